//! Fast start: load a pack's device segment into one device arena in a few large copies and
//! install each layer's overlays as views into it. A straight pipeline: open and validate the
//! pack, map it, copy the segment (`io`: a registered read-only mapping, a pinned staging ring,
//! or both), describe the overlays (`bind`). No repack, no quantization, no per-tensor copy.

pub mod arms;
mod bind;
mod dest;
mod engine;
mod io;
mod ring;
mod rules;

pub use bind::{LayerOverlays, overlays};
pub use engine::{EngineOptions, LoadedModel, forward_context};
pub use io::{COLD_RESIDENCY, resident_fraction};
pub use ring::{DIRECT_ALIGN, RING_PIECE_BYTES, RingTimes};

use crate::GgmlType;
use crate::gpu::allreduce::AllGather;
use crate::gpu::{DevicePtr, GpuBackend, GpuError, GpuResult, StreamId};
use crate::pack::Pack;
use std::path::Path;
use std::time::Instant;

/// How the segment reaches the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// By the segment and the host: a cold segment (less than half in the page cache) through
    /// the ring with O_DIRECT; a warm segment below [`AUTO_REGISTER_BELOW`] bytes, or any warm
    /// segment with fewer than [`STAGED_MIN_READERS`] reader threads, registered (pinning the
    /// ring's buffers costs more than a small copy: BENCHMARKS.md), unless the backend keeps
    /// ring buffers from an earlier load; any other warm segment through the ring. A refused
    /// registration falls back to the ring, saying why.
    Auto,
    /// Register the mapped segment read-only and copy straight from it.
    Register,
    /// Copy through a ring of pinned staging buffers.
    Staged,
    /// Both at once: the first `hybrid_fraction` of the segment registered (in pieces, on a
    /// helper thread) and copied straight from the mapping while the reader threads carry the
    /// rest through the ring, so pinning and `pread` share the work the DMA engine drains.
    Hybrid,
    /// Plain (pageable) copies from the mapping: the driver stages them itself.
    Pageable,
}

/// Where the staging ring's pinned memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// The backend's kept buffers ([`GpuBackend::staging_pool`]): pinned by the first load of a
    /// process, kept at the end and reused by the next load.
    Kept,
    /// Pinned for this load and released at its end.
    Fresh,
}

/// `IoMode::Auto` takes the staging ring from this many reader threads up.
pub const STAGED_MIN_READERS: usize = 8;

/// `IoMode::Auto` registers a warm segment smaller than this instead of staging it.
pub const AUTO_REGISTER_BELOW: u64 = 1 << 30;

/// Loader settings.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// How the segment reaches the device.
    pub io: IoMode,
    /// Streams the copies are spread over.
    pub streams: usize,
    /// Bytes per copy.
    pub chunk: usize,
    /// Staging buffers in the ring (staged mode).
    pub ring: usize,
    /// Reader threads filling the ring (staged mode).
    pub readers: usize,
    /// The ring's first chunks grow from `chunk / readers` to `chunk` (one step per reader),
    /// so the first copy waits for a small read instead of a whole chunk (staged mode).
    pub ramp: bool,
    /// [`load_beside`]'s side job runs after the segment's copy instead of beside it (an
    /// experiment: the side job's driver calls and thread against the readers').
    pub side_after_copy: bool,
    /// Where the ring's pinned memory comes from (staged mode).
    pub staging: Staging,
    /// The ring's memory is pinned in pieces of this many bytes, at least one buffer each
    /// ([`RING_PIECE_BYTES`] by default).
    pub ring_piece: usize,
    /// Register the mapping in pieces of this many bytes (a multiple of 4096), a helper thread
    /// registering piece i+1 while piece i copies; 0 registers the whole segment at once.
    pub register_chunk: usize,
    /// Threads registering pieces at once (with `register_chunk` > 0); each piece's copies are
    /// issued as soon as it is registered.
    pub register_threads: usize,
    /// Read the ring with O_DIRECT (bypassing the page cache): `None` decides by residency (a
    /// segment less than half in the page cache is cold: O_DIRECT, and `Auto` takes the ring).
    pub direct: Option<bool>,
    /// `IoMode::Hybrid`: the share of the segment that is registered (0..=1).
    pub hybrid_fraction: f64,
    /// `IoMode::Auto` registers a warm segment smaller than this many bytes
    /// ([`AUTO_REGISTER_BELOW`] by default).
    pub auto_register_below: u64,
    /// Back the arena in pieces of this many bytes (rounded up to the device's granularity) on
    /// a helper thread while the copies into pieces already backed run, instead of allocating
    /// it whole before the first copy; 0 allocates it whole.
    pub map_piece: usize,
    /// Rank `r` of `n` of a tensor-parallel pack (`convert --tp n`): load the replicated
    /// range and rank `r`'s segment only. `None` loads a pack that is not tensor-parallel.
    pub rank: Option<(u32, u32)>,
    /// Check every FFN blob against its layout's rules (`loader/rules.rs`: the structure
    /// rules on the CPU beside the copy, the element rules on the copied bytes after it; on by
    /// default). Off only to measure what the check costs (`bench-load`'s A/B): a pack whose
    /// checksums were recomputed over bad bytes then loads.
    pub blob_rules: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            io: IoMode::Auto,
            streams: 2,
            // 8 MiB copies from a ring of 16 (128 MiB pinned), one reader per core up to 16: the
            // best of the settings swept on the H200 host (BENCHMARKS.md). The ring a CUDA
            // backend pins when it opens has this shape, so the first load takes it as kept.
            chunk: crate::gpu::staging::PREPIN_BUFFER_BYTES,
            ring: crate::gpu::staging::PREPIN_BUFFERS,
            readers: std::thread::available_parallelism()
                .map_or(4, |n| n.get())
                .min(16),
            ramp: true,
            side_after_copy: false,
            staging: Staging::Kept,
            ring_piece: RING_PIECE_BYTES,
            register_chunk: 0,
            register_threads: 1,
            direct: None,
            hybrid_fraction: 0.4,
            auto_register_below: AUTO_REGISTER_BELOW,
            map_piece: 0,
            rank: None,
            blob_rules: true,
        }
    }
}

/// What a load did and how long it took.
#[derive(Clone, Debug)]
pub struct LoadStats {
    /// Bytes copied.
    pub bytes: u64,
    /// Seconds to open the pack (map, header checksum, manifest validation).
    pub open_seconds: f64,
    /// Seconds to allocate the arena and the streams.
    pub alloc_seconds: f64,
    /// Seconds to ask the page cache how much of the segment it holds.
    pub resident_seconds: f64,
    /// Seconds in the copy.
    pub copy_seconds: f64,
    /// Bytes this process read from the pack (with [`load_gathered`], its part of the
    /// replicated range and its own segment; otherwise `bytes`).
    pub read_bytes: u64,
    /// Seconds in the all-gather of the replicated range ([`load_gathered`]; 0 otherwise).
    pub gather_seconds: f64,
    /// Seconds to describe the overlays.
    pub bind_seconds: f64,
    /// Seconds of the blob rules' part beside the copy (the CPU's structure rules and their
    /// kernel's module, on the side thread): it adds to the load's time only where it outlasts
    /// the copy.
    pub validate_seconds: f64,
    /// Seconds after the copy checking the blobs' element rules on the copied bytes (one
    /// `blob_rules` launch a part, one read back): on the load's critical path.
    pub validate_after_seconds: f64,
    /// Seconds from open to the overlays described.
    pub total_seconds: f64,
    /// The mode the copy took.
    pub mode: IoMode,
    /// Why `Auto` fell back from registration, or the ring from O_DIRECT, if it did.
    pub fell_back: Option<String>,
    /// The fraction of the segment's pages that were in the page cache when the load began.
    pub resident: f64,
    /// The ring read every chunk with O_DIRECT (a cold file).
    pub direct: bool,
    /// Where the ring's time went, when the copy took the ring.
    pub ring: Option<RingTimes>,
}

/// A pack on the device.
pub struct LoadedPack {
    /// The opened pack.
    pub pack: Pack,
    /// The device segment.
    pub arena: DevicePtr,
    /// Every FFN layer's overlays.
    pub layers: Vec<LayerOverlays>,
    /// What the load did.
    pub stats: LoadStats,
    /// The data-relative ranges of the pack that were copied, `(offset, bytes)`, and where
    /// each lies in the arena, in order (the whole segment, or the replicated range and
    /// one rank's segment).
    pub pieces: Vec<(u64, u64, u64)>,
    /// The FFN intermediate size on this rank (the model's when not tensor-parallel).
    pub ffn_inter: usize,
}

/// The data-relative ranges `(offset, bytes)` that rank `rank` of a pack loads, checked
/// against the pack's rank count: the whole device segment for a pack that is not
/// tensor-parallel (rank 0 of 1), the replicated range and rank r's segment otherwise.
pub fn rank_pieces(pack: &Pack, rank: Option<(u32, u32)>) -> crate::Result<Vec<(u64, u64)>> {
    let m = &pack.manifest;
    let bad = |reason: String| crate::Error::Unsupported {
        file: pack.file.path.display().to_string(),
        reason,
    };
    match (&m.tp, rank) {
        (None, None) | (None, Some((0, 1))) => Ok(vec![(m.segment_offset, m.segment_bytes)]),
        (None, Some((r, n))) => Err(bad(format!(
            "not a tensor-parallel pack (TP = 1), but rank {r} of {n} was asked for; convert with --tp {n}"
        ))),
        (Some(tp), None) => Err(bad(format!(
            "a tensor-parallel pack of {} ranks: load one rank (LoadOptions::rank = Some((r, {})))",
            tp.ranks, tp.ranks
        ))),
        (Some(tp), Some((r, n))) if n != tp.ranks || r >= n => Err(bad(format!(
            "rank {r} of {n} asked for, but the pack was converted for {} ranks (ranks 0 to {})",
            tp.ranks,
            tp.ranks - 1
        ))),
        (Some(tp), Some((r, _))) => {
            let s = tp.rank_segments[r as usize];
            Ok(vec![(tp.replicated[0], tp.replicated[1]), (s[0], s[1])])
        }
    }
}

/// A tensor in the device segment, as the engine takes it: its stored type and shape (bytes
/// unchanged from the source for passthrough tensors) and where it lies on the device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceTensor<'a> {
    /// The tensor's name in the pack (the source's name for passthrough tensors).
    pub name: &'a str,
    /// Its ggml type in the pack (`I8` for FFN blobs and for safetensors dtypes ggml has no
    /// type for; `source_type` then says what the bytes are).
    pub ty: GgmlType,
    /// Its row-major shape: the source's for passthrough tensors, `[bytes]` for FFN blobs.
    pub shape: Vec<u64>,
    /// The source's type name (`Q4_1`, `BF16`, `F8_E4M3`, ...).
    pub source_type: &'a str,
    /// Its bytes on the device.
    pub ptr: DevicePtr,
    /// Its manifest entry: for an FFN blob the layout, projection, part and padded shape
    /// (`entry.ffn`); the checksum; the tensor-parallel cut.
    pub entry: &'a crate::manifest::TensorEntry,
}

impl LoadedPack {
    /// The device bytes of tensor `i`, if it is a device tensor.
    fn ptr_at(&self, i: usize) -> Option<DevicePtr> {
        let t = &self.pack.file.tensors[i];
        if !self.pack.manifest.tensors[i].device {
            return None;
        }
        arena_offset(&self.pieces, t.offset, t.bytes).map(|off| self.arena.view(off, t.bytes))
    }

    fn device_tensor_at(&self, i: usize) -> Option<DeviceTensor<'_>> {
        let ptr = self.ptr_at(i)?;
        let (e, t) = (&self.pack.manifest.tensors[i], &self.pack.file.tensors[i]);
        let shape = match &e.source_shape {
            Some(s) => s.to_vec(),
            None => t.ne.iter().rev().copied().collect(),
        };
        Some(DeviceTensor {
            name: &e.name,
            ty: t.ty,
            shape,
            source_type: &e.source_type,
            ptr,
            entry: e,
        })
    }

    /// The device tensor `name` (any tensor of the segment: FFN blobs, attention, norms,
    /// embeddings, output head), or `None` for a host tensor or an unknown name.
    pub fn device_tensor(&self, name: &str) -> Option<DeviceTensor<'_>> {
        self.device_tensor_at(self.pack.index(name)?)
    }

    /// Every device tensor, in segment (layer) order.
    pub fn device_tensors(&self) -> impl Iterator<Item = DeviceTensor<'_>> {
        (0..self.pack.manifest.tensors.len()).filter_map(|i| self.device_tensor_at(i))
    }

    /// The device bytes of tensor `name` (see [`device_tensor`](Self::device_tensor)).
    pub fn device_view(&self, name: &str) -> Option<DevicePtr> {
        self.ptr_at(self.pack.index(name)?)
    }

    /// A host view (in the page cache, zero-copy) of a passthrough tensor, on the device or not.
    pub fn host_view(&self, name: &str) -> Option<&[u8]> {
        let i = self.pack.index(name)?;
        self.pack.manifest.tensors[i]
            .ffn
            .is_none()
            .then(|| self.pack.data(i))
    }
}

/// Open, validate, map, copy and describe a pack. The layers' overlays are views into one arena
/// allocation; install them with [`LayerOverlays::install`].
pub fn load(
    b: &dyn GpuBackend,
    path: impl AsRef<Path>,
    opts: &LoadOptions,
) -> Result<LoadedPack, crate::Error> {
    load_inner(b, path.as_ref(), opts, None)
}

/// The parts of a replicated range of `len` bytes that `n` ranks read, rank `k` part `k`:
/// `(offset, bytes)` within the range, equal and page-aligned (the last shorter or empty), in
/// order, together exactly the range.
pub fn split_parts(len: u64, n: u32) -> Vec<(u64, u64)> {
    let n = u64::from(n.max(1));
    let step = len.div_ceil(n).next_multiple_of(4096);
    (0..n)
        .map(|k| {
            let (a, e) = ((k * step).min(len), ((k + 1) * step).min(len));
            (a, e - a)
        })
        .collect()
}

/// [`load`] of rank `r` of `n` (`opts.rank`) of a tensor-parallel pack, every rank reading from
/// the file only its own segment and its part of the replicated range ([`split_parts`]); one
/// all-gather among the ranks (each rank's process or thread calls this at once with the same
/// `gather`) then fills every rank's replicated range, so each host byte is read once
/// (formats.md, "Tensor-parallel packs": split reads). The result is the same as `load`'s.
pub fn load_gathered(
    b: &dyn GpuBackend,
    path: impl AsRef<Path>,
    opts: &LoadOptions,
    gather: &dyn AllGather,
) -> Result<LoadedPack, crate::Error> {
    load_inner(b, path.as_ref(), opts, Some(gather))
}

fn load_inner(
    b: &dyn GpuBackend,
    path: &Path,
    opts: &LoadOptions,
    gather: Option<&dyn AllGather>,
) -> Result<LoadedPack, crate::Error> {
    Ok(load_with(b, path, opts, gather, |_, _| ())?.0)
}

/// [`load`], with `side` run on its own thread while the segment is copied: it gets the opened
/// pack and this rank's FFN intermediate size, and its result comes back beside the load's.
/// An engine builds what does not depend on the weights there (its forward context: the
/// scratch arena's first allocation costs milliseconds, a small pack's whole copy costs a few),
/// so the copy hides it. `side` runs to its end even when the copy fails.
pub fn load_beside<R: Send>(
    b: &dyn GpuBackend,
    path: impl AsRef<Path>,
    opts: &LoadOptions,
    side: impl FnOnce(&Pack, usize) -> R + Send,
) -> Result<(LoadedPack, R), crate::Error> {
    load_with(b, path.as_ref(), opts, None, side)
}

fn load_with<R: Send>(
    b: &dyn GpuBackend,
    path: &Path,
    opts: &LoadOptions,
    gather: Option<&dyn AllGather>,
    side: impl FnOnce(&Pack, usize) -> R + Send,
) -> Result<(LoadedPack, R), crate::Error> {
    let t0 = Instant::now();
    let pack = Pack::open(path)?;
    let open_seconds = t0.elapsed().as_secs_f64();
    let ranges = rank_pieces(&pack, opts.rank)?;
    let ffn_inter = rank_inter(&pack, opts.rank);
    // Every blob against its layout's rules (loader/rules.rs): the structure rules and the
    // kernel's module beside the copy, with the caller's side job; the element rules on the
    // copied bytes after it. A pack whose checksums were recomputed over bad scales or
    // permutations is refused, not forwarded.
    let checked_side = |pack: &Pack| {
        let t = Instant::now();
        let rules = opts.blob_rules.then(|| rules::beside_copy(b, pack));
        let rules_seconds = t.elapsed().as_secs_f64();
        (rules, rules_seconds, side(pack, ffn_inter))
    };
    let (copied, (rules, rules_seconds, r)) = if opts.side_after_copy {
        let copied = copy_segment(b, &pack, path, opts, gather, &ranges);
        (copied, checked_side(&pack))
    } else {
        std::thread::scope(|s| {
            let pack = &pack;
            let h = s.spawn(move || checked_side(pack));
            let copied = copy_segment(b, pack, path, opts, gather, &ranges);
            (copied, h.join().expect("the load's side job panicked"))
        })
    };
    let (arena, pieces, mut stats) = copied?;
    let t_rules = Instant::now();
    let device_rules = match rules {
        Some(Ok(rules::Pending::Device(k))) => rules::after_copy(b, &pack, k, |i| {
            let t = &pack.file.tensors[i];
            let off = arena_offset(&pieces, t.offset, t.bytes)?;
            pack.manifest.tensors[i]
                .device
                .then(|| arena.view(off, t.bytes))
        }),
        Some(Err(e)) => Err(e),
        Some(Ok(rules::Pending::Done)) | None => Ok(()),
    };
    if let Err(e) = device_rules {
        b.free(arena);
        return Err(e);
    }
    stats.validate_seconds = rules_seconds;
    stats.validate_after_seconds = t_rules.elapsed().as_secs_f64();
    let t2 = Instant::now();
    let layers = match bind::overlays(&pack, arena, &pieces, ffn_inter) {
        Ok(l) => l,
        Err(e) => {
            b.free(arena);
            return Err(gpu_error(path)(e));
        }
    };
    stats.open_seconds = open_seconds;
    stats.bind_seconds = t2.elapsed().as_secs_f64();
    stats.total_seconds = t0.elapsed().as_secs_f64();
    let lp = LoadedPack {
        pack,
        arena,
        layers,
        stats,
        pieces,
        ffn_inter,
    };
    Ok((lp, r))
}

/// A runtime error of loading `path`, as the crate's error naming the file.
fn gpu_error(path: &Path) -> impl Fn(GpuError) -> crate::Error + '_ {
    move |e| crate::Error::Unsupported {
        file: path.display().to_string(),
        reason: format!("loading to the GPU: {e}"),
    }
}

/// The arena of `len` bytes: allocated whole, or (with `opts.map_piece`, rounded up to the
/// device's granularity, below `len`) reserved and backed piece by piece ahead of the copies;
/// returns it and that piece size.
fn alloc_arena(
    b: &dyn GpuBackend,
    len: u64,
    opts: &LoadOptions,
) -> GpuResult<(DevicePtr, Option<u64>)> {
    let granule = b.map_granularity().max(1);
    let piece = (opts.map_piece as u64).div_ceil(granule) * granule;
    if piece > 0 && piece < len {
        Ok((b.reserve(len)?, Some(piece)))
    } else {
        Ok((b.alloc(len)?, None))
    }
}

/// The share of the `ranges` of `pack` (`len` bytes together) in the page cache.
fn resident_share(pack: &Pack, ranges: &[(u64, u64)], len: u64) -> f64 {
    if len == 0 {
        return 1.0;
    }
    let d0 = pack.file.data_offset as usize;
    ranges
        .iter()
        .map(|&(o, n)| {
            let p = &pack.file.map[d0 + o as usize..d0 + (o + n) as usize];
            io::resident_fraction(p) * p.len() as f64
        })
        .sum::<f64>()
        / len as f64
}

/// The arena, its pieces `(offset, bytes, arena offset)` and the load's figures.
type Copied = (DevicePtr, Vec<(u64, u64, u64)>, LoadStats);

/// Allocate the arena and copy `ranges` of the opened `pack` into it (and all-gather the
/// replicated range with `gather`): the arena, the pieces `(offset, bytes, arena offset)`, and
/// the load's figures so far (open, bind and total are the caller's). The arena is freed on
/// an error.
fn copy_segment(
    b: &dyn GpuBackend,
    pack: &Pack,
    path: &Path,
    opts: &LoadOptions,
    gather: Option<&dyn AllGather>,
    ranges: &[(u64, u64)],
) -> Result<Copied, crate::Error> {
    let t0 = Instant::now();
    let file = path.display().to_string();
    let gpu = gpu_error(path);
    let mut pieces = Vec::with_capacity(ranges.len());
    let mut len = 0u64;
    for &(off, bytes) in ranges {
        pieces.push((off, bytes, len));
        len += bytes;
    }
    let (split, copies) =
        reads(&pieces, opts.rank, gather.is_some()).ok_or_else(|| crate::Error::Unsupported {
            file: file.clone(),
            reason: "load_gathered loads one rank of a tensor-parallel pack (LoadOptions::rank)"
                .into(),
        })?;
    let (arena, map_piece) = alloc_arena(b, len, opts).map_err(&gpu)?;
    let streams = match (0..opts.streams.max(1))
        .map(|_| b.new_stream())
        .collect::<GpuResult<Vec<StreamId>>>()
    {
        Ok(s) => s,
        Err(e) => {
            b.free(arena);
            return Err(gpu(e));
        }
    };
    let alloc_seconds = t0.elapsed().as_secs_f64();
    let tr = Instant::now();
    let resident = resident_share(pack, ranges, len);
    let resident_seconds = tr.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let into = CopyTarget {
        arena,
        len,
        map_piece,
        streams: &streams,
        resident,
    };
    let copied = match copy_into(b, pack, path, &into, &copies, opts) {
        Ok(c) => c,
        Err(e) => {
            b.free(arena);
            return Err(gpu(e));
        }
    };
    let copy_seconds = t1.elapsed().as_secs_f64();
    let tg = Instant::now();
    if let (Some(g), Some((r, parts))) = (gather, &split) {
        let (_, rep, at) = pieces[0];
        if let Err(e) = g.all_gather(*r, b, arena.view(at, rep), parts) {
            b.free(arena);
            return Err(gpu(e));
        }
    }
    let gather_seconds = tg.elapsed().as_secs_f64();
    let stats = LoadStats {
        bytes: len,
        open_seconds: 0.0,
        alloc_seconds,
        resident_seconds,
        copy_seconds,
        read_bytes: copies.iter().map(|c| c.1).sum(),
        gather_seconds,
        bind_seconds: 0.0,
        validate_seconds: 0.0,
        validate_after_seconds: 0.0,
        total_seconds: 0.0,
        mode: copied.mode,
        fell_back: copied.fell_back,
        resident,
        direct: copied.direct,
        ring: copied.ring,
    };
    Ok((arena, pieces, stats))
}

/// A split read (rank index and parts) and the copies one process makes.
type Reads = (Option<(usize, Vec<(u64, u64)>)>, Vec<(u64, u64, u64)>);

/// A split read and what one process copies from the file, `(offset, bytes, arena offset)`:
/// every piece, or with a gather (`gathered`) its own segment and its part of the replicated
/// range (the first piece), with rank `r`'s index and the parts. `None` for a gather without a
/// rank of a tensor-parallel pack.
fn reads(pieces: &[(u64, u64, u64)], rank: Option<(u32, u32)>, gathered: bool) -> Option<Reads> {
    match (gathered, rank) {
        (false, _) => Some((None, pieces.to_vec())),
        (true, Some((r, n))) if pieces.len() == 2 => {
            let parts = split_parts(pieces[0].1, n);
            let (off, _, at) = pieces[0];
            let (po, pl) = parts[r as usize];
            let copies = [(off + po, pl, at + po), pieces[1]]
                .into_iter()
                .filter(|p| p.1 > 0)
                .collect();
            Some((Some((r as usize, parts)), copies))
        }
        (true, _) => None,
    }
}

/// Where the copies go: the arena of `len` bytes (backed ahead of the copies in pieces of
/// `map_piece` bytes, when given), the streams, and the share of the source in the page cache.
struct CopyTarget<'a> {
    arena: DevicePtr,
    len: u64,
    map_piece: Option<u64>,
    streams: &'a [StreamId],
    resident: f64,
}

/// Copy each of `copies` from the pack into the arena; the first copy's mode, and any copy's
/// fallback.
fn copy_into(
    b: &dyn GpuBackend,
    pack: &Pack,
    path: &Path,
    to: &CopyTarget,
    copies: &[(u64, u64, u64)],
    opts: &LoadOptions,
) -> GpuResult<io::Copied> {
    let d0 = pack.file.data_offset;
    let gate = dest::Gate::new(if to.map_piece.is_some() { 0 } else { to.len });
    std::thread::scope(|sc| {
        if let Some(piece) = to.map_piece {
            let (gate, arena, len) = (&gate, to.arena, to.len);
            sc.spawn(move || {
                for off in (0..len).step_by(piece as usize) {
                    let n = piece.min(len - off);
                    match b.map_range(arena, off, n) {
                        Ok(()) => gate.open_to(off + n),
                        Err(e) => return gate.fail(e.to_string()),
                    }
                }
            });
        }
        let dest = dest::Dest::new(to.arena, &gate);
        let mut out: Option<io::Copied> = None;
        for &(off, bytes, at) in copies {
            let range = d0 + off..d0 + off + bytes;
            let sub = dest.sub(at, bytes);
            let c = io::copy_segment(b, pack, path, range, &sub, to.streams, to.resident, opts)?;
            match &mut out {
                None => out = Some(c),
                Some(o) => {
                    if o.fell_back.is_none() {
                        o.fell_back = c.fell_back;
                    }
                }
            }
        }
        Ok(out.unwrap_or(io::Copied {
            mode: opts.io,
            fell_back: None,
            direct: false,
            ring: None,
        }))
    })
}

/// The FFN intermediate size a rank's layers have (its padded slice; the model's without TP).
fn rank_inter(pack: &Pack, rank: Option<(u32, u32)>) -> usize {
    match (&pack.manifest.tp, rank) {
        (Some(tp), Some((r, _))) => {
            let [lo, hi] =
                crate::pack::tp::rank_range(pack.manifest.model.intermediate_size, tp.ranks, r);
            crate::pack::tp::padded_width(hi - lo) as usize
        }
        _ => pack.manifest.model.intermediate_size as usize,
    }
}

/// Where data-relative `[off, off + bytes)` lies in the arena, if a loaded piece holds it.
pub(crate) fn arena_offset(pieces: &[(u64, u64, u64)], off: u64, bytes: u64) -> Option<u64> {
    pieces
        .iter()
        .find(|&&(o, b, _)| off >= o && off + bytes <= o + b)
        .map(|&(o, _, at)| at + off - o)
}
