//! Layouts for a source: which keep the FFN weights as the source stores them, which set
//! re-quantizes an already-quantized weight (what `convert` refuses without
//! `--allow-requantize`, as llama-quantize does), and what each layout of a set costs before
//! anything is written (`convert --dry-run`): its bytes and its error measured on one layer.

use super::plan::Plan;
use super::*;
use crate::converters::layouts::q4k_mmq::DownFormat;
use crate::error::Result;
use crate::model::{Activation, DType, FfnWeight, Model};

/// How the FFN weights of a source are stored, as the user knows it (`BF16`, `Q4_1`,
/// `FP8 block`, `NVFP4 (ModelOpt)`, `int4 (compressed-tensors)`, `AWQ int4`), and whether that
/// is a quantized format.
pub fn weight_kind(model: &Model, w: &FfnWeight) -> (String, bool) {
    match w {
        FfnWeight::Plain { weight } => match model.tensors[*weight].dtype {
            DType::Ggml(t) => (t.name().to_string(), t.is_quantized()),
            DType::St(d) => {
                let name = format!("{d:?}");
                let quantized = !matches!(name.as_str(), "F32" | "F16" | "BF16" | "F64");
                (name, quantized)
            }
        },
        FfnWeight::GgufScaled { weight, .. } => {
            let (name, quantized) = weight_kind(model, &FfnWeight::Plain { weight: *weight });
            (format!("{name} with an output scale"), quantized)
        }
        FfnWeight::ModelOptNvfp4 { .. } => ("NVFP4 (ModelOpt)".into(), true),
        FfnWeight::CtNvfp4 { .. } => ("NVFP4 (compressed-tensors)".into(), true),
        FfnWeight::CtMxfp4 { .. } => ("MXFP4 (compressed-tensors)".into(), true),
        FfnWeight::Fp8Block { .. } => ("FP8 block".into(), true),
        FfnWeight::Fp8Channel { .. } => ("FP8 per channel".into(), true),
        FfnWeight::Fp8Tensor { .. } => ("FP8 per tensor".into(), true),
        FfnWeight::CtInt { bits, .. } => (format!("int{bits} (compressed-tensors)"), true),
        FfnWeight::Awq { .. } => ("AWQ int4".into(), true),
        FfnWeight::Gptq { bits, .. } => {
            let order = if model.gptq_act_order(w) {
                " with act-order (g_idx: groups not contiguous)"
            } else {
                ""
            };
            (format!("GPTQ int{bits}{order}"), true)
        }
        FfnWeight::Bnb4 { nf4: true, .. } => ("NF4 (bitsandbytes)".into(), true),
        FfnWeight::Bnb4 { .. } => ("FP4 (bitsandbytes)".into(), true),
        FfnWeight::BnbInt8 { .. } => ("LLM.int8 (bitsandbytes)".into(), true),
        FfnWeight::Half { of, .. } => weight_kind(model, of),
    }
}

/// Whether `layout` stores projection weight `w` as the source has it (its codes and scales
/// carried, only re-laid), or widens it to a float format (`bf16`; `lora` holds an adapter).
/// Any other layout quantizes the weight anew.
pub fn keeps(
    model: &Model,
    layout: Layout,
    w: &FfnWeight,
    down: bool,
    opts: &ConvertOptions,
) -> bool {
    let w = match w {
        FfnWeight::Half { of, .. } => of,
        w => w,
    };
    layout.spec().keeps(model, w, down, opts)
}

/// One layout of a set that would quantize an already-quantized source weight again.
#[derive(Clone, Debug, PartialEq)]
pub struct Requantized {
    /// The layout.
    pub layout: Layout,
    /// The source's storage of the first such weight ([`weight_kind`]).
    pub source: String,
}

/// The layouts of `layouts` that re-quantize some quantized FFN weight of `model`.
pub fn requantizing(model: &Model, layouts: &[Layout], opts: &ConvertOptions) -> Vec<Requantized> {
    let mut out = Vec::new();
    for &layout in layouts {
        let hit = model.ffn_layers.iter().find_map(|l| {
            [(&l.gate, false), (&l.up, false), (&l.down, true)]
                .into_iter()
                .find(|(w, down)| weight_kind(model, w).1 && !keeps(model, layout, w, *down, opts))
                .map(|(w, _)| weight_kind(model, w).0)
        });
        if let Some(source) = hit {
            out.push(Requantized { layout, source });
        }
    }
    out
}

/// The layouts `convert` uses when none are named: the target's default for the source's
/// activation, or else the first layout, by [`default_rank`](crate::layout::LayoutSpec::default_rank), that keeps every
/// quantized FFN weight of the source as it is stored and serves its activation (each
/// layout's `keeps_what`, in `metrale-pack layouts`, says what that is); `None` for a quantized
/// source no such set keeps (GGUF's NVFP4; FP8 per channel in a GELU model: the user
/// chooses, from the dry run's figures).
pub fn default_for(model: &Model, opts: &ConvertOptions) -> Option<Vec<Layout>> {
    let act = model.activation.unwrap_or(Activation::Silu);
    let mut alone: Vec<(u8, Layout)> = crate::layout::specs()
        .iter()
        .filter_map(|s| Some((s.default_rank()?, s.layout())))
        .collect();
    alone.sort_by_key(|&(rank, _)| rank);
    std::iter::once(default_layouts(act))
        .chain(alone.into_iter().map(|(_, l)| vec![l]))
        .filter(|set| set.iter().all(|l| l.serves(act)))
        .find(|set| requantizing(model, set, opts).is_empty())
}

/// How `q4k_mmq` stores the down projections when the user does not say: as Q4_K where every
/// FFN down weight of the source is Q4_K (their bytes kept), else as int8 rows.
pub fn default_down(model: &Model) -> DownFormat {
    let q4k = |w: &FfnWeight| {
        matches!(w, FfnWeight::Plain { weight }
            if model.tensors[*weight].dtype == DType::Ggml(crate::GgmlType::Q4_K))
    };
    if !model.ffn_layers.is_empty() && model.ffn_layers.iter().all(|l| q4k(&l.down)) {
        DownFormat::Q4k
    } else {
        DownFormat::Int8
    }
}

/// The layouts `convert` will use for `model`, and why it would stop without
/// `--allow-requantize` (`None`: nothing re-quantized): what the CLI and the Python package
/// both decide.
pub struct Settled {
    /// The set: as named, [`default_for`] the source, or the target's default.
    pub layouts: Vec<Layout>,
    /// The re-quantization a convert without `--allow-requantize` refuses, in words.
    pub refusal: Option<String>,
}

/// Settle the layouts for `model`: none named takes [`default_for`]; a set that
/// re-quantizes a quantized weight (the target's default included, where no set keeps the
/// source) carries its refusal.
pub fn settle(model: &Model, opts: &ConvertOptions) -> Settled {
    let named = opts.layouts.is_some();
    if !named && let Some(layouts) = default_for(model, opts) {
        return Settled {
            layouts,
            refusal: None,
        };
    }
    let layouts = opts
        .layouts
        .clone()
        .unwrap_or_else(|| default_layouts(model.activation.unwrap_or(Activation::Silu)));
    let requant = requantizing(model, &layouts, opts);
    let refusal = (!requant.is_empty()).then(|| {
        let what = requant
            .iter()
            .map(|r| {
                format!(
                    "{} would re-quantize its {} weights",
                    r.layout.tag(),
                    r.source
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let default = if named {
            ""
        } else {
            "no layout keeps this source's format and serves every forward: the default "
        };
        format!("{default}{what}")
    });
    Settled { layouts, refusal }
}

/// What one layout of a set costs (`convert --dry-run`).
#[derive(Clone, Debug, PartialEq)]
pub struct LayoutCost {
    /// The layout.
    pub layout: Layout,
    /// Its blobs over every FFN layer (and rank).
    pub bytes: u64,
    /// Per projection, its relative error against the source's weights (decoded), measured
    /// on the first FFN layer.
    pub rel_err: Vec<(String, f64)>,
    /// Whether it re-quantizes a quantized source weight.
    pub requantizes: bool,
}

/// The dry run: every layout of `opts.layouts` encoded for the model's first FFN layer (and
/// first rank), its bytes scaled to every layer, and the bytes carried unchanged
/// (passthrough tensors). Nothing is written.
pub fn dry_run(model: &Model, opts: &ConvertOptions) -> Result<(Vec<LayoutCost>, u64)> {
    let plan = Plan::new(model, opts)?;
    let (per_layout, carried) = plan.sample_costs()?;
    let fidelity = plan.fidelity();
    let layouts: Vec<Layout> = per_layout.iter().map(|(l, _)| *l).collect();
    let requant = requantizing(model, &layouts, opts);
    let costs = per_layout
        .into_iter()
        .map(|(layout, bytes)| LayoutCost {
            layout,
            bytes,
            rel_err: fidelity
                .iter()
                .filter(|f| f.layout == layout.tag())
                .map(|f| (f.proj.clone(), f.mean_rel_err))
                .collect(),
            requantizes: requant.iter().any(|r| r.layout == layout),
        })
        .collect();
    Ok((costs, carried))
}
