//! One model view over GGUF (single or split) and safetensors (single or sharded) checkpoints:
//! the tensor table, the dense FFN layers (gate/up/down) with how each weight is stored, hidden
//! and intermediate size and the activation. Every other tensor is carried as it is.

use crate::GgmlType;
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::safetensors_file::StFile;
use safetensors::Dtype;
use std::borrow::Cow;
use std::path::{Path, PathBuf};

mod bnb;
mod classify;
mod companions;
mod decode;
mod int_groups;
pub mod lora;
mod open;
mod quant_decl;
pub use quant_decl::{IntGrouping, QuantDecl};

/// The container a checkpoint came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A GGUF file (or split shards).
    Gguf,
    /// safetensors files with `config.json`.
    Safetensors,
}

impl Format {
    /// The format's name.
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
    /// A ggml type (GGUF).
    Ggml(GgmlType),
    /// A safetensors dtype.
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

    /// The type's name as its container spells it (`Q4_K`, `F8_E4M3`, ...): a static string
    /// for every type this build knows ([`type_name`]).
    pub fn name(&self) -> Cow<'static, str> {
        match self {
            DType::Ggml(t) => Cow::Borrowed(t.name()),
            DType::St(d) => type_name(format!("{d:?}")),
        }
    }
}

/// The safetensors dtype names (the `safetensors` crate's spelling, as its header writes them).
const ST_DTYPE_NAMES: &[&str] = &[
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
];

/// A source type name as a static string when it is a ggml type's or a safetensors dtype's
/// (a pack of 100k tensors holds one name per tensor: a copy each would be 3 MB), else as given.
pub fn type_name(name: String) -> Cow<'static, str> {
    GgmlType::from_name(&name)
        .map(GgmlType::name)
        .or_else(|| ST_DTYPE_NAMES.iter().copied().find(|&n| n == name))
        .map_or(Cow::Owned(name), Cow::Borrowed)
}

/// The FFN activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up`.
    Silu,
    /// `gelu(gate) * up` (tanh approximation).
    Gelu,
}

impl Activation {
    /// The `act` argument of the fused act-mul quantizers (`quantize_act_mul_fp8_*`,
    /// `quantize_act_mul_q8_1`): 0 SiLU, 1 GELU.
    pub fn kernel_arg(self) -> usize {
        match self {
            Activation::Silu => 0,
            Activation::Gelu => 1,
        }
    }

    /// The name in the manifest.
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
    /// The tensor's name in its file.
    pub name: crate::Name,
    /// Its stored type.
    pub dtype: DType,
    /// Row-major, outermost first.
    pub shape: Vec<u64>,
    /// Index into [`Model::files`].
    pub file: usize,
    /// Absolute offset in that file.
    pub offset: u64,
    /// Its data bytes.
    pub bytes: u64,
}

impl Tensor {
    /// The element count (every model's tensors were checked at open to have one that fits).
    pub fn elems(&self) -> u64 {
        crate::gguf::element_count(&self.shape).unwrap_or(u64::MAX)
    }
}

/// How one FFN projection weight is stored (indices into [`Model::tensors`]).
#[derive(Clone, Debug, PartialEq)]
pub enum FfnWeight {
    /// One tensor of a plain or ggml block type.
    Plain {
        /// The weight tensor.
        weight: usize,
    },
    /// A GGUF weight beside llama.cpp's per-tensor output scale (`blk.N.ffn_X.scale`, one F32
    /// value): llama.cpp multiplies the projection's output by it (NVFP4 files converted from
    /// ModelOpt carry its `weight_scale_2` there). Decoded, it is the weight times the scale.
    GgufScaled {
        /// The weight tensor (any ggml type).
        weight: usize,
        /// The one-value scale tensor.
        scale: usize,
    },
    /// ModelOpt NVFP4: U8 codes, F8_E4M3 block scales, F32 `weight_scale_2`.
    ModelOptNvfp4 {
        /// The packed E2M1 codes.
        weight: usize,
        /// The E4M3 block scales.
        scale: usize,
        /// The global `weight_scale_2`.
        scale_2: usize,
        /// The activation `input_scale`, if present (not used by the layouts).
        input_scale: Option<usize>,
    },
    /// compressed-tensors `nvfp4-pack-quantized`: `weight_global_scale` is 1 / ModelOpt's.
    CtNvfp4 {
        /// The packed E2M1 codes (`weight_packed`).
        packed: usize,
        /// The E4M3 block scales.
        scale: usize,
        /// `weight_global_scale`.
        global_scale: usize,
    },
    /// compressed-tensors `mxfp4-pack-quantized` (MXFP4A16): U8 E2M1 codes `[n, k/2]` and U8
    /// E8M0 scales `[n, k/32]` (`converters::mxfp4_ct`).
    CtMxfp4 {
        /// The packed E2M1 codes (`weight_packed`).
        packed: usize,
        /// The E8M0 group scales (`weight_scale`).
        scale: usize,
    },
    /// Block FP8, 128x128: F8_E4M3 `[n, k]` and a float scale grid `[ceil(n/128), ceil(k/128)]`
    /// (DeepSeek's `weight_scale_inv`, or compressed-tensors' `weight_scale` with the block strategy).
    Fp8Block {
        /// The E4M3 weight.
        weight: usize,
        /// The scale grid.
        scale_inv: usize,
    },
    /// Per-channel FP8: F8_E4M3 `[n, k]` and a float `weight_scale [n, 1]`.
    Fp8Channel {
        /// The E4M3 weight.
        weight: usize,
        /// The per-row scales.
        scale: usize,
    },
    /// Per-tensor FP8: F8_E4M3 `[n, k]` and one float `weight_scale` (`[]` or `[1]`).
    Fp8Tensor {
        /// The E4M3 weight.
        weight: usize,
        /// The one scale.
        scale: usize,
    },
    /// compressed-tensors integer codes (`converters::ct_int`): `int-quantized` (I8 `weight`)
    /// or `pack-quantized` (I32 `weight_packed` and I64 `weight_shape`), a float `weight_scale`
    /// per tensor, row or group, and for asymmetric schemes `weight_zero_point`.
    CtInt {
        /// The codes: the I8 `weight`, or the I32 `weight_packed`.
        weight: usize,
        /// The float scales.
        scale: usize,
        /// The zero points (asymmetric schemes).
        zero_point: Option<usize>,
        /// `weight_shape` of a packed weight (`None`: one I8 code per element).
        shape: Option<usize>,
        /// Bits per code (8 for `int-quantized`).
        bits: u32,
    },
    /// AutoAWQ's GEMM packing (`quant_method: awq`, `version: gemm`): I32 `qweight [k, n/8]`
    /// and `qzeros [G, n/8]`, eight 4-bit codes a word in AWQ's order, F16 `scales [G, n]`
    /// (`converters::awq`).
    Awq {
        /// The packed codes.
        qweight: usize,
        /// The packed zero points.
        qzeros: usize,
        /// The group scales.
        scales: usize,
    },
    /// GPTQ's own packing (`quant_method: gptq`, v1 zero points): I32 `qweight
    /// [k * bits / 32, n]`, I32 `qzeros [G, n * bits / 32]`, F16 `scales [G, n]`, I32 `g_idx
    /// [k]` and AutoGPTQ's all-zero `bias` (`converters::gptq`).
    Gptq {
        /// The packed codes.
        qweight: usize,
        /// The packed zero points, each stored minus one.
        qzeros: usize,
        /// The group scales.
        scales: usize,
        /// Each input channel's group (absent: `i / group`).
        g_idx: Option<usize>,
        /// AutoGPTQ's bias (all zeros for a model without biases; others are refused).
        bias: Option<usize>,
        /// Bits per code: 2, 4 or 8.
        bits: u32,
    },
    /// bitsandbytes 4-bit, NF4 or FP4 (`converters::bnb`): U8 `weight` (two codes a byte),
    /// `weight.absmax`, the 16-value `weight.quant_map` and the JSON
    /// `weight.quant_state.bitsandbytes__nf4` (or `__fp4`); double-quantized, the absmax is U8
    /// codes of `weight.nested_quant_map` with `weight.nested_absmax`.
    Bnb4 {
        /// The packed codes.
        weight: usize,
        /// The block absmax (F32, or U8 codes when double-quantized).
        absmax: usize,
        /// The code table.
        quant_map: usize,
        /// `nested_absmax` and `nested_quant_map` of a double-quantized absmax.
        nested: Option<(usize, usize)>,
        /// The quant state (U8 bytes of a JSON object).
        state: usize,
        /// NF4 (`true`) or FP4, from the quant state's name.
        nf4: bool,
    },
    /// bitsandbytes LLM.int8 (`converters::bnb`): I8 `weight [n, k]`, F32 `SCB [n]` (each row's
    /// absmax) and `weight_format` (0: rows).
    BnbInt8 {
        /// The codes.
        weight: usize,
        /// The row absmax.
        scb: usize,
        /// `weight_format`, where saved.
        format: Option<usize>,
    },
    /// One half of a fused gate+up weight (Phi-3's `gate_up_proj` / GGUF `ffn_up` of `2 * I`
    /// rows): rows `half * I .. (half + 1) * I` of `of` (0: the gate, 1: the up projection).
    Half {
        /// The fused weight.
        of: Box<FfnWeight>,
        /// 0 for the gate (the first `I` rows), 1 for the up projection.
        half: u8,
    },
}

impl FfnWeight {
    /// The main tensor (its name identifies the weight).
    pub fn main(&self) -> usize {
        match *self {
            FfnWeight::Plain { weight }
            | FfnWeight::GgufScaled { weight, .. }
            | FfnWeight::ModelOptNvfp4 { weight, .. }
            | FfnWeight::Fp8Block { weight, .. }
            | FfnWeight::Fp8Channel { weight, .. }
            | FfnWeight::Fp8Tensor { weight, .. }
            | FfnWeight::CtInt { weight, .. }
            | FfnWeight::Bnb4 { weight, .. }
            | FfnWeight::BnbInt8 { weight, .. } => weight,
            FfnWeight::Awq { qweight, .. } | FfnWeight::Gptq { qweight, .. } => qweight,
            FfnWeight::CtNvfp4 { packed, .. } | FfnWeight::CtMxfp4 { packed, .. } => packed,
            FfnWeight::Half { ref of, .. } => of.main(),
        }
    }

    /// Every tensor the weight is read from (the main one first).
    pub fn tensors(&self) -> Vec<usize> {
        match *self {
            FfnWeight::Plain { weight } => vec![weight],
            FfnWeight::GgufScaled { weight, scale } => vec![weight, scale],
            // `input_scale` (the W4A4 activation scale) is not part of the weight: it is
            // carried as a passthrough tensor under its own name.
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
            FfnWeight::CtMxfp4 { packed, scale } => vec![packed, scale],
            FfnWeight::Fp8Block { weight, scale_inv } => vec![weight, scale_inv],
            FfnWeight::Fp8Channel { weight, scale } | FfnWeight::Fp8Tensor { weight, scale } => {
                vec![weight, scale]
            }
            FfnWeight::CtInt {
                weight,
                scale,
                zero_point,
                shape,
                ..
            } => [Some(weight), Some(scale), zero_point, shape]
                .into_iter()
                .flatten()
                .collect(),
            FfnWeight::Half { ref of, .. } => of.tensors(),
            FfnWeight::Bnb4 {
                weight,
                absmax,
                quant_map,
                nested,
                state,
                ..
            } => {
                let mut v = vec![weight, absmax, quant_map, state];
                v.extend(nested.into_iter().flat_map(|(a, m)| [a, m]));
                v
            }
            FfnWeight::BnbInt8 {
                weight,
                scb,
                format,
            } => [Some(weight), Some(scb), format]
                .into_iter()
                .flatten()
                .collect(),
            FfnWeight::Awq {
                qweight,
                qzeros,
                scales,
            } => vec![qweight, qzeros, scales],
            FfnWeight::Gptq {
                qweight,
                qzeros,
                scales,
                g_idx,
                bias,
                ..
            } => [Some(qweight), Some(qzeros), Some(scales), g_idx, bias]
                .into_iter()
                .flatten()
                .collect(),
        }
    }
    /// A short name of the storage scheme.
    pub fn scheme(&self) -> &'static str {
        match self {
            FfnWeight::Plain { .. } => "plain",
            FfnWeight::GgufScaled { .. } => "gguf-output-scale",
            FfnWeight::ModelOptNvfp4 { .. } => "modelopt-nvfp4",
            FfnWeight::CtNvfp4 { .. } => "compressed-tensors-nvfp4",
            FfnWeight::CtMxfp4 { .. } => "compressed-tensors-mxfp4",
            FfnWeight::Fp8Block { .. } => "fp8-block128",
            FfnWeight::Fp8Channel { .. } => "fp8-channel",
            FfnWeight::Fp8Tensor { .. } => "fp8-tensor",
            FfnWeight::CtInt { bits: 4, .. } => "compressed-tensors-int4",
            FfnWeight::CtInt { bits: 8, .. } => "compressed-tensors-int8",
            FfnWeight::CtInt { .. } => "compressed-tensors-int",
            FfnWeight::Half { of, .. } => of.scheme(),
            FfnWeight::Awq { .. } => "awq-gemm-int4",
            FfnWeight::Gptq { bits: 2, .. } => "gptq-int2",
            FfnWeight::Gptq { bits: 4, .. } => "gptq-int4",
            FfnWeight::Gptq { .. } => "gptq-int8",
            FfnWeight::Bnb4 { nf4: true, .. } => "bitsandbytes-nf4",
            FfnWeight::Bnb4 { .. } => "bitsandbytes-fp4",
            FfnWeight::BnbInt8 { .. } => "bitsandbytes-int8",
        }
    }
}

/// An FP8 weight-scale strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Kind {
    /// One scale for the tensor.
    Tensor,
    /// One scale per output row.
    Channel,
    /// One scale per 128x128 block.
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

/// The three projections of one dense FFN layer.
#[derive(Clone, Debug)]
pub struct FfnLayer {
    /// The layer index.
    pub index: usize,
    /// The gate projection.
    pub gate: FfnWeight,
    /// The up projection.
    pub up: FfnWeight,
    /// The down projection.
    pub down: FfnWeight,
}

/// A mapped source file.
pub enum SourceFile {
    /// A GGUF file.
    Gguf(GgufFile),
    /// A safetensors file.
    Safetensors(StFile),
}

impl SourceFile {
    /// The file's path.
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
        crate::gguf::release_pages(map, start, end);
    }

    /// An error if the file shrank or was replaced since it was mapped (`crate::mapguard`):
    /// what was read from it may be zeros.
    pub fn check_intact(&self) -> Result<()> {
        let (map, guard, file) = match self {
            SourceFile::Gguf(g) => (&g.map, &g.guard, &g.file),
            SourceFile::Safetensors(s) => (&s.map, &s.guard, &s.file),
        };
        crate::mapguard::check(self.path(), file, map.len() as u64, guard)
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
    /// GGUF or safetensors.
    pub format: Format,
    /// The path the user gave.
    pub path: PathBuf,
    /// The files opened. A GGUF's tensor infos have moved into [`Model::tensors`] (its
    /// `tensors` list is empty here).
    pub files: Vec<SourceFile>,
    /// Every tensor of every file.
    pub tensors: Vec<Tensor>,
    /// Tensor indices sorted by name, for lookup by binary search (a name map would hold a
    /// second copy of every name: a file of a million tensors is mostly names).
    by_name: Vec<usize>,
    /// `general.architecture` or `model_type`.
    pub architecture: Option<String>,
    /// Hidden size, when the metadata says.
    pub hidden_size: Option<u64>,
    /// Intermediate size, when the metadata says.
    pub intermediate_size: Option<u64>,
    /// The FFN activation, when the metadata says.
    pub activation: Option<Activation>,
    /// Attention heads and KV heads, when the metadata says (GGUF `{arch}.attention.head_count`
    /// and `head_count_kv`; `config.json` `num_attention_heads` and `num_key_value_heads`): the
    /// tensor-parallel split of attention needs them.
    pub heads: Option<(u64, u64)>,
    /// Quantization scheme the config declares, if any.
    pub quantization: Option<String>,
    /// What the config declares about quantized weights.
    pub quant: QuantDecl,
    /// The dense FFN layers found, in layer order (not always `0..n`: see `moe_layers`).
    pub ffn_layers: Vec<FfnLayer>,
    /// Layers whose FFN is a mixture of experts: carried as they are, named by `inspect` and
    /// `convert`.
    pub moe_layers: Vec<usize>,
}

impl Model {
    /// Every file this model was read from: the tensor files, the path the user gave and, for
    /// safetensors, the side files beside them (`config.json`, `hf_quant_config.json`, the index).
    pub fn input_paths(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.files.iter().map(|f| f.path().to_path_buf()).collect();
        v.push(self.path.clone());
        if self.format == Format::Safetensors {
            let dir = self.files[0].path().parent().unwrap_or(Path::new(""));
            for side in [
                "config.json",
                "quantize_config.json",
                "hf_quant_config.json",
                "model.safetensors.index.json",
            ] {
                v.push(dir.join(side));
            }
        }
        v
    }

    /// Every file a convert of this model reads: [`Model::input_paths`], and with a LoRA
    /// adapter folder its `adapter_model.safetensors` and `adapter_config.json` (an output
    /// that is any of them is refused).
    pub fn convert_inputs(&self, lora: Option<&Path>) -> Vec<PathBuf> {
        let mut v = self.input_paths();
        if let Some(dir) = lora {
            v.extend(["adapter_model.safetensors", "adapter_config.json"].map(|f| dir.join(f)));
        }
        v
    }

    /// An error naming the first file that shrank or was replaced since the model was opened:
    /// callers that read a source ask this before they call a result good.
    pub fn check_intact(&self) -> Result<()> {
        self.files.iter().try_for_each(SourceFile::check_intact)
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
}
