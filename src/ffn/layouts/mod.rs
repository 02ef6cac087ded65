//! The runtime registry: each built-in layout's runtime (`src/layouts/TAG/runtime.rs`, mounted
//! here): its weight type (built through a validating constructor), its overlay key, its `set_*`
//! validators and load-time finalizers, how the loader's overlays install it, and its rows of
//! the arm table (the launches those arms make are its `arms.rs`). A layout's runtime is one
//! `#[path]` line and one name in [`registry!`], whose order is the install order.

use super::*;
use crate::gpu::ModelLevers;

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
    /// The arms a pack-loaded layer holding it offers by name.
    pub(crate) named: &'static [NamedArm],
}

/// An arm a pack-loaded layer offers by name (`loader::arms::arms_of`: `ffn-apply --arm`, the
/// quality and tensor-parallel checks, Python's `forward(..., arm=)`): the layer's overlays of
/// `layouts` alone (offered when it holds them all), its levers, and the fixed path or the
/// routed one.
pub struct NamedArm {
    /// Its name.
    pub name: &'static str,
    /// The overlays it installs (this layout's, after the base it builds on).
    pub layouts: &'static [Layout],
    /// Its levers (read when the arm is listed, as `ModelLevers::default` reads the
    /// environment).
    pub levers: fn() -> ModelLevers,
    /// `forward_fixed` instead of the routed forward.
    pub fixed: bool,
    /// The most rows it takes per prefill call.
    pub max_rows: usize,
    /// Its place in the list (lower first).
    pub rank: u16,
}

impl NamedArm {
    /// The routed arm `name` on the overlays of `layouts`, with the default levers, any number
    /// of rows per call, at `rank`.
    pub const fn new(name: &'static str, layouts: &'static [Layout], rank: u16) -> Self {
        NamedArm {
            name,
            layouts,
            levers: ModelLevers::default,
            fixed: false,
            max_rows: usize::MAX,
            rank,
        }
    }
    /// This arm on the fixed path.
    pub const fn fixed(self) -> Self {
        NamedArm {
            fixed: true,
            ..self
        }
    }
    /// This arm with the levers `levers` makes.
    pub const fn levers(self, levers: fn() -> ModelLevers) -> Self {
        NamedArm { levers, ..self }
    }
    /// This arm taking at most `max_rows` rows per prefill call.
    pub const fn max_rows(self, max_rows: usize) -> Self {
        NamedArm { max_rows, ..self }
    }
}

/// Every built-in layout's named arms, by rank (sorted once, as [`super::arms`] is).
pub fn named_arms() -> &'static [&'static NamedArm] {
    static SORTED: std::sync::LazyLock<Vec<&'static NamedArm>> = std::sync::LazyLock::new(|| {
        let mut v: Vec<&'static NamedArm> = RUNTIMES.iter().flat_map(|r| r.named.iter()).collect();
        v.sort_by_key(|a| a.rank);
        v
    });
    &SORTED
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
