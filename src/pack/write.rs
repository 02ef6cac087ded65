//! `convert`: streaming, crash-safe writing of a pack.

use super::plan::{Item, companions};
use super::*;
use crate::GgmlType;
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::gguf_write::GgufBuilder;
use crate::model::{Model, SourceFile};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

/// Progress callback: (bytes of source processed so far, total).
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// Convert `model` to a pack at `out` (crash-safe). Returns the manifest written.
pub fn convert(
    model: &Model,
    opts: &ConvertOptions,
    out: &Path,
    progress: Progress,
) -> Result<Manifest> {
    let file = out.display().to_string();
    let io = |err: std::io::Error| Error::Write {
        file: file.clone(),
        step: "write",
        err,
    };
    let json = |e: serde_json::Error| Error::Output {
        file: file.clone(),
        reason: format!("encoding the manifest: {e}"),
    };
    let plan = Plan::new(model, opts)?;
    // Source identity: names, sizes and a content hash of every source file.
    let sources: Vec<SourceInfo> = model
        .files
        .iter()
        .map(|f| {
            let bytes = f.bytes();
            // Streamed hash, dropping each chunk's pages behind it to keep the resident set small.
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for (c, chunk) in bytes.chunks(64 << 20).enumerate() {
                h.update(chunk);
                f.release(
                    (c as u64) << 26,
                    ((c as u64 + 1) << 26).min(bytes.len() as u64),
                );
            }
            SourceInfo {
                name: f
                    .path()
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default(),
                bytes: bytes.len() as u64,
                xxh3: hex(h.digest()),
            }
        })
        .collect();

    // Placeholder header: every tensor with size 0, manifest with empty checksums.
    let header_for = |entries: &[PlannedTensor],
                      manifest: &Manifest,
                      reserve: usize|
     -> Result<(GgufBuilder, usize)> {
        let mut b = GgufBuilder::new(PACK_ALIGNMENT);
        b.reserve_kv(metadata_bytes(model) + reserve + 4096);
        copy_metadata(model, &mut b);
        b.add_kv(keys::FORMAT_VERSION, &Value::U32(PACK_FORMAT_VERSION));
        b.add_kv(
            keys::CONVERTER_VERSION,
            &Value::String(CONVERTER_VERSION.into()),
        );
        b.add_kv(keys::TARGET_ARCH, &Value::String(TARGET_ARCH.into()));
        b.add_kv(keys::KERNEL_ABI, &Value::U32(KERNEL_ABI_VERSION));
        b.add_kv(keys::SEGMENT_OFFSET, &Value::U64(manifest.segment_offset));
        b.add_kv(keys::SEGMENT_BYTES, &Value::U64(manifest.segment_bytes));
        let mut json = serde_json::to_string(manifest).map_err(json)?;
        let reserve = reserve.max(json.len());
        json.push_str(&" ".repeat(reserve - json.len()));
        b.add_kv(keys::MANIFEST, &Value::String(json));
        b.add_kv(keys::HEADER_XXH3, &Value::U64(0));
        for (name, ty, ne) in entries {
            b.add_tensor(name, ne, *ty);
        }
        Ok((b, reserve))
    };

    // Which items start on a page: a pad tensor is planned before each (its size known only
    // once the bytes before it are), and one after the last.
    let page_before = page_starts(&plan.items);
    let (planned, placeholder_entries, pads) = planned_table(&plan.items, &page_before);
    // Reserve room for the real manifest: the placeholder lists every passthrough entry but its
    // 16-digit checksum; each FFN blob's entry (absent from it) is bounded by 700 bytes; the
    // fidelity table (at most 9 layouts x 3 projections) and the tensor-parallel ranges by
    // 27 x 200 + 1024.
    let mut pm = plan.manifest(placeholder_entries, (0, 0), None);
    pm.sources = sources.clone();
    let n_blobs = plan
        .items
        .iter()
        .filter(|i| matches!(i, Item::Blob { .. }))
        .count();
    let reserve = serde_json::to_string(&pm).map_err(json)?.len()
        + 16 * (plan.items.len() - n_blobs)
        + 700 * n_blobs
        + 27 * 200
        + 1024;
    // The header ends on a page, so the data section starts on one.
    let raw = header_for(&planned, &pm, reserve)?.0.header_len();
    let reserve = reserve + (raw.div_ceil(PACK_PAGE as usize) * PACK_PAGE as usize - raw);
    let (ph, reserve) = header_for(&planned, &pm, reserve)?;
    let header_len = ph.header_len();
    drop((ph, pm));
    debug_assert_eq!(header_len % PACK_PAGE as usize, 0);

    let total: u64 = model.tensors.iter().map(|t| t.bytes).sum();
    let n_pass = plan
        .items
        .iter()
        .filter(|i| matches!(i, Item::Passthrough { .. } | Item::Slice { .. }))
        .count();
    // The segment starts at the first device tensor (host tensors come first).
    let n_host = plan
        .items
        .iter()
        .take_while(|i| matches!(i, Item::Passthrough { entry, .. } if !entry.device))
        .count();
    // Progress of the FFN part: each blob advances by its layer's source bytes / blobs per layer.
    let blobs_per_layer = (plan.items.len() - n_pass) as u64 / model.ffn_layers.len() as u64;
    let layer_bytes: Vec<u64> = model
        .ffn_layers
        .iter()
        .map(|l| {
            [&l.gate, &l.up, &l.down]
                .iter()
                .flat_map(|w| companions(w))
                .map(|i| model.tensors[i].bytes)
                .sum()
        })
        .collect();
    let mut validated = None;
    crate::atomic::write_atomic_checked(
        out,
        |w| -> Result<()> {
            w.write_all(&vec![0u8; header_len]).map_err(io)?;
            let mut pos = 0u64; // data-relative
            let mut done = 0u64;
            let mut entries: Vec<TensorEntry> = Vec::with_capacity(plan.items.len());
            let mut seg_start = None;
            let mut starts = Vec::with_capacity(plan.items.len());
            let mut pad_bytes: Vec<u64> = Vec::with_capacity(pads + 1);
            let mut pad_to_page =
                |w: &mut std::io::BufWriter<std::fs::File>, pos: &mut u64| -> Result<()> {
                    let pad = (PACK_PAGE - *pos % PACK_PAGE) % PACK_PAGE;
                    w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
                    *pos += pad;
                    pad_bytes.push(pad);
                    Ok(())
                };
            plan.produce(|name, bytes, mut entry| {
                if page_before[entries.len()] {
                    pad_to_page(w, &mut pos)?;
                }
                if entries.len() == n_host {
                    seg_start = Some(pos);
                }
                starts.push(pos);
                entry.xxh3 = hex(xxh3_64(bytes));
                entry.bytes = bytes.len() as u64;
                w.write_all(bytes).map_err(io)?;
                let padded = (bytes.len() as u64).div_ceil(PACK_ALIGNMENT) * PACK_ALIGNMENT;
                w.write_all(&vec![0u8; (padded - bytes.len() as u64) as usize])
                    .map_err(io)?;
                pos += padded;
                done += match &entry.ffn {
                    None => bytes.len() as u64,
                    Some(fe) => {
                        layer_bytes[plan.layer_pos.get(&fe.layer).copied().unwrap_or(0)]
                            / blobs_per_layer.max(1)
                    }
                };
                progress(done.min(total), total);
                debug_assert_eq!(name, entry.name);
                entries.push(entry);
                Ok(())
            })?;
            // The file (and the segment, or the last rank's) ends on a page.
            pad_to_page(w, &mut pos)?;
            let seg = seg_start.map(|s| (s, pos - s)).unwrap_or((pos, 0));
            // A tensor-parallel pack: the replicated range, then each rank's segment.
            let tp = match plan.tp() {
                (1, _) => None,
                (n, heads) => {
                    let first_of = |r: u32| {
                        entries
                            .iter()
                            .position(|e| e.tp.as_ref().is_some_and(|t| t.rank == r))
                            .map_or(pos, |i| starts[i])
                    };
                    let bounds: Vec<u64> = (0..n).map(first_of).chain([pos]).collect();
                    Some(TpInfo {
                        ranks: n,
                        heads: heads.map(|(h, kv)| [h, kv]),
                        replicated: [seg.0, bounds[0] - seg.0],
                        rank_segments: bounds.windows(2).map(|w| [w[0], w[1] - w[0]]).collect(),
                    })
                }
            };
            // The real header, same length as the placeholder: the blobs' and the pads' sizes.
            let (mut ents, mut padn) = (entries.iter(), pad_bytes.iter());
            let real: Vec<PlannedTensor> = planned
                .iter()
                .map(|(name, ty, ne)| {
                    if name.starts_with(PAD_PREFIX) {
                        let p = padn.next().copied().unwrap_or(0);
                        return (name.clone(), GgmlType::I8, vec![p]);
                    }
                    let e = ents.next().expect("an entry per planned tensor");
                    assert_eq!(name, &e.name);
                    if e.ffn.is_some() {
                        (name.clone(), GgmlType::I8, vec![e.bytes])
                    } else {
                        (name.clone(), *ty, ne.clone())
                    }
                })
                .collect();
            let mut man = plan.manifest(entries, seg, tp);
            man.sources = sources.clone();
            let (rb, _) = header_for(&real, &man, reserve)?;
            let mut header = rb.header();
            // The checksum is the last KV: its value is the 8 bytes before the tensor infos.
            let at = rb.kv_end() - 8;
            let digest = crate::pack_check::header_digest(&header, at);
            header[at..at + 8].copy_from_slice(&digest.to_le_bytes());
            if header.len() != header_len {
                return Err(Error::Output {
                    file: file.clone(),
                    reason: format!(
                        "internal: header grew from {header_len} to {} bytes",
                        header.len()
                    ),
                });
            }
            // A source that shrank while it was read gave zeros: never name such a pack.
            model.check_intact()?;
            w.flush().map_err(io)?;
            let f = w.get_mut();
            f.seek(SeekFrom::Start(0)).map_err(io)?;
            f.write_all(&header).map_err(io)?;
            f.seek(SeekFrom::End(0)).map_err(io)?;
            progress(total, total);
            Ok(())
        },
        |tmp| {
            validated = Some(validate_finished(tmp, out)?);
            Ok(())
        },
    )?;
    // The manifest the validation read back (the pack is not opened a second time).
    Ok(validated.expect("a written pack was validated"))
}

/// A planned tensor: name, type and `ne` (the FFN blobs' and the pads' sizes are placeholders).
type PlannedTensor = (String, GgmlType, Vec<u64>);

/// The tensor table in file order, a pad tensor before every item `page_before` marks and one
/// at the end; the passthrough entries the placeholder manifest lists; the pads before the last.
fn planned_table(
    items: &[Item],
    page_before: &[bool],
) -> (Vec<PlannedTensor>, Vec<TensorEntry>, usize) {
    let mut planned: Vec<PlannedTensor> = Vec::new();
    let mut placeholder_entries = Vec::new();
    let mut pads = 0usize;
    for (it, &page) in items.iter().zip(page_before) {
        if page {
            planned.push((format!("{PAD_PREFIX}{pads}"), GgmlType::I8, vec![0]));
            pads += 1;
        }
        match it {
            Item::Passthrough { ty, ne, entry, .. } | Item::Slice { ty, ne, entry, .. } => {
                planned.push((entry.name.clone(), *ty, ne.clone()));
                placeholder_entries.push((**entry).clone());
            }
            Item::Blob {
                layer,
                proj,
                layout,
                part,
                rank,
            } => {
                planned.push((
                    blob_name_tp(*layer, *proj, *layout, part, *rank),
                    GgmlType::I8,
                    vec![0],
                ));
            }
        }
    }
    planned.push((format!("{PAD_PREFIX}{pads}"), GgmlType::I8, vec![0]));
    (planned, placeholder_entries, pads)
}

/// Whether each planned item starts on a page (formats.md, "The pack container"): the first
/// device tensor, the first of each rank's segment, every FFN blob, and every tensor of at
/// least a page.
fn page_starts(items: &[Item]) -> Vec<bool> {
    let mut seen_device = false;
    let mut last_rank = None;
    items
        .iter()
        .map(|it| {
            let (device, bytes, rank) = match it {
                Item::Passthrough { entry, .. } => (entry.device, entry.bytes, None),
                Item::Slice { entry, .. } => (true, entry.bytes, entry.tp.as_ref().map(|t| t.rank)),
                Item::Blob { rank, .. } => (true, u64::MAX, *rank),
            };
            let first_device = device && !std::mem::replace(&mut seen_device, true);
            let new_rank = rank.is_some() && rank != last_rank;
            if rank.is_some() {
                last_rank = rank;
            }
            first_device || new_rank || bytes >= PACK_PAGE
        })
        .collect()
}

/// Re-open the finished pack at its temporary path `tmp` as any reader will (header checksum,
/// manifest parsed and checked against every blob, every tensor's checksum): a pack that fails
/// is never named `out`, so a good pack already there survives. Returns its manifest.
fn validate_finished(tmp: &Path, out: &Path) -> Result<Manifest> {
    let fail = |e: Error| Error::Output {
        file: out.display().to_string(),
        reason: format!("the finished pack failed validation, so it was not written: {e}"),
    };
    let p = Pack::open(tmp).map_err(fail)?;
    let bad = p.verify_checksums().map_err(fail)?;
    if !bad.is_empty() {
        return Err(fail(Error::Output {
            file: out.display().to_string(),
            reason: format!("checksum mismatch in {} tensors", bad.len()),
        }));
    }
    Ok(p.manifest)
}

/// The bytes of the source metadata [`copy_metadata`] copies (an upper bound).
fn metadata_bytes(model: &Model) -> usize {
    match &model.files[0] {
        SourceFile::Gguf(g) => g.kvs.iter().map(|kv| kv.span.len()).sum(),
        SourceFile::Safetensors(_) => 1 << 16,
    }
}

/// Copy the source's metadata: GGUF KVs byte for byte (minus `general.alignment` and `split.*`);
/// for safetensors, the architecture and the config and index files as strings.
fn copy_metadata(model: &Model, b: &mut GgufBuilder) {
    match &model.files[0] {
        SourceFile::Gguf(g) => {
            for kv in &g.kvs {
                if kv.key == "general.alignment"
                    || kv.key.starts_with("split.")
                    || kv.key.starts_with("metrale.pack.")
                {
                    continue;
                }
                b.add_raw_kv(&g.map[kv.span.clone()]);
            }
        }
        SourceFile::Safetensors(_) => {
            if let Some(a) = &model.architecture {
                b.add_kv("general.architecture", &Value::String(a.clone()));
            }
            let dir = model.files[0]
                .path()
                .parent()
                .unwrap_or(Path::new(""))
                .to_path_buf();
            for (key, file) in [
                ("metrale.source.config_json", "config.json"),
                (
                    "metrale.source.hf_quant_config_json",
                    "hf_quant_config.json",
                ),
            ] {
                if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
                    b.add_kv(key, &Value::String(text));
                }
            }
        }
    }
}
