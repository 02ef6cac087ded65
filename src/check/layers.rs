//! Layer rows: every `DenseFfnLayer` arm on CUDA against the same arm on the host backend.

use super::*;
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::host::HostBackend;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, ModelLevers, download_f32, upload_f32};
use crate::model::Activation;
use crate::testing::*;
use std::collections::HashMap;
use std::sync::Arc;

/// How a layer check installs its weights (the same seeded weights on both backends).
pub type Install = fn(&dyn GpuBackend, &mut DenseFfnLayer, &DenseWeights) -> GpuResult<()>;

/// One arm configuration of the layer checks: its name, how its weights are installed, the
/// levers (`METRALE_*` pairs) and the activation. One table drives the CUDA-against-host checks
/// and the host routing matrix (`check::routing::routing_matrix`).
pub struct LayerArm {
    /// The check's name (`gpu-check --arms` filters on it).
    pub name: &'static str,
    /// Its installation.
    pub install: Install,
    /// Its levers.
    pub levers: &'static [(&'static str, &'static str)],
    /// Its activation.
    pub act: Activation,
}

impl LayerArm {
    /// The levers as the layer reads them (the SM90 defaults under these pairs).
    pub fn model_levers(&self) -> ModelLevers {
        let env: HashMap<String, String> = self
            .levers
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        ModelLevers::from_map(&env, crate::gpu::levers::HARDWARE_SM90)
    }
}

const fn arm(
    name: &'static str,
    install: Install,
    levers: &'static [(&'static str, &'static str)],
    act: Activation,
) -> LayerArm {
    LayerArm {
        name,
        install,
        levers,
        act,
    }
}

/// Every arm configuration the layer checks run.
pub static LAYER_ARMS: [LayerArm; 35] = [
    arm(
        "fp8 fused",
        |b, l, w| install_fp8(b, l, w, true),
        &[],
        Activation::Silu,
    ),
    arm(
        "fp8",
        |b, l, w| install_fp8(b, l, w, false),
        &[],
        Activation::Silu,
    ),
    arm(
        // The f32 FFMA GEMV (f32 activations) for m <= 4, fused gate+up: the default for 2..4
        // rows before 2026-12-02 (session 17).
        "fp8 ffma gemv",
        |b, l, w| install_fp8(b, l, w, true),
        &[("METRALE_FP8_GEMV_MMA", "0")],
        Activation::Silu,
    ),
    arm(
        // The tensor-core GEMV (bf16 activations) from one row to its 8, fused gate+up.
        "fp8 mma gemv",
        |b, l, w| install_fp8(b, l, w, true),
        &[
            ("METRALE_FP8_GEMV_MMA_MIN_ROWS", "1"),
            ("METRALE_FP8_W8A8_MIN_ROWS", "9"),
        ],
        Activation::Silu,
    ),
    arm(
        // The w8a16 contract (bf16 activations) at every m: the FP8 W8A8 prefill off.
        "fp8 w8a16",
        |b, l, w| install_fp8(b, l, w, false),
        &[("METRALE_FP8_W8A8", "0")],
        Activation::Silu,
    ),
    arm(
        // W8A8 (per-group FP8 activations) from 33 rows, the default before 2026-12-02: 5..32
        // rows on the w8a16 GEMMs.
        "fp8 w8a8 from 33 rows",
        |b, l, w| install_fp8(b, l, w, true),
        &[("METRALE_FP8_W8A8_MIN_ROWS", "33")],
        Activation::Silu,
    ),
    arm(
        "fp8 m16_tc",
        |b, l, w| install_fp8(b, l, w, false),
        &[
            ("METRALE_FFN_M16_TC", "1"),
            ("METRALE_FP8_W8A8_MIN_ROWS", "33"),
        ],
        Activation::Silu,
    ),
    arm(
        "fp8 batch16",
        |b, l, w| install_fp8(b, l, w, false),
        &[
            ("METRALE_FFN_BATCH16", "1"),
            ("METRALE_FP8_W8A8_MIN_ROWS", "33"),
        ],
        Activation::Silu,
    ),
    arm(
        "fp8 gelu",
        |b, l, w| install_fp8(b, l, w, false),
        &[],
        Activation::Gelu,
    ),
    arm(
        "w8a8",
        install_w8a8,
        &[("METRALE_W8A8_MAX_ROWS", "4096")],
        Activation::Silu,
    ),
    arm(
        // The portable GEMM (what a device without sm_90a runs).
        "w8a8 portable",
        install_w8a8,
        &[
            ("METRALE_W8A8_MAX_ROWS", "4096"),
            ("METRALE_W8A8_WGMMA", "0"),
        ],
        Activation::Silu,
    ),
    arm(
        // m <= 16 through w8a8_gemv; the fixed-path row below checks its bits against the
        // GEMM's (one row alone against 130 rows).
        "w8a8 decode gemv",
        install_w8a8,
        &[
            ("METRALE_W8A8_MAX_ROWS", "4096"),
            ("METRALE_W8A8_DECODE_GEMV", "1"),
            ("METRALE_W8A8_WGMMA", "0"),
        ],
        Activation::Silu,
    ),
    arm("bf16", install_bf16, &[], Activation::Silu),
    arm("nvfp4", install_nvfp4, &[], Activation::Silu),
    arm("nvfp4 gelu", install_nvfp4, &[], Activation::Gelu),
    arm("nvfp4 t", install_nvfp4_t, &[], Activation::Silu),
    arm(
        "nvfp4 t k64",
        install_nvfp4_t,
        &[("METRALE_W4A16_K64_MIN_K", "64")],
        Activation::Silu,
    ),
    arm("nvfp4 mmq", install_nvfp4_mmq, &[], Activation::Silu),
    arm(
        // The portable MMQ GEMM (what a device without sm_90a runs).
        "nvfp4 mmq mma.sync",
        install_nvfp4_mmq,
        &[("METRALE_DQ_WGMMA", "0")],
        Activation::Silu,
    ),
    arm(
        "nvfp4 ksplit down",
        install_nvfp4,
        &[("METRALE_W4A16_GEMV_KSPLIT_MIN_K", "1")],
        Activation::Silu,
    ),
    arm(
        "nvfp4 silu fused",
        install_nvfp4,
        &[
            ("METRALE_FFN_SILU_FUSED_DOWN", "1"),
            ("METRALE_DECODE_FFN_VIA_GEMM", "0"),
        ],
        Activation::Silu,
    ),
    arm(
        "nvfp4 q4k mmq",
        |b, l, w| install_nvfp4_q4k(b, l, w, false),
        &[("METRALE_Q4K_MMQ", "1")],
        Activation::Silu,
    ),
    arm(
        "nvfp4 q4k mmq mma.sync",
        |b, l, w| install_nvfp4_q4k(b, l, w, false),
        &[("METRALE_Q4K_MMQ", "1"), ("METRALE_DQ_WGMMA", "0")],
        Activation::Silu,
    ),
    arm(
        "nvfp4 q4k mmq q4k-down",
        |b, l, w| install_nvfp4_q4k(b, l, w, true),
        &[("METRALE_Q4K_MMQ", "1")],
        Activation::Silu,
    ),
    arm(
        // q4k_mmq alone: the decode GEMVs over its bytes, the MMQ prefill.
        "q4k",
        |b, l, w| install_q4k(b, l, w, false),
        &[],
        Activation::Silu,
    ),
    arm(
        "q4k q4k-down",
        |b, l, w| install_q4k(b, l, w, true),
        &[],
        Activation::Silu,
    ),
    arm("q2", install_q2, &[], Activation::Silu),
    arm(
        // 8-bit codes (a Q8_0 or float source).
        "affine q8",
        |b, l, w| install_affine(b, l, w, AffineKind::Q8_0),
        &[],
        Activation::Silu,
    ),
    arm(
        // 4-bit codes with offsets (a Q4_1 source), GELU.
        "affine q4 gelu",
        |b, l, w| install_affine(b, l, w, AffineKind::Q4_1),
        &[],
        Activation::Gelu,
    ),
    arm(
        // 4-bit codes in groups of 128 with zero points and half scales (an AWQ or
        // compressed-tensors int4 source).
        "affine int4 g128",
        |b, l, w| install_affine(b, l, w, AffineKind::Int4G128),
        &[],
        Activation::Silu,
    ),
    arm(
        // 8-bit codes, one group a row, f32 scale and zero point (compressed-tensors int8 per
        // channel in f32).
        "affine int8 channel",
        |b, l, w| install_affine(b, l, w, AffineKind::Int8Channel),
        &[],
        Activation::Silu,
    ),
    arm(
        // 4-bit groups of 128 with act-order (GPTQ desc_act): columns sorted by group, the
        // activations gathered, the prefill's BF16 weights scattered back.
        "affine int4 g128 act-order",
        |b, l, w| install_affine(b, l, w, AffineKind::Int4G128Perm),
        &[],
        Activation::Silu,
    ),
    arm(
        "q2 mmq",
        install_q2,
        &[("METRALE_Q2G128_MMQ", "1")],
        Activation::Silu,
    ),
    arm(
        // The same seeded adapter on both backends.
        "nvfp4 lora",
        |b, l, w| {
            install_nvfp4(b, l, w)?;
            LoraAdapter::random(&mut Rand(77), w.hidden, w.inter, 16).install(b, l)
        },
        &[],
        Activation::Silu,
    ),
    arm(
        "nvfp4 w4a4",
        install_nvfp4,
        &[
            ("METRALE_SINGLE_ROW_W4A4", "1"),
            ("METRALE_SMALL_BATCH_W4A4", "1"),
        ],
        Activation::Silu,
    ),
];

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
    for &(h, i) in shapes {
        let w = DenseWeights::random(rng, h, i);
        let cfg = FfnConfig {
            hidden: h,
            inter: i,
        };
        for a in LAYER_ARMS.iter().filter(|a| keep(a.name)) {
            let levers = a.model_levers();
            let mut gc = ForwardContext::new(b.clone(), cfg, mmax, levers.clone())?;
            let mut hc = ForwardContext::new(host.clone(), cfg, mmax, levers.clone())?;
            (gc.tracing, hc.tracing) = (true, true);
            let mut gl = DenseFfnLayer::new_with_activation(&gc, a.act);
            let mut hl = DenseFfnLayer::new_with_activation(&hc, a.act);
            (a.install)(b.as_ref(), &mut gl, &w)?;
            (a.install)(host.as_ref(), &mut hl, &w)?;
            for &m in ms {
                let x = rng.vec(m * h, 1.0);
                let xg = b.alloc((m * h * 4) as u64)?;
                let xh = host.alloc((m * h * 4) as u64)?;
                upload_f32(b.as_ref(), xg, &x)?;
                upload_f32(host.as_ref(), xh, &x)?;
                for method in methods(a.name, m) {
                    gc.trace.clear();
                    hc.trace.clear();
                    let yg = run_method(&gl, &mut gc, xg, method, m)?;
                    let yh = run_method(&hl, &mut hc, xh, method, m)?;
                    let err = cuda_vs_host_err(&yg, &yh, gc.trace == hc.trace);
                    push(
                        &mut rows,
                        &format!("layer {} {method}", a.name),
                        (h, i),
                        m,
                        err,
                        tolerance(a.name, method, m, &levers),
                    );
                }
                b.free(xg);
                host.free(xh);
            }
            if a.name.starts_with("w8a8") || a.name == "nvfp4 w4a4" {
                let row = fixed_batch_invariance(b.as_ref(), &gl, &mut gc, a.name, h, mmax, rng)?;
                push(&mut rows, &row.0, (h, i), row.1, row.2, 0.0);
            }
        }
    }
    Ok(rows)
}

/// The forward methods a layer check calls at `m` rows.
fn methods(arm: &str, m: usize) -> &'static [&'static str] {
    let nv = arm.starts_with("nvfp4");
    match m {
        1 if nv => &["forward", "prefill", "km"],
        1 => &["forward", "prefill"],
        2 => &["forward_k2", "prefill"],
        3 => &["forward_k3"],
        _ if arm.starts_with("w8a8") => &["prefill", "fixed"],
        _ if arm == "nvfp4 w4a4" && m <= 16 => &["prefill", "fixed", "km"],
        _ if arm == "nvfp4 w4a4" => &["fixed"],
        _ if nv && m <= 16 => &["prefill", "km"],
        _ => &["prefill"],
    }
}

/// Call forward method `method` of `l` on `m` rows at `x` (its output poisoned first), and
/// read the output back.
fn run_method(
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    x: DevicePtr,
    method: &str,
    m: usize,
) -> GpuResult<Vec<f32>> {
    c.backend.fill(c.arena.output, 0xFF)?;
    let out = call_method(l, c, x, method, m)?;
    c.backend.synchronize(0)?;
    download_f32(c.backend.as_ref(), out)
}

/// Forward method `method` (`forward`, `forward_k2`, `forward_k3`, `fixed`, `km`, `prefill`).
pub(crate) fn call_method(
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    x: DevicePtr,
    method: &str,
    m: usize,
) -> GpuResult<DevicePtr> {
    match method {
        "forward" => l.forward(c, x),
        "forward_k2" => l.forward_k2(c, x),
        "forward_k3" => l.forward_k3(c, x),
        "fixed" => l.forward_fixed(c, x, m),
        "km" => l.forward_km(c, x, m),
        _ => l.forward_prefill(c, x, m),
    }
}

/// The tolerance of a layer check against the host backend.
///
/// Intermediate activations amplify last-bit differences: 1e-4 for arms that keep f32
/// activations (the FP8, BF16 and Q2 GEMVs); where the intermediate is rounded again a
/// last-bit difference can flip it: 1e-3 for BF16 (the cuBLAS arm, the FP8 tensor-core GEMMs
/// above the GEMV rows, and every NVFP4 arm: its decode GEMVs round activations to bf16 too),
/// 5e-3 for W8A8 (FP8).
fn tolerance(arm: &str, method: &str, m: usize, levers: &ModelLevers) -> f64 {
    let nv = arm.starts_with("nvfp4");
    let tc_rows = if levers.ffn_batch16 { 16 } else { 4 };
    let w4a4 = arm == "nvfp4 w4a4" && method != "prefill";
    let q2_prefill = arm.starts_with("q2") && method == "prefill";
    let q4k_prefill = arm.contains("q4k") && method == "prefill";
    let affine_gemv = arm.starts_with("affine")
        && (method != "prefill" || m <= crate::gpu::sizes::AFFINE_GEMV_MAX_ROWS);
    if (q2_prefill && arm.ends_with("mmq")) || q4k_prefill || affine_gemv {
        // q8_1 activations (the affine GEMVs' int8 ones): a last-bit difference can move one
        // code.
        5e-3
    } else if q2_prefill || (arm.starts_with("affine") && method == "prefill") {
        // Weights and activations rounded to BF16 for the BF16 GEMM.
        1e-3
    } else if w4a4 {
        // NVFP4 activations: a last-bit difference can move one E2M1 code.
        2e-2
    } else if arm.starts_with("fp8") && levers.fp8_w8a8 && m >= levers.fp8_w8a8_min_rows {
        // The FP8 arm's W8A8 prefill: FP8 activations per 128-column group, as W8A8 below (a
        // last-bit difference can move an FP8 code).
        2e-2
    } else if arm == "w8a8" {
        // The wgmma GEMMs sum each 128-k stage on Hopper's FP8 accumulator (about 1e-4 from
        // the f64 twin, their kernel rows); that moves some FP8 codes of the down projection's
        // quantized input by one step (2^-3): 2e-2, as for the NVFP4 activations.
        2e-2
    } else if arm.starts_with("w8a8") {
        5e-3
    } else if arm.starts_with("bf16")
        || m > tc_rows
        || nv
        || (arm.starts_with("fp8")
            && levers.fp8_gemv_mma
            && (levers.fp8_gemv_mma_min_rows..=8).contains(&m))
    {
        // bf16-rounded activations (the FP8 tensor-core GEMVs among them).
        1e-3
    } else {
        1e-4
    }
}

/// The fixed path's batch invariance: a row's output bits alone equal its bits inside a batch
/// (W8A8: 130 rows, two m tiles of the wgmma GEMM; rows alone sit at position 0). Returns the
/// row's (check, m, err).
fn fixed_batch_invariance(
    b: &dyn GpuBackend,
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    arm: &str,
    h: usize,
    mmax: usize,
    rng: &mut Rand,
) -> GpuResult<(String, usize, f64)> {
    let m = if arm.starts_with("w8a8") { 130 } else { 33 }.min(mmax);
    let x = rng.vec(m * h, 1.0);
    let xg = b.alloc((m * h * 4) as u64)?;
    upload_f32(b, xg, &x)?;
    let all = download_f32(b, l.forward_fixed(c, xg, m)?)?;
    let mut same = true;
    for r in [0, m / 2, m - 1] {
        let x1 = b.alloc((h * 4) as u64)?;
        upload_f32(b, x1, &x[r * h..(r + 1) * h])?;
        let one = download_f32(b, l.forward_fixed(c, x1, 1)?)?;
        same &= same_bits(&one, &all[r * h..(r + 1) * h]);
        b.free(x1);
    }
    b.free(xg);
    Ok((
        format!("fixed {arm}: row bits alone == in batch"),
        m,
        if same { 0.0 } else { 1.0 },
    ))
}
