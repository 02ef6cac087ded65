//! Overlays keyed by layout: one home for every layout's weights on a layer, built-in and
//! registered alike ([`Overlays`], typed by a [`Key`] per built-in layout), and one layer's
//! overlays as the loader binds them from a pack ([`LayerOverlays`]), installed through the
//! layer's validating `set_*` methods.

use super::{
    Bf16Weight, DenseFfnLayer, Fp8Overlay, LoraWeight, Nvfp4TWeight, Nvfp4Weight, Q2g128Weight,
    Q4kMmqWeights, W8a8Weight,
};
use crate::converters::layouts::Layout;
use crate::gpu::{DevicePtr, GpuResult};
use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;

/// One layout's overlay on a layer: whatever its binding made (device views, shapes), typed by
/// its layout ([`Key`]) and shared between the loader's [`LayerOverlays`] and the layer.
pub type Overlay = Arc<dyn Any + Send + Sync>;

/// The overlay of a layout registered at run time (the same thing as [`Overlay`]).
pub type CustomOverlay = Overlay;

/// The key of one built-in layout's overlay, typed by what it holds.
pub struct Key<T> {
    /// The layout.
    pub layout: Layout,
    of: PhantomData<fn() -> T>,
}

impl<T> Clone for Key<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Key<T> {}

impl<T> Key<T> {
    /// The key of `layout`'s overlay, holding a `T`.
    pub const fn new(layout: Layout) -> Key<T> {
        Key {
            layout,
            of: PhantomData,
        }
    }
}

/// The key of each built-in layout's overlay (its weight type beside it in `weights`).
pub mod key {
    use super::*;
    /// `nvfp4`: the NVFP4 base of gate, up and down.
    pub const NVFP4: Key<[Nvfp4Weight; 3]> = Key::new(Layout::Nvfp4);
    /// `nvfp4_t`: the transposed copies, per projection (held while any is).
    pub const NVFP4_T: Key<[Option<Nvfp4TWeight>; 3]> = Key::new(Layout::Nvfp4T);
    /// `nvfp4_mmq`: the MMQ tiles, per projection (held while any is).
    pub const NVFP4_MMQ: Key<[Option<DevicePtr>; 3]> = Key::new(Layout::Nvfp4Mmq);
    /// `q4k_mmq`: the Q4_K MMQ copies.
    pub const Q4K_MMQ: Key<Q4kMmqWeights> = Key::new(Layout::Q4kMmq);
    /// `fp8`: gate, up, down and the fused gate+up they may view.
    pub const FP8: Key<Fp8Overlay> = Key::new(Layout::Fp8);
    /// `w8a8`: the declared-W8A8 decode weights.
    pub const W8A8: Key<[W8a8Weight; 3]> = Key::new(Layout::W8a8);
    /// `bf16`: gate, up, down.
    pub const BF16: Key<[Bf16Weight; 3]> = Key::new(Layout::Bf16);
    /// `q2g128`: gate, up, down.
    pub const Q2G128: Key<[Q2g128Weight; 3]> = Key::new(Layout::Q2g128);
    /// `lora`: the adapter per projection (any may be absent).
    pub const LORA: Key<[Option<LoraWeight>; 3]> = Key::new(Layout::Lora);
}

/// A layer's overlays, keyed by layout: at most one per layout, in the order installed.
#[derive(Clone, Default)]
pub struct Overlays(Vec<(Layout, Overlay)>);

impl std::fmt::Debug for Overlays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(l, _)| l.tag()))
            .finish()
    }
}

impl Overlays {
    /// The overlay under `key`, if held.
    pub fn get<T: 'static>(&self, key: Key<T>) -> Option<&T> {
        self.any(key.layout)?.downcast_ref()
    }

    /// The overlay of `layout` as held (any type).
    pub fn any(&self, layout: Layout) -> Option<&Overlay> {
        self.0.iter().find(|(l, _)| *l == layout).map(|(_, o)| o)
    }

    /// Hold `value` under `key`, replacing what was there.
    pub fn set<T: Any + Send + Sync>(&mut self, key: Key<T>, value: T) {
        self.set_any(key.layout, Arc::new(value));
    }

    /// Hold per-projection slots under `key` while any slot is filled; none filled removes it.
    pub fn set_slots<T: Any + Send + Sync>(
        &mut self,
        key: Key<[Option<T>; 3]>,
        slots: [Option<T>; 3],
    ) {
        if slots.iter().any(Option::is_some) {
            self.set(key, slots);
        } else {
            self.remove(key.layout);
        }
    }

    /// Hold `overlay` for `layout`, replacing what was there.
    pub fn set_any(&mut self, layout: Layout, overlay: Overlay) {
        match self.0.iter_mut().find(|(l, _)| *l == layout) {
            Some(slot) => slot.1 = overlay,
            None => self.0.push((layout, overlay)),
        }
    }

    /// Drop `layout`'s overlay.
    pub fn remove(&mut self, layout: Layout) {
        self.0.retain(|(l, _)| *l != layout);
    }

    /// Whether `layout`'s overlay is held.
    pub fn holds(&self, layout: Layout) -> bool {
        self.any(layout).is_some()
    }

    /// Every overlay held, in the order installed.
    pub fn iter(&self) -> impl Iterator<Item = (Layout, &Overlay)> {
        self.0.iter().map(|(l, o)| (*l, o))
    }
}

/// One layer's overlays as the loader binds them from a pack, as views into the arena.
#[derive(Clone, Debug, Default)]
pub struct LayerOverlays {
    /// The layer index.
    pub index: usize,
    /// Every layout's overlay for this layer, keyed by layout.
    pub overlays: Overlays,
}

impl LayerOverlays {
    /// This layer's overlays of `layouts` alone (the same views): what a layer holding only
    /// those layouts gets.
    pub fn only(&self, layouts: &[Layout]) -> LayerOverlays {
        let mut o = LayerOverlays {
            index: self.index,
            ..Default::default()
        };
        for &l in layouts {
            if let Some(x) = self.overlays.any(l) {
                o.overlays.set_any(l, x.clone());
            }
        }
        o
    }

    /// Install every overlay this layer has into `layer` through the validating `set_*`
    /// methods: the NVFP4 base, then what builds on it (`nvfp4_t`, `nvfp4_mmq` tiles, `lora`,
    /// `q4k_mmq`; skipped without the base), then `fp8`, `bf16`, `w8a8`, `q2g128`, then the
    /// layouts registered at run time.
    pub fn install(&self, layer: &mut DenseFfnLayer) -> GpuResult<()> {
        let o = &self.overlays;
        if let Some(&w) = o.get(key::NVFP4) {
            layer.set_nvfp4_weights(w)?;
            if let Some(&t) = o.get(key::NVFP4_T) {
                layer.set_nvfp4_t_weights(t)?;
            }
            // Tiles from the pack: finalize_nvfp4_mmq_load then has nothing to repack.
            layer.set_nvfp4_mmq_tiles(o.get(key::NVFP4_MMQ).copied().unwrap_or_default())?;
            if let Some(&l) = o.get(key::LORA) {
                layer.set_lora_weights(l)?;
            }
            if let Some(&q) = o.get(key::Q4K_MMQ) {
                layer.set_q4k_mmq_weights(q)?;
            }
        }
        if let Some(f) = o.get(key::FP8) {
            layer.set_fp8_weights(f.gate, f.up, f.down)?;
            if let Some(fused) = f.fused {
                layer.set_fp8_gate_up_fused(fused)?;
            }
        }
        if let Some(&[g, u, d]) = o.get(key::BF16) {
            layer.set_bf16_weights(g, u, d)?;
        }
        if let Some(&w) = o.get(key::W8A8) {
            layer.set_w8a8_decode_weights(w, layer.hidden, layer.inter)?;
        }
        if let Some(&[g, u, d]) = o.get(key::Q2G128) {
            layer.set_q2_weights(g, u, d)?;
        }
        for (l, ov) in o.iter().filter(|(l, _)| matches!(l, Layout::Custom(_))) {
            layer.set_overlay(l, ov.clone())?;
        }
        Ok(())
    }
}
