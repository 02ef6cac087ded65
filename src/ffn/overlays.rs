//! Overlays keyed by layout: one home for every layout's weights on a layer, built-in and
//! registered alike ([`Overlays`], typed by a [`Key`] per built-in layout, `key`), and one layer's
//! overlays as the loader binds them from a pack ([`LayerOverlays`]), installed through the
//! layer's validating `set_*` methods.

use super::DenseFfnLayer;
use super::layouts::runtimes;
use crate::converters::layouts::Layout;
use crate::gpu::GpuResult;
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

    /// Install every overlay this layer has into `layer` through each registered runtime's
    /// `install` (the built-in layouts' validating `set_*` methods), in the registry's order:
    /// the NVFP4 base, then what builds on it (skipped without the base), then the layouts
    /// that stand alone, then the layouts registered later.
    pub fn install(&self, layer: &mut DenseFfnLayer) -> GpuResult<()> {
        let o = &self.overlays;
        for r in runtimes().iter() {
            if r.builds_on.is_none_or(|b| o.holds(b)) {
                (r.install)(o, layer)?;
            }
        }
        Ok(())
    }
}
