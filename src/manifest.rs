//! The manifest (`metrale.pack.manifest`, JSON) and the conversion options it records.

use crate::converters::layouts::{Layout, q4k_mmq::DownFormat};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Conversion options.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConvertOptions {
    /// Layouts to build for every FFN layer; `None` = the set that keeps the source's quantized
    /// weights (`pack::choice::default_for`), else the defaults for the model's activation.
    pub layouts: Option<Vec<Layout>>,
    /// How `q4k_mmq` stores the down projection.
    pub q4k_down: DownFormat,
    /// A PEFT LoRA adapter directory (adds the `lora` layout).
    pub lora: Option<PathBuf>,
    /// Name patterns (`*` and `?` wildcards) of passthrough tensors kept out of the device
    /// segment (`--host-tensors`): the engine keeps them on the host.
    #[serde(default)]
    pub host_tensors: Vec<String>,
    /// Tensor-parallel ranks (`--tp N`): 1 for a single-GPU pack; N splits every FFN layer
    /// and the llama-style attention into N rank segments (formats.md, "Tensor-parallel packs").
    #[serde(default = "one")]
    pub tp: u32,
    /// Carry NaN and infinite FFN weights (`--allow-nonfinite`; only the `bf16` layout holds
    /// them). Without it a non-finite weight is refused, naming tensor, row and column.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_nonfinite: bool,
    /// With `--tp`, copy mixture-of-experts layers whole onto every rank (`--replicate-moe`)
    /// instead of refusing the model.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replicate_moe: bool,
}

fn one() -> u32 {
    1
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            layouts: None,
            q4k_down: DownFormat::Int8,
            lora: None,
            host_tensors: Vec::new(),
            tp: 1,
            allow_nonfinite: false,
            replicate_moe: false,
        }
    }
}

/// One source file in the manifest.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SourceInfo {
    /// The source file's name.
    pub name: String,
    /// Its size.
    pub bytes: u64,
    /// Its XXH3-64 (hex).
    pub xxh3: String,
}

/// The model facts the loader needs.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelInfo {
    /// The source architecture.
    pub architecture: Option<String>,
    /// Hidden size.
    pub hidden_size: u64,
    /// Intermediate size.
    pub intermediate_size: u64,
    /// `silu` or `gelu`.
    pub activation: String,
    /// Dense FFN layers converted.
    pub ffn_layers: usize,
    /// The converted layers' indices where they are not `0..ffn_layers` (dense layers between
    /// mixture-of-experts ones); empty: `0..ffn_layers`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dense_layers: Vec<usize>,
    /// Layers whose FFN is a mixture of experts: their tensors are carried as they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moe_layers: Vec<usize>,
}

impl ModelInfo {
    /// The indices of the converted FFN layers, in order.
    pub fn layer_indices(&self) -> Vec<usize> {
        if self.dense_layers.is_empty() {
            (0..self.ffn_layers).collect()
        } else {
            self.dense_layers.clone()
        }
    }
}

/// A 64-bit checksum as JSON: a string of exactly 16 lowercase hex digits (held as a number, a
/// pack of 100k tensors holds 100k of them).
mod hex64 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{v:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let hex = s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !hex {
            return Err(D::Error::custom(format!(
                "xxh3 {s:?} is not 16 lowercase hex digits"
            )));
        }
        u64::from_str_radix(&s, 16).map_err(D::Error::custom)
    }
}

/// Read a source type name, held static when known.
fn static_type_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Cow<'static, str>, D::Error> {
    String::deserialize(d).map(crate::model::type_name)
}

/// One tensor of the pack.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TensorEntry {
    /// The tensor's name in the pack.
    pub name: crate::Name,
    /// Present for repacked FFN blobs.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ffn: Option<Box<FfnEntry>>,
    /// In the device segment (every FFN blob, and every passthrough tensor that
    /// `--host-tensors` does not keep on the host).
    pub device: bool,
    /// The source tensor's type (`Q4_1`, `BF16`, `F8_E4M3`, ...); for FFN blobs the main tensor's.
    /// Held as a static string when this build knows the type ([`crate::model::type_name`]).
    #[serde(deserialize_with = "static_type_name")]
    pub source_type: Cow<'static, str>,
    /// For passthrough tensors stored as I8 blobs (safetensors dtypes with no ggml type), the
    /// source shape; otherwise absent.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_shape: Option<Box<[u64]>>,
    /// Its data bytes.
    pub bytes: u64,
    /// xxh3-64 of the tensor's bytes (padding excluded), written as 16 hex digits.
    #[serde(with = "hex64")]
    pub xxh3: u64,
    /// In a tensor-parallel pack, the rank this tensor is a slice for and how it was cut;
    /// absent for replicated and host tensors.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tp: Option<Box<TpSlice>>,
}

/// How one tensor of a tensor-parallel pack was cut from its source (formats.md,
/// "Tensor-parallel packs").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TpSlice {
    /// The rank that loads it.
    pub rank: u32,
    /// The rule applied: `ffn_rows` (gate, up, the fused gate_up), `ffn_cols` (down), `q_rows`,
    /// `kv_rows`, `o_cols`.
    pub rule: String,
    /// The source tensor (its main tensor for FFN weights).
    pub source: String,
    /// The rows (`*_rows`) or columns (`*_cols`) `[start, end)` of the source's logical
    /// `[out, in]` this tensor holds; for FFN blobs, the intermediate range.
    pub range: [u64; 2],
    /// Zero rows (`*_rows`) or columns (`*_cols`) appended after the range: FFN slices are
    /// padded to a multiple of `TP_INTER_ALIGN`; 0 for attention slices.
    #[serde(default)]
    pub pad: u64,
}

/// The tensor-parallel layout of a pack's device segment: the replicated range then one range
/// per rank, each contiguous and page-aligned, together exactly the device segment.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TpInfo {
    /// The rank count N.
    pub ranks: u32,
    /// Attention heads and KV heads the split followed, when the model has attention.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub heads: Option<[u64; 2]>,
    /// Data-relative `[offset, bytes]` of the replicated range (the segment's start).
    pub replicated: [u64; 2],
    /// Data-relative `[offset, bytes]` of each rank's segment, in rank order.
    pub rank_segments: Vec<[u64; 2]>,
}

/// The relative error of one layout's decoded weights against the source's own decoded weights,
/// `||decoded - source|| / ||source||` in float64 over the logical `[out, in]` (the absolute
/// `||decoded - source||` where the source is all zeros), over the FFN layers.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Fidelity {
    /// The layout tag.
    pub layout: String,
    /// `gate`, `up`, `down` or `gate_up`.
    pub proj: String,
    /// The largest relative error over the layers.
    pub worst_rel_err: f64,
    /// The layer where it occurs.
    pub worst_layer: usize,
    /// The mean relative error over the layers.
    pub mean_rel_err: f64,
}

/// What an FFN blob is.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FfnEntry {
    /// The layer index.
    pub layer: usize,
    /// `gate`, `up`, `down` or `gate_up`.
    pub proj: String,
    /// The layout tag.
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

/// The manifest (`metrale.pack.manifest`, JSON). Serialized through [`ManifestOut`].
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Manifest {
    /// The pack format version.
    pub pack_format_version: u32,
    /// The converter that wrote it.
    pub converter_version: String,
    /// The target architecture (`sm_90`).
    pub target_arch: String,
    /// The kernel ABI the layouts are for.
    pub kernel_abi: u32,
    /// The source files.
    pub sources: Vec<SourceInfo>,
    /// `gguf` or `safetensors`.
    pub source_format: String,
    /// The options it was converted with.
    pub options: ConvertOptions,
    /// The layouts it holds.
    pub layouts: Vec<String>,
    /// The model.
    pub model: ModelInfo,
    /// Data-section-relative offset and length of the device segment.
    pub segment_offset: u64,
    /// The device segment's length.
    pub segment_bytes: u64,
    /// Every tensor of the pack, in file order.
    #[serde(deserialize_with = "tensor_list")]
    pub tensors: Vec<TensorEntry>,
    /// What each layout costs in weight fidelity, per layout and projection (absent in packs
    /// written before it was measured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fidelity: Vec<Fidelity>,
    /// Present in a tensor-parallel pack (`--tp N`, N > 1).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tp: Option<TpInfo>,
}

/// The tensor list, grown by an eighth at a time and fitted at the end: a `Vec` doubling
/// while 100k entries arrive held up to twice their size (JSON gives no count ahead).
fn tensor_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<TensorEntry>, D::Error> {
    struct List;
    impl<'de> serde::de::Visitor<'de> for List {
        type Value = Vec<TensorEntry>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of tensor entries")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut v = Vec::new();
            while let Some(e) = seq.next_element()? {
                if v.len() == v.capacity() {
                    v.reserve_exact(v.len() / 8 + 16);
                }
                v.push(e);
            }
            v.shrink_to_fit();
            Ok(v)
        }
    }
    d.deserialize_seq(List)
}

/// A manifest serialized with its tensor list given apart: `head`'s own `tensors` are not
/// written; `tensors` (any sequence of entries) is, in their place. A converter derives its
/// entries while they are written instead of holding 100k of them; [`Manifest`]'s own
/// serialization is this with its own list, so the two cannot differ.
pub struct ManifestOut<'a, T: Serialize> {
    /// Every field but the tensor list.
    pub head: &'a Manifest,
    /// The tensor list.
    pub tensors: T,
}

impl<T: Serialize> Serialize for ManifestOut<'_, T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let m = self.head;
        let mut st = s.serialize_struct("Manifest", 14)?;
        st.serialize_field("pack_format_version", &m.pack_format_version)?;
        st.serialize_field("converter_version", &m.converter_version)?;
        st.serialize_field("target_arch", &m.target_arch)?;
        st.serialize_field("kernel_abi", &m.kernel_abi)?;
        st.serialize_field("sources", &m.sources)?;
        st.serialize_field("source_format", &m.source_format)?;
        st.serialize_field("options", &m.options)?;
        st.serialize_field("layouts", &m.layouts)?;
        st.serialize_field("model", &m.model)?;
        st.serialize_field("segment_offset", &m.segment_offset)?;
        st.serialize_field("segment_bytes", &m.segment_bytes)?;
        st.serialize_field("tensors", &self.tensors)?;
        if m.fidelity.is_empty() {
            st.skip_field("fidelity")?;
        } else {
            st.serialize_field("fidelity", &m.fidelity)?;
        }
        match &m.tp {
            None => st.skip_field("tp")?,
            Some(tp) => st.serialize_field("tp", tp)?,
        }
        st.end()
    }
}

impl Serialize for Manifest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ManifestOut {
            head: self,
            tensors: &self.tensors,
        }
        .serialize(s)
    }
}

/// Whether `name` matches the glob `pattern` (`*`: any run of characters, `?`: one character).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative match with one backtrack point (the last `*`).
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// The layer a tensor name belongs to (`blk.N.`, `layers.N.`, `layer.N.`, `h.N.`), if any.
pub fn layer_of(name: &str) -> Option<usize> {
    let parts: Vec<&str> = name.split('.').collect();
    parts.windows(2).find_map(|w| {
        matches!(w[0], "blk" | "layers" | "layer" | "h")
            .then(|| w[1].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn globs_and_layer_names() {
        use super::{glob_match as g, layer_of};
        assert!(g("token_embd.weight", "token_embd.weight"));
        assert!(g("*embd*", "token_embd.weight"));
        assert!(g("blk.?.attn_*", "blk.3.attn_q.weight"));
        assert!(!g("blk.?.attn_*", "blk.12.attn_q.weight"));
        assert!(g("*", ""));
        assert!(!g("a*b", "acd"));
        assert!(g("a*b*c", "axxbyyc"));
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("model.layers.3.self_attn.q_proj.weight"), Some(3));
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(layer_of("output.weight"), None);
    }

    /// A checksum is written as 16 lowercase hex digits, leading zeros kept, and read back
    /// only in that form.
    #[test]
    fn checksums_are_sixteen_hex_digits() {
        use super::TensorEntry;
        let e = TensorEntry {
            name: "t".into(),
            ffn: None,
            device: true,
            source_type: "F32".into(),
            source_shape: None,
            bytes: 4,
            xxh3: 0x00ab_cdef_0123_4567,
            tp: None,
        };
        let j = serde_json::to_string(&e).unwrap();
        assert!(j.contains(r#""xxh3":"00abcdef01234567""#), "{j}");
        assert_eq!(serde_json::from_str::<TensorEntry>(&j).unwrap(), e);
        for bad in [
            "abcdef01234567",
            "00ABCDEF01234567",
            "00abcdef0123456g",
            "-0abcdef01234567",
        ] {
            let j = j.replace("00abcdef01234567", bad);
            let err = serde_json::from_str::<TensorEntry>(&j)
                .unwrap_err()
                .to_string();
            assert!(err.contains("16 lowercase hex digits"), "{bad}: {err}");
        }
    }
}
