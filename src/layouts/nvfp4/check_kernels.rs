//! The NVFP4 rows: the GEMVs, the batch-m tiers, the base, `_t` and MMQ GEMMs, and W4A4. `gpu-
//! check`'s kernel section (`check::kernels`), moved here unchanged.

use crate::check::kernels::*;
use crate::check::*;
use crate::converters::layouts;
use crate::ffn::DenseFfnLayer;
use crate::gpu::reference::{self, ActRound};
use crate::gpu::{GpuResult, alloc_upload, download_f32};
use crate::layouts::nvfp4::arms::nvfp4_args;
use crate::testing::*;
use rayon::prelude::*;

/// NVFP4: the GEMVs and batch-m tiers within their caps, the base GEMM, the `_t` GEMMs over
/// the transposed copy, the MMQ GEMM over the tiles, and W4A4.
pub(crate) fn nvfp4_rows(c: &mut Case, rows: &mut Vec<Row>, rng: &mut Rand) -> GpuResult<()> {
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
pub(crate) fn w4a4_rows(
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

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[("nvfp4", nvfp4_rows)];
