//! The layout registry: each pack layout implements [`LayoutSpec`] once (a built-in one in its
//! folder, `src/layouts/TAG/spec.rs`, mounted here), and the pack writer (`Plan`), the reader
//! and `dump` (`Pack::decode_ffn`), the manifest checks (`pack::check`) and the loader's overlay
//! binding (`loader::overlays`) iterate the registry instead of matching on layouts. A built-in
//! layout's folder also holds its codec (mounted in `converters::layouts`), its runtime (in
//! `ffn::layouts`: weight type, key, validators, install and arm rows), its arms, kernels and
//! kernel checks (docs/contributing.md); `layouts::builtin_layouts!` names it once, and a test
//! below fails when the spec and runtime registries disagree.
//! Every layout enters this registry through [`register`] and the runtime registry through
//! `ffn::register`: the built-in ones at first use, a layout defined outside the crate (an
//! engine's own, or a test's) when it calls them. It then converts, loads and forwards like a
//! built-in one (`tests/toy_layout.rs`).

pub use crate::converters::layouts::{CustomTag, Encoded, Layout, Proj, q4k_mmq::DownFormat};

use crate::error::{Error, Result};
use crate::ffn::LayerOverlays;
use crate::gpu::DevicePtr;
pub use crate::gpu::reference::ElementRule;
use crate::manifest::{ConvertOptions, FfnEntry};
use crate::model::lora::Lora;
use crate::model::{Activation, FfnLayer, FfnWeight, Model};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, LazyLock, RwLock};

/// One layout: its parts and sizes, its encoder, its decoder and its overlay binding.
pub trait LayoutSpec: Sync {
    /// The registry key (and through it the tag written in manifests and tensor names).
    fn layout(&self) -> Layout;

    /// The projections this layout stores for one layer, in file order.
    fn projections(&self) -> &'static [Proj] {
        &[Proj::Gate, Proj::Up, Proj::Down]
    }

    /// The part suffixes a projection is written as, in order ("" for a single blob).
    fn parts(&self, proj: Proj, down: DownFormat) -> &'static [&'static str];

    /// The padded shape stored for a projection of logical shape `[n, k]`, with checked
    /// arithmetic (the numbers may come from a file); `None` when they overflow or do not fit.
    fn padded_shape(&self, proj: Proj, shape: [u64; 2]) -> Option<[u64; 2]>;

    /// The byte size of `part` for padded shape `[np, kp]` (and, for LoRA, `rank`); `None` for
    /// an unknown part or an overflow.
    fn part_bytes(&self, part: &str, padded: [u64; 2], rank: u64) -> Option<u64>;

    /// The byte size of `part` for padded shape `[np, kp]` given the blob's recorded scalars
    /// (a layout whose parts' sizes follow its recorded `bits` and `group`); by default
    /// [`LayoutSpec::part_bytes`]
    /// with the LoRA `rank` (0 without one).
    fn part_bytes_with(
        &self,
        part: &str,
        padded: [u64; 2],
        scalars: &BTreeMap<String, f32>,
    ) -> Option<u64> {
        let rank = scalars.get("rank").map_or(0, |&r| r as u64);
        self.part_bytes(part, padded, rank)
    }

    /// Whether a blob's scalars (named by [`LayoutSpec::scalar_names`], finite, checked before)
    /// are ones this layout stores for padded shape `padded`; the error says what is wrong.
    fn check_scalars(
        &self,
        _scalars: &BTreeMap<String, f32>,
        _padded: [u64; 2],
    ) -> std::result::Result<(), String> {
        Ok(())
    }

    /// The scalars recorded per blob (manifest `scalars`).
    fn scalar_names(&self) -> &'static [&'static str] {
        &[]
    }

    /// Scalars a blob may lack (added after packs without them were written; the layout reads
    /// their absence as the value those packs meant).
    fn optional_scalars(&self) -> &'static [&'static str] {
        &[]
    }

    /// Encode projection `proj` of the layer `cx` holds; `None` when the layout stores nothing
    /// for it (LoRA on a projection the adapter does not target).
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>>;

    /// Decode one stored projection back to f32 in its logical shape.
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>>;

    /// The rules every element of a part keeps (formats.md, "Each layout's own rules"), from
    /// the blob's scalars and padded shape alone: `(part, rule, elements)`, `elements` `None`
    /// for the whole part, `Some(n)` for its first `n` (a part that ends with other data). The
    /// loader checks them on the bytes it copied, one `blob_rules` launch each (the host
    /// backend's twin on the CPU); a part the blob lacks is skipped. Default: the
    /// [`LayoutSpec::scale_rule`] over the whole `scales` part, if any.
    fn element_rules(
        &self,
        _scalars: &BTreeMap<String, f32>,
        _padded: [usize; 2],
    ) -> Vec<(&'static str, ElementRule, Option<usize>)> {
        self.scale_rule()
            .map(|r| vec![("scales", r, None)])
            .unwrap_or_default()
    }

    /// The rule every element of the `scales` part keeps, for a layout with one such rule
    /// (finite f32 scales, E4M3 scales that are not NaN). Default: none.
    fn scale_rule(&self) -> Option<ElementRule> {
        None
    }

    /// The rules over a blob that are not element by element (a permutation that must be
    /// one), checked on the CPU from the file. Default: none.
    fn check_structure(&self, _b: &BlobRead) -> Result<()> {
        Ok(())
    }

    /// Whether a stored blob keeps this layout's own rules beyond its sizes and scalars
    /// (checked when the pack opened): [`LayoutSpec::check_structure`] and every
    /// [`LayoutSpec::element_rules`] on the CPU, the first broken one named. What `verify`
    /// runs, and the loader where no `blob_rules` kernel serves (and to name what its launch
    /// found). A pack whose checksums were recomputed over bad bytes is refused, never
    /// forwarded.
    fn check_blob(&self, b: &BlobRead) -> Result<()> {
        self.check_structure(b)?;
        for (part, rule, count) in self.element_rules(b.scalars, b.padded) {
            if !b.has(part) {
                continue;
            }
            let bytes = b.part(part)?;
            let n = count.unwrap_or(bytes.len() / rule.elem_bytes());
            if n.checked_mul(rule.elem_bytes())
                .is_none_or(|e| e > bytes.len())
            {
                return Err(b.bad(part, format!("{n} elements of {rule:?} pass the part")));
            }
            let i = crate::gpu::reference::blob_rules(bytes, n, rule);
            if i != u32::MAX {
                return Err(b.bad(part, element_reason(rule, i)));
            }
        }
        Ok(())
    }

    /// Bind one layer's device views into the overlays the loader installs. The loader asks
    /// every registered layout: one whose views the layer lacks binds nothing.
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays);

    /// Whether this layout stores source weight `w` (a `down` projection or not) as the source
    /// has it: its codes and scales carried, only re-laid, or widened to a float format. Any
    /// other weight it quantizes anew (`pack::choice` warns and refuses on that).
    fn keeps(&self, _model: &Model, _w: &FfnWeight, _down: bool, _opts: &ConvertOptions) -> bool {
        false
    }

    /// What it keeps as the source stores it, in words (`metrale-pack layouts`).
    fn keeps_what(&self) -> &'static str {
        "-"
    }

    /// Why a GELU layer refuses this layout, if it does (`convert` refuses such a request).
    fn gelu_refusal(&self) -> Option<&'static str> {
        None
    }

    /// Where this layout stands, alone, among the sets `convert` tries when none is named
    /// (lower first, after the target's float default): the first set that keeps every
    /// quantized FFN weight of the source and serves its activation is taken
    /// (`pack::choice::default_for`). `None` (the default): never a default set of its own.
    fn default_rank(&self) -> Option<u8> {
        None
    }

    /// Whether this layout is in the target's default set for layers of activation `act`: what
    /// `convert` writes for float sources (and, with `--allow-requantize`, for a quantized
    /// source no layout keeps), and what an engine holds after start-up ([`default_layouts`]).
    fn float_default(&self, _act: Activation) -> bool {
        false
    }
}

/// The target's default set for layers of activation `act`: every registered layout whose
/// [`LayoutSpec::float_default`] says so, in registry order.
pub fn default_layouts(act: Activation) -> Vec<Layout> {
    specs()
        .iter()
        .filter(|s| s.float_default(act))
        .map(|s| s.layout())
        .collect()
}

/// Why element `i` breaks `rule`, in words.
pub fn element_reason(rule: ElementRule, i: u32) -> String {
    match rule {
        ElementRule::Halves => format!("half {i} (a scale or offset) is not finite"),
        ElementRule::ZeroPairs { bits } | ElementRule::ZeroPairsF32 { bits } => format!(
            "pair {i}: its scale is not finite or its zero point is not an integer code of {bits} bits"
        ),
        ElementRule::F32 => format!("scale {i} is not finite (NaN or infinite)"),
        ElementRule::E4m3 => format!("E4M3 scale {i} is NaN"),
    }
}

/// Generates [`BUILT_IN`] from the list of built-in layouts (`layouts::builtin_layouts!`).
macro_rules! spec_registry {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        /// Every built-in layout's spec (`src/layouts/TAG/spec.rs`), in `Layout` order (the
        /// order [`register`] takes them in).
        static BUILT_IN: [&dyn LayoutSpec; Layout::ALL.len()] =
            [$(&crate::layouts::$t::spec::$v),*];
    };
}
crate::layouts::builtin_layouts!(spec_registry);

/// The spec registry: the built-in layouts' specs, registered through [`admit`] at first use
/// in `Layout` order, then each registered with [`register`].
static REGISTRY: LazyLock<RwLock<Arc<[&'static dyn LayoutSpec]>>> = LazyLock::new(|| {
    let mut reg: Arc<[&'static dyn LayoutSpec]> = Arc::new([]);
    for spec in BUILT_IN {
        if let Err(e) = admit(&mut reg, spec) {
            unreachable!("a built-in spec is refused: {e}");
        }
    }
    RwLock::new(reg)
});

/// Every registered layout's spec: the built-in ones in `Layout` order, then those registered
/// with [`register`], in that order.
pub fn specs() -> Arc<[&'static dyn LayoutSpec]> {
    REGISTRY.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Register a layout's spec: `spec` answers for it end to end (parts, sizes, encode, decode,
/// overlay binding) under the tag of its `layout()`. The built-in layouts' specs come this way
/// first; a layout defined outside the crate ([`Layout::custom`]) registers its spec, then its
/// runtime (`ffn::register`). From then on packs holding it convert, open, load and forward
/// like those of a built-in layout. Registering the same spec again does nothing; a tag that
/// another spec holds (a built-in layout's among them), or one that is not lowercase
/// `[a-z0-9_]`, is refused.
pub fn register(spec: &'static dyn LayoutSpec) -> Result<Layout> {
    admit(
        &mut REGISTRY.write().unwrap_or_else(|e| e.into_inner()),
        spec,
    )
}

/// [`register`] on the registry `reg`: every spec, built in or not, enters this way.
fn admit(
    reg: &mut Arc<[&'static dyn LayoutSpec]>,
    spec: &'static dyn LayoutSpec,
) -> Result<Layout> {
    let layout = spec.layout();
    let tag = layout.tag();
    let refuse = |reason: &str| Error::Register {
        what: format!("layout {tag:?}"),
        reason: reason.into(),
    };
    if tag.is_empty()
        || !tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(refuse("a tag is lowercase letters, digits and underscores"));
    }
    match reg.iter().find(|s| s.layout().tag() == tag) {
        Some(s) if std::ptr::addr_eq(*s, spec) => return Ok(layout),
        Some(_) => return Err(refuse("another spec holds that tag")),
        None => {}
    }
    *reg = reg.iter().copied().chain([spec]).collect();
    if let Layout::Custom(_) = layout {
        crate::converters::layouts::register_tag(tag);
    }
    Ok(layout)
}

/// The spec of a [`Layout::custom`] never registered: it stores, decodes and binds nothing
/// (no file reaches it: [`Layout::from_tag`] knows only registered layouts).
struct Unregistered;

impl LayoutSpec for Unregistered {
    fn layout(&self) -> Layout {
        Layout::custom("unregistered")
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &[]
    }
    fn padded_shape(&self, _: Proj, _: [u64; 2]) -> Option<[u64; 2]> {
        None
    }
    fn part_bytes(&self, _: &str, _: [u64; 2], _: u64) -> Option<u64> {
        None
    }
    fn encode(&self, _: &mut EncodeCx, _: Proj) -> Result<Option<Encoded>> {
        Err(Error::Register {
            what: "a layout".into(),
            reason: "its spec was never registered (layout::register)".into(),
        })
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        Err(Error::Register {
            what: format!("layout of {}", b.name),
            reason: "its spec was never registered (layout::register)".into(),
        })
    }
    fn bind(&self, _: &LayerViews, _: &mut LayerOverlays) {}
}

impl Layout {
    /// This layout's entry in the registry.
    pub fn spec(self) -> &'static dyn LayoutSpec {
        let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
        reg.iter()
            .find(|s| s.layout() == self)
            .copied()
            .unwrap_or(&Unregistered)
    }

    /// Whether a layer of activation `act` takes this layout; `convert` refuses the others
    /// ([`LayoutSpec::gelu_refusal`]).
    pub fn serves(self, act: Activation) -> bool {
        act != Activation::Gelu || self.spec().gelu_refusal().is_none()
    }
}

/// The index of a projection's source weight in a layer (`gate`, `up`, `down`); the fused FP8
/// `gate_up` is described by the gate's.
pub fn source_index(proj: Proj) -> usize {
    match proj {
        Proj::Gate | Proj::GateUp => 0,
        Proj::Up => 1,
        Proj::Down => 2,
    }
}

/// What an encoder reads for one layer: the model, the layer's weights, the options and the
/// adapter, and two caches shared by every layout of the layer: the decoded f32 weights and the
/// NVFP4 base (which the layouts that build on it re-lay).
pub struct EncodeCx<'a> {
    /// The source model.
    pub model: &'a Model,
    /// The layer being encoded.
    pub layer: &'a FfnLayer,
    /// The conversion options.
    pub opts: &'a ConvertOptions,
    /// The adapter, with `lora`.
    pub lora: Option<&'a Lora>,
    /// In a tensor-parallel pack, the intermediate range `[start, end)` of the rank being
    /// encoded: gate and up keep those rows, down those columns, and every method below
    /// answers for the slice (formats.md, "Tensor-parallel packs").
    pub tp: Option<[u64; 2]>,
    dense: [Option<Rc<Vec<f32>>>; 3],
    nvfp4: [Option<Rc<Encoded>>; 3],
}

impl<'a> EncodeCx<'a> {
    /// A context for one layer, its caches empty.
    pub fn new(
        model: &'a Model,
        layer: &'a FfnLayer,
        opts: &'a ConvertOptions,
        lora: Option<&'a Lora>,
    ) -> Self {
        EncodeCx {
            model,
            layer,
            opts,
            lora,
            tp: None,
            dense: [None, None, None],
            nvfp4: [None, None, None],
        }
    }

    /// Source weight `pi` (0 gate, 1 up, 2 down).
    pub fn weight(&self, pi: usize) -> &'a FfnWeight {
        [&self.layer.gate, &self.layer.up, &self.layer.down][pi]
    }

    /// The logical `[n, k]` of the whole source weight `pi` (before any tensor-parallel cut).
    pub fn full_shape(&self, pi: usize) -> Result<[usize; 2]> {
        Ok(self
            .model
            .weight_shape(self.weight(pi))?
            .map(|d| d as usize))
    }

    /// The tensor-parallel cut of source weight `pi`: (cuts columns, `[start, end)`).
    pub fn cut(&self, pi: usize) -> Option<(bool, [u64; 2])> {
        self.tp.map(|r| (pi == 2, r))
    }

    /// The zero rows or columns appended to the cut (to `TP_INTER_ALIGN`).
    pub fn pad(&self) -> u64 {
        self.tp.map_or(0, |[lo, hi]| {
            crate::converters::slice::padded_width(hi - lo) - (hi - lo)
        })
    }

    /// The logical `[n, k]` of source weight `pi` (of the rank's padded slice in a TP pack).
    pub fn shape(&self, pi: usize) -> Result<[usize; 2]> {
        let [n, k] = self.full_shape(pi)?;
        let w = |lo: u64, hi: u64| crate::converters::slice::padded_width(hi - lo) as usize;
        Ok(match self.cut(pi) {
            None => [n, k],
            Some((false, [lo, hi])) => [w(lo, hi), k],
            Some((true, [lo, hi])) => [n, w(lo, hi)],
        })
    }

    /// Source weight `pi` decoded to f32 (once per layer, shared by every layout), cut to the
    /// rank's slice in a TP pack.
    pub fn dense(&mut self, pi: usize) -> Result<Rc<Vec<f32>>> {
        if self.dense[pi].is_none() {
            let full = self.model.decode_weight(self.weight(pi))?.0;
            let [n, k] = self.full_shape(pi)?;
            if !self.opts.allow_nonfinite
                && let Some(at) = full.iter().position(|v| !v.is_finite())
            {
                let t = self.weight(pi).main();
                return Err(Error::Tensor {
                    file: self.model.file_of(t),
                    tensor: self.model.tensors[t].name.to_string(),
                    field: "values",
                    reason: format!(
                        "row {}, column {} decodes to {} (a non-finite value or scale in the source); \
                         refused, since no quantized layout can carry it (--allow-nonfinite keeps it in the bf16 layout)",
                        at / k.max(1),
                        at % k.max(1),
                        full[at]
                    ),
                });
            }
            let pad = self.pad() as usize;
            let v = match self.cut(pi) {
                None => full,
                Some((false, [lo, hi])) => {
                    let mut v = full[lo as usize * k..hi as usize * k].to_vec();
                    v.resize(v.len() + pad * k, 0.0);
                    v
                }
                Some((true, [lo, hi])) => {
                    let w = (hi - lo) as usize + pad;
                    let mut v = vec![0f32; n * w];
                    for r in 0..n {
                        v[r * w..r * w + (hi - lo) as usize]
                            .copy_from_slice(&full[r * k + lo as usize..r * k + hi as usize]);
                    }
                    v
                }
            };
            self.dense[pi] = Some(Rc::new(v));
        }
        Ok(Rc::clone(self.dense[pi].as_ref().expect("just set")))
    }

    /// The stored bytes of source tensor `t`, which belongs to weight `pi` and is laid out as
    /// `[rows, cols]` blocks of `block` (elements, bytes) along each row, cut to the rank's
    /// slice in a TP pack, zero-padded like [`EncodeCx::dense`] (cut positions scaled by `per`:
    /// 1 for the weight itself, 128 for a block-FP8 scale grid, which is never padded). `None`
    /// where the cut or the padding would split a block: the layout then encodes from the f32
    /// slice, as converting that f32 slice would.
    pub fn stored(
        &self,
        pi: usize,
        t: usize,
        dims: [u64; 2],
        block: (u64, u64),
        per: u64,
    ) -> Option<std::borrow::Cow<'a, [u8]>> {
        self.stored_in(pi, self.model.data(t), dims, block, per)
    }

    /// As [`EncodeCx::stored`], of `data`: a source tensor's bytes or a re-laying of them
    /// (compressed-tensors' MXFP4 as GGUF blocks).
    pub fn stored_in<'b>(
        &self,
        pi: usize,
        mut data: &'b [u8],
        dims: [u64; 2],
        block: (u64, u64),
        per: u64,
    ) -> Option<std::borrow::Cow<'b, [u8]>> {
        // One half of a fused gate+up: its rows of the fused tensor (not its scale grids).
        if let FfnWeight::Half { half, .. } = self.weight(pi) {
            if per != 1 || !dims[1].is_multiple_of(block.0) {
                return None;
            }
            let rows = (dims[1] / block.0 * block.1).checked_mul(dims[0])? as usize;
            let at = *half as usize * rows;
            data = data.get(at..at + rows)?;
        }
        match self.cut(pi) {
            None => Some(std::borrow::Cow::Borrowed(data)),
            Some((cols, [lo, hi])) => {
                let pad = self.pad();
                if lo % per != 0 || per > 1 && pad > 0 {
                    return None;
                }
                let end = hi.div_ceil(per);
                crate::converters::slice::slice_padded(
                    data,
                    dims,
                    block,
                    cols,
                    [lo / per, end],
                    pad,
                )
                .map(std::borrow::Cow::Owned)
            }
        }
    }

    /// The NVFP4 encoding of source weight `pi` (once per layer): carried from ModelOpt or
    /// compressed-tensors NVFP4 sources, encoded from f32 otherwise.
    pub fn nvfp4_base(&mut self, pi: usize) -> Result<Rc<Encoded>> {
        if self.nvfp4[pi].is_none() {
            let m = self.model;
            let [n, k] = self.shape(pi)?;
            let [fnn, fk] = self.full_shape(pi)?.map(|d| d as u64);
            // Codes (2 per byte) and E4M3 scales (one per 16) of the (cut) source, and its
            // global scale as ModelOpt's `weight_scale_2`.
            let carried = match *self.weight(pi) {
                FfnWeight::ModelOptNvfp4 {
                    weight,
                    scale,
                    scale_2,
                    ..
                } => Some((weight, scale, m.scalar_f32(scale_2, "weight_scale_2")?)),
                FfnWeight::CtNvfp4 {
                    packed,
                    scale,
                    global_scale,
                } => Some((
                    packed,
                    scale,
                    1.0 / m.scalar_f32(global_scale, "weight_global_scale")?,
                )),
                _ => None,
            };
            let cut = carried.and_then(|(codes, scales, s2)| {
                let c = self.stored(pi, codes, [fnn, fk], (2, 1), 1)?;
                let s = self.stored(pi, scales, [fnn, fk], (16, 1), 1)?;
                Some(crate::converters::layouts::nvfp4::from_modelopt(
                    &c, &s, s2, n, k,
                ))
            });
            let enc = match cut {
                Some(e) => e,
                None => crate::converters::layouts::nvfp4::encode(&self.dense(pi)?, n, k),
            };
            self.nvfp4[pi] = Some(Rc::new(enc));
        }
        Ok(Rc::clone(self.nvfp4[pi].as_ref().expect("just set")))
    }
}

/// One stored projection as the decoder sees it: its parts' bytes by suffix, its logical and
/// padded shapes (already checked against the blobs by `pack::check`) and its scalars.
pub struct BlobRead<'a> {
    /// The projection.
    pub proj: Proj,
    /// Its logical shape `[n, k]`.
    pub shape: [usize; 2],
    /// Its padded shape.
    pub padded: [usize; 2],
    /// Its scalars from the manifest.
    pub scalars: &'a BTreeMap<String, f32>,
    /// The pack file and the blob's name, for errors.
    pub file: &'a str,
    /// The blob's name (for errors).
    pub name: &'a str,
    /// Its parts by name.
    pub parts: &'a dyn Fn(&str) -> Option<&'a [u8]>,
}

impl BlobRead<'_> {
    /// The bytes of part `p`, or an error naming the missing tensor.
    pub fn part(&self, p: &str) -> Result<&[u8]> {
        (self.parts)(p).ok_or_else(|| Error::NotFound {
            file: self.file.into(),
            tensor: if p.is_empty() {
                self.name.into()
            } else {
                format!("{}.{p}", self.name)
            },
        })
    }

    /// An error naming part `p` of this blob and why it breaks a rule.
    pub fn bad(&self, p: &str, reason: String) -> Error {
        Error::Tensor {
            file: self.file.into(),
            tensor: if p.is_empty() {
                self.name.into()
            } else {
                format!("{}.{p}", self.name)
            },
            field: "rules",
            reason,
        }
    }

    /// Whether part `p` is stored.
    pub fn has(&self, p: &str) -> bool {
        (self.parts)(p).is_some()
    }

    /// Scalar `s` (0 when absent: `pack::check` has required every scalar the layout names).
    pub fn scalar(&self, s: &str) -> f32 {
        self.scalars.get(s).copied().unwrap_or(0.0)
    }
}

/// The device view and manifest entry of one part of one projection, looked up by
/// `(projection, part suffix)`.
pub type ViewLookup<'a> = dyn Fn(Proj, &str) -> Option<(DevicePtr, &'a FfnEntry)> + 'a;

/// One layer's device views as the loader binds them: `(view, manifest entry)` of a part by
/// projection and suffix, for this spec's layout.
pub struct LayerViews<'a> {
    /// The model's intermediate size (the fused FP8 gate_up splits at it).
    pub inter: usize,
    /// The views of this layer, by projection and part.
    pub get: &'a ViewLookup<'a>,
}

impl LayerViews<'_> {
    /// The view and entry of `part` of `proj`.
    pub fn get(&self, proj: Proj, part: &str) -> Option<(DevicePtr, &FfnEntry)> {
        (self.get)(proj, part)
    }

    /// Whether every one of gate, up and down has `part`.
    pub fn all(&self, part: &str) -> bool {
        [Proj::Gate, Proj::Up, Proj::Down]
            .iter()
            .all(|&p| self.get(p, part).is_some())
    }
}

/// `(n, k, np, kp)` of an entry, as `usize`.
pub fn dims(fe: &FfnEntry) -> (usize, usize, usize, usize) {
    (
        fe.shape[0] as usize,
        fe.shape[1] as usize,
        fe.padded[0] as usize,
        fe.padded[1] as usize,
    )
}

/// Round `x` up to a multiple of `m`, checked.
pub(crate) fn ru(x: u64, m: usize) -> Option<u64> {
    x.checked_next_multiple_of(m as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_in_layout_order_and_complete() {
        let specs = specs();
        for (i, l) in Layout::ALL.into_iter().enumerate() {
            assert_eq!(specs[i].layout(), l);
            assert_eq!(l.spec().layout(), l);
        }
    }

    /// Each built-in layout has exactly one runtime (`ffn/layouts/`), and each built-in
    /// runtime is a built-in layout's: a layout registered in one layer and not another fails
    /// here. (That what builds on another installs after it, `ffn::register` checks.)
    #[test]
    fn every_built_in_layout_has_one_runtime() {
        let rt: Vec<Layout> = crate::ffn::runtimes().iter().map(|r| r.layout).collect();
        for l in Layout::ALL {
            assert_eq!(rt.iter().filter(|&&x| x == l).count(), 1, "{}", l.tag());
        }
        assert_eq!(
            rt[..Layout::ALL.len()]
                .iter()
                .filter(|l| Layout::ALL.contains(l))
                .count(),
            Layout::ALL.len()
        );
    }
}
