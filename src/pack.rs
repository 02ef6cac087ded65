//! The pack: one GGUF v3 file holding a model's passthrough tensors byte for byte and, for every
//! dense FFN layer, the weight layouts the engine's `DenseFfnLayer` overlays take, in one
//! contiguous device segment in layer order, described by a manifest in `metrale.pack.*`
//! metadata (formats.md, "The pack container").
//!
//! Writing is streaming and crash-safe: the header is planned with placeholder sizes (all its
//! numeric fields are fixed-width, the manifest string is padded to a reserved length), tensor
//! data is written layer by layer to a temporary file, then the real header overwrites the
//! placeholder in place, the file is fsynced and renamed into place.

use crate::GgmlType;
use crate::converters::layouts::{self, Encoded, Layout, Proj, q4k_mmq::DownFormat};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};
use crate::gguf_write::GgufBuilder;
use crate::model::{Activation, DType, FfnLayer, FfnWeight, Format, Model, SourceFile};
use safetensors::Dtype;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Lazily decodes (once) and shares a layer's f32 weights: `(projection index, weight)`.
type DenseOf<'a> = dyn FnMut(usize, &FfnWeight) -> Result<Rc<Vec<f32>>> + 'a;
use xxhash_rust::xxh3::xxh3_64;

/// Version of the container and manifest; bumped on any incompatible change.
/// 2: the header checksum `metrale.pack.header_xxh3`; LoRA blobs only for targeted projections.
pub const PACK_FORMAT_VERSION: u32 = 2;
/// Version of the layouts' contract with the GPU kernels that read them.
pub const KERNEL_ABI_VERSION: u32 = 1;
/// The GPU architecture the default layouts are built for.
pub const TARGET_ARCH: &str = "sm_90";
/// Every tensor starts on a page, so any run of tensors can be registered or read with O_DIRECT.
pub const PACK_ALIGNMENT: u64 = 4096;
/// The converter's version.
pub const CONVERTER_VERSION: &str = env!("CARGO_PKG_VERSION");
/// ggml's name limit (`GGML_MAX_NAME` 64 with the NUL).
pub const MAX_NAME_LEN: usize = 63;

/// Metadata keys of the manifest.
pub mod keys {
    pub const FORMAT_VERSION: &str = "metrale.pack.format_version";
    pub const CONVERTER_VERSION: &str = "metrale.pack.converter_version";
    pub const TARGET_ARCH: &str = "metrale.pack.target.arch";
    pub const KERNEL_ABI: &str = "metrale.pack.target.kernel_abi";
    pub const SEGMENT_OFFSET: &str = "metrale.pack.segment.offset";
    pub const SEGMENT_BYTES: &str = "metrale.pack.segment.bytes";
    pub const MANIFEST: &str = "metrale.pack.manifest";
    /// xxh3-64 of the header with these 8 value bytes as zeros; always the last KV.
    pub const HEADER_XXH3: &str = "metrale.pack.header_xxh3";
}

/// Conversion options.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConvertOptions {
    /// Layouts to build for every FFN layer; `None` = the defaults for the model's activation.
    pub layouts: Option<Vec<Layout>>,
    /// How `q4k_mmq` stores the down projection.
    pub q4k_down: DownFormat,
    /// A PEFT LoRA adapter directory (adds the `lora` layout).
    pub lora: Option<PathBuf>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            layouts: None,
            q4k_down: DownFormat::Int8,
            lora: None,
        }
    }
}

/// The layouts an sm_90 engine holds after start-up: the NVFP4 base plus, for SiLU layers, the
/// NVFP4-MMQ tiles (`finalize_nvfp4_mmq_load` builds them and frees the `_t` copies); GELU
/// layers keep the transposed `_t` copies instead (that finalize skips them).
pub fn default_layouts(act: Activation) -> Vec<Layout> {
    match act {
        Activation::Silu => vec![Layout::Nvfp4, Layout::Nvfp4Mmq],
        Activation::Gelu => vec![Layout::Nvfp4, Layout::Nvfp4T],
    }
}

/// One source file in the manifest.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SourceInfo {
    pub name: String,
    pub bytes: u64,
    pub xxh3: String,
}

/// The model facts the loader needs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelInfo {
    pub architecture: Option<String>,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub activation: String,
    pub ffn_layers: usize,
}

/// One tensor of the pack.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    /// Present for repacked FFN blobs.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ffn: Option<FfnEntry>,
    /// The source tensor's type (`Q4_1`, `BF16`, `F8_E4M3`, ...); for FFN blobs the main tensor's.
    pub source_type: String,
    /// For passthrough tensors stored as I8 blobs (safetensors dtypes with no ggml type), the
    /// source shape; otherwise absent.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_shape: Option<Vec<u64>>,
    pub bytes: u64,
    /// xxh3-64 of the tensor's bytes (padding excluded), 16 hex digits.
    pub xxh3: String,
}

/// What an FFN blob is.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FfnEntry {
    pub layer: usize,
    pub proj: String,
    pub layout: String,
    /// Part suffix (`codes`, `scales`, `a`, `b`) or "" for a single blob.
    pub part: String,
    /// How the source stored it (`plain`, `modelopt-nvfp4`, `fp8-block128`, ...).
    pub source_scheme: String,
    /// Logical `[out, in]` shape.
    pub shape: [u64; 2],
    /// The shape after padding (see each layout in formats.md).
    pub padded: [u64; 2],
    /// The part that holds this blob's scales, if another part does.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub scales: Option<String>,
    /// Derived scalars (`global_scale`, `scaling`, `rank`), f32.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub scalars: BTreeMap<String, f32>,
}

/// The manifest (`metrale.pack.manifest`, JSON).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub pack_format_version: u32,
    pub converter_version: String,
    pub target_arch: String,
    pub kernel_abi: u32,
    pub sources: Vec<SourceInfo>,
    pub source_format: String,
    pub options: ConvertOptions,
    pub layouts: Vec<String>,
    pub model: ModelInfo,
    /// Data-section-relative offset and length of the device segment.
    pub segment_offset: u64,
    pub segment_bytes: u64,
    pub tensors: Vec<TensorEntry>,
}

/// Pack tensor name of an FFN blob.
pub fn blob_name(layer: usize, proj: Proj, layout: Layout, part: &str) -> String {
    let base = format!("blk.{layer}.ffn_{}.{}", proj.name(), layout.tag());
    if part.is_empty() {
        base
    } else {
        format!("{base}.{part}")
    }
}

/// The part suffixes a layout writes for a projection, in order.
pub fn part_names(layout: Layout, proj: Proj, down: DownFormat) -> &'static [&'static str] {
    match layout {
        Layout::Nvfp4 | Layout::Nvfp4T | Layout::Fp8 | Layout::W8a8 => &["codes", "scales"],
        Layout::Q4kMmq if proj == Proj::Down && down == DownFormat::Int8 => &["codes", "scales"],
        Layout::Lora => &["a", "b"],
        _ => &[""],
    }
}

/// A planned tensor: where its bytes come from.
enum Item {
    /// Copied byte for byte from source tensor `i`.
    Passthrough {
        src: usize,
        ty: GgmlType,
        ne: Vec<u64>,
        entry: Box<TensorEntry>,
    },
    /// Part `part` of layout `layout` of projection `proj` of layer `layer`.
    Blob {
        layer: usize,
        proj: Proj,
        layout: Layout,
        part: &'static str,
    },
}

/// A PEFT LoRA adapter on the FFN projections: which (layer, projection) it targets, with each
/// one's rank and scaling (PEFT's `rank_pattern`, `alpha_pattern` and `use_rslora` applied).
/// Projections it does not target are served as identity (no `lora` blobs, no delta).
struct Lora {
    model: Model,
    targets: HashMap<(usize, Proj), (usize, f32)>,
}

/// The value of the first key of a PEFT `rank_pattern` / `alpha_pattern` that names `module`
/// (PEFT matches `(.*\.)?KEY$`; keys are module names or name suffixes).
fn peft_pattern(
    file: &str,
    field: &str,
    map: Option<&serde_json::Value>,
    module: &str,
) -> Result<Option<f64>> {
    let Some(obj) = map.and_then(|m| m.as_object()) else {
        return Ok(None);
    };
    for (key, v) in obj {
        if key
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        {
            return Err(Error::Json {
                file: file.into(),
                field: format!("{field}.{key}"),
                reason: "regular-expression keys are not supported; name modules or suffixes"
                    .into(),
            });
        }
        if module == key || module.ends_with(&format!(".{key}")) {
            return v.as_f64().map(Some).ok_or_else(|| Error::Json {
                file: file.into(),
                field: format!("{field}.{key}"),
                reason: "not a number".into(),
            });
        }
    }
    Ok(None)
}

impl Lora {
    fn open(dir: &Path, base: &Model) -> Result<Lora> {
        let cfg_path = dir.join("adapter_config.json");
        let f = cfg_path.display().to_string();
        let v = crate::safetensors_file::read_json(&cfg_path)?;
        let refuse = |field: &str, reason: String| Error::Json {
            file: f.clone(),
            field: field.into(),
            reason,
        };
        let num = |k: &str| -> Result<f64> {
            v.get(k)
                .and_then(|x| x.as_f64())
                .ok_or_else(|| refuse(k, "missing or not a number".into()))
        };
        let flag = |k: &str| v.get(k).and_then(|b| b.as_bool()).unwrap_or(false);
        let set = |k: &str| {
            v.get(k).is_some_and(|x| {
                !(x.is_null() || x == &serde_json::json!([]) || x == &serde_json::json!({}))
            })
        };
        if let Some(t) = v.get("peft_type").and_then(|t| t.as_str())
            && t != "LORA"
        {
            return Err(refuse(
                "peft_type",
                format!("{t}: only LoRA adapters are served"),
            ));
        }
        if flag("use_dora") {
            return Err(refuse("use_dora", "DoRA adapters are not served: the engine applies y += s*B(Ax) and has no per-column magnitude vector".into()));
        }
        if flag("lora_bias") {
            return Err(refuse(
                "lora_bias",
                "LoRA with a bias on lora_B is not served: the engine's LoRA path adds no bias"
                    .into(),
            ));
        }
        if let Some(b) = v.get("bias").and_then(|b| b.as_str())
            && b != "none"
        {
            return Err(refuse(
                "bias",
                format!("{b:?}: trained base-layer biases are not served (\"none\" is)"),
            ));
        }
        for k in [
            "modules_to_save",
            "layer_replication",
            "target_parameters",
            "trainable_token_indices",
        ] {
            if set(k) {
                return Err(refuse(
                    k,
                    "is set: the engine serves LoRA A/B on gate/up/down only".into(),
                ));
            }
        }
        let r = num("r")?;
        let alpha = num("lora_alpha")?;
        let rslora = flag("use_rslora");
        let model = Model::open(&dir.join("adapter_model.safetensors"))?;
        let adapter_file = model.files[0].path().display().to_string();
        // Every adapter tensor must be an FFN projection's lora_A or lora_B.
        let mut present: HashMap<(usize, Proj), [bool; 2]> = HashMap::new();
        for t in &model.tensors {
            let bad = |reason: String| Error::Quantized {
                file: adapter_file.clone(),
                tensor: t.name.clone(),
                reason,
            };
            let rest = t.name.strip_prefix("base_model.model.model.layers.");
            let parsed = rest.and_then(|r| {
                let (layer, r) = r.split_once('.')?;
                let layer: usize = layer.parse().ok()?;
                let r = r.strip_prefix("mlp.")?;
                let (proj, r) = r.split_once("_proj.")?;
                Some((layer, Proj::from_name(proj)?, r))
            });
            match parsed {
                Some((layer, proj, "lora_A.weight")) if proj != Proj::GateUp => {
                    present.entry((layer, proj)).or_default()[0] = true
                }
                Some((layer, proj, "lora_B.weight")) if proj != Proj::GateUp => {
                    present.entry((layer, proj)).or_default()[1] = true
                }
                _ if t.name.contains("lora_magnitude_vector") => {
                    return Err(bad(
                        "a DoRA magnitude vector: DoRA adapters are not served".into()
                    ));
                }
                _ if t.name.contains("lora_B.bias") || t.name.contains("lora_A.bias") => {
                    return Err(bad("a LoRA bias: lora_bias adapters are not served".into()));
                }
                _ => {
                    return Err(bad("LoRA on a module the engine does not serve: adapters apply to the FFN projections gate_proj, up_proj and down_proj only".into()));
                }
            }
        }
        let layers: HashSet<usize> = base.ffn_layers.iter().map(|l| l.index).collect();
        let mut targets = HashMap::new();
        for (&(layer, proj), &[a, b]) in &present {
            let module = format!("model.layers.{layer}.mlp.{}_proj", proj.name());
            if !layers.contains(&layer) {
                return Err(Error::NotFound {
                    file: base.path.display().to_string(),
                    tensor: format!("{module} (the adapter has LoRA for it)"),
                });
            }
            if !(a && b) {
                return Err(Error::NotFound {
                    file: adapter_file.clone(),
                    tensor: format!(
                        "base_model.model.{module}.lora_{}.weight (its lora_{} is present)",
                        if a { "B" } else { "A" },
                        if a { "A" } else { "B" }
                    ),
                });
            }
            let rank =
                peft_pattern(&f, "rank_pattern", v.get("rank_pattern"), &module)?.unwrap_or(r);
            let alpha = peft_pattern(&f, "alpha_pattern", v.get("alpha_pattern"), &module)?
                .unwrap_or(alpha);
            if rank < 1.0 || rank.fract() != 0.0 || rank > crate::ffn::LORA_MAX_RANK as f64 {
                return Err(refuse(
                    "r",
                    format!(
                        "{module}: rank {rank} is not in 1..={}",
                        crate::ffn::LORA_MAX_RANK
                    ),
                ));
            }
            let scaling = if rslora {
                alpha / rank.sqrt()
            } else {
                alpha / rank
            };
            targets.insert((layer, proj), (rank as usize, scaling as f32));
        }
        if targets.is_empty() {
            return Err(refuse(
                "target_modules",
                "the adapter holds no LoRA for gate_proj, up_proj or down_proj".into(),
            ));
        }
        Ok(Lora { model, targets })
    }

    /// (A `[r, k]`, B `[n, r]`) for a targeted projection.
    fn matrices(
        &self,
        layer: usize,
        proj: Proj,
        n: usize,
        k: usize,
    ) -> Result<(Vec<f32>, Vec<f32>, usize, f32)> {
        let (rank, scaling) = self.targets[&(layer, proj)];
        let base = format!(
            "base_model.model.model.layers.{layer}.mlp.{}_proj",
            proj.name()
        );
        let get = |ab: &str, shape: [usize; 2]| -> Result<Vec<f32>> {
            let i = self.model.tensor(&format!("{base}.lora_{ab}.weight"))?;
            let t = &self.model.tensors[i];
            if t.shape != [shape[0] as u64, shape[1] as u64] {
                return Err(Error::Quantized {
                    file: self.model.file_of(i),
                    tensor: t.name.clone(),
                    reason: format!(
                        "expected shape {shape:?} (rank {rank}, base [{n}, {k}]), found {:?}",
                        t.shape
                    ),
                });
            }
            self.model.decode_tensor(i)
        };
        Ok((get("A", [rank, k])?, get("B", [n, rank])?, rank, scaling))
    }

    fn targets(&self, layer: usize, proj: Proj) -> bool {
        self.targets.contains_key(&(layer, proj))
    }
}

/// Everything the writer and `verify --source` share: the plan and the per-layer producer.
pub struct Plan<'m> {
    model: &'m Model,
    opts: ConvertOptions,
    layouts: Vec<Layout>,
    lora: Option<Lora>,
    items: Vec<Item>,
    ffn_sources: HashSet<usize>,
    /// Position in `model.ffn_layers` of each FFN layer index (plan and progress look layers up
    /// by index once per blob; a scan there made convert quadratic in the layer count).
    layer_pos: HashMap<usize, usize>,
    hidden: u64,
    inter: u64,
    activation: Activation,
}

impl<'m> Plan<'m> {
    /// Check the options against the model and list every tensor the pack will hold.
    pub fn new(model: &'m Model, opts: &ConvertOptions) -> Result<Plan<'m>> {
        let file = model.path.display().to_string();
        let bad = |reason: String| Error::Unsupported {
            file: file.clone(),
            reason,
        };
        if model.ffn_layers.is_empty() {
            return Err(bad(
                "no dense FFN layers (gate/up/down) found: nothing to pack".into(),
            ));
        }
        let activation = model.activation.unwrap_or(Activation::Silu);
        let mut layouts = opts
            .layouts
            .clone()
            .unwrap_or_else(|| default_layouts(activation));
        if opts.lora.is_some() && !layouts.contains(&Layout::Lora) {
            layouts.push(Layout::Lora);
        }
        layouts.sort();
        layouts.dedup();
        if activation == Activation::Gelu {
            if layouts.contains(&Layout::W8a8) {
                return Err(bad("layout w8a8 is refused for GELU layers (set_w8a8_decode_weights refuses a GELU FFN)".into()));
            }
            if layouts.contains(&Layout::Nvfp4Mmq) {
                return Err(bad("layout nvfp4_mmq is not built for GELU layers (finalize_nvfp4_mmq_load skips them)".into()));
            }
        }
        if layouts.contains(&Layout::Lora) {
            if opts.lora.is_none() {
                return Err(bad("layout lora needs --lora DIR (a PEFT adapter)".into()));
            }
            if !layouts.contains(&Layout::Nvfp4) {
                return Err(bad("layout lora needs the nvfp4 base layout (set_lora_weights only takes an adapter on the NVFP4 base)".into()));
            }
        }
        let lora = opts
            .lora
            .as_deref()
            .map(|d| Lora::open(d, model))
            .transpose()?;
        let hidden = model.hidden_size.unwrap_or(0);
        let inter = model.intermediate_size.unwrap_or(0);
        let mut ffn_sources = HashSet::new();
        for l in &model.ffn_layers {
            for (w, want) in [
                (&l.gate, [inter, hidden]),
                (&l.up, [inter, hidden]),
                (&l.down, [hidden, inter]),
            ] {
                let s = model.weight_shape(w)?;
                if s != want {
                    return Err(Error::Quantized {
                        file: model.file_of(w.main()),
                        tensor: model.tensors[w.main()].name.clone(),
                        reason: format!("shape {s:?} but hidden/intermediate size say {want:?}"),
                    });
                }
                ffn_sources.extend(companions(w));
            }
        }
        let mut items = Vec::new();
        for (i, t) in model.tensors.iter().enumerate() {
            if ffn_sources.contains(&i) {
                continue;
            }
            if t.name.len() > MAX_NAME_LEN {
                return Err(Error::Tensor {
                    file: model.file_of(i),
                    tensor: t.name.clone(),
                    field: "name",
                    reason: format!(
                        "{} bytes; GGUF readers accept at most {MAX_NAME_LEN}",
                        t.name.len()
                    ),
                });
            }
            // A type ggml has keeps it; any other becomes an I8 blob of its bytes.
            let (ty, ne, source_shape) = match t.dtype.as_ggml() {
                Some(ty) => (ty, t.shape.iter().rev().copied().collect(), None),
                None => (GgmlType::I8, vec![t.bytes], Some(t.shape.clone())),
            };
            let entry = TensorEntry {
                name: t.name.clone(),
                ffn: None,
                source_type: t.dtype.name(),
                source_shape,
                bytes: t.bytes,
                xxh3: String::new(),
            };
            items.push(Item::Passthrough {
                src: i,
                ty,
                ne,
                entry: Box::new(entry),
            });
        }
        for l in &model.ffn_layers {
            for &layout in &layouts {
                for &proj in layout.projections() {
                    if layout == Layout::Lora
                        && !lora.as_ref().is_some_and(|a| a.targets(l.index, proj))
                    {
                        continue; // not targeted: served as identity
                    }
                    for &part in part_names(layout, proj, opts.q4k_down) {
                        items.push(Item::Blob {
                            layer: l.index,
                            proj,
                            layout,
                            part,
                        });
                    }
                }
            }
        }
        let layer_pos = model
            .ffn_layers
            .iter()
            .enumerate()
            .map(|(p, l)| (l.index, p))
            .collect();
        Ok(Plan {
            model,
            opts: opts.clone(),
            layouts,
            lora,
            items,
            ffn_sources,
            layer_pos,
            hidden,
            inter,
            activation,
        })
    }

    /// Produce every tensor in file order, calling `sink(name, bytes, entry)`; one layer's
    /// weights are held at a time.
    pub fn produce(
        &self,
        mut sink: impl FnMut(&str, &[u8], TensorEntry) -> Result<()>,
    ) -> Result<()> {
        let m = self.model;
        let mut i = 0;
        while i < self.items.len() {
            match &self.items[i] {
                Item::Passthrough { src, entry, .. } => {
                    sink(&entry.name, m.data(*src), (**entry).clone())?;
                    m.release(*src);
                    i += 1;
                }
                Item::Blob { layer, .. } => {
                    let layer = *layer;
                    let blobs = self.layer_blobs(layer)?;
                    for (name, bytes, entry) in blobs {
                        match &self.items[i] {
                            Item::Blob {
                                layer: l2,
                                proj,
                                layout,
                                part,
                            } if *l2 == layer && name == blob_name(layer, *proj, *layout, part) => {
                            }
                            _ => unreachable!("producer order differs from plan at {name}"),
                        }
                        sink(&name, &bytes, entry)?;
                        i += 1;
                    }
                    let l = self.layer(layer);
                    for t in [&l.gate, &l.up, &l.down].into_iter().flat_map(companions) {
                        m.release(t);
                    }
                }
            }
        }
        Ok(())
    }

    /// The FFN layer with index `layer` (every planned layer is one of the model's).
    fn layer(&self, layer: usize) -> &'m FfnLayer {
        &self.model.ffn_layers[self.layer_pos[&layer]]
    }

    /// Every blob of one layer, in plan order.
    fn layer_blobs(&self, layer: usize) -> Result<Vec<(String, Vec<u8>, TensorEntry)>> {
        let m = self.model;
        let l = self.layer(layer);
        let ws = [
            (Proj::Gate, &l.gate),
            (Proj::Up, &l.up),
            (Proj::Down, &l.down),
        ];
        // Decoded f32 weights, computed once per projection on first need and shared (not copied)
        // by every layout that encodes from them.
        let mut dense: [Option<Rc<Vec<f32>>>; 3] = [None, None, None];
        let mut nvfp4: [Option<Encoded>; 3] = [None, None, None];
        let mut out = Vec::new();
        for &layout in &self.layouts {
            let mut per_proj: Vec<(Proj, usize, Encoded)> = Vec::new();
            for (pi, &(proj, w)) in ws.iter().enumerate() {
                let [n, k] = m.weight_shape(w)?.map(|d| d as usize);
                if layout == Layout::Fp8 && proj == Proj::Up {
                    continue; // fused with gate below
                }
                let mut dense_of = |pi: usize, w: &FfnWeight| -> Result<Rc<Vec<f32>>> {
                    if dense[pi].is_none() {
                        dense[pi] = Some(Rc::new(m.decode_weight(w)?.0));
                    }
                    Ok(Rc::clone(dense[pi].as_ref().unwrap()))
                };
                let enc = match layout {
                    Layout::Nvfp4 | Layout::Nvfp4T | Layout::Nvfp4Mmq => {
                        if nvfp4[pi].is_none() {
                            nvfp4[pi] = Some(match *w {
                                FfnWeight::ModelOptNvfp4 {
                                    weight,
                                    scale,
                                    scale_2,
                                    ..
                                } => {
                                    let s2 = m.scalar_f32(scale_2, "weight_scale_2")?;
                                    layouts::nvfp4::from_modelopt(
                                        m.data(weight),
                                        m.data(scale),
                                        s2,
                                        n,
                                        k,
                                    )
                                }
                                FfnWeight::CtNvfp4 {
                                    packed,
                                    scale,
                                    global_scale,
                                } => {
                                    let g = m.scalar_f32(global_scale, "weight_global_scale")?;
                                    layouts::nvfp4::from_modelopt(
                                        m.data(packed),
                                        m.data(scale),
                                        1.0 / g,
                                        n,
                                        k,
                                    )
                                }
                                _ => layouts::nvfp4::encode(&dense_of(pi, w)?, n, k),
                            });
                        }
                        let base = nvfp4[pi].as_ref().unwrap();
                        let (codes, scales, g, kp) = (
                            &base.parts[0].1,
                            &base.parts[1].1,
                            base.scalars[0].1,
                            base.padded[1],
                        );
                        match layout {
                            Layout::Nvfp4 => base.clone(),
                            Layout::Nvfp4T => layouts::nvfp4_t::from_nvfp4(codes, scales, g, n, kp),
                            _ => layouts::nvfp4_mmq::from_nvfp4(codes, scales, g, n, kp),
                        }
                    }
                    Layout::Q4kMmq => {
                        let q4k_src =
                            matches!(m.tensors[w.main()].dtype, DType::Ggml(GgmlType::Q4_K))
                                && k % layouts::q4k_mmq::K_ALIGN == 0;
                        if proj == Proj::Down && self.opts.q4k_down == DownFormat::Int8 {
                            layouts::q4k_mmq::encode_int8(&dense_of(pi, w)?, n, k)
                        } else if q4k_src {
                            layouts::q4k_mmq::carry_q4k(m.data(w.main()), n, k)
                        } else {
                            layouts::q4k_mmq::encode_q4k(&dense_of(pi, w)?, n, k)
                        }
                    }
                    Layout::Fp8 => {
                        let one = |pi: usize,
                                   w: &FfnWeight,
                                   dense_of: &mut DenseOf|
                         -> Result<Encoded> {
                            let [n, k] = m.weight_shape(w)?.map(|d| d as usize);
                            Ok(match *w {
                                FfnWeight::Fp8Block { weight, scale_inv } => layouts::fp8::carry(
                                    m.data(weight),
                                    &m.floats(scale_inv, "block scales")?,
                                    n,
                                    k,
                                ),
                                _ => layouts::fp8::encode(&dense_of(pi, w)?, n, k),
                            })
                        };
                        if proj == Proj::Gate {
                            let g = one(0, &l.gate, &mut dense_of)?;
                            let u = one(1, &l.up, &mut dense_of)?;
                            per_proj.push((Proj::GateUp, 0, layouts::fp8::fuse(g, u)));
                            continue;
                        }
                        one(pi, w, &mut dense_of)?
                    }
                    Layout::W8a8 => layouts::w8a8::encode(&dense_of(pi, w)?, n, k),
                    Layout::Bf16 => match m.tensors[w.main()].dtype {
                        DType::Ggml(GgmlType::BF16) | DType::St(Dtype::BF16)
                            if matches!(w, FfnWeight::Plain { .. }) =>
                        {
                            layouts::bf16::carry(m.data(w.main()), n, k)
                        }
                        _ => layouts::bf16::encode(&dense_of(pi, w)?, n, k),
                    },
                    Layout::Q2g128 => layouts::q2g128::encode(&dense_of(pi, w)?, n, k),
                    Layout::Lora => {
                        let lora = self.lora.as_ref().expect("checked in Plan::new");
                        if !lora.targets(layer, proj) {
                            continue;
                        }
                        let (a, b, rank, scaling) = lora.matrices(layer, proj, n, k)?;
                        layouts::lora::encode(&a, &b, n, k, rank, scaling)
                    }
                };
                per_proj.push((proj, pi, enc));
            }
            for (proj, pi, enc) in per_proj {
                let w = ws[pi].1;
                let [n, k] = m.weight_shape(w)?;
                let shape = if proj == Proj::GateUp {
                    [2 * n, k]
                } else {
                    [n, k]
                };
                let names = part_names(layout, proj, self.opts.q4k_down);
                assert_eq!(
                    enc.parts.iter().map(|p| p.0).collect::<Vec<_>>(),
                    names,
                    "{layout:?} {proj:?} parts"
                );
                let scales = names
                    .contains(&"scales")
                    .then(|| blob_name(layer, proj, layout, "scales"));
                for (part, bytes) in enc.parts {
                    let entry = TensorEntry {
                        name: blob_name(layer, proj, layout, part),
                        ffn: Some(FfnEntry {
                            layer,
                            proj: proj.name().into(),
                            layout: layout.tag().into(),
                            part: part.into(),
                            source_scheme: w.scheme().into(),
                            shape,
                            padded: enc.padded.map(|d| d as u64),
                            scales: scales.clone().filter(|s| !s.ends_with(&format!(".{part}"))),
                            scalars: enc
                                .scalars
                                .iter()
                                .map(|(k, v)| (k.to_string(), *v))
                                .collect(),
                        }),
                        source_type: m.tensors[w.main()].dtype.name(),
                        source_shape: None,
                        bytes: bytes.len() as u64,
                        xxh3: String::new(),
                    };
                    out.push((entry.name.clone(), bytes, entry));
                }
            }
        }
        Ok(out)
    }

    fn manifest(&self, tensors: Vec<TensorEntry>, segment: (u64, u64)) -> Manifest {
        let m = self.model;
        Manifest {
            pack_format_version: PACK_FORMAT_VERSION,
            converter_version: CONVERTER_VERSION.into(),
            target_arch: TARGET_ARCH.into(),
            kernel_abi: KERNEL_ABI_VERSION,
            sources: Vec::new(),
            source_format: m.format.name().into(),
            options: self.opts.clone(),
            layouts: self.layouts.iter().map(|l| l.tag().to_string()).collect(),
            model: ModelInfo {
                architecture: m.architecture.clone(),
                hidden_size: self.hidden,
                intermediate_size: self.inter,
                activation: self.activation.name().into(),
                ffn_layers: m.ffn_layers.len(),
            },
            segment_offset: segment.0,
            segment_bytes: segment.1,
            tensors,
        }
    }

    /// Source tensors consumed by the FFN layouts (not carried).
    pub fn ffn_sources(&self) -> &HashSet<usize> {
        &self.ffn_sources
    }
}

fn companions(w: &FfnWeight) -> Vec<usize> {
    match *w {
        FfnWeight::Plain { weight } => vec![weight],
        // `input_scale` (the W4A4 activation scale) is not consumed: it is carried as a
        // passthrough tensor under its own name, like compressed-tensors' `input_global_scale`.
        FfnWeight::ModelOptNvfp4 {
            weight,
            scale,
            scale_2,
            ..
        } => vec![weight, scale, scale_2],
        FfnWeight::CtNvfp4 {
            packed,
            scale,
            global_scale,
        } => vec![packed, scale, global_scale],
        FfnWeight::Fp8Block { weight, scale_inv } => vec![weight, scale_inv],
        FfnWeight::Fp8Channel { weight, scale } | FfnWeight::Fp8Tensor { weight, scale } => {
            vec![weight, scale]
        }
    }
}

fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// Progress callback: (bytes of source processed so far, total).
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// Convert `model` to a pack at `out` (crash-safe). Returns the manifest written.
pub fn convert(
    model: &Model,
    opts: &ConvertOptions,
    out: &Path,
    progress: Progress,
) -> anyhow::Result<Manifest> {
    let plan = Plan::new(model, opts)?;
    // Source identity: names, sizes and a content hash of every source file.
    let sources: Vec<SourceInfo> = model
        .files
        .iter()
        .map(|f| {
            let bytes = f.bytes();
            // Streamed hash, dropping each chunk's pages behind it to keep the resident set small.
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for (c, chunk) in bytes.chunks(64 << 20).enumerate() {
                h.update(chunk);
                f.release(
                    (c as u64) << 26,
                    ((c as u64 + 1) << 26).min(bytes.len() as u64),
                );
            }
            SourceInfo {
                name: f
                    .path()
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default(),
                bytes: bytes.len() as u64,
                xxh3: hex(h.digest()),
            }
        })
        .collect();

    // Placeholder header: every tensor with size 0, manifest with empty checksums.
    let header_for = |entries: &[(String, GgmlType, Vec<u64>)],
                      manifest: &Manifest,
                      reserve: usize|
     -> anyhow::Result<(GgufBuilder, usize)> {
        let mut b = GgufBuilder::new(PACK_ALIGNMENT);
        copy_metadata(model, &mut b);
        b.add_kv(keys::FORMAT_VERSION, &Value::U32(PACK_FORMAT_VERSION));
        b.add_kv(
            keys::CONVERTER_VERSION,
            &Value::String(CONVERTER_VERSION.into()),
        );
        b.add_kv(keys::TARGET_ARCH, &Value::String(TARGET_ARCH.into()));
        b.add_kv(keys::KERNEL_ABI, &Value::U32(KERNEL_ABI_VERSION));
        b.add_kv(keys::SEGMENT_OFFSET, &Value::U64(manifest.segment_offset));
        b.add_kv(keys::SEGMENT_BYTES, &Value::U64(manifest.segment_bytes));
        let mut json = serde_json::to_string(manifest)?;
        let reserve = reserve.max(json.len());
        json.push_str(&" ".repeat(reserve - json.len()));
        b.add_kv(keys::MANIFEST, &Value::String(json));
        b.add_kv(keys::HEADER_XXH3, &Value::U64(0));
        for (name, ty, ne) in entries {
            b.add_tensor(name, ne, *ty);
        }
        Ok((b, reserve))
    };

    let mut planned: Vec<(String, GgmlType, Vec<u64>)> = Vec::new();
    let mut placeholder_entries = Vec::new();
    for it in &plan.items {
        match it {
            Item::Passthrough { ty, ne, entry, .. } => {
                planned.push((entry.name.clone(), *ty, ne.clone()));
                placeholder_entries.push((**entry).clone());
            }
            Item::Blob {
                layer,
                proj,
                layout,
                part,
            } => {
                planned.push((
                    blob_name(*layer, *proj, *layout, part),
                    GgmlType::I8,
                    vec![0],
                ));
            }
        }
    }
    // Reserve room for the real manifest: every entry's JSON is bounded; be generous.
    let mut pm = plan.manifest(placeholder_entries, (0, 0));
    pm.sources = sources.clone();
    let reserve = serde_json::to_string(&pm)?.len() + 1024 + 700 * plan.items.len();
    let (ph, reserve) = header_for(&planned, &pm, reserve)?;
    let header_len = ph.header().len();

    let total: u64 = model.tensors.iter().map(|t| t.bytes).sum();
    let n_pass = plan
        .items
        .iter()
        .filter(|i| matches!(i, Item::Passthrough { .. }))
        .count();
    // Progress of the FFN part: each blob advances by its layer's source bytes / blobs per layer.
    let blobs_per_layer = (plan.items.len() - n_pass) as u64 / model.ffn_layers.len() as u64;
    let layer_bytes: Vec<u64> = model
        .ffn_layers
        .iter()
        .map(|l| {
            [&l.gate, &l.up, &l.down]
                .iter()
                .flat_map(|w| companions(w))
                .map(|i| model.tensors[i].bytes)
                .sum()
        })
        .collect();
    crate::atomic::write_atomic(out, |w| -> anyhow::Result<()> {
        w.write_all(&vec![0u8; header_len])?;
        let mut pos = 0u64; // data-relative
        let mut done = 0u64;
        let mut entries: Vec<TensorEntry> = Vec::with_capacity(plan.items.len());
        let mut seg_start = None;
        plan.produce(|name, bytes, mut entry| {
            if entries.len() == n_pass {
                seg_start = Some(pos);
            }
            entry.xxh3 = hex(xxh3_64(bytes));
            entry.bytes = bytes.len() as u64;
            let io = |e: std::io::Error| Error::Io {
                file: out.display().to_string(),
                err: e,
            };
            w.write_all(bytes).map_err(io)?;
            let padded = (bytes.len() as u64).div_ceil(PACK_ALIGNMENT) * PACK_ALIGNMENT;
            w.write_all(&vec![0u8; (padded - bytes.len() as u64) as usize])
                .map_err(io)?;
            pos += padded;
            done += match &entry.ffn {
                None => bytes.len() as u64,
                Some(fe) => {
                    layer_bytes[plan.layer_pos.get(&fe.layer).copied().unwrap_or(0)]
                        / blobs_per_layer.max(1)
                }
            };
            progress(done.min(total), total);
            debug_assert_eq!(name, entry.name);
            entries.push(entry);
            Ok(())
        })?;
        let seg = seg_start.map(|s| (s, pos - s)).unwrap_or((pos, 0));
        // The real header, same length as the placeholder.
        let real: Vec<(String, GgmlType, Vec<u64>)> = planned
            .iter()
            .zip(&entries)
            .map(|((name, ty, ne), e)| {
                assert_eq!(name, &e.name);
                if e.ffn.is_some() {
                    (name.clone(), GgmlType::I8, vec![e.bytes])
                } else {
                    (name.clone(), *ty, ne.clone())
                }
            })
            .collect();
        let mut man = plan.manifest(entries, seg);
        man.sources = sources.clone();
        let (rb, _) = header_for(&real, &man, reserve)?;
        let mut header = rb.header();
        // The checksum is the last KV: its value is the 8 bytes before the tensor infos.
        let at = rb.kv_end() - 8;
        let digest = crate::pack_check::header_digest(&header, at);
        header[at..at + 8].copy_from_slice(&digest.to_le_bytes());
        anyhow::ensure!(
            header.len() == header_len,
            "internal: header grew from {header_len} to {} bytes",
            header.len()
        );
        w.flush()?;
        let f = w.get_mut();
        f.seek(SeekFrom::Start(0))?;
        f.write_all(&header)?;
        f.seek(SeekFrom::End(0))?;
        progress(total, total);
        Ok(())
    })?;
    let pack = Pack::open(out)?;
    Ok(pack.manifest)
}

/// Copy the source's metadata: GGUF KVs byte for byte (minus `general.alignment` and `split.*`);
/// for safetensors, the architecture and the config and index files as strings.
fn copy_metadata(model: &Model, b: &mut GgufBuilder) {
    match &model.files[0] {
        SourceFile::Gguf(g) => {
            for kv in &g.kvs {
                if kv.key == "general.alignment"
                    || kv.key.starts_with("split.")
                    || kv.key.starts_with("metrale.pack.")
                {
                    continue;
                }
                b.add_raw_kv(&g.map[kv.span.clone()]);
            }
        }
        SourceFile::Safetensors(_) => {
            if let Some(a) = &model.architecture {
                b.add_kv("general.architecture", &Value::String(a.clone()));
            }
            let dir = model.files[0]
                .path()
                .parent()
                .unwrap_or(Path::new(""))
                .to_path_buf();
            for (key, file) in [
                ("metrale.source.config_json", "config.json"),
                (
                    "metrale.source.hf_quant_config_json",
                    "hf_quant_config.json",
                ),
            ] {
                if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
                    b.add_kv(key, &Value::String(text));
                }
            }
        }
    }
}

/// An opened, validated pack.
pub struct Pack {
    pub file: GgufFile,
    pub manifest: Manifest,
    /// Tensor index by name (`index` is called once per tensor by `verify --source`).
    by_name: HashMap<String, usize>,
}

impl Pack {
    /// Open `path` and check that it is a pack this build reads: format version, kernel ABI and
    /// target, and the manifest against the tensor table.
    pub fn open(path: &Path) -> Result<Pack> {
        let file = GgufFile::open(path)?;
        Self::from_gguf(file)
    }

    /// Validate an opened GGUF as a pack.
    pub fn from_gguf(file: GgufFile) -> Result<Pack> {
        let f = file.path.display().to_string();
        let reconvert = |what: String| Error::Metadata {
            file: f.clone(),
            key: "metrale.pack".into(),
            reason: format!(
                "{what}; re-convert the model with this metrale-pack ({CONVERTER_VERSION})"
            ),
        };
        let version = file.get(keys::FORMAT_VERSION).and_then(Value::as_u64);
        match version {
            None => {
                return Err(reconvert(
                    "not a metrale pack (no metrale.pack.format_version)".into(),
                ));
            }
            Some(v) if v != PACK_FORMAT_VERSION as u64 => {
                return Err(reconvert(format!(
                    "pack format version {v}, this build reads {PACK_FORMAT_VERSION}"
                )));
            }
            _ => {}
        }
        let abi = file.get(keys::KERNEL_ABI).and_then(Value::as_u64);
        if abi != Some(KERNEL_ABI_VERSION as u64) {
            return Err(reconvert(format!(
                "kernel ABI {abi:?}, this build's kernels need {KERNEL_ABI_VERSION}"
            )));
        }
        let arch = file
            .get(keys::TARGET_ARCH)
            .and_then(Value::as_str)
            .unwrap_or("?");
        if arch != TARGET_ARCH {
            return Err(reconvert(format!(
                "target {arch}, this build targets {TARGET_ARCH}"
            )));
        }
        if file.alignment != PACK_ALIGNMENT {
            return Err(reconvert(format!(
                "general.alignment {} (packs use {PACK_ALIGNMENT})",
                file.alignment
            )));
        }
        // Every header byte is as written before any of its numbers is used (the comparisons
        // above only decide whether this build reads the pack at all: "re-convert").
        crate::pack_check::check_header(&file)?;
        let json = file
            .get(keys::MANIFEST)
            .and_then(Value::as_str)
            .ok_or_else(|| reconvert("no metrale.pack.manifest".into()))?;
        let manifest: Manifest =
            serde_json::from_str(json.trim_end()).map_err(|e| Error::Json {
                file: f.clone(),
                field: keys::MANIFEST.into(),
                reason: e.to_string(),
            })?;
        if manifest.tensors.len() != file.tensors.len() {
            return Err(reconvert(format!(
                "manifest lists {} tensors, the file holds {}",
                manifest.tensors.len(),
                file.tensors.len()
            )));
        }
        for (e, t) in manifest.tensors.iter().zip(&file.tensors) {
            if e.name != t.name || e.bytes != t.bytes {
                return Err(Error::Tensor {
                    file: f.clone(),
                    tensor: t.name.clone(),
                    field: "manifest",
                    reason: format!(
                        "manifest says {} ({} bytes), tensor table says {} ({} bytes)",
                        e.name, e.bytes, t.name, t.bytes
                    ),
                });
            }
        }
        let seg = manifest.segment_offset..manifest.segment_offset + manifest.segment_bytes;
        for (e, t) in manifest.tensors.iter().zip(&file.tensors) {
            let inside = seg.contains(&t.offset) || (t.bytes == 0 && t.offset == seg.end);
            if e.ffn.is_some() != inside {
                return Err(Error::Tensor {
                    file: f.clone(),
                    tensor: t.name.clone(),
                    field: "offset",
                    reason: format!(
                        "{} the device segment {seg:?}",
                        if inside {
                            "passthrough tensor inside"
                        } else {
                            "FFN blob outside"
                        }
                    ),
                });
            }
        }
        crate::pack_check::check_manifest(&file, &manifest)?;
        let by_name = manifest
            .tensors
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name.clone(), i))
            .collect();
        Ok(Pack {
            file,
            manifest,
            by_name,
        })
    }

    /// Index of a tensor by name.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Bytes of tensor `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        self.file.tensor_data(i)
    }

    /// The device segment's bytes (absolute file range).
    pub fn segment_range(&self) -> std::ops::Range<u64> {
        let s = self.file.data_offset + self.manifest.segment_offset;
        s..s + self.manifest.segment_bytes
    }

    /// Tensor `i`'s bytes, read with `pread` (see [`GgufFile::read_range`]): an error, not
    /// SIGBUS, if the file shrinks meanwhile.
    pub fn read(&self, i: usize) -> Result<Vec<u8>> {
        let t = &self.file.tensors[i];
        let mut out = Vec::with_capacity(t.bytes as usize);
        self.file
            .read_range(t.file_offset, t.file_offset + t.bytes, &t.name, |c| {
                out.extend_from_slice(c)
            })?;
        Ok(out)
    }

    /// Check every tensor's xxh3 against the manifest; returns the names that differ. Reads
    /// with `pread`, so a file truncated while it is checked gives an error, not SIGBUS.
    pub fn verify_checksums(&self) -> Result<Vec<String>> {
        use rayon::prelude::*;
        let differs = (0..self.manifest.tensors.len())
            .into_par_iter()
            .map(|i| {
                let t = &self.file.tensors[i];
                let mut h = xxhash_rust::xxh3::Xxh3::new();
                self.file
                    .read_range(t.file_offset, t.file_offset + t.bytes, &t.name, |c| {
                        h.update(c)
                    })?;
                Ok((hex(h.digest()) != self.manifest.tensors[i].xxh3).then_some(i))
            })
            .collect::<Result<Vec<Option<usize>>>>()?;
        Ok(differs
            .into_iter()
            .flatten()
            .map(|i| self.manifest.tensors[i].name.clone())
            .collect())
    }

    /// Decode an FFN layout of one projection to f32 `[out, in]` (logical shape, padding
    /// removed). `name` is the blob name with or without its part suffix.
    pub fn decode_ffn(&self, name: &str) -> Result<(Vec<f32>, [u64; 2])> {
        let f = self.file.path.display().to_string();
        let nf = || Error::NotFound {
            file: f.clone(),
            tensor: name.into(),
        };
        let entry = self
            .manifest
            .tensors
            .iter()
            .find(|e| {
                e.name == name || (e.ffn.is_some() && e.name.starts_with(&format!("{name}.")))
            })
            .ok_or_else(nf)?;
        let fe = entry.ffn.as_ref().ok_or_else(nf)?;
        let layout = Layout::from_tag(&fe.layout).ok_or_else(nf)?;
        let proj = Proj::from_name(&fe.proj).ok_or_else(nf)?;
        let part = |p: &str| -> Result<&[u8]> {
            let n = blob_name(fe.layer, proj, layout, p);
            Ok(self.data(self.index(&n).ok_or_else(|| Error::NotFound {
                file: f.clone(),
                tensor: n.clone(),
            })?))
        };
        let [n, k] = fe.shape.map(|d| d as usize);
        let [np, kp] = fe.padded.map(|d| d as usize);
        let scalar = |s: &str| fe.scalars.get(s).copied().unwrap_or(0.0);
        let out = match layout {
            Layout::Nvfp4 => layouts::crop(
                &layouts::nvfp4::decode_padded(
                    part("codes")?,
                    part("scales")?,
                    scalar("global_scale"),
                    n,
                    kp,
                ),
                kp,
                n,
                k,
            ),
            Layout::Nvfp4T => {
                let (c, s) = layouts::nvfp4_t::to_nvfp4(part("codes")?, part("scales")?, n, np, kp);
                layouts::crop(
                    &layouts::nvfp4::decode_padded(&c, &s, scalar("global_scale"), n, kp),
                    kp,
                    n,
                    k,
                )
            }
            Layout::Nvfp4Mmq => {
                let (c, s) = layouts::nvfp4_mmq::to_nvfp4(part("")?, n, np, kp);
                layouts::crop(
                    &layouts::nvfp4::decode_padded(&c, &s, scalar("global_scale"), n, kp),
                    kp,
                    n,
                    k,
                )
            }
            Layout::Q4kMmq => {
                if self
                    .index(&blob_name(fe.layer, proj, layout, "codes"))
                    .is_some()
                {
                    layouts::q4k_mmq::decode_int8(part("codes")?, part("scales")?, n, k, kp)
                } else {
                    layouts::q4k_mmq::decode_q4k(part("")?, n, k, kp)
                }
            }
            Layout::Fp8 if proj == Proj::GateUp => {
                layouts::fp8::decode_fused(part("codes")?, part("scales")?, n / 2, k, kp)
            }
            Layout::Fp8 => layouts::crop(
                &layouts::fp8::decode_padded(part("codes")?, part("scales")?, np, kp),
                kp,
                n,
                k,
            ),
            Layout::W8a8 => layouts::w8a8::decode(part("codes")?, part("scales")?, n, k, kp),
            Layout::Bf16 => layouts::bf16::decode(part("")?, n, k, kp),
            Layout::Q2g128 => layouts::q2g128::decode(part("")?, n, k, kp),
            Layout::Lora => layouts::lora::decode_delta(
                part("a")?,
                part("b")?,
                n,
                k,
                scalar("rank") as usize,
                scalar("scaling"),
            ),
        };
        Ok((out, fe.shape))
    }
}

/// Outcome of `verify --source`.
#[derive(Debug, Default)]
pub struct SourceCheck {
    pub checked: usize,
    pub mismatched: Vec<String>,
}

/// Re-derive every tensor of `pack` from `source` with the pack's recorded options and compare
/// bit for bit.
pub fn verify_against_source(pack: &Pack, source: &Model) -> Result<SourceCheck> {
    let plan = Plan::new(source, &pack.manifest.options)?;
    let mut check = SourceCheck::default();
    let mut i = 0;
    plan.produce(|name, bytes, entry| {
        check.checked += 1;
        // The bytes and every manifest field that says how to read them (shape, padding,
        // scalars, source type) must be what the source gives.
        match pack.index(name) {
            Some(j)
                if j == i
                    && pack.read(j)? == bytes
                    && pack.manifest.tensors[j].ffn == entry.ffn
                    && pack.manifest.tensors[j].source_shape == entry.source_shape
                    && pack.manifest.tensors[j].source_type == entry.source_type => {}
            _ => check.mismatched.push(name.to_string()),
        }
        i += 1;
        Ok(())
    })?;
    if check.checked != pack.manifest.tensors.len() {
        check.mismatched.push(format!(
            "(the source yields {} tensors, the pack holds {})",
            check.checked,
            pack.manifest.tensors.len()
        ));
    }
    Ok(check)
}

/// Whether an opened GGUF is a pack.
pub fn is_pack(g: &GgufFile) -> bool {
    g.get(keys::FORMAT_VERSION).is_some()
}

/// The source format a pack came from.
pub fn source_format(m: &Manifest) -> Format {
    if m.source_format == "gguf" {
        Format::Gguf
    } else {
        Format::Safetensors
    }
}
