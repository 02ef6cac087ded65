//! Pinned staging memory for host-to-device copies, in pieces, and the pool a backend keeps
//! between loads.
//!
//! Pinning fresh memory is the slow part of a first load: on the H200 host (gVisor) populating
//! anonymous memory costs about 0.3 ms a MiB and `cuMemHostAlloc` about 0.4 ms a MiB, where
//! registering populated memory read-only costs 0.04 ms a MiB (BENCHMARKS-history.md, "The staging
//! ring in pieces, kept between loads"). A [`Piece`] is therefore an anonymous mapping populated by the kernel and
//! registered read-only (the device only reads staging memory), with `alloc_pinned` as the
//! fallback where registration is refused.

use super::{GpuBackend, GpuResult, StreamId};
use std::sync::Mutex;

/// One pinned range of staging memory.
#[derive(Debug)]
pub struct Piece {
    ptr: *mut u8,
    len: usize,
    /// An anonymous mapping registered with the driver (else `alloc_pinned` memory).
    mapped: bool,
}

// SAFETY: a Piece is an owned allocation; only its owner reads or writes the memory.
unsafe impl Send for Piece {}

impl Piece {
    /// Pin `len` bytes (page-aligned): a populated anonymous mapping registered read-only, or
    /// `alloc_pinned` memory where the mapping or the registration is refused.
    pub fn pin(b: &dyn GpuBackend, len: usize) -> GpuResult<Piece> {
        if let Some(Ok(piece)) = Populated::new(len).map(|m| m.register(b)) {
            return Ok(piece);
        }
        Ok(Piece {
            ptr: b.alloc_pinned(len)?,
            len,
            mapped: false,
        })
    }

    /// The memory's start.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Unpin and free it.
    ///
    /// # Safety
    /// No copy from the memory may be in flight; `b` is the backend that pinned it.
    pub unsafe fn release(self, b: &dyn GpuBackend) {
        if self.mapped {
            // SAFETY: registered and mapped in `pin`; no copy in flight (the caller's promise).
            unsafe {
                b.unregister_host(self.ptr);
                libc::munmap(self.ptr as *mut libc::c_void, self.len);
            }
        } else {
            // SAFETY: from alloc_pinned; no copy in flight.
            unsafe { b.free_pinned(self.ptr) };
        }
    }
}

/// Anonymous memory populated by the kernel and not yet registered: the slow half of pinning
/// (about 0.3 ms a MiB on the H200 host), which needs no CUDA context, so it can run on a
/// helper thread while the driver starts ([`prepin_bytes`]).
#[derive(Debug)]
pub struct Populated {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: an owned private mapping that nothing else references until it is registered.
unsafe impl Send for Populated {}

impl Populated {
    /// A private anonymous mapping of `len` bytes populated by the kernel (`MAP_POPULATE`);
    /// `None` where the mapping is refused.
    pub fn new(len: usize) -> Option<Populated> {
        // SAFETY: a fresh private anonymous mapping; the result is checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(Populated {
            ptr: p as *mut u8,
            len,
        })
    }

    /// Register the memory read-only with `b` (the device only reads staging memory): a
    /// [`Piece`]. A refused registration unmaps it and is returned.
    pub fn register(self, b: &dyn GpuBackend) -> GpuResult<Piece> {
        let (ptr, len) = (self.ptr, self.len);
        std::mem::forget(self);
        // SAFETY: the mapping made in `new`, unregistered (in `Piece::release`) before it is
        // unmapped.
        match unsafe { b.register_host(ptr, len, true) } {
            Ok(()) => Ok(Piece {
                ptr,
                len,
                mapped: true,
            }),
            Err(e) => {
                // SAFETY: the mapping made in `new`, registered with nothing.
                unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
                Err(e)
            }
        }
    }
}

impl Drop for Populated {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, never registered (`register` forgets `self`).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Staging buffers a backend pins when it opens, before any load asks: [`PREPIN_BUFFERS`] of
/// [`PREPIN_BUFFER_BYTES`] (the loader's default ring, so its first load takes them as kept
/// buffers). The memory is populated on a helper thread while the driver initializes and
/// registered once the context exists.
pub const PREPIN_BUFFER_BYTES: usize = 8 << 20;
/// See [`PREPIN_BUFFER_BYTES`].
pub const PREPIN_BUFFERS: usize = 16;

/// The bytes a backend pins when it opens: [`PREPIN_BUFFERS`] x [`PREPIN_BUFFER_BYTES`], or
/// none when the environment sets `METRALE_PREPIN=0` (a process that will not load a pack).
pub fn prepin_bytes() -> Option<usize> {
    match std::env::var("METRALE_PREPIN") {
        Ok(v) if v.trim() == "0" => None,
        _ => Some(PREPIN_BUFFERS * PREPIN_BUFFER_BYTES),
    }
}

impl Buffers {
    /// `piece` cut into buffers of `size` bytes, each with a new stream of `b`.
    pub fn cut(b: &dyn GpuBackend, piece: Piece, size: usize) -> GpuResult<Buffers> {
        let mut bufs = Buffers {
            size,
            ..Buffers::default()
        };
        let base = piece.ptr();
        let n = piece.len() / size.max(1);
        bufs.pieces.push(piece);
        for i in 0..n {
            match b.new_stream() {
                Ok(s) => bufs.slots.push((base.wrapping_add(i * size), s)),
                Err(e) => {
                    // SAFETY: no copy from the buffers was ever issued.
                    unsafe { bufs.release(b) };
                    return Err(e);
                }
            }
        }
        Ok(bufs)
    }
}

/// Staging buffers of one size cut from pinned pieces, each with its own stream.
#[derive(Debug, Default)]
pub struct Buffers {
    /// The pinned pieces the buffers are cut from.
    pub pieces: Vec<Piece>,
    /// Every buffer: its start and its stream.
    pub slots: Vec<(*mut u8, StreamId)>,
    /// The bytes of each buffer.
    pub size: usize,
}

// SAFETY: owned pinned memory and stream ids; one owner at a time.
unsafe impl Send for Buffers {}

impl Buffers {
    /// Unpin and free every piece.
    ///
    /// # Safety
    /// No copy from the buffers may be in flight; `b` is the backend that pinned them.
    pub unsafe fn release(self, b: &dyn GpuBackend) {
        for piece in self.pieces {
            // SAFETY: per this function's contract.
            unsafe { piece.release(b) };
        }
    }
}

/// The staging buffers a backend keeps between loads: a later load takes them instead of
/// pinning new memory; released with the backend.
#[derive(Debug, Default)]
pub struct StagingPool(Mutex<Option<Buffers>>);

impl StagingPool {
    /// The kept buffers, if any are kept with buffers of `size` bytes.
    pub fn take(&self, size: usize) -> Option<Buffers> {
        let mut g = self.0.lock().unwrap();
        match g.as_ref() {
            Some(k) if k.size == size => g.take(),
            _ => None,
        }
    }

    /// Whether buffers of `size` bytes are kept.
    pub fn holds(&self, size: usize) -> bool {
        matches!(self.0.lock().unwrap().as_ref(), Some(k) if k.size == size && !k.slots.is_empty())
    }

    /// Register `mem` with `b` and keep it, cut into buffers of `size` bytes, for the next
    /// load (what a backend pins when it opens: [`PREPIN_BUFFERS`]). On an error nothing is
    /// kept and the memory is freed.
    pub fn keep_populated(&self, b: &dyn GpuBackend, mem: Populated, size: usize) -> GpuResult<()> {
        let bufs = Buffers::cut(b, mem.register(b)?, size)?;
        if let Some(old) = self.keep(bufs) {
            // SAFETY: `old` was kept by a finished load, whose copies were all synchronized.
            unsafe { old.release(b) };
        }
        Ok(())
    }

    /// Keep `bufs` for the next load; returns what was kept before (the caller releases it).
    pub fn keep(&self, bufs: Buffers) -> Option<Buffers> {
        self.0.lock().unwrap().replace(bufs)
    }

    /// Release everything kept (a backend's drop).
    ///
    /// # Safety
    /// No copy from the kept buffers may be in flight; `b` is the backend that pinned them.
    pub unsafe fn release_all(&self, b: &dyn GpuBackend) {
        if let Some(bufs) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // SAFETY: per this function's contract.
            unsafe { bufs.release(b) };
        }
    }
}
