//! The copy of the device segment: a registered read-only mapping (whole or in pieces), a ring
//! of pinned staging buffers filled by reader threads (through the page cache or O_DIRECT), or
//! both at once.

use super::{IoMode, LoadOptions, STAGED_MIN_READERS, Staging};
use crate::gpu::{DevicePtr, GpuBackend, GpuError, GpuResult, StreamId};
use crate::pack::Pack;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// O_DIRECT reads need buffers, offsets and lengths aligned to the device's logical block; 4096
/// covers every block size Linux uses.
pub const DIRECT_ALIGN: usize = 4096;

/// Below this fraction of its pages in the page cache, a segment counts as cold.
pub const COLD_RESIDENCY: f64 = 0.5;

/// Windows of [`RESIDENCY_WINDOW_PAGES`] pages that [`resident_fraction`] samples at most.
pub const RESIDENCY_WINDOWS: usize = 64;
/// Pages per sampled window.
pub const RESIDENCY_WINDOW_PAGES: usize = 64;

/// The fraction of `seg`'s pages (a page-aligned range of a mapping) in the page cache
/// (`mincore`); 1.0 where the kernel will not say. A segment of more than
/// `RESIDENCY_WINDOWS * RESIDENCY_WINDOW_PAGES` pages is sampled in that many evenly spaced
/// windows (asking about all 4 million pages of a 16 GB segment took part of the load).
pub fn resident_fraction(seg: &[u8]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    let pages = seg.len().div_ceil(page);
    if pages == 0 || !(seg.as_ptr() as usize).is_multiple_of(page) {
        return 1.0;
    }
    let (windows, per) = if pages <= RESIDENCY_WINDOWS * RESIDENCY_WINDOW_PAGES {
        (1, pages)
    } else {
        (RESIDENCY_WINDOWS, RESIDENCY_WINDOW_PAGES)
    };
    let mut v = vec![0u8; per];
    let (mut resident, mut asked) = (0usize, 0usize);
    for w in 0..windows {
        // Evenly spaced windows, the last ending at the segment's end.
        let first = if windows == 1 {
            0
        } else {
            w * (pages - per) / (windows - 1)
        };
        let len = (per * page).min(seg.len() - first * page);
        // SAFETY: a page-aligned range inside a live mapping; `v` has one byte per page of it.
        let r = unsafe {
            libc::mincore(
                seg.as_ptr().add(first * page) as *mut libc::c_void,
                len,
                v.as_mut_ptr(),
            )
        };
        if r != 0 {
            return 1.0;
        }
        let n = len.div_ceil(page);
        resident += v[..n].iter().filter(|&&b| b & 1 != 0).count();
        asked += n;
    }
    resident as f64 / asked.max(1) as f64
}

/// Read `len` bytes at `off` with O_DIRECT into `buf` (page-aligned, at least `len` rounded up
/// to [`DIRECT_ALIGN`] bytes): whole aligned blocks, the tail past `len` (or past the end of the
/// file) ignored.
fn read_direct(f: &std::fs::File, buf: &mut [u8], off: u64, len: usize) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let want = len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    let mut got = 0;
    while got < len {
        let n = f.read_at(&mut buf[got..want], off + got as u64)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(())
}

/// Add `msg` to what the load reports it fell back from.
fn note(fell_back: &mut Option<String>, msg: String) {
    *fell_back = Some(match fell_back.take() {
        Some(p) => format!("{p}; {msg}"),
        None => msg,
    });
}

/// How much of the arena is backed by device memory, in bytes from its start: the mapping
/// thread publishes it as it maps pieces of a reserved arena (all of an allocated one), and each
/// copy waits for its destination before it is issued.
pub(super) struct Gate {
    mapped: AtomicU64,
    failed: Mutex<Option<String>>,
}

impl Gate {
    /// A gate with `mapped` bytes mapped.
    pub(super) fn new(mapped: u64) -> Self {
        Gate {
            mapped: AtomicU64::new(mapped),
            failed: Mutex::new(None),
        }
    }

    /// `[0, end)` is mapped now.
    pub(super) fn open_to(&self, end: u64) {
        self.mapped.fetch_max(end, Ordering::Release);
    }

    /// Mapping failed: every waiter gets `msg`.
    pub(super) fn fail(&self, msg: String) {
        *self.failed.lock().unwrap() = Some(msg);
    }

    /// Wait until `[0, end)` is mapped (or mapping failed).
    fn wait(&self, end: u64) -> GpuResult<()> {
        let mut spins = 0u32;
        while self.mapped.load(Ordering::Acquire) < end {
            if let Some(m) = self.failed.lock().unwrap().as_ref() {
                return Err(GpuError::Invalid(format!("mapping the arena: {m}")));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        Ok(())
    }
}

/// Where a copy path writes: `arena`, `base` bytes into the whole arena whose mapping `gate`
/// tracks.
pub(super) struct Dest<'a> {
    arena: DevicePtr,
    base: u64,
    gate: &'a Gate,
}

impl<'a> Dest<'a> {
    /// The whole arena.
    pub(super) fn new(arena: DevicePtr, gate: &'a Gate) -> Self {
        Dest {
            arena,
            base: 0,
            gate,
        }
    }

    /// `[off, off + len)` of it, once mapped.
    fn view(&self, off: u64, len: u64) -> GpuResult<DevicePtr> {
        self.gate.wait(self.base + off + len)?;
        Ok(self.arena.view(off, len))
    }

    /// The part `[off, off + len)` as a destination of its own.
    pub(super) fn sub(&self, off: u64, len: u64) -> Dest<'a> {
        Dest {
            arena: self.arena.view(off, len),
            base: self.base + off,
            gate: self.gate,
        }
    }
}

/// What the copy did: the mode it took, what it fell back from, whether the ring read with
/// O_DIRECT.
pub(super) struct Copied {
    pub mode: IoMode,
    pub fell_back: Option<String>,
    pub direct: bool,
    pub ring: Option<RingTimes>,
}

/// Where the staging ring's time went, in seconds: the moments are counted from the ring's
/// start, the sums over every reader thread.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RingTimes {
    /// Buffers taken from the backend's pool (kept from an earlier load).
    pub kept: usize,
    /// Buffers pinned by this load.
    pub pinned: usize,
    /// The first buffer ready (kept, or its piece pinned).
    pub first_buffer: f64,
    /// Every buffer of the ring ready.
    pub ring_ready: f64,
    /// Spent pinning pieces and creating their streams (on the pinning thread).
    pub pin: f64,
    /// The first copy issued.
    pub first_issue: f64,
    /// The last copy issued.
    pub last_issue: f64,
    /// Every copy complete.
    pub drained: f64,
    /// The buffers kept for the next load, or released: the ring's end.
    pub released: f64,
    /// Summed over the readers: waiting for a free buffer and for its previous copy.
    pub wait: f64,
    /// Summed: reading the file into the buffers.
    pub read: f64,
    /// Summed: issuing the copies.
    pub issue: f64,
}

/// Staging memory is pinned in pieces of this many bytes (at least one buffer each), on a
/// helper thread while the readers use the buffers already pinned: the first copy waits for one
/// piece, not for the whole ring (the default of `LoadOptions::ring_piece`).
pub const RING_PIECE_BYTES: usize = 16 << 20;

/// Copy the pack's device segment into `arena` by `opts.io` (for `Auto`, by the rule of
/// [`IoMode::Auto`]); `resident` is the segment's page-cache residency.
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_segment(
    b: &dyn GpuBackend,
    pack: &Pack,
    path: &Path,
    range: std::ops::Range<u64>,
    arena: &Dest,
    streams: &[StreamId],
    resident: f64,
    opts: &LoadOptions,
) -> GpuResult<Copied> {
    let file = path.display().to_string();
    let seg = &pack.file.map[range.start as usize..range.end as usize];
    let cold = resident < COLD_RESIDENCY;
    let use_direct = opts.direct.unwrap_or(cold);
    let mut fell_back = None;
    let mut direct = false;
    let mut ring = None;
    // The ring, with O_DIRECT when chosen (and the file system allows it; else said why).
    let mut staged = |fell_back: &mut Option<String>| -> GpuResult<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let odirect = if use_direct {
            match std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => Some(f),
                Err(e) => {
                    note(
                        fell_back,
                        format!("O_DIRECT open: {e}; read through the page cache"),
                    );
                    None
                }
            }
        } else {
            None
        };
        let (err, times) = copy_staged(
            b,
            &pack.file.file,
            odirect.as_ref(),
            range.start,
            seg.len(),
            arena,
            opts,
        )?;
        ring = Some(times);
        direct = odirect.is_some() && err.is_none();
        if let Some(e) = err {
            tracing::warn!("{file}: {e}; those chunks were read through the page cache");
            note(
                fell_back,
                format!("{e}; those chunks read through the page cache"),
            );
        }
        Ok(())
    };
    let mode = match opts.io {
        IoMode::Staged => {
            staged(&mut fell_back)?;
            IoMode::Staged
        }
        IoMode::Register => {
            copy_registered(b, seg, arena, streams, opts)?;
            IoMode::Register
        }
        IoMode::Pageable => {
            for off in (0..seg.len()).step_by(opts.chunk.max(1)) {
                let len = opts.chunk.max(1).min(seg.len() - off);
                b.upload(arena.view(off as u64, len as u64)?, &seg[off..off + len])?;
            }
            IoMode::Pageable
        }
        IoMode::Hybrid => {
            // Page- and chunk-aligned split: [0, split) registered, [split, len) staged.
            let unit = opts.chunk.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
            let want = (seg.len() as f64 * opts.hybrid_fraction.clamp(0.0, 1.0)) as usize;
            let split = (want / unit * unit).min(seg.len());
            let piece = if opts.register_chunk > 0 {
                opts.register_chunk
            } else {
                256 << 20
            };
            let (reg, rest) = seg.split_at(split);
            let reg_opts = LoadOptions {
                register_chunk: piece,
                ..opts.clone()
            };
            let reg_result = std::thread::scope(|sc| {
                let h = (!reg.is_empty()).then(|| {
                    sc.spawn(|| {
                        copy_registered(b, reg, &arena.sub(0, split as u64), streams, &reg_opts)
                    })
                });
                let staged_result = if rest.is_empty() {
                    Ok((None, RingTimes::default()))
                } else {
                    copy_staged(
                        b,
                        &pack.file.file,
                        None,
                        range.start + split as u64,
                        rest.len(),
                        &arena.sub(split as u64, rest.len() as u64),
                        opts,
                    )
                };
                let r = h.map_or(Ok(()), |h| h.join().expect("registration thread panicked"));
                r.and(staged_result)
            });
            ring = Some(reg_result?.1);
            IoMode::Hybrid
        }
        IoMode::Auto
            if cold
                || (opts.readers >= STAGED_MIN_READERS
                    && (seg.len() as u64 >= opts.auto_register_below || kept_ring(b, opts))) =>
        {
            staged(&mut fell_back)?;
            IoMode::Staged
        }
        IoMode::Auto => match copy_registered(b, seg, arena, streams, opts) {
            Ok(()) => IoMode::Register,
            Err(e) => {
                tracing::warn!(
                    "{file}: read-only registration failed ({e}); using the pinned staging ring"
                );
                let mut why = Some(e.to_string());
                staged(&mut why)?;
                fell_back = why;
                IoMode::Staged
            }
        },
    };
    Ok(Copied {
        mode,
        fell_back,
        direct,
        ring,
    })
}

/// Whether the backend keeps staging buffers the ring would take (`Staging::Kept`, buffers of
/// the ring's size): then the ring has no pinning to pay and beats registration at any size.
fn kept_ring(b: &dyn GpuBackend, opts: &LoadOptions) -> bool {
    let chunk = opts.chunk.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    opts.staging == Staging::Kept && b.staging_pool().is_some_and(|p| p.holds(chunk))
}

fn copy_registered(
    b: &dyn GpuBackend,
    seg: &[u8],
    arena: &Dest,
    streams: &[StreamId],
    opts: &LoadOptions,
) -> GpuResult<()> {
    let chunk = opts.chunk;
    if opts.register_chunk > 0 && opts.register_chunk < seg.len() {
        let (piece, threads) = (opts.register_chunk, opts.register_threads.max(1));
        return copy_registered_pipelined(b, seg, arena, streams, chunk, piece, threads);
    }
    // SAFETY: `seg` is a page-aligned range of the pack's read-only mapping, which outlives the
    // registration (unregistered below, after every copy from it is synchronized).
    unsafe { b.register_host(seg.as_ptr(), seg.len(), true)? };
    let r = (|| {
        for (c, off) in (0..seg.len()).step_by(chunk).enumerate() {
            let len = chunk.min(seg.len() - off);
            // SAFETY: the registered mapping stays valid until the synchronize below.
            unsafe {
                b.upload_async(
                    arena.view(off as u64, len as u64)?,
                    seg.as_ptr().add(off),
                    len,
                    streams[c % streams.len()],
                )?
            };
        }
        streams.iter().try_for_each(|&s| b.synchronize(s))
    })();
    // SAFETY: every copy from the range has completed (or failed) above.
    unsafe { b.unregister_host(seg.as_ptr()) };
    r
}

/// Registration in pieces by `threads` helper threads (each takes the next piece), the copies
/// of each registered piece issued as soon as it is registered; every piece is unregistered
/// after the final synchronize.
fn copy_registered_pipelined(
    b: &dyn GpuBackend,
    seg: &[u8],
    arena: &Dest,
    streams: &[StreamId],
    chunk: usize,
    piece: usize,
    threads: usize,
) -> GpuResult<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let piece = piece.div_ceil(4096) * 4096;
    let pieces: Vec<(usize, usize)> = (0..seg.len())
        .step_by(piece)
        .map(|off| (off, piece.min(seg.len() - off)))
        .collect();
    let registered = std::sync::Mutex::new(Vec::<usize>::new());
    let (tx, rx) = std::sync::mpsc::channel::<GpuResult<(usize, usize)>>();
    let (next, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
    let result = std::thread::scope(|sc| {
        for _ in 0..threads.min(pieces.len()).max(1) {
            let (reg, pcs, next, stop, tx) = (&registered, &pieces, &next, &stop, tx.clone());
            sc.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Some(&(off, len)) = pcs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        return;
                    };
                    // SAFETY: a page-aligned sub-range of the pack's read-only mapping, which
                    // outlives the registration (unregistered below, after every copy is
                    // synchronized).
                    let r = unsafe { b.register_host(seg.as_ptr().add(off), len, true) };
                    let ok = r.is_ok();
                    if ok {
                        reg.lock().unwrap().push(off);
                    }
                    if tx.send(r.map(|_| (off, len))).is_err() || !ok {
                        stop.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
        drop(tx);
        let mut c = 0usize;
        let copies = (|| {
            for _ in 0..pieces.len() {
                let (off, len) = rx
                    .recv()
                    .map_err(|_| GpuError::Invalid("registration threads ended early".into()))??;
                for sub in (off..off + len).step_by(chunk) {
                    let n = chunk.min(off + len - sub);
                    // SAFETY: the piece is registered and stays so until the synchronize below.
                    unsafe {
                        b.upload_async(
                            arena.view(sub as u64, n as u64)?,
                            seg.as_ptr().add(sub),
                            n,
                            streams[c % streams.len()],
                        )?
                    };
                    c += 1;
                }
            }
            streams.iter().try_for_each(|&s| b.synchronize(s))
        })();
        stop.store(true, Ordering::Relaxed);
        copies
    });
    // Every copy has completed (or the stream failed): unregister what was registered.
    let _ = streams.iter().try_for_each(|&s| b.synchronize(s));
    for off in registered.into_inner().unwrap() {
        // SAFETY: no copy from this piece is in flight any more (synchronized above).
        unsafe { b.unregister_host(seg.as_ptr().add(off)) };
    }
    result
}

/// The free staging buffers (FIFO: the buffer given back longest ago, whose copy is most likely
/// complete, is taken first), and the pinning thread's state.
struct FreeBuffers {
    queue: std::collections::VecDeque<(usize, StreamId)>,
    /// Buffers that exist (free or in use).
    total: usize,
    /// The pinning thread is still adding buffers.
    growing: bool,
    /// A reader failed: the others stop.
    stop: bool,
    /// Readers waiting for a buffer.
    waiting: usize,
    /// Why pinning stopped early, if it did.
    pin_error: Option<String>,
}

/// Staged copy: a ring of `opts.ring` pinned buffers of `opts.chunk` bytes, each with its own
/// stream, filled by `opts.readers` threads with `pread` from the file (no page faults on the
/// mapping, no copy beyond the page cache and the ring) while the DMA engine drains the buffers
/// filled before. The buffers are the backend's kept ones ([`Staging::Kept`]) or pinned on a
/// helper thread in `opts.ring_piece` pieces while the readers already use the first.
/// With `direct` (the pack opened with O_DIRECT) chunks are read around the page cache; a chunk
/// whose O_DIRECT read fails is read through the cache instead, and the first such error is
/// returned beside the result (the load reports it).
fn copy_staged(
    b: &dyn GpuBackend,
    file: &std::fs::File,
    direct: Option<&std::fs::File>,
    seg_off: u64,
    seg_len: usize,
    arena: &Dest,
    opts: &LoadOptions,
) -> GpuResult<(Option<String>, RingTimes)> {
    use crate::gpu::staging::{Buffers, Piece};
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex};
    use std::time::Instant;
    let t0 = Instant::now();
    let secs = |t: Instant| (t - t0).as_secs_f64();
    let direct_error: Mutex<Option<String>> = Mutex::new(None);
    // Whole O_DIRECT blocks per buffer.
    let chunk = opts.chunk.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    let n_chunks = seg_len.div_ceil(chunk);
    let ring = opts.ring.max(1).min(n_chunks.max(1));
    let pool = match opts.staging {
        Staging::Kept => b.staging_pool(),
        Staging::Fresh => None,
    };
    let kept = pool.and_then(|p| p.take(chunk)).unwrap_or(Buffers {
        size: chunk,
        ..Buffers::default()
    });
    let n_kept = kept.slots.len();
    let to_pin = ring.saturating_sub(n_kept);
    let free = Mutex::new(FreeBuffers {
        queue: kept.slots.iter().map(|&(p, s)| (p as usize, s)).collect(),
        total: n_kept,
        growing: to_pin > 0,
        stop: false,
        waiting: 0,
        pin_error: None,
    });
    let ready = Condvar::new();
    let next = AtomicUsize::new(0);
    let (mut first_buffer, mut ring_ready) = (if n_kept > 0 { 0.0 } else { f64::NAN }, 0.0);
    let nanos = |t: Instant| (t - t0).as_nanos() as u64;
    let (first_issue, last_issue) = (AtomicU64::new(u64::MAX), AtomicU64::new(0));
    let (wait, read, issue) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let add = |to: &AtomicU64, t: Instant| -> Instant {
        let now = Instant::now();
        to.fetch_add((now - t).as_nanos() as u64, Ordering::Relaxed);
        now
    };
    let (result, grown, pin_secs) = std::thread::scope(|sc| {
        let (free, ready) = (&free, &ready);
        // The pinning thread: pieces of RING_PIECE_BYTES, each cut into buffers with streams.
        let next_c = &next;
        let pinner = (to_pin > 0).then(|| {
            sc.spawn(move || {
                let next = next_c;
                let t = Instant::now();
                let per = (opts.ring_piece / chunk).max(1);
                let mut grown = Buffers {
                    size: chunk,
                    ..Buffers::default()
                };
                let mut first = None;
                let mut left = to_pin;
                let err = loop {
                    // Done when the ring is full, a reader failed, or every chunk is claimed and
                    // no reader waits for a buffer (a small segment needs no more).
                    let f = free.lock().unwrap();
                    if left == 0
                        || f.stop
                        || (next.load(Ordering::Relaxed) >= n_chunks && f.waiting == 0)
                    {
                        break None;
                    }
                    drop(f);
                    // The first piece is one buffer, so the first copy waits for the least.
                    let k = if grown.slots.is_empty() {
                        1
                    } else {
                        per.min(left)
                    };
                    let piece = match Piece::pin(b, k * chunk) {
                        Ok(p) => p,
                        Err(e) => break Some(e.to_string()),
                    };
                    let base = piece.ptr() as usize;
                    grown.pieces.push(piece);
                    let mut new = Vec::with_capacity(k);
                    for i in 0..k {
                        match b.new_stream() {
                            Ok(s) => new.push((base + i * chunk, s)),
                            Err(_) => break,
                        }
                    }
                    let made = new.len();
                    grown
                        .slots
                        .extend(new.iter().map(|&(p, s)| (p as *mut u8, s)));
                    {
                        let mut f = free.lock().unwrap();
                        f.queue.extend(new);
                        f.total += made;
                    }
                    ready.notify_all();
                    first.get_or_insert_with(Instant::now);
                    if made < k {
                        break Some("creating a staging buffer's stream failed".into());
                    }
                    left -= k;
                };
                let mut f = free.lock().unwrap();
                f.growing = false;
                f.pin_error = err;
                drop(f);
                ready.notify_all();
                (
                    grown,
                    first,
                    Instant::now(),
                    (Instant::now() - t).as_secs_f64(),
                )
            })
        });
        let workers: Vec<_> = (0..opts.readers.max(1).min(n_chunks.max(1)))
            .map(|_| {
                let (next, direct_error) = (&next, &direct_error);
                let (first_issue, last_issue) = (&first_issue, &last_issue);
                let (wait, read, issue, add) = (&wait, &read, &issue, &add);
                sc.spawn(move || -> GpuResult<()> {
                    let fail = |e: GpuError| {
                        free.lock().unwrap().stop = true;
                        ready.notify_all();
                        Err(e)
                    };
                    loop {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c >= n_chunks {
                            return Ok(());
                        }
                        let off = c * chunk;
                        let len = chunk.min(seg_len - off);
                        let t = Instant::now();
                        // A free buffer: wait while every buffer is in use or still unpinned.
                        let (p, stream) = {
                            let mut f = free.lock().unwrap();
                            loop {
                                if f.stop {
                                    return Ok(());
                                }
                                if let Some(x) = f.queue.pop_front() {
                                    break x;
                                }
                                if f.total == 0 && !f.growing {
                                    let why = f.pin_error.clone().unwrap_or_default();
                                    drop(f);
                                    return fail(GpuError::Invalid(format!(
                                        "no staging buffer could be pinned: {why}"
                                    )));
                                }
                                f.waiting += 1;
                                f = ready.wait(f).unwrap();
                                f.waiting -= 1;
                            }
                        };
                        let buf = p as *mut u8;
                        let give_back = || {
                            free.lock().unwrap().queue.push_back((p, stream));
                            ready.notify_one();
                        };
                        // The copy that last used this buffer must finish before it is refilled.
                        if let Err(e) = b.synchronize(stream) {
                            give_back();
                            return fail(e);
                        }
                        let t = add(wait, t);
                        // SAFETY: `buf` holds `chunk` bytes, owned by this thread until given
                        // back, with no copy from it in flight (synchronized above).
                        let whole = unsafe { std::slice::from_raw_parts_mut(buf, chunk) };
                        let at = seg_off + off as u64;
                        let direct_ok = match direct {
                            Some(f) => match read_direct(f, whole, at, len) {
                                Ok(()) => true,
                                Err(e) => {
                                    direct_error.lock().unwrap().get_or_insert_with(|| {
                                        format!("O_DIRECT read at {at}: {e}")
                                    });
                                    false
                                }
                            },
                            None => false,
                        };
                        if !direct_ok && let Err(e) = file.read_exact_at(&mut whole[..len], at) {
                            give_back();
                            return fail(GpuError::Invalid(format!(
                                "reading the pack at {at}: {e}"
                            )));
                        }
                        let t = add(read, t);
                        first_issue.fetch_min(nanos(t), Ordering::Relaxed);
                        // SAFETY: the buffer stays untouched until its stream is synchronized
                        // (by the next user of this buffer, or the final synchronize below).
                        let r = arena
                            .view(off as u64, len as u64)
                            .and_then(|dst| unsafe { b.upload_async(dst, buf, len, stream) });
                        give_back();
                        if let Err(e) = r {
                            return fail(e);
                        }
                        let t = add(issue, t);
                        last_issue.fetch_max(nanos(t), Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let result = workers
            .into_iter()
            .try_for_each(|w| w.join().expect("reader thread panicked"));
        let (grown, pin_secs) = match pinner {
            Some(h) => {
                let (grown, first, done, s) = h.join().expect("pinning thread panicked");
                if let (Some(f), 0) = (first, n_kept) {
                    first_buffer = secs(f);
                }
                ring_ready = secs(done);
                (grown, s)
            }
            None => (Buffers::default(), 0.0),
        };
        (result, grown, pin_secs)
    });
    // Every buffer, kept and grown.
    let mut all = kept;
    let n_pinned = grown.slots.len();
    all.pieces.extend(grown.pieces);
    all.slots.extend(grown.slots);
    let synced = all.slots.iter().try_for_each(|&(_, s)| b.synchronize(s));
    let drained = t0.elapsed().as_secs_f64();
    let release = |bufs: Buffers| {
        for piece in bufs.pieces {
            // SAFETY: every copy from the buffers is synchronized above (or the context failed).
            unsafe { piece.release(b) };
        }
    };
    match pool {
        Some(p) if synced.is_ok() => {
            if let Some(old) = p.keep(all) {
                release(old);
            }
        }
        _ => release(all),
    }
    let ns = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
    let first = first_issue.load(Ordering::Relaxed);
    let times = RingTimes {
        kept: n_kept,
        pinned: n_pinned,
        first_buffer: if first_buffer.is_nan() {
            0.0
        } else {
            first_buffer
        },
        ring_ready,
        pin: pin_secs,
        first_issue: if first == u64::MAX {
            0.0
        } else {
            first as f64 * 1e-9
        },
        last_issue: ns(&last_issue),
        drained,
        released: t0.elapsed().as_secs_f64(),
        wait: ns(&wait),
        read: ns(&read),
        issue: ns(&issue),
    };
    result.and(synced)?;
    Ok((direct_error.into_inner().unwrap(), times))
}
