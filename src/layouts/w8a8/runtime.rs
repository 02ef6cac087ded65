//! `w8a8`: E4M3 with per-row scales for the declared-W8A8 arm (activations quantized per row).

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{projection_weight, refuse};
use crate::ffn::*;

use crate::gpu::{DevicePtr, GpuError, GpuResult};

use crate::ffn::routing::{always, prefill};
use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `w8a8`: the declared-W8A8 decode weights.
    pub const W8A8: Key<[W8a8Weight; 3]> = Key::new(Layout::W8a8);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::W8a8,
    builds_on: None,
    install,
    arms: &ARMS,
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 2] = [
    NamedArm::new("w8a8", &[Layout::W8a8], 30).max_rows(W8A8_MAX_ROWS),
    NamedArm::new("w8a8 fixed (W8A8)", &[Layout::W8a8], 31).fixed(),
];

/// Install this layer's `w8a8` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::W8A8) {
        Some(&w) => l.set_w8a8_decode_weights(w, l.hidden, l.inter),
        None => Ok(()),
    }
}

/// Its rows of the arm table, ranked within each method (`routing::arms`).
#[rustfmt::skip]
static ARMS: [Arm; 5] = [
    Arm::new(Decode, "w8a8", W8a8, |l, c, _| l.fixed_w8a8_ok(c, 1), |l, c, x, m| l.w8a8_arm(c, x, m)).rank(10),
    Arm::new(Small, "w8a8 via prefill", W8a8, always, prefill).rank(20),
    Arm::new(Prefill, "w8a8", W8a8, |l, c, m| m <= c.levers.w8a8_max_rows && l.fixed_w8a8_ok(c, m), |l, c, x, m| l.w8a8_arm(c, x, m)).rank(10),
    Arm::new(Prefill, "w8a8 past its rows", W8a8, always, |_, c, _, m| Err(w8a8_rows_refusal(c, m))).rank(80),
    Arm::new(Fixed, "w8a8", W8a8, |l, c, m| l.fixed_w8a8_ok(c, m), |l, c, x, m| l.w8a8_arm(c, x, m)).rank(10),
];

/// A prefill past the W8A8 arm's rows on a layer with nothing else.
fn w8a8_rows_refusal(c: &ForwardContext, m: usize) -> GpuError {
    GpuError::NotServed(format!(
        "forward_prefill: {m} rows exceed the W8A8 arm's {} and no other weights are installed",
        c.levers.w8a8_max_rows
    ))
}

/// Per-row FP8 weight (`w8a8` layout): E4M3 `[n, kp]`, f32 row scales `[n]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct W8a8Weight {
    pub(crate) weight: DevicePtr,
    pub(crate) scale: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
}
projection_weight!(W8a8Weight, "A validated W8A8 weight of `[n, k]` stored as `[n, kp]`." {
    weight: DevicePtr,
    scale: DevicePtr,
    n: usize,
    k: usize,
    kp: usize
});

impl W8a8Weight {
    /// The `w8a8` layout's rules: kp % 128 (its `K_ALIGN`), buffers that hold `[n, kp]` and
    /// `[n]` f32.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let x = self;
        if !x
            .kp
            .is_multiple_of(crate::converters::layouts::w8a8::K_ALIGN)
            || x.kp < x.k
            || !fits(x.weight.bytes, &[x.n, x.kp])
            || !fits(x.scale.bytes, &[x.n, 4])
        {
            return Err(refuse(
                what,
                format!("kp {} / buffers do not fit the w8a8 layout", x.kp),
            ));
        }
        Ok(())
    }
}

impl DenseFfnLayer {
    /// The fixed W8A8 arm: W8A8 weights installed (a SiLU or GELU layer), its two kernels
    /// resolved, and the declared format `w8a8` or none.
    pub fn fixed_w8a8_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        let declared = ctx
            .levers
            .activation_quantization
            .as_deref()
            .is_none_or(|f| f == "w8a8");
        declared
            && self.holds(Layout::W8a8)
            && self.kernels.quant_fp8_row.ok()
            && self.kernels.w8a8_gemm.ok()
            && (1..=ctx.max_tokens).contains(&m)
    }

    /// Install the declared-W8A8 decode weights (`w8a8` layout), for a SiLU or GELU FFN (the
    /// arm's act-mul and its fused quantizer take the layer's activation). Refused for shapes
    /// other than `[inter, hidden]` (gate, up) and `[hidden, inter]` (down).
    pub fn set_w8a8_decode_weights(
        &mut self,
        w: [W8a8Weight; 3],
        hidden: usize,
        inter: usize,
    ) -> GpuResult<()> {
        if (hidden, inter) != (self.hidden, self.inter) {
            return Err(GpuError::Shape(format!(
                "set_w8a8_decode_weights: hidden/inter {hidden}/{inter}, layer is {}/{}",
                self.hidden, self.inter
            )));
        }
        self.check_projections(
            "set_w8a8_decode_weights",
            [Some(&w[0]), Some(&w[1]), Some(&w[2])],
        )?;
        self.overlays.set(key::W8A8, w);
        Ok(())
    }
}
