//! The runtime registry: each built-in layout's runtime (`src/layouts/TAG/runtime.rs`, mounted
//! here): its weight type (built through a validating constructor), its overlay key, its `set_*`
//! validators and load-time finalizers, how the loader's overlays install it, and its rows of
//! the arm table (the launches those arms make are its `arms.rs`). A layout's runtime is one
//! `#[path]` line and one name in [`registry!`], whose order is the install order.

use super::*;

/// One built-in layout's runtime, as the registry holds it.
pub(crate) struct Runtime {
    /// The layout.
    pub(crate) layout: Layout,
    /// The layout it is installed beside (its validators refuse it without that one first);
    /// skipped when the loader's overlays lack that one.
    pub(crate) builds_on: Option<Layout>,
    /// Install this layout's overlay from the loader's into a layer, if held.
    pub(crate) install: fn(&Overlays, &mut DenseFfnLayer) -> GpuResult<()>,
    /// Its rows of the arm table.
    pub(crate) arms: &'static [Arm],
}

/// The registry: each layout's module, its types and key re-exported, its runtime in
/// [`RUNTIMES`], in install order.
macro_rules! registry {
    ($($m:ident),* $(,)?) => {
        // A layout whose overlay has no type of its own (`nvfp4_mmq`: device pointers) re-exports
        // nothing.
        $(#[allow(unused_imports)] pub use $m::*;)*
        /// The key of each built-in layout's overlay (its weight type beside it).
        pub mod key {
            $(pub use super::$m::keys::*;)*
        }
        /// Every built-in layout's runtime, in install order.
        pub(crate) static RUNTIMES: &[&Runtime] = &[$(&$m::RUNTIME),*];
    };
}

// Each layout's runtime, in its folder (`src/layouts/TAG/runtime.rs`).
use crate::layouts::affine::runtime as affine;
use crate::layouts::bf16::runtime as bf16;
use crate::layouts::fp8::runtime as fp8;
use crate::layouts::lora::runtime as lora;
use crate::layouts::nvfp4::runtime as nvfp4;
use crate::layouts::nvfp4_mmq::runtime as nvfp4_mmq;
use crate::layouts::nvfp4_t::runtime as nvfp4_t;
use crate::layouts::q2g128::runtime as q2g128;
use crate::layouts::q4k_mmq::runtime as q4k_mmq;
use crate::layouts::w8a8::runtime as w8a8;

// The NVFP4 base first, then what builds on it (lora before fp8, bf16 and q2g128, which its
// validator refuses), then the layouts that stand alone.
registry!(
    nvfp4, nvfp4_t, nvfp4_mmq, lora, q4k_mmq, fp8, bf16, w8a8, q2g128, affine
);

/// The layout `layout` is installed beside (the `nvfp4` base for `nvfp4_t`, `nvfp4_mmq`,
/// `q4k_mmq` and `lora`), if any.
pub fn builds_on(layout: Layout) -> Option<Layout> {
    RUNTIMES
        .iter()
        .find(|r| r.layout == layout)
        .and_then(|r| r.builds_on)
}
