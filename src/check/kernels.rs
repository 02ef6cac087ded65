//! Kernel rows: every kernel against the host reference (`reference.rs`) on fresh random data.

use super::*;
use crate::converters::layouts;
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext, W8a8Weight};
use crate::gpu::reference::{self, ActRound};
use crate::gpu::sizes::*;
use crate::gpu::{
    DevicePtr, GemmBf16, GpuBackend, GpuResult, ModelLevers, alloc_upload, download_f32, upload_f32,
};
use crate::testing::*;
use rayon::prelude::*;
use std::sync::Arc;

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
        let cfg = FfnConfig {
            hidden: h,
            inter: i,
        };
        let mut ctx = ForwardContext::new(b.clone(), cfg, mmax, ModelLevers::default())?;
        let layer = DenseFfnLayer::new(&ctx);
        let (n, k) = (i, h); // gate/up shape
        let wf = rng.vec(n * k, 1.0 / (k as f32).sqrt());
        let (w, codes, scales) = upload_fp8(b.as_ref(), &wf, n, k)?;
        let x = rng.vec(mmax * k, 1.0);
        let xr = |r: usize| &x[r * k..(r + 1) * k];
        let xd = b.alloc((mmax * k * 4) as u64)?;
        upload_f32(b.as_ref(), xd, &x)?;
        let yd = b.alloc((mmax * n * 4) as u64)?;
        let kk = *layer.kernels();
        let fp8: [(&str, _, usize, ActRound); 5] = [
            ("w8a16_gemv_batch4", kk.fp8_b4, 4, ActRound::None),
            ("w8a16_gemv_batch16", kk.fp8_b16, 16, ActRound::None),
            ("w8a16_gemm_m16", kk.fp8_m16, 32, ActRound::Bf16),
            (
                "w8a16_gemm_pipelined",
                kk.fp8_pipe,
                usize::MAX,
                ActRound::Bf16,
            ),
            ("w8a16_gemm", kk.fp8_base, usize::MAX, ActRound::None),
        ];
        for (name, handle, cap, round) in fp8 {
            for &m in ms.iter().filter(|&&m| m <= cap) {
                poison(b.as_ref(), yd)?;
                layer.fp8_launch(&mut ctx, handle, &w, xd, m, yd, n)?;
                b.synchronize(0)?;
                let err = sampled_err(b.as_ref(), yd, m, n, |r| {
                    let mut out = vec![0f32; n];
                    reference::fp8_block_row(xr(r), &codes, &scales, n, k, w.kp, round, &mut out);
                    out
                })?;
                push(&mut rows, name, (h, i), m, err, 2e-6);
            }
        }
        // W8A8: activation quantization bit for bit, then the FP8 tensor-core GEMM.
        let we = layouts::w8a8::encode(&wf, n, k);
        let ww = W8a8Weight {
            weight: alloc_upload(b.as_ref(), &we.parts[0].1)?,
            scale: alloc_upload(b.as_ref(), &we.parts[1].1)?,
            n,
            k,
            kp: we.padded[1],
        };
        let wsc = layouts::f32_from(&we.parts[1].1);
        for &m in ms {
            poison(b.as_ref(), yd)?;
            layer.w8a8_project(&mut ctx, &ww, xd, m, yd, n)?;
            b.synchronize(0)?;
            let mut q = vec![0u8; m * ww.kp];
            b.download(ctx.arena.act_codes.view(0, q.len() as u64), &mut q)?;
            let sx = download_f32(b.as_ref(), ctx.arena.act_scale.view(0, (m * 4) as u64))?;
            let exact = (0..m).into_par_iter().all(|r| {
                let (qr, s) = reference::quantize_row_fp8(xr(r), ww.kp);
                qr == q[r * ww.kp..(r + 1) * ww.kp] && s.to_bits() == sx[r].to_bits()
            });
            push(
                &mut rows,
                "quantize_act_fp8_row (bits)",
                (h, i),
                m,
                if exact { 0.0 } else { 1.0 },
                0.0,
            );
            let err = sampled_err(b.as_ref(), yd, m, n, |r| {
                let (qr, s) = reference::quantize_row_fp8(xr(r), ww.kp);
                let mut out = vec![0f32; n];
                reference::w8a8_row(&qr, s, &we.parts[0].1, &wsc, n, ww.kp, &mut out);
                out
            })?;
            // FP8 tensor-core accumulation is not full f32 on Hopper: 1e-3.
            push(&mut rows, "w8a8_gemm", (h, i), m, err, 1e-3);
        }
        // BF16: GEMV (m <= 4) and cuBLAS.
        let be = layouts::bf16::encode(&wf, n, k);
        let bw = crate::ffn::Bf16Weight {
            weight: alloc_upload(b.as_ref(), &be.parts[0].1)?,
            n,
            k,
            kp: be.padded[1],
        };
        let bf16_ref = |r: usize, round: ActRound| {
            let mut out = vec![0f32; n];
            reference::bf16_row(xr(r), &be.parts[0].1, n, k, bw.kp, round, &mut out);
            out
        };
        for &m in ms {
            if m <= 4 {
                poison(b.as_ref(), yd)?;
                layer.bf16_gemv(&mut ctx, &bw, xd, m, yd, n)?;
                b.synchronize(0)?;
                let err = sampled_err(b.as_ref(), yd, m, n, |r| bf16_ref(r, ActRound::None))?;
                push(&mut rows, "bf16_gemv_batch4", (h, i), m, err, 2e-6);
            }
            poison(b.as_ref(), yd)?;
            let xb = layer.to_bf16(&mut ctx, xd, m * k)?;
            b.gemm_bf16(
                &GemmBf16 {
                    x: xb,
                    w: bw.weight,
                    y: yd,
                    m,
                    n,
                    k,
                    kw: bw.kp,
                },
                0,
            )?;
            b.synchronize(0)?;
            let err = sampled_err(b.as_ref(), yd, m, n, |r| bf16_ref(r, ActRound::Bf16))?;
            // cuBLAS blocks the k sum its own way: 1e-5.
            push(&mut rows, "cublas gemm_bf16", (h, i), m, err, 1e-5);
        }
        // NVFP4: the decode GEMV on sampled rows, and the MMQ repack byte for byte.
        let ne = layouts::nvfp4::encode(&wf, n, k);
        let nw = crate::ffn::Nvfp4Weight {
            codes: alloc_upload(b.as_ref(), &ne.parts[0].1)?,
            scales: alloc_upload(b.as_ref(), &ne.parts[1].1)?,
            global_scale: ne.scalars[0].1,
            n,
            k,
            kp: ne.padded[1],
        };
        // (name, kernel, row cap, activation rounding, GEMV launch shape?)
        let nvfp4: [(&str, _, usize, ActRound, bool); 8] = [
            ("w4a16_gemv", kk.nvfp4_gemv, 4, ActRound::None, true),
            (
                "w4a16_gemv_ksplit",
                kk.nvfp4_gemv_ksplit,
                4,
                ActRound::None,
                true,
            ),
            (
                "w4a16_gemv_batch2",
                kk.nvfp4_gemv_b2,
                2,
                ActRound::None,
                true,
            ),
            (
                "w4a16_gemv_batch3",
                kk.nvfp4_gemv_b3,
                3,
                ActRound::None,
                true,
            ),
            (
                "nvfp4_proj_small_m4",
                kk.nvfp4_small_m4,
                4,
                ActRound::None,
                true,
            ),
            (
                "nvfp4_proj_small_m8",
                kk.nvfp4_small_m8,
                8,
                ActRound::None,
                true,
            ),
            (
                "nvfp4_proj_small_m16",
                kk.nvfp4_small_m16,
                16,
                ActRound::None,
                true,
            ),
            (
                "w4a16_gemm",
                kk.nvfp4_gemm,
                usize::MAX,
                ActRound::Bf16,
                false,
            ),
        ];
        for (name, handle, cap, round, gemv) in nvfp4 {
            for &m in ms.iter().filter(|&&m| m <= cap) {
                poison(b.as_ref(), yd)?;
                let a = |v: usize| crate::gpu::KArg::Dim(v);
                use crate::gpu::KArg::{F32, Ptr};
                let (grid, block) = if name == "w4a16_gemv_ksplit" {
                    ((n.div_ceil(4) as u32, 1, 1), (256, 1, 1))
                } else if gemv {
                    (
                        (n.div_ceil(crate::ffn::NVFP4_GEMV_COLS) as u32, 1, 1),
                        (256, 1, 1),
                    )
                } else {
                    (
                        (n.div_ceil(128) as u32, m.div_ceil(64) as u32, 1),
                        (128, 1, 1),
                    )
                };
                let cfg = crate::gpu::LaunchCfg {
                    grid,
                    block,
                    smem: 0,
                };
                b.launch(
                    handle,
                    cfg,
                    0,
                    &[
                        Ptr(xd),
                        a(m),
                        Ptr(nw.codes),
                        Ptr(nw.scales),
                        F32(nw.global_scale),
                        Ptr(yd),
                        a(n),
                        a(k),
                        a(nw.kp),
                        a(n),
                    ],
                )?;
                b.synchronize(0)?;
                let err = sampled_err(b.as_ref(), yd, m, n, |r| {
                    let mut out = vec![0f32; n];
                    reference::nvfp4_row(
                        xr(r),
                        &ne.parts[0].1,
                        &ne.parts[1].1,
                        nw.global_scale,
                        n,
                        k,
                        nw.kp,
                        round,
                        &mut out,
                    );
                    out
                })?;
                push(&mut rows, name, (h, i), m, err, 2e-6);
            }
        }
        // The `_t` GEMMs over the transposed copy and the MMQ GEMM over the tiles: the same
        // numerics as w4a16_gemm (bf16 activations, f32 accumulation).
        let kp = nw.kp;
        let te = layouts::nvfp4_t::from_nvfp4(&ne.parts[0].1, &ne.parts[1].1, 0.0, n, kp);
        let me = layouts::nvfp4_mmq::from_nvfp4(&ne.parts[0].1, &ne.parts[1].1, 0.0, n, kp);
        let (ct, st, tiles) = (
            alloc_upload(b.as_ref(), &te.parts[0].1)?,
            alloc_upload(b.as_ref(), &te.parts[1].1)?,
            alloc_upload(b.as_ref(), &me.parts[0].1)?,
        );
        let gemms: [(&str, _, usize, bool); 5] = [
            ("w4a16_gemm_t", kk.nvfp4_gemm_t, 64, false),
            ("w4a16_gemm_t_k64", kk.nvfp4_gemm_t_k64, 64, false),
            ("w4a16_gemm_t_m128", kk.nvfp4_gemm_t_m128, 128, false),
            ("w4a16_gemm_t_m128_v2", kk.nvfp4_gemm_t_m128_v2, 128, false),
            ("nvfp4_mmq_gemm", kk.nvfp4_mmq_gemm, 64, true),
        ];
        let nvfp4_ref = |r: usize, round: ActRound| {
            let mut out = vec![0f32; n];
            reference::nvfp4_row(
                xr(r),
                &ne.parts[0].1,
                &ne.parts[1].1,
                nw.global_scale,
                n,
                k,
                kp,
                round,
                &mut out,
            );
            out
        };
        for (name, handle, bm, mmq) in gemms {
            for &m in ms {
                poison(b.as_ref(), yd)?;
                use crate::gpu::KArg::{F32, I32, Ptr};
                let a = |v: usize| I32(v as i32);
                let (np, grid_n) = if mmq {
                    (me.padded[0], me.padded[0] / 128)
                } else {
                    (te.padded[0], n.div_ceil(128))
                };
                let cfg = crate::gpu::LaunchCfg::grid(
                    grid_n,
                    m.div_ceil(bm),
                    if mmq { 128 } else { 2 * bm },
                );
                let mut args = vec![Ptr(xd), a(m)];
                if mmq {
                    args.push(Ptr(tiles));
                } else {
                    args.extend([Ptr(ct), Ptr(st)]);
                }
                args.extend([
                    F32(nw.global_scale),
                    Ptr(yd),
                    a(n),
                    a(np),
                    a(k),
                    a(kp),
                    a(n),
                ]);
                b.launch(handle, cfg, 0, &args)?;
                b.synchronize(0)?;
                let err = sampled_err(b.as_ref(), yd, m, n, |r| nvfp4_ref(r, ActRound::Bf16))?;
                push(&mut rows, name, (h, i), m, err, 2e-6);
            }
        }
        // W4A4: NVFP4 activation quantization bit for bit, then nvfp4_proj_mx against the f64
        // product of the same quantized activations.
        {
            let mut l = DenseFfnLayer::new(&ctx);
            let same = DenseWeights {
                gate: wf.clone(),
                up: wf.clone(),
                down: rng.vec(k * n, 0.1),
                hidden: k,
                inter: n,
            };
            install_nvfp4(b.as_ref(), &mut l, &same)?;
            for &m in ms {
                poison(b.as_ref(), yd)?;
                let q = l.w4a4_gate_for_check(&mut ctx, xd, m, yd)?;
                b.synchronize(0)?;
                let mut qc = vec![0u8; m * kp / 2];
                let mut qs = vec![0u8; m * kp / 16];
                b.download(q.0, &mut qc)?;
                b.download(q.1, &mut qs)?;
                let qg = download_f32(b.as_ref(), q.2)?;
                let exact = (0..m).into_par_iter().all(|r| {
                    let (c, s, g) = reference::quantize_row_nvfp4(xr(r), kp);
                    c == qc[r * kp / 2..(r + 1) * kp / 2]
                        && s == qs[r * kp / 16..(r + 1) * kp / 16]
                        && g.to_bits() == qg[r].to_bits()
                });
                push(
                    &mut rows,
                    "quantize_act_nvfp4 (bits)",
                    (h, i),
                    m,
                    if exact { 0.0 } else { 1.0 },
                    0.0,
                );
                let err = sampled_err(b.as_ref(), yd, m, n, |r| {
                    let (c, s, g) = reference::quantize_row_nvfp4(xr(r), kp);
                    let mut out = vec![0f32; n];
                    reference::w4a4_row(
                        &c,
                        &s,
                        g,
                        &ne.parts[0].1,
                        &ne.parts[1].1,
                        nw.global_scale,
                        n,
                        kp,
                        &mut out,
                    );
                    out
                })?;
                push(&mut rows, "nvfp4_proj_mx", (h, i), m, err, 2e-6);
            }
        }
        for p in [ct, st, tiles] {
            b.free(p);
        }
        // q2g128: the GEMVs, the BF16 dequantization and the q8_1 activations bit for bit,
        // the MMQ GEMM against the f64 product of the same q8_1 blocks.
        {
            use crate::gpu::KArg::{I32, Ptr};
            let a = |v: usize| I32(v as i32);
            let qe = layouts::q2g128::encode(&wf, n, k);
            let kp2 = qe.padded[1];
            let qw = alloc_upload(b.as_ref(), &qe.parts[0].1)?;
            let q2ref = |r: usize| {
                let mut out = vec![0f32; n];
                reference::q2_row(xr(r), &qe.parts[0].1, n, k, kp2, &mut out);
                out
            };
            for (name, handle, cap) in [
                ("q2g128_gemv", kk.q2_gemv, 1usize),
                ("q2g128_gemv_batchm", kk.q2_gemv_m, 4),
            ] {
                for &m in ms.iter().filter(|&&m| m <= cap) {
                    poison(b.as_ref(), yd)?;
                    let cfg = crate::gpu::LaunchCfg::grid(n.div_ceil(8), 1, 256);
                    let args = [Ptr(xd), a(m), Ptr(qw), Ptr(yd), a(n), a(k), a(kp2), a(n)];
                    b.launch(handle, cfg, 0, &args)?;
                    b.synchronize(0)?;
                    let err = sampled_err(b.as_ref(), yd, m, n, q2ref)?;
                    push(&mut rows, name, (h, i), m, err, 2e-6);
                }
            }
            let dq = b.alloc((n * kp2 * 2) as u64)?;
            let cfg = crate::gpu::LaunchCfg::grid((n * kp2 / 128 * 32).div_ceil(256), 1, 256);
            b.launch(kk.q2_dequant, cfg, 0, &[Ptr(qw), a(n), a(kp2), Ptr(dq)])?;
            b.synchronize(0)?;
            let mut got = vec![0u8; n * kp2 * 2];
            b.download(dq, &mut got)?;
            let same = got == reference::q2_dequant_bf16(&qe.parts[0].1, n, kp2);
            push(
                &mut rows,
                "q2g128_dequant_bf16 (bytes)",
                (h, i),
                0,
                if same { 0.0 } else { 1.0 },
                0.0,
            );
            b.free(dq);
            let bs = kp2 / Q8_1_ELEMS * Q8_1_BYTES;
            let xq = b.alloc((mmax * bs) as u64)?;
            for &m in ms {
                let cfg = crate::gpu::LaunchCfg::grid((kp2 / 32).div_ceil(8), m, 256);
                b.launch(
                    kk.quant_q8_1,
                    cfg,
                    0,
                    &[Ptr(xd), a(m), a(k), a(kp2), Ptr(xq)],
                )?;
                poison(b.as_ref(), yd)?;
                let cfg = crate::gpu::LaunchCfg::mmq_tile(m, n);
                b.launch(
                    kk.q2_mmq,
                    cfg,
                    0,
                    &[Ptr(xq), a(m), Ptr(qw), Ptr(yd), a(n), a(kp2), a(n)],
                )?;
                b.synchronize(0)?;
                let mut q = vec![0u8; m * bs];
                b.download(xq.view(0, q.len() as u64), &mut q)?;
                let first_diff = (0..m).into_par_iter().find_first(|&r| {
                    reference::quantize_row_q8_1_act(xr(r), kp2) != q[r * bs..(r + 1) * bs]
                });
                if let Some(r) = first_diff {
                    let want = reference::quantize_row_q8_1_act(xr(r), kp2);
                    let got = &q[r * bs..(r + 1) * bs];
                    let blk = (0..bs / Q8_1_BYTES)
                        .find(|&j| {
                            want[j * Q8_1_BYTES..(j + 1) * Q8_1_BYTES]
                                != got[j * Q8_1_BYTES..(j + 1) * Q8_1_BYTES]
                        })
                        .unwrap_or(0);
                    eprintln!(
                        "quantize_act_q8_1 {h}x{i} m={m}: row {r} block {blk} differs\n  gpu {:?}\n  cpu {:?}\n  x {:?}",
                        &got[blk * Q8_1_BYTES..(blk + 1) * Q8_1_BYTES],
                        &want[blk * Q8_1_BYTES..(blk + 1) * Q8_1_BYTES],
                        &xr(r)[(blk * 32).min(k)..((blk + 1) * 32).min(k)]
                    );
                }
                let exact = first_diff.is_none();
                push(
                    &mut rows,
                    "quantize_act_q8_1 (bits)",
                    (h, i),
                    m,
                    if exact { 0.0 } else { 1.0 },
                    0.0,
                );
                let err = sampled_err(b.as_ref(), yd, m, n, |r| {
                    let mut out = vec![0f32; n];
                    reference::q2_mmq_row(
                        &q[r * bs..(r + 1) * bs],
                        &qe.parts[0].1,
                        n,
                        kp2,
                        &mut out,
                    );
                    out
                })?;
                push(&mut rows, "q2g128_mmq_gemm", (h, i), m, err, 2e-6);
            }
            b.free(xq);
            b.free(qw);
        }
        {
            let mut l = DenseFfnLayer::new(&ctx);
            let down = DenseWeights {
                gate: wf.clone(),
                up: wf.clone(),
                down: rng.vec(k * n, 0.1),
                hidden: k,
                inter: n,
            };
            install_nvfp4(b.as_ref(), &mut l, &down)?;
            l.finalize_nvfp4_mmq_load(&mut ctx, k, n, 0)?;
            let want = layouts::nvfp4_mmq::from_nvfp4(
                &ne.parts[0].1,
                &ne.parts[1].1,
                0.0,
                n,
                ne.padded[1],
            )
            .parts
            .remove(0)
            .1;
            let got_p = l.weights().nvfp4_mmq[0].ok_or_else(|| {
                crate::gpu::GpuError::Invalid("finalize built no gate tiles".into())
            })?;
            let mut got = vec![0u8; got_p.bytes as usize];
            b.download(got_p, &mut got)?;
            push(
                &mut rows,
                "nvfp4_mmq_repack (bytes == converter)",
                (h, i),
                0,
                if got == want { 0.0 } else { 1.0 },
                0.0,
            );
            // finalize_q4k_load: the GPU Q4_K (gate, and down with the Q4_K lever) and int8
            // (down) bytes equal the converter's encoders on the NVFP4 values.
            let wd = nvfp4_decoded(&down);
            for down_q4k in [false, true] {
                let levers = ModelLevers {
                    q4k_mmq: true,
                    q4k_mmq_down_q4k: down_q4k,
                    ..ModelLevers::default()
                };
                let cfg = FfnConfig {
                    hidden: k,
                    inter: n,
                };
                let mut qctx = ForwardContext::new(b.clone(), cfg, 1, levers)?;
                let mut ql = DenseFfnLayer::new(&qctx);
                install_nvfp4(b.as_ref(), &mut ql, &down)?;
                ql.finalize_q4k_load(&mut qctx, k, n, 0)?;
                let q = ql.weights().q4k.ok_or_else(|| {
                    crate::gpu::GpuError::Invalid("finalize_q4k_load built nothing".into())
                })?;
                let bytes = |p: DevicePtr| -> GpuResult<Vec<u8>> {
                    let mut v = vec![0u8; p.bytes as usize];
                    b.download(p, &mut v)?;
                    Ok(v)
                };
                let gate_ok =
                    bytes(q.gate)? == layouts::q4k_mmq::encode_q4k(&wd.gate, n, k).parts[0].1;
                let down_ok = match q.down {
                    crate::ffn::Q4kDown::Q4k(p) => {
                        bytes(p)? == layouts::q4k_mmq::encode_q4k(&wd.down, k, n).parts[0].1
                    }
                    crate::ffn::Q4kDown::Int8 { codes, scales } => {
                        let e = layouts::q4k_mmq::encode_int8(&wd.down, k, n);
                        bytes(codes)? == e.parts[0].1 && bytes(scales)? == e.parts[1].1
                    }
                };
                push(
                    &mut rows,
                    "nvfp4_to_q4k gate (bytes == converter)",
                    (h, i),
                    0,
                    if gate_ok { 0.0 } else { 1.0 },
                    0.0,
                );
                push(
                    &mut rows,
                    if down_q4k {
                        "nvfp4_to_q4k down (bytes == converter)"
                    } else {
                        "nvfp4_to_int8_rows down (bytes == converter)"
                    },
                    (h, i),
                    0,
                    if down_ok { 0.0 } else { 1.0 },
                    0.0,
                );
                // The GEMMs over the GPU-built copies: Q4_K gate x q8_1 activations (the GPU's
                // own quantization, its bits checked above) against the f64 product of the same
                // blocks; the int8 down GEMM against its f64 twin on bf16-requantized inputs.
                use crate::gpu::KArg::{I32, Ptr};
                let a = |v: usize| I32(v as i32);
                let (kp_g, kp_d) = (q.kp_gate, q.kp_down);
                let bs = kp_g / Q8_1_ELEMS * Q8_1_BYTES;
                let gate_bytes = bytes(q.gate)?;
                let xq = b.alloc((mmax * bs) as u64)?;
                let act = rng.vec(mmax * n, 1.0);
                let actd = alloc_upload(b.as_ref(), bytemuck::cast_slice(&act))?;
                let (aq, sa) = (b.alloc((mmax * kp_d) as u64)?, b.alloc((mmax * 4) as u64)?);
                let yk = b.alloc((mmax * k * 4) as u64)?;
                for &m in ms {
                    if !down_q4k {
                        let cfg = crate::gpu::LaunchCfg::grid((kp_g / 32).div_ceil(8), m, 256);
                        b.launch(
                            kk.quant_q8_1,
                            cfg,
                            0,
                            &[Ptr(xd), a(m), a(k), a(kp_g), Ptr(xq)],
                        )?;
                        poison(b.as_ref(), yd)?;
                        let args = [Ptr(xq), a(m), Ptr(q.gate), Ptr(yd), a(n), a(kp_g), a(n)];
                        b.launch(kk.q4k_gemm, crate::gpu::LaunchCfg::mmq_tile(m, n), 0, &args)?;
                        b.synchronize(0)?;
                        let mut qx = vec![0u8; m * bs];
                        b.download(xq.view(0, qx.len() as u64), &mut qx)?;
                        let err = sampled_err(b.as_ref(), yd, m, n, |r| {
                            let mut out = vec![0f32; n];
                            let xr = &qx[r * bs..(r + 1) * bs];
                            reference::q4k_mmq_row(xr, &gate_bytes, n, kp_g, &mut out);
                            out
                        })?;
                        push(&mut rows, "q4k_mmq_gemm", (h, i), m, err, 2e-6);
                    }
                    if let crate::ffn::Q4kDown::Int8 { codes, scales } = q.down {
                        let cfg = crate::gpu::LaunchCfg::grid(m, 1, 256);
                        let args = [Ptr(actd), a(m), a(n), a(kp_d), Ptr(aq), Ptr(sa)];
                        b.launch(kk.requant_int8, cfg, 0, &args)?;
                        poison(b.as_ref(), yk)?;
                        let args = [
                            Ptr(aq),
                            Ptr(sa),
                            a(m),
                            Ptr(codes),
                            Ptr(scales),
                            Ptr(yk),
                            a(k),
                            a(kp_d),
                            a(k),
                        ];
                        b.launch(
                            kk.int8_gemm,
                            crate::gpu::LaunchCfg::mmq_tile(m, k),
                            0,
                            &args,
                        )?;
                        b.synchronize(0)?;
                        let (wc, ws) = (bytes(codes)?, layouts::f32_from(&bytes(scales)?));
                        let err = sampled_err(b.as_ref(), yk, m, k, |r| {
                            let (qa, d) =
                                reference::requant_row_bf16_int8(&act[r * n..(r + 1) * n], kp_d);
                            let mut out = vec![0f32; k];
                            reference::int8_row(&qa, d, &wc, &ws, k, kp_d, &mut out);
                            out
                        })?;
                        push(&mut rows, "q4k_mmq_int8_down_gemm", (h, i), m, err, 2e-6);
                    }
                }
                for p in [xq, actd, aq, sa, yk] {
                    b.free(p);
                }
            }
        }
        for p in [
            xd, yd, w.weight, w.scale, ww.weight, ww.scale, bw.weight, nw.codes, nw.scales,
        ] {
            b.free(p);
        }
    }
    Ok(rows)
}
