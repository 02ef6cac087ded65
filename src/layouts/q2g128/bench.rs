//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): its GEMV chain, its dequantizing prefill and its MMQ.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::check::bench_decode::part;
use crate::gpu::sizes::{Q2G128_BYTES, Q2G128_ELEMS};
use crate::testing::*;

/// q2g128 bytes per element.
const Q2_BPE: f64 = Q2G128_BYTES as f64 / Q2G128_ELEMS as f64;

/// Three GEMVs, 8 rows a block.
fn gemvs(_: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    let q2 = |k: usize| k / Q2G128_ELEMS * Q2G128_BYTES;
    vec![part(i, q2(h), 8), part(i, q2(h), 8), part(h, q2(i), 8)]
}

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 3] = [
    bench("q2 GEMV chain", install_q2, &[], Some(Q2_BPE), false).probe(gemvs),
    bench("q2 dequant + BF16 GEMM", install_q2, &[], None, true),
    bench("q2 MMQ (q8_1)", install_q2, &[("METRALE_Q2G128_MMQ", "1")], None, true),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 1] = [SmallArm {
    name: "q2",
    install: install_q2,
    levers: &[],
}];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
