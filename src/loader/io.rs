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
            (range.start, seg.len()),
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
                        (range.start + split as u64, rest.len()),
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

/// The ring's buffers as the readers and the pinning thread share them.
struct FreeRing {
    state: std::sync::Mutex<FreeBuffers>,
    ready: std::sync::Condvar,
}

impl FreeRing {
    /// A ring holding `kept` buffers, with `growing` if a pinning thread will add more.
    fn new(kept: &[(*mut u8, StreamId)], growing: bool) -> Self {
        FreeRing {
            state: std::sync::Mutex::new(FreeBuffers {
                queue: kept.iter().map(|&(p, s)| (p as usize, s)).collect(),
                total: kept.len(),
                growing,
                stop: false,
                waiting: 0,
                pin_error: None,
            }),
            ready: std::sync::Condvar::new(),
        }
    }

    /// The free buffer given back longest ago, waiting while every buffer is in use or still
    /// unpinned; `None` once a reader failed; an error when no buffer could be pinned at all.
    fn take(&self) -> GpuResult<Option<(usize, StreamId)>> {
        let mut f = self.state.lock().unwrap();
        loop {
            if f.stop {
                return Ok(None);
            }
            if let Some(x) = f.queue.pop_front() {
                return Ok(Some(x));
            }
            if f.total == 0 && !f.growing {
                let why = f.pin_error.clone().unwrap_or_default();
                return Err(GpuError::Invalid(format!(
                    "no staging buffer could be pinned: {why}"
                )));
            }
            f.waiting += 1;
            f = self.ready.wait(f).unwrap();
            f.waiting -= 1;
        }
    }

    fn give_back(&self, buf: (usize, StreamId)) {
        self.state.lock().unwrap().queue.push_back(buf);
        self.ready.notify_one();
    }

    /// New buffers from the pinning thread.
    fn add(&self, bufs: &[(usize, StreamId)]) {
        let mut f = self.state.lock().unwrap();
        f.queue.extend(bufs.iter().copied());
        f.total += bufs.len();
        drop(f);
        self.ready.notify_all();
    }

    /// A reader failed: every other stops.
    fn fail(&self) {
        self.state.lock().unwrap().stop = true;
        self.ready.notify_all();
    }

    /// Whether the pinning thread should pin another piece: a reader still runs, and a chunk is
    /// unclaimed or a reader waits for a buffer (a small segment needs no more).
    fn wants_more(&self, next: &std::sync::atomic::AtomicUsize, n_chunks: usize) -> bool {
        let f = self.state.lock().unwrap();
        !f.stop && (next.load(Ordering::Relaxed) < n_chunks || f.waiting > 0)
    }

    /// The pinning thread is done (`err`: why it stopped early).
    fn done_pinning(&self, err: Option<String>) {
        let mut f = self.state.lock().unwrap();
        f.growing = false;
        f.pin_error = err;
        drop(f);
        self.ready.notify_all();
    }
}

/// What the pinning thread pinned: the buffers, when the first was ready, when it finished,
/// and the seconds it spent.
struct Pinned {
    bufs: crate::gpu::staging::Buffers,
    first: Option<std::time::Instant>,
    done: std::time::Instant,
    secs: f64,
}

/// Pin `to_pin` buffers of `chunk` bytes, the first alone and then `per` at a time, adding each
/// piece's buffers to `free` as soon as they exist; stop early once `free` wants no more.
fn pin_ring(
    b: &dyn GpuBackend,
    free: &FreeRing,
    (to_pin, chunk, per): (usize, usize, usize),
    next: &std::sync::atomic::AtomicUsize,
    n_chunks: usize,
) -> Pinned {
    use crate::gpu::staging::{Buffers, Piece};
    let t = std::time::Instant::now();
    let mut bufs = Buffers {
        size: chunk,
        ..Buffers::default()
    };
    let mut first = None;
    let mut left = to_pin;
    let err = loop {
        if left == 0 || !free.wants_more(next, n_chunks) {
            break None;
        }
        // The first piece is one buffer, so the first copy waits for the least.
        let k = if bufs.slots.is_empty() {
            1
        } else {
            per.min(left)
        };
        let piece = match Piece::pin(b, k * chunk) {
            Ok(p) => p,
            Err(e) => break Some(e.to_string()),
        };
        let base = piece.ptr() as usize;
        bufs.pieces.push(piece);
        let mut new = Vec::with_capacity(k);
        for i in 0..k {
            match b.new_stream() {
                Ok(s) => new.push((base + i * chunk, s)),
                Err(_) => break,
            }
        }
        bufs.slots
            .extend(new.iter().map(|&(p, s)| (p as *mut u8, s)));
        free.add(&new);
        first.get_or_insert_with(std::time::Instant::now);
        if new.len() < k {
            break Some("creating a staging buffer's stream failed".into());
        }
        left -= k;
    };
    free.done_pinning(err);
    Pinned {
        bufs,
        first,
        done: std::time::Instant::now(),
        secs: t.elapsed().as_secs_f64(),
    }
}

/// The readers' shared job: the segment's chunks, claimed in order, and what the readers add up.
struct ChunkJob<'a> {
    file: &'a std::fs::File,
    direct: Option<&'a std::fs::File>,
    seg_off: u64,
    seg_len: usize,
    chunk: usize,
    n_chunks: usize,
    arena: &'a Dest<'a>,
    next: std::sync::atomic::AtomicUsize,
    t0: std::time::Instant,
    first_issue: AtomicU64,
    last_issue: AtomicU64,
    wait: AtomicU64,
    read: AtomicU64,
    issue: AtomicU64,
    direct_error: std::sync::Mutex<Option<String>>,
}

impl ChunkJob<'_> {
    /// Add the time since `t` to `to`; returns now.
    fn add(to: &AtomicU64, t: std::time::Instant) -> std::time::Instant {
        let now = std::time::Instant::now();
        to.fetch_add((now - t).as_nanos() as u64, Ordering::Relaxed);
        now
    }

    fn at(&self, t: std::time::Instant) -> u64 {
        (t - self.t0).as_nanos() as u64
    }

    /// One reader: claim chunks until none is left, each into a free buffer and copied from it.
    fn run(&self, b: &dyn GpuBackend, free: &FreeRing) -> GpuResult<()> {
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.n_chunks {
                return Ok(());
            }
            let t = std::time::Instant::now();
            let buf = match free.take() {
                Ok(Some(buf)) => buf,
                Ok(None) => return Ok(()),
                Err(e) => {
                    free.fail();
                    return Err(e);
                }
            };
            let r = self.one(b, c, buf, t);
            free.give_back(buf);
            if r.is_err() {
                free.fail();
                return r;
            }
        }
    }

    /// Chunk `c` into buffer `buf` (taken at `t`): wait for the buffer's previous copy, read,
    /// issue the copy on the buffer's stream.
    fn one(
        &self,
        b: &dyn GpuBackend,
        c: usize,
        (p, stream): (usize, StreamId),
        t: std::time::Instant,
    ) -> GpuResult<()> {
        use std::os::unix::fs::FileExt;
        let off = c * self.chunk;
        let len = self.chunk.min(self.seg_len - off);
        // The copy that last used this buffer must finish before it is refilled.
        b.synchronize(stream)?;
        let t = Self::add(&self.wait, t);
        // SAFETY: the buffer holds `chunk` bytes, owned by this reader until given back, with
        // no copy from it in flight (synchronized above).
        let whole = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, self.chunk) };
        let at = self.seg_off + off as u64;
        let direct_ok = match self.direct {
            Some(f) => match read_direct(f, whole, at, len) {
                Ok(()) => true,
                Err(e) => {
                    self.direct_error
                        .lock()
                        .unwrap()
                        .get_or_insert_with(|| format!("O_DIRECT read at {at}: {e}"));
                    false
                }
            },
            None => false,
        };
        if !direct_ok {
            self.file
                .read_exact_at(&mut whole[..len], at)
                .map_err(|e| GpuError::Invalid(format!("reading the pack at {at}: {e}")))?;
        }
        let t = Self::add(&self.read, t);
        self.first_issue.fetch_min(self.at(t), Ordering::Relaxed);
        let dst = self.arena.view(off as u64, len as u64)?;
        // SAFETY: the buffer stays untouched until its stream is synchronized (by the next user
        // of this buffer, or the ring's final synchronize).
        unsafe { b.upload_async(dst, p as *const u8, len, stream)? };
        let t = Self::add(&self.issue, t);
        self.last_issue.fetch_max(self.at(t), Ordering::Relaxed);
        Ok(())
    }
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
    (seg_off, seg_len): (u64, usize),
    arena: &Dest,
    opts: &LoadOptions,
) -> GpuResult<(Option<String>, RingTimes)> {
    use crate::gpu::staging::Buffers;
    let t0 = std::time::Instant::now();
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
    let free = FreeRing::new(&kept.slots, to_pin > 0);
    let job = ChunkJob {
        file,
        direct,
        seg_off,
        seg_len,
        chunk,
        n_chunks,
        arena,
        next: Default::default(),
        t0,
        first_issue: AtomicU64::new(u64::MAX),
        last_issue: AtomicU64::new(0),
        wait: AtomicU64::new(0),
        read: AtomicU64::new(0),
        issue: AtomicU64::new(0),
        direct_error: Default::default(),
    };
    let per = (opts.ring_piece / chunk).max(1);
    let (result, pinned) = std::thread::scope(|sc| {
        let (free, job) = (&free, &job);
        let pinner = (to_pin > 0).then(|| {
            sc.spawn(move || pin_ring(b, free, (to_pin, chunk, per), &job.next, n_chunks))
        });
        let readers: Vec<_> = (0..opts.readers.max(1).min(n_chunks.max(1)))
            .map(|_| sc.spawn(move || job.run(b, free)))
            .collect();
        let result = readers
            .into_iter()
            .try_for_each(|r| r.join().expect("reader thread panicked"));
        (
            result,
            pinner.map(|h| h.join().expect("pinning thread panicked")),
        )
    });
    let secs = |t: std::time::Instant| (t - t0).as_secs_f64();
    let (grown, first_buffer, ring_ready, pin) = match pinned {
        Some(p) => {
            let first = match (p.first, n_kept) {
                (Some(f), 0) => secs(f),
                _ => 0.0,
            };
            (p.bufs, first, secs(p.done), p.secs)
        }
        None => (Buffers::default(), 0.0, 0.0, 0.0),
    };
    let n_pinned = grown.slots.len();
    let (synced, drained) = finish_ring(b, pool, kept, grown);
    let ns = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
    let first_issue = job.first_issue.load(Ordering::Relaxed);
    let times = RingTimes {
        kept: n_kept,
        pinned: n_pinned,
        first_buffer,
        ring_ready,
        pin,
        first_issue: if first_issue == u64::MAX {
            0.0
        } else {
            first_issue as f64 * 1e-9
        },
        last_issue: ns(&job.last_issue),
        drained: secs(drained),
        released: t0.elapsed().as_secs_f64(),
        wait: ns(&job.wait),
        read: ns(&job.read),
        issue: ns(&job.issue),
    };
    result.and(synced)?;
    Ok((job.direct_error.into_inner().unwrap(), times))
}

/// The ring's end: synchronize every buffer's stream, then keep the buffers (kept and grown)
/// in `pool` for the next load, or release them. Returns the synchronize's result and when it
/// finished.
fn finish_ring(
    b: &dyn GpuBackend,
    pool: Option<&crate::gpu::staging::StagingPool>,
    mut all: crate::gpu::staging::Buffers,
    grown: crate::gpu::staging::Buffers,
) -> (GpuResult<()>, std::time::Instant) {
    all.pieces.extend(grown.pieces);
    all.slots.extend(grown.slots);
    let synced = all.slots.iter().try_for_each(|&(_, s)| b.synchronize(s));
    let drained = std::time::Instant::now();
    let release = |bufs: crate::gpu::staging::Buffers| {
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
    (synced, drained)
}
