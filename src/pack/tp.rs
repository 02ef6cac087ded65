//! Tensor-parallel packs: which tensors are split, the range each rank holds, and the byte
//! slicing of a stored tensor by rows or columns (formats.md, "Tensor-parallel packs").
//!
//! The rules are Megatron-LM's column- and row-parallel split of a transformer layer
//! (Shoeybi et al. 2019, section 3): gate and up by output rows, down by the matching input
//! columns, so each rank's down projection yields a partial sum that one all-reduce completes;
//! q by head ranges, k and v by KV-head ranges (replicated where there are fewer KV heads than
//! ranks, as vLLM does for grouped-query attention), the attention output by the matching columns.

pub use crate::converters::slice::{TP_INTER_ALIGN, padded_width, slice_bytes, slice_padded};
use crate::error::{Error, Result};
use crate::model::{DType, Model};

/// The largest rank count `--tp` takes (one node of eight GPUs).
pub const MAX_TP_RANKS: u32 = 8;

/// How a tensor is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// FFN gate, up (and the fused gate_up): output rows, the intermediate range.
    FfnRows,
    /// FFN down: input columns, the intermediate range.
    FfnCols,
    /// Attention q (weight and bias): the rank's heads' rows.
    QRows,
    /// Attention k and v (weight and bias): the rank's KV heads' rows.
    KvRows,
    /// Attention output: the columns of the rank's heads.
    OCols,
}

impl Rule {
    /// The name in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            Rule::FfnRows => "ffn_rows",
            Rule::FfnCols => "ffn_cols",
            Rule::QRows => "q_rows",
            Rule::KvRows => "kv_rows",
            Rule::OCols => "o_cols",
        }
    }
    /// The rule of a manifest name.
    pub fn from_name(s: &str) -> Option<Rule> {
        [
            Rule::FfnRows,
            Rule::FfnCols,
            Rule::QRows,
            Rule::KvRows,
            Rule::OCols,
        ]
        .into_iter()
        .find(|r| r.name() == s)
    }
    /// Whether it cuts columns (the input dimension) rather than rows.
    pub fn cuts_columns(self) -> bool {
        matches!(self, Rule::FfnCols | Rule::OCols)
    }
}

/// `[start, end)` of rank `r` of `n` over `total`: `[floor(r·total/n), floor((r+1)·total/n))`.
pub fn rank_range(total: u64, n: u32, r: u32) -> [u64; 2] {
    let at = |i: u64| (total as u128 * i as u128 / n.max(1) as u128) as u64;
    [at(r as u64), at(r as u64 + 1)]
}

/// The attention rule of a passthrough tensor's name (llama-style separate q, k, v and output,
/// GGUF or Hugging Face names), if it is split; `Err` for a tensor that would have to be split
/// but cannot be (a fused QKV, or a q/k/v/o companion other than the weight and the bias).
pub fn attention_rule(file: &str, name: &str) -> Result<Option<Rule>> {
    let parts: Vec<&str> = name.rsplitn(2, '.').collect();
    let (stem, last) = match parts.as_slice() {
        [last, stem] => (*stem, *last),
        _ => return Ok(None),
    };
    let module = stem.rsplit('.').next().unwrap_or("");
    let rule = match module {
        "attn_q" | "q_proj" => Rule::QRows,
        "attn_k" | "attn_v" | "k_proj" | "v_proj" => Rule::KvRows,
        "attn_output" | "o_proj" => Rule::OCols,
        "attn_qkv" | "qkv_proj" | "query_key_value" | "c_attn" => {
            return Err(Error::Unsupported {
                file: file.into(),
                reason: format!(
                    "{name}: a fused QKV tensor cannot be split by heads for --tp (only separate q, k, v and output projections are)"
                ),
            });
        }
        _ => return Ok(None),
    };
    match (rule, last) {
        (_, "weight") => Ok(Some(rule)),
        // A row-parallel bias is added once, after the all-reduce: replicated.
        (Rule::OCols, "bias") => Ok(None),
        (_, "bias") => Ok(Some(rule)),
        // A quantized weight's scales follow its cut ([`companion_plan`] decides per shape).
        (_, c) if SCALE_COMPANIONS.contains(&c) => Ok(Some(rule)),
        // E2M1 codes (compressed-tensors NVFP4) are cut like a weight; packed integers are
        // refused by [`plan_for`].
        (_, "weight_packed" | "weight_shape") => Ok(Some(rule)),
        _ => Err(Error::Unsupported {
            file: file.into(),
            reason: format!(
                "{name}: --tp splits the attention projections' weight, bias and weight scales, not {last:?} companions"
            ),
        }),
    }
}

/// The companions of a quantized attention weight that `--tp` cuts with it or replicates.
pub const SCALE_COMPANIONS: [&str; 7] = [
    "weight_scale",
    "weight_scale_inv",
    "weight_zero_point",
    "weight_scale_2",
    "weight_global_scale",
    "input_scale",
    "input_global_scale",
];

/// Rank `r`'s cut of companion `t` (a scale, zero point or activation scale of the attention
/// weight beside it) when its weight is cut by `rule`; `None` where every rank needs all of it
/// (one value, a per-output-row scale of a column cut). The companion's extent along the cut
/// dimension must divide the weight's into groups `g` (or be `ceil(D / 128)`, a block-FP8 grid):
/// the cut is `[lo / g, ceil(hi / g))`, refused where it would split a group.
pub fn companion_plan(
    model: &Model,
    t: usize,
    rule: Rule,
    heads: (u64, u64),
    n: u32,
    r: u32,
) -> Result<Option<SlicePlan>> {
    let name = &model.tensors[t].name;
    let bad = |reason: String| Error::Tensor {
        file: model.file_of(t),
        tensor: name.to_string(),
        field: "shape",
        reason,
    };
    let prefix = name.rsplit_once('.').map_or("", |(p, _)| p);
    let Some(w) = model
        .quantized_weight_named(&format!("{prefix}.weight"))
        .or_else(|| model.quantized_weight_named(&format!("{prefix}.weight_packed")))
    else {
        return Err(bad(format!(
            "--tp: {prefix}.weight is not a quantized weight this tool reads, so its companion cannot be cut"
        )));
    };
    let [wn, wk] = model.weight_shape(&w)?;
    let wplan = slice_plan(model, w.main(), rule, heads, n, r)?;
    // The weight's stored columns may pack several logical ones (E2M1: two a byte).
    let stored_cols = out_in(&model.tensors[w.main()].shape)
        .map_or(1, |s| s[1])
        .max(1);
    let per_stored = if rule.cuts_columns() {
        wk / stored_cols
    } else {
        1
    };
    let [lo, hi] = wplan.range.map(|x| x * per_stored.max(1));
    let ten = &model.tensors[t];
    let [cr, cc] = match ten.shape[..] {
        [] => return Ok(None),
        _ => out_in(&ten.shape).ok_or_else(|| bad(format!("{:?}: not 1-D or 2-D", ten.shape)))?,
    };
    let (dim, extent) = if rule.cuts_columns() {
        (wk, cc)
    } else {
        (wn, cr)
    };
    if extent <= 1 || cr * cc <= 1 {
        return Ok(None);
    }
    let g = if dim % extent == 0 {
        dim / extent
    } else if dim.div_ceil(128) == extent {
        128
    } else {
        return Err(bad(format!(
            "{:?} does not group the weight's {dim} {}",
            ten.shape,
            if rule.cuts_columns() {
                "columns"
            } else {
                "rows"
            }
        )));
    };
    if lo % g != 0 || (hi % g != 0 && hi != dim) {
        return Err(bad(format!(
            "rank {r}'s cut [{lo}, {hi}) of {prefix}.weight splits its groups of {g}"
        )));
    }
    let range = [lo / g, hi.div_ceil(g)];
    let block = block_of(&ten.dtype).ok_or_else(|| bad("unknown element size".into()))?;
    let shape = if rule.cuts_columns() {
        [cr, range[1] - range[0]]
    } else {
        [range[1] - range[0], cc]
    };
    Ok(Some(SlicePlan {
        range,
        shape,
        bytes: shape[0] * (shape[1] / block.0) * block.1,
        dims: [cr, cc],
        block,
        columns: rule.cuts_columns(),
    }))
}

/// Rank `r`'s cut of attention tensor `t` (a weight, a bias or a weight's companion) by
/// `rule`; `None`: every rank holds it whole.
pub fn plan_for(
    model: &Model,
    t: usize,
    rule: Rule,
    heads: (u64, u64),
    n: u32,
    r: u32,
) -> Result<Option<SlicePlan>> {
    let ten = &model.tensors[t];
    let last = ten.name.rsplit('.').next().unwrap_or("");
    let packed_int = last == "weight_shape"
        || (last == "weight_packed" && ten.dtype != DType::St(safetensors::Dtype::U8));
    if packed_int {
        return Err(Error::Unsupported {
            file: model.file_of(t),
            reason: format!(
                "{}: --tp does not split packed integer attention weights yet (their packed words and weight_shape would have to be rewritten); convert without --tp",
                ten.name
            ),
        });
    }
    if SCALE_COMPANIONS.contains(&last) {
        companion_plan(model, t, rule, heads, n, r)
    } else {
        slice_plan(model, t, rule, heads, n, r).map(Some)
    }
}

/// Check that `n` ranks can split heads `(h, kv)`: `h` divisible by `n`, and `kv` divisible by
/// `n` or dividing it (then each KV head is replicated on `n / kv` ranks).
pub fn check_heads(file: &str, (h, kv): (u64, u64), n: u32) -> Result<()> {
    let n64 = n as u64;
    let bad = |reason: String| Error::Unsupported {
        file: file.into(),
        reason,
    };
    if h == 0 || kv == 0 || h % kv != 0 {
        return Err(bad(format!(
            "--tp {n}: head counts {h} / {kv} KV heads are not a valid attention layout"
        )));
    }
    if h % n64 != 0 {
        return Err(bad(format!(
            "--tp {n}: the model's {h} attention heads do not split evenly over {n} ranks"
        )));
    }
    if kv % n64 != 0 && !n64.is_multiple_of(kv) {
        return Err(bad(format!(
            "--tp {n}: the model's {kv} KV heads neither split over {n} ranks nor divide {n}"
        )));
    }
    Ok(())
}

/// The rows or columns `[start, end)` rank `r` of `n` holds of an attention tensor whose split
/// dimension is `dim` long.
pub fn attention_range(rule: Rule, dim: u64, (h, kv): (u64, u64), n: u32, r: u32) -> [u64; 2] {
    let (n, r) = (n as u64, r as u64);
    match rule {
        Rule::KvRows if kv < n => {
            let hd = dim / kv;
            let head = r / (n / kv);
            [head * hd, (head + 1) * hd]
        }
        Rule::KvRows => {
            let per = dim / kv * (kv / n);
            [r * per, (r + 1) * per]
        }
        _ => {
            let per = dim / h * (h / n);
            [r * per, (r + 1) * per]
        }
    }
}

/// The block of a stored type: (elements, bytes), for byte slicing. Types with no ggml type
/// (safetensors FP8, ...) are elementwise.
pub fn block_of(d: &DType) -> Option<(u64, u64)> {
    match d {
        DType::Ggml(t) => Some((t.block_elems(), t.block_bytes())),
        DType::St(s) => match s.bitsize() {
            b if b >= 8 && b % 8 == 0 => Some((1, b as u64 / 8)),
            4 => Some((2, 1)),
            _ => None,
        },
    }
}

/// The logical `[out, in]` of a stored tensor (a 1-D tensor is `[len, 1]`).
pub fn out_in(shape: &[u64]) -> Option<[u64; 2]> {
    match shape {
        [n] => Some([*n, 1]),
        [n, k] => Some([*n, *k]),
        _ => None,
    }
}

/// Where rank `r` of `n` cuts source tensor `t` by `rule`, checked before any byte is read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlicePlan {
    /// The rows or columns `[start, end)` of the source's logical `[out, in]`.
    pub range: [u64; 2],
    /// The slice's logical `[out, in]`.
    pub shape: [u64; 2],
    /// The slice's bytes.
    pub bytes: u64,
    /// The source's `[out, in]`, its block (elements, bytes) along a row, and whether the
    /// cut is of columns.
    dims: [u64; 2],
    block: (u64, u64),
    columns: bool,
}

/// Plan rank `r` of `n`'s slice of source tensor `t` by `rule`. Errors name the tensor when it
/// is not 1-D or 2-D, when its split dimension does not divide into the heads, or when the cut
/// would split one of its quantization blocks.
pub fn slice_plan(
    model: &Model,
    t: usize,
    rule: Rule,
    heads: (u64, u64),
    n: u32,
    r: u32,
) -> Result<SlicePlan> {
    let ten = &model.tensors[t];
    let bad = |reason: String| Error::Tensor {
        file: model.file_of(t),
        tensor: ten.name.to_string(),
        field: "shape",
        reason,
    };
    let [rows, cols] = out_in(&ten.shape)
        .ok_or_else(|| bad(format!("{:?}: --tp splits 1-D and 2-D tensors", ten.shape)))?;
    let dim = if rule.cuts_columns() { cols } else { rows };
    let (count, what) = if rule == Rule::KvRows {
        (heads.1, "KV heads")
    } else {
        (heads.0, "heads")
    };
    if dim % count != 0 {
        let unit = if rule.cuts_columns() {
            "columns"
        } else {
            "rows"
        };
        return Err(bad(format!(
            "{dim} {unit} do not split into the model's {count} {what}"
        )));
    }
    let range = attention_range(rule, dim, heads, n, r);
    let block = block_of(&ten.dtype).ok_or_else(|| bad("unknown element size".into()))?;
    if rule.cuts_columns()
        && (!range[0].is_multiple_of(block.0) || !range[1].is_multiple_of(block.0))
    {
        return Err(bad(format!(
            "rank {r}'s columns {range:?} cut through {}'s blocks of {} elements",
            ten.dtype.name(),
            block.0
        )));
    }
    let shape = if rule.cuts_columns() {
        [rows, range[1] - range[0]]
    } else {
        [range[1] - range[0], cols]
    };
    Ok(SlicePlan {
        range,
        shape,
        bytes: shape[0] * (shape[1] / block.0) * block.1,
        dims: [rows, cols],
        block,
        columns: rule.cuts_columns(),
    })
}

/// The bytes of a planned slice.
pub fn slice_tensor(model: &Model, t: usize, plan: &SlicePlan) -> Result<Vec<u8>> {
    slice_bytes(
        model.data(t),
        plan.dims,
        plan.block,
        plan.columns,
        plan.range,
    )
    .ok_or_else(|| Error::Tensor {
        file: model.file_of(t),
        tensor: model.tensors[t].name.to_string(),
        field: "bytes",
        reason: format!("shorter than its shape {:?} needs", plan.dims),
    })
}

/// The pack name of rank `r`'s slice of a tensor: `.tp{r}` before the last name component
/// (`blk.3.attn_q.weight` -> `blk.3.attn_q.tp1.weight`).
pub fn slice_name(name: &str, r: u32) -> String {
    match name.rsplit_once('.') {
        Some((stem, last)) => format!("{stem}.tp{r}.{last}"),
        None => format!("{name}.tp{r}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_dimension_in_order() {
        for (total, n) in [(1536u64, 3u32), (320, 4), (100, 8), (7, 2)] {
            let mut at = 0;
            for r in 0..n {
                let [lo, hi] = rank_range(total, n, r);
                assert_eq!(lo, at);
                assert!(hi >= lo);
                at = hi;
            }
            assert_eq!(at, total);
        }
        // SmolLM2 at 3 ranks: 9 heads of 64, 3 KV heads.
        assert_eq!(attention_range(Rule::QRows, 576, (9, 3), 3, 1), [192, 384]);
        assert_eq!(attention_range(Rule::KvRows, 192, (9, 3), 3, 2), [128, 192]);
        assert_eq!(attention_range(Rule::OCols, 576, (9, 3), 3, 2), [384, 576]);
        // 2 KV heads over 8 ranks: each KV head on 4 ranks.
        assert_eq!(attention_range(Rule::KvRows, 256, (8, 2), 8, 5), [128, 256]);
        assert!(check_heads("m", (9, 3), 2).is_err());
        assert!(check_heads("m", (9, 3), 3).is_ok());
        assert!(check_heads("m", (32, 8), 8).is_ok());
        assert!(check_heads("m", (12, 3), 4).is_err());
    }

    #[test]
    fn column_slices_keep_blocks_whole() {
        // 2 rows of 4 blocks of 2 elements (3 bytes each).
        let data: Vec<u8> = (0..24).collect();
        let got = slice_bytes(&data, [2, 8], (2, 3), true, [2, 6]).unwrap();
        assert_eq!(got, [3, 4, 5, 6, 7, 8, 15, 16, 17, 18, 19, 20]);
        assert!(slice_bytes(&data, [2, 8], (2, 3), true, [1, 6]).is_none());
        assert_eq!(
            slice_bytes(&data, [2, 8], (2, 3), false, [1, 2]).unwrap(),
            (12..24).collect::<Vec<u8>>()
        );
        assert_eq!(
            slice_name("blk.3.attn_q.weight", 1),
            "blk.3.attn_q.tp1.weight"
        );
        assert!(attention_rule("f", "blk.0.attn_qkv.weight").is_err());
        assert_eq!(
            attention_rule("f", "model.layers.0.self_attn.o_proj.weight").unwrap(),
            Some(Rule::OCols)
        );
        assert_eq!(attention_rule("f", "blk.0.attn_output.bias").unwrap(), None);
        assert_eq!(attention_rule("f", "blk.0.attn_norm.weight").unwrap(), None);
    }
}
