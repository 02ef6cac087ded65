//! Where a copy path writes: the arena, and the gate that says how much of it is backed by
//! device memory yet (the arena may be mapped piece by piece while the copies run).

use crate::gpu::{DevicePtr, GpuError, GpuResult};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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
    pub(super) fn view(&self, off: u64, len: u64) -> GpuResult<DevicePtr> {
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
