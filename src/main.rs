//! The `metrale-pack` command line.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use metrale_pack::model::{Format, Model};
use metrale_pack::{atomic, model, npy};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "metrale-pack",
    version,
    about = "Repack LLM checkpoints offline into the layouts GPU kernels read, so engines start with one DMA."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show a checkpoint's format, metadata, tensors and dense FFN layers.
    Inspect {
        /// A .gguf file (any shard of a split model), a .safetensors file, an index.json, or a directory.
        file: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write one tensor to a .npy file: decoded to f32 in its logical shape, or its stored bytes.
    Dump {
        file: PathBuf,
        /// Tensor name. For a quantized FFN weight (ModelOpt/compressed-tensors NVFP4, FP8) name
        /// its main tensor (`...weight` / `...weight_packed`): the scales are applied.
        tensor: String,
        /// Output .npy path.
        #[arg(short, long)]
        output: PathBuf,
        /// Write the stored bytes as a 1-D u8 array instead of decoding.
        #[arg(long)]
        raw: bool,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Inspect { file, json } => inspect(&file, json),
        Cmd::Dump {
            file,
            tensor,
            output,
            raw,
        } => dump(&file, &tensor, &output, raw),
    }
}

fn inspect(path: &Path, json: bool) -> Result<()> {
    let m = Model::open(path)?;
    let metadata: Vec<(String, String)> = match &m.files[0] {
        model::SourceFile::Gguf(g) => g
            .kvs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.summary()))
            .collect(),
        model::SourceFile::Safetensors(s) => {
            let mut v: Vec<_> = s
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            v.sort();
            v
        }
    };
    if json {
        let tensors: Vec<serde_json::Value> = m
            .tensors
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name, "type": t.dtype.name(), "shape": t.shape,
                    "offset": t.offset, "bytes": t.bytes, "file": t.file,
                })
            })
            .collect();
        let layers: Vec<serde_json::Value> = m
            .ffn_layers
            .iter()
            .map(|l| {
                let w = |w: &model::FfnWeight| {
                    serde_json::json!({"tensor": m.tensors[w.main()].name, "scheme": w.scheme(),
                        "type": m.tensors[w.main()].dtype.name(), "shape": m.weight_shape(w).ok()})
                };
                serde_json::json!({"index": l.index, "gate": w(&l.gate), "up": w(&l.up), "down": w(&l.down)})
            })
            .collect();
        let out = serde_json::json!({
            "format": m.format.name(),
            "files": m.files.iter().map(|f| f.path().display().to_string()).collect::<Vec<_>>(),
            "architecture": m.architecture,
            "quantization": m.quantization,
            "hidden_size": m.hidden_size,
            "intermediate_size": m.intermediate_size,
            "activation": m.activation.map(|a| a.name()),
            "ffn_layers": m.ffn_layers.len(),
            "ffn": layers,
            "metadata": metadata.into_iter().map(|(k, v)| (k, serde_json::Value::String(v)))
                .collect::<serde_json::Map<String, serde_json::Value>>(),
            "tensors": tensors,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let mut o = std::io::stdout().lock();
    writeln!(o, "format: {}", m.format.name())?;
    for f in &m.files {
        writeln!(o, "file: {}", f.path().display())?;
    }
    if let model::SourceFile::Gguf(g) = &m.files[0] {
        writeln!(o, "gguf version: {}, alignment: {}", g.version, g.alignment)?;
    }
    writeln!(
        o,
        "architecture: {}",
        m.architecture.as_deref().unwrap_or("?")
    )?;
    if let Some(q) = &m.quantization {
        writeln!(o, "quantization: {q}")?;
    }
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
    writeln!(
        o,
        "ffn layers: {}, hidden: {}, intermediate: {}, activation: {}",
        m.ffn_layers.len(),
        opt(m.hidden_size),
        opt(m.intermediate_size),
        m.activation.map(|a| a.name()).unwrap_or("?")
    )?;
    if let Some(l) = m.ffn_layers.first() {
        writeln!(
            o,
            "ffn weights (layer {}): gate {} ({}), up {}, down {}",
            l.index,
            m.tensors[l.gate.main()].dtype.name(),
            l.gate.scheme(),
            m.tensors[l.up.main()].dtype.name(),
            m.tensors[l.down.main()].dtype.name()
        )?;
    }
    writeln!(o, "metadata ({} keys):", metadata.len())?;
    for (k, v) in &metadata {
        writeln!(o, "  {k} = {v}")?;
    }
    writeln!(o, "tensors ({}):", m.tensors.len())?;
    writeln!(
        o,
        "  {:<48} {:<8} {:<20} {:>12} {:>12}",
        "name", "type", "shape", "offset", "bytes"
    )?;
    for t in &m.tensors {
        writeln!(
            o,
            "  {:<48} {:<8} {:<20} {:>12} {:>12}",
            t.name,
            t.dtype.name(),
            format!("{:?}", t.shape),
            t.offset,
            t.bytes
        )?;
    }
    Ok(())
}

fn dump(path: &Path, name: &str, out: &Path, raw: bool) -> Result<()> {
    let m = Model::open(path)?;
    let i = m.tensor(name)?;
    if raw {
        let data = m.data(i);
        atomic::write_atomic(out, |w| npy::write_u8(w, &[data.len()], data))?;
        eprintln!(
            "wrote {} stored bytes of {name} to {}",
            data.len(),
            out.display()
        );
        return Ok(());
    }
    let (values, shape): (Vec<f32>, Vec<usize>) = match m.ffn_weight_named(name) {
        Some(w) if m.format == Format::Safetensors => {
            let (v, s) = m.decode_weight(w)?;
            (v, s.iter().map(|&d| d as usize).collect())
        }
        _ => (
            m.decode_tensor(i)?,
            m.tensors[i].shape.iter().map(|&d| d as usize).collect(),
        ),
    };
    atomic::write_atomic(out, |w| npy::write_f32(w, &shape, &values))
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {name} {:?} f32 to {}", shape, out.display());
    Ok(())
}
