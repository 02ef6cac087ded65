//! One model view over GGUF (single or split) and safetensors (single or sharded) checkpoints:
//! the tensor table, the dense FFN layers (gate/up/down) with how each weight is stored, hidden
//! and intermediate size and the activation. Every other tensor is carried as it is.

use crate::GgmlType;
use crate::converters::{self, fp8, fp8_block, fp8_row, nvfp4_modelopt};
use crate::error::{Error, Result};
use crate::gguf::{self, GgufFile, Value};
use crate::safetensors_file::{self, StFile};
use safetensors::Dtype;
use std::path::{Path, PathBuf};

/// The container a checkpoint came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gguf,
    Safetensors,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Gguf => "gguf",
            Format::Safetensors => "safetensors",
        }
    }
}

/// A tensor's storage type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    Ggml(GgmlType),
    St(Dtype),
}

impl DType {
    /// The ggml type with the same bytes: itself for GGUF; F32, F16, BF16, F64, I8..I64 for
    /// safetensors; `None` for dtypes ggml has no type for (U8, FP8, FP4, ...).
    pub fn as_ggml(&self) -> Option<GgmlType> {
        match *self {
            DType::Ggml(t) => Some(t),
            DType::St(d) => match d {
                Dtype::F32 => Some(GgmlType::F32),
                Dtype::F16 => Some(GgmlType::F16),
                Dtype::BF16 => Some(GgmlType::BF16),
                Dtype::F64 => Some(GgmlType::F64),
                Dtype::I8 => Some(GgmlType::I8),
                Dtype::I16 => Some(GgmlType::I16),
                Dtype::I32 => Some(GgmlType::I32),
                Dtype::I64 => Some(GgmlType::I64),
                _ => None,
            },
        }
    }

    /// The type's name as its container spells it (`Q4_K`, `F8_E4M3`, ...).
    pub fn name(&self) -> String {
        match self {
            DType::Ggml(t) => t.name().to_string(),
            DType::St(d) => format!("{d:?}"),
        }
    }
}

/// The FFN activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    Gelu,
}

impl Activation {
    pub fn name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::Gelu => "gelu",
        }
    }
    /// From a HF `hidden_act` / GGUF architecture hint.
    pub fn from_act_name(s: &str) -> Option<Self> {
        let s = s.to_ascii_lowercase();
        if s == "silu" || s == "swish" || s == "swiglu" {
            Some(Activation::Silu)
        } else if s.starts_with("gelu") || s == "geglu" {
            Some(Activation::Gelu)
        } else {
            None
        }
    }
}

/// One tensor in the model.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    /// Row-major, outermost first.
    pub shape: Vec<u64>,
    /// Index into [`Model::files`].
    pub file: usize,
    /// Absolute offset in that file.
    pub offset: u64,
    pub bytes: u64,
}

impl Tensor {
    /// The element count (every model's tensors were checked at open to have one that fits).
    pub fn elems(&self) -> u64 {
        self.shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// How one FFN projection weight is stored (indices into [`Model::tensors`]).
#[derive(Clone, Debug, PartialEq)]
pub enum FfnWeight {
    /// One tensor of a plain or ggml block type.
    Plain { weight: usize },
    /// ModelOpt NVFP4: U8 codes, F8_E4M3 block scales, F32 `weight_scale_2`.
    ModelOptNvfp4 {
        weight: usize,
        scale: usize,
        scale_2: usize,
        input_scale: Option<usize>,
    },
    /// compressed-tensors `nvfp4-pack-quantized`: `weight_global_scale` is 1 / ModelOpt's.
    CtNvfp4 {
        packed: usize,
        scale: usize,
        global_scale: usize,
    },
    /// Block FP8, 128x128: F8_E4M3 `[n, k]` and a float scale grid `[ceil(n/128), ceil(k/128)]`
    /// (DeepSeek's `weight_scale_inv`, or compressed-tensors' `weight_scale` with the block strategy).
    Fp8Block { weight: usize, scale_inv: usize },
    /// Per-channel FP8: F8_E4M3 `[n, k]` and a float `weight_scale [n, 1]`.
    Fp8Channel { weight: usize, scale: usize },
    /// Per-tensor FP8: F8_E4M3 `[n, k]` and one float `weight_scale` (`[]` or `[1]`).
    Fp8Tensor { weight: usize, scale: usize },
}

impl FfnWeight {
    /// The main tensor (its name identifies the weight).
    pub fn main(&self) -> usize {
        match *self {
            FfnWeight::Plain { weight }
            | FfnWeight::ModelOptNvfp4 { weight, .. }
            | FfnWeight::Fp8Block { weight, .. }
            | FfnWeight::Fp8Channel { weight, .. }
            | FfnWeight::Fp8Tensor { weight, .. } => weight,
            FfnWeight::CtNvfp4 { packed, .. } => packed,
        }
    }
    /// A short name of the storage scheme.
    pub fn scheme(&self) -> &'static str {
        match self {
            FfnWeight::Plain { .. } => "plain",
            FfnWeight::ModelOptNvfp4 { .. } => "modelopt-nvfp4",
            FfnWeight::CtNvfp4 { .. } => "compressed-tensors-nvfp4",
            FfnWeight::Fp8Block { .. } => "fp8-block128",
            FfnWeight::Fp8Channel { .. } => "fp8-channel",
            FfnWeight::Fp8Tensor { .. } => "fp8-tensor",
        }
    }
}

/// An FP8 weight-scale strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Kind {
    Tensor,
    Channel,
    Block,
}

impl Fp8Kind {
    fn name(self) -> &'static str {
        match self {
            Fp8Kind::Tensor => "per-tensor",
            Fp8Kind::Channel => "per-channel",
            Fp8Kind::Block => "block 128x128",
        }
    }
}

/// What a checkpoint's config declares about its quantized weights (`config.json`
/// `quantization_config`, or ModelOpt's `hf_quant_config.json`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantDecl {
    /// `quant_method` (`compressed-tensors`, `fp8`, `modelopt`), or `modelopt ALGO`.
    pub method: Option<String>,
    /// The FP8 weight strategies declared; empty when the config declares none (then a weight's
    /// scheme follows from its scale tensor's full shape alone).
    pub fp8: Vec<Fp8Kind>,
}

impl QuantDecl {
    /// Read the declaration, refusing schemes this tool cannot decode (naming the config field).
    pub fn parse(
        file: &str,
        qc: Option<&serde_json::Value>,
        hf_quant_algo: Option<&str>,
    ) -> Result<QuantDecl> {
        let bad = |field: String, reason: String| Error::Json {
            file: file.into(),
            field,
            reason,
        };
        let mut d = QuantDecl::default();
        let block_128 = |field: &str, v: Option<&serde_json::Value>| -> Result<()> {
            match v.and_then(|b| b.as_array()) {
                Some(b) if b.len() == 2 && b.iter().all(|x| x.as_u64() == Some(128)) => Ok(()),
                None => Ok(()),
                Some(b) => Err(bad(
                    field.into(),
                    format!("block {b:?}: only 128x128 FP8 blocks are supported"),
                )),
            }
        };
        if let Some(qc) = qc {
            d.method = qc
                .get("quant_method")
                .and_then(|m| m.as_str())
                .map(str::to_string);
            if d.method.as_deref() == Some("fp8") {
                let wbs = qc.get("weight_block_size");
                block_128("quantization_config.weight_block_size", wbs)?;
                d.fp8.push(if wbs.is_some() {
                    Fp8Kind::Block
                } else {
                    Fp8Kind::Tensor
                });
            }
            if let Some(groups) = qc.get("config_groups").and_then(|g| g.as_object()) {
                for (gname, g) in groups {
                    let Some(w) = g.get("weights").filter(|w| !w.is_null()) else {
                        continue;
                    };
                    let field =
                        |f: &str| format!("quantization_config.config_groups.{gname}.weights.{f}");
                    let ty = w.get("type").and_then(|t| t.as_str()).unwrap_or("");
                    let bits = w.get("num_bits").and_then(|b| b.as_u64()).unwrap_or(0);
                    let strategy = w.get("strategy").and_then(|t| t.as_str()).unwrap_or("");
                    match (ty, bits, strategy) {
                        ("float", 8, "tensor") => d.fp8.push(Fp8Kind::Tensor),
                        ("float", 8, "channel") => d.fp8.push(Fp8Kind::Channel),
                        ("float", 8, "block") => {
                            block_128(&field("block_structure"), w.get("block_structure"))?;
                            d.fp8.push(Fp8Kind::Block)
                        }
                        ("float", 4, "tensor_group") => {
                            let gs = w.get("group_size").and_then(|b| b.as_u64());
                            if gs != Some(16) {
                                return Err(bad(
                                    field("group_size"),
                                    format!("{gs:?}: NVFP4 needs group_size 16"),
                                ));
                            }
                        }
                        // ModelOpt's config_groups carry no strategy; its quant_algo says.
                        ("float", 8, "") => {}
                        ("float", 8, other) => {
                            return Err(bad(
                                field("strategy"),
                                format!(
                                    "FP8 strategy {other:?} is not supported (tensor, channel and block 128x128 are)"
                                ),
                            ));
                        }
                        _ => {}
                    }
                }
            }
        }
        let algo = qc
            .and_then(|q| q.get("quant_algo"))
            .and_then(|a| a.as_str())
            .or(hf_quant_algo);
        if let Some(algo) = algo {
            if d.method.is_none() {
                d.method = Some(format!("modelopt {algo}"));
            }
            if algo == "FP8" {
                d.fp8.push(Fp8Kind::Tensor);
            }
        }
        d.fp8.dedup();
        Ok(d)
    }
}

/// The three projections of one dense FFN layer.
#[derive(Clone, Debug)]
pub struct FfnLayer {
    pub index: usize,
    pub gate: FfnWeight,
    pub up: FfnWeight,
    pub down: FfnWeight,
}

/// A mapped source file.
pub enum SourceFile {
    Gguf(GgufFile),
    Safetensors(StFile),
}

impl SourceFile {
    pub fn path(&self) -> &Path {
        match self {
            SourceFile::Gguf(g) => &g.path,
            SourceFile::Safetensors(s) => &s.path,
        }
    }
    /// Drop this process's mapped pages inside `[start, end)` (page-aligned inward).
    pub fn release(&self, start: u64, end: u64) {
        let map = match self {
            SourceFile::Gguf(g) => &g.map,
            SourceFile::Safetensors(s) => &s.map,
        };
        const PAGE: u64 = 4096;
        let (start, end) = (
            start.div_ceil(PAGE) * PAGE,
            (end / PAGE * PAGE).min(map.len() as u64),
        );
        if end > start {
            // SAFETY: the map is a read-only, file-backed mapping; MADV_DONTNEED on it only
            // discards this process's page-table entries, and later reads fault the unchanged
            // file contents back in, so no slice into the range changes.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start as usize,
                    (end - start) as usize,
                )
            };
        }
    }

    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        match self {
            SourceFile::Gguf(g) => &g.map,
            SourceFile::Safetensors(s) => &s.map,
        }
    }
}

/// A checkpoint, opened and validated.
pub struct Model {
    pub format: Format,
    /// The path the user gave.
    pub path: PathBuf,
    pub files: Vec<SourceFile>,
    pub tensors: Vec<Tensor>,
    /// Tensor indices sorted by name, for lookup by binary search (a name map would hold a
    /// second copy of every name: a file of a million tensors is mostly names).
    by_name: Vec<usize>,
    pub architecture: Option<String>,
    pub hidden_size: Option<u64>,
    pub intermediate_size: Option<u64>,
    pub activation: Option<Activation>,
    /// Quantization scheme the config declares, if any.
    pub quantization: Option<String>,
    /// What the config declares about quantized weights.
    pub quant: QuantDecl,
    pub ffn_layers: Vec<FfnLayer>,
}

impl Model {
    /// Open a `.gguf` file (split models through any shard), a `.safetensors` file, a
    /// `model.safetensors.index.json`, or a directory holding one of them.
    pub fn open(path: &Path) -> Result<Model> {
        let file = path.display().to_string();
        if path.is_dir() {
            for cand in ["model.safetensors.index.json", "model.safetensors"] {
                if path.join(cand).exists() {
                    return Self::open(&path.join(cand));
                }
            }
            let mut ggufs: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|err| Error::Io {
                    file: file.clone(),
                    err,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
                .collect();
            ggufs.sort();
            return match ggufs.first() {
                Some(g) => Self::open(g),
                None => Err(Error::Unsupported {
                    file,
                    reason: "directory holds no model.safetensors(.index.json) and no .gguf".into(),
                }),
            };
        }
        gguf::require_regular(path)?;
        let mut head = [0u8; 4];
        let n = {
            use std::io::Read;
            let mut f = std::fs::File::open(path).map_err(|err| Error::Io {
                file: file.clone(),
                err,
            })?;
            f.read(&mut head).map_err(|err| Error::Io {
                file: file.clone(),
                err,
            })?
        };
        let name = path
            .file_name()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default();
        if &head[..n] == gguf::MAGIC || name.ends_with(".gguf") {
            Self::open_gguf(path)
        } else if name.ends_with(".index.json") {
            let (shards, _) = safetensors_file::read_index(path)?;
            Self::open_safetensors(path, shards)
        } else if name.ends_with(".safetensors") {
            Self::open_safetensors(path, vec![path.to_path_buf()])
        } else {
            Err(Error::Unsupported {
                file,
                reason: "not a GGUF file, a .safetensors file, an index.json or a model directory"
                    .into(),
            })
        }
    }

    fn open_gguf(path: &Path) -> Result<Model> {
        let first = GgufFile::open(path)?;
        let split_count = first
            .get("split.count")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        let mut files = vec![first];
        if split_count > 1 {
            let file = path.display().to_string();
            let (paths, n) = gguf::split_paths(path).ok_or_else(|| Error::Split {
                file: file.clone(),
                reason: format!("split.count = {split_count} but the name is not NAME-00001-of-{split_count:05}.gguf"),
            })?;
            if n as u64 != split_count {
                return Err(Error::Split {
                    file,
                    reason: format!("split.count = {split_count} but the name says {n}"),
                });
            }
            // Reopen from shard 1 in order, whichever shard the user named.
            files.clear();
            for (i, p) in paths.iter().enumerate() {
                let g = GgufFile::open(p)?;
                let no = g.get("split.no").and_then(Value::as_u64);
                let cnt = g.get("split.count").and_then(Value::as_u64);
                if no != Some(i as u64) || cnt != Some(split_count) {
                    return Err(Error::Split {
                        file: p.display().to_string(),
                        reason: format!(
                            "split.no = {no:?}, split.count = {cnt:?}; expected {i} and {split_count}"
                        ),
                    });
                }
                files.push(g);
            }
            let total: usize = files.iter().map(|g| g.tensors.len()).sum();
            if let Some(want) = files[0].get("split.tensors.count").and_then(Value::as_u64)
                && want != total as u64
            {
                return Err(Error::Split {
                    file: files[0].path.display().to_string(),
                    reason: format!(
                        "split.tensors.count = {want} but the shards hold {total} tensors"
                    ),
                });
            }
        }
        let mut tensors = Vec::new();
        for (fi, g) in files.iter().enumerate() {
            for t in &g.tensors {
                tensors.push(Tensor {
                    name: t.name.clone(),
                    dtype: DType::Ggml(t.ty),
                    shape: t.shape(),
                    file: fi,
                    offset: t.file_offset,
                    bytes: t.bytes,
                });
            }
        }
        let arch = files[0]
            .get("general.architecture")
            .and_then(Value::as_str)
            .map(str::to_string);
        let key = |k: &str| {
            arch.as_ref()
                .and_then(|a| files[0].get(&format!("{a}.{k}")).cloned())
        };
        let hidden = key("embedding_length").and_then(|v| v.as_u64());
        let inter = key("feed_forward_length").and_then(|v| match v {
            Value::Array(_, xs) => xs.iter().filter_map(Value::as_u64).max(),
            v => v.as_u64(),
        });
        let activation = arch.as_deref().map(|a| {
            if a.starts_with("gemma") || a == "bert" || a == "nomic-bert" || a == "gpt2" {
                Activation::Gelu
            } else {
                Activation::Silu
            }
        });
        let files: Vec<SourceFile> = files.into_iter().map(SourceFile::Gguf).collect();
        Self::assemble(
            Format::Gguf,
            path,
            files,
            tensors,
            arch,
            hidden,
            inter,
            activation,
            QuantDecl::default(),
        )
    }

    fn open_safetensors(path: &Path, shards: Vec<PathBuf>) -> Result<Model> {
        let mut files = Vec::new();
        let mut tensors = Vec::new();
        for (fi, p) in shards.iter().enumerate() {
            let st = StFile::open(p)?;
            for t in &st.tensors {
                tensors.push(Tensor {
                    name: t.name.clone(),
                    dtype: DType::St(t.dtype),
                    shape: t.shape.clone(),
                    file: fi,
                    offset: t.file_offset,
                    bytes: t.bytes,
                });
            }
            files.push(SourceFile::Safetensors(st));
        }
        let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
        let cfg_path = dir.join("config.json");
        let cfg = cfg_path
            .exists()
            .then(|| safetensors_file::read_json(&cfg_path))
            .transpose()?;
        let get = |k: &str| cfg.as_ref().and_then(|c| c.get(k));
        let arch = get("model_type")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let hidden = get("hidden_size").and_then(|v| v.as_u64());
        let inter = get("intermediate_size").and_then(|v| v.as_u64());
        let activation = get("hidden_act")
            .or_else(|| get("hidden_activation"))
            .and_then(|v| v.as_str())
            .and_then(Activation::from_act_name);
        let hf_quant = dir.join("hf_quant_config.json");
        let hf_algo = hf_quant
            .exists()
            .then(|| safetensors_file::read_json(&hf_quant))
            .transpose()?
            .and_then(|v| {
                v.pointer("/quantization/quant_algo")
                    .and_then(|a| a.as_str())
                    .map(str::to_string)
            });
        let quant = QuantDecl::parse(
            &cfg_path.display().to_string(),
            get("quantization_config"),
            hf_algo.as_deref(),
        )?;
        Self::assemble(
            Format::Safetensors,
            path,
            files,
            tensors,
            arch,
            hidden,
            inter,
            activation,
            quant,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        format: Format,
        path: &Path,
        files: Vec<SourceFile>,
        tensors: Vec<Tensor>,
        architecture: Option<String>,
        hidden: Option<u64>,
        inter: Option<u64>,
        activation: Option<Activation>,
        quant: QuantDecl,
    ) -> Result<Model> {
        // Shapes whose dimensions overflow int64 in any order (a zero dimension does not excuse
        // the others: `elems` and every decoder multiply them in their own order).
        for t in &tensors {
            let fits = t.shape.iter().filter(|&&d| d != 0).try_fold(1u64, |a, &d| {
                a.checked_mul(d).filter(|&p| p <= i64::MAX as u64)
            });
            if fits.is_none() {
                return Err(Error::Tensor {
                    file: files[t.file].path().display().to_string(),
                    tensor: t.name.clone(),
                    field: "shape",
                    reason: format!("{:?} overflows int64", t.shape),
                });
            }
        }
        let mut by_name: Vec<usize> = (0..tensors.len()).collect();
        by_name.sort_unstable_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
        if let Some(w) = by_name
            .windows(2)
            .find(|w| tensors[w[0]].name == tensors[w[1]].name)
        {
            let t = &tensors[w[1].max(w[0])];
            return Err(Error::DuplicateTensor {
                file: files[t.file].path().display().to_string(),
                tensor: t.name.clone(),
            });
        }
        let mut m = Model {
            format,
            path: path.to_path_buf(),
            files,
            tensors,
            by_name,
            architecture,
            hidden_size: hidden,
            intermediate_size: inter,
            activation,
            quantization: quant.method.clone(),
            quant,
            ffn_layers: Vec::new(),
        };
        m.ffn_layers = m.find_ffn_layers();
        if let Some(l) = m.ffn_layers.first() {
            let s = m.weight_shape(&l.gate)?;
            m.intermediate_size.get_or_insert(s[0]);
            m.hidden_size.get_or_insert(s[1]);
        }
        if m.activation.is_none() && !m.ffn_layers.is_empty() {
            m.activation = Some(Activation::Silu);
        }
        Ok(m)
    }

    fn find_ffn_layers(&self) -> Vec<FfnLayer> {
        let mut layers = Vec::new();
        for index in 0.. {
            let names: [String; 3] = match self.format {
                Format::Gguf => ["gate", "up", "down"].map(|p| format!("blk.{index}.ffn_{p}")),
                Format::Safetensors => {
                    ["gate", "up", "down"].map(|p| format!("model.layers.{index}.mlp.{p}_proj"))
                }
            };
            let [g, u, d] = names.map(|n| self.classify(&n));
            let (Some(gate), Some(up), Some(down)) = (g, u, d) else {
                break;
            };
            layers.push(FfnLayer {
                index,
                gate,
                up,
                down,
            });
        }
        layers
    }

    fn classify(&self, prefix: &str) -> Option<FfnWeight> {
        let idx = |s: &str| self.index_of(&format!("{prefix}.{s}"));
        if let (Some(packed), Some(scale), Some(global_scale)) = (
            idx("weight_packed"),
            idx("weight_scale"),
            idx("weight_global_scale"),
        ) {
            return Some(FfnWeight::CtNvfp4 {
                packed,
                scale,
                global_scale,
            });
        }
        let weight = idx("weight")?;
        let dt = self.tensors[weight].dtype;
        match (
            dt,
            idx("weight_scale"),
            idx("weight_scale_2"),
            idx("weight_scale_inv"),
        ) {
            (DType::St(Dtype::U8), Some(scale), Some(scale_2), _) => {
                Some(FfnWeight::ModelOptNvfp4 {
                    weight,
                    scale,
                    scale_2,
                    input_scale: idx("input_scale"),
                })
            }
            (DType::St(Dtype::F8_E4M3), _, _, Some(scale_inv)) => {
                Some(FfnWeight::Fp8Block { weight, scale_inv })
            }
            (DType::St(Dtype::F8_E4M3), Some(scale), None, None) => {
                Some(match self.fp8_kind(weight, scale) {
                    Fp8Kind::Tensor => FfnWeight::Fp8Tensor { weight, scale },
                    Fp8Kind::Channel => FfnWeight::Fp8Channel { weight, scale },
                    Fp8Kind::Block => FfnWeight::Fp8Block {
                        weight,
                        scale_inv: scale,
                    },
                })
            }
            _ => Some(FfnWeight::Plain { weight }),
        }
    }

    /// The FP8 strategies a `weight_scale` of this full shape fits, for a `[n, k]` weight.
    fn fp8_fits(&self, weight: usize, scale: usize) -> Vec<Fp8Kind> {
        let s = &self.tensors[scale].shape;
        let [n, k] = match self.tensors[weight].shape[..] {
            [n, k] => [n, k],
            _ => return Vec::new(),
        };
        let (gn, gk) = fp8_block::scale_grid(n as usize, k as usize);
        let mut v = Vec::new();
        if s.is_empty() || s[..] == [1] {
            v.push(Fp8Kind::Tensor);
        }
        if s[..] == [n, 1] || s[..] == [n] {
            v.push(Fp8Kind::Channel);
        }
        if s[..] == [gn as u64, gk as u64] {
            v.push(Fp8Kind::Block);
        }
        v
    }

    /// The strategy of an FP8 `weight_scale`: the declared one its shape fits (the config
    /// decides; shapes never by element count), else the one its shape fits. A shape that fits
    /// none is reported by [`Model::weight_shape`].
    fn fp8_kind(&self, weight: usize, scale: usize) -> Fp8Kind {
        let fits = self.fp8_fits(weight, scale);
        let pick = if self.quant.fp8.is_empty() {
            fits.first()
        } else {
            fits.iter().find(|k| self.quant.fp8.contains(k))
        };
        pick.copied()
            .or_else(|| self.quant.fp8.first().copied())
            .unwrap_or(Fp8Kind::Channel)
    }

    /// Values of a scale tensor stored as F32, BF16 or F16 (the libraries write all three), as
    /// f32 (exact: every BF16 and F16 value is an f32).
    pub fn floats(&self, t: usize, what: &str) -> Result<Vec<f32>> {
        let b = self.data(t);
        Ok(match self.tensors[t].dtype {
            DType::St(Dtype::F32) => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::St(Dtype::BF16) => b
                .chunks_exact(2)
                .map(|c| converters::bf16::to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            DType::St(Dtype::F16) => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            ref other => {
                return Err(self.qerr(
                    t,
                    format!("{what}: expected F32, BF16 or F16, found {}", other.name()),
                ));
            }
        })
    }

    /// A quantized weight (NVFP4 or FP8, of any module, FFN or not) whose main tensor is `name`
    /// (`...weight` or `...weight_packed`); `None` for a plain tensor.
    pub fn quantized_weight_named(&self, name: &str) -> Option<FfnWeight> {
        let prefix = name
            .strip_suffix(".weight_packed")
            .or_else(|| name.strip_suffix(".weight"))?;
        let w = self.classify(prefix)?;
        (w.main() == self.index_of(name)? && !matches!(w, FfnWeight::Plain { .. })).then_some(w)
    }

    /// Every file this model was read from: the tensor files, the path the user gave and, for
    /// safetensors, the side files beside them (`config.json`, `hf_quant_config.json`, the index).
    pub fn input_paths(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.files.iter().map(|f| f.path().to_path_buf()).collect();
        v.push(self.path.clone());
        if self.format == Format::Safetensors {
            let dir = self.files[0].path().parent().unwrap_or(Path::new(""));
            for side in [
                "config.json",
                "hf_quant_config.json",
                "model.safetensors.index.json",
            ] {
                v.push(dir.join(side));
            }
        }
        v
    }

    /// The first file as GGUF, if it is one (its metadata is the model's).
    pub fn files_gguf0(&self) -> &GgufFile {
        match &self.files[0] {
            SourceFile::Gguf(g) => g,
            SourceFile::Safetensors(_) => panic!("not a GGUF model"),
        }
    }

    /// The file a tensor lives in, for messages.
    pub fn file_of(&self, t: usize) -> String {
        self.files[self.tensors[t].file]
            .path()
            .display()
            .to_string()
    }

    /// The stored bytes of tensor `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        let t = &self.tensors[i];
        &self.files[t.file].bytes()[t.offset as usize..(t.offset + t.bytes) as usize]
    }

    /// Drop this process's mapped pages of tensor `i` (they stay in the page cache), so that
    /// streaming through a model keeps the resident set at one layer, not the whole file.
    pub fn release(&self, i: usize) {
        let t = &self.tensors[i];
        self.files[t.file].release(t.offset, t.offset + t.bytes);
    }

    /// The index of the tensor named `name`, if there is one.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name
            .binary_search_by(|&i| self.tensors[i].name.as_str().cmp(name))
            .ok()
            .map(|k| self.by_name[k])
    }

    /// Look a tensor up by name.
    pub fn tensor(&self, name: &str) -> Result<usize> {
        self.index_of(name).ok_or_else(|| Error::NotFound {
            file: self.path.display().to_string(),
            tensor: name.into(),
        })
    }

    /// Decode a plain tensor (any ggml type with a decoder, or a safetensors float/int type) to
    /// f32 in its logical shape.
    pub fn decode_tensor(&self, i: usize) -> Result<Vec<f32>> {
        let t = &self.tensors[i];
        let bytes = self.data(i);
        let n = t.elems() as usize;
        let codec_err = |err| Error::Codec {
            file: self.file_of(i),
            tensor: t.name.clone(),
            err,
        };
        let mut out = vec![0f32; n];
        let Some(ggml) = t.dtype.as_ggml() else {
            let DType::St(d) = t.dtype else {
                unreachable!("every ggml type maps to itself")
            };
            let dec: fn(u8) -> f32 = match d {
                Dtype::U8 => |b| b as f32,
                Dtype::F8_E4M3 => fp8::e4m3_to_f32,
                Dtype::F8_E5M2 => fp8::e5m2_to_f32,
                other => {
                    return Err(Error::Unsupported {
                        file: self.file_of(i),
                        reason: format!(
                            "tensor {}: decoding safetensors dtype {other:?} is not supported",
                            t.name
                        ),
                    });
                }
            };
            out.iter_mut().zip(bytes).for_each(|(o, &b)| *o = dec(b));
            return Ok(out);
        };
        converters::decode_ggml(ggml, bytes, &mut out).map_err(codec_err)?;
        Ok(out)
    }

    fn qerr(&self, t: usize, reason: String) -> Error {
        Error::Quantized {
            file: self.file_of(t),
            tensor: self.tensors[t].name.clone(),
            reason,
        }
    }

    fn expect(&self, t: usize, dtype: Dtype, shape: &[u64], what: &str) -> Result<()> {
        let tt = &self.tensors[t];
        if tt.dtype != DType::St(dtype) || tt.shape != shape {
            return Err(self.qerr(
                t,
                format!(
                    "{what}: expected {dtype:?} {shape:?}, found {} {:?}",
                    tt.dtype.name(),
                    tt.shape
                ),
            ));
        }
        Ok(())
    }

    /// A one-element scale (`[]` or `[1]`) stored as F32, BF16 or F16.
    pub fn scalar_f32(&self, t: usize, what: &str) -> Result<f32> {
        let tt = &self.tensors[t];
        if !(tt.shape.is_empty() || tt.shape[..] == [1]) {
            return Err(self.qerr(
                t,
                format!(
                    "{what}: expected one value (shape [] or [1]), found {} {:?}",
                    tt.dtype.name(),
                    tt.shape
                ),
            ));
        }
        let v = self.floats(t, what)?;
        v.first()
            .copied()
            .ok_or_else(|| self.qerr(t, format!("{what}: no value")))
    }

    /// A scale companion must have exactly `want` as its shape and a float dtype.
    fn expect_scale(&self, t: usize, want: &[&[u64]], what: &str, scheme: &str) -> Result<()> {
        let tt = &self.tensors[t];
        let float = matches!(
            tt.dtype,
            DType::St(Dtype::F32) | DType::St(Dtype::BF16) | DType::St(Dtype::F16)
        );
        if !float || !want.contains(&&tt.shape[..]) {
            return Err(self.qerr(
                t,
                format!(
                    "{what}: {scheme} needs a float scale of shape {}, found {} {:?}",
                    want.iter()
                        .map(|s| format!("{s:?}"))
                        .collect::<Vec<_>>()
                        .join(" or "),
                    tt.dtype.name(),
                    tt.shape
                ),
            ));
        }
        Ok(())
    }

    /// The logical `[out, in]` shape of an FFN weight, its companions checked against it.
    pub fn weight_shape(&self, w: &FfnWeight) -> Result<[u64; 2]> {
        let two = |t: usize| -> Result<[u64; 2]> {
            match self.tensors[t].shape[..] {
                [a, b] => Ok([a, b]),
                ref s => Err(self.qerr(t, format!("expected a 2-D weight, found shape {s:?}"))),
            }
        };
        // An FP8 scale that the config's declared scheme does not fit is named with both shapes.
        let fp8_declared = |weight: usize, scale: usize, kind: Fp8Kind| -> Result<()> {
            let fits = self.fp8_fits(weight, scale);
            if !fits.contains(&kind)
                || (!self.quant.fp8.is_empty() && !self.quant.fp8.contains(&kind))
            {
                let declared = if self.quant.fp8.is_empty() {
                    "no FP8 scheme declared".to_string()
                } else {
                    format!(
                        "the config declares {}",
                        self.quant
                            .fp8
                            .iter()
                            .map(|k| k.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(self.qerr(
                    scale,
                    format!(
                        "scale shape {:?} fits no FP8 scheme {declared} for weight {} {:?} (per-tensor [] or [1], per-channel [n, 1], block [ceil(n/128), ceil(k/128)])",
                        self.tensors[scale].shape,
                        self.tensors[weight].name,
                        self.tensors[weight].shape
                    ),
                ));
            }
            Ok(())
        };
        Ok(match *w {
            FfnWeight::Plain { weight } => two(weight)?,
            FfnWeight::ModelOptNvfp4 { weight, scale, .. }
            | FfnWeight::CtNvfp4 {
                packed: weight,
                scale,
                ..
            } => {
                let [n, kh] = two(weight)?;
                self.expect(weight, Dtype::U8, &[n, kh], "packed E2M1 codes")?;
                let k = kh * 2;
                if k % 16 != 0 {
                    return Err(self.qerr(weight, format!("NVFP4 K = {k} is not a multiple of 16")));
                }
                self.expect(scale, Dtype::F8_E4M3, &[n, k / 16], "block scales")?;
                match *w {
                    FfnWeight::ModelOptNvfp4 { scale_2, .. } => {
                        self.scalar_f32(scale_2, "weight_scale_2")?;
                    }
                    FfnWeight::CtNvfp4 { global_scale, .. } => {
                        self.scalar_f32(global_scale, "weight_global_scale")?;
                    }
                    _ => {}
                }
                [n, k]
            }
            FfnWeight::Fp8Block { weight, scale_inv } => {
                let [n, k] = two(weight)?;
                self.expect(weight, Dtype::F8_E4M3, &[n, k], "FP8 codes")?;
                let (gn, gk) = fp8_block::scale_grid(n as usize, k as usize);
                if self.tensors[scale_inv].name.ends_with("weight_scale") {
                    fp8_declared(weight, scale_inv, Fp8Kind::Block)?;
                }
                self.expect_scale(
                    scale_inv,
                    &[&[gn as u64, gk as u64]],
                    "block scales",
                    "block FP8",
                )?;
                [n, k]
            }
            FfnWeight::Fp8Channel { weight, scale } => {
                let [n, k] = two(weight)?;
                self.expect(weight, Dtype::F8_E4M3, &[n, k], "FP8 codes")?;
                fp8_declared(weight, scale, Fp8Kind::Channel)?;
                self.expect_scale(scale, &[&[n, 1], &[n]], "weight_scale", "per-channel FP8")?;
                [n, k]
            }
            FfnWeight::Fp8Tensor { weight, scale } => {
                let [n, k] = two(weight)?;
                self.expect(weight, Dtype::F8_E4M3, &[n, k], "FP8 codes")?;
                fp8_declared(weight, scale, Fp8Kind::Tensor)?;
                self.expect_scale(scale, &[&[], &[1]], "weight_scale", "per-tensor FP8")?;
                [n, k]
            }
        })
    }

    /// Decode a quantized or plain weight to f32 `[out, in]`, applying its scales in the order
    /// its library does (so the result equals the library's own f32 dequantization bit for bit).
    pub fn decode_weight(&self, w: &FfnWeight) -> Result<(Vec<f32>, [u64; 2])> {
        let shape = self.weight_shape(w)?;
        let (n, k) = (shape[0] as usize, shape[1] as usize);
        let len = n
            .checked_mul(k)
            .ok_or_else(|| self.qerr(w.main(), format!("shape {shape:?} overflows")))?;
        let out = match *w {
            FfnWeight::Plain { weight } => self.decode_tensor(weight)?,
            FfnWeight::ModelOptNvfp4 {
                weight,
                scale,
                scale_2,
                ..
            } => {
                let s2 = self.scalar_f32(scale_2, "weight_scale_2")?;
                let mut out = vec![0f32; len];
                nvfp4_modelopt::decode_source(
                    self.data(weight),
                    self.data(scale),
                    nvfp4_modelopt::BlockScale::TimesGlobal(s2),
                    &mut out,
                );
                out
            }
            FfnWeight::CtNvfp4 {
                packed,
                scale,
                global_scale,
            } => {
                let g = self.scalar_f32(global_scale, "weight_global_scale")?;
                let mut out = vec![0f32; len];
                nvfp4_modelopt::decode_source(
                    self.data(packed),
                    self.data(scale),
                    nvfp4_modelopt::BlockScale::OverGlobal(g),
                    &mut out,
                );
                out
            }
            FfnWeight::Fp8Block { weight, scale_inv } => {
                let mut out = vec![0f32; len];
                let s = self.floats(scale_inv, "block scales")?;
                fp8_block::decode(self.data(weight), &s, n, k, &mut out);
                out
            }
            FfnWeight::Fp8Channel { weight, scale } | FfnWeight::Fp8Tensor { weight, scale } => {
                let mut s = self.floats(scale, "weight_scale")?;
                if s.len() == 1 {
                    s = vec![s[0]; n];
                }
                let mut out = vec![0f32; len];
                fp8_row::decode(self.data(weight), &s, k, &mut out);
                out
            }
        };
        Ok((out, shape))
    }

    /// The FFN weight whose main tensor is `name`, if any.
    pub fn ffn_weight_named(&self, name: &str) -> Option<&FfnWeight> {
        let i = self.index_of(name)?;
        self.ffn_layers
            .iter()
            .flat_map(|l| [&l.gate, &l.up, &l.down])
            .find(|w| w.main() == i)
    }
}
