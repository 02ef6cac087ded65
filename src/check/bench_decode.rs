//! `bench-gpu`'s decode ceilings (the decode-roofline issue): the streaming probe of each decode
//! arm's weight bytes at its kernels' grids, the decode GEMV kernels alone against the probe of
//! their own grid, and the cuBLAS BF16 layer at m = 1..16, the peer a user would pick instead.

use super::{Lines, time_median};
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::sizes::*;
use crate::gpu::table::{Kernel, Kernels};
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, ModelLevers, upload_f32};
use crate::testing::*;
use std::sync::Arc;

/// Calls per timed sample of the back-to-back figures: the host's launch and synchronization
/// (5-10 us) spread over many calls, as when an engine runs layer after layer.
pub(super) const BACK_TO_BACK: usize = 20;

/// Median seconds per call of `f` run [`BACK_TO_BACK`] times in a row (11 samples).
pub(crate) fn per_call(b: &dyn GpuBackend, mut f: impl FnMut() -> GpuResult<()>) -> GpuResult<f64> {
    let t = time_median(b, 11, || {
        for _ in 0..BACK_TO_BACK {
            f()?;
        }
        Ok(())
    })?;
    Ok(t / BACK_TO_BACK as f64)
}

/// One `stream_probe` launch per part `(bytes, blocks)`: block `b` of a part reads the part's
/// `b`-th slice, as a decode kernel's block reads its rows. Parts lie one after another in
/// `scratch` (so no two parts share bytes in L2).
fn probe_launches(
    b: &dyn GpuBackend,
    k: &Kernel,
    scratch: DevicePtr,
    sink: DevicePtr,
    parts: &[(u64, usize)],
) -> GpuResult<()> {
    let mut at = 0u64;
    for &(bytes, blocks) in parts {
        let count = (bytes / 16) as usize;
        let call = k.call().ptr("p", scratch.view(at, bytes));
        let call = call.dim("count", count).dim("per", count.div_ceil(blocks));
        call.ptr("sink", sink).finish()?.run(b, 0)?;
        at += bytes.next_multiple_of(256);
    }
    Ok(())
}

/// The bytes a probe over `parts` needs.
fn probe_bytes(parts: &[(u64, usize)]) -> u64 {
    parts.iter().map(|(b, _)| b.next_multiple_of(256)).sum()
}

/// A projection's weight bytes `(bytes, blocks)` for `n` rows of `row_bytes` at `rows` rows per
/// block.
pub(crate) fn part(n: usize, row_bytes: usize, rows: usize) -> (u64, usize) {
    ((n * row_bytes) as u64, n.div_ceil(rows))
}

/// Seconds per back-to-back call of the probe over `parts`.
pub(crate) fn probe_time(b: &dyn GpuBackend, parts: &[(u64, usize)]) -> GpuResult<f64> {
    let k = Kernels::resolve(b).stream_probe;
    let scratch = b.alloc(probe_bytes(parts))?;
    b.fill(scratch, 0x5A)?;
    let blocks = parts.iter().map(|p| p.1).max().unwrap_or(1);
    let sink = b.alloc((blocks * 4) as u64)?;
    let t = per_call(b, || probe_launches(b, &k, scratch, sink, parts));
    b.free(scratch);
    b.free(sink);
    t
}

/// The decode GEMV kernels alone on the llama-8B gate (14336 x 4096) and down (4096 x 14336)
/// shapes, m = 1 and 4, each against the streaming probe of its own grid.
pub(super) fn decode_kernels(
    b: &dyn GpuBackend,
    ceiling: f64,
    rng: &mut Rand,
    out: &mut Lines,
) -> GpuResult<()> {
    let ks = Kernels::resolve(b);
    // (kernel, rows per block, weight bytes per element)
    let kernels: [(Kernel, usize, usize); 5] = [
        (ks.bf16_gemv, BF16_GEMV_ROWS, 2),
        (ks.fp8_b4, FP8_GEMV_ROWS, 1),
        (ks.fp8_b4_cvt, FP8_GEMV_ROWS, 1),
        (ks.fp8_mma, FP8_MMA_GEMV_ROWS, 1),
        (ks.fp8_mma_ilp, FP8_MMA_GEMV_ROWS, 1),
    ];
    let x = b.alloc((16 * 14336 * 4) as u64)?;
    upload_f32(b, x, &rng.vec(16 * 14336, 1.0))?;
    let w = b.alloc(14336 * 4096 * 2)?;
    b.fill(w, 0x3C)?;
    let s = b.alloc(14336 / 128 * 4096 / 128 * 4)?;
    b.fill(s, 0x3C)?;
    let y = b.alloc((16 * 14336 * 4) as u64)?;
    for (shape, n, k) in [
        ("gate 14336x4096", 14336usize, 4096usize),
        ("down 4096x14336", 4096, 14336),
    ] {
        for &(kernel, rows, bpe) in &kernels {
            if !kernel.ok() {
                continue;
            }
            let bytes = (n * k * bpe) as f64;
            let probe = probe_time(b, &[part(n, k * bpe, rows)])?;
            for m in [1usize, 2, 4] {
                if m > kernel.spec.row_cap.unwrap_or(usize::MAX) {
                    continue;
                }
                let call = || {
                    let c = kernel.call().ptr("x", x).dim("m", m).ptr("w", w);
                    let c = if bpe == 1 { c.ptr("s", s) } else { c };
                    let c = c.ptr("y", y).dim("n", n).dim("k", k).dim("kp", k);
                    c.dim("ldy", n).finish()?.run(b, 0)
                };
                let t = per_call(b, call)?;
                let what = format!("{shape} m={m}");
                out.push(kernel_line(&kernel, &what, (t, bytes, probe), ceiling));
            }
        }
    }
    for p in [x, w, s, y] {
        b.free(p);
    }
    Ok(())
}

/// One decode kernel's line: `(seconds, weight bytes, its probe's seconds)` against the copy
/// ceiling and the probe of its grid.
pub(crate) fn kernel_line(
    kernel: &Kernel,
    what: &str,
    (t, bytes, probe): (f64, f64, f64),
    ceiling: f64,
) -> String {
    format!(
        "decode kernel {:<20} {what} {:>7.1} us {:>6.0} GB/s {:>5.1}% of copy ceiling {:>5.1}% of its probe ({:.1} us)",
        kernel.spec.name,
        t * 1e6,
        bytes / t / 1e9,
        100.0 * bytes / t / ceiling,
        100.0 * probe / t,
        probe * 1e6
    )
}

/// The BF16 layer on cuBLAS (activations to bf16, the gate and up GEMMs, SiLU * up, to bf16,
/// the down GEMM) at m = 1..16, back to back: `(m, seconds per call)`.
pub(super) fn cublas_layer(
    b: &Arc<dyn GpuBackend>,
    w: &DenseWeights,
    rng: &mut Rand,
    out: &mut Lines,
) -> GpuResult<Vec<(usize, f64)>> {
    let (h, i) = (w.hidden, w.inter);
    let cfg = FfnConfig {
        hidden: h,
        inter: i,
    };
    let mut ctx = ForwardContext::new(b.clone(), cfg, 16, ModelLevers::default())?;
    let mut layer = DenseFfnLayer::new(&ctx);
    install_bf16(b.as_ref(), &mut layer, w)?;
    let x = b.alloc((16 * h * 4) as u64)?;
    upload_f32(b.as_ref(), x, &rng.vec(16 * h, 1.0))?;
    let mut times = Vec::new();
    ctx.tracing = true;
    let _ = layer.bf16_prefill_arm(&mut ctx, x, 1);
    ctx.tracing = false;
    if !ctx.trace.contains(&"cublas_gemm_bf16") {
        out.push("cuBLAS BF16 layer: cuBLAS not loaded; no peer figures".into());
        b.free(x);
        return Ok(times);
    }
    for m in DECODE_MS {
        let t = per_call(b.as_ref(), || {
            layer.bf16_prefill_arm(&mut ctx, x, m).map(|_| ())
        })?;
        out.push(format!(
            "decode m={m:<2} {:<30} {:>8.1} us back to back",
            "cuBLAS BF16 layer (peer)",
            t * 1e6
        ));
        times.push((m, t));
    }
    b.free(x);
    Ok(times)
}

/// The decode row counts of the sweeps and the peer.
pub(super) const DECODE_MS: [usize; 7] = [1, 2, 3, 4, 8, 12, 16];
