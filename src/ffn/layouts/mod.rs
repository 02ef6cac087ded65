//! The runtime registry: each layout's [`Runtime`] (a built-in one's is its folder's
//! `runtime.rs`, mounted here with its weight type, overlay key, `set_*` validators and
//! load-time finalizers): how the loader's overlays install it, its rows of the arm table (the
//! launches those arms make are its `arms.rs`) and its named arms. Built-in layouts and layouts
//! defined outside the crate enter it alike, through [`register`]; the built-in ones first, at
//! first use, in the install order of `layouts::builtin_layouts!`.

use super::*;
use crate::gpu::ModelLevers;
use std::sync::{Arc, LazyLock, RwLock};

/// One layout's runtime: what a layer does with its overlay. A built-in layout declares it in
/// its folder (`src/layouts/TAG/runtime.rs`), a layout defined outside the crate beside its spec
/// (`tests/toy_layout.rs`); both enter the registry through [`register`].
pub struct Runtime {
    /// The layout.
    pub layout: Layout,
    /// The layout it is installed beside (its validators refuse it without that one first);
    /// skipped when the loader's overlays lack that one. Registered before it.
    pub builds_on: Option<Layout>,
    /// Install this layout's overlay from the loader's into a layer, if held (a built-in layout
    /// through its validating `set_*` method, one defined outside the crate through
    /// [`DenseFfnLayer::set_overlay`]).
    pub install: fn(&Overlays, &mut DenseFfnLayer) -> GpuResult<()>,
    /// Its rows of the arm table.
    pub arms: &'static [Arm],
    /// The arms a pack-loaded layer holding it offers by name.
    pub named: &'static [NamedArm],
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

/// Generates the built-in runtimes from the list of built-in layouts
/// (`layouts::builtin_layouts!`): each layout's runtime (`src/layouts/TAG/runtime.rs`), its
/// types and key re-exported, and [`BUILT_IN`], in install order (the order [`register`] takes
/// them in).
macro_rules! runtime_registry {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($m:ident),*]) => {
        // A layout whose overlay has no type of its own (device pointers only) re-exports
        // nothing.
        $(#[allow(unused_imports)] pub use crate::layouts::$m::runtime::*;)*
        /// The key of each built-in layout's overlay (its weight type beside it).
        pub mod key {
            $(pub use crate::layouts::$m::runtime::keys::*;)*
        }
        /// Every built-in layout's runtime, in install order.
        static BUILT_IN: &[&Runtime] = &[$(&crate::layouts::$m::runtime::RUNTIME),*];
    };
}
crate::layouts::builtin_layouts!(runtime_registry);

/// The registered runtimes in install order, and the arm tables read from them.
struct Registry {
    /// Every runtime registered, in the order registered (the install order).
    runtimes: Arc<[&'static Runtime]>,
    /// Their arms by method, then rank (see [`arms`]).
    arms: Arc<[&'static Arm]>,
    /// Their named arms by rank.
    named: Arc<[&'static NamedArm]>,
}

/// The runtime registry: the built-in layouts' runtimes, registered through [`admit`] at first
/// use, then each registered with [`register`].
static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(|| {
    let mut r = Registry {
        runtimes: Arc::new([]),
        arms: Arc::new([]),
        named: Arc::new([]),
    };
    for rt in BUILT_IN {
        if let Err(e) = admit(&mut r, rt) {
            unreachable!("a built-in runtime is refused: {e}");
        }
    }
    RwLock::new(r)
});

/// Register a layout's runtime: from then on layers install its overlay ([`Runtime::install`],
/// in the order registered), its arms serve the forward methods ([`arms`]) and its named arms
/// are offered ([`named_arms`]). The built-in layouts' runtimes come this way first; a layout
/// defined outside the crate registers its spec (`layout::register`), then its runtime.
/// Registering the same runtime again does nothing. Refused: a layout that another runtime
/// serves, a `builds_on` layout not registered yet, an arm needing a layout that is neither
/// this one nor registered.
pub fn register(runtime: &'static Runtime) -> crate::Result<()> {
    admit(
        &mut REGISTRY.write().unwrap_or_else(|e| e.into_inner()),
        runtime,
    )
}

/// [`register`] on the registry `reg`: every runtime, built in or not, enters this way.
fn admit(reg: &mut Registry, rt: &'static Runtime) -> crate::Result<()> {
    if reg.runtimes.iter().any(|r| std::ptr::eq(*r, rt)) {
        return Ok(());
    }
    let refuse = |reason: String| crate::Error::Register {
        what: format!("the runtime of layout {:?}", rt.layout.tag()),
        reason,
    };
    let known = |l: Layout| l == rt.layout || reg.runtimes.iter().any(|r| r.layout == l);
    if reg
        .runtimes
        .iter()
        .any(|r| r.layout.tag() == rt.layout.tag())
    {
        return Err(refuse("another runtime serves that layout".into()));
    }
    if let Some(b) = rt.builds_on.filter(|&b| b == rt.layout || !known(b)) {
        return Err(refuse(format!(
            "it builds on {}, whose runtime is not registered before it",
            b.tag()
        )));
    }
    let needs = rt.arms.iter().map(|a| (a.name, a.layout));
    let needs = needs.chain(
        rt.named
            .iter()
            .flat_map(|a| a.layouts.iter().map(|&l| (a.name, l))),
    );
    if let Some((name, l)) = needs.clone().find(|&(_, l)| !known(l)) {
        return Err(refuse(format!(
            "its arm {name:?} needs layout {}, whose runtime is not registered",
            l.tag()
        )));
    }
    let runtimes: Vec<_> = reg.runtimes.iter().copied().chain([rt]).collect();
    let mut arms: Vec<&'static Arm> = runtimes.iter().flat_map(|r| r.arms.iter()).collect();
    arms.sort_by_key(|a| (a.method, a.rank));
    let mut named: Vec<&'static NamedArm> = runtimes.iter().flat_map(|r| r.named.iter()).collect();
    named.sort_by_key(|a| a.rank);
    *reg = Registry {
        runtimes: runtimes.into(),
        arms: arms.into(),
        named: named.into(),
    };
    Ok(())
}

fn registry() -> std::sync::RwLockReadGuard<'static, Registry> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner())
}

/// Every registered runtime, in install order.
pub(crate) fn runtimes() -> Arc<[&'static Runtime]> {
    registry().runtimes.clone()
}

/// Every registered arm, in the order a method tries them: sorted by method, then rank (a
/// stable sort: equal ranks keep the order registered, the built-in layouts' install order
/// first). The first arm whose layout is installed and whose condition holds serves the call.
pub fn arms() -> Arc<[&'static Arm]> {
    registry().arms.clone()
}

/// Every registered layout's named arms, by rank.
pub fn named_arms() -> Arc<[&'static NamedArm]> {
    registry().named.clone()
}

/// The layout `layout` is installed beside (the base its overlay builds on, as its runtime
/// declares it), if any.
pub fn builds_on(layout: Layout) -> Option<Layout> {
    registry()
        .runtimes
        .iter()
        .find(|r| r.layout == layout)
        .and_then(|r| r.builds_on)
}
