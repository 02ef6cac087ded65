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

/// The host collectives' one mechanism: each rank publishes its value; once every rank has,
/// each reads them all; no rank publishes again before every rank has read.
struct Exchange<T> {
    slots: Mutex<Vec<T>>,
    barrier: Barrier,
}

impl<T: Clone + Default> Exchange<T> {
    fn new(n: usize) -> Self {
        Exchange {
            slots: Mutex::new(vec![T::default(); n]),
            barrier: Barrier::new(n),
        }
    }

    /// Publish `mine` as rank `rank`'s value, then `read` every rank's (in rank order).
    fn exchange<R>(&self, rank: usize, mine: T, read: impl FnOnce(&[T]) -> R) -> R {
        self.slots.lock().unwrap()[rank] = mine;
        self.barrier.wait();
        let r = read(&self.slots.lock().unwrap());
        self.barrier.wait();
        r
    }
}

/// The host all-reduce: each rank's values are downloaded, summed in rank order (the same sum on
/// every rank) and uploaded back.
pub struct HostSum(Exchange<Vec<f32>>);

impl HostSum {
    /// For `n` ranks.
    pub fn new(n: usize) -> Self {
        HostSum(Exchange::new(n))
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
        let sum = self.0.exchange(rank, mine, |parts| {
            let mut s = vec![0f32; count];
            for part in parts {
                s.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
            s
        });
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
pub struct HostGather(Exchange<Vec<u8>>);

impl HostGather {
    /// For `n` ranks.
    pub fn new(n: usize) -> Self {
        HostGather(Exchange::new(n))
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
        self.0.exchange(rank, mine, |all| {
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
        })
    }
}
