//! The staging ring: pinned buffers filled by reader threads with `pread` (through the page
//! cache or O_DIRECT) while the DMA engine drains the buffers filled before; pinned in pieces
//! on a helper thread, or taken from the buffers the backend kept from an earlier load.

use super::dest::Dest;
use super::{LoadOptions, Staging};
use crate::gpu::{GpuBackend, GpuError, GpuResult, StreamId};
use std::sync::atomic::{AtomicU64, Ordering};

/// O_DIRECT reads need buffers, offsets and lengths aligned to the device's logical block; 4096
/// covers every block size Linux uses.
pub const DIRECT_ALIGN: usize = 4096;

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

/// Whether the backend keeps staging buffers the ring would take (`Staging::Kept`, buffers of
/// the ring's size): then the ring has no pinning to pay and beats registration at any size.
pub(super) fn kept_ring(b: &dyn GpuBackend, opts: &LoadOptions) -> bool {
    let chunk = opts.chunk.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
    opts.staging == Staging::Kept && b.staging_pool().is_some_and(|p| p.holds(chunk))
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

    /// Whether the pinning thread should pin another piece: no reader failed, and there is no
    /// buffer yet, a chunk is unclaimed, or a reader waits for a buffer (a small segment needs
    /// no more). With no buffer it always pins one: readers that claimed every chunk but have
    /// not yet asked for a buffer still need one.
    fn wants_more(&self, next: &std::sync::atomic::AtomicUsize, n_chunks: usize) -> bool {
        let f = self.state.lock().unwrap();
        !f.stop && (f.total == 0 || next.load(Ordering::Relaxed) < n_chunks || f.waiting > 0)
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

/// The chunks a segment of `seg_len` bytes is read in, `(offset, bytes)` in order: `chunk`
/// bytes each, or with `ramp` the first `readers` growing by `chunk / readers` (rounded up to
/// whole [`DIRECT_ALIGN`] blocks) from one step to `chunk`. The readers start together, so
/// the first copy is issued after the smallest read, not after a whole chunk's, and the DMA
/// engine drains the small chunks while the larger ones are read (BENCHMARKS-history.md, "The ring's
/// first chunks").
pub(super) fn chunk_plan(
    seg_len: usize,
    chunk: usize,
    readers: usize,
    ramp: bool,
) -> Vec<(usize, usize)> {
    let chunk = chunk.max(1);
    let steps = if ramp { readers.max(1) } else { 1 };
    let mut plan = Vec::with_capacity(seg_len / chunk + steps);
    let mut off = 0;
    while off < seg_len {
        let i = plan.len();
        let want = if i < steps {
            (chunk * (i + 1) / steps).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN
        } else {
            chunk
        };
        let len = want.clamp(1, chunk).min(seg_len - off);
        plan.push((off, len));
        off += len;
    }
    plan
}

/// The readers' shared job: the segment's chunks, claimed in order, and what the readers add up.
struct ChunkJob<'a> {
    file: &'a std::fs::File,
    direct: Option<&'a std::fs::File>,
    seg_off: u64,
    /// The chunks, `(offset in the segment, bytes)` ([`chunk_plan`]).
    plan: Vec<(usize, usize)>,
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
        let (off, len) = self.plan[c];
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
pub(super) fn copy_staged(
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
    let plan = chunk_plan(seg_len, chunk, opts.readers.max(1), opts.ramp);
    let n_chunks = plan.len();
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
        plan,
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
    // SAFETY: every copy from the buffers is synchronized above (or the context failed).
    let release = |bufs: crate::gpu::staging::Buffers| unsafe { bufs.release(b) };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan covers the segment once, in order, in whole O_DIRECT blocks but the last, no
    /// chunk above `chunk`; with the ramp the first chunks grow one step per reader.
    #[test]
    fn chunk_plans_cover_the_segment_and_ramp_up() {
        let chunk = 8 << 20;
        for (len, readers, ramp) in [
            (350_000_000usize, 16usize, true),
            (350_000_000, 16, false),
            (5 << 20, 16, true),
            (1, 4, true),
            (0, 4, true),
            ((8 << 20) * 40 + 12345, 3, true),
        ] {
            let plan = chunk_plan(len, chunk, readers, ramp);
            let mut at = 0;
            for (i, &(off, n)) in plan.iter().enumerate() {
                assert_eq!(off, at, "chunk {i} of {len}");
                assert!(n > 0 && n <= chunk, "chunk {i} of {len}: {n} bytes");
                if i + 1 < plan.len() {
                    assert_eq!(n % DIRECT_ALIGN, 0, "chunk {i} of {len}: {n} bytes");
                }
                at += n;
            }
            assert_eq!(at, len);
            if ramp && len > chunk * readers {
                let step = (chunk / readers).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
                assert_eq!(plan[0].1, step);
                assert!(plan.windows(2).take(readers - 1).all(|w| w[1].1 > w[0].1));
                assert!(plan[readers..plan.len() - 1].iter().all(|c| c.1 == chunk));
            } else if !ramp {
                assert!(plan[..plan.len() - 1].iter().all(|c| c.1 == chunk));
            }
        }
    }
}
