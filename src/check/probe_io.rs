//! `bench-load --probe`: where a load's time goes. Each rate a copy path is built from, measured
//! alone on this host: host-to-device copies from pinned memory on 1, 2 and 4 streams; host
//! memory copies on 1 to 16 threads; `pread` of the warm segment into pinned buffers (the ring's
//! host side) on 1 to 16 threads; pinning by registration, whole and in pieces on several
//! threads; copies from a registered mapping; pageable copies; a pinned copy running beside the
//! ring's reads (do the two kinds of memory traffic add up?); and O_DIRECT reads of the file.

use crate::error::Result;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, StreamId};
use crate::pack::Pack;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

const MIB: usize = 1 << 20;

/// One measured rate.
#[derive(Clone, Debug)]
pub struct Probe {
    /// What was measured.
    pub what: String,
    /// Bytes over seconds.
    pub gbs: f64,
}

fn gbs(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-12) / 1e9
}

/// Run every probe on the pack at `path` (its segment warm in the page cache) and print each.
pub fn probe(b: &dyn GpuBackend, path: &Path) -> Result<Vec<Probe>> {
    warm_page_cache(path);
    let pack = Pack::open(path)?;
    let r = pack.segment_range();
    let seg = &pack.file.map[r.start as usize..r.end as usize];
    let mut out = Vec::new();
    let mut put = |what: String, gbs: f64| {
        println!("probe {what:<58} {gbs:>7.1} GB/s");
        out.push(Probe { what, gbs });
    };
    let big = (1usize << 30).min(seg.len().max(64 * MIB));
    staging_costs(b, big)?;
    for n in [1usize, 2, 4] {
        put(
            format!("pinned -> device, {} MiB, {n} stream(s)", big / MIB),
            h2d_pinned(b, big, n)?,
        );
    }
    for n in [1usize, 8, 16] {
        put(
            format!("host memcpy, 512 MiB over {n} thread(s)"),
            host_memcpy(n, 512 * MIB),
        );
    }
    for n in [1usize, 4, 8, 16] {
        let v = pread_to_pinned(b, &pack.file.file, r.start, seg.len(), n, 2 * MIB, None)?;
        put(format!("pread segment -> pinned 2 MiB, {n} thread(s)"), v);
    }
    let t = Instant::now();
    // SAFETY: a page-aligned range of the pack's read-only mapping, unregistered below before the
    // mapping is dropped.
    unsafe { b.register_host(seg.as_ptr(), seg.len(), true)? };
    put(
        "register whole segment, 1 thread".into(),
        gbs(seg.len(), t.elapsed().as_secs_f64()),
    );
    let streams: Vec<StreamId> = (0..2).map(|_| b.new_stream()).collect::<GpuResult<_>>()?;
    let arena = b.alloc(seg.len() as u64)?;
    let t = Instant::now();
    for (c, off) in (0..seg.len()).step_by(2 * MIB).enumerate() {
        let len = (2 * MIB).min(seg.len() - off);
        // SAFETY: registered above; synchronized below before unregistering.
        unsafe {
            b.upload_async(
                arena.view(off as u64, len as u64),
                seg.as_ptr().add(off),
                len,
                streams[c % 2],
            )?
        };
    }
    streams.iter().try_for_each(|&s| b.synchronize(s))?;
    put(
        "registered -> device, 2 MiB copies, 2 streams".into(),
        gbs(seg.len(), t.elapsed().as_secs_f64()),
    );
    let t = Instant::now();
    // SAFETY: every copy from it is synchronized above.
    unsafe { b.unregister_host(seg.as_ptr()) };
    put(
        "unregister whole segment".into(),
        gbs(seg.len(), t.elapsed().as_secs_f64()),
    );
    for n in [2usize, 4, 8] {
        put(
            format!("register in 256 MiB pieces, {n} threads at once"),
            register_pieces(b, seg, 256 * MIB, n)?,
        );
    }
    let t = Instant::now();
    for off in (0..seg.len()).step_by(64 * MIB) {
        let len = (64 * MIB).min(seg.len() - off);
        b.upload(arena.view(off as u64, len as u64), &seg[off..off + len])?;
    }
    put(
        "pageable mapping -> device, 64 MiB copies".into(),
        gbs(seg.len(), t.elapsed().as_secs_f64()),
    );
    let (copy, read) = overlap(b, &pack.file.file, r.start, seg.len(), arena, big)?;
    put(
        "overlap: pinned -> device while 16 threads pread".into(),
        copy,
    );
    put(
        "overlap: pread -> pinned (16 threads) while copying".into(),
        read,
    );
    b.free(arena);
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => {
            // The first 4 GiB at most: the disk's rate, without reading a large file three times.
            let len = seg.len().min(4 << 30);
            for n in [1usize, 4, 16] {
                let v = pread_to_pinned(b, &f, r.start, len, n, 8 * MIB, Some(()))?;
                put(format!("O_DIRECT read 8 MiB requests, {n} thread(s)"), v);
            }
        }
        Err(e) => println!("probe O_DIRECT: cannot open {}: {e}", path.display()),
    }
    Ok(out)
}

/// What the staging ring's set-up costs, each way it can be pinned (printed in milliseconds for
/// 64 MiB), and how the copy rate depends on the size of each copy.
fn staging_costs(b: &dyn GpuBackend, big: usize) -> GpuResult<()> {
    alloc_costs(b)?;
    let ring = 64 * MIB;
    for (populate, read_only) in [(true, false), (true, true), (false, false)] {
        let populate_flag = if populate { libc::MAP_POPULATE } else { 0 };
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | populate_flag;
        let what = format!(
            "anonymous mmap{}",
            if populate { " MAP_POPULATE" } else { "" }
        );
        map_and_register(b, ring, (flags, -1), read_only, &what);
    }
    // A memfd (shared memory, filled by fallocate), mapped shared and registered.
    // SAFETY: a C string literal; the descriptor is checked here and closed below.
    let fd = unsafe { libc::memfd_create(c"metrale-staging".as_ptr(), 0) };
    // SAFETY: a descriptor just created.
    if fd >= 0 && unsafe { libc::fallocate(fd, 0, 0, ring as libc::off_t) } == 0 {
        for read_only in [false, true] {
            let flags = libc::MAP_SHARED | libc::MAP_POPULATE;
            let what = "memfd fallocate + shared mmap MAP_POPULATE";
            map_and_register(b, ring, (flags, fd), read_only, what);
        }
    } else {
        println!("probe staging: memfd unavailable");
    }
    if fd >= 0 {
        // SAFETY: our descriptor; the mappings of it are gone.
        unsafe { libc::close(fd) };
    }
    let t = Instant::now();
    let many: Vec<StreamId> = (0..32).map(|_| b.new_stream()).collect::<GpuResult<_>>()?;
    println!(
        "probe staging: 32 streams created in {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    copy_sizes(b, big, &many)
}

/// `alloc_pinned` of 64 MiB as 32 x 2 MiB and as one block, and freeing each.
fn alloc_costs(b: &dyn GpuBackend) -> GpuResult<()> {
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let each: Vec<*mut u8> = (0..32)
        .map(|_| b.alloc_pinned(2 * MIB))
        .collect::<GpuResult<_>>()?;
    let pin_each = ms(t);
    let t = Instant::now();
    for &p in &each {
        // SAFETY: from alloc_pinned, no copy from it.
        unsafe { b.free_pinned(p) };
    }
    let free_each = ms(t);
    let t = Instant::now();
    let one = b.alloc_pinned(64 * MIB)?;
    let pin_one = ms(t);
    let t = Instant::now();
    // SAFETY: from alloc_pinned, no copy from it.
    unsafe { b.free_pinned(one) };
    let free_one = ms(t);
    println!(
        "probe staging 64 MiB: alloc_pinned 32 x 2 MiB {pin_each:.2} ms (free {free_each:.2}); 1 x 64 MiB {pin_one:.2} ms (free {free_one:.2})"
    );
    Ok(())
}

/// Map `len` bytes (`flags`, of descriptor `fd` or anonymous with -1), register the mapping
/// (`read_only` or not), unregister and unmap it; print each step's milliseconds.
fn map_and_register(
    b: &dyn GpuBackend,
    len: usize,
    (flags, fd): (i32, i32),
    read_only: bool,
    what: &str,
) {
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    // SAFETY: a fresh mapping, checked below and unmapped at the end.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        println!("probe staging: {what}: mmap failed");
        return;
    }
    let mapped = ms(t);
    let t = Instant::now();
    // SAFETY: the mapping above, unregistered before it is unmapped.
    let r = unsafe { b.register_host(p as *const u8, len, read_only) };
    let registered = ms(t);
    let t = Instant::now();
    if r.is_ok() {
        // SAFETY: registered above, no copy from it.
        unsafe { b.unregister_host(p as *const u8) };
    }
    // SAFETY: the mapping above, no longer registered.
    unsafe { libc::munmap(p, len) };
    println!(
        "probe staging {} MiB: {what} {mapped:.2} ms + register{} {registered:.2} ms ({}); unregister + unmap {:.2} ms",
        len / MIB,
        if read_only { " read-only" } else { "" },
        if r.is_ok() { "ok" } else { "refused" },
        ms(t)
    );
}

/// Copies of `big` bytes from pinned memory in pieces of 1 to 8 MiB over 2 streams, and of
/// 2 MiB over the `many` streams.
fn copy_sizes(b: &dyn GpuBackend, big: usize, many: &[StreamId]) -> GpuResult<()> {
    let h = b.alloc_pinned(big)?;
    let d = b.alloc(big as u64)?;
    let two: Vec<StreamId> = (0..2).map(|_| b.new_stream()).collect::<GpuResult<_>>()?;
    for (piece, s) in [
        (MIB, &two[..]),
        (2 * MIB, &two[..]),
        (4 * MIB, &two[..]),
        (8 * MIB, &two[..]),
        (2 * MIB, many),
    ] {
        let t = Instant::now();
        for (c, off) in (0..big).step_by(piece).enumerate() {
            let len = piece.min(big - off);
            // SAFETY: the pinned buffer outlives the synchronize below.
            unsafe {
                b.upload_async(
                    d.view(off as u64, len as u64),
                    h.add(off),
                    len,
                    s[c % s.len()],
                )?
            };
        }
        s.iter().try_for_each(|&st| b.synchronize(st))?;
        println!(
            "probe pinned -> device in {} MiB copies, {} MiB, {} streams: {:.1} GB/s",
            piece / MIB,
            big / MIB,
            s.len(),
            gbs(big, t.elapsed().as_secs_f64())
        );
    }
    b.free(d);
    // SAFETY: synchronized above.
    unsafe { b.free_pinned(h) };
    Ok(())
}

fn h2d_pinned(b: &dyn GpuBackend, bytes: usize, n: usize) -> GpuResult<f64> {
    let h = b.alloc_pinned(bytes)?;
    let d = b.alloc(bytes as u64)?;
    let s: Vec<StreamId> = (0..n).map(|_| b.new_stream()).collect::<GpuResult<_>>()?;
    let part = bytes / n;
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for (i, &st) in s.iter().enumerate() {
            // SAFETY: `h` is pinned and outlives the synchronize below.
            unsafe {
                b.upload_async(
                    d.view((i * part) as u64, part as u64),
                    h.add(i * part),
                    part,
                    st,
                )?
            };
        }
        s.iter().try_for_each(|&st| b.synchronize(st))?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    b.free(d);
    // SAFETY: no copy in flight after the synchronizes.
    unsafe { b.free_pinned(h) };
    Ok(gbs(part * n, best))
}

/// `n` threads each copying `per_thread` bytes between buffers already touched.
fn host_memcpy(n: usize, total: usize) -> f64 {
    // `total` bytes split over the threads (each 32 MiB or more at 16 threads, past any cache):
    // 256 MiB per thread took 8 GB at 16 threads, which the test machine's memory is not for.
    let per_thread = total / n;
    // Both buffers written before the clock starts (a zeroed allocation's pages are mapped on
    // first touch: timing that measures page faults, not copies).
    let mut bufs: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|_| (vec![1u8; per_thread], vec![2u8; per_thread]))
        .collect();
    let t = Instant::now();
    std::thread::scope(|sc| {
        for (src, dst) in bufs.iter_mut() {
            sc.spawn(move || {
                dst.copy_from_slice(src);
                std::hint::black_box(&dst);
            });
        }
    });
    gbs(n * per_thread, t.elapsed().as_secs_f64())
}

/// The O_DIRECT sequential read rate of the pack's segment (16 threads, 8 MiB requests), or
/// `None` where the file system refuses O_DIRECT: the disk's own rate, for cold loads.
pub fn odirect_rate(b: &dyn GpuBackend, path: &Path) -> Result<Option<f64>> {
    use std::os::unix::fs::OpenOptionsExt;
    let pack = Pack::open(path)?;
    let r = pack.segment_range();
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    else {
        return Ok(None);
    };
    let len = ((r.end - r.start) as usize).min(4 << 30);
    Ok(Some(pread_to_pinned(
        b,
        &f,
        r.start,
        len,
        16,
        8 * MIB,
        Some(()),
    )?))
}

/// `n` threads reading `[off, off + len)` of `f` in `chunk` pieces into their own pinned
/// buffers (O_DIRECT when `direct`: whole aligned blocks).
fn pread_to_pinned(
    b: &dyn GpuBackend,
    f: &std::fs::File,
    off: u64,
    len: usize,
    n: usize,
    chunk: usize,
    direct: Option<()>,
) -> GpuResult<f64> {
    let next = AtomicUsize::new(0);
    let chunks = len.div_ceil(chunk);
    let bufs: Vec<usize> = (0..n)
        .map(|_| b.alloc_pinned(chunk).map(|p| p as usize))
        .collect::<GpuResult<_>>()?;
    let t = Instant::now();
    let res: std::io::Result<()> = std::thread::scope(|sc| {
        let hs: Vec<_> = bufs
            .iter()
            .map(|&p| {
                let next = &next;
                sc.spawn(move || -> std::io::Result<()> {
                    // SAFETY: `p` holds `chunk` pinned bytes owned by this thread until joined.
                    let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, chunk) };
                    loop {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c >= chunks {
                            return Ok(());
                        }
                        let n = chunk.min(len - c * chunk);
                        let want = if direct.is_some() {
                            n.div_ceil(4096) * 4096
                        } else {
                            n
                        };
                        let mut got = 0;
                        while got < n {
                            let r =
                                f.read_at(&mut buf[got..want], off + (c * chunk + got) as u64)?;
                            if r == 0 {
                                break;
                            }
                            got += r;
                        }
                    }
                })
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().expect("reader panicked"))
    });
    let secs = t.elapsed().as_secs_f64();
    for p in bufs {
        // SAFETY: every reader has joined.
        unsafe { b.free_pinned(p as *mut u8) };
    }
    res.map_err(|e| crate::gpu::GpuError::Invalid(format!("probe read: {e}")))?;
    Ok(gbs(len, secs))
}

fn register_pieces(b: &dyn GpuBackend, seg: &[u8], piece: usize, n: usize) -> GpuResult<f64> {
    let pieces: Vec<(usize, usize)> = (0..seg.len())
        .step_by(piece)
        .map(|o| (o, piece.min(seg.len() - o)))
        .collect();
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    let r: GpuResult<()> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let (next, pieces) = (&next, &pieces);
                sc.spawn(move || -> GpuResult<()> {
                    while let Some(&(o, l)) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                        // SAFETY: a page-aligned piece of the live read-only mapping,
                        // unregistered below.
                        unsafe { b.register_host(seg.as_ptr().add(o), l, true)? };
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().expect("register thread panicked"))
    });
    let secs = t.elapsed().as_secs_f64();
    for &(o, _) in &pieces {
        // SAFETY: no copy uses these pieces.
        unsafe { b.unregister_host(seg.as_ptr().add(o)) };
    }
    r?;
    Ok(gbs(seg.len(), secs))
}

/// A pinned `bytes` buffer copied to the device over and over on 2 streams while 16 threads
/// `pread` the segment into pinned buffers: (copy GB/s, read GB/s) while both run.
fn overlap(
    b: &dyn GpuBackend,
    f: &std::fs::File,
    off: u64,
    len: usize,
    arena: DevicePtr,
    bytes: usize,
) -> GpuResult<(f64, f64)> {
    let bytes = bytes.min(arena.bytes as usize);
    let h = b.alloc_pinned(bytes)?;
    let s: Vec<StreamId> = (0..2).map(|_| b.new_stream()).collect::<GpuResult<_>>()?;
    let done = AtomicBool::new(false);
    let copied = AtomicUsize::new(0);
    let hp = h as usize;
    let (read, copy_secs) = std::thread::scope(|sc| -> GpuResult<(f64, f64)> {
        let (done_r, copied_r, s_r) = (&done, &copied, &s);
        let copier = sc.spawn(move || -> GpuResult<f64> {
            let t = Instant::now();
            let half = bytes / 2;
            while !done_r.load(Ordering::Relaxed) {
                for (i, &st) in s_r.iter().enumerate() {
                    // SAFETY: the pinned buffer outlives the synchronize below.
                    unsafe {
                        b.upload_async(
                            arena.view((i * half) as u64, half as u64),
                            (hp as *const u8).add(i * half),
                            half,
                            st,
                        )?
                    };
                }
                s_r.iter().try_for_each(|&st| b.synchronize(st))?;
                copied_r.fetch_add(2 * half, Ordering::Relaxed);
            }
            Ok(t.elapsed().as_secs_f64())
        });
        let read = pread_to_pinned(b, f, off, len, 16, 2 * MIB, None);
        done.store(true, Ordering::Relaxed);
        let secs = copier.join().expect("copier panicked")?;
        Ok((read?, secs))
    })?;
    // SAFETY: the copier synchronized its last copies before returning.
    unsafe { b.free_pinned(h) };
    Ok((gbs(copied.load(Ordering::Relaxed), copy_secs), read))
}

/// Read a file through once (64 MiB at a time) so it sits in the page cache.
pub fn warm_page_cache(path: &Path) {
    use std::io::Read;
    if let Ok(mut f) = std::fs::File::open(path) {
        let mut buf = vec![0u8; 64 << 20];
        while matches!(f.read(&mut buf), Ok(n) if n > 0) {}
    }
}
