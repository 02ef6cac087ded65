//! `bf16`: BF16 rows, K padded to 8, and the BF16 arms.

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{projection_weight, refuse, shape_args};
use crate::ffn::*;

use crate::gpu::{DevicePtr, GpuResult};

use crate::ffn::routing::{always, prefill};
use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `bf16`: gate, up, down.
    pub const BF16: Key<[Bf16Weight; 3]> = Key::new(Layout::Bf16);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Bf16,
    builds_on: None,
    install,
    arms: &ARMS,
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 1] = [NamedArm::new("bf16", &[Layout::Bf16], 10)];

/// Install this layer's `bf16` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::BF16) {
        Some(&[g, u, d]) => l.set_bf16_weights(g, u, d),
        None => Ok(()),
    }
}

/// Its rows of the arm table, ranked within each method (`routing::arms`).
#[rustfmt::skip]
static ARMS: [Arm; 5] = [
    Arm::new(Decode, "bf16 gemv", Bf16, |l, _, _| l.kernels.bf16_gemv.ok(), |l, c, x, m| l.bf16_gemv_arm(c, x, m)).rank(50),
    Arm::new(Decode, "bf16 via prefill", Bf16, always, prefill).rank(60),
    Arm::new(Small, "bf16 via prefill", Bf16, always, prefill).rank(40),
    Arm::new(Verify, "bf16 via prefill", Bf16, always, prefill).rank(20),
    Arm::new(Prefill, "bf16", Bf16, always, |l, c, x, m| l.bf16_prefill_arm(c, x, m)).rank(40),
];

/// BF16 weight (`bf16` layout): `[n, kp]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bf16Weight {
    pub(crate) weight: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
}
projection_weight!(Bf16Weight, "A validated BF16 weight of `[n, k]` stored as `[n, kp]`." {
    weight: DevicePtr,
    n: usize,
    k: usize,
    kp: usize
});

impl Bf16Weight {
    /// The `bf16` layout's rules: k and kp % 8, a buffer that holds `[n, kp]`.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let w = self;
        if !w.k.is_multiple_of(8)
            || w.kp < w.k
            || !w.kp.is_multiple_of(8)
            || !fits(w.weight.bytes, &[w.n, w.kp, 2])
        {
            return Err(refuse(
                what,
                format!(
                    "k {} / kp {} / {} bytes do not fit the bf16 layout",
                    w.k, w.kp, w.weight.bytes
                ),
            ));
        }
        Ok(())
    }
}

shape_args!(Bf16Weight);

impl DenseFfnLayer {
    /// Install the BF16 overlay (`bf16` layout).
    pub fn set_bf16_weights(
        &mut self,
        gate: Bf16Weight,
        up: Bf16Weight,
        down: Bf16Weight,
    ) -> GpuResult<()> {
        self.check_projections("set_bf16_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(key::BF16, [gate, up, down]);
        Ok(())
    }
}
