//! Layer rows: every `DenseFfnLayer` arm on CUDA against the same arm on the host backend.

use super::*;
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::host::HostBackend;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, ModelLevers, download_f32, upload_f32};
use crate::model::Activation;
use crate::testing::*;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

/// How a layer check installs its weights (the same seeded weights on both backends).
pub type Install = fn(&dyn GpuBackend, &mut DenseFfnLayer, &DenseWeights) -> GpuResult<()>;

/// One arm configuration of the layer checks: its name, how its weights are installed, the
/// levers (`METRALE_*` pairs) and the activation. One table drives the CUDA-against-host checks
/// and the host routing matrix (`check::routing::routing_matrix`).
#[derive(Clone, Copy)]
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

pub(crate) const fn arm(
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

/// Generates [`LAYER_ARMS`] from the list of built-in layouts (`layouts::builtin_layouts!`).
macro_rules! layer_arms {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        /// Every arm configuration the layer checks run: each built-in layout's
        /// (`src/layouts/TAG/check_layers.rs`), in `Layout` order.
        pub static LAYER_ARMS: LazyLock<Vec<LayerArm>> = LazyLock::new(|| {
            let mut v = Vec::new();
            $(v.extend_from_slice(&crate::layouts::$t::check_layers::ARMS);)*
            v
        });
    };
}
crate::layouts::builtin_layouts!(layer_arms);

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
