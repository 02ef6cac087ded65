//! `convert`: streaming, crash-safe writing of a pack.

use super::plan::{Item, companions, passthrough, passthrough_type};
use super::*;
use crate::GgmlType;
use crate::error::{Error, Result};
use crate::gguf::Value;
use crate::gguf_write::{KvWriter, encode_tensor_info, header_prefix, tensor_bytes};
use crate::model::{Model, SourceFile};
use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// Progress callback: (bytes of source processed so far, total).
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// Convert `model` to a pack at `out` (crash-safe). Returns the manifest written.
///
/// Refused before any work, for every caller (the CLI, the Python package, an engine): with no
/// layouts named, a source whose default set would re-quantize a quantized weight (as the
/// command line refuses it without `--allow-requantize`); an `out` that is a folder, sits in
/// a folder that does not exist, or is one of the model's inputs (a shard, its `config.json`
/// or index, the LoRA adapter's files) through any spelling, symlink or hard link
/// ([`crate::atomic::refuse_inputs`]).
///
/// Memory: the source index, the plan (16 bytes a tensor), each written tensor's size and
/// checksum (24 bytes; the entries of FFN blobs and TP slices whole), then the finished pack's
/// table and manifest while it is validated. The header (tensor table and manifest JSON) is
/// streamed from the plan and never held (formats.md, "The pack container").
pub fn convert(
    model: impl Borrow<Model>,
    opts: &ConvertOptions,
    out: impl AsRef<Path>,
    progress: Progress,
) -> Result<Manifest> {
    convert_until(model, opts, out, progress, &AtomicBool::new(false))
}

/// [`convert`], stopped when `stop` is set (from any thread: a signal, a caller's cancel
/// button): the writer checks it before each tensor, then fails with
/// [`Error::Interrupted`] having removed its temporary file; nothing is written at `out`.
pub fn convert_until(
    model: impl Borrow<Model>,
    opts: &ConvertOptions,
    out: impl AsRef<Path>,
    progress: Progress,
    stop: &AtomicBool,
) -> Result<Manifest> {
    let out = out.as_ref();
    crate::atomic::refuse_inputs(out, &model.borrow().convert_inputs(opts.lora.as_deref()))?;
    // None named: the set that keeps the source's quantized weights, as `convert` on the command
    // line and the Python package choose it (`choice::settle`), else the target's default; where
    // that default would re-quantize a quantized weight (a source no layout keeps), refused as
    // they refuse it: a caller who wants it names the layouts.
    let resolved;
    let opts = match opts.layouts {
        None => {
            let model = model.borrow();
            let settled = super::choice::settle(model, opts);
            if let Some(why) = settled.refusal {
                return Err(Error::Unsupported {
                    file: model.path.display().to_string(),
                    reason: format!("{why} (name the layouts to re-quantize it)"),
                });
            }
            resolved = ConvertOptions {
                layouts: Some(settled.layouts),
                ..opts.clone()
            };
            &resolved
        }
        Some(_) => opts,
    };
    let mut validated = None;
    crate::atomic::write_atomic_checked(
        out,
        move |w| -> Result<()> {
            // A source that shrank or was replaced while it was read is the cause of whatever
            // failed then (a write from its vanished pages fails with EFAULT): named first.
            write_pack(model.borrow(), opts, out, progress, stop, w)
                .map_err(|e| model.borrow().check_intact().err().unwrap_or(e))?;
            // Every source byte has been read: its pages need not stay resident while the
            // pack is validated (tensors under a page are never released one by one), and an
            // owned model's index is freed.
            for f in &model.borrow().files {
                f.release(0, f.bytes().len() as u64);
            }
            drop(model);
            // The heap the index and the entries took goes back to the system before the
            // pack's table and manifest are read back (glibc keeps it otherwise: 3 MB of 48).
            #[cfg(target_env = "gnu")]
            // SAFETY: malloc_trim only returns free heap pages to the system; no live
            // allocation moves or changes.
            unsafe {
                libc::malloc_trim(0);
            }
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

/// Write the pack for `model` to `w` (the temporary file behind `out`): the placeholder
/// header, every tensor, then the real header over the placeholder.
fn write_pack(
    model: &Model,
    opts: &ConvertOptions,
    out: &Path,
    progress: Progress,
    stop: &AtomicBool,
    w: &mut std::io::BufWriter<std::fs::File>,
) -> Result<()> {
    let file = out.display().to_string();
    let io = |err: std::io::Error| Error::Write {
        file: file.clone(),
        step: "write",
        err,
    };
    let plan = Plan::new(model, opts)?;
    let sources = source_identity(model);
    // Which items start on a page: a pad tensor is planned before each (its size known only
    // once the bytes before it are), and one after the last.
    let page_before = page_starts(model, &plan.items);
    let mut pm = plan.manifest(Vec::new(), (0, 0), None);
    pm.sources = sources.clone();
    let reserve = manifest_reserve(model, &plan, &pm, &file)?;
    // The header is measured by writing the placeholder's KVs into a sink; it ends on a page,
    // so the data section starts on one.
    let n_rows = table(model, &plan.items, &page_before, None).count() as u64;
    let infos: u64 = table(model, &plan.items, &page_before, None)
        .map(|(name, ne, _)| crate::gguf_write::tensor_info_len(&name, &ne) as u64)
        .sum();
    let mut measured = KvWriter::new(std::io::sink());
    pack_kvs(model, &pm, &pm.tensors, reserve, &file, &mut measured)?;
    let raw = (24 + measured.len() + infos).next_multiple_of(PACK_ALIGNMENT);
    let reserve = reserve + (raw.next_multiple_of(PACK_PAGE) - raw) as usize;
    let header_len = raw.next_multiple_of(PACK_PAGE);
    let kvs = (measured.count(), measured.len() + header_len - raw);
    drop(pm);

    let total: u64 = model.tensors.iter().map(|t| t.bytes).sum();
    // The segment starts at the first device tensor (host tensors come first).
    let n_host = plan
        .items
        .iter()
        .take_while(|i| matches!(i, Item::Passthrough { device: false, .. }))
        .count();
    let advance = progress_steps(model, &plan);
    write_zeros(w, header_len as u64).map_err(io)?;
    let mut pos = 0u64; // data-relative
    let mut done = 0u64;
    let mut written = Written::with_capacity(plan.items.len());
    let mut seg_start = None;
    let mut starts = Vec::with_capacity(plan.items.len());
    let mut pad_bytes: Vec<u64> = Vec::new();
    let mut pad_to_page =
        |w: &mut std::io::BufWriter<std::fs::File>, pos: &mut u64| -> Result<()> {
            let pad = (PACK_PAGE - *pos % PACK_PAGE) % PACK_PAGE;
            write_zeros(w, pad).map_err(io)?;
            *pos += pad;
            pad_bytes.push(pad);
            Ok(())
        };
    plan.produce(|name, bytes, mut entry| {
        if stop.load(Ordering::Relaxed) {
            return Err(Error::Interrupted { file: file.clone() });
        }
        let k = written.len();
        if page_before[k] {
            pad_to_page(w, &mut pos)?;
        }
        if k == n_host {
            seg_start = Some(pos);
        }
        starts.push(pos);
        entry.xxh3 = xxh3_64(bytes);
        entry.bytes = bytes.len() as u64;
        w.write_all(bytes).map_err(io)?;
        let padded = (bytes.len() as u64).div_ceil(PACK_ALIGNMENT) * PACK_ALIGNMENT;
        write_zeros(w, padded - bytes.len() as u64).map_err(io)?;
        pos += padded;
        done += advance(&entry);
        progress(done.min(total), total);
        debug_assert_eq!(name, entry.name);
        written.push(&plan.items[k], entry);
        Ok(())
    })?;
    // The file (and the segment, or the last rank's) ends on a page.
    pad_to_page(w, &mut pos)?;
    let seg = seg_start.map(|s| (s, pos - s)).unwrap_or((pos, 0));
    let tp = tp_info(plan.tp(), &written, &starts, seg, pos);
    let mut man = plan.manifest(Vec::new(), seg, tp);
    man.sources = sources;
    let entries = Entries {
        model,
        items: &plan.items,
        written: &written,
    };
    // A source that shrank while it was read gave zeros: never name such a pack.
    model.check_intact()?;
    // The real header over the placeholder, same length: the blobs' and the pads' sizes.
    let rows = table(
        model,
        &plan.items,
        &page_before,
        Some((&written, &pad_bytes)),
    );
    write_header(w, (n_rows, header_len), kvs, rows, |kv| {
        pack_kvs(model, &man, &entries, reserve, &file, kv)
    })
    .map_err(|e| match e {
        HeaderError::Pack(e) => e,
        HeaderError::Io(e) => io(e),
    })?;
    progress(total, total);
    Ok(())
}

/// Write `n` zero bytes in chunks (a 100k-tensor pack's header is megabytes of placeholder).
fn write_zeros(w: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Source identity: names, sizes and a content hash of every source file (streamed, dropping
/// each chunk's pages behind it to keep the resident set small).
/// Each source file's name, size and xxh3-64 (what the manifest's `sources` records).
pub(crate) fn source_identity(model: &Model) -> Vec<SourceInfo> {
    model
        .files
        .iter()
        .map(|f| {
            let bytes = f.bytes();
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
        .collect()
}

/// How far each written entry advances the progress figure: its bytes for a passthrough
/// tensor; for an FFN blob, its layer's source bytes over the blobs per layer.
fn progress_steps<'a>(model: &'a Model, plan: &Plan) -> impl Fn(&TensorEntry) -> u64 + 'a {
    let n_pass = plan
        .items
        .iter()
        .filter(|i| matches!(i, Item::Passthrough { .. } | Item::Slice(_)))
        .count();
    let blobs_per_layer =
        ((plan.items.len() - n_pass) as u64 / model.ffn_layers.len() as u64).max(1);
    let layer_bytes: HashMap<usize, u64> = model
        .ffn_layers
        .iter()
        .map(|l| {
            let b = [&l.gate, &l.up, &l.down]
                .iter()
                .flat_map(|w| companions(w))
                .map(|i| model.tensors[i].bytes)
                .sum();
            (l.index, b)
        })
        .collect();
    move |e| match &e.ffn {
        None => e.bytes,
        Some(fe) => layer_bytes.get(&fe.layer).copied().unwrap_or(0) / blobs_per_layer,
    }
}

/// A tensor-parallel pack's ranges: the replicated range, then each rank's segment (`None`
/// for one rank).
fn tp_info(
    (n, heads): (u32, Option<(u64, u64)>),
    written: &Written,
    starts: &[u64],
    seg: (u64, u64),
    end: u64,
) -> Option<TpInfo> {
    if n == 1 {
        return None;
    }
    let first_of = |r: u32| {
        (0..written.len())
            .position(|k| written.rank(k) == Some(r))
            .map_or(end, |i| starts[i])
    };
    let bounds: Vec<u64> = (0..n).map(first_of).chain([end]).collect();
    Some(TpInfo {
        ranks: n,
        heads: heads.map(|(h, kv)| [h, kv]),
        replicated: [seg.0, bounds[0] - seg.0],
        rank_segments: bounds.windows(2).map(|w| [w[0], w[1] - w[0]]).collect(),
    })
}

/// The pack's KVs into `kv`: the source metadata, the pack keys, `manifest` as JSON streamed
/// and padded with spaces to `reserve` bytes, and the header checksum (zero) last.
fn pack_kvs<W: Write>(
    model: &Model,
    manifest: &Manifest,
    tensors: &impl serde::Serialize,
    reserve: usize,
    file: &str,
    kv: &mut KvWriter<W>,
) -> Result<()> {
    let fail = |reason: String| Error::Output {
        file: file.to_string(),
        reason,
    };
    let io = |e: std::io::Error| fail(format!("writing the header: {e}"));
    copy_metadata(model, kv).map_err(io)?;
    for (key, v) in [
        (keys::FORMAT_VERSION, Value::U32(PACK_FORMAT_VERSION)),
        (
            keys::CONVERTER_VERSION,
            Value::String(CONVERTER_VERSION.into()),
        ),
        (keys::TARGET_ARCH, Value::String(TARGET_ARCH.into())),
        (keys::KERNEL_ABI, Value::U32(KERNEL_ABI_VERSION)),
        (keys::SEGMENT_OFFSET, Value::U64(manifest.segment_offset)),
        (keys::SEGMENT_BYTES, Value::U64(manifest.segment_bytes)),
    ] {
        kv.add_kv(key, &v).map_err(io)?;
    }
    let mut encoded = Ok(());
    kv.add_kv_string_sized(keys::MANIFEST, reserve as u64, |w| {
        let mut c = CountingWriter { w, n: 0 };
        let out = ManifestOut {
            head: manifest,
            tensors,
        };
        encoded = serde_json::to_writer(&mut c, &out);
        if encoded.is_err() {
            return Ok(());
        }
        if c.n > reserve {
            return Err(std::io::Error::other(format!(
                "internal: the manifest takes {} bytes, {reserve} were reserved",
                c.n
            )));
        }
        write_spaces(c.w, reserve - c.n)
    })
    .map_err(io)?;
    encoded.map_err(|e| fail(format!("encoding the manifest: {e}")))?;
    kv.add_kv(keys::HEADER_XXH3, &Value::U64(0)).map_err(io)?;
    Ok(())
}

/// A writer that counts the bytes it passes on.
struct CountingWriter<W: Write> {
    w: W,
    n: usize,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let k = self.w.write(b)?;
        self.n += k;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// Write `n` spaces (the manifest's padding).
fn write_spaces(w: &mut dyn Write, mut n: usize) -> std::io::Result<()> {
    let spaces = [b' '; 4096];
    while n > 0 {
        let k = n.min(spaces.len());
        w.write_all(&spaces[..k])?;
        n -= k;
    }
    Ok(())
}

/// Why streaming the header failed: building a KV, or the file.
enum HeaderError {
    Pack(Error),
    Io(std::io::Error),
}

/// A writer that hashes what it passes on (the header's checksum, computed as it is written).
struct HashingWriter<'a, W: Write> {
    w: &'a mut W,
    h: Xxh3,
    n: u64,
}

impl<W: Write> Write for HashingWriter<'_, W> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let k = self.w.write(b)?;
        self.h.update(&b[..k]);
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// Stream the header over the placeholder at the file's start: the prefix, the KVs `kvs_of`
/// writes (`kvs`: their count and bytes as measured, the checksum's zero value last), the
/// tensor infos of `rows` with their offsets assigned in order, zeros to `len`; then the
/// checksum (xxh3-64 of those bytes, its own value read as zeros) over its zero value. Never
/// held whole: a pack of 100k tensors has a header of 13 MB.
fn write_header<N: AsRef<str>, D: AsRef<[u64]>>(
    f: &mut std::io::BufWriter<std::fs::File>,
    (n_rows, len): (u64, u64),
    kvs: (u64, u64),
    rows: impl Iterator<Item = (N, D, GgmlType)>,
    kvs_of: impl FnOnce(
        &mut KvWriter<&mut HashingWriter<'_, std::io::BufWriter<std::fs::File>>>,
    ) -> Result<()>,
) -> std::result::Result<(), HeaderError> {
    let internal = |what: String| {
        HeaderError::Pack(Error::Output {
            file: String::new(),
            reason: format!("internal: {what}"),
        })
    };
    f.seek(SeekFrom::Start(0)).map_err(HeaderError::Io)?;
    let mut hw = HashingWriter {
        w: f,
        h: Xxh3::new(),
        n: 0,
    };
    hw.write_all(&header_prefix(n_rows, kvs.0))
        .map_err(HeaderError::Io)?;
    let mut kv = KvWriter::new(&mut hw);
    kvs_of(&mut kv).map_err(HeaderError::Pack)?;
    if (kv.count(), kv.len()) != kvs {
        return Err(internal(format!(
            "the header's KVs took {} bytes, {} were measured",
            kv.len(),
            kvs.1
        )));
    }
    let at = 24 + kvs.1 - 8;
    let (mut info, mut next, mut n) = (Vec::new(), 0u64, 0u64);
    for (name, ne, ty) in rows {
        let (name, ne) = (name.as_ref(), ne.as_ref());
        info.clear();
        encode_tensor_info(&mut info, name, ne, ty, next);
        hw.write_all(&info).map_err(HeaderError::Io)?;
        next = (next + tensor_bytes(ne, ty)).next_multiple_of(PACK_ALIGNMENT);
        n += 1;
    }
    let pad = len
        .checked_sub(hw.n)
        .filter(|_| n == n_rows)
        .ok_or_else(|| internal(format!("the header grew from {len} to {} bytes", hw.n)))?;
    write_zeros(&mut hw, pad).map_err(HeaderError::Io)?;
    let digest = hw.h.digest();
    f.seek(SeekFrom::Start(at)).map_err(HeaderError::Io)?;
    f.write_all(&digest.to_le_bytes())
        .map_err(HeaderError::Io)?;
    f.seek(SeekFrom::End(0)).map_err(HeaderError::Io)?;
    Ok(())
}

/// Bytes to reserve for the manifest: the placeholder `pm` listing every passthrough entry as
/// the plan has it (its length counted entry by entry, never held),
/// each FFN blob's entry bounded by 700 bytes, and the fidelity table (at most 9 layouts x 3
/// projections) and the tensor-parallel ranges by 27 x 200 + 1024.
fn manifest_reserve(model: &Model, plan: &Plan, pm: &Manifest, file: &str) -> Result<usize> {
    let mut n = json_len(pm, file)? + 27 * 200 + 1024;
    let mut listed = 0;
    for it in &plan.items {
        n += match it {
            &Item::Passthrough { src, device } => json_len(&passthrough(model, src, device), file)?,
            Item::Slice(sl) => json_len(&sl.entry, file)?,
            Item::Blob(_) => 700,
        };
        listed += usize::from(!matches!(it, Item::Blob(_)));
    }
    // The commas between the listed entries.
    Ok(n + listed.saturating_sub(1))
}

/// The length of `v` as JSON, counted without building it.
fn json_len(v: &impl serde::Serialize, file: &str) -> Result<usize> {
    struct Count(usize);
    impl Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).map_err(|e| Error::Output {
        file: file.to_string(),
        reason: format!("encoding the manifest: {e}"),
    })?;
    Ok(c.0)
}

/// The pack's tensor table in file order (name, `ne`, type): a pad tensor before every item
/// `page_before` marks and one at the end. With `sizes` (the entries written, in item order,
/// and the pads' sizes) the blobs and pads have their sizes; without, zeros in their place.
fn table<'a>(
    model: &'a Model,
    items: &'a [Item],
    page_before: &'a [bool],
    sizes: Option<(&'a Written, &'a [u64])>,
) -> impl Iterator<Item = (Cow<'a, str>, Vec<u64>, GgmlType)> + 'a {
    let pad = move |i: usize| {
        let bytes = sizes.map_or(0, |(_, p)| p[i]);
        (
            Cow::Owned(format!("{PAD_PREFIX}{i}")),
            vec![bytes],
            GgmlType::I8,
        )
    };
    let last = page_before.iter().filter(|&&b| b).count();
    let mut pads = 0;
    items
        .iter()
        .enumerate()
        .flat_map(move |(k, it)| {
            let before = page_before[k].then(|| {
                pads += 1;
                pad(pads - 1)
            });
            let row = match it {
                &Item::Passthrough { src, .. } => {
                    let (ty, ne) = passthrough_type(model, src);
                    (table_name(model.tensors[src].name.as_str()), ne, ty)
                }
                Item::Slice(sl) => (table_name(sl.entry.name.as_str()), sl.ne.clone(), sl.ty),
                Item::Blob(b) => {
                    let name = blob_name_tp(b.layer, b.proj, b.layout, b.part, b.rank);
                    let bytes = sizes.map_or(0, |(w, _)| w.bytes(k));
                    (Cow::Owned(name), vec![bytes], GgmlType::I8)
                }
            };
            before.into_iter().chain([row])
        })
        .chain(std::iter::once_with(move || pad(last)))
}

/// Whether each planned item starts on a page (formats.md, "The pack container"): the first
/// device tensor, the first of each rank's segment, every FFN blob, and every tensor of at
/// least a page.
fn page_starts(model: &Model, items: &[Item]) -> Vec<bool> {
    let mut seen_device = false;
    let mut last_rank = None;
    items
        .iter()
        .map(|it| {
            let (device, bytes, rank) = match it {
                &Item::Passthrough { src, device } => (device, model.tensors[src].bytes, None),
                Item::Slice(sl) => (true, sl.entry.bytes, sl.entry.tp.as_ref().map(|t| t.rank)),
                Item::Blob(b) => (true, u64::MAX, b.rank),
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

/// What writing each planned item gave: its size and checksum, and its whole entry only where
/// the plan cannot give it again (FFN blobs and tensor-parallel slices). A passthrough entry is
/// derived from the source index when the manifest is serialized: 100k of them held took
/// 14 MB, the pack itself 16.
struct Written {
    /// (bytes, xxh3-64) per item, in plan order.
    sums: Vec<[u64; 2]>,
    /// The entries of the items that are not passthrough tensors.
    kept: Vec<Option<Box<TensorEntry>>>,
}

impl Written {
    fn with_capacity(n: usize) -> Written {
        Written {
            sums: Vec::with_capacity(n),
            kept: Vec::with_capacity(n),
        }
    }

    fn len(&self) -> usize {
        self.sums.len()
    }

    /// Record the entry written for `item`.
    fn push(&mut self, item: &Item, entry: TensorEntry) {
        self.sums.push([entry.bytes, entry.xxh3]);
        let derivable = matches!(item, Item::Passthrough { .. });
        self.kept.push((!derivable).then(|| Box::new(entry)));
    }

    fn bytes(&self, k: usize) -> u64 {
        self.sums[k][0]
    }

    /// The rank item `k` is a slice for (`None`: replicated, host or one rank).
    fn rank(&self, k: usize) -> Option<u32> {
        self.kept[k].as_ref()?.tp.as_ref().map(|t| t.rank)
    }

    /// Item `k`'s entry as written.
    fn entry<'a>(&'a self, model: &Model, item: &Item, k: usize) -> Cow<'a, TensorEntry> {
        match (item, &self.kept[k]) {
            (_, Some(e)) => Cow::Borrowed(&**e),
            (&Item::Passthrough { src, device }, None) => {
                let mut e = passthrough(model, src, device);
                [e.bytes, e.xxh3] = self.sums[k];
                Cow::Owned(e)
            }
            _ => unreachable!("Written::push keeps every entry but a passthrough tensor's"),
        }
    }
}

/// The manifest's tensor list, serialized from what was written (never held whole).
struct Entries<'a> {
    model: &'a Model,
    items: &'a [Item],
    written: &'a Written,
}

impl serde::Serialize for Entries<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.items.len()))?;
        for (k, item) in self.items.iter().enumerate() {
            seq.serialize_element(&*self.written.entry(self.model, item, k))?;
        }
        seq.end()
    }
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

/// The files of a safetensors folder a pack carries, as string KVs, so the pack is the whole
/// model: its config, its quantization config, its tokenizer and its generation defaults
/// (formats.md, "The pack container", file order).
pub const SOURCE_FILES: [(&str, &str); 6] = [
    ("metrale.source.config_json", "config.json"),
    (
        "metrale.source.hf_quant_config_json",
        "hf_quant_config.json",
    ),
    ("metrale.source.tokenizer_json", "tokenizer.json"),
    (
        "metrale.source.tokenizer_config_json",
        "tokenizer_config.json",
    ),
    (
        "metrale.source.special_tokens_map_json",
        "special_tokens_map.json",
    ),
    (
        "metrale.source.generation_config_json",
        "generation_config.json",
    ),
];

/// Copy the source's metadata: GGUF KVs byte for byte (minus `general.alignment` and `split.*`);
/// for safetensors, the architecture and the config and index files as strings.
fn copy_metadata<W: Write>(model: &Model, b: &mut KvWriter<W>) -> std::io::Result<()> {
    match &model.files[0] {
        SourceFile::Gguf(g) => {
            for kv in &g.kvs {
                if kv.key == "general.alignment"
                    || kv.key.starts_with("split.")
                    || kv.key.starts_with("metrale.pack.")
                {
                    continue;
                }
                b.add_raw_kv(&g.map[kv.span.clone()])?;
            }
        }
        SourceFile::Safetensors(_) => {
            if let Some(a) = &model.architecture {
                b.add_kv("general.architecture", &Value::String(a.clone()))?;
            }
            let dir = model.files[0]
                .path()
                .parent()
                .unwrap_or(Path::new(""))
                .to_path_buf();
            for (key, file) in SOURCE_FILES {
                if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
                    b.add_kv(key, &Value::String(text))?;
                }
            }
        }
    }
    Ok(())
}
