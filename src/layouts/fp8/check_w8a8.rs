//! The FP8 activation quantizers fused with the activation product, and the FP8 arm's W8A8
//! prefill: the per-group quantizer bit for bit against its twin, the block-scaled `fp8_wgmma`
//! GEMM against its f64 twin.

use crate::check::kernels::*;
use crate::check::*;
use crate::gpu::reference::{self};
use crate::gpu::table::Kernel;
use crate::gpu::{GpuResult, download_f32};
use rayon::prelude::*;

/// A fused quantizer (`fused`: codes of `act(g, u)` from gate and up) against the unfused chain
/// (`act_mul_silu`, then `plain` over its f32 product), bit for bit, with the case's x as both
/// gate and up; `per_row` scales a row (1, or kp / 128 for the per-group quantizers).
pub(crate) fn fused_act_bits(
    c: &mut Case,
    rows: &mut Vec<Row>,
    fused: Kernel,
    plain: Kernel,
    kp: usize,
    per_row: usize,
    m: usize,
) -> GpuResult<()> {
    let (b, k, x) = (c.b.clone(), c.k, c.xd);
    if !fused.ok() || !plain.ok() {
        return Ok(());
    }
    let (qn, sn) = (m * kp, m * per_row * 4);
    let tmp = b.alloc((m * k * 4) as u64)?;
    let q = b.alloc((2 * qn) as u64)?;
    let sx = b.alloc((2 * sn) as u64)?;
    let (q1, q2) = (q.view(0, qn as u64), q.view(qn as u64, qn as u64));
    let (s1, s2) = (sx.view(0, sn as u64), sx.view(sn as u64, sn as u64));
    let run = || -> GpuResult<bool> {
        let call = fused
            .call()
            .ptr("g", x)
            .ptr("u", x)
            .dim("gs", k)
            .dim("us", k);
        let call = call.dim("act", 0).dim("m", m).dim("k", k).dim("kp", kp);
        c.launch(call.ptr("q", q1).ptr("sx", s1))?;
        let call = c.kk.act_silu.call().ptr("g", x).ptr("u", x).ptr("out", tmp);
        let call = call.dim("rows", m).dim("cols", k).dim("gs", k).dim("us", k);
        c.launch(call.dim("os", k))?;
        let call = plain.call().ptr("x", tmp).dim("m", m).dim("k", k);
        c.launch(call.dim("kp", kp).ptr("q", q2).ptr("sx", s2))?;
        b.synchronize(0)?;
        let mut codes = vec![0u8; 2 * (qn + sn)];
        let (cq, cs) = codes.split_at_mut(2 * qn);
        b.download(q, cq)?;
        b.download(sx, cs)?;
        Ok(cq[..qn] == cq[qn..] && cs[..sn] == cs[sn..])
    };
    let same = run();
    for p in [tmp, q, sx] {
        b.free(p);
    }
    let name = format!("{} (bits = act_mul + quantize)", fused.spec.name);
    c.bits(rows, &name, m, same?);
    Ok(())
}

/// The FP8 arm's W8A8 prefill at every m: `quantize_act_fp8_g128` bit for bit against
/// `quantize_row_fp8_g128`, the fused quantizer against the unfused chain, and `fp8_wgmma` over
/// the quantized rows against `fp8_w8a8_block_row` (1e-3: Hopper's FP8 accumulator within a
/// 128-k stage, as the W8A8 GEMM's rows).
pub(crate) fn fp8_w8a8_rows(c: &mut Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let kk = c.kk;
    if !kk.quant_fp8_g128.ok() || !kk.fp8_wgmma.ok() {
        return Ok(());
    }
    let (n, k, b) = (c.n, c.k, c.b.clone());
    let (w, codes, scales) = upload_fp8(b.as_ref(), &c.wf, n, k)?;
    let (kp, g) = (w.kp, w.kp / 128);
    let (q, sx) = (c.ctx.arena.act_codes, c.ctx.arena.act_scale);
    for &m in c.ms {
        let call = kk
            .quant_fp8_g128
            .call()
            .ptr("x", c.xd)
            .dim("m", m)
            .dim("k", k);
        c.launch(call.dim("kp", kp).ptr("q", q).ptr("sx", sx))?;
        b.synchronize(0)?;
        let mut qh = vec![0u8; m * kp];
        b.download(q.view(0, qh.len() as u64), &mut qh)?;
        let sh = download_f32(b.as_ref(), sx.view(0, (m * g * 4) as u64))?;
        let exact = (0..m).into_par_iter().all(|r| {
            let (wq, ws) = reference::quantize_row_fp8_g128(c.xr(r), kp);
            wq == qh[r * kp..(r + 1) * kp] && same_bits(&ws, &sh[r * g..(r + 1) * g])
        });
        c.bits(rows, "quantize_act_fp8_g128 (bits)", m, exact);
        c.poison_y()?;
        let call = kk.fp8_wgmma.call().ptr("q", q).ptr("sx", sx).dim("m", m);
        let call = call.ptr("w", w.weight).ptr("s", w.scale).ptr("y", c.yd);
        c.launch(call.dim("n", n).dim("kp", kp).dim("ldy", n))?;
        b.synchronize(0)?;
        let err = c.err(m, |r| {
            let mut out = vec![0f32; n];
            let (qr, sr) = (&qh[r * kp..(r + 1) * kp], &sh[r * g..(r + 1) * g]);
            reference::fp8_w8a8_block_row(qr, sr, &codes, &scales, n, kp, &mut out);
            out
        })?;
        c.row(rows, "fp8_wgmma", m, err, 1e-3);
        let (fused, plain) = (kk.quant_fp8_act_g128, kk.quant_fp8_g128);
        fused_act_bits(c, rows, fused, plain, kp, g, m)?;
    }
    b.free(w.weight);
    b.free(w.scale);
    Ok(())
}
