//! Each built-in layout's runtime, one file per layout: its weight type (built through a
//! validating constructor), its overlay key, its `set_*` validators and load-time finalizers,
//! how the loader's overlays install it, and its rows of the arm table (the kernels those arms
//! launch are in `arms/`, by family). Its storage is in `layout/` and its codec in
//! `converters/layouts/`. A layout's runtime is its file here and one name in [`registry!`],
//! whose order is the install order.

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
        $(mod $m; #[allow(unused_imports)] pub use $m::*;)*
        /// The key of each built-in layout's overlay (its weight type beside it).
        pub mod key {
            $(pub use super::$m::keys::*;)*
        }
        /// Every built-in layout's runtime, in install order.
        pub(crate) static RUNTIMES: &[&Runtime] = &[$(&$m::RUNTIME),*];
    };
}

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
