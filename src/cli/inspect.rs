//! `metrale-pack inspect` and the fidelity table it and `convert` print.

use super::*;

/// The fidelity table: per layout and projection, the relative error of the decoded weights
/// against the source's (float64), worst layer and mean over layers.
pub(crate) fn write_fidelity(o: &mut impl Write, f: &[pack::Fidelity]) -> std::io::Result<()> {
    if f.is_empty() {
        return Ok(());
    }
    writeln!(
        o,
        "fidelity (||decoded - source|| / ||source||, float64):\n  {:<10} {:<8} {:>12} {:>6} {:>12}",
        "layout", "proj", "worst", "layer", "mean"
    )?;
    for e in f {
        writeln!(
            o,
            "  {:<10} {:<8} {:>12.3e} {:>6} {:>12.3e}",
            e.layout, e.proj, e.worst_rel_err, e.worst_layer, e.mean_rel_err
        )?;
    }
    Ok(())
}

pub(crate) fn inspect(path: &Path, json: bool) -> Result<()> {
    let m = Model::open(path)?;
    let pack_manifest = match &m.files[0] {
        model::SourceFile::Gguf(g) if pack::is_pack(g) => {
            Some(Pack::from_gguf(gguf::GgufFile::open(path)?)?.manifest)
        }
        _ => None,
    };
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
        // Streamed: one JSON value per top-level key and one line per tensor, never the whole
        // document in memory (a file of a million tensors would otherwise take 60x its size).
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
        let head: Vec<(&str, serde_json::Value)> = vec![
            ("format", m.format.name().into()),
            ("files", m.files.iter().map(|f| f.path().display().to_string()).collect::<Vec<_>>().into()),
            ("architecture", serde_json::json!(m.architecture)),
            ("quantization", serde_json::json!(m.quantization)),
            ("hidden_size", serde_json::json!(m.hidden_size)),
            ("intermediate_size", serde_json::json!(m.intermediate_size)),
            ("activation", serde_json::json!(m.activation.map(|a| a.name()))),
            // A pack's FFN layers are its manifest's (the blobs are not named as source weights).
            ("ffn_layers", pack_manifest.as_ref().map_or(m.ffn_layers.len(), |pm| pm.model.ffn_layers).into()),
            ("fidelity", serde_json::json!(pack_manifest.as_ref().map(|pm| &pm.fidelity))),
            ("ffn", layers.into()),
            ("moe_layers", serde_json::json!(m.moe_layers)),
            ("metadata", metadata.into_iter().filter(|(k, _)| k != pack::keys::MANIFEST).map(|(k, v)| (k, serde_json::Value::String(v)))
                .collect::<serde_json::Map<String, serde_json::Value>>().into()),
            ("pack", serde_json::json!(pack_manifest.as_ref().map(|pm| serde_json::json!({
                "format_version": pm.pack_format_version, "converter_version": pm.converter_version,
                "target_arch": pm.target_arch, "kernel_abi": pm.kernel_abi, "layouts": pm.layouts,
                "model": pm.model, "segment_offset": pm.segment_offset, "segment_bytes": pm.segment_bytes,
                "sources": pm.sources, "options": pm.options, "tp": pm.tp,
            })))),
        ];
        let mut o = std::io::BufWriter::new(std::io::stdout().lock());
        writeln!(o, "{{")?;
        for (k, v) in head {
            writeln!(
                o,
                "  {}: {},",
                serde_json::to_string(k)?,
                serde_json::to_string(&v)?
            )?;
        }
        writeln!(o, "  \"tensors\": [")?;
        for (i, t) in m.tensors.iter().enumerate() {
            let sep = if i + 1 < m.tensors.len() { "," } else { "" };
            let v = serde_json::json!({
                "name": t.name, "type": t.dtype.name(), "shape": t.shape,
                "offset": t.offset, "bytes": t.bytes, "file": t.file,
            });
            writeln!(o, "    {}{sep}", serde_json::to_string(&v)?)?;
        }
        writeln!(o, "  ]\n}}")?;
        o.flush()?;
        return Ok(());
    }
    // Names, keys and values come from the file: each is escaped on its way to the terminal
    // (a newline in a name too), and every line again.
    use super::term::escape as esc;
    let mut o = super::term::Escaping::new(std::io::BufWriter::new(std::io::stdout().lock()));
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
    match &pack_manifest {
        Some(pm) => writeln!(
            o,
            "ffn layers: {} (packed as {}), hidden: {}, intermediate: {}, activation: {}",
            pm.model.ffn_layers,
            pm.layouts.join(","),
            pm.model.hidden_size,
            pm.model.intermediate_size,
            pm.model.activation
        )?,
        None => writeln!(
            o,
            "ffn layers: {}, hidden: {}, intermediate: {}, activation: {}",
            m.ffn_layers.len(),
            opt(m.hidden_size),
            opt(m.intermediate_size),
            m.activation.map(|a| a.name()).unwrap_or("?")
        )?,
    }
    if !m.moe_layers.is_empty() {
        writeln!(
            o,
            "layers {:?}: mixture-of-experts (passed through, not packed)",
            m.moe_layers
        )?;
    }
    if m.ffn_layers.iter().enumerate().any(|(i, l)| l.index != i) {
        writeln!(
            o,
            "dense ffn layers: {:?}",
            m.ffn_layers.iter().map(|l| l.index).collect::<Vec<_>>()
        )?;
    }
    if let Some(l) = m.ffn_layers.first() {
        writeln!(
            o,
            "ffn weights (layer {}): gate {} ({}{}), up {}, down {}",
            l.index,
            m.tensors[l.gate.main()].dtype.name(),
            l.gate.scheme(),
            if matches!(l.gate, model::FfnWeight::Half { .. }) {
                ", fused gate+up split in halves"
            } else {
                ""
            },
            m.tensors[l.up.main()].dtype.name(),
            m.tensors[l.down.main()].dtype.name()
        )?;
    }
    if let Some(pm) = &pack_manifest {
        writeln!(
            o,
            "pack: format {} (converter {}), target {} abi {}, layouts {}, {} FFN layers ({} x {}, {}), device segment {} bytes at data+{}",
            pm.pack_format_version,
            pm.converter_version,
            pm.target_arch,
            pm.kernel_abi,
            pm.layouts.join(","),
            pm.model.ffn_layers,
            pm.model.intermediate_size,
            pm.model.hidden_size,
            pm.model.activation,
            pm.segment_bytes,
            pm.segment_offset
        )?;
        for s in &pm.sources {
            writeln!(
                o,
                "  source {} ({} bytes, xxh3 {})",
                esc(&s.name),
                s.bytes,
                s.xxh3
            )?;
        }
        if let Some(tp) = &pm.tp {
            let heads = tp
                .heads
                .map(|[h, kv]| format!(", attention split by {h} heads / {kv} KV heads"))
                .unwrap_or_default();
            writeln!(
                o,
                "  tensor-parallel: {} ranks{heads}; replicated {} bytes, per rank {}",
                tp.ranks,
                tp.replicated[1],
                tp.rank_segments
                    .iter()
                    .map(|r| r[1].to_string())
                    .collect::<Vec<_>>()
                    .join(" / ")
            )?;
        }
        write_fidelity(&mut o, &pm.fidelity)?;
    }
    writeln!(o, "metadata ({} keys):", metadata.len())?;
    for (k, v) in &metadata {
        writeln!(o, "  {} = {}", esc(k), esc(v))?;
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
            esc(&t.name),
            t.dtype.name(),
            format!("{:?}", t.shape),
            t.offset,
            t.bytes
        )?;
    }
    o.flush()?;
    Ok(())
}
