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

/// Generates the runtime registry from the list of built-in layouts
/// (`layouts::builtin_layouts!`): each layout's runtime (`src/layouts/TAG/runtime.rs`), its
/// types and key re-exported, its runtime in [`RUNTIMES`], in install order.
macro_rules! runtime_registry {
    (layouts: [$($t:ident $v:ident),*], install: [$($m:ident),*]) => {
        // A layout whose overlay has no type of its own (`nvfp4_mmq`: device pointers) re-exports
        // nothing.
        $(#[allow(unused_imports)] pub use crate::layouts::$m::runtime::*;)*
        /// The key of each built-in layout's overlay (its weight type beside it).
        pub mod key {
            $(pub use crate::layouts::$m::runtime::keys::*;)*
        }
        /// Every built-in layout's runtime, in install order.
        pub(crate) static RUNTIMES: &[&Runtime] = &[$(&crate::layouts::$m::runtime::RUNTIME),*];
    };
}
crate::layouts::builtin_layouts!(runtime_registry);

/// The layout `layout` is installed beside (the `nvfp4` base for `nvfp4_t`, `nvfp4_mmq`,
/// `q4k_mmq` and `lora`), if any.
pub fn builds_on(layout: Layout) -> Option<Layout> {
    RUNTIMES
        .iter()
        .find(|r| r.layout == layout)
        .and_then(|r| r.builds_on)
}
