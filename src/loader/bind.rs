//! Binding: each layer's overlays described from the manifest as views into the arena (every
//! layout of the registry binds its own), and installed through the layer's `set_*` methods.

use crate::converters::layouts::{Layout, Proj};
use crate::ffn::{
    Bf16Weight, DenseFfnLayer, Fp8Weight, LoraWeight, Nvfp4TWeight, Nvfp4Weight, Q2g128Weight,
    Q4kMmqWeights, W8a8Weight,
};
use crate::gpu::{DevicePtr, GpuError, GpuResult};
use crate::pack::{FfnEntry, Pack};
use std::collections::HashMap;

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
        Ok(())
    }
}

/// Describe every layer's overlays from the manifest, as views into `arena`.
/// `pieces` says where each loaded range of the pack lies in the arena (blobs of ranks not
/// loaded are skipped); `inter` is the intermediate size of the loaded rank's layer.
pub fn overlays(
    pack: &Pack,
    arena: DevicePtr,
    pieces: &[(u64, u64, u64)],
    inter: usize,
) -> GpuResult<Vec<LayerOverlays>> {
    let m = &pack.manifest;
    let mut by: HashMap<(usize, Layout, Proj, String), (DevicePtr, &FfnEntry)> = HashMap::new();
    for (i, e) in m.tensors.iter().enumerate() {
        let Some(fe) = &e.ffn else { continue };
        let t = &pack.file.tensors[i];
        let Some(off) = super::arena_offset(pieces, t.offset, t.bytes) else {
            continue;
        };
        let view = arena.view(off, t.bytes);
        let layout = Layout::from_tag(&fe.layout).ok_or_else(|| {
            GpuError::Invalid(format!("{}: unknown layout {}", e.name, fe.layout))
        })?;
        let proj = Proj::from_name(&fe.proj).ok_or_else(|| {
            GpuError::Invalid(format!("{}: unknown projection {}", e.name, fe.proj))
        })?;
        by.insert((fe.layer, layout, proj, fe.part.clone()), (view, fe));
    }
    let mut layers: Vec<usize> = by.keys().map(|k| k.0).collect();
    layers.sort();
    layers.dedup();
    let mut out = Vec::new();
    for l in layers {
        let mut o = LayerOverlays {
            index: l,
            ..Default::default()
        };
        // Each layout of the registry binds its own overlays from this layer's views.
        for spec in crate::layout::REGISTRY {
            let lay = spec.layout();
            let get = |p: Proj, part: &str| by.get(&(l, lay, p, part.to_string())).copied();
            spec.bind(&crate::layout::LayerViews { inter, get: &get }, &mut o);
        }
        out.push(o);
    }
    Ok(out)
}
