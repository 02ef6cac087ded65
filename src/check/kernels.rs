//! Kernel rows: every kernel against the host reference (`reference.rs`) on fresh random data.
//! Row caps and activation rounding come from the kernel table ([`crate::gpu::table`]), and
//! every launch is built by parameter name through it, as the layer's own launches are.

use super::*;
use crate::converters::layouts;
use crate::ffn::{DenseFfnLayer, FfnConfig, FfnKernels, ForwardContext, W8a8Weight, nvfp4_args};
use crate::gpu::reference::{self, ActRound};
use crate::gpu::sizes::*;
use crate::gpu::table::{Call, Kernel};
use crate::gpu::{
    DevicePtr, GemmBf16, GpuBackend, GpuError, GpuResult, ModelLevers, alloc_upload, download_f32,
    upload_f32,
};
use crate::testing::*;
use rayon::prelude::*;
use std::sync::Arc;

mod affine;
mod dq_wgmma;
mod fp8_w8a8;
mod rules;

/// The largest m the FP8 check sends to a kernel with a row cap: the routing's range for the
/// batch tiers (5..=32), which `fp8_launch` splits into launches of the kernel's cap.
const FP8_CHUNKED_MAX_M: usize = 32;

/// One shape's inputs, shared by every family's rows: the gate/up-shaped weight `wf` (`[n, k]`
/// = `[inter, hidden]`), `mmax` rows of activations `x` on the device as `xd`, and an output
/// buffer `yd` of `[mmax, n]`.
struct Case<'a> {
    b: Arc<dyn GpuBackend>,
    ctx: ForwardContext,
    layer: DenseFfnLayer,
    kk: FfnKernels,
    shape: (usize, usize),
    n: usize,
    k: usize,
    ms: &'a [usize],
    mmax: usize,
    wf: Vec<f32>,
    x: Vec<f32>,
    xd: DevicePtr,
    yd: DevicePtr,
}

impl Case<'_> {
    fn xr(&self, r: usize) -> &[f32] {
        &self.x[r * self.k..(r + 1) * self.k]
    }

    fn row(&self, rows: &mut Vec<Row>, check: &str, m: usize, err: f64, tol: f64) {
        push(rows, check, self.shape, m, err, tol);
    }

    fn bits(&self, rows: &mut Vec<Row>, check: &str, m: usize, exact: bool) {
        push(
            rows,
            check,
            self.shape,
            m,
            if exact { 0.0 } else { 1.0 },
            0.0,
        );
    }

    /// Finish `call` by the kernel table and launch it on the default stream.
    fn launch(&self, call: Call) -> GpuResult<()> {
        call.finish()?.run(self.b.as_ref(), 0)
    }

    /// The sampled error of the `[m, n]` output in `yd`.
    fn err(&self, m: usize, f: impl Fn(usize) -> Vec<f32> + Sync) -> GpuResult<f64> {
        sampled_err(self.b.as_ref(), self.yd, m, self.n, f)
    }

    fn poison_y(&self) -> GpuResult<()> {
        poison(self.b.as_ref(), self.yd)
    }
}

/// The m of `ms` within a kernel's row cap (`limit` when it has none).
fn within(ms: &[usize], k: &Kernel, limit: usize) -> Vec<usize> {
    let cap = k.spec.row_cap.unwrap_or(limit);
    ms.iter().copied().filter(|&m| m <= cap).collect()
}

/// Kernel-level checks: each projection kernel on its row counts, sampled rows against the
/// reference (f64 sums), every output element checked written.
pub fn kernel_checks(
    b: Arc<dyn GpuBackend>,
    shapes: &[(usize, usize)],
    ms: &[usize],
    rng: &mut Rand,
) -> GpuResult<Vec<Row>> {
    let mut rows = Vec::new();
    let mmax = *ms.iter().max().unwrap();
    for &(h, i) in shapes {
        let config = FfnConfig {
            hidden: h,
            inter: i,
        };
        let ctx = ForwardContext::new(b.clone(), config, mmax, ModelLevers::default())?;
        let layer = DenseFfnLayer::new(&ctx);
        let (n, k) = (i, h); // gate/up shape
        let x = rng.vec(mmax * k, 1.0);
        let xd = b.alloc((mmax * k * 4) as u64)?;
        upload_f32(b.as_ref(), xd, &x)?;
        let mut c = Case {
            kk: *layer.kernels(),
            b: b.clone(),
            ctx,
            layer,
            shape: (h, i),
            n,
            k,
            ms,
            mmax,
            wf: rng.vec(n * k, 1.0 / (k as f32).sqrt()),
            x,
            xd,
            yd: b.alloc((mmax * n * 4) as u64)?,
        };
        rules::rules_rows(&c, &mut rows, rng)?;
        fp8_rows(&mut c, &mut rows)?;
        fp8_w8a8::fp8_w8a8_rows(&mut c, &mut rows)?;
        w8a8_rows(&mut c, &mut rows)?;
        bf16_rows(&mut c, &mut rows)?;
        nvfp4_rows(&mut c, &mut rows, rng)?;
        q2g128_rows(&c, &mut rows)?;
        affine::affine_rows(&c, &mut rows)?;
        q4k_gemv_rows(&c, &mut rows)?;
        repack_rows(&c, &mut rows, rng)?;
        for p in [c.xd, c.yd] {
            b.free(p);
        }
    }
    Ok(rows)
}

/// The W8A16 kernels through the layer's `fp8_launch` (which splits m by the kernel's cap).
fn fp8_rows(c: &mut Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k) = (c.n, c.k);
    let (w, codes, scales) = upload_fp8(c.b.as_ref(), &c.wf, n, k)?;
    let kk = c.kk;
    for kernel in [
        kk.fp8_b4,
        kk.fp8_mma,
        kk.fp8_mma_ilp,
        kk.fp8_b16,
        kk.fp8_m16,
        kk.fp8_pipe,
        kk.fp8_base,
        kk.fp8_b4_cvt,
    ] {
        let limit = if kernel.spec.row_cap.is_some() {
            FP8_CHUNKED_MAX_M
        } else {
            usize::MAX
        };
        for m in c.ms.iter().copied().filter(|&m| m <= limit) {
            c.poison_y()?;
            let (xd, yd) = (c.xd, c.yd);
            c.layer.fp8_launch(&mut c.ctx, kernel, &w, xd, m, yd, n)?;
            c.b.synchronize(0)?;
            let err = c.err(m, |r| {
                let mut out = vec![0f32; n];
                let round = kernel.spec.round;
                reference::fp8_block_row(c.xr(r), &codes, &scales, n, k, w.kp, round, &mut out);
                out
            })?;
            c.row(rows, kernel.spec.name, m, err, 2e-6);
        }
    }
    c.b.free(w.weight);
    c.b.free(w.scale);
    Ok(())
}

/// W8A8: activation quantization bit for bit, then the FP8 tensor-core GEMM.
fn w8a8_rows(c: &mut Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k) = (c.n, c.k);
    let b = c.b.clone();
    let we = layouts::w8a8::encode(&c.wf, n, k);
    let ww = W8a8Weight {
        weight: alloc_upload(b.as_ref(), &we.parts[0].1)?,
        scale: alloc_upload(b.as_ref(), &we.parts[1].1)?,
        n,
        k,
        kp: we.padded[1],
    };
    let wsc = layouts::f32_from(&we.parts[1].1);
    for &m in c.ms {
        c.poison_y()?;
        let (xd, yd) = (c.xd, c.yd);
        c.layer.w8a8_project(&mut c.ctx, &ww, xd, m, yd, n)?;
        b.synchronize(0)?;
        let mut q = vec![0u8; m * ww.kp];
        b.download(c.ctx.arena.act_codes.view(0, q.len() as u64), &mut q)?;
        let sx = download_f32(b.as_ref(), c.ctx.arena.act_scale.view(0, (m * 4) as u64))?;
        let exact = (0..m).into_par_iter().all(|r| {
            let (qr, s) = reference::quantize_row_fp8(c.xr(r), ww.kp);
            qr == q[r * ww.kp..(r + 1) * ww.kp] && s.to_bits() == sx[r].to_bits()
        });
        c.bits(rows, "quantize_act_fp8_row (bits)", m, exact);
        let (fused, plain) = (c.kk.quant_fp8_act, c.kk.quant_fp8_row);
        fp8_w8a8::fused_act_bits(c, rows, fused, plain, ww.kp, 1, m)?;
        // Each GEMM over the same quantized rows (the projection above routed to one of them),
        // against the reference: FP8 tensor-core accumulation is not full f32 on Hopper, 1e-3.
        let (q, s) = (c.ctx.arena.act_codes, c.ctx.arena.act_scale);
        let reference = |r: usize| {
            let (qr, s) = reference::quantize_row_fp8(c.xr(r), ww.kp);
            let mut out = vec![0f32; n];
            reference::w8a8_row(&qr, s, &we.parts[0].1, &wsc, n, ww.kp, &mut out);
            out
        };
        let mut outputs: Vec<(&str, Vec<f32>)> = Vec::new();
        for kernel in [
            c.kk.w8a8,
            c.kk.w8a8_wgmma,
            c.kk.w8a8_wgmma_m64,
            c.kk.w8a8_gemv,
        ] {
            let fits = kernel.spec.row_cap.is_none_or(|cap| m <= cap);
            if !kernel.ok() || !fits {
                continue;
            }
            c.poison_y()?;
            let call = kernel.call().ptr("q", q).ptr("sx", s).dim("m", m);
            let call = call.ptr("w", ww.weight).ptr("sw", ww.scale).ptr("y", yd);
            c.launch(call.dim("n", n).dim("kp", ww.kp).dim("ldy", n))?;
            b.synchronize(0)?;
            let err = c.err(m, reference)?;
            c.row(rows, kernel.spec.name, m, err, 1e-3);
            let y = download_f32(b.as_ref(), yd.view(0, (m * n * 4) as u64))?;
            outputs.push((kernel.spec.name, y));
        }
        // The decode GEMV (m <= 16) reproduces the portable GEMM bit for bit, and the two wgmma
        // tilings compute each output alike.
        let out = |name: &str| outputs.iter().find(|(k, _)| *k == name).map(|(_, y)| y);
        for (check, a, b) in [
            ("w8a8_gemv (bits = w8a8_gemm)", "w8a8_gemv", "w8a8_gemm"),
            (
                "w8a8_wgmma_m64 (bits = w8a8_wgmma)",
                "w8a8_wgmma_m64",
                "w8a8_wgmma",
            ),
        ] {
            if let (Some(a), Some(b)) = (out(a), out(b)) {
                c.bits(rows, check, m, same_bits(a, b));
            }
        }
    }
    b.free(ww.weight);
    b.free(ww.scale);
    Ok(())
}

/// BF16: the GEMV within its cap, and cuBLAS.
fn bf16_rows(c: &mut Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k) = (c.n, c.k);
    let b = c.b.clone();
    let be = layouts::bf16::encode(&c.wf, n, k);
    let bw = crate::ffn::Bf16Weight {
        weight: alloc_upload(b.as_ref(), &be.parts[0].1)?,
        n,
        k,
        kp: be.padded[1],
    };
    let x = c.x.clone();
    let bf16_ref = |r: usize, round: ActRound| {
        let mut out = vec![0f32; n];
        let xr = &x[r * k..(r + 1) * k];
        reference::bf16_row(xr, &be.parts[0].1, n, k, bw.kp, round, &mut out);
        out
    };
    let gemv = c.kk.bf16_gemv;
    let gemv_ms = within(c.ms, &gemv, usize::MAX);
    for &m in c.ms {
        let (xd, yd) = (c.xd, c.yd);
        if gemv_ms.contains(&m) {
            c.poison_y()?;
            c.layer.bf16_gemv(&mut c.ctx, &bw, xd, m, yd, n)?;
            b.synchronize(0)?;
            let err = c.err(m, |r| bf16_ref(r, gemv.spec.round))?;
            c.row(rows, gemv.spec.name, m, err, 2e-6);
        }
        c.poison_y()?;
        let xb = c.layer.to_bf16(&mut c.ctx, xd, m * k)?;
        let g = GemmBf16 {
            x: xb,
            w: bw.weight,
            y: yd,
            m,
            n,
            k,
            kw: bw.kp,
        };
        b.gemm_bf16(&g, 0)?;
        b.synchronize(0)?;
        let err = c.err(m, |r| bf16_ref(r, ActRound::Bf16))?;
        // cuBLAS blocks the k sum its own way: 1e-5.
        c.row(rows, "cublas gemm_bf16", m, err, 1e-5);
    }
    b.free(bw.weight);
    Ok(())
}

/// NVFP4: the GEMVs and batch-m tiers within their caps, the base GEMM, the `_t` GEMMs over
/// the transposed copy, the MMQ GEMM over the tiles, and W4A4.
fn nvfp4_rows(c: &mut Case, rows: &mut Vec<Row>, rng: &mut Rand) -> GpuResult<()> {
    let (n, k) = (c.n, c.k);
    let b = c.b.clone();
    let ne = layouts::nvfp4::encode(&c.wf, n, k);
    let nw = crate::ffn::Nvfp4Weight {
        codes: alloc_upload(b.as_ref(), &ne.parts[0].1)?,
        scales: alloc_upload(b.as_ref(), &ne.parts[1].1)?,
        global_scale: ne.scalars[0].1,
        n,
        k,
        kp: ne.padded[1],
    };
    let kp = nw.kp;
    let nvfp4_ref = |r: usize, round: ActRound| {
        let mut out = vec![0f32; n];
        let (codes, scales) = (&ne.parts[0].1, &ne.parts[1].1);
        let g = nw.global_scale;
        reference::nvfp4_row(c.xr(r), codes, scales, g, n, k, kp, round, &mut out);
        out
    };
    let kk = c.kk;
    let over_nvfp4 = [
        kk.nvfp4_gemv,
        kk.nvfp4_gemv_ksplit,
        kk.nvfp4_gemv_b2,
        kk.nvfp4_gemv_b3,
        kk.nvfp4_small_m4,
        kk.nvfp4_small_m8,
        kk.nvfp4_small_m16,
        kk.nvfp4_gemm,
    ];
    for kernel in over_nvfp4 {
        for m in within(c.ms, &kernel, usize::MAX) {
            c.poison_y()?;
            c.launch(nvfp4_args(kernel, &nw, c.xd, m, c.yd, n))?;
            b.synchronize(0)?;
            let err = c.err(m, |r| nvfp4_ref(r, kernel.spec.round))?;
            c.row(rows, kernel.spec.name, m, err, 2e-6);
        }
    }
    // The `_t` GEMMs over the transposed copy and the MMQ GEMM over the tiles: the same
    // numerics as w4a16_gemm (bf16 activations, f32 accumulation).
    let te = layouts::nvfp4_t::from_nvfp4(&ne.parts[0].1, &ne.parts[1].1, 0.0, n, kp);
    let me = layouts::nvfp4_mmq::from_nvfp4(&ne.parts[0].1, &ne.parts[1].1, 0.0, n, kp);
    let (ct, st, tiles) = (
        alloc_upload(b.as_ref(), &te.parts[0].1)?,
        alloc_upload(b.as_ref(), &te.parts[1].1)?,
        alloc_upload(b.as_ref(), &me.parts[0].1)?,
    );
    let gemms = [
        kk.nvfp4_gemm_t,
        kk.nvfp4_gemm_t_k64,
        kk.nvfp4_gemm_t_m128,
        kk.nvfp4_gemm_t_m128_v2,
        kk.nvfp4_mmq_gemm,
    ];
    for kernel in gemms {
        for &m in c.ms {
            c.poison_y()?;
            let call = kernel.call().ptr("x", c.xd).dim("m", m);
            let call = if kernel.spec.name == "nvfp4_mmq_gemm" {
                call.ptr("tiles", tiles).dim("np", me.padded[0])
            } else {
                call.ptr("ct", ct).ptr("st", st).dim("np", te.padded[0])
            };
            let call = call.float("g", nw.global_scale).ptr("y", c.yd);
            c.launch(call.dim("n", n).dim("k", k).dim("kp", kp).dim("ldy", n))?;
            b.synchronize(0)?;
            let err = c.err(m, |r| nvfp4_ref(r, kernel.spec.round))?;
            c.row(rows, kernel.spec.name, m, err, 2e-6);
        }
    }
    let bf16_ref = |r: usize| nvfp4_ref(r, ActRound::Bf16);
    dq_wgmma::nvfp4_wgmma_rows(c, rows, &nw, tiles, me.padded[0], &bf16_ref)?;
    for &m in c.ms {
        dq_wgmma::act_bf16_bits(c, rows, m)?;
    }
    for p in [ct, st, tiles] {
        b.free(p);
    }
    w4a4_rows(c, rows, rng, &ne)?;
    b.free(nw.codes);
    b.free(nw.scales);
    Ok(())
}

/// W4A4: NVFP4 activation quantization bit for bit, then `nvfp4_proj_mx` against the f64
/// product of the same quantized activations.
fn w4a4_rows(
    c: &mut Case,
    rows: &mut Vec<Row>,
    rng: &mut Rand,
    ne: &layouts::Encoded,
) -> GpuResult<()> {
    let (n, k) = (c.n, c.k);
    let b = c.b.clone();
    let kp = ne.padded[1];
    let mut l = DenseFfnLayer::new(&c.ctx);
    let same = DenseWeights {
        gate: c.wf.clone(),
        up: c.wf.clone(),
        down: rng.vec(k * n, 0.1),
        hidden: k,
        inter: n,
    };
    install_nvfp4(b.as_ref(), &mut l, &same)?;
    for &m in c.ms {
        c.poison_y()?;
        let (xd, yd) = (c.xd, c.yd);
        let q = l.w4a4_gate_for_check(&mut c.ctx, xd, m, yd)?;
        b.synchronize(0)?;
        let mut qc = vec![0u8; m * kp / 2];
        let mut qs = vec![0u8; m * kp / 16];
        b.download(q.0, &mut qc)?;
        b.download(q.1, &mut qs)?;
        let qg = download_f32(b.as_ref(), q.2)?;
        let exact = (0..m).into_par_iter().all(|r| {
            let (cd, s, g) = reference::quantize_row_nvfp4(c.xr(r), kp);
            cd == qc[r * kp / 2..(r + 1) * kp / 2]
                && s == qs[r * kp / 16..(r + 1) * kp / 16]
                && g.to_bits() == qg[r].to_bits()
        });
        c.bits(rows, "quantize_act_nvfp4 (bits)", m, exact);
        let err = c.err(m, |r| {
            let (cd, s, g) = reference::quantize_row_nvfp4(c.xr(r), kp);
            let mut out = vec![0f32; n];
            let (wc, ws, wg) = (&ne.parts[0].1, &ne.parts[1].1, ne.scalars[0].1);
            reference::w4a4_row(&cd, &s, g, wc, ws, wg, n, kp, &mut out);
            out
        })?;
        c.row(rows, "nvfp4_proj_mx", m, err, 2e-6);
    }
    Ok(())
}

/// The `q4k_mmq` decode GEMVs over f32 activations: Q4_K rows (`q4k_gemv`, its batch-4 form)
/// and int8 rows with f32 row scales (`int8_rows_gemv`, its batch-4 form), against their f64
/// twins.
fn q4k_gemv_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    let qe = layouts::q4k_mmq::encode_q4k(&c.wf, n, k);
    let e8 = layouts::q4k_mmq::encode_int8(&c.wf, n, k);
    let kp = qe.padded[1];
    let sw = layouts::f32_from(&e8.parts[1].1);
    let qw = alloc_upload(b, &qe.parts[0].1)?;
    let (wq, ws) = (
        alloc_upload(b, &e8.parts[0].1)?,
        alloc_upload(b, &e8.parts[1].1)?,
    );
    let kk = c.kk;
    for kernel in [kk.q4k_gemv, kk.q4k_gemv_m, kk.int8_gemv, kk.int8_gemv_m] {
        let q4 = kernel.spec.name.starts_with("q4k");
        for m in within(c.ms, &kernel, usize::MAX) {
            c.poison_y()?;
            let call = kernel.call().ptr("x", c.xd).dim("m", m);
            let call = if q4 {
                call.ptr("w", qw)
            } else {
                call.ptr("wq", wq).ptr("sw", ws)
            };
            let call = call.ptr("y", c.yd).dim("n", n).dim("k", k).dim("kp", kp);
            c.launch(call.dim("ldy", n))?;
            b.synchronize(0)?;
            let err = c.err(m, |r| {
                let mut out = vec![0f32; n];
                if q4 {
                    reference::q4k_row(c.xr(r), &qe.parts[0].1, n, k, kp, &mut out);
                } else {
                    reference::int8_rows_row(c.xr(r), &e8.parts[0].1, &sw, n, k, kp, &mut out);
                }
                out
            })?;
            c.row(rows, kernel.spec.name, m, err, 2e-6);
        }
    }
    for p in [qw, wq, ws] {
        b.free(p);
    }
    Ok(())
}

/// q2g128: the GEMVs, the BF16 dequantization and the q8_1 activations bit for bit, the MMQ
/// GEMM against the f64 product of the same q8_1 blocks.
fn q2g128_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    let qe = layouts::q2g128::encode(&c.wf, n, k);
    let kp2 = qe.padded[1];
    let qw = alloc_upload(b, &qe.parts[0].1)?;
    let q2ref = |r: usize| {
        let mut out = vec![0f32; n];
        reference::q2_row(c.xr(r), &qe.parts[0].1, n, k, kp2, &mut out);
        out
    };
    for kernel in [c.kk.q2_gemv, c.kk.q2_gemv_m] {
        for m in within(c.ms, &kernel, usize::MAX) {
            c.poison_y()?;
            let call = kernel.call().ptr("x", c.xd).dim("m", m).ptr("w", qw);
            let call = call.ptr("y", c.yd).dim("n", n).dim("k", k).dim("kp", kp2);
            c.launch(call.dim("ldy", n))?;
            b.synchronize(0)?;
            let err = c.err(m, q2ref)?;
            c.row(rows, kernel.spec.name, m, err, 2e-6);
        }
    }
    let dq = b.alloc((n * kp2 * 2) as u64)?;
    let call =
        c.kk.q2_dequant
            .call()
            .ptr("w", qw)
            .dim("n", n)
            .dim("kp", kp2);
    c.launch(call.ptr("out", dq))?;
    b.synchronize(0)?;
    let mut got = vec![0u8; n * kp2 * 2];
    b.download(dq, &mut got)?;
    let same = got == reference::q2_dequant_bf16(&qe.parts[0].1, n, kp2);
    c.bits(rows, "q2g128_dequant_bf16 (bytes)", 0, same);
    b.free(dq);
    let bs = kp2 / Q8_1_ELEMS * Q8_1_BYTES;
    let xq = b.alloc((c.mmax * bs) as u64)?;
    for &m in c.ms {
        let call = c.kk.quant_q8_1.call().ptr("x", c.xd).dim("m", m);
        c.launch(call.dim("k", k).dim("kp", kp2).ptr("out", xq))?;
        c.poison_y()?;
        let call = c.kk.q2_mmq.call().ptr("xq", xq).dim("m", m).ptr("w", qw);
        c.launch(call.ptr("y", c.yd).dim("n", n).dim("kp", kp2).dim("ldy", n))?;
        b.synchronize(0)?;
        let mut q = vec![0u8; m * bs];
        b.download(xq.view(0, q.len() as u64), &mut q)?;
        let first_diff = (0..m).into_par_iter().find_first(|&r| {
            reference::quantize_row_q8_1_act(c.xr(r), kp2) != q[r * bs..(r + 1) * bs]
        });
        if let Some(r) = first_diff {
            report_q8_1_diff(c, m, r, &q[r * bs..(r + 1) * bs], kp2);
        }
        c.bits(rows, "quantize_act_q8_1 (bits)", m, first_diff.is_none());
        let err = c.err(m, |r| {
            let mut out = vec![0f32; n];
            let xr = &q[r * bs..(r + 1) * bs];
            reference::q2_mmq_row(xr, &qe.parts[0].1, n, kp2, &mut out);
            out
        })?;
        c.row(rows, "q2g128_mmq_gemm", m, err, 2e-6);
    }
    b.free(xq);
    b.free(qw);
    Ok(())
}

/// Print the first q8_1 block of row `r` where the device differs from the reference.
fn report_q8_1_diff(c: &Case, m: usize, r: usize, got: &[u8], kp: usize) {
    let want = reference::quantize_row_q8_1_act(c.xr(r), kp);
    let blk = (0..got.len() / Q8_1_BYTES)
        .find(|&j| {
            want[j * Q8_1_BYTES..(j + 1) * Q8_1_BYTES] != got[j * Q8_1_BYTES..(j + 1) * Q8_1_BYTES]
        })
        .unwrap_or(0);
    let (lo, hi) = ((blk * 32).min(c.k), ((blk + 1) * 32).min(c.k));
    eprintln!(
        "quantize_act_q8_1 {}x{} m={m}: row {r} block {blk} differs\n  gpu {:?}\n  cpu {:?}\n  x {:?}",
        c.shape.0,
        c.shape.1,
        &got[blk * Q8_1_BYTES..(blk + 1) * Q8_1_BYTES],
        &want[blk * Q8_1_BYTES..(blk + 1) * Q8_1_BYTES],
        &c.xr(r)[lo..hi]
    );
}

/// The load-time repacks byte for byte against the converters (`nvfp4_mmq_repack`,
/// `nvfp4_to_q4k`, `nvfp4_to_int8_rows`), then the Q4_K MMQ and int8 down GEMMs over the
/// GPU-built copies.
fn repack_rows(c: &Case, rows: &mut Vec<Row>, rng: &mut Rand) -> GpuResult<()> {
    let (n, k) = (c.n, c.k);
    let b = c.b.clone();
    let mut ctx = ForwardContext::new(b.clone(), c.ctx.config, 1, ModelLevers::default())?;
    let mut l = DenseFfnLayer::new(&ctx);
    let down = DenseWeights {
        gate: c.wf.clone(),
        up: c.wf.clone(),
        down: rng.vec(k * n, 0.1),
        hidden: k,
        inter: n,
    };
    install_nvfp4(b.as_ref(), &mut l, &down)?;
    l.finalize_nvfp4_mmq_load(&mut ctx, k, n, 0)?;
    let ne = layouts::nvfp4::encode(&c.wf, n, k);
    let want = layouts::nvfp4_mmq::from_nvfp4(&ne.parts[0].1, &ne.parts[1].1, 0.0, n, ne.padded[1])
        .parts
        .remove(0)
        .1;
    let got_p = l
        .get(crate::ffn::key::NVFP4_MMQ)
        .and_then(|t| t[0])
        .ok_or_else(|| GpuError::Invalid("finalize built no gate tiles".into()))?;
    let bytes = |p: DevicePtr| -> GpuResult<Vec<u8>> {
        let mut v = vec![0u8; p.bytes as usize];
        b.download(p, &mut v)?;
        Ok(v)
    };
    c.bits(
        rows,
        "nvfp4_mmq_repack (bytes == converter)",
        0,
        bytes(got_p)? == want,
    );
    // finalize_q4k_load: the GPU Q4_K (gate, and down with the Q4_K lever) and int8 (down)
    // bytes equal the converter's encoders on the NVFP4 values.
    let wd = nvfp4_decoded(&down);
    for down_q4k in [false, true] {
        let levers = ModelLevers {
            q4k_mmq: true,
            q4k_mmq_down_q4k: down_q4k,
            ..ModelLevers::default()
        };
        let mut qctx = ForwardContext::new(b.clone(), c.ctx.config, 1, levers)?;
        let mut ql = DenseFfnLayer::new(&qctx);
        install_nvfp4(b.as_ref(), &mut ql, &down)?;
        ql.finalize_q4k_load(&mut qctx, k, n, 0)?;
        let q = *ql
            .get(crate::ffn::key::Q4K_MMQ)
            .ok_or_else(|| GpuError::Invalid("finalize_q4k_load built nothing".into()))?;
        let gate_ok = bytes(q.gate)? == layouts::q4k_mmq::encode_q4k(&wd.gate, n, k).parts[0].1;
        let down_ok = match q.down {
            crate::ffn::Q4kDown::Q4k(p) => {
                bytes(p)? == layouts::q4k_mmq::encode_q4k(&wd.down, k, n).parts[0].1
            }
            crate::ffn::Q4kDown::Int8 { codes, scales } => {
                let e = layouts::q4k_mmq::encode_int8(&wd.down, k, n);
                bytes(codes)? == e.parts[0].1 && bytes(scales)? == e.parts[1].1
            }
        };
        c.bits(rows, "nvfp4_to_q4k gate (bytes == converter)", 0, gate_ok);
        let down_check = if down_q4k {
            "nvfp4_to_q4k down (bytes == converter)"
        } else {
            "nvfp4_to_int8_rows down (bytes == converter)"
        };
        c.bits(rows, down_check, 0, down_ok);
        q4k_gemm_rows(c, rows, rng, &q, down_q4k)?;
    }
    Ok(())
}

/// The GEMMs over the GPU-built copies: Q4_K gate x q8_1 activations (the GPU's own
/// quantization, its bits checked with q2g128) against the f64 product of the same blocks; the
/// int8 down GEMM against its f64 twin on bf16-requantized inputs.
fn q4k_gemm_rows(
    c: &Case,
    rows: &mut Vec<Row>,
    rng: &mut Rand,
    q: &crate::ffn::Q4kMmqWeights,
    down_q4k: bool,
) -> GpuResult<()> {
    let (n, k, mmax) = (c.n, c.k, c.mmax);
    let b = c.b.as_ref();
    let bytes = |p: DevicePtr| -> GpuResult<Vec<u8>> {
        let mut v = vec![0u8; p.bytes as usize];
        b.download(p, &mut v)?;
        Ok(v)
    };
    let (kp_g, kp_d) = (q.kp_gate, q.kp_down);
    let bs = kp_g / Q8_1_ELEMS * Q8_1_BYTES;
    let gate_bytes = bytes(q.gate)?;
    let xq = b.alloc((mmax * bs) as u64)?;
    let act = rng.vec(mmax * n, 1.0);
    let actd = alloc_upload(b, bytemuck::cast_slice(&act))?;
    let (aq, sa) = (b.alloc((mmax * kp_d) as u64)?, b.alloc((mmax * 4) as u64)?);
    let yk = b.alloc((mmax * k * 4) as u64)?;
    let kk = c.kk;
    for &m in c.ms {
        if !down_q4k {
            let call = kk.quant_q8_1.call().ptr("x", c.xd).dim("m", m);
            c.launch(call.dim("k", k).dim("kp", kp_g).ptr("out", xq))?;
            c.poison_y()?;
            let call = kk
                .q4k_gemm
                .call()
                .ptr("xq", xq)
                .dim("m", m)
                .ptr("w", q.gate);
            c.launch(
                call.ptr("y", c.yd)
                    .dim("n", n)
                    .dim("kp", kp_g)
                    .dim("ldy", n),
            )?;
            b.synchronize(0)?;
            let mut qx = vec![0u8; m * bs];
            b.download(xq.view(0, qx.len() as u64), &mut qx)?;
            let err = c.err(m, |r| {
                let mut out = vec![0f32; n];
                let xr = &qx[r * bs..(r + 1) * bs];
                reference::q4k_mmq_row(xr, &gate_bytes, n, kp_g, &mut out);
                out
            })?;
            c.row(rows, kk.q4k_gemm.spec.name, m, err, 2e-6);
        }
        if let crate::ffn::Q4kDown::Int8 { codes, scales } = q.down {
            let call = kk.requant_int8.call().ptr("x", actd).dim("m", m);
            c.launch(call.dim("k", n).dim("kp", kp_d).ptr("qc", aq).ptr("qs", sa))?;
            poison(b, yk)?;
            let call = kk.int8_gemm.call().ptr("aq", aq).ptr("sa", sa).dim("m", m);
            let call = call.ptr("wq", codes).ptr("sw", scales).ptr("y", yk);
            c.launch(call.dim("n", k).dim("kp", kp_d).dim("ldy", k))?;
            b.synchronize(0)?;
            let (wc, ws) = (bytes(codes)?, layouts::f32_from(&bytes(scales)?));
            let err = sampled_err(b, yk, m, k, |r| {
                let (qa, d) = reference::requant_row_bf16_int8(&act[r * n..(r + 1) * n], kp_d);
                let mut out = vec![0f32; k];
                reference::int8_row(&qa, d, &wc, &ws, k, kp_d, &mut out);
                out
            })?;
            c.row(rows, kk.int8_gemm.spec.name, m, err, 2e-6);
            dq_wgmma::int8_wgmma_bits(c, rows, m, (aq, sa), (codes, scales), k, kp_d, yk)?;
        }
    }
    if !down_q4k {
        dq_wgmma::q4k_wgmma_rows(c, rows, q.gate, &gate_bytes, kp_g)?;
    }
    for p in [xq, actd, aq, sa, yk] {
        b.free(p);
    }
    Ok(())
}
