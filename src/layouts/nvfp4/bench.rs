//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): the NVFP4 GEMV chains, W4A4 and the base GEMM.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::gpu::sizes::NVFP4_GEMV_ROWS;
use crate::testing::*;

/// NVFP4: 0.5 byte codes + 1/16 byte scales per weight.
pub(crate) const NVFP4_BPE: f64 = 0.5 + 1.0 / 16.0;

/// The dual gate+up GEMV (2 x n / 16 blocks), then the down GEMV; codes and scales of a
/// block's rows are one slice.
fn gemvs(_: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    let nv = |n: usize, k: usize| n * (k / 2 + k / 16); // codes + E4M3 scales per row
    vec![
        ((2 * nv(i, h)) as u64, 2 * i.div_ceil(NVFP4_GEMV_ROWS)),
        (nv(h, i) as u64, h.div_ceil(NVFP4_GEMV_ROWS)),
    ]
}

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 5] = [
    bench("nvfp4 GEMV chain (k-split down)", install_nvfp4, &[("METRALE_W4A16_GEMV_KSPLIT_MIN_K", "8192")], Some(NVFP4_BPE), false).probe(gemvs),
    bench("nvfp4 GEMV chain (split SiLU)", install_nvfp4, &[], Some(NVFP4_BPE), false).probe(gemvs),
    bench("nvfp4 GEMV chain (SiLU-fused down)", install_nvfp4, &[("METRALE_FFN_SILU_FUSED_DOWN", "1")], Some(NVFP4_BPE), false).probe(gemvs),
    bench("nvfp4 W4A4 (single row)", install_nvfp4, &[("METRALE_SINGLE_ROW_W4A4", "1")], Some(NVFP4_BPE), false),
    bench("nvfp4 base w4a16_gemm", install_nvfp4, &[], None, true),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 3] = [
    SmallArm {
        name: "nvfp4 split SiLU",
        install: install_nvfp4,
        levers: &[],
    },
    SmallArm {
        name: "nvfp4 SiLU-fused down",
        install: install_nvfp4,
        levers: &[("METRALE_FFN_SILU_FUSED_DOWN", "1")],
    },
    SmallArm {
        name: "nvfp4 W4A4 single row",
        install: install_nvfp4,
        levers: &[("METRALE_SINGLE_ROW_W4A4", "1")],
    },
];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
