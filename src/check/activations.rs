//! `metrale-pack check-activations`: every arm of a layer, loaded from a pack, on recorded real
//! activations (`layerN.npy`, the FFN input of layer N, f32 `[tokens, hidden]`, e.g. from
//! `scripts/quality_kl.py --record`), against the float64 FFN of the source's own weights; and
//! the same arm on random activations of the same row norms, for comparison.

use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::{GpuBackend, GpuResult};
use crate::loader::arms::{Arm, arms_of, rows_per_call, run_rows_with};
use crate::loader::{self, LoadOptions};
use crate::model::{Activation, Model};
use crate::testing::*;
use rayon::prelude::*;
use std::path::Path;
use std::sync::Arc;

/// One row of the table.
#[derive(Clone, Debug)]
pub struct ActRow {
    /// The arm (the overlays installed and the path taken).
    pub arm: String,
    /// The layer.
    pub layer: usize,
    /// Rows per call (1: the decode path, one call per row; else one prefill call).
    pub m: usize,
    /// Relative error against the float64 FFN of the source weights, real activations.
    pub real: f64,
    /// The same on random activations with the real rows' norms.
    pub random: f64,
    /// Why the layer refused this arm's overlays (e.g. W8A8 on a GELU model): the row then has
    /// no errors (NaN) and `m` 0. A refusal is a row of the table, never a silent gap.
    pub refused: Option<String>,
}

/// The float64 FFN of `rows` rows, in parallel over chunks of rows.
fn reference(x: &[f32], rows: usize, w: &DenseWeights, act: Activation) -> Vec<f64> {
    let h = w.hidden;
    let chunk = 16;
    (0..rows.div_ceil(chunk))
        .into_par_iter()
        .flat_map_iter(|c| {
            let (a, b) = (c * chunk, ((c + 1) * chunk).min(rows));
            ffn_f64(&x[a * h..b * h], b - a, w, act)
        })
        .collect()
}

/// Run the table for `layers` (all recorded when empty), at most `max_rows` rows of each.
pub fn activation_checks(
    b: Arc<dyn GpuBackend>,
    pack: &Path,
    source: &Path,
    inputs: &Path,
    layers: &[usize],
    max_rows: usize,
    rng: &mut Rand,
) -> crate::Result<Vec<ActRow>> {
    let model = Model::open(source)?;
    let lp = loader::load(b.as_ref(), pack, &LoadOptions::default())?;
    let m = &lp.pack.manifest.model;
    let (h, i) = (m.hidden_size as usize, m.intermediate_size as usize);
    let act = Activation::from_act_name(&m.activation).unwrap_or(Activation::Silu);
    let gpu = |e: crate::gpu::GpuError| crate::Error::Gpu(e);
    let mut out = Vec::new();
    for (pos, ov) in lp.layers.iter().enumerate() {
        let l = ov.index;
        if !layers.is_empty() && !layers.contains(&l) {
            continue;
        }
        let file = inputs.join(format!("layer{l}.npy"));
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let npy = crate::npy::parse(&bytes).map_err(|reason| crate::Error::Unsupported {
            file: file.display().to_string(),
            reason,
        })?;
        if npy.dtype != crate::npy::NpyDtype::F32 || npy.shape.last() != Some(&h) {
            return Err(crate::Error::Unsupported {
                file: file.display().to_string(),
                reason: format!(
                    "expected f32 [tokens, {h}], got {:?} {:?}",
                    npy.dtype, npy.shape
                ),
            });
        }
        let rows = (npy.data.len() / 4 / h).min(max_rows);
        let real: Vec<f32> = npy.to_f32()[..rows * h].to_vec();
        // Random rows with the real rows' norms.
        let mut random = rng.vec(rows * h, 1.0);
        for r in 0..rows {
            let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            let (want, got) = (
                norm(&real[r * h..(r + 1) * h]),
                norm(&random[r * h..(r + 1) * h]),
            );
            let s = if got > 0.0 { (want / got) as f32 } else { 0.0 };
            random[r * h..(r + 1) * h].iter_mut().for_each(|x| *x *= s);
        }
        let fl = &model.ffn_layers[pos.min(model.ffn_layers.len() - 1)];
        let fl = model.ffn_layers.iter().find(|f| f.index == l).unwrap_or(fl);
        let w = DenseWeights {
            gate: model.decode_weight(&fl.gate)?.0,
            up: model.decode_weight(&fl.up)?.0,
            down: model.decode_weight(&fl.down)?.0,
            hidden: h,
            inter: i,
        };
        let want_real = reference(&real, rows, &w, act);
        let want_random = reference(&random, rows, &w, act);
        let arms = arms_of(ov);
        let cfg = FfnConfig {
            hidden: h,
            inter: i,
        };
        for Arm {
            name: arm,
            overlays,
            levers,
            fixed,
        } in arms
        {
            let mut ctx = ForwardContext::new(b.clone(), cfg, rows.max(1), levers).map_err(gpu)?;
            let mut layer = DenseFfnLayer::new_with_activation(&ctx, act);
            if let Err(e) = overlays.install(&mut layer) {
                out.push(ActRow {
                    arm: arm.into(),
                    layer: l,
                    m: 0,
                    real: f64::NAN,
                    random: f64::NAN,
                    refused: Some(e.to_string()),
                });
                continue;
            }
            // Decode (one row per call) on the first rows, then prefill calls over all.
            let decode_rows = rows.min(32);
            for (m, count) in [(1usize, decode_rows), (rows_per_call(arm, rows), rows)] {
                let er = |x: &[f32], want: &[f64], ctx: &mut ForwardContext| -> GpuResult<f64> {
                    let y = run_rows_with(
                        ctx,
                        &layer,
                        fixed,
                        &x[..count * h],
                        h,
                        m.min(count),
                        |_, _| Ok(()),
                    )?;
                    Ok(rel_err(&y, &want[..count * h]))
                };
                let real_err = er(&real, &want_real, &mut ctx).map_err(gpu)?;
                let random_err = er(&random, &want_random, &mut ctx).map_err(gpu)?;
                out.push(ActRow {
                    arm: arm.into(),
                    layer: l,
                    m: m.min(count),
                    real: real_err,
                    random: random_err,
                    refused: None,
                });
            }
        }
    }
    b.free(lp.arena);
    Ok(out)
}

/// Print the table.
pub fn print_activation_table(rows: &[ActRow]) {
    println!(
        "{:<22} {:>5} {:>6} {:>14} {:>14} {:>7}",
        "arm", "layer", "m", "real rel err", "random rel err", "ratio"
    );
    for r in rows {
        if let Some(why) = &r.refused {
            println!("{:<22} {:>5}   refused: {why}", r.arm, r.layer);
            continue;
        }
        println!(
            "{:<22} {:>5} {:>6} {:>14.3e} {:>14.3e} {:>7.2}",
            r.arm,
            r.layer,
            r.m,
            r.real,
            r.random,
            r.real / r.random.max(1e-300)
        );
    }
}

/// Layer `layer`'s FFN from the pack at `pack`, by arm `arm` (a name of [`arms_of`]), on the
/// rows of `x` (f32 `[rows, hidden]`): the output rows, f32 (`ffn-apply --arm`).
pub fn apply_arm(
    b: Arc<dyn GpuBackend>,
    pack: &Path,
    layer: usize,
    arm: &str,
    x: &[f32],
) -> crate::Result<Vec<f32>> {
    let lp = loader::load(b.as_ref(), pack, &LoadOptions::default())?;
    let y = loader::arms::run_arm(&b, &lp, layer, arm, x);
    b.free(lp.arena);
    y
}
