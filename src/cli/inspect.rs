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
    let pack = match &m.files[0] {
        model::SourceFile::Gguf(g) if pack::is_pack(g) => {
            Some(Pack::from_gguf(gguf::GgufFile::open(path)?)?)
        }
        _ => None,
    };
    let pack_manifest = pack.as_ref().map(|p| &p.manifest);
    if json {
        return inspect_json(&m, pack.as_ref());
    }
    // Names, keys and values come from the file: each is escaped on its way to the terminal
    // (a newline in a name too), and every line again.
    let mut o = super::term::Escaping::new(std::io::BufWriter::new(std::io::stdout().lock()));
    write_model(&mut o, &m, pack_manifest)?;
    if let Some(pm) = pack_manifest {
        write_pack(&mut o, pm)?;
    }
    write_metadata_and_tensors(&mut o, &m)?;
    o.flush()?;
    Ok(())
}

/// The model view: format, files, architecture, sizes, the FFN layers and their weights (a
/// pack's as its manifest has them).
fn write_model(
    o: &mut impl Write,
    m: &Model,
    pack_manifest: Option<&pack::Manifest>,
) -> Result<()> {
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
    Ok(())
}

/// A pack's header fields, sources, tensor-parallel split and fidelity table.
fn write_pack(o: &mut impl Write, pm: &pack::Manifest) -> Result<()> {
    use super::term::escape as esc;
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
    write_fidelity(o, &pm.fidelity)?;
    Ok(())
}

/// The metadata (values summarised) and the tensor table.
fn write_metadata_and_tensors(o: &mut impl Write, m: &Model) -> Result<()> {
    use super::term::escape as esc;
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
    Ok(())
}

/// A metadata value as JSON: numbers, booleans, strings whole, arrays element by element
/// (non-finite floats, which JSON cannot hold, as the strings `NaN`, `inf`, `-inf`).
fn value_json(v: &gguf::Value) -> serde_json::Value {
    use gguf::Value as V;
    let float = |x: f64| {
        serde_json::Number::from_f64(x).map_or_else(
            || serde_json::Value::String(format!("{x}")),
            serde_json::Value::Number,
        )
    };
    match v {
        V::U8(x) => (*x).into(),
        V::I8(x) => (*x).into(),
        V::U16(x) => (*x).into(),
        V::I16(x) => (*x).into(),
        V::U32(x) => (*x).into(),
        V::I32(x) => (*x).into(),
        V::U64(x) => (*x).into(),
        V::I64(x) => (*x).into(),
        V::F32(x) => float(*x as f64),
        V::F64(x) => float(*x),
        V::Bool(x) => (*x).into(),
        V::String(x) => x.as_str().into(),
        V::Array(_, xs) => xs.iter().map(value_json).collect::<Vec<_>>().into(),
        // `GgufFile::whole_value` holds every value whole; these never reach here.
        V::LongArray(..) | V::LongString(_) => serde_json::Value::Null,
    }
}

/// `inspect --json`: the model view, every metadata value whole, for a pack its manifest (the
/// header's fields, the FFN blobs by layer, each tensor's manifest entry), and every tensor.
/// Streamed: one JSON value per top-level key and per metadata key, one line per tensor, never
/// the whole document in memory (a file of a million tensors would otherwise take 60x its
/// size). Its field names are pinned by `tests/inspect_json.rs`.
fn inspect_json(m: &Model, pack: Option<&Pack>) -> Result<()> {
    let pm = pack.map(|p| &p.manifest);
    let ffn: Vec<serde_json::Value> = match pm {
        // A pack's FFN layers are its manifest's blobs (not named as source weights).
        Some(pm) => {
            let mut layers: std::collections::BTreeMap<usize, Vec<serde_json::Value>> =
                Default::default();
            for e in &pm.tensors {
                if let Some(fe) = &e.ffn {
                    layers.entry(fe.layer).or_default().push(serde_json::json!({
                        "tensor": e.name, "layout": fe.layout, "proj": fe.proj, "part": fe.part,
                        "shape": fe.shape, "padded": fe.padded, "bytes": e.bytes,
                    }));
                }
            }
            layers
                .into_iter()
                .map(|(index, blobs)| serde_json::json!({"index": index, "blobs": blobs}))
                .collect()
        }
        None => m
            .ffn_layers
            .iter()
            .map(|l| {
                let w = |w: &model::FfnWeight| {
                    serde_json::json!({"tensor": m.tensors[w.main()].name, "scheme": w.scheme(),
                        "type": m.tensors[w.main()].dtype.name(), "shape": m.weight_shape(w).ok()})
                };
                serde_json::json!({"index": l.index, "gate": w(&l.gate), "up": w(&l.up), "down": w(&l.down)})
            })
            .collect(),
    };
    let head: Vec<(&str, serde_json::Value)> = vec![
        ("format", m.format.name().into()),
        ("files", m.files.iter().map(|f| f.path().display().to_string()).collect::<Vec<_>>().into()),
        ("architecture", serde_json::json!(m.architecture)),
        ("quantization", serde_json::json!(m.quantization)),
        ("hidden_size", serde_json::json!(m.hidden_size)),
        ("intermediate_size", serde_json::json!(m.intermediate_size)),
        ("activation", serde_json::json!(m.activation.map(|a| a.name()))),
        ("ffn_layers", pm.map_or(m.ffn_layers.len(), |pm| pm.model.ffn_layers).into()),
        ("fidelity", serde_json::json!(pm.map(|pm| &pm.fidelity))),
        ("ffn", ffn.into()),
        ("moe_layers", serde_json::json!(m.moe_layers)),
        ("pack", serde_json::json!(pm.map(|pm| serde_json::json!({
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
    writeln!(o, "  \"metadata\": {{")?;
    let mut first = true;
    let mut item = |o: &mut std::io::BufWriter<_>, k: &str, v: serde_json::Value| -> Result<()> {
        let sep = if std::mem::take(&mut first) {
            ""
        } else {
            ",\n"
        };
        write!(
            o,
            "{sep}    {}: {}",
            serde_json::to_string(k)?,
            serde_json::to_string(&v)?
        )?;
        Ok(())
    };
    match &m.files[0] {
        model::SourceFile::Gguf(g) => {
            for kv in g.kvs.iter().filter(|kv| kv.key != pack::keys::MANIFEST) {
                item(&mut o, &kv.key, value_json(&g.whole_value(kv)?))?;
            }
        }
        model::SourceFile::Safetensors(s) => {
            let mut v: Vec<_> = s.metadata.iter().collect();
            v.sort();
            for (k, val) in v {
                item(&mut o, k, val.as_str().into())?;
            }
        }
    }
    writeln!(o, "\n  }},\n  \"tensors\": [")?;
    for (i, t) in m.tensors.iter().enumerate() {
        let sep = if i + 1 < m.tensors.len() { "," } else { "" };
        let mut v = serde_json::json!({
            "name": t.name, "type": t.dtype.name(), "shape": t.shape,
            "offset": t.offset, "bytes": t.bytes, "file": t.file,
        });
        // A pack's tensor with its manifest entry (pads have none).
        if let Some((p, j)) = pack.and_then(|p| p.index(&t.name).map(|j| (p, j))) {
            v["entry"] = serde_json::to_value(&p.manifest.tensors[j])?;
        }
        writeln!(o, "    {}{sep}", serde_json::to_string(&v)?)?;
    }
    writeln!(o, "  ]\n}}")?;
    o.flush()?;
    Ok(())
}
