//! What `Pack::open` checks before anything reads a pack's numbers: every header byte (KV
//! metadata, the tokenizer included, the tensor table, the manifest, the header's own padding)
//! against `metrale.pack.header_xxh3`, and every manifest field against the blobs and the layout
//! registry (`LayoutSpec::padded_shape`, `LayoutSpec::part_bytes`), with checked arithmetic. `verify`
//! adds the tensor checksums and checks that every byte of padding between and after tensors is
//! zero, so no byte of a pack can change without `verify` failing.

use crate::converters::layouts::{Layout, Proj};
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};
use crate::pack::{FfnEntry, Manifest, TensorEntry, keys};
use std::collections::{BTreeMap, HashMap, HashSet};
use xxhash_rust::xxh3::Xxh3;

/// xxh3-64 of the header `[0, data_offset)` with the checksum's own 8 value bytes read as zeros.
pub fn header_digest(header: &[u8], value_at: usize) -> u64 {
    let mut h = Xxh3::new();
    h.update(&header[..value_at]);
    h.update(&[0u8; 8]);
    h.update(&header[value_at + 8..]);
    h.digest()
}

/// Check the header checksum of an opened pack.
pub fn check_header(file: &GgufFile) -> Result<()> {
    let f = file.path.display().to_string();
    let kv = file
        .kvs
        .iter()
        .find(|kv| kv.key == keys::HEADER_XXH3)
        .ok_or_else(|| Error::Metadata {
            file: f.clone(),
            key: keys::HEADER_XXH3.into(),
            reason: "missing; re-convert the model with this metrale-pack".into(),
        })?;
    let Value::U64(want) = kv.value else {
        return Err(Error::Metadata {
            file: f,
            key: keys::HEADER_XXH3.into(),
            reason: format!("must be a u64, found {:?}", kv.value),
        });
    };
    // As `header_digest`, a MiB at a time, each dropped from the resident set once hashed:
    // a pack of 100k tensors has a 12 MB header, held parsed already.
    let (at, end) = (kv.span.end - 8, file.data_offset as usize);
    let hash = |h: &mut Xxh3, range: std::ops::Range<usize>| {
        for start in range.clone().step_by(1 << 20) {
            let stop = (start + (1 << 20)).min(range.end);
            h.update(&file.map[start..stop]);
            file.release(start as u64, stop as u64);
        }
    };
    let mut h = Xxh3::new();
    hash(&mut h, 0..at);
    h.update(&[0u8; 8]);
    hash(&mut h, at + 8..end);
    let got = h.digest();
    if got != want {
        return Err(Error::Metadata {
            file: f,
            key: keys::HEADER_XXH3.into(),
            reason: format!(
                "the header (metadata, tensor table, manifest) hashes to {got:016x}, the pack says {want:016x}: it was changed after conversion"
            ),
        });
    }
    Ok(())
}

/// Bytes per element of a source dtype name, where the name is one this tool writes.
fn dtype_size(name: &str) -> Option<u64> {
    Some(match name {
        "U8" | "I8" | "BOOL" | "F8_E4M3" | "F8_E5M2" | "F8_E8M0" => 1,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "F32" | "I32" | "U32" => 4,
        "F64" | "I64" | "U64" => 8,
        _ => return None,
    })
}

/// The error constructors of one pack's checks: a metadata field, a tensor's field.
type Meta<'a> = &'a dyn Fn(&str, String) -> Error;
type Bad<'a> = &'a dyn Fn(&str, &'static str, String) -> Error;

/// What identifies one FFN blob: (layer, layout, projection, part, rank).
type BlobKey = (usize, Layout, Proj, String, Option<u32>);

/// Every manifest field against the tensor table and the layout registry.
pub fn check_manifest(file: &GgufFile, m: &Manifest) -> Result<()> {
    let f = file.path.display().to_string();
    let bad = |tensor: &str, field: &'static str, reason: String| Error::Tensor {
        file: f.clone(),
        tensor: tensor.into(),
        field,
        reason,
    };
    let meta = |field: &str, reason: String| Error::Metadata {
        file: f.clone(),
        key: format!("{}.{field}", keys::MANIFEST),
        reason,
    };
    let data_len = (file.map.len() as u64).saturating_sub(file.data_offset);
    let (layouts, indices) = check_model(m, data_len, &meta)?;
    let ranks = check_tp(file, m, &meta, &bad)?;
    let mut seen = HashSet::new();
    let mut scalars = BlobScalars::new();
    for (e, t) in m.tensors.iter().zip(&file.tensors) {
        let Some(fe) = &e.ffn else {
            check_passthrough(e, &bad)?;
            continue;
        };
        let key = check_blob_identity(e, fe, m, &layouts, &indices, &bad)?;
        check_blob_sizes(e, fe, t.bytes, &key, m, &meta, &bad)?;
        check_same_scalars(&mut scalars, &key, e, fe, &bad)?;
        if !seen.insert(key) {
            return Err(Error::DuplicateTensor {
                file: f.clone(),
                tensor: e.name.to_string(),
            });
        }
    }
    check_complete(m, &layouts, &indices, &ranks, &seen, &f)
}

/// The first part's scalars of each blob (layer, layout, projection, rank).
type BlobScalars<'a> = HashMap<(usize, Layout, Proj, Option<u32>), &'a BTreeMap<String, f32>>;

/// A blob's parts share its scalars (the codes of one scheme read with another's scales would
/// decode wrongly): `fe`'s equal the first part's.
fn check_same_scalars<'a>(
    seen: &mut BlobScalars<'a>,
    &(layer, layout, proj, _, rank): &BlobKey,
    e: &TensorEntry,
    fe: &'a FfnEntry,
    bad: Bad,
) -> Result<()> {
    let first = *seen
        .entry((layer, layout, proj, rank))
        .or_insert(&fe.scalars);
    if first != &fe.scalars {
        return Err(bad(
            &e.name,
            "ffn.scalars",
            format!(
                "{:?} differ from {first:?}, the scalars of another part of this {} blob",
                fe.scalars,
                layout.tag()
            ),
        ));
    }
    Ok(())
}

/// The segment inside the data section, the layouts known, the activation, the layer indices
/// increasing and the sizes set: (the layouts, the dense layer indices).
fn check_model(m: &Manifest, data_len: u64, meta: Meta) -> Result<(Vec<Layout>, Vec<usize>)> {
    m.segment_offset
        .checked_add(m.segment_bytes)
        .filter(|&e| e <= data_len)
        .ok_or_else(|| {
            meta(
                "segment",
                format!(
                    "offset {} + {} bytes runs past the data section ({data_len} bytes)",
                    m.segment_offset, m.segment_bytes
                ),
            )
        })?;
    let (hidden, inter) = (m.model.hidden_size, m.model.intermediate_size);
    let mut layouts = Vec::new();
    for t in &m.layouts {
        layouts.push(
            Layout::from_tag(t).ok_or_else(|| meta("layouts", format!("unknown layout {t:?}")))?,
        );
    }
    if m.model.activation != "silu" && m.model.activation != "gelu" {
        return Err(meta(
            "model.activation",
            format!("{:?} (silu or gelu)", m.model.activation),
        ));
    }
    let indices = m.model.layer_indices();
    if indices.len() != m.model.ffn_layers || indices.windows(2).any(|w| w[0] >= w[1]) {
        return Err(meta(
            "model.dense_layers",
            format!(
                "{:?}: {} increasing layer indices expected",
                m.model.dense_layers, m.model.ffn_layers
            ),
        ));
    }
    if m.model.ffn_layers > 0 && (hidden == 0 || inter == 0) {
        return Err(meta(
            "model",
            format!("hidden {hidden} / intermediate {inter} with FFN layers"),
        ));
    }
    Ok((layouts, indices))
}

/// One FFN blob's layout (listed), projection (the layout's), layer (the pack's), part (the
/// layout's) and name (the one those give): its key.
fn check_blob_identity(
    e: &TensorEntry,
    fe: &FfnEntry,
    m: &Manifest,
    layouts: &[Layout],
    indices: &[usize],
    bad: Bad,
) -> Result<BlobKey> {
    let name = e.name.as_str();
    let rank = e.tp.as_ref().map(|t| t.rank);
    let layout = Layout::from_tag(&fe.layout)
        .filter(|l| layouts.contains(l))
        .ok_or_else(|| {
            bad(
                name,
                "ffn.layout",
                format!("{:?} is not a layout this pack lists", fe.layout),
            )
        })?;
    let proj = Proj::from_name(&fe.proj)
        .filter(|p| layout.spec().projections().contains(p))
        .ok_or_else(|| {
            bad(
                name,
                "ffn.proj",
                format!("{:?} is not a projection of {}", fe.proj, layout.tag()),
            )
        })?;
    if indices.binary_search(&fe.layer).is_err() {
        return Err(bad(
            name,
            "ffn.layer",
            format!(
                "{} is not one of the pack's {} FFN layers",
                fe.layer, m.model.ffn_layers
            ),
        ));
    }
    if !layout
        .spec()
        .parts(proj, m.options.q4k_down)
        .contains(&fe.part.as_str())
    {
        return Err(bad(
            name,
            "ffn.part",
            format!(
                "{:?} is not a part of {} {}",
                fe.part,
                layout.tag(),
                proj.name()
            ),
        ));
    }
    if name != crate::pack::blob_name_tp(fe.layer, proj, layout, &fe.part, rank) {
        return Err(bad(
            name,
            "name",
            "does not match its layer, projection, layout and part".into(),
        ));
    }
    Ok((fe.layer, layout, proj, fe.part.clone(), rank))
}

/// One FFN blob's shape (the model's, or its rank's slice), padding (its layout's), scalars
/// (the layout's names, finite), bytes (what the layout's part takes) and scales part.
fn check_blob_sizes(
    e: &TensorEntry,
    fe: &FfnEntry,
    bytes: u64,
    &(_, layout, proj, _, rank): &BlobKey,
    m: &Manifest,
    meta: Meta,
    bad: Bad,
) -> Result<()> {
    let name = e.name.as_str();
    let hidden = m.model.hidden_size;
    // A rank's slice: its intermediate range (check_tp checked it is the rank's).
    let inter = match &e.tp {
        Some(ts) => ts.range[1] - ts.range[0] + ts.pad,
        None => m.model.intermediate_size,
    };
    let want = match proj {
        Proj::Gate | Proj::Up => [inter, hidden],
        Proj::Down => [hidden, inter],
        Proj::GateUp => [
            inter
                .checked_mul(2)
                .ok_or_else(|| meta("model.intermediate_size", "overflows".into()))?,
            hidden,
        ],
    };
    if fe.shape != want {
        return Err(bad(
            name,
            "ffn.shape",
            format!("{:?}, but the model's sizes give {want:?}", fe.shape),
        ));
    }
    let padded = layout.spec().padded_shape(proj, fe.shape);
    if padded != Some(fe.padded) {
        return Err(bad(
            name,
            "ffn.padded",
            format!(
                "{:?}, but {} pads {:?} to {padded:?}",
                fe.padded,
                layout.tag(),
                fe.shape
            ),
        ));
    }
    check_scalars(name, fe, layout, bad)?;
    if let Err(why) = layout.spec().check_scalars(&fe.scalars, fe.padded) {
        return Err(bad(name, "ffn.scalars", why));
    }
    let want = layout
        .spec()
        .part_bytes_with(&fe.part, fe.padded, &fe.scalars);
    if want != Some(bytes) {
        return Err(bad(
            name,
            "bytes",
            format!(
                "{bytes} bytes, but {} {:?} part {:?} takes {want:?}",
                layout.tag(),
                fe.padded,
                fe.part
            ),
        ));
    }
    if let Some(s) = &fe.scales
        && *s != crate::pack::blob_name_tp(fe.layer, proj, layout, "scales", rank)
    {
        return Err(bad(
            name,
            "ffn.scales",
            format!("{s:?} is not this blob's scales part"),
        ));
    }
    Ok(())
}

/// A blob's scalars: every one of its layout's names, no other but its optional ones, finite
/// and non-negative (LoRA's `scaling` and ggml's `output_scale` may be negative); returns the LoRA rank (0 for other
/// layouts).
fn check_scalars(name: &str, fe: &FfnEntry, layout: Layout, bad: Bad) -> Result<u64> {
    let (names, optional) = (
        layout.spec().scalar_names(),
        layout.spec().optional_scalars(),
    );
    let known = |k: &str| names.contains(&k) || optional.contains(&k);
    if !names.iter().all(|s| fe.scalars.contains_key(*s)) || !fe.scalars.keys().all(|k| known(k)) {
        return Err(bad(
            name,
            "ffn.scalars",
            format!(
                "{:?}, {} records {names:?} (and may record {optional:?})",
                fe.scalars.keys().collect::<Vec<_>>(),
                layout.tag()
            ),
        ));
    }
    for (k, &v) in &fe.scalars {
        if !v.is_finite() || v < 0.0 && k != "scaling" && k != "output_scale" {
            return Err(bad(
                name,
                "ffn.scalars",
                format!("{k} = {v} is not a finite non-negative value"),
            ));
        }
    }
    match fe.scalars.get("rank") {
        Some(&r) if r >= 1.0 && r.fract() == 0.0 && r as usize <= crate::ffn::LORA_MAX_RANK => {
            Ok(r as u64)
        }
        Some(&r) => Err(bad(
            name,
            "ffn.scalars",
            format!("rank {r} (1..={})", crate::ffn::LORA_MAX_RANK),
        )),
        None => Ok(0),
    }
}

/// Every layer holds every listed layout whole, on every rank (LoRA: each projection's a and
/// b, or neither).
fn check_complete(
    m: &Manifest,
    layouts: &[Layout],
    indices: &[usize],
    ranks: &[Option<u32>],
    seen: &HashSet<BlobKey>,
    f: &str,
) -> Result<()> {
    for &layer in indices {
        for &layout in layouts {
            for &proj in layout.spec().projections() {
                for &rank in ranks {
                    let parts = layout.spec().parts(proj, m.options.q4k_down);
                    let have: Vec<bool> = parts
                        .iter()
                        .map(|p| seen.contains(&(layer, layout, proj, p.to_string(), rank)))
                        .collect();
                    let whole = have.iter().all(|&h| h);
                    if !(whole || layout == Layout::Lora && have.iter().all(|&h| !h)) {
                        let missing = parts
                            .iter()
                            .zip(&have)
                            .find(|(_, h)| !**h)
                            .map(|(p, _)| *p)
                            .unwrap_or("");
                        return Err(Error::NotFound {
                            file: f.to_string(),
                            tensor: crate::pack::blob_name_tp(layer, proj, layout, missing, rank),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// A tensor-parallel pack's segment layout and every slice's rank, rule and range; the ranks
/// whose FFN blobs the pack must hold (`[None]` for a pack that is not tensor-parallel).
fn check_tp(file: &GgufFile, m: &Manifest, meta: Meta, bad: Bad) -> Result<Vec<Option<u32>>> {
    let Some(tp) = &m.tp else {
        if m.options.tp != 1 {
            return Err(meta(
                "options.tp",
                format!("{} without a tp section", m.options.tp),
            ));
        }
        if let Some(e) = m.tensors.iter().find(|e| e.tp.is_some()) {
            return Err(bad(
                &e.name,
                "tp",
                "a slice in a pack that is not tensor-parallel".into(),
            ));
        }
        return Ok(vec![None]);
    };
    let n = tp.ranks;
    if !(2..=crate::pack::tp::MAX_TP_RANKS).contains(&n)
        || m.options.tp != n
        || tp.rank_segments.len() != n as usize
    {
        return Err(meta(
            "tp.ranks",
            format!(
                "{n} ranks, {} rank segments, options.tp {} (2 to {} and all equal)",
                tp.rank_segments.len(),
                m.options.tp,
                crate::pack::tp::MAX_TP_RANKS
            ),
        ));
    }
    // Replicated range then rank 0..N, contiguous, page-aligned, exactly the device segment.
    let mut at = m.segment_offset;
    for (i, r) in std::iter::once(&tp.replicated)
        .chain(&tp.rank_segments)
        .enumerate()
    {
        if r[0] != at || r[0] % crate::pack::PACK_ALIGNMENT != 0 {
            return Err(meta(
                "tp",
                format!(
                    "range {i} starts at {} but the previous one ends at {at} (ranges are contiguous and page-aligned)",
                    r[0]
                ),
            ));
        }
        at = r[0]
            .checked_add(r[1])
            .ok_or_else(|| meta("tp", format!("range {i} overflows")))?;
    }
    if at != m.segment_offset + m.segment_bytes {
        return Err(meta(
            "tp",
            format!(
                "the ranges end at {at}, the device segment at {}",
                m.segment_offset + m.segment_bytes
            ),
        ));
    }
    let inter = m.model.intermediate_size;
    for (e, t) in m.tensors.iter().zip(&file.tensors) {
        let Some(ts) = &e.tp else {
            if e.device
                && !(tp.replicated[0]..tp.replicated[0] + tp.replicated[1]).contains(&t.offset)
                && t.bytes > 0
            {
                return Err(bad(
                    &e.name,
                    "tp",
                    "a replicated tensor outside the replicated range".into(),
                ));
            }
            continue;
        };
        let rule = crate::pack::tp::Rule::from_name(&ts.rule)
            .ok_or_else(|| bad(&e.name, "tp.rule", format!("unknown rule {:?}", ts.rule)))?;
        let seg = tp.rank_segments.get(ts.rank as usize).ok_or_else(|| {
            bad(
                &e.name,
                "tp.rank",
                format!("rank {} of a pack of {n} ranks", ts.rank),
            )
        })?;
        if !e.device || !(seg[0]..seg[0] + seg[1]).contains(&t.offset) {
            return Err(bad(
                &e.name,
                "tp.rank",
                format!(
                    "rank {}'s slice lies outside rank {}'s segment",
                    ts.rank, ts.rank
                ),
            ));
        }
        let want_rule = match e.ffn.as_ref().map(|f| f.proj.as_str()) {
            None => None,
            Some("down") => Some(crate::pack::tp::Rule::FfnCols),
            Some(_) => Some(crate::pack::tp::Rule::FfnRows),
        };
        if let Some(w) = want_rule {
            let want = crate::pack::tp::rank_range(inter, n, ts.rank);
            let pad = crate::pack::tp::padded_width(want[1] - want[0]) - (want[1] - want[0]);
            if rule != w || ts.range != want || ts.pad != pad {
                return Err(bad(
                    &e.name,
                    "tp.range",
                    format!(
                        "{} {:?}, but rank {} of {n} holds {} {want:?} of the intermediate size {inter}",
                        ts.rule,
                        ts.range,
                        ts.rank,
                        w.name()
                    ),
                ));
            }
        } else if matches!(
            rule,
            crate::pack::tp::Rule::FfnRows | crate::pack::tp::Rule::FfnCols
        ) || ts.range[0] > ts.range[1]
            || ts.pad != 0
        {
            return Err(bad(
                &e.name,
                "tp.rule",
                format!("{} {:?} on an attention slice", ts.rule, ts.range),
            ));
        }
    }
    Ok((0..n).map(Some).collect())
}

fn check_passthrough(e: &TensorEntry, bad: Bad) -> Result<()> {
    if let Some(shape) = &e.source_shape {
        let elems = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let want = dtype_size(&e.source_type).and_then(|s| elems?.checked_mul(s));
        if want != Some(e.bytes) {
            return Err(bad(
                &e.name,
                "source_shape",
                format!("{} {shape:?} is not {} bytes", e.source_type, e.bytes),
            ));
        }
    }
    Ok(())
}

/// Names of the tensors followed by non-zero padding (up to the next tensor or the end).
pub fn nonzero_padding(file: &GgufFile) -> Result<Vec<String>> {
    let data = file.data_offset;
    let len = file.map.len() as u64;
    let mut out = Vec::new();
    for (i, t) in file.tensors.iter().enumerate() {
        let start = data.saturating_add(t.offset).saturating_add(t.bytes);
        let end = file
            .tensors
            .get(i + 1)
            .map(|n| data.saturating_add(n.offset))
            .unwrap_or(len)
            .min(len);
        let mut nonzero = false;
        // pread, not the map: a file truncated meanwhile gives an error, not SIGBUS.
        file.read_range(start, end, &t.name, |c| {
            nonzero |= c.iter().any(|&b| b != 0)
        })?;
        if nonzero {
            out.push(t.name.to_string());
        }
    }
    Ok(out)
}
