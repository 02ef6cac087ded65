//! Opening a checkpoint: GGUF (single or split) and safetensors (single or sharded), and the checks every model passes.

use super::*;
use crate::error::{Error, Result};
use crate::gguf::{self, GgufFile, Value};
use crate::safetensors_file::{self, StFile};
use std::path::{Path, PathBuf};

impl Model {
    /// Open a `.gguf` file (split models through any shard), a `.safetensors` file, a
    /// `model.safetensors.index.json`, or a directory holding one of them.
    pub fn open(path: impl AsRef<Path>) -> Result<Model> {
        let path = path.as_ref();
        let file = path.display().to_string();
        if path.is_dir() {
            return Self::open(&Self::model_in(path)?);
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

    /// The file a model directory is opened through: its `model.safetensors.index.json` or
    /// `model.safetensors`, else its one `.safetensors` file of another name (AutoGPTQ's
    /// `gptq_model-4bit-128g.safetensors`; several without an index are ambiguous), else its
    /// first `.gguf` (a split model's first shard).
    fn model_in(path: &Path) -> Result<PathBuf> {
        let file = path.display().to_string();
        for cand in ["model.safetensors.index.json", "model.safetensors"] {
            if path.join(cand).exists() {
                return Ok(path.join(cand));
            }
        }
        let with = |ext: &str| -> Result<Vec<PathBuf>> {
            let mut v: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|err| Error::Io {
                    file: file.clone(),
                    err,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == ext))
                .collect();
            v.sort();
            Ok(v)
        };
        let st = with("safetensors")?;
        match st.len() {
            0 => {}
            1 => return Ok(st[0].clone()),
            _ => {
                return Err(Error::Unsupported {
                    file,
                    reason: format!(
                        "directory holds {} .safetensors files and no model.safetensors.index.json saying which tensors each holds: name one file",
                        st.len()
                    ),
                });
            }
        }
        with("gguf")?.first().cloned().ok_or_else(|| Error::Unsupported {
            file,
            reason: "directory holds no model.safetensors(.index.json), no other .safetensors and no .gguf".into(),
        })
    }

    pub(super) fn open_gguf(path: &Path) -> Result<Model> {
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
        // The tensor infos move into the model's index: a GGUF of 100k small tensors held
        // both lists, a tenth of what converting it took.
        let mut tensors = Vec::with_capacity(files.iter().map(|g| g.tensors.len()).sum());
        for (fi, g) in files.iter_mut().enumerate() {
            for t in std::mem::take(&mut g.tensors) {
                let mut shape = t.ne.to_vec();
                shape.reverse();
                tensors.push(Tensor {
                    dtype: DType::Ggml(t.ty),
                    shape,
                    name: t.name,
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
        let heads = key("attention.head_count")
            .and_then(|v| v.as_u64())
            .map(|h| {
                let kv = key("attention.head_count_kv").and_then(|v| v.as_u64());
                (h, kv.unwrap_or(h))
            });
        let files: Vec<SourceFile> = files.into_iter().map(SourceFile::Gguf).collect();
        let mut m = Self::assemble(
            Format::Gguf,
            path,
            files,
            tensors,
            arch,
            hidden,
            inter,
            activation,
            QuantDecl::default(),
        )?;
        m.heads = heads;
        Ok(m)
    }

    pub(super) fn open_safetensors(path: &Path, shards: Vec<PathBuf>) -> Result<Model> {
        let mut files = Vec::new();
        let mut tensors = Vec::new();
        for (fi, p) in shards.iter().enumerate() {
            let st = StFile::open(p)?;
            for t in &st.tensors {
                tensors.push(Tensor {
                    name: t.name.as_str().into(),
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
        let declared = ["hidden_act", "hidden_activation"]
            .into_iter()
            .find_map(|k| get(k).map(|v| (k, v.clone())));
        let activation = declared
            .as_ref()
            .and_then(|(_, v)| v.as_str())
            .and_then(Activation::from_act_name);
        let quant = Self::quant_decl(&dir, &cfg_path, get("quantization_config"))?;
        let heads = get("num_attention_heads")
            .and_then(|v| v.as_u64())
            .map(|h| {
                let kv = get("num_key_value_heads").and_then(|v| v.as_u64());
                (h, kv.unwrap_or(h))
            });
        let mut m = Self::assemble(
            Format::Safetensors,
            path,
            files,
            tensors,
            arch,
            hidden,
            inter,
            activation,
            quant,
        )?;
        // A declared activation the layers do not run is refused, never packed as SiLU.
        if let (Some((key, v)), None, false) = (&declared, activation, m.ffn_layers.is_empty()) {
            return Err(Error::Json {
                file: cfg_path.display().to_string(),
                field: (*key).into(),
                reason: format!(
                    "{v}: not an activation the packed layers run (silu, swish, swiglu; gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, geglu)"
                ),
            });
        }
        m.heads = heads;
        Ok(m)
    }

    /// The quantization a safetensors checkpoint in `dir` declares: config.json's
    /// `quantization_config` (`qc`), or AutoGPTQ's `quantize_config.json` where config.json has
    /// none (its `quant_method` then `gptq`), with ModelOpt's `hf_quant_config.json` algorithm.
    fn quant_decl(
        dir: &Path,
        cfg_path: &Path,
        qc: Option<&serde_json::Value>,
    ) -> Result<QuantDecl> {
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
        let gptq_path = dir.join("quantize_config.json");
        let gptq_cfg = (qc.is_none() && gptq_path.exists())
            .then(|| safetensors_file::read_json(&gptq_path))
            .transpose()?
            .map(|mut q| {
                if q.get("quant_method").is_none()
                    && let Some(o) = q.as_object_mut()
                {
                    o.insert("quant_method".into(), "gptq".into());
                }
                q
            });
        let (file, qc) = match &gptq_cfg {
            Some(q) => (gptq_path.as_path(), Some(q)),
            None => (cfg_path, qc),
        };
        QuantDecl::parse(&file.display().to_string(), qc, hf_algo.as_deref())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn assemble(
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
            if crate::gguf::element_count(&t.shape).is_none() {
                return Err(Error::Tensor {
                    file: files[t.file].path().display().to_string(),
                    tensor: t.name.to_string(),
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
                tensor: t.name.to_string(),
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
            heads: None,
            quantization: quant.method.clone(),
            quant,
            ffn_layers: Vec::new(),
            moe_layers: Vec::new(),
        };
        if m.format == Format::Safetensors {
            m.check_companions()?;
        }
        let partial;
        (m.ffn_layers, m.moe_layers, partial) = m.find_ffn_layers();
        // A layer that lacks a projection the model's other layers have would be carried as
        // passthrough tensors while its siblings are packed: a model that is not the source.
        // (Where no layer is whole, the FFN is another kind, a non-gated MLP, carried as is.)
        if let (Some((index, lacks)), false) = (partial.first(), m.ffn_layers.is_empty()) {
            return Err(Error::Tensor {
                file: m.path.display().to_string(),
                tensor: lacks.clone(),
                field: "ffn",
                reason: format!(
                    "layer {index}'s dense FFN lacks this projection while {} other layers have all three; the checkpoint is incomplete",
                    m.ffn_layers.len()
                ),
            });
        }
        m.check_gguf_scales()?;
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
}
