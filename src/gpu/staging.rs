//! Pinned staging memory for host-to-device copies, in pieces, and the pool a backend keeps
//! between loads.
//!
//! Pinning fresh memory is the slow part of a first load: on the H200 host (gVisor) populating
//! anonymous memory costs about 0.3 ms a MiB and `cuMemHostAlloc` about 0.4 ms a MiB, where
//! registering populated memory read-only costs 0.04 ms a MiB (BENCHMARKS.md, "The staging
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
        if p != libc::MAP_FAILED {
            // SAFETY: the mapping just made, unregistered (in `release`) before it is unmapped.
            match unsafe { b.register_host(p as *const u8, len, true) } {
                Ok(()) => {
                    return Ok(Piece {
                        ptr: p as *mut u8,
                        len,
                        mapped: true,
                    });
                }
                // SAFETY: the mapping just made, registered with nothing.
                Err(_) => unsafe {
                    libc::munmap(p, len);
                },
            }
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
