//! The `q4k_mmq` rows: its decode GEMVs, the load-time repacks byte for byte, and the
//! GEMMs over the GPU-built copies. `gpu-check`'s kernel section (`check::kernels`), moved here
//! unchanged.

use crate::check::kernels::*;
use crate::check::*;
use crate::converters::layouts;
use crate::ffn::{DenseFfnLayer, ForwardContext};
use crate::gpu::reference::{self};
use crate::gpu::sizes::*;
use crate::gpu::{DevicePtr, GpuError, GpuResult, ModelLevers, alloc_upload};
use crate::testing::*;

/// The `q4k_mmq` decode GEMVs over f32 activations: Q4_K rows (`q4k_gemv`, its batch-4 form)
/// and int8 rows with f32 row scales (`int8_rows_gemv`, its batch-4 form), against their f64
/// twins.
pub(crate) fn q4k_gemv_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
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

/// The load-time repacks byte for byte against the converters (`nvfp4_mmq_repack`,
/// `nvfp4_to_q4k`, `nvfp4_to_int8_rows`), then the Q4_K MMQ and int8 down GEMMs over the
/// GPU-built copies.
pub(crate) fn repack_rows(c: &Case, rows: &mut Vec<Row>, rng: &mut Rand) -> GpuResult<()> {
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
/// quantization, bit for bit its twin in the 2-bit layout's rows) against the f64 product
/// of the same blocks; the int8 down GEMM against its f64 twin on bf16-requantized inputs.
pub(crate) fn q4k_gemm_rows(
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

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[("q4k_mmq", |c, r, g| {
    q4k_gemv_rows(c, r)?;
    repack_rows(c, r, g)
})];
