//! `q2g128`: 2-bit codes with one f16 scale per group of 128, and the q2g128 arms.

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{projection_weight, refuse, shape_args};
use crate::ffn::*;

use crate::gpu::sizes::*;
use crate::gpu::{DevicePtr, GpuResult};

use crate::ffn::routing::always;
use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `q2g128`: gate, up, down.
    pub const Q2G128: Key<[Q2g128Weight; 3]> = Key::new(Layout::Q2g128);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Q2g128,
    builds_on: None,
    install,
    arms: &ARMS,
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 1] = [NamedArm::new("q2g128", &[Layout::Q2g128], 50)];

/// Install this layer's `q2g128` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::Q2G128) {
        Some(&[g, u, d]) => l.set_q2_weights(g, u, d),
        None => Ok(()),
    }
}

/// Its rows of the arm table, ranked within each method (`routing::arms`).
#[rustfmt::skip]
static ARMS: [Arm; 3] = [
    Arm::new(Decode, "q2g128 gemv", Q2g128, always, |l, c, x, m| l.q2_gemv_arm(c, x, m)).rank(20),
    Arm::new(Small, "q2g128 batch-m", Q2g128, always, |l, c, x, m| l.forward_km_q2(c, x, m)).rank(10),
    Arm::new(Prefill, "q2g128", Q2g128, always, |l, c, x, m| l.q2_prefill_arm(c, x, m)).rank(20),
];

/// Packed q2g128 weight (`q2g128` layout): `[n, kp/128]` blocks of [`Q2G128_BYTES`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q2g128Weight {
    pub(crate) blocks: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
}
projection_weight!(Q2g128Weight, "A validated q2g128 weight of `[n, k]` stored as `[n, kp]`." {
    blocks: DevicePtr,
    n: usize,
    k: usize,
    kp: usize
});

impl Q2g128Weight {
    /// The `q2g128` layout's rules: kp % 128, a buffer that holds `[n, kp/128]` blocks.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let w = self;
        if !w.kp.is_multiple_of(Q2G128_ELEMS)
            || w.kp < w.k
            || !fits(w.blocks.bytes, &[w.n, w.kp / Q2G128_ELEMS, Q2G128_BYTES])
        {
            return Err(refuse(
                what,
                format!(
                    "kp {} / {} bytes do not fit the q2g128 layout of [{}, {}] (kp % {Q2G128_ELEMS}, {Q2G128_BYTES} bytes per {Q2G128_ELEMS})",
                    w.kp, w.blocks.bytes, w.n, w.k
                ),
            ));
        }
        Ok(())
    }
}

shape_args!(Q2g128Weight);

impl DenseFfnLayer {
    /// Install the packed q2g128 overlay (`q2g128` layout). Its arms: decode through
    /// `q2g128_gemv`, 2-3 rows through `forward_km_q2`, prefill (SiLU only) through the Q2 MMQ
    /// GEMM (`METRALE_Q2G128_MMQ=1`) or dequantize-to-BF16 plus the BF16 GEMM.
    pub fn set_q2_weights(
        &mut self,
        gate: Q2g128Weight,
        up: Q2g128Weight,
        down: Q2g128Weight,
    ) -> GpuResult<()> {
        self.check_projections("set_q2_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(key::Q2G128, [gate, up, down]);
        Ok(())
    }
}
