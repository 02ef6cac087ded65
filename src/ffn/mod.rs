//! `DenseFfnLayer`: the engine's dense FFN layer with its weight overlays and forward arms, on
//! any [`GpuBackend`]. By concern: `context` (dimensions, the scratch arena, levers), `layouts`
//! (each built-in layout's runtime: weight type, key, validators, install, arm rows),
//! `weights` (the rules every weight type shares), `overlays` (the layer's overlays keyed by layout, one home for
//! built-in and registered layouts), `kernels` (the kernel table), `routing` (which arm serves `m` rows), `forward` (the
//! public forward methods), and `arms/` (the arms several layouts share; each layout's own arms
//! are in its folder, `src/layouts/TAG/arms.rs`).
//!
//! Activations are f32 row-major `[m, hidden]`; outputs land in the arena's `output`
//! (`[m, hidden]` f32). Every kernel launched is appended to `ForwardContext::trace`, so tests
//! can assert which arm served a call.

use crate::gpu::{DevicePtr, GpuBackend, GpuError, GpuResult};
use crate::model::Activation;
use std::sync::Arc;

mod arms;
mod context;
mod forward;
mod kernels;
pub(crate) mod layouts;
mod overlays;
pub(crate) mod routing;
pub(crate) mod weights;

use crate::converters::layouts::Layout;
pub use context::*;
pub use kernels::*;
pub use layouts::*;
pub use overlays::{CustomOverlay, Key, LayerOverlays, Overlay, Overlays};
pub use routing::{Arm, Method};
use weights::ProjWeight;
pub(crate) use weights::fits;

pub use crate::gpu::levers::FP8_W8A8_MIN_ROWS;

pub use crate::converters::layouts::Proj;

/// The engine's dense FFN layer.
pub struct DenseFfnLayer {
    /// Hidden size (the FFN input and output width).
    pub hidden: usize,
    /// Intermediate size.
    pub inter: usize,
    /// SiLU or GELU gating.
    pub activation: Activation,
    /// Every installed layout's overlay, keyed by layout (built-in ones through their `set_*`
    /// validators, registered ones through [`DenseFfnLayer::set_overlay`]).
    pub(crate) overlays: Overlays,
    pub(crate) kernels: FfnKernels,
    /// The runtime, and the buffers this layer allocated itself (what its `finalize_*` calls
    /// build: NVFP4-MMQ tiles, Q4_K copies), freed when it is dropped. Installed overlays are
    /// views the caller owns.
    pub(crate) backend: Arc<dyn GpuBackend>,
    pub(crate) allocated: Vec<DevicePtr>,
}

impl Drop for DenseFfnLayer {
    fn drop(&mut self) {
        for p in self.allocated.drain(..) {
            self.backend.free(p);
        }
    }
}

/// Output columns (weight rows) per block of the NVFP4 GEMVs (`w4a16_gemv*`, the batch-m
/// tiers): one m16n8k16 MMA's 16 rows, k split over the block's 8 warps (src/layouts/nvfp4/kernels.cu
/// sees it as `MP_NVFP4_GEMV_ROWS`).
pub const NVFP4_GEMV_COLS: usize = crate::gpu::sizes::NVFP4_GEMV_ROWS;

/// Rows the declared W8A8 arm serves in prefill before the next arm (HARDWARE.toml default).
pub const W8A8_MAX_ROWS: usize = 64;

impl DenseFfnLayer {
    /// A SiLU layer sized by the context.
    pub fn new(ctx: &ForwardContext) -> Self {
        Self::new_with_activation(ctx, Activation::Silu)
    }

    /// A layer with the given activation.
    pub fn new_with_activation(ctx: &ForwardContext, activation: Activation) -> Self {
        DenseFfnLayer {
            hidden: ctx.config.hidden,
            inter: ctx.config.inter,
            activation,
            overlays: Overlays::default(),
            kernels: FfnKernels::resolve(ctx.backend.as_ref()),
            backend: ctx.backend.clone(),
            allocated: Vec::new(),
        }
    }

    /// Install the overlay of a layout defined outside the crate (`layout::register`); its
    /// arms ([`register`]) read it back with [`DenseFfnLayer::overlay`]. Built-in layouts are
    /// installed through their own `set_*` methods, which validate their weights; a second
    /// overlay for the same layout replaces the first.
    pub fn set_overlay(&mut self, layout: Layout, overlay: CustomOverlay) -> GpuResult<()> {
        if !matches!(layout, Layout::Custom(_)) {
            return Err(GpuError::Invalid(format!(
                "set_overlay: {} is a built-in layout: install it through its set_* method",
                layout.tag()
            )));
        }
        self.overlays.set_any(layout, overlay);
        Ok(())
    }

    /// The overlay of a layout (registered at run time or built in), if installed and of type
    /// `T`.
    pub fn overlay<T: 'static>(&self, layout: Layout) -> Option<&T> {
        self.overlays.any(layout)?.downcast_ref()
    }

    /// A built-in layout's overlay, if installed ([`key`]).
    pub fn get<T: 'static>(&self, key: Key<T>) -> Option<&T> {
        self.overlays.get(key)
    }

    /// A built-in layout's overlay, or `NotServed` naming its layout (the arm table checks
    /// [`DenseFfnLayer::holds`] first, so an arm never meets a missing one).
    pub(crate) fn need<T: 'static>(&self, key: Key<T>) -> GpuResult<&T> {
        self.get(key).ok_or_else(|| {
            GpuError::NotServed(format!("no {} weights installed", key.layout.tag()))
        })
    }

    /// Every overlay installed, keyed by layout (read-only: install through the `set_*`
    /// methods).
    pub fn overlays(&self) -> &Overlays {
        &self.overlays
    }

    /// The resolved kernels.
    pub fn kernels(&self) -> &FfnKernels {
        &self.kernels
    }

    /// Each given projection's weight against this layer's shape and against its layout's
    /// rules (`what` names the caller in errors).
    pub(crate) fn check_projections<W: ProjWeight>(
        &self,
        what: &str,
        w: [Option<&W>; 3],
    ) -> GpuResult<()> {
        for (p, x) in [Proj::Gate, Proj::Up, Proj::Down].into_iter().zip(w) {
            let Some(x) = x else { continue };
            let (n, k) = x.shape();
            self.check_shape(what, p, n, k)?;
            x.validate(&format!("{what} {p:?}"))?;
        }
        Ok(())
    }

    /// A load-time finalizer's `h`/`inter` against this layer's (`what` names it in the error).
    pub(crate) fn check_dims(&self, what: &str, h: usize, inter: usize) -> GpuResult<()> {
        if (h, inter) != (self.hidden, self.inter) {
            return Err(GpuError::Shape(format!(
                "{what}: {h}/{inter}, layer is {}/{}",
                self.hidden, self.inter
            )));
        }
        Ok(())
    }

    fn check_shape(&self, what: &str, p: Proj, n: usize, k: usize) -> GpuResult<()> {
        let want = match p {
            Proj::Gate | Proj::Up => (self.inter, self.hidden),
            Proj::Down => (self.hidden, self.inter),
            Proj::GateUp => (2 * self.inter, self.hidden),
        };
        if (n, k) != want {
            return Err(GpuError::Shape(format!(
                "{what} {p:?}: shape [{n}, {k}], this layer needs [{}, {}] ([inter, hidden] for gate/up, [hidden, inter] for down)",
                want.0, want.1
            )));
        }
        Ok(())
    }
}
