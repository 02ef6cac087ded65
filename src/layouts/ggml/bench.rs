//! The `ggml` lines of `bench-gpu`'s decode-kernel section (`check::bench_decode`): every type
//! of the engine alone on the llama-8B gate (14336 x 4096) and down (4096 x 14336) shapes at
//! m = 1, 2, 4 and 8, timed as llama.cpp's `test-backend-ops perf -o MUL_MAT` times its peer
//! (`../shared/tools/ggml-peer.sh`): the f32 activations quantized to q8_1, then the GEMV; and
//! each type's prefill dequantization to BF16.

use super::codec::TYPES;
use crate::GgmlType;
use crate::GgmlType::{NF4, Q4_K, Q5_0, Q6_K, Q8_0};
use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::check::bench_decode::{part, per_call};
use crate::gpu::sizes::*;
use crate::gpu::table::{Kernel, Kernels};
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, alloc_upload, upload_f32};
use crate::testing::*;

/// The llama-8B projection shapes `(name, n, k)`.
const SHAPES: [(&str, usize, usize); 2] = [
    ("gate 14336x4096", 14336, 4096),
    ("down 4096x14336", 4096, 14336),
];

/// Rows timed per shape.
const ROWS: [usize; 4] = [1, 2, 4, 8];

/// The device buffers: f32 activations, their q8_1 blocks, the output, the BF16 scratch.
struct Bufs {
    x: DevicePtr,
    xq: DevicePtr,
    y: DevicePtr,
    dq: DevicePtr,
}

/// Push one line per (type, shape, m) and one per type's dequantization.
pub(crate) fn kernel_lines(
    b: &dyn GpuBackend,
    ceiling: f64,
    rng: &mut Rand,
    push: &mut dyn FnMut(String),
) -> GpuResult<()> {
    let ks = Kernels::resolve(b);
    if !ks.ggml_gemv.ok() || !ks.quant_q8_1.ok() {
        return Ok(());
    }
    const MAX_K: usize = 14336;
    let m_max = ROWS[ROWS.len() - 1];
    let x = b.alloc((m_max * MAX_K * 4) as u64)?;
    upload_f32(b, x, &rng.vec(m_max * MAX_K, 1.0))?;
    let bufs = Bufs {
        x,
        xq: b.alloc((m_max * MAX_K / Q8_1_ELEMS * Q8_1_BYTES) as u64)?,
        y: b.alloc((m_max * MAX_K * 4) as u64)?,
        dq: b.alloc((14336 * 4096 * 2) as u64)?,
    };
    // METRALE_BENCH_GGML_TYPES (comma-separated type names, e.g. `Q4_K,Q8_0`) limits the
    // types, for a short device call.
    let only: Option<Vec<String>> = std::env::var("METRALE_BENCH_GGML_TYPES")
        .ok()
        .map(|v| v.split(',').map(|t| t.trim().to_uppercase()).collect());
    let wanted = |t: &GgmlType| {
        only.as_ref()
            .is_none_or(|o| o.iter().any(|n| n == t.name()))
    };
    for ty in TYPES.into_iter().filter(wanted) {
        // One buffer serves both shapes: n * k is the same, and a random block is a block.
        let w = alloc_upload(b, &ggml_random_blocks(rng, ty, 4096, 14336))?;
        for (shape, n, k) in SHAPES {
            for m in ROWS {
                // The layer's form for the rows (`ggml_gemv1` for one, `ggml_gemv_sa` from two)
                // beside `ggml_gemv` and, from two to `GGML_GEMV_SPLIT_M`, `ggml_gemv_split`,
                // from two to `GGML_GEMV_SPLIT4_M` `ggml_gemv_split4` (A/B).
                let mut forms = match m {
                    1 => vec![("gemv", &ks.ggml_gemv), ("gemv1", &ks.ggml_gemv1)],
                    _ => vec![("gemv", &ks.ggml_gemv), ("gemv_sa", &ks.ggml_gemv_sa)],
                };
                if m > 1 && m <= GGML_GEMV_SPLIT_M {
                    forms.push(("gemv_split", &ks.ggml_gemv_split));
                }
                if m > 1 && m <= GGML_GEMV_SPLIT4_M {
                    forms.push(("gemv_split4", &ks.ggml_gemv_split4));
                }
                for (form, gemv) in forms {
                    let t = gemv_time(b, &ks, gemv, &bufs, (w, ty), (n, k, m))?;
                    let bytes = w.bytes as f64;
                    push(format!(
                        "ggml kernel {:<7} {form} {shape} m={m} {:>7.1} us {:>6.0} GB/s {:>5.1}% of copy ceiling",
                        ty.name(),
                        t * 1e6,
                        bytes / t / 1e9,
                        100.0 * bytes / t / ceiling
                    ));
                }
            }
        }
        push(dequant_line(b, &ks, &bufs, (w, ty), ceiling)?);
        b.free(w);
    }
    for p in [bufs.x, bufs.xq, bufs.y, bufs.dq] {
        b.free(p);
    }
    Ok(())
}

/// Seconds per back-to-back call of the activations' q8_1 quantization (split for `ggml_gemv1`)
/// and the launches of `gemv` (`GGML_GEMV_MAX_M` rows each) on `m` rows of `[n, k]` weights `w` of type `ty`.
fn gemv_time(
    b: &dyn GpuBackend,
    ks: &Kernels,
    gemv: &Kernel,
    bufs: &Bufs,
    (w, ty): (DevicePtr, GgmlType),
    (n, k, m): (usize, usize, usize),
) -> GpuResult<f64> {
    let row_q8 = k / Q8_1_ELEMS * Q8_1_BYTES;
    // `ggml_gemv1` and `ggml_gemv_split` read the activations split.
    let quant = if super::host::SPLIT_FORMS.contains(&gemv.spec.name) {
        ks.quant_q8_1s
    } else {
        ks.quant_q8_1
    };
    per_call(b, || {
        let q = quant.call().ptr("x", bufs.x).dim("m", m).dim("k", k);
        q.dim("kp", k).ptr("out", bufs.xq).finish()?.run(b, 0)?;
        for r0 in (0..m).step_by(GGML_GEMV_MAX_M) {
            let rows = (m - r0).min(GGML_GEMV_MAX_M);
            let xv = bufs.xq.view((r0 * row_q8) as u64, (rows * row_q8) as u64);
            let yv = bufs.y.view((r0 * n * 4) as u64, (rows * n * 4) as u64);
            let c = gemv.call().ptr("xq", xv).dim("m", rows).ptr("w", w);
            let c = c
                .dim("ty", ty as u32 as usize)
                .float("sc", 1.0)
                .ptr("y", yv);
            let c = c.ptr("w2", DevicePtr::NULL).dim("ty2", 0).float("sc2", 1.0);
            let c = c.ptr("y2", DevicePtr::NULL).dim("projs", 1).dim("n", n);
            c.dim("kp", k).dim("ldy", n).finish()?.run(b, 0)?;
        }
        Ok(())
    })
}

/// The line of the dequantization of the down shape's weights `w` of type `ty` to BF16.
fn dequant_line(
    b: &dyn GpuBackend,
    ks: &Kernels,
    bufs: &Bufs,
    (w, ty): (DevicePtr, GgmlType),
    ceiling: f64,
) -> GpuResult<String> {
    let (n, k) = (4096usize, 14336usize);
    let t = per_call(b, || {
        let c = ks
            .ggml_dequant
            .call()
            .ptr("w", w)
            .dim("ty", ty as u32 as usize)
            .float("sc", 1.0);
        c.dim("n", n)
            .dim("kp", k)
            .ptr("out", bufs.dq)
            .finish()?
            .run(b, 0)
    })?;
    let rw = (w.bytes + (n * k * 2) as u64) as f64; // read + written
    Ok(format!(
        "ggml kernel {:<7} dequant_bf16 down 4096x14336 {:>7.1} us {:>6.0} GB/s read+written {:>5.1}% of copy ceiling",
        ty.name(),
        t * 1e6,
        rw / t / 1e9,
        100.0 * rw / t / ceiling
    ))
}

/// A `ggml` arm's weight bytes per element: gate and up of `gu`, down of `d`.
const fn ggml_bpe(gu: GgmlType, d: GgmlType) -> f64 {
    let (gb, ge) = (gu.block_bytes() as f64, gu.block_elems() as f64);
    (2.0 * gb / ge + d.block_bytes() as f64 / d.block_elems() as f64) / 3.0
}

/// The types of the arm `name` (gate, up, down).
fn arm_types(name: &str) -> [GgmlType; 3] {
    match name {
        n if n.starts_with("ggml Q4_K_M") => [Q4_K, Q4_K, Q6_K],
        n if n.starts_with("ggml Q4_K") => [Q4_K; 3],
        n if n.starts_with("ggml Q5_0") => [Q5_0; 3],
        n if n.starts_with("ggml NF4") => [NF4; 3],
        _ => [Q8_0; 3],
    }
}

/// One launch per projection (`ggml_gemv1`: a warp a row, `GGML_GEMV1_WARPS` a block), its rows
/// of its type.
fn gemvs(name: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    let [g, u, d] = arm_types(name);
    let row = |t: GgmlType, k: usize| t.row_bytes(k as u64).unwrap_or(0) as usize;
    vec![
        part(i, row(g, h), GGML_GEMV1_WARPS),
        part(i, row(u, h), GGML_GEMV1_WARPS),
        part(h, row(d, i), GGML_GEMV1_WARPS),
    ]
}

/// Its arms on the llama-8B FFN shape: the GGUF blocks as stored, one GEMV for every type to
/// 16 rows, BF16 dequantization then the BF16 GEMM from 17. llama.cpp's peer: ggml-peer.sh.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 6] = [
    bench("ggml Q4_K_M (Q4_K gate and up, Q6_K down) GEMV / dequant + BF16 GEMM", |b, l, w| install_ggml_types(b, l, w, [Q4_K, Q4_K, Q6_K]), &[], Some(ggml_bpe(Q4_K, Q6_K)), true).probe(gemvs),
    // A/B: the down projection of 3 and 4 rows on `ggml_gemv_sa` (before session 35).
    bench("ggml Q4_K_M, down on ggml_gemv_sa from 3 rows (A/B)", |b, l, w| install_ggml_types(b, l, w, [Q4_K, Q4_K, Q6_K]), &[("METRALE_GGML_DOWN_SPLIT_MAX_ROWS", "2")], Some(ggml_bpe(Q4_K, Q6_K)), false).probe(gemvs),
    bench("ggml Q4_K GEMV / dequant + BF16 GEMM", |b, l, w| install_ggml_types(b, l, w, [Q4_K, Q4_K, Q4_K]), &[], Some(ggml_bpe(Q4_K, Q4_K)), true).probe(gemvs),
    bench("ggml Q5_0 GEMV / dequant + BF16 GEMM", |b, l, w| install_ggml_types(b, l, w, [Q5_0, Q5_0, Q5_0]), &[], Some(ggml_bpe(Q5_0, Q5_0)), true).probe(gemvs),
    bench("ggml Q8_0 GEMV / dequant + BF16 GEMM", |b, l, w| install_ggml_types(b, l, w, [Q8_0, Q8_0, Q8_0]), &[], Some(ggml_bpe(Q8_0, Q8_0)), true).probe(gemvs),
    bench("ggml NF4 (bitsandbytes) GEMV / dequant + BF16 GEMM", |b, l, w| install_ggml_types(b, l, w, [NF4, NF4, NF4]), &[], Some(ggml_bpe(NF4, NF4)), true).probe(gemvs),
];

/// Its kernel lines: every type alone, and each type's dequantization.
pub(crate) static KERNELS: &[KernelLines] = &[("ggml kernel", kernel_lines)];

/// llama.cpp's type for a row of `k` values where `ty`'s blocks do not divide it
/// (llama-quant.cpp, `convert_incompatible_tensor`: the 2- and 3-bit K-quants, IQ1-IQ3 and
/// IQ4_XS to IQ4_NL, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0).
const fn fallback(ty: GgmlType, k: usize) -> GgmlType {
    use GgmlType::*;
    if k.is_multiple_of(ty.block_elems() as usize) {
        return ty;
    }
    match ty {
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        _ => IQ4_NL,
    }
}

/// A SmolLM2-shape arm of one type: every projection of `$t`, gate and up (rows of 576) in
/// its llama.cpp fallback where its blocks do not divide them.
macro_rules! small_arms {
    ($($t:ident),*) => {
        [$(SmallArm {
            name: concat!("ggml ", stringify!($t)),
            install: |b, l, w| {
                let gu = fallback(GgmlType::$t, w.hidden);
                install_ggml_types(b, l, w, [gu, gu, GgmlType::$t])
            },
            levers: &[],
        }),*]
    };
}

/// Its arms on the SmolLM2 shape (goal: a layer under 10 us at one row): every engine type.
pub(crate) static SMALL: [SmallArm; 22] = small_arms!(
    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
    IQ3_S, IQ1_S, IQ1_M, IQ4_NL, IQ4_XS, MXFP4, NVFP4, NF4
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
    use crate::gpu::ModelLevers;
    use crate::gpu::host::HostBackend;
    use std::sync::Arc;

    /// The host backend, random weights of `[h, i]` and a one-row forward context.
    fn host_layer(
        h: usize,
        i: usize,
        seed: u64,
    ) -> (Arc<dyn GpuBackend>, DenseWeights, ForwardContext) {
        let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
        let w = DenseWeights::random(&mut Rand(seed), h, i);
        let cfg = FfnConfig {
            hidden: h,
            inter: i,
        };
        let ctx = ForwardContext::new(b.clone(), cfg, 1, ModelLevers::default()).unwrap();
        (b, w, ctx)
    }

    /// Every engine type has a SmolLM2-shape arm, which installs on the host backend (576 is
    /// not whole super-blocks: the fallbacks) and serves one row through the engine.
    #[test]
    fn every_engine_type_has_a_small_arm_that_installs() {
        let (b, w, ctx) = host_layer(576, 1536, 6);
        for ty in TYPES {
            let arm = SMALL
                .iter()
                .find(|a| a.name == format!("ggml {}", ty.name()))
                .unwrap_or_else(|| panic!("no small arm for {}", ty.name()));
            let mut layer = DenseFfnLayer::new(&ctx);
            (arm.install)(b.as_ref(), &mut layer, &w).unwrap();
            let served = layer.serving_arm(&ctx, crate::ffn::Method::Decode, 1);
            assert_eq!(served.map(|a| a.name), Some("ggml gemv"), "{}", arm.name);
        }
        assert_eq!(fallback(GgmlType::Q4_K, 576), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::IQ2_S, 576), GgmlType::IQ4_NL);
        assert_eq!(fallback(GgmlType::NVFP4, 576), GgmlType::NVFP4);
    }

    /// The engine's bench arms install on the host backend (a layer whose engine arm serves
    /// decode), and their decode probe reads each projection's rows of its type.
    #[test]
    fn the_bench_arms_install_and_probe_their_bytes() {
        let (b, w, ctx) = host_layer(256, 512, 5);
        for arm in &ARMS {
            let mut layer = DenseFfnLayer::new(&ctx);
            (arm.install)(b.as_ref(), &mut layer, &w).unwrap();
            let served = layer.serving_arm(&ctx, crate::ffn::Method::Decode, 1);
            assert_eq!(served.map(|a| a.name), Some("ggml gemv"), "{}", arm.name);
            let parts = (arm.probe.expect(arm.name))(arm.name, 4096, 14336);
            let bytes: u64 = parts.iter().map(|p| p.0).sum();
            let want = arm.decode.unwrap() * (3 * 4096 * 14336) as f64;
            assert!(
                (bytes as f64 - want).abs() < 1.0,
                "{}: {bytes} bytes, {want}",
                arm.name
            );
        }
    }
}
