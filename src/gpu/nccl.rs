//! NCCL through cudarc's dynamically loaded bindings (nothing is needed to build; at run time
//! `libnccl.so` must be on the loader path, e.g. from the Python package `nvidia-nccl-cu13`):
//! one communicator per GPU of this process (`ncclCommInitAll`), and the in-place f32 sum of
//! the tensor-parallel layer's partial outputs. `NCCL_NVLS_ENABLE=0` is set before the
//! communicators are made unless the caller set it (NVLink multicast stays off on the H200
//! machines this runs on).

use super::allreduce::AllReduce;
use super::cuda::CudaBackend;
use super::{DevicePtr, GpuBackend, GpuError, GpuResult};
use cudarc::nccl::sys;
use std::sync::Arc;

/// One communicator per rank, rank r on `backends[r]`'s device.
pub struct Nccl {
    comms: Vec<sys::ncclComm_t>,
    backends: Vec<Arc<CudaBackend>>,
}

// SAFETY: an NCCL communicator may be used from any thread, one thread at a time per
// communicator; each rank's thread uses only its own (`all_reduce` takes the rank).
unsafe impl Send for Nccl {}
// SAFETY: as above.
unsafe impl Sync for Nccl {}

fn check(call: &str, r: sys::ncclResult_t) -> GpuResult<()> {
    if r == sys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any result.
    let msg = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(r)) };
    Err(GpuError::Cuda {
        call: call.into(),
        msg: format!("{r:?}: {}", msg.to_string_lossy()),
    })
}

impl Nccl {
    /// Communicators over the devices of `backends`, rank r on `backends[r]`.
    pub fn new(backends: &[Arc<CudaBackend>]) -> GpuResult<Self> {
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoDevice(
                "libnccl could not be loaded: put the directory of libnccl.so (pip package nvidia-nccl-cu13, nvidia/nccl/lib, with a libnccl.so link to libnccl.so.2) on LD_LIBRARY_PATH".into(),
            ));
        }
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: set before any NCCL thread exists (the communicators are made below).
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
        let devs: Vec<i32> = backends.iter().map(|b| b.ordinal()).collect();
        let mut comms = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` holds one slot per device of `devs`.
        check("ncclCommInitAll", unsafe {
            sys::ncclCommInitAll(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr())
        })?;
        Ok(Nccl {
            comms,
            backends: backends.to_vec(),
        })
    }
}

impl AllReduce for Nccl {
    fn all_reduce(
        &self,
        rank: usize,
        _b: &dyn GpuBackend,
        ptr: DevicePtr,
        count: usize,
    ) -> GpuResult<()> {
        self.backends[rank].make_current()?;
        // SAFETY: `ptr` holds `count` f32 on rank `rank`'s device (the caller's contract); the
        // sum is in place, on the default stream the layer's kernels ran on.
        check("ncclAllReduce", unsafe {
            sys::ncclAllReduce(
                ptr.addr as *const std::ffi::c_void,
                ptr.addr as *mut std::ffi::c_void,
                count,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                self.comms[rank],
                std::ptr::null_mut(),
            )
        })
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        for &c in &self.comms {
            // SAFETY: each communicator was made by ncclCommInitAll and is destroyed once.
            unsafe { sys::ncclCommDestroy(c) };
        }
    }
}
