//! The GPU runtime: a backend trait over device memory, copies, streams and kernels looked up
//! by (module, name), with two implementations: [`cuda::CudaBackend`] (cudarc, dynamic loading,
//! kernels compiled with NVRTC and cached on disk) and [`host::HostBackend`], which implements
//! the same kernel names on the CPU with the same numerics contract ([`reference`](mod@reference)), so every
//! routing decision runs in CI and GPU results are checked against it.

pub mod allreduce;
pub mod cuda;
pub mod host;
pub mod kernel_cache;
pub mod kernels;
pub mod levers;
pub mod nccl;
pub mod prebuilt;
pub mod reference;
pub mod sizes;
pub mod staging;
pub mod table;
pub mod timing;

pub use levers::ModelLevers;

/// A device address range. `addr == 0` is null.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct DevicePtr {
    /// Device address.
    pub addr: u64,
    /// Length in bytes.
    pub bytes: u64,
}

impl DevicePtr {
    /// The null pointer.
    pub const NULL: DevicePtr = DevicePtr { addr: 0, bytes: 0 };
    /// Whether it is null.
    pub fn is_null(&self) -> bool {
        self.addr == 0
    }
    /// The sub-range `[off, off + len)`; panics when it leaves the allocation (a logic error).
    pub fn view(&self, off: u64, len: u64) -> DevicePtr {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.bytes),
            "view {off}+{len} outside {} bytes",
            self.bytes
        );
        DevicePtr {
            addr: self.addr + off,
            bytes: len,
        }
    }
}

/// A resolved kernel; `0` means the kernel is not available and the path that needs it must
/// return [`GpuError::MissingKernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct KernelHandle(pub u64);

impl KernelHandle {
    /// Whether the kernel resolved.
    pub fn ok(&self) -> bool {
        self.0 != 0
    }
}

/// A stream; 0 is the backend's default stream.
pub type StreamId = u64;

/// A timing event.
pub type EventId = u64;

/// A captured launch graph (CUDA graph), replayed by [`GpuBackend::replay`].
pub type GraphId = u64;

/// A kernel argument.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KArg {
    /// A device pointer (`T*`).
    Ptr(DevicePtr),
    /// An `int`.
    I32(i32),
    /// A `float`.
    F32(f32),
    /// A size, count or stride for the kernel's `int` parameter: the backend refuses one above
    /// `i32::MAX` at launch instead of truncating it.
    Dim(usize),
    /// A tensor map (`CUtensorMap`, passed by value) over a row-major byte matrix, which the
    /// backend encodes at launch (the kernel table's `t` parameters).
    Tmap(Tmap),
}

/// A 2-D tensor map for the bulk tensor copy engine (TMA): `rows` rows of `row_bytes` u8 at
/// `base`, copied in boxes of `box_rows` rows by `box_bytes` bytes in the 128-byte swizzle
/// (formats.md, "The W8A8 wgmma GEMMs"); rows and bytes past the matrix read as zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tmap {
    /// The matrix (its first byte; 16-byte aligned).
    pub base: DevicePtr,
    /// Bytes per row, which is also the row stride (a multiple of 16).
    pub row_bytes: usize,
    /// Rows.
    pub rows: usize,
    /// Rows per box (at most 256).
    pub box_rows: usize,
    /// Bytes per box row (at most 128, the swizzle span).
    pub box_bytes: usize,
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchCfg {
    /// Blocks (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory in bytes.
    pub smem: u32,
    /// A programmatic dependent launch (the kernel table's `dependent`): the backend may start
    /// it before the stream's previous kernel ends; the kernel waits where it must.
    pub dependent: bool,
}

impl LaunchCfg {
    /// A `gx` x `gy` grid of `block`-thread blocks without dynamic shared memory.
    pub fn grid(gx: usize, gy: usize, block: usize) -> Self {
        LaunchCfg {
            grid: (gx as u32, gy as u32, 1),
            block: (block as u32, 1, 1),
            smem: 0,
            dependent: false,
        }
    }
}

pub use crate::error::{GpuError, GpuResult};

/// A BF16 GEMM: `y[m, n] = x[m, k] . w[n, k]^T`, `x` row stride `k`, `w` row stride `kw`.
#[derive(Clone, Copy, Debug)]
pub struct GemmBf16 {
    /// Activations, BF16 `[m, k]`.
    pub x: DevicePtr,
    /// Weight, BF16 `[n, kw]`.
    pub w: DevicePtr,
    /// Output, f32 `[m, n]`.
    pub y: DevicePtr,
    /// Rows.
    pub m: usize,
    /// Output columns.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// The weight's row stride (>= k).
    pub kw: usize,
}

/// Device memory, copies, streams and kernels.
pub trait GpuBackend: Send + Sync {
    /// Human-readable device name.
    fn name(&self) -> String;
    /// `sm_90`, or `host` for the reference backend.
    fn arch(&self) -> String;
    /// Allocate device memory (uninitialised).
    fn alloc(&self, bytes: u64) -> GpuResult<DevicePtr>;
    /// `bytes` of device address space, contiguous, whose memory [`map_range`](Self::map_range)
    /// backs piece by piece (so allocating can overlap copies into pieces already mapped); freed
    /// by `free`. The default allocates it whole (every range already backed).
    fn reserve(&self, bytes: u64) -> GpuResult<DevicePtr> {
        self.alloc(bytes)
    }
    /// Back `[off, off + len)` of a [`reserve`](Self::reserve)d range with device memory
    /// (`off` a multiple of [`map_granularity`](Self::map_granularity); `len` rounded up to it
    /// within the range). The default has nothing to do.
    fn map_range(&self, _p: DevicePtr, _off: u64, _len: u64) -> GpuResult<()> {
        Ok(())
    }
    /// The unit of [`map_range`](Self::map_range) offsets (1 where ranges come backed).
    fn map_granularity(&self) -> u64 {
        1
    }
    /// Free an allocation made by [`alloc`](Self::alloc).
    fn free(&self, p: DevicePtr);
    /// Copy host bytes to the device (synchronous; `src` may be pageable).
    fn upload(&self, dst: DevicePtr, src: &[u8]) -> GpuResult<()>;
    /// Copy device bytes to the host (synchronous).
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> GpuResult<()>;
    /// Set every byte of `dst` to `byte`.
    fn fill(&self, dst: DevicePtr, byte: u8) -> GpuResult<()>;
    /// Resolve a kernel; handle 0 when it does not exist.
    fn kernel(&self, module: &str, name: &str) -> KernelHandle;
    /// Launch a resolved kernel.
    fn launch(
        &self,
        k: KernelHandle,
        cfg: LaunchCfg,
        stream: StreamId,
        args: &[KArg],
    ) -> GpuResult<()>;
    /// `y[m, n] = x[m, k] . w[n, k]^T`: BF16 `x` and `w` (row strides `k` and `kw >= k`), f32 `y`,
    /// f32 accumulation (cuBLAS on CUDA). Returns `MissingKernel` when there is no BLAS.
    fn gemm_bf16(&self, g: &GemmBf16, stream: StreamId) -> GpuResult<()>;
    /// Wait for all work on `stream`.
    fn synchronize(&self, stream: StreamId) -> GpuResult<()>;
    /// Kernel launches (and BLAS calls) so far: tests count repacks and no-launch paths with it.
    fn launch_count(&self) -> u64;
    /// Multiprocessors, to which a persistent kernel's grid is clamped; `None` (the default):
    /// no clamp.
    fn multiprocessors(&self) -> Option<usize> {
        None
    }
    /// A new asynchronous stream.
    fn new_stream(&self) -> GpuResult<StreamId>;
    /// A new timing event.
    fn new_event(&self) -> GpuResult<EventId>;
    /// Record `event` on `stream` (it completes when the work queued before it does).
    fn record_event(&self, event: EventId, stream: StreamId) -> GpuResult<()>;
    /// Milliseconds between two recorded, completed events.
    fn elapsed_ms(&self, start: EventId, end: EventId) -> GpuResult<f32>;
    /// Page-lock `len` bytes at `ptr` for DMA (`read_only`: `CU_MEMHOSTREGISTER_READ_ONLY`, for
    /// file mappings the driver must not pin writable).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay mapped until [`unregister_host`](Self::unregister_host).
    unsafe fn register_host(&self, ptr: *const u8, len: usize, read_only: bool) -> GpuResult<()>;
    /// Undo [`register_host`](Self::register_host).
    ///
    /// # Safety
    /// `ptr` must have been registered and no copy from it may be in flight.
    unsafe fn unregister_host(&self, ptr: *const u8);
    /// Pinned host memory for staging copies.
    fn alloc_pinned(&self, bytes: usize) -> GpuResult<*mut u8>;
    /// Free [`alloc_pinned`](Self::alloc_pinned) memory.
    ///
    /// # Safety
    /// `p` came from `alloc_pinned` and no copy from it is in flight.
    unsafe fn free_pinned(&self, p: *mut u8);
    /// The staging buffers this backend keeps between loads, if it keeps any (the loader's
    /// ring takes them instead of pinning new memory, and gives them back).
    fn staging_pool(&self) -> Option<&staging::StagingPool> {
        None
    }
    /// Record the launches `f` queues on `stream` (a stream from [`new_stream`](Self::new_stream))
    /// into a graph instead of running them (CUDA stream capture): `f` must launch only on that
    /// stream, without allocating, copying or synchronizing. The default has no graphs.
    fn capture(
        &self,
        _stream: StreamId,
        _f: &mut dyn FnMut() -> GpuResult<()>,
    ) -> GpuResult<GraphId> {
        Err(GpuError::Invalid(format!(
            "{}: no launch graphs on this backend",
            self.name()
        )))
    }
    /// Queue a captured graph's launches on `stream` as one submission.
    fn replay(&self, _g: GraphId, _stream: StreamId) -> GpuResult<()> {
        Err(GpuError::Invalid(format!(
            "{}: no launch graphs on this backend",
            self.name()
        )))
    }
    /// A stream this backend can queue work on for a stream another library made (a
    /// `CUstream` handle as an integer, torch's `cuda_stream`; 0 the legacy default stream): the
    /// same id for the same handle. The backend never destroys it. The default (a backend
    /// without streams of its own) gives a new stream of its own.
    fn adopt_stream(&self, raw: u64) -> GpuResult<StreamId> {
        let _ = raw;
        self.new_stream()
    }
    /// Queue a copy of `src` (all its bytes) into `dst` on `stream`. The default copies through
    /// the host (a backend whose device is the host).
    ///
    /// # Safety
    /// `src` and `dst` must be device memory, `dst` at least as long as `src`, not overlapping,
    /// valid until `stream` is synchronized.
    unsafe fn copy_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        stream: StreamId,
    ) -> GpuResult<()> {
        let _ = stream;
        let mut tmp = vec![0u8; src.bytes as usize];
        self.download(src, &mut tmp)?;
        self.upload(dst, &tmp)
    }
    /// Queue a host-to-device copy on `stream`.
    ///
    /// # Safety
    /// `src..src+len` must stay valid and unchanged until `stream` is synchronized; it should
    /// be pinned or registered (pageable memory is copied synchronously by the driver).
    unsafe fn upload_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: StreamId,
    ) -> GpuResult<()>;
}

/// A device as a loader's caller names it: `"cpu"` (the host backend) or `"cuda"` /
/// `"cuda:N"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The process's shared host backend.
    Host,
    /// CUDA device N.
    Cuda(usize),
}

impl Device {
    /// Parse `"cpu"`, `"cuda"` or `"cuda:N"`.
    pub fn parse(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Host),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("device {s:?}: expected \"cpu\", \"cuda\" or \"cuda:N\"")),
        }
    }

    /// DLPack's `(device type, id)`: `(1, 0)` host, `(2, N)` CUDA.
    pub fn dlpack(self) -> (i32, i32) {
        match self {
            Device::Host => (1, 0),
            Device::Cuda(n) => (2, n as i32),
        }
    }

    /// The process's shared backend of this device ([`host::HostBackend::shared`],
    /// [`cuda::CudaBackend::shared`]).
    pub fn backend(self) -> GpuResult<std::sync::Arc<dyn GpuBackend>> {
        Ok(match self {
            Device::Host => host::HostBackend::shared().clone(),
            Device::Cuda(n) => cuda::CudaBackend::shared(n)?,
        })
    }
}

/// Upload a slice of f32 values.
pub fn upload_f32(b: &dyn GpuBackend, dst: DevicePtr, v: &[f32]) -> GpuResult<()> {
    b.upload(
        dst,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
}

/// Download f32 values.
pub fn download_f32(b: &dyn GpuBackend, src: DevicePtr) -> GpuResult<Vec<f32>> {
    let mut raw = vec![0u8; src.bytes as usize];
    b.download(src, &mut raw)?;
    Ok(raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Allocate and upload.
pub fn alloc_upload(b: &dyn GpuBackend, bytes: &[u8]) -> GpuResult<DevicePtr> {
    let p = b.alloc(bytes.len() as u64)?;
    b.upload(p, bytes)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_from_what_callers_write() {
        assert_eq!(Device::parse("cpu"), Ok(Device::Host));
        assert_eq!(Device::parse("cuda"), Ok(Device::Cuda(0)));
        assert_eq!(Device::parse("cuda:3"), Ok(Device::Cuda(3)));
        assert_eq!(Device::Cuda(3).dlpack(), (2, 3));
        assert_eq!(Device::Host.dlpack(), (1, 0));
        for bad in ["cuda:", "cuda:x", "cuda:-1", "tpu", "CPU", ""] {
            let e = Device::parse(bad).unwrap_err();
            assert!(e.contains("expected"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_default_device_copy_moves_every_byte_and_refuses_a_short_destination() {
        let b = host::HostBackend::new();
        let src = alloc_upload(&b, &(0..=255u8).collect::<Vec<_>>()).unwrap();
        let dst = b.alloc(256).unwrap();
        let s = b.adopt_stream(12345).unwrap();
        // SAFETY: both are this backend's allocations of 256 bytes; host copies are synchronous.
        unsafe { b.copy_device_async(dst, src, s) }.unwrap();
        let mut got = vec![0u8; 256];
        b.download(dst, &mut got).unwrap();
        assert_eq!(got, (0..=255u8).collect::<Vec<_>>());
        let short = b.alloc(16).unwrap();
        // SAFETY: as above; the copy is refused before any byte moves.
        assert!(unsafe { b.copy_device_async(short, src, s) }.is_err());
    }
}
