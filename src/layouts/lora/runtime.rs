//! `lora`: a PEFT adapter per projection on the `nvfp4` base (the NVFP4 decode arms add it).

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{projection_weight, refuse};
use crate::ffn::*;

use crate::gpu::{DevicePtr, GpuError, GpuResult};
use crate::model::Activation;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `lora`: the adapter per projection (any may be absent).
    pub const LORA: Key<[Option<LoraWeight>; 3]> = Key::new(Layout::Lora);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Lora,
    builds_on: Some(Layout::Nvfp4),
    install,
    arms: &[],
    named: &[],
};

/// Install this layer's `lora` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::LORA) {
        Some(&w) => l.set_lora_weights(w),
        None => Ok(()),
    }
}

pub use crate::converters::layouts::lora::LORA_MAX_RANK;

/// A LoRA adapter of one projection (`lora` layout): A BF16 `[rank, k]`, B BF16 `[n, rank]`;
/// the projection's output gains `scaling * B (A x)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraWeight {
    pub(crate) a: DevicePtr,
    pub(crate) b: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) rank: usize,
    pub(crate) scaling: f32,
}
projection_weight!(LoraWeight, "A validated adapter: rank 1..=[`LORA_MAX_RANK`], buffers that hold A and B in BF16." {
    a: DevicePtr,
    b: DevicePtr,
    n: usize,
    k: usize,
    rank: usize,
    scaling: f32
});

impl LoraWeight {
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let x = self;
        if x.rank == 0
            || x.rank > LORA_MAX_RANK
            || !fits(x.a.bytes, &[2, x.rank, x.k])
            || !fits(x.b.bytes, &[2, x.n, x.rank])
        {
            return Err(refuse(
                what,
                format!(
                    "rank {} (1..={LORA_MAX_RANK}) or buffers do not fit A [rank, {}] and B [{}, rank] in BF16",
                    x.rank, x.k, x.n
                ),
            ));
        }
        Ok(())
    }
}

impl DenseFfnLayer {
    /// Install a LoRA adapter (`lora` layout) per projection (gate, up, down; any may be absent)
    /// on the NVFP4 base. Refused while an FP8, BF16 or q2g128 overlay is installed, and when
    /// the layer cannot take the split-SiLU decode path (SiLU, `act_mul_silu` and `w4a16_gemv`
    /// resolved), with those words.
    pub fn set_lora_weights(&mut self, w: [Option<LoraWeight>; 3]) -> GpuResult<()> {
        if self.holds(Layout::Fp8) || self.holds(Layout::Bf16) || self.holds(Layout::Q2g128) {
            return Err(GpuError::Order(
                "set_lora_weights: refused while an FP8, BF16 or q2g128 overlay is installed (LoRA applies to the NVFP4 arms only)".into(),
            ));
        }
        if self.activation != Activation::Silu
            || !self.kernels.act_silu.ok()
            || !self.kernels.nvfp4_gemv.ok()
        {
            return Err(GpuError::NotServed(
                "set_lora_weights: refused: the layer cannot take the split-SiLU decode path (needs SiLU, act_mul_silu and w4a16_gemv)".into(),
            ));
        }
        if !self.holds(Layout::Nvfp4) {
            return Err(GpuError::Order(
                "set_lora_weights: install the NVFP4 base first".into(),
            ));
        }
        self.check_projections(
            "set_lora_weights",
            [w[0].as_ref(), w[1].as_ref(), w[2].as_ref()],
        )?;
        self.overlays.set(key::LORA, w);
        Ok(())
    }
}
