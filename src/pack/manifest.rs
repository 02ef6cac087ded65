//! The manifest (`metrale.pack.manifest`, JSON) and the conversion options it records.

use crate::converters::layouts::{Layout, q4k_mmq::DownFormat};
use crate::model::Activation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

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
