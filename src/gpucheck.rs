//! The GPU check and benchmarks that `metrale-pack gpu-check` / `bench-gpu` run on a device:
//! every kernel and every layer arm against the host reference on fresh random data, poisoned
//! outputs, the fixed path's batch invariance, then bandwidth and TFLOP/s figures against the
//! copy ceiling and cuBLAS measured in the same run.

use crate::converters::layouts;
use crate::ffn::testing::*;
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext, Fp8Weight, W8a8Weight};
use crate::gpu::host::HostBackend;
use crate::gpu::reference::{self, ActRound};
use crate::gpu::{
    DevicePtr, GemmBf16, GpuBackend, GpuResult, ModelLevers, alloc_upload, download_f32, upload_f32,
};
use crate::model::Activation;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// One line of the result table.
#[derive(Clone, Debug)]
pub struct Row {
    pub check: String,
    pub shape: String,
    pub m: usize,
    pub err: f64,
    pub tol: f64,
    pub pass: bool,
}

/// The row counts of the GPU issue.
pub const M_SET: [usize; 12] = [1, 2, 3, 4, 5, 16, 17, 32, 33, 64, 512, 2048];
/// SmolLM2 and llama-8B FFN shapes (hidden, inter).
pub const SHAPES: [(usize, usize); 2] = [(576, 1536), (4096, 14336)];

fn sample_rows(m: usize) -> Vec<usize> {
    if m <= 8 {
        return (0..m).collect();
    }
    let mut v = vec![0, 1, m / 3, m / 2, m - 2, m - 1];
    v.dedup();
    v
}

fn upload_fp8(
    b: &dyn GpuBackend,
    x: &[f32],
    n: usize,
    k: usize,
) -> GpuResult<(Fp8Weight, Vec<u8>, Vec<f32>)> {
    let e = layouts::fp8::encode(x, n, k);
    let w = Fp8Weight {
        weight: alloc_upload(b, &e.parts[0].1)?,
        scale: alloc_upload(b, &e.parts[1].1)?,
        n,
        k,
        np: e.padded[0],
        kp: e.padded[1],
    };
    Ok((w, e.parts[0].1.clone(), layouts::f32_from(&e.parts[1].1)))
}

fn push(rows: &mut Vec<Row>, check: &str, shape: (usize, usize), m: usize, err: f64, tol: f64) {
    let pass = err.is_finite() && err <= tol;
    rows.push(Row {
        check: check.into(),
        shape: format!("{}x{}", shape.0, shape.1),
        m,
        err,
        tol,
        pass,
    });
}

/// A fresh scratch folder under the temp dir, unique per process and call.
fn scratch_dir(tag: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("metrale-{tag}-{}-{n}", std::process::id()))
}

/// ‖y − reference‖ / ‖reference‖ over the sampled rows of the device output `yd` (`[m, n]`
/// f32, row stride n); NaN when any element of `y` was left unwritten (outputs are poisoned with
/// NaN before each launch). `reference(r)` computes row `r` on the CPU.
fn sampled_err(
    b: &dyn GpuBackend,
    yd: DevicePtr,
    m: usize,
    n: usize,
    reference: impl Fn(usize) -> Vec<f32> + Sync,
) -> GpuResult<f64> {
    let y = download_f32(b, yd.view(0, (m * n * 4) as u64))?;
    if !y.iter().all(|v| v.is_finite()) {
        return Ok(f64::NAN);
    }
    let srows = sample_rows(m);
    let want: Vec<f64> = srows
        .par_iter()
        .flat_map(|&r| {
            reference(r)
                .into_iter()
                .map(|v| v as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    let got: Vec<f32> = srows
        .iter()
        .flat_map(|&r| y[r * n..(r + 1) * n].to_vec())
        .collect();
    Ok(rel_err(&got, &want))
}

/// The relative error of a CUDA layer output against the host backend's, or NaN (a failing
/// row) when the two took different routes or the CUDA output has a non-finite value.
fn cuda_vs_host_err(cuda: &[f32], host: &[f32], same_route: bool) -> f64 {
    if !same_route || !cuda.iter().all(|v| v.is_finite()) {
        return f64::NAN;
    }
    let want: Vec<f64> = host.iter().map(|&v| v as f64).collect();
    rel_err(cuda, &want)
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
            b.download(ctx.arena.act_fp8.view(0, q.len() as u64), &mut q)?;
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
                let a = |v: usize| crate::gpu::KArg::I32(v as i32);
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
        // Packed Q2: the GEMVs, the BF16 dequantization and the q8_1 activations bit for bit,
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
                ("q2_0_gemv_vec", kk.q2_gemv, 1usize),
                ("q2_0_gemv_vec_batchm", kk.q2_gemv_m, 4),
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
                "dequant_q2_0_gn_to_bf16 (bytes)",
                (h, i),
                0,
                if same { 0.0 } else { 1.0 },
                0.0,
            );
            b.free(dq);
            let bs = kp2 / 32 * 36;
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
                    let blk = (0..bs / 36)
                        .find(|&j| want[j * 36..(j + 1) * 36] != got[j * 36..(j + 1) * 36])
                        .unwrap_or(0);
                    eprintln!(
                        "quantize_act_q8_1 {h}x{i} m={m}: row {r} block {blk} differs\n  gpu {:?}\n  cpu {:?}\n  x {:?}",
                        &got[blk * 36..(blk + 1) * 36],
                        &want[blk * 36..(blk + 1) * 36],
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
                push(&mut rows, "q2_0_mmq_gemm", (h, i), m, err, 2e-6);
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
            let got_p = l.weights.nvfp4_mmq[0].ok_or_else(|| {
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
                    ffn_mmq: true,
                    ffn_mmq_down_q4k: down_q4k,
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
                let q = ql.weights.q4k.ok_or_else(|| {
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
                let bs = kp_g / 32 * 36;
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
                        push(&mut rows, "int8_gemm_faith2", (h, i), m, err, 2e-6);
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

/// Layer-level checks: every method and arm on CUDA against the same layer on the host backend
/// (same routing, same inputs), and the fixed path's batch invariance.
pub fn layer_checks(
    b: Arc<dyn GpuBackend>,
    shapes: &[(usize, usize)],
    ms: &[usize],
    rng: &mut Rand,
) -> GpuResult<Vec<Row>> {
    layer_checks_of(b, shapes, ms, rng, |_| true)
}

/// [`layer_checks`] of the arms whose name `keep` accepts (`gpu-check --arms`: one
/// compute-sanitizer run per arm group fits a device call).
pub fn layer_checks_of(
    b: Arc<dyn GpuBackend>,
    shapes: &[(usize, usize)],
    ms: &[usize],
    rng: &mut Rand,
    keep: impl Fn(&str) -> bool,
) -> GpuResult<Vec<Row>> {
    let mut rows = Vec::new();
    let mmax = *ms.iter().max().unwrap();
    let host: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let lev = |pairs: &[(&str, &str)]| {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        ModelLevers::from_map(&env, crate::gpu::levers::HARDWARE_SM90)
    };
    type Install = fn(&dyn GpuBackend, &mut DenseFfnLayer, &DenseWeights) -> GpuResult<()>;
    let arms: [(&str, Install, ModelLevers, Activation); 20] = [
        (
            "fp8 fused",
            |b, l, w| install_fp8(b, l, w, true),
            lev(&[]),
            Activation::Silu,
        ),
        (
            "fp8",
            |b, l, w| install_fp8(b, l, w, false),
            lev(&[]),
            Activation::Silu,
        ),
        (
            "fp8 m16_tc",
            |b, l, w| install_fp8(b, l, w, false),
            lev(&[("METRALE_FFN_M16_TC", "1")]),
            Activation::Silu,
        ),
        (
            "fp8 batch16",
            |b, l, w| install_fp8(b, l, w, false),
            lev(&[("METRALE_FFN_BATCH16", "1")]),
            Activation::Silu,
        ),
        (
            "fp8 gelu",
            |b, l, w| install_fp8(b, l, w, false),
            lev(&[]),
            Activation::Gelu,
        ),
        (
            "w8a8",
            install_w8a8,
            lev(&[("METRALE_W8A8_MAX_ROWS", "4096")]),
            Activation::Silu,
        ),
        ("bf16", install_bf16, lev(&[]), Activation::Silu),
        ("nvfp4", install_nvfp4, lev(&[]), Activation::Silu),
        ("nvfp4 gelu", install_nvfp4, lev(&[]), Activation::Gelu),
        ("nvfp4 t", install_nvfp4_t, lev(&[]), Activation::Silu),
        (
            "nvfp4 t k64",
            install_nvfp4_t,
            lev(&[("METRALE_W4A16_K64_MIN_K", "64")]),
            Activation::Silu,
        ),
        ("nvfp4 mmq", install_nvfp4_mmq, lev(&[]), Activation::Silu),
        (
            "nvfp4 ksplit down",
            install_nvfp4,
            lev(&[("METRALE_W4A16_GEMV_KSPLIT_MIN_K", "1")]),
            Activation::Silu,
        ),
        (
            "nvfp4 silu fused",
            install_nvfp4,
            lev(&[
                ("METRALE_FFN_SILU_FUSED_DOWN", "1"),
                ("METRALE_DECODE_FFN_VIA_GEMM", "0"),
            ]),
            Activation::Silu,
        ),
        (
            "nvfp4 q4k mmq",
            |b, l, w| install_nvfp4_q4k(b, l, w, false),
            lev(&[("METRALE_FFN_MMQ", "1")]),
            Activation::Silu,
        ),
        (
            "nvfp4 q4k mmq q4k-down",
            |b, l, w| install_nvfp4_q4k(b, l, w, true),
            lev(&[("METRALE_FFN_MMQ", "1")]),
            Activation::Silu,
        ),
        ("q2", install_q2, lev(&[]), Activation::Silu),
        (
            "q2 mmq",
            install_q2,
            lev(&[("METRALE_GGUF_NATIVE_Q2_MMQ", "1")]),
            Activation::Silu,
        ),
        (
            // The same seeded adapter on both backends.
            "nvfp4 lora",
            |b, l, w| {
                install_nvfp4(b, l, w)?;
                LoraAdapter::random(&mut Rand(77), w.hidden, w.inter, 16).install(b, l)
            },
            lev(&[]),
            Activation::Silu,
        ),
        (
            "nvfp4 w4a4",
            install_nvfp4,
            lev(&[
                ("METRALE_SINGLE_ROW_W4A4", "1"),
                ("METRALE_SMALL_BATCH_W4A4", "1"),
            ]),
            Activation::Silu,
        ),
    ];
    for &(h, i) in shapes {
        let w = DenseWeights::random(rng, h, i);
        let cfg = FfnConfig {
            hidden: h,
            inter: i,
        };
        for (arm, install, levers, act) in arms.iter().filter(|a| keep(a.0)) {
            let mut gc = ForwardContext::new(b.clone(), cfg, mmax, levers.clone())?;
            let mut hc = ForwardContext::new(host.clone(), cfg, mmax, levers.clone())?;
            let mut gl = DenseFfnLayer::new_with_activation(&gc, *act);
            let mut hl = DenseFfnLayer::new_with_activation(&hc, *act);
            install(b.as_ref(), &mut gl, &w)?;
            install(host.as_ref(), &mut hl, &w)?;
            for &m in ms {
                let x = rng.vec(m * h, 1.0);
                let xg = b.alloc((m * h * 4) as u64)?;
                let xh = host.alloc((m * h * 4) as u64)?;
                upload_f32(b.as_ref(), xg, &x)?;
                upload_f32(host.as_ref(), xh, &x)?;
                let nv = arm.starts_with("nvfp4");
                let methods: &[&str] = match m {
                    1 if nv => &["forward", "prefill", "km"],
                    1 => &["forward", "prefill"],
                    2 => &["forward_k2", "prefill"],
                    3 => &["forward_k3"],
                    _ if *arm == "w8a8" => &["prefill", "fixed"],
                    _ if *arm == "nvfp4 w4a4" && m <= 16 => &["prefill", "fixed", "km"],
                    _ if *arm == "nvfp4 w4a4" => &["fixed"],
                    _ if nv && m <= 16 => &["prefill", "km"],
                    _ => &["prefill"],
                };
                for method in methods {
                    let call = |l: &DenseFfnLayer,
                                c: &mut ForwardContext,
                                x: DevicePtr|
                     -> GpuResult<Vec<f32>> {
                        c.backend.fill(c.arena.moe_output, 0xFF)?;
                        let out = match *method {
                            "forward" => l.forward(c, x),
                            "forward_k2" => l.forward_k2(c, x),
                            "forward_k3" => l.forward_k3(c, x),
                            "fixed" => l.forward_fixed(c, x, m),
                            "km" => l.forward_km(c, x, m),
                            _ => l.forward_prefill(c, x, m),
                        }?;
                        c.backend.synchronize(0)?;
                        download_f32(c.backend.as_ref(), out)
                    };
                    gc.trace.clear();
                    hc.trace.clear();
                    let yg = call(&gl, &mut gc, xg)?;
                    let yh = call(&hl, &mut hc, xh)?;
                    let err = cuda_vs_host_err(&yg, &yh, gc.trace == hc.trace);
                    // Intermediate activations amplify last-bit differences: 1e-4 for arms that keep
                    // f32 activations (the GEMVs); where the intermediate is rounded again a
                    // last-bit difference can flip it: 1e-3 for BF16 (the cuBLAS arm, and the FP8
                    // tensor-core GEMMs above the GEMV rows), 5e-3 for W8A8 (FP8).
                    let tc_rows = if levers.ffn_batch16 { 16 } else { 4 };
                    let w4a4 = *arm == "nvfp4 w4a4" && *method != "prefill";
                    let q2_prefill = arm.starts_with("q2") && *method == "prefill";
                    let q4k_prefill = arm.contains("q4k") && *method == "prefill";
                    let tol = if (q2_prefill && arm.ends_with("mmq")) || q4k_prefill {
                        // q8_1 activations: a last-bit difference can move one code.
                        5e-3
                    } else if q2_prefill {
                        1e-3
                    } else if w4a4 {
                        // NVFP4 activations: a last-bit difference can move one E2M1 code.
                        2e-2
                    } else if arm.starts_with("w8a8") {
                        5e-3
                    } else if arm.starts_with("bf16") || m > tc_rows || (nv && *method == "prefill")
                    {
                        1e-3
                    } else {
                        1e-4
                    };
                    push(
                        &mut rows,
                        &format!("layer {arm} {method}"),
                        (h, i),
                        m,
                        err,
                        tol,
                    );
                }
                b.free(xg);
                host.free(xh);
            }
            // Fixed path: a row's output bits alone equal its bits inside a batch.
            if *arm == "w8a8" || *arm == "nvfp4 w4a4" {
                let m = 33.min(mmax);
                let x = rng.vec(m * h, 1.0);
                let xg = b.alloc((m * h * 4) as u64)?;
                upload_f32(b.as_ref(), xg, &x)?;
                let all = download_f32(b.as_ref(), gl.forward_fixed(&mut gc, xg, m)?)?;
                let mut same = true;
                for r in [0, m / 2, m - 1] {
                    let x1 = b.alloc((h * 4) as u64)?;
                    upload_f32(b.as_ref(), x1, &x[r * h..(r + 1) * h])?;
                    let one = download_f32(b.as_ref(), gl.forward_fixed(&mut gc, x1, 1)?)?;
                    same &= one
                        .iter()
                        .zip(&all[r * h..(r + 1) * h])
                        .all(|(a, c)| a.to_bits() == c.to_bits());
                    b.free(x1);
                }
                b.free(xg);
                push(
                    &mut rows,
                    &format!("fixed {arm}: row bits alone == in batch"),
                    (h, i),
                    m,
                    if same { 0.0 } else { 1.0 },
                    0.0,
                );
            }
        }
    }
    Ok(rows)
}

/// Median seconds of `reps` runs of `f` (synchronized before and after each).
pub fn time_median(
    b: &dyn GpuBackend,
    reps: usize,
    mut f: impl FnMut() -> GpuResult<()>,
) -> GpuResult<f64> {
    f()?;
    b.synchronize(0)?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        b.synchronize(0)?;
        t.push(t0.elapsed().as_secs_f64());
    }
    t.sort_by(|a, c| a.partial_cmp(c).unwrap());
    Ok(t[reps / 2])
}

/// Benchmarks; returns printable lines.
pub fn benchmarks(
    b: Arc<dyn GpuBackend>,
    copy_ceiling: impl Fn(u64) -> GpuResult<f64>,
    rng: &mut Rand,
) -> GpuResult<Vec<String>> {
    let mut out = Lines(Vec::new());
    let ceiling = copy_ceiling(4 << 30)?; // bytes read + written per second
    out.push(format!(
        "copy ceiling (device-to-device, 4 GiB, read+write): {:.0} GB/s",
        ceiling / 1e9
    ));
    let (h, i) = (4096usize, 14336usize);
    let cfg = FfnConfig {
        hidden: h,
        inter: i,
    };
    let w = DenseWeights::random(rng, h, i);
    let weight_bytes = |per_elem: f64| per_elem * (3 * h * i) as f64;
    // Decode (m = 1): effective weight bandwidth of each arm.
    type Install = fn(&dyn GpuBackend, &mut DenseFfnLayer, &DenseWeights) -> GpuResult<()>;
    let arms: [(&str, Install, f64); 4] = [
        (
            "fp8 fused gate+up GEMV chain",
            |b, l, w| install_fp8(b, l, w, true),
            1.0 + 4.0 / 16384.0,
        ),
        (
            "fp8 GEMV chain",
            |b, l, w| install_fp8(b, l, w, false),
            1.0 + 4.0 / 16384.0,
        ),
        ("w8a8 (quantize + FP8 MMA)", install_w8a8, 1.0),
        ("bf16 GEMV chain", install_bf16, 2.0),
    ];
    for (name, install, bpe) in arms {
        let levers = ModelLevers {
            w8a8_max_rows: 4096,
            ..ModelLevers::default()
        };
        let mut ctx = ForwardContext::new(b.clone(), cfg, 4096, levers)?;
        let mut layer = DenseFfnLayer::new(&ctx);
        install(b.as_ref(), &mut layer, &w)?;
        let x = b.alloc((4096 * h * 4) as u64)?;
        upload_f32(b.as_ref(), x.view(0, (h * 4) as u64), &rng.vec(h, 1.0))?;
        let t = time_median(b.as_ref(), 50, || layer.forward(&mut ctx, x).map(|_| ()))?;
        let bw = weight_bytes(bpe) / t;
        out.push(format!(
            "decode m=1 {name:<30} {:>8.1} us  {:>6.0} GB/s  {:>5.1}% of copy ceiling",
            t * 1e6,
            bw / 1e9,
            100.0 * bw / ceiling
        ));
        if name.starts_with("fp8 GEMV") || name.starts_with("w8a8") || name.starts_with("bf16") {
            for m in [512usize, 1024, 2048, 4096] {
                upload_f32(
                    b.as_ref(),
                    x.view(0, (m * h * 4) as u64),
                    &rng.vec(m * h, 1.0),
                )?;
                let t = time_median(b.as_ref(), 10, || {
                    layer.forward_prefill(&mut ctx, x, m).map(|_| ())
                })?;
                let flops = 2.0 * m as f64 * (3 * h * i) as f64;
                out.push(format!(
                    "prefill m={m:<5} {name:<30} {:>8.2} ms  {:>6.1} TFLOP/s",
                    t * 1e3,
                    flops / t / 1e12
                ));
            }
        }
        b.free(x);
    }
    // NVFP4 (0.5 byte codes + 1/16 byte scales per weight): decode chains, prefill GEMMs.
    // (name, install, levers, prefill?, weight bytes per element for the decode figure)
    type NvArm = (
        &'static str,
        Install,
        &'static [(&'static str, &'static str)],
        bool,
        f64,
    );
    let nvfp4_bpe = 0.5 + 1.0 / 16.0;
    let q2_bpe = 34.0 / 128.0;
    let nv_arms: [NvArm; 11] = [
        (
            "nvfp4 GEMV chain (k-split down)",
            install_nvfp4,
            &[("METRALE_W4A16_GEMV_KSPLIT_MIN_K", "8192")],
            false,
            nvfp4_bpe,
        ),
        (
            "nvfp4 GEMV chain (split SiLU)",
            install_nvfp4,
            &[],
            false,
            nvfp4_bpe,
        ),
        (
            "nvfp4 GEMV chain (SiLU-fused down)",
            install_nvfp4,
            &[("METRALE_FFN_SILU_FUSED_DOWN", "1")],
            false,
            nvfp4_bpe,
        ),
        (
            "nvfp4 W4A4 (single row)",
            install_nvfp4,
            &[("METRALE_SINGLE_ROW_W4A4", "1")],
            false,
            nvfp4_bpe,
        ),
        ("nvfp4 base w4a16_gemm", install_nvfp4, &[], true, nvfp4_bpe),
        ("nvfp4 _t GEMMs", install_nvfp4_t, &[], true, nvfp4_bpe),
        ("nvfp4 MMQ GEMM", install_nvfp4_mmq, &[], true, nvfp4_bpe),
        (
            "Q4_K MMQ (int8 down)",
            |b, l, w| install_nvfp4_q4k(b, l, w, false),
            &[("METRALE_FFN_MMQ", "1")],
            true,
            nvfp4_bpe,
        ),
        ("q2 GEMV chain", install_q2, &[], false, q2_bpe),
        ("q2 dequant + BF16 GEMM", install_q2, &[], true, q2_bpe),
        (
            "q2 MMQ (q8_1)",
            install_q2,
            &[("METRALE_GGUF_NATIVE_Q2_MMQ", "1")],
            true,
            q2_bpe,
        ),
    ];
    for (name, install, env, prefill, bpe) in nv_arms {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let levers = ModelLevers::from_map(&map, crate::gpu::levers::HARDWARE_SM90);
        let mut ctx = ForwardContext::new(b.clone(), cfg, 4096, levers)?;
        let mut layer = DenseFfnLayer::new(&ctx);
        install(b.as_ref(), &mut layer, &w)?;
        let x = b.alloc((4096 * h * 4) as u64)?;
        upload_f32(
            b.as_ref(),
            x.view(0, (4096 * h * 4) as u64),
            &rng.vec(4096 * h, 1.0),
        )?;
        if !prefill {
            let t = time_median(b.as_ref(), 50, || layer.forward(&mut ctx, x).map(|_| ()))?;
            let bw = weight_bytes(bpe) / t;
            out.push(format!(
                "decode m=1 {name:<30} {:>8.1} us  {:>6.0} GB/s  {:>5.1}% of copy ceiling",
                t * 1e6,
                bw / 1e9,
                100.0 * bw / ceiling
            ));
        } else {
            for m in [64usize, 512, 1024, 2048, 4096] {
                let t = time_median(b.as_ref(), 10, || {
                    layer.forward_prefill(&mut ctx, x, m).map(|_| ())
                })?;
                let flops = 2.0 * m as f64 * (3 * h * i) as f64;
                out.push(format!(
                    "prefill m={m:<5} {name:<30} {:>8.2} ms  {:>6.1} TFLOP/s",
                    t * 1e3,
                    flops / t / 1e12
                ));
            }
        }
        b.free(x);
    }
    // The start-up cost a pack saves: each finalize's GPU work for one layer.
    type Finalize = fn(&mut DenseFfnLayer, &mut ForwardContext, usize, usize) -> GpuResult<bool>;
    let finalizes: [(&str, Install, ModelLevers, Finalize); 2] = [
        (
            "finalize_nvfp4_mmq_load (GPU repack of gate, up, down)",
            install_nvfp4_t,
            ModelLevers::default(),
            |l, c, h, i| l.finalize_nvfp4_mmq_load(c, h, i, 0),
        ),
        (
            "finalize_q4k_load (GPU Q4_K gate+up, int8 down)",
            install_nvfp4,
            ModelLevers {
                ffn_mmq: true,
                ..ModelLevers::default()
            },
            |l, c, h, i| l.finalize_q4k_load(c, h, i, 0),
        ),
    ];
    for (label, install, levers, finalize) in finalizes {
        let mut ctx = ForwardContext::new(b.clone(), cfg, 1, levers)?;
        let mut times = Vec::new();
        for _ in 0..5 {
            let mut layer = DenseFfnLayer::new(&ctx);
            install(b.as_ref(), &mut layer, &w)?;
            b.synchronize(0)?;
            let t0 = Instant::now();
            finalize(&mut layer, &mut ctx, h, i)?;
            times.push(t0.elapsed().as_secs_f64());
            free_nvfp4_family(b.as_ref(), &layer);
        }
        times.sort_by(f64::total_cmp);
        out.push(format!(
            "{label} {:>8.3} ms per layer ({}x{}; median of 5)",
            times[2] * 1e3,
            h,
            i
        ));
    }
    // cuBLAS BF16 on the same shapes, the peer of the prefill figures.
    let wb = b.alloc((i * h * 2) as u64)?;
    b.fill(wb, 0x3C)?;
    let xb = b.alloc((4096 * h * 2) as u64)?;
    b.fill(xb, 0x3C)?;
    let yb = b.alloc((4096 * i * 4) as u64)?;
    for m in [512usize, 1024, 2048, 4096] {
        let t = time_median(b.as_ref(), 10, || {
            b.gemm_bf16(
                &GemmBf16 {
                    x: xb,
                    w: wb,
                    y: yb,
                    m,
                    n: i,
                    k: h,
                    kw: h,
                },
                0,
            )
        })?;
        out.push(format!(
            "prefill m={m:<5} {:<30} {:>8.2} ms  {:>6.1} TFLOP/s (one [{i}, {h}] projection)",
            "cuBLAS BF16 GEMM",
            t * 1e3,
            2.0 * (m * i * h) as f64 / t / 1e12
        ));
    }
    Ok(out.0)
}

/// Free the NVFP4 base of a benchmark layer and what its finalize calls built from it.
fn free_nvfp4_family(b: &dyn GpuBackend, layer: &DenseFfnLayer) {
    let w = &layer.weights;
    for p in w.nvfp4.iter().flatten() {
        b.free(p.codes);
        b.free(p.scales);
    }
    for p in w.nvfp4_mmq.iter().flatten() {
        b.free(*p);
    }
    if let Some(q) = w.q4k.filter(|q| q.owned) {
        b.free(q.gate);
        b.free(q.up);
        match q.down {
            crate::ffn::Q4kDown::Q4k(p) => b.free(p),
            crate::ffn::Q4kDown::Int8 { codes, scales } => {
                b.free(codes);
                b.free(scales);
            }
        }
    }
}

/// Lines printed as they are produced (a long run that fails still shows what it measured).
struct Lines(Vec<String>);

impl Lines {
    fn push(&mut self, s: String) {
        println!("{s}");
        self.0.push(s);
    }
}

/// Print the table and return whether every row passed.
pub fn print_table(rows: &[Row]) -> bool {
    println!(
        "{:<44} {:>11} {:>5} {:>10} {:>8} {:>5}",
        "check", "shape", "m", "rel err", "tol", "ok"
    );
    for r in rows {
        println!(
            "{:<44} {:>11} {:>5} {:>10.2e} {:>8.0e} {:>5}",
            r.check,
            r.shape,
            r.m,
            r.err,
            r.tol,
            if r.pass { "PASS" } else { "FAIL" }
        );
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    println!("{} passed, {} failed", rows.len() - failed, failed);
    failed == 0
}

/// Loader checks: a generated model (F32, 2 layers) converted with every layout (a generated
/// PEFT adapter for `lora`), loaded by each copy path; overlay bytes on the device must equal
/// the pack's, loading must launch no kernel, finalize must have nothing to build, every arm of
/// a pack-loaded layer must give bit-identical outputs to a layer built at start-up from the
/// source, and the q4k_mmq + lora layer must agree with the host backend given the same pack.
pub fn load_checks(
    b: Arc<dyn GpuBackend>,
    hidden: usize,
    inter: usize,
    modes: &[crate::loader::IoMode],
    rng: &mut Rand,
) -> anyhow::Result<Vec<Row>> {
    let dir = scratch_dir("load-check");
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("m.gguf");
    crate::gen_model::gen_model(&src, hidden, inter, 2, crate::GgmlType::F32, "llama")?;
    let rows = load_checks_from(b, &src, modes, rng);
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

/// The loader checks on a given source checkpoint (e.g. the real SmolLM2 GGUF): convert it with
/// every layout, load, and compare layer 1 (layer 0 on a one-layer model) as [`load_checks`]
/// does.
pub fn load_checks_from(
    b: Arc<dyn GpuBackend>,
    src: &std::path::Path,
    modes: &[crate::loader::IoMode],
    rng: &mut Rand,
) -> anyhow::Result<Vec<Row>> {
    use crate::converters::layouts::Layout;
    use crate::loader::{self, LayerOverlays, LoadOptions};
    use crate::model::Model;
    use crate::pack::{self, ConvertOptions};
    let dir = scratch_dir("load-from");
    std::fs::create_dir_all(&dir)?;
    let packp = dir.join("m.mpk.gguf");
    let model = Model::open(src)?;
    let (hidden, inter) = (
        model
            .hidden_size
            .ok_or_else(|| anyhow::anyhow!("{}: no hidden size", src.display()))? as usize,
        model
            .intermediate_size
            .ok_or_else(|| anyhow::anyhow!("{}: no intermediate size", src.display()))?
            as usize,
    );
    let li = usize::from(model.ffn_layers.len() > 1);
    let adapter_dir = dir.join("adapter");
    let adapter = crate::ffn::testing::LoraAdapter::write_peft(
        rng,
        &adapter_dir,
        model.ffn_layers.len(),
        hidden,
        inter,
        8,
    )?;
    let opts = ConvertOptions {
        layouts: Some(vec![
            Layout::Nvfp4,
            Layout::Nvfp4T,
            Layout::Nvfp4Mmq,
            Layout::Q4kMmq,
            Layout::Fp8,
            Layout::W8a8,
            Layout::Bf16,
            Layout::Q2g128,
            Layout::Lora,
        ]),
        lora: Some(adapter_dir),
        ..Default::default()
    };
    pack::convert(&model, &opts, &packp, &|_, _| {})?;
    let mut rows = Vec::new();
    let shape = (hidden, inter);
    for &io in modes {
        let before = b.launch_count();
        let lp = loader::load(
            b.as_ref(),
            &packp,
            &LoadOptions {
                io,
                chunk: 1 << 20,
                ..Default::default()
            },
        )?;
        push(
            &mut rows,
            &format!("load {io:?}: kernel launches"),
            shape,
            0,
            (b.launch_count() - before) as f64,
            0.0,
        );
        let mut differ = 0usize;
        for (i, e) in lp.pack.manifest.tensors.iter().enumerate() {
            if let Some(v) = e.ffn.as_ref().and_then(|_| lp.device_view(&e.name)) {
                let mut got = vec![0u8; v.bytes as usize];
                b.download(v, &mut got)?;
                differ += usize::from(got != lp.pack.data(i));
            }
        }
        push(
            &mut rows,
            &format!("load {io:?}: overlay blobs != pack bytes"),
            shape,
            0,
            differ as f64,
            0.0,
        );
        let cfg = FfnConfig { hidden, inter };
        let mut ctx = ForwardContext::new(b.clone(), cfg, 64, ModelLevers::default())?;
        let l = &model.ffn_layers[li];
        let w = DenseWeights {
            gate: model.decode_weight(&l.gate)?.0,
            up: model.decode_weight(&l.up)?.0,
            down: model.decode_weight(&l.down)?.0,
            hidden,
            inter,
        };
        let ov = &lp.layers[li];
        // How an engine without packs builds the same overlays at start-up.
        type Install<'a> = dyn Fn(
                &dyn GpuBackend,
                &mut DenseFfnLayer,
                &DenseWeights,
                &mut ForwardContext,
            ) -> GpuResult<()>
            + 'a;
        let arms: [(&str, LayerOverlays, &Install<'_>); 8] = [
            (
                "q2",
                LayerOverlays {
                    q2: ov.q2,
                    ..Default::default()
                },
                &|b, l, w, _| install_q2(b, l, w),
            ),
            (
                "fp8",
                LayerOverlays {
                    fp8: ov.fp8,
                    ..Default::default()
                },
                &|b, l, w, _| install_fp8(b, l, w, true),
            ),
            (
                "w8a8",
                LayerOverlays {
                    w8a8: ov.w8a8,
                    ..Default::default()
                },
                &|b, l, w, _| install_w8a8(b, l, w),
            ),
            (
                "bf16",
                LayerOverlays {
                    bf16: ov.bf16,
                    ..Default::default()
                },
                &|b, l, w, _| install_bf16(b, l, w),
            ),
            (
                "nvfp4",
                LayerOverlays {
                    nvfp4: ov.nvfp4,
                    ..Default::default()
                },
                &|b, l, w, _| install_nvfp4(b, l, w),
            ),
            (
                "nvfp4_t",
                LayerOverlays {
                    nvfp4: ov.nvfp4,
                    nvfp4_t: ov.nvfp4_t,
                    ..Default::default()
                },
                &|b, l, w, _| install_nvfp4_t(b, l, w),
            ),
            (
                // Start-up: the _t copies, then the GPU repack of finalize_nvfp4_mmq_load.
                "nvfp4_mmq",
                LayerOverlays {
                    nvfp4: ov.nvfp4,
                    nvfp4_mmq: ov.nvfp4_mmq,
                    ..Default::default()
                },
                &|b, l, w, c| {
                    install_nvfp4_t(b, l, w)?;
                    let (h, i) = (w.hidden, w.inter);
                    l.finalize_nvfp4_mmq_load(c, h, i, 0).map(|_| ())
                },
            ),
            (
                // Start-up: the same adapter encoded and installed through set_lora_weights.
                "lora",
                LayerOverlays {
                    nvfp4: ov.nvfp4,
                    lora: ov.lora,
                    ..Default::default()
                },
                &|b, l, w, _| {
                    install_nvfp4(b, l, w)?;
                    adapter.install(b, l)
                },
            ),
        ];
        {
            // A pack holding nvfp4_mmq: finalize_nvfp4_mmq_load has nothing to repack.
            let mut l = DenseFfnLayer::new(&ctx);
            LayerOverlays {
                nvfp4: ov.nvfp4,
                nvfp4_mmq: ov.nvfp4_mmq,
                ..Default::default()
            }
            .install(&mut l)?;
            let n0 = b.launch_count();
            let did = l.finalize_nvfp4_mmq_load(&mut ctx, hidden, inter, 0)?;
            push(
                &mut rows,
                &format!("load {io:?}: repack launches with nvfp4_mmq in the pack"),
                shape,
                0,
                (b.launch_count() - n0) as f64 + f64::from(u8::from(did)),
                0.0,
            );
        }
        {
            // A pack holding q4k_mmq (and lora): finalize_q4k_load has nothing to build, and
            // the layer from the pack (Q4_K MMQ prefill, int8 down, the adapter on both) agrees
            // with the host backend given the same pack.
            let levers = ModelLevers {
                ffn_mmq: true,
                ..ModelLevers::default()
            };
            let host: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
            let hlp = loader::load(host.as_ref(), &packp, &LoadOptions::default())?;
            let overlays = |o: &LayerOverlays| LayerOverlays {
                nvfp4: o.nvfp4,
                q4k: o.q4k,
                lora: o.lora,
                ..Default::default()
            };
            let mut gctx = ForwardContext::new(b.clone(), cfg, 64, levers.clone())?;
            let mut hctx = ForwardContext::new(host.clone(), cfg, 64, levers)?;
            let mut gl = DenseFfnLayer::new(&gctx);
            overlays(ov).install(&mut gl)?;
            let mut hl = DenseFfnLayer::new(&hctx);
            overlays(&hlp.layers[li]).install(&mut hl)?;
            let n0 = b.launch_count();
            let did = gl.finalize_q4k_load(&mut gctx, hidden, inter, 0)?;
            push(
                &mut rows,
                &format!("load {io:?}: build launches with q4k_mmq in the pack"),
                shape,
                0,
                (b.launch_count() - n0) as f64 + f64::from(u8::from(did)),
                0.0,
            );
            for m in [1usize, 5, 33] {
                let x = rng.vec(m * hidden, 1.0);
                let run = |l: &DenseFfnLayer, c: &mut ForwardContext| -> GpuResult<Vec<f32>> {
                    let be = c.backend.clone();
                    let xp = be.alloc((m * hidden * 4) as u64)?;
                    upload_f32(be.as_ref(), xp, &x)?;
                    c.trace.clear();
                    let out = match m {
                        1 => l.forward(c, xp),
                        _ => l.forward_prefill(c, xp, m),
                    }?;
                    be.synchronize(0)?;
                    let y = download_f32(be.as_ref(), out);
                    be.free(xp);
                    y
                };
                let yg = run(&gl, &mut gctx)?;
                let yh = run(&hl, &mut hctx)?;
                let err = cuda_vs_host_err(&yg, &yh, gctx.trace == hctx.trace);
                // As the layer checks: 1e-4 for the GEMV arm, 5e-3 where q8_1 codes can move.
                let tol = if m == 1 { 1e-4 } else { 5e-3 };
                push(
                    &mut rows,
                    &format!("load {io:?}: q4k_mmq+lora pack, CUDA vs host"),
                    shape,
                    m,
                    err,
                    tol,
                );
            }
            host.free(hlp.arena);
        }
        for (arm, overlays, install) in arms {
            let mut from_pack = DenseFfnLayer::new(&ctx);
            overlays.install(&mut from_pack)?;
            let mut built = DenseFfnLayer::new(&ctx);
            install(b.as_ref(), &mut built, &w, &mut ctx)?;
            for m in [1usize, 2, 3, 5, 33] {
                let x = rng.vec(m * hidden, 1.0);
                let xp = b.alloc((m * hidden * 4) as u64)?;
                upload_f32(b.as_ref(), xp, &x)?;
                let run =
                    |layer: &DenseFfnLayer, ctx: &mut ForwardContext| -> GpuResult<Vec<f32>> {
                        let out = match m {
                            1 => layer.forward(ctx, xp),
                            2 => layer.forward_k2(ctx, xp),
                            3 => layer.forward_k3(ctx, xp),
                            _ => layer.forward_prefill(ctx, xp, m),
                        }?;
                        b.synchronize(0)?;
                        download_f32(b.as_ref(), out)
                    };
                let a = run(&from_pack, &mut ctx)?;
                let c = run(&built, &mut ctx)?;
                let diff = a
                    .iter()
                    .zip(&c)
                    .filter(|(p, q)| p.to_bits() != q.to_bits())
                    .count();
                push(
                    &mut rows,
                    &format!("load {io:?}: {arm} pack vs start-up bits differ"),
                    shape,
                    m,
                    diff as f64,
                    0.0,
                );
                b.free(xp);
            }
        }
        b.free(lp.arena);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rows)
}
