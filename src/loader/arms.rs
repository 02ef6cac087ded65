//! The arms a pack-loaded layer can run, by name (`bf16`, `nvfp4 fixed (W4A4)`, ...: each a set
//! of the layer's overlays, levers and the path it takes), and one layer run through one of
//! them: what `ffn-apply --arm`, `check-activations`, the tensor-parallel check and the Python
//! package's `forward(..., arm=)` share.

use super::{LayerOverlays, LoadedPack};
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::{GpuBackend, GpuResult, ModelLevers, download_f32, upload_f32};
use crate::model::Activation;
use std::sync::Arc;

/// One arm of a pack-loaded layer: the overlays it installs, its levers, and whether it runs the
/// fixed (batch-invariant, activation-quantizing) path.
pub struct Arm {
    /// Its name in the tables.
    pub name: &'static str,
    /// The overlays it installs.
    pub overlays: LayerOverlays,
    /// Its levers.
    pub levers: ModelLevers,
    /// `forward_fixed` instead of the routed forward.
    pub fixed: bool,
}

/// Every arm that the layer's overlays `ov` (from a pack) can serve: each registered layout's
/// named arms (`ffn::NamedArm`, in its runtime) whose layouts the layer holds, by rank.
pub fn arms_of(ov: &LayerOverlays) -> Vec<Arm> {
    crate::ffn::named_arms()
        .iter()
        .filter(|a| a.layouts.iter().all(|&l| ov.overlays.holds(l)))
        .map(|a| Arm {
            name: a.name,
            overlays: ov.only(a.layouts),
            levers: (a.levers)(),
            fixed: a.fixed,
        })
        .collect()
}

/// The overlays of FFN layer `layer` of a loaded pack, or an error naming the pack and layer.
pub fn layer_overlays(lp: &LoadedPack, layer: usize) -> crate::Result<&LayerOverlays> {
    lp.layers
        .iter()
        .find(|o| o.index == layer)
        .ok_or_else(|| crate::Error::NotFound {
            file: lp.pack.file.path.display().to_string(),
            tensor: format!("FFN layer {layer}"),
        })
}

/// The most rows arm `arm` takes per prefill call: its `NamedArm::max_rows` (the declared
/// W8A8 arm serves at most `W8A8_MAX_ROWS`), every other any number.
pub fn rows_per_call(arm: &str, rows: usize) -> usize {
    crate::ffn::named_arms()
        .iter()
        .find(|a| a.name == arm)
        .map_or(rows, |a| rows.min(a.max_rows))
}

/// `m` device rows at `x` through `layer`: the fixed path, the decode forward for one row,
/// else the prefill forward (how an arm of [`arms_of`] runs).
pub fn forward_rows(
    ctx: &mut ForwardContext,
    layer: &DenseFfnLayer,
    fixed: bool,
    x: crate::gpu::DevicePtr,
    m: usize,
) -> GpuResult<crate::gpu::DevicePtr> {
    if fixed {
        layer.forward_fixed(ctx, x, m)
    } else if m == 1 {
        layer.forward(ctx, x)
    } else {
        layer.forward_prefill(ctx, x, m)
    }
}

/// `layer` on the rows of `x` (`[rows, h]`), `per` rows per call: the fixed path, the decode
/// forward for single rows, else the prefill forward. The output rows, f32. `after(output,
/// rows)` runs on each call's output before it is downloaded (the tensor-parallel check's
/// all-reduce; nothing elsewhere).
pub fn run_rows_with(
    ctx: &mut ForwardContext,
    layer: &DenseFfnLayer,
    fixed: bool,
    x: &[f32],
    h: usize,
    per: usize,
    mut after: impl FnMut(crate::gpu::DevicePtr, usize) -> GpuResult<()>,
) -> GpuResult<Vec<f32>> {
    let be = ctx.backend.clone();
    let total = x.len() / h;
    let mut y = Vec::with_capacity(total * h);
    let xp = be.alloc((per * h * 4) as u64)?;
    for r0 in (0..total).step_by(per) {
        let n = per.min(total - r0);
        upload_f32(be.as_ref(), xp, &x[r0 * h..(r0 + n) * h])?;
        let o = forward_rows(ctx, layer, fixed, xp, n)?;
        be.synchronize(0)?;
        after(o, n)?;
        y.extend(download_f32(be.as_ref(), o.view(0, (n * h * 4) as u64))?);
    }
    be.free(xp);
    Ok(y)
}

/// FFN layer `layer` of the loaded pack `lp` through arm `arm` (a name of [`arms_of`]) on the
/// rows of `x` (f32 `[rows, hidden]`): the output rows, f32. The arm's layer and context are
/// built for the call and freed after it.
pub fn run_arm(
    b: &Arc<dyn GpuBackend>,
    lp: &LoadedPack,
    layer: usize,
    arm: &str,
    x: &[f32],
) -> crate::Result<Vec<f32>> {
    let gpu = |e: crate::gpu::GpuError| crate::Error::Gpu(e);
    let file = lp.pack.file.path.display().to_string();
    let m = &lp.pack.manifest.model;
    let h = m.hidden_size as usize;
    let act = Activation::from_act_name(&m.activation).unwrap_or(Activation::Silu);
    let ov = layer_overlays(lp, layer)?;
    let a = arms_of(ov)
        .into_iter()
        .find(|a| a.name == arm)
        .ok_or_else(|| crate::Error::Unsupported {
            file: file.clone(),
            reason: format!(
                "layer {layer} has no arm {arm:?} (its arms: {})",
                arm_names(ov).join(", ")
            ),
        })?;
    if h == 0 || x.is_empty() || !x.len().is_multiple_of(h) {
        return Err(crate::Error::Unsupported {
            file,
            reason: format!("{} input values are not rows of {h}", x.len()),
        });
    }
    let per = rows_per_call(a.name, x.len() / h).max(1);
    let cfg = FfnConfig {
        hidden: h,
        inter: lp.ffn_inter,
    };
    let mut ctx = ForwardContext::new(b.clone(), cfg, per, a.levers).map_err(gpu)?;
    let mut l = DenseFfnLayer::new_with_activation(&ctx, act);
    a.overlays.install(&mut l).map_err(gpu)?;
    run_rows_with(&mut ctx, &l, a.fixed, x, h, per, |_, _| Ok(())).map_err(gpu)
}

/// The names of the arms the overlays `ov` can serve, in [`arms_of`]'s order.
pub fn arm_names(ov: &LayerOverlays) -> Vec<&'static str> {
    arms_of(ov).into_iter().map(|a| a.name).collect()
}
