//! The refusals a convert makes before it reads a tensor: a safetensors model without its
//! `config.json`, no dense FFN layer, a layout set the model or the options cannot take.
//! Moved out of `plan.rs` unchanged.

use super::*;
use crate::converters::layouts::Layout;
use crate::model::{Activation, Model};

/// The layouts a convert builds (the given ones or the activation's defaults, with `lora` when an
/// adapter is given), after every refusal that needs no tensor read: why not, otherwise.
pub(super) fn checked_layouts(
    model: &Model,
    opts: &ConvertOptions,
    activation: Activation,
) -> std::result::Result<Vec<Layout>, String> {
    if let Some(why) = missing_config(model) {
        return Err(why);
    }
    if model.ffn_layers.is_empty() {
        return Err(no_dense_layers(model));
    }
    if opts.tp > 1 && !model.moe_layers.is_empty() && !opts.replicate_moe {
        let l = model.moe_layers[0];
        return Err(format!(
            "--tp {} would copy the mixture-of-experts layers {:?} whole onto every rank (e.g. {}); --replicate-moe asks for that",
            opts.tp,
            model.moe_layers,
            model.expert_tensors(l, 2).join(", ")
        ));
    }
    let mut layouts = opts
        .layouts
        .clone()
        .unwrap_or_else(|| default_layouts(activation));
    if opts.lora.is_some() && !layouts.contains(&Layout::Lora) {
        layouts.push(Layout::Lora);
    }
    layouts.sort();
    layouts.dedup();
    if let Some(why) = layouts
        .iter()
        .filter(|l| !l.serves(activation))
        .find_map(|l| l.spec().gelu_refusal())
    {
        return Err(why.to_string());
    }
    if opts.allow_nonfinite
        && let Some(l) = layouts.iter().find(|&&l| l != Layout::Bf16)
    {
        return Err(format!(
            "--allow-nonfinite: layout {} cannot carry NaN or infinite weights; use --layouts bf16",
            l.tag()
        ));
    }
    if layouts.contains(&Layout::Lora) {
        if opts.lora.is_none() {
            return Err("layout lora needs --lora DIR (a PEFT adapter)".into());
        }
        if !layouts.contains(&Layout::Nvfp4) {
            return Err("layout lora needs the nvfp4 base layout (set_lora_weights only takes an adapter on the NVFP4 base)".into());
        }
    }
    Ok(layouts)
}

/// A safetensors model without its `config.json`: the architecture, sizes and activation would
/// be guesses, so it is refused.
fn missing_config(model: &Model) -> Option<String> {
    let cfg = model.files[0].path().parent()?.join("config.json");
    (model.format == crate::model::Format::Safetensors && !cfg.exists()).then(|| {
        format!(
            "no config.json beside the safetensors files (looked for {}): the architecture, sizes and activation come from it",
            cfg.display()
        )
    })
}

/// Why a model with no dense FFN layer cannot be packed, and what can be.
fn no_dense_layers(model: &Model) -> String {
    use crate::model::SourceFile;
    if let SourceFile::Gguf(g) = &model.files[0]
        && is_pack(g)
    {
        return "is already a metrale pack: `metrale-pack inspect` shows it, `verify` checks it; convert the source checkpoint instead".into();
    }
    if let Some(&l) = model.moe_layers.first() {
        return format!(
            "no dense FFN layer: layers {:?} are mixture-of-experts ({}, ...), which this tool passes through but does not pack; a model with dense FFN layers (all or some) converts",
            model.moe_layers,
            model.expert_tensors(l, 3).join(", ")
        );
    }
    format!(
        "no dense FFN layers found in architecture {}: layers are read as GGUF blk.N.ffn_{{gate,up,down}} (or a fused ffn_up of 2 x I rows, Phi-3) and safetensors model.layers.N.mlp.{{gate,up,down}}_proj (or gate_up_proj), as llama, mistral, qwen2, gemma, phi3 and their quantized exports name them",
        model.architecture.as_deref().unwrap_or("(none named)")
    )
}
