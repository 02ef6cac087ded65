//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): the NVFP4 GEMV chains, W4A4 and the base GEMM.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::check::bench_decode::{kernel_line, per_call, probe_time};
use crate::gpu::sizes::NVFP4_GEMV_ROWS;
use crate::gpu::table::Kernels;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, upload_f32};
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

/// Its kernel lines (selected with the other decode kernels' by `decode kernel`).
pub(crate) static KERNELS: &[KernelLines] = &[("decode kernel nvfp4", kernel_lines)];

/// The NVFP4 decode GEMVs alone: the dual gate+up GEMV on the gate shape (two projections), the
/// one-projection GEMV on both shapes, m = 1 and 4, against the probe of their grids.
fn kernel_lines(
    b: &dyn GpuBackend,
    ceiling: f64,
    rng: &mut Rand,
    out: &mut dyn FnMut(String),
) -> GpuResult<()> {
    let ks = &Kernels::resolve(b);
    let (nmax, kmax) = (14336usize, 14336usize);
    let x = b.alloc((4 * kmax * 4) as u64)?;
    upload_f32(b, x, &rng.vec(4 * kmax, 1.0))?;
    // Codes and E4M3 scales (1.0) of two projections of 14336 x 4096 (or 4096 x 14336).
    let bufs = [nvfp4_weight(b, nmax * 4096)?, nvfp4_weight(b, nmax * 4096)?];
    let y = b.alloc((2 * 4 * nmax * 4) as u64)?;
    let y2 = y.view((4 * nmax * 4) as u64, (4 * nmax * 4) as u64);
    let row_bytes = |k: usize| k / 2 + k / 16;
    let cases = [
        (ks.nvfp4_gemv_dual, true, 14336usize, 4096usize),
        (ks.nvfp4_gemv, false, 14336, 4096),
        (ks.nvfp4_gemv, false, 4096, 14336),
    ];
    for (kernel, dual, n, k) in cases {
        if !kernel.ok() {
            continue;
        }
        let projections = if dual { 2 } else { 1 };
        let bytes = (projections * n * row_bytes(k)) as f64;
        let parts = [(bytes as u64, projections * n.div_ceil(NVFP4_GEMV_ROWS))];
        let probe = probe_time(b, &parts)?;
        for m in [1usize, 4] {
            let call = || {
                let c = kernel.call().ptr("x", x).dim("m", m);
                let c = if dual {
                    let c = c.ptr("cg", bufs[0].0).ptr("sg", bufs[0].1).float("gg", 1.0);
                    let c = c.ptr("yg", y).ptr("cu", bufs[1].0).ptr("su", bufs[1].1);
                    c.float("gu", 1.0).ptr("yu", y2)
                } else {
                    let c = c.ptr("codes", bufs[0].0).ptr("scales", bufs[0].1);
                    c.float("g", 1.0).ptr("y", y)
                };
                let c = c.dim("n", n).dim("k", k).dim("kp", k).dim("ldy", n);
                c.finish()?.run(b, 0)
            };
            let t = per_call(b, call)?;
            let what = format!("{n}x{k} m={m}");
            out(kernel_line(&kernel, &what, (t, bytes, probe), ceiling));
        }
    }
    b.free(x);
    b.free(y);
    for (c, s) in bufs {
        b.free(c);
        b.free(s);
    }
    Ok(())
}

/// Device codes and scales of `elems` NVFP4 weights (codes 0x5A, scales E4M3 1.0).
fn nvfp4_weight(b: &dyn GpuBackend, elems: usize) -> GpuResult<(DevicePtr, DevicePtr)> {
    let (c, s) = (b.alloc((elems / 2) as u64)?, b.alloc((elems / 16) as u64)?);
    b.fill(c, 0x5A)?;
    b.fill(s, 0x38)?;
    Ok((c, s))
}
