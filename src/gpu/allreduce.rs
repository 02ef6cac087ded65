//! The collectives of tensor-parallel ranks: the all-reduce of a layer's partial outputs
//! ([`AllReduce`]; [`HostSum`] on the host backend, `super::nccl::Nccl` with NCCL) and the
//! all-gather that fills every rank's copy of a pack's replicated range from the parts each
//! rank read ([`AllGather`]; [`HostGather`] on the host backend).

use super::{DevicePtr, GpuBackend, GpuResult, download_f32, upload_f32};
use std::sync::{Barrier, Mutex};

/// Sum `count` f32 values at `ptr` over every rank, in place, on rank `rank`'s backend. Every
/// rank calls it the same number of times in the same order (a collective).
pub trait AllReduce: Sync {
    /// The collective for rank `rank`.
    fn all_reduce(
        &self,
        rank: usize,
        b: &dyn GpuBackend,
        ptr: DevicePtr,
        count: usize,
    ) -> GpuResult<()>;
}

/// The host all-reduce: each rank's values are downloaded, summed in rank order (the same sum on
/// every rank) and uploaded back.
pub struct HostSum {
    partials: Mutex<Vec<Vec<f32>>>,
    barrier: Barrier,
}

impl HostSum {
    /// For `n` ranks.
    pub fn new(n: usize) -> Self {
        HostSum {
            partials: Mutex::new(vec![Vec::new(); n]),
            barrier: Barrier::new(n),
        }
    }
}

impl AllReduce for HostSum {
    fn all_reduce(
        &self,
        rank: usize,
        b: &dyn GpuBackend,
        ptr: DevicePtr,
        count: usize,
    ) -> GpuResult<()> {
        let mine = download_f32(b, ptr.view(0, count as u64 * 4))?;
        self.partials.lock().unwrap()[rank] = mine;
        self.barrier.wait();
        let sum = {
            let p = self.partials.lock().unwrap();
            let mut s = vec![0f32; count];
            for part in p.iter() {
                s.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
            s
        };
        // Every rank has read every partial before any rank stores its next one.
        self.barrier.wait();
        upload_f32(b, ptr, &sum)
    }
}

/// Fill `region` (one rank's copy of a range every rank holds) from the parts the ranks read:
/// part `k` of `parts` (`(offset, bytes)` within `region`) was written by rank `k`; afterwards
/// every rank's `region` holds every part. Every rank calls it once per load (a collective).
pub trait AllGather: Sync {
    /// The collective for rank `rank`.
    fn all_gather(
        &self,
        rank: usize,
        b: &dyn GpuBackend,
        region: DevicePtr,
        parts: &[(u64, u64)],
    ) -> GpuResult<()>;
}

/// The host all-gather: each rank's part is downloaded, published, and uploaded into every other
/// rank's region.
pub struct HostGather {
    parts: Mutex<Vec<Vec<u8>>>,
    barrier: Barrier,
}

impl HostGather {
    /// For `n` ranks.
    pub fn new(n: usize) -> Self {
        HostGather {
            parts: Mutex::new(vec![Vec::new(); n]),
            barrier: Barrier::new(n),
        }
    }
}

impl AllGather for HostGather {
    fn all_gather(
        &self,
        rank: usize,
        b: &dyn GpuBackend,
        region: DevicePtr,
        parts: &[(u64, u64)],
    ) -> GpuResult<()> {
        let &(at, len) = parts.get(rank).ok_or_else(|| {
            super::GpuError::Invalid(format!("all_gather: rank {rank} of {} parts", parts.len()))
        })?;
        let mut mine = vec![0u8; len as usize];
        b.download(region.view(at, len), &mut mine)?;
        self.parts.lock().unwrap()[rank] = mine;
        self.barrier.wait();
        let result = (|| {
            let all = self.parts.lock().unwrap();
            for (k, &(at, len)) in parts.iter().enumerate().filter(|&(k, _)| k != rank) {
                if all[k].len() as u64 != len {
                    return Err(super::GpuError::Invalid(format!(
                        "all_gather: rank {k} gave {} bytes for a part of {len}",
                        all[k].len()
                    )));
                }
                b.upload(region.view(at, len), &all[k])?;
            }
            Ok(())
        })();
        // Every rank has read every part before any rank's next gather stores its own.
        self.barrier.wait();
        result
    }
}
