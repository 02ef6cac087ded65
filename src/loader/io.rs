//! The copy of the device segment: a registered read-only mapping (whole or in pieces), the
//! ring of pinned staging buffers (`ring.rs`), or both at once.

use super::dest::Dest;
use super::ring::{DIRECT_ALIGN, RingTimes, copy_staged, kept_ring};
use super::{IoMode, LoadOptions, STAGED_MIN_READERS};
use crate::gpu::{GpuBackend, GpuError, GpuResult, StreamId};
use crate::pack::Pack;
use std::path::Path;

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

/// Add `msg` to what the load reports it fell back from.
fn note(fell_back: &mut Option<String>, msg: String) {
    *fell_back = Some(match fell_back.take() {
        Some(p) => format!("{p}; {msg}"),
        None => msg,
    });
}

/// What the copy did: the mode it took, what it fell back from, whether the ring read with
/// O_DIRECT.
pub(super) struct Copied {
    pub mode: IoMode,
    pub fell_back: Option<String>,
    pub direct: bool,
    pub ring: Option<RingTimes>,
}

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
