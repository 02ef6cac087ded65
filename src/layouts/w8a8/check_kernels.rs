//! The W8A8 rows: the activation quantization bit for bit, then the FP8 tensor-core GEMM. `gpu-
//! check`'s kernel section (`check::kernels`), moved here unchanged.

use crate::check::kernels::*;
use crate::check::*;
use crate::converters::layouts;
use crate::ffn::W8a8Weight;
use crate::gpu::reference::{self};
use crate::gpu::{GpuResult, alloc_upload, download_f32};
use rayon::prelude::*;

/// W8A8: activation quantization bit for bit, then the FP8 tensor-core GEMM.
pub(crate) fn w8a8_rows(c: &mut Case, rows: &mut Vec<Row>) -> GpuResult<()> {
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
        crate::layouts::fp8::check_w8a8::fused_act_bits(c, rows, fused, plain, ww.kp, 1, m)?;
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
            c.kk.w8a8_gemm,
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

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[("w8a8", |c, r, _| w8a8_rows(c, r))];
