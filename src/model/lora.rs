//! A PEFT LoRA adapter as `convert --lora` reads it.

use crate::converters::layouts::Proj;
use crate::converters::layouts::lora::LORA_MAX_RANK;
use crate::error::{Error, Result};
use crate::model::Model;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// A PEFT LoRA adapter on the FFN projections: which (layer, projection) it targets, with each
/// one's rank and scaling (PEFT's `rank_pattern`, `alpha_pattern` and `use_rslora` applied).
/// Projections it does not target are served as identity (no `lora` blobs, no delta).
pub struct Lora {
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
    pub(crate) fn open(dir: &Path, base: &Model) -> Result<Lora> {
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
        let model = Model::open(dir.join("adapter_model.safetensors"))?;
        let adapter_file = model.files[0].path().display().to_string();
        // Every adapter tensor must be an FFN projection's lora_A or lora_B.
        let mut present: HashMap<(usize, Proj), [bool; 2]> = HashMap::new();
        for t in &model.tensors {
            let bad = |reason: String| Error::Quantized {
                file: adapter_file.clone(),
                tensor: t.name.to_string(),
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
            if rank < 1.0 || rank.fract() != 0.0 || rank > LORA_MAX_RANK as f64 {
                return Err(refuse(
                    "r",
                    format!("{module}: rank {rank} is not in 1..={}", LORA_MAX_RANK),
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
    pub(crate) fn matrices(
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
                    tensor: t.name.to_string(),
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

    pub(crate) fn targets(&self, layer: usize, proj: Proj) -> bool {
        self.targets.contains_key(&(layer, proj))
    }
}
