//! One layer's overlays: the weights of every layout a pack holds for it, as views into device
//! memory, and their installation into a [`DenseFfnLayer`] through its `set_*` methods.

use super::{
    Bf16Weight, CustomOverlay, DenseFfnLayer, Fp8Weight, LoraWeight, Nvfp4TWeight, Nvfp4Weight,
    Q2g128Weight, Q4kMmqWeights, W8a8Weight,
};
use crate::converters::layouts::Layout;
use crate::gpu::{DevicePtr, GpuResult};

/// One layer's overlays, as views into the arena.
#[derive(Clone, Debug, Default)]
pub struct LayerOverlays {
    /// The layer index.
    pub index: usize,
    /// The NVFP4 base (`nvfp4` layout).
    pub nvfp4: Option<[Nvfp4Weight; 3]>,
    /// `nvfp4_t` transposed copies per projection, when the pack holds them.
    pub nvfp4_t: [Option<Nvfp4TWeight>; 3],
    /// `nvfp4_mmq` tiles per projection (gate, up, down), when the pack holds them.
    pub nvfp4_mmq: [Option<DevicePtr>; 3],
    /// LoRA adapter per projection (`lora` layout), installed on the NVFP4 base.
    pub lora: Option<[Option<LoraWeight>; 3]>,
    /// FP8 gate, up and down with the fused gate+up they view (`fp8`).
    pub fp8: Option<([Fp8Weight; 3], Option<Fp8Weight>)>,
    /// W8A8 (`w8a8`).
    pub w8a8: Option<[W8a8Weight; 3]>,
    /// BF16 (`bf16`).
    pub bf16: Option<[Bf16Weight; 3]>,
    /// Packed q2g128 (`q2g128` layout).
    pub q2: Option<[Q2g128Weight; 3]>,
    /// The Q4_K MMQ copies (`q4k_mmq` layout): `finalize_q4k_load` then has nothing to build.
    pub q4k: Option<Q4kMmqWeights>,
    /// The overlays of layouts registered at run time, by layout.
    pub custom: Vec<(Layout, CustomOverlay)>,
}

impl LayerOverlays {
    /// Install every overlay this layer has into `layer` through the `set_*` methods.
    pub fn install(&self, layer: &mut DenseFfnLayer) -> GpuResult<()> {
        if let Some(w) = self.nvfp4 {
            layer.set_nvfp4_weights(w)?;
            if self.nvfp4_t.iter().any(Option::is_some) {
                layer.set_nvfp4_t_weights(self.nvfp4_t)?;
            }
            // Tiles from the pack: finalize_nvfp4_mmq_load then has nothing to repack.
            layer.set_nvfp4_mmq_tiles(self.nvfp4_mmq)?;
            if let Some(l) = self.lora {
                layer.set_lora_weights(l)?;
            }
            if let Some(q) = self.q4k {
                layer.set_q4k_mmq_weights(q)?;
            }
        }
        if let Some(([g, u, d], fused)) = self.fp8 {
            layer.set_fp8_weights(g, u, d)?;
            if let Some(f) = fused {
                layer.set_fp8_gate_up_fused(f)?;
            }
        }
        if let Some([g, u, d]) = self.bf16 {
            layer.set_bf16_weights(g, u, d)?;
        }
        if let Some(w) = self.w8a8 {
            layer.set_w8a8_decode_weights(w, layer.hidden, layer.inter)?;
        }
        if let Some([g, u, d]) = self.q2 {
            layer.set_q2_weights(g, u, d)?;
        }
        for (l, o) in &self.custom {
            layer.set_overlay(*l, o.clone())?;
        }
        Ok(())
    }
}
