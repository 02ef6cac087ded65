//! What a checkpoint's config declares about its quantized weights (`config.json`
//! `quantization_config`, AutoGPTQ's `quantize_config.json`, ModelOpt's
//! `hf_quant_config.json`): read, with every scheme this tool does not read refused by field.

use super::*;

/// What a checkpoint's config declares about its quantized weights (`config.json`
/// `quantization_config`, or ModelOpt's `hf_quant_config.json`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QuantDecl {
    /// `quant_method` (`compressed-tensors`, `fp8`, `modelopt`), or `modelopt ALGO`.
    pub method: Option<String>,
    /// The FP8 weight strategies declared; empty when the config declares none (then a weight's
    /// scheme follows from its scale tensor's full shape alone).
    pub fp8: Vec<Fp8Kind>,
    /// The integer weight widths declared (compressed-tensors `type: int` groups).
    pub int_bits: Vec<u32>,
    /// GPTQ's code width (`quant_method: gptq`, `bits`: 2, 4 or 8).
    pub gptq_bits: Option<u32>,
    /// GPTQ's declared `group_size` (-1: one group a row), checked against each weight's
    /// scales.
    pub gptq_group: Option<i64>,
    /// The integer weights' declared scale grouping (compressed-tensors `strategy` and
    /// `group_size`), when the config groups declare one: checked against each weight's scale.
    pub int_grouping: Option<IntGrouping>,
}

/// How a checkpoint declares its integer weights' scales are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntGrouping {
    /// One scale for the tensor.
    Tensor,
    /// One scale a row.
    Channel,
    /// One scale per `group` values of a row.
    Group(u64),
}

/// A config field that must be an integer when present: `None` when absent or null, else its
/// value, or an error naming `field` (a string `"4"` is refused, not read as absent).
fn int_field(
    v: Option<&serde_json::Value>,
    field: &str,
    bad: &dyn Fn(String, String) -> Error,
) -> Result<Option<i64>> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(x) => x
            .as_i64()
            .map(Some)
            .ok_or_else(|| bad(field.into(), format!("{x}: an integer is expected"))),
    }
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
            if let Some(m) = d.method.as_deref()
                && !READ_METHODS.contains(&m)
            {
                return Err(Error::Unsupported {
                    file: file.into(),
                    reason: format!(
                        "quantization_config.quant_method {m:?}{}: weights quantized this way are not read yet (read: {})",
                        unread_detail(m, qc),
                        READ_METHODS.join(", ")
                    ),
                });
            }
            // bitsandbytes' 4-bit codes packed into another storage dtype (`bnb_4bit_quant_storage`
            // bf16, ...) are not read: its default, U8, is.
            if d.method.as_deref() == Some("bitsandbytes")
                && let Some(st) = qc.get("bnb_4bit_quant_storage")
                && st.as_str() != Some("uint8")
                && qc.get("load_in_4bit").and_then(|v| v.as_bool()) == Some(true)
            {
                return Err(bad(
                    "quantization_config.bnb_4bit_quant_storage".into(),
                    format!("{st}: 4-bit codes stored as uint8 are read"),
                ));
            }
            if d.method.as_deref() == Some("awq") {
                let version = qc.get("version").and_then(|v| v.as_str()).unwrap_or("gemm");
                let bits = qc.get("bits").and_then(|v| v.as_u64());
                if !version.eq_ignore_ascii_case("gemm") {
                    return Err(bad(
                        "quantization_config.version".into(),
                        format!("AWQ {version:?} packing is not read (AutoAWQ's \"gemm\" is)"),
                    ));
                }
                if bits != Some(4) {
                    return Err(bad(
                        "quantization_config.bits".into(),
                        format!("{bits:?}: AWQ GEMM packing holds 4-bit codes"),
                    ));
                }
            }
            if d.method.as_deref() == Some("gptq") {
                d.gptq_bits = Some(gptq_bits(qc, &bad)?);
                d.gptq_group =
                    int_field(qc.get("group_size"), "quantization_config.group_size", &bad)?;
            }
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
                let several_int_groups = groups
                    .values()
                    .filter(|g| g.pointer("/weights/type").and_then(|t| t.as_str()) == Some("int"))
                    .count()
                    > 1;
                for (gname, g) in groups {
                    config_group(&mut d, gname, g, several_int_groups, &bad, &block_128)?;
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
        d.int_bits.sort_unstable();
        d.int_bits.dedup();
        Ok(d)
    }
}

/// One `config_groups` entry of a compressed-tensors declaration (`gname`, `g`) into `d`:
/// its weights' scheme, refused (naming the field) where this tool does not read it.
fn config_group(
    d: &mut QuantDecl,
    gname: &str,
    g: &serde_json::Value,
    several_int_groups: bool,
    bad: &dyn Fn(String, String) -> Error,
    block_128: &dyn Fn(&str, Option<&serde_json::Value>) -> Result<()>,
) -> Result<()> {
    let Some(w) = g.get("weights").filter(|w| !w.is_null()) else {
        return Ok(());
    };
    let field = |f: &str| format!("quantization_config.config_groups.{gname}.weights.{f}");
    let ty = w.get("type").and_then(|t| t.as_str()).unwrap_or("");
    let bits = int_field(w.get("num_bits"), &field("num_bits"), &bad)?;
    let bits = bits.map_or(0, |b| b.clamp(0, 64) as u64);
    let strategy = w.get("strategy").and_then(|t| t.as_str()).unwrap_or("");
    let group_size = int_field(w.get("group_size"), &field("group_size"), &bad)?;
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
        // MXFP4 (llm-compressor's MXFP4A16): E2M1 codes with an E8M0 scale per 32.
        ("float", 4, "group") => {
            if group_size != Some(32) {
                return Err(bad(
                    field("group_size"),
                    format!(
                        "{group_size:?}: float 4-bit weights in groups are read as MXFP4, whose group_size is 32"
                    ),
                ));
            }
        }
        // ModelOpt's config_groups carry no strategy; its quant_algo says.
        ("float", 8 | 4, "") => {}
        ("float", 8, other) => {
            return Err(bad(
                field("strategy"),
                format!(
                    "FP8 strategy {other:?} is not supported (tensor, channel and block 128x128 are)"
                ),
            ));
        }
        ("int", 1..=8, "tensor" | "channel" | "group" | "") => {
            if w.get("actorder").and_then(|a| a.as_str()) == Some("group") {
                return Err(bad(
                        field("actorder"),
                                        "act-order groups (weight_g_idx) are not read yet; a checkpoint without actorder \"group\" is read (GPTQ act-order is: quant_method \"gptq\" with desc_act)".into(),
                    ));
            }
            d.int_bits.push(bits as u32);
            let g = match (strategy, group_size) {
                ("tensor", _) => Some(IntGrouping::Tensor),
                ("channel", _) => Some(IntGrouping::Channel),
                ("group", Some(gs)) if gs > 0 => Some(IntGrouping::Group(gs as u64)),
                ("group", gs) => {
                    return Err(bad(
                        field("group_size"),
                        format!("{gs:?}: strategy \"group\" needs a group_size above 0"),
                    ));
                }
                _ => None,
            };
            // Several config groups declaring different groupings: each
            // weight's own scale says (nothing single to check against).
            d.int_grouping = match (d.int_grouping, g) {
                (None, g) if !several_int_groups => g,
                _ => None,
            };
        }
        ("int", _, other) => {
            return Err(bad(
                field("strategy"),
                format!(
                    "integer weights with {bits} bits and strategy {other:?} are not supported (1 to 8 bits per tensor, channel or group are)"
                ),
            ));
        }
        ("float", _, other) => {
            return Err(bad(
                field("num_bits"),
                format!(
                    "float {bits}-bit weights with strategy {other:?} are not read (FP8 per tensor, channel or 128x128 block, and NVFP4 tensor_group 16 are)"
                ),
            ));
        }
        (other, _, _) => {
            return Err(bad(
                field("type"),
                format!("{other:?}: weights of this type are not read (int and float are)"),
            ));
        }
    }
    Ok(())
}

/// The `quant_method`s whose weights this tool reads (others are refused at open, naming the
/// method, rather than found to hold no FFN layers).
const READ_METHODS: [&str; 6] = [
    "awq",
    "gptq",
    "bitsandbytes",
    "compressed-tensors",
    "fp8",
    "modelopt",
];

/// What a method this tool does not read declares, in words (quanto's weight type, the
/// `mxfp4` method's blocks): the format named, not just the method.
fn unread_detail(method: &str, qc: &serde_json::Value) -> String {
    let s = |k: &str| qc.get(k).and_then(|v| v.as_str());
    match method {
        "quanto" => s("weights").map_or(String::new(), |w| format!(" ({w} weights)")),
        "mxfp4" => " (MXFP4: E2M1 codes in blocks of 32 with E8M0 scales)".into(),
        _ => String::new(),
    }
}

/// The code width of a GPTQ declaration, refusing what `converters::gptq` does not read: 3-bit
/// codes (they straddle words), the v2 zero points (`checkpoint_format: gptq_v2`) and Marlin's
/// repacked tiles, each naming its field.
fn gptq_bits(qc: &serde_json::Value, bad: &dyn Fn(String, String) -> Error) -> Result<u32> {
    let bits = qc.get("bits").and_then(|v| v.as_u64());
    let Some(bits) = bits
        .and_then(|b| u32::try_from(b).ok())
        .filter(|b| crate::converters::gptq::BITS.contains(b))
    else {
        return Err(bad(
            "quantization_config.bits".into(),
            format!("{bits:?}: GPTQ codes of 2, 4 or 8 bits are read (3-bit codes straddle words)"),
        ));
    };
    let format = qc.get("checkpoint_format").and_then(|v| v.as_str());
    if format.is_some_and(|f| f != "gptq") {
        return Err(bad(
            "quantization_config.checkpoint_format".into(),
            format!(
                "{format:?}: only GPTQ's \"gptq\" (v1) zero points are read; re-save in that format"
            ),
        ));
    }
    if qc.get("is_marlin_format").and_then(|v| v.as_bool()) == Some(true) {
        return Err(bad(
            "quantization_config.is_marlin_format".into(),
            "Marlin's repacked tiles are not read (the \"gptq\" packing is)".into(),
        ));
    }
    Ok(bits)
}
