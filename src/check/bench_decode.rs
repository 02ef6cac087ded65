//! `bench-gpu`'s decode ceilings (the decode-roofline issue): the streaming probe of each decode
//! arm's weight bytes at its kernels' grids, the decode GEMV kernels alone against the probe of
//! their own grid, and the cuBLAS BF16 layer at m = 1..16, the peer a user would pick instead.

use super::{Lines, time_median};
use crate::converters::affine::Form;
use crate::converters::layouts::affine::Scheme;
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

/// The `affine` scheme a bench arm or kernel line named `name` times, for rows of `k`: 4 or 8
/// bits; groups of 128 with half zero points ("g128"), one group a row with f32 ones ("per
/// channel"), else GGUF's groups of 32 with offsets.
pub(crate) fn affine_bench_scheme(name: &str, k: usize) -> Scheme {
    let bits = if name.contains("4-bit") { 4 } else { 8 };
    if name.contains("g128") {
        Scheme {
            bits,
            group: 128,
            form: Form::Zero,
        }
    } else if name.contains("per channel") {
        Scheme {
            bits,
            group: k,
            form: Form::ZeroF32,
        }
    } else {
        Scheme::ggml(bits)
    }
}

/// A projection's weight bytes `(bytes, blocks)` for `n` rows of `row_bytes` at `rows` rows per
/// block.
pub(crate) fn part(n: usize, row_bytes: usize, rows: usize) -> (u64, usize) {
    ((n * row_bytes) as u64, n.div_ceil(rows))
}

/// Seconds per back-to-back call of the probe over `parts`.
pub(super) fn probe_time(b: &dyn GpuBackend, parts: &[(u64, usize)]) -> GpuResult<f64> {
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
    affine_kernels(b, &ks, ceiling, rng, out)?;
    nvfp4_kernels(b, &ks, ceiling, rng, out)
}

/// The `affine` GEMVs (4- and 8-bit codes, a half scale and offset per 32 values) on both
/// shapes at m = 1, 2, 4, 8 and 16 (the batch-4 and batch-16 forms both at 2 and 4) over
/// activations quantized once beforehand, against the probe of their grids over the same bytes;
/// the activation quantizer and the prefill's BF16 dequantization alone.
fn affine_kernels(
    b: &dyn GpuBackend,
    ks: &Kernels,
    ceiling: f64,
    rng: &mut Rand,
    out: &mut Lines,
) -> GpuResult<()> {
    const M: usize = AFFINE_GEMV_MAX_ROWS;
    let x = b.alloc((M * 14336 * 4) as u64)?;
    upload_f32(b, x, &rng.vec(M * 14336, 1.0))?;
    let (xq, xs) = (
        b.alloc((M * 14336) as u64)?,
        b.alloc((M * 14336 / 2) as u64)?,
    );
    let codes = b.alloc(14336 * 4096)?;
    b.fill(codes, 0x5A)?;
    let sb = b.alloc((14336 * 4096 / AFFINE_GROUP * 4) as u64)?;
    b.fill(sb, 0x3C)?;
    let (codes2, sb2) = (b.alloc(codes.bytes)?, b.alloc(sb.bytes)?);
    b.fill(codes2, 0x5A)?;
    b.fill(sb2, 0x3C)?;
    let y = b.alloc((M * 14336 * 4) as u64)?;
    let dq = b.alloc(14336 * 4096 * 2)?;
    for (shape, n, k) in [
        ("gate 14336x4096", 14336usize, 4096usize),
        ("down 4096x14336", 4096, 14336),
    ] {
        for scheme in ["4-bit", "4-bit g128", "8-bit", "8-bit per channel"] {
            let sc = affine_bench_scheme(scheme, k);
            let bits = sc.bits as usize;
            let kernels = if bits == 4 {
                [
                    ks.affine4_gemv,
                    ks.affine4_gemv_m,
                    ks.affine4_gemv_m16,
                    ks.affine4_gemv_ks,
                ]
            } else {
                [
                    ks.affine8_gemv,
                    ks.affine8_gemv_m,
                    ks.affine8_gemv_m16,
                    ks.affine8_gemv_ks,
                ]
            };
            let (form_n, gshift) = (sc.form as usize, sc.group_shift(k) as usize);
            let quant = |m: usize| {
                let c = ks.affine_quant.call().ptr("x", x).ptr("u", x).dim("act", 0);
                let c = c.dim("m", m).dim("k", k).dim("ld", k).dim("kp", k);
                c.dim("bits", bits)
                    .ptr("xq", xq)
                    .ptr("xs", xs)
                    .ptr("perm", DevicePtr::NULL)
                    .finish()?
                    .run(b, 0)
            };
            quant(M)?;
            let row = sc.row_bytes(k);
            let bufs = AffineBufs {
                xq,
                xs,
                codes: [codes, codes2],
                sb: [sb, sb2],
                y,
            };
            let what = (shape, scheme, n, k);
            affine_gemv_lines(b, kernels, &bufs, what, sc, ceiling, out)?;
            let t = per_call(b, || quant(1))?;
            out.push(format!(
                "decode kernel affine_quantize_act k={k} {scheme} m=1 {:>7.1} us",
                t * 1e6
            ));
            // The prefill's dequantization of this projection to BF16, alone.
            let call = || {
                let c = ks.affine_dequant.call().ptr("codes", codes).ptr("sb", sb);
                let c = c.dim("n", n).dim("kp", k).dim("bits", bits);
                let c = c.dim("form", form_n).dim("gshift", gshift);
                let c = c.ptr("perm", DevicePtr::NULL);
                c.ptr("out", dq).finish()?.run(b, 0)
            };
            let t = per_call(b, call)?;
            let bytes = (n * row + n * k * 2) as f64; // read + written
            out.push(format!(
                "prefill kernel affine_dequant_bf16 {shape} {scheme} {:>7.1} us {:>6.0} GB/s read+written {:>5.1}% of copy ceiling",
                t * 1e6,
                bytes / t / 1e9,
                100.0 * bytes / t / ceiling
            ));
        }
    }
    for p in [x, xq, xs, codes, sb, codes2, sb2, y, dq] {
        b.free(p);
    }
    Ok(())
}

/// The affine bench's device buffers: activation codes and records, two projections' codes
/// and scale pairs, the output.
struct AffineBufs {
    xq: DevicePtr,
    xs: DevicePtr,
    codes: [DevicePtr; 2],
    sb: [DevicePtr; 2],
    y: DevicePtr,
}

/// One scheme's GEMV lines on one shape `(shape, scheme, n, k)`: `kernels` (the one-row,
/// batch-4, batch-16 and k-split forms) at their row counts, one projection and (gate shape)
/// two, each against the probe of its grid.
fn affine_gemv_lines(
    b: &dyn GpuBackend,
    kernels: [Kernel; 4],
    bufs: &AffineBufs,
    (shape, scheme, n, k): (&str, &str, usize, usize),
    sc: Scheme,
    ceiling: f64,
    out: &mut Lines,
) -> GpuResult<()> {
    let AffineBufs {
        xq,
        xs,
        codes: [codes, codes2],
        sb: [sb, sb2],
        y,
    } = *bufs;
    let (form_n, gshift) = (sc.form as usize, sc.group_shift(k) as usize);
    let row = sc.row_bytes(k);
    let probe = probe_time(b, &[part(n, row, AFFINE_GEMV_BLOCK_ROWS)])?;
    let probe_ks = probe_time(b, &[part(n, row, AFFINE_GEMV_KS_BLOCK_ROWS)])?;
    // The batch-4 and batch-16 forms both at 2 and 4 rows; the k-split form (one
    // projection) at 1.
    let variants = [
        (0, 1usize),
        (3, 1),
        (1, 2),
        (2, 2),
        (1, 4),
        (2, 4),
        (2, 8),
        (2, 16),
    ];
    for (variant, m) in variants {
        let kernel = kernels[variant];
        if !kernel.ok() {
            continue;
        }
        let probe = if variant == 3 { probe_ks } else { probe };
        // One projection, and (gate shape, not the k-split form) gate and up in one
        // launch, up's codes and scale pairs a second buffer (the same buffer twice
        // would be read from L2).
        let both = n == 14336 && variant != 3;
        for projs in [1usize, 2].into_iter().take(if both { 2 } else { 1 }) {
            let call = || {
                let c = kernel.call().ptr("xq", xq).ptr("xs", xs).dim("m", m);
                let c = c.ptr("cg", codes).ptr("sg", sb).ptr("yg", y);
                let c = c.ptr("cu", codes2).ptr("su", sb2).ptr("yu", y);
                let c = c.dim("projs", projs).dim("n", n).dim("kp", k);
                let c = c.dim("form", form_n).dim("gshift", gshift);
                c.dim("ldy", n).finish()?.run(b, 0)
            };
            let t = per_call(b, call)?;
            let what = format!("{shape} {scheme} m={m} x{projs}");
            let bytes = (projs * n * row) as f64;
            let probe = probe * projs as f64;
            out.push(kernel_line(&kernel, &what, (t, bytes, probe), ceiling));
        }
    }
    Ok(())
}

/// One decode kernel's line: `(seconds, weight bytes, its probe's seconds)` against the copy
/// ceiling and the probe of its grid.
fn kernel_line(
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

/// The NVFP4 decode GEMVs alone: the dual gate+up GEMV on the gate shape (two projections), the
/// one-projection GEMV on both shapes, m = 1 and 4, against the probe of their grids.
fn nvfp4_kernels(
    b: &dyn GpuBackend,
    ks: &Kernels,
    ceiling: f64,
    rng: &mut Rand,
    out: &mut Lines,
) -> GpuResult<()> {
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
            out.push(kernel_line(&kernel, &what, (t, bytes, probe), ceiling));
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
