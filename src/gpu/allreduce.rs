//! The all-reduce of a tensor-parallel layer's partial outputs: the collective's interface,
//! and [`HostSum`], the host backend's (NCCL's is `super::nccl::Nccl`).

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
