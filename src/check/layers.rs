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
    /// How the checks run it and how close it must come.
    pub rules: ArmRules,
}

/// How the layer checks run an arm: the forward methods at `m` rows, the tolerance of its CUDA
/// output against the host backend's (`tol(method, m, levers)`), and the rows of its fixed
/// path's batch-invariance check where it has a fixed path. Each layout's arms say theirs
/// (`src/layouts/TAG/check_layers.rs`).
///
/// Intermediate activations amplify last-bit differences: 1e-4 for arms that keep f32
/// activations; where the intermediate is rounded again a last-bit difference can flip it
/// (1e-3 for BF16, more where an arm quantizes its activations).
#[derive(Clone, Copy)]
pub struct ArmRules {
    /// The forward methods at `m` rows (`forward`, `forward_k2`, `forward_k3`, `fixed`, `km`,
    /// `prefill`).
    pub methods: fn(usize) -> &'static [&'static str],
    /// The tolerance for `(method, m, levers)`.
    pub tol: fn(&str, usize, &ModelLevers) -> f64,
    /// The rows of the fixed-path batch-invariance check (`None`: no fixed path).
    pub fixed_rows: Option<usize>,
}

/// Arms whose GEMVs (up to `GEMV_ROWS` rows, the prefill's too) take int8 activations: a
/// last-bit difference (a GPU's `expf`/`tanhf`, a summation order) can move one code (5e-3);
/// above, weights and activations rounded to BF16 for the BF16 GEMM (1e-3).
pub const fn int8_activation_rules<const GEMV_ROWS: usize>() -> ArmRules {
    ArmRules {
        tol: |method, m, _| {
            if method != "prefill" || m <= GEMV_ROWS {
                5e-3
            } else {
                1e-3
            }
        },
        ..ArmRules::PLAIN
    }
}

impl ArmRules {
    /// f32 activations through the GEMVs, BF16 from the tensor-core rows on
    /// ([`plain_methods`], [`plain_tol`]).
    pub const PLAIN: ArmRules = ArmRules {
        methods: plain_methods,
        tol: plain_tol,
        fixed_rows: None,
    };
}

/// The methods every arm serves: the one-, two- and three-row decodes, and the prefill.
pub fn plain_methods(m: usize) -> &'static [&'static str] {
    match m {
        1 => &["forward", "prefill"],
        2 => &["forward_k2", "prefill"],
        3 => &["forward_k3"],
        _ => &["prefill"],
    }
}

/// The rows from which the layer's tensor-core GEMMs (BF16 activations) serve.
pub fn tensor_core_rows(levers: &ModelLevers) -> usize {
    if levers.ffn_batch16 { 16 } else { 4 }
}

/// 1e-4 where activations stay f32, 1e-3 from the tensor-core rows (BF16-rounded
/// activations).
pub fn plain_tol(_method: &str, m: usize, levers: &ModelLevers) -> f64 {
    if m > tensor_core_rows(levers) {
        1e-3
    } else {
        1e-4
    }
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
        rules: ArmRules::PLAIN,
    }
}

impl LayerArm {
    /// The arm with rules `rules`.
    pub(crate) const fn with(mut self, rules: ArmRules) -> LayerArm {
        self.rules = rules;
        self
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
                for method in (a.rules.methods)(m) {
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
                        (a.rules.tol)(method, m, &levers),
                    );
                }
                b.free(xg);
                host.free(xh);
            }
            if let Some(fixed) = a.rules.fixed_rows {
                let m = fixed.min(mmax);
                let row = fixed_batch_invariance(b.as_ref(), &gl, &mut gc, a.name, h, m, rng)?;
                push(&mut rows, &row.0, (h, i), row.1, row.2, 0.0);
            }
        }
    }
    Ok(rows)
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

/// The fixed path's batch invariance: a row's output bits alone equal its bits inside a batch
/// of `m` rows (the arm's `fixed_rows`; rows alone sit at position 0). Returns the row's
/// (check, m, err).
fn fixed_batch_invariance(
    b: &dyn GpuBackend,
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    arm: &str,
    h: usize,
    m: usize,
    rng: &mut Rand,
) -> GpuResult<(String, usize, f64)> {
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
