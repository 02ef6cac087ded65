//! The ceilings the benchmarks set figures against: pinned host-to-device and device-to-device
//! copy rates, measured on this device in the same run.

use super::{CudaBackend, cuerr};
use crate::gpu::{GpuBackend, GpuResult};
use cudarc::driver::result as cu;

impl CudaBackend {
    /// The pinned host-to-device ceiling: bytes per second of `reps` copies of `bytes` from
    /// pinned memory, spread over two streams (median of 5 runs).
    pub fn pinned_h2d_ceiling(&self, bytes: usize) -> GpuResult<f64> {
        let h = self.alloc_pinned(bytes)?;
        let d = self.alloc(bytes as u64)?;
        let s = [self.new_stream()?, self.new_stream()?];
        let half = bytes / 2;
        let t = crate::gpu::timing::time_median(self, 5, || {
            for (i, st) in s.iter().enumerate() {
                // SAFETY: `h` is pinned and outlives the synchronize below.
                unsafe {
                    self.upload_async(
                        d.view((i * half) as u64, half as u64),
                        h.add(i * half),
                        half,
                        *st,
                    )?
                };
            }
            for st in s {
                self.synchronize(st)?;
            }
            Ok(())
        });
        self.free(d);
        // SAFETY: no copy in flight after the synchronizes.
        unsafe { self.free_pinned(h) };
        Ok(bytes as f64 / t?)
    }

    /// The device-to-device copy ceiling: bytes read plus written per second, median of 10
    /// copies of `bytes` between two device buffers.
    pub fn copy_ceiling(&self, bytes: u64) -> GpuResult<f64> {
        let a = self.alloc(bytes)?;
        let b = self.alloc(bytes)?;
        self.fill(a, 0x3C)?;
        let t = crate::gpu::timing::time_median(self, 10, || {
            // SAFETY: both ranges are live allocations of `bytes`.
            unsafe { cu::memcpy_dtod_async(b.addr, a.addr, bytes as usize, std::ptr::null_mut()) }
                .map_err(cuerr("cuMemcpyDtoDAsync"))
        });
        self.free(a);
        self.free(b);
        Ok(2.0 * bytes as f64 / t?)
    }
}
