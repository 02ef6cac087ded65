//! The CUDA backend: cudarc 0.19 with dynamic loading (nothing CUDA is needed to build), the
//! driver API on raw device pointers, kernels compiled with NVRTC for the device's arch on first
//! use and cached on disk (keyed by source, options, arch and NVRTC version), cuBLAS for BF16.

use super::{
    DevicePtr, EventId, GemmBf16, GpuBackend, GpuError, GpuResult, GraphId, KArg, KernelHandle,
    LaunchCfg, StreamId,
};
use cudarc::driver::{result as cu, sys as cus};
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod ceilings;
mod compile;
mod launch;
mod modules;
mod tmap;
pub use compile::{
    compile_cubin, compile_options, compile_with_log, cuda_include_dir, nvrtc_version,
};
pub use launch::pdl_enabled;

/// The error of a failed driver or cuBLAS call `call`, with what the library said.
fn cuerr<E: std::fmt::Debug>(call: &str) -> impl Fn(E) -> GpuError + '_ {
    move |e| GpuError::Cuda {
        call: call.into(),
        msg: format!("{e:?}"),
    }
}

struct State {
    modules: HashMap<String, Option<cus::CUmodule>>,
    /// Each loaded module's kernels by name, enumerated at load: a lookup of a name the module
    /// does not define answers 0 without a failing `cuModuleGetFunction` (which
    /// compute-sanitizer reports as an API error).
    entries: HashMap<String, HashMap<String, cus::CUfunction>>,
    functions: Vec<cus::CUfunction>,
    index: HashMap<(String, String), u64>,
    compile_errors: HashMap<String, String>,
    cublas: Option<cudarc::cublas::sys::cublasHandle_t>,
    streams: Vec<cus::CUstream>,
    events: Vec<cus::CUevent>,
    /// Reserved address ranges (`reserve`) by base address: their size and mapped pieces.
    reserved: HashMap<u64, Reserved>,
    /// Instantiated launch graphs (`capture`), by `GraphId - 1`.
    graphs: Vec<cus::CUgraphExec>,
    /// Functions whose dynamic shared-memory limit was raised, and to what.
    smem_limit: HashMap<usize, u32>,
}

/// A reserved device address range and the physical pieces mapped into it.
struct Reserved {
    size: usize,
    pieces: Vec<(u64, usize, cus::CUmemGenericAllocationHandle)>,
}

/// The CUDA implementation of [`GpuBackend`].
pub struct CudaBackend {
    ctx: cus::CUcontext,
    device: cus::CUdevice,
    name: String,
    arch: String,
    /// Multiprocessors (a persistent kernel's most blocks).
    sms: usize,
    /// Launch the kernel table's `dependent` kernels as programmatic dependents (sm_90 and up,
    /// unless `METRALE_PDL=0`): [`pdl_enabled`].
    pdl: bool,
    include: Option<String>,
    cache_dir: PathBuf,
    state: Mutex<State>,
    launches: AtomicU64,
    /// The staging buffers a load gave back, kept for the next load.
    staging: crate::gpu::staging::StagingPool,
    /// Where `new` spent its time.
    open: Mutex<OpenTimes>,
}

/// Where opening a [`CudaBackend`] spent its time, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpenTimes {
    /// Loading the driver, retaining the primary context, the device queries.
    pub driver: f64,
    /// Populating the staging memory (on a helper thread, beside `driver`).
    pub populate: f64,
    /// Waiting for that thread after the driver was ready.
    pub waited: f64,
    /// Registering the staging memory and creating its streams.
    pub register: f64,
}

// SAFETY: CUDA driver contexts, modules, functions and cuBLAS handles may be used from any
// thread once the context is current; every entry point makes it current first, and mutable
// bookkeeping is behind a Mutex.
unsafe impl Send for CudaBackend {}
// SAFETY: as above.
unsafe impl Sync for CudaBackend {}

impl Drop for CudaBackend {
    /// Release the kept staging buffers (the context itself stays retained for the process).
    fn drop(&mut self) {
        // SAFETY: the buffers loads gave back, with every copy from them synchronized.
        unsafe { self.staging.release_all(self) };
    }
}

impl CudaBackend {
    /// The process's shared backend of device `ordinal` (opened on first use): its kernels and
    /// kept staging buffers serve every later load on that device.
    pub fn shared(ordinal: usize) -> GpuResult<Arc<CudaBackend>> {
        /// The backends opened, by ordinal.
        type Opened = Mutex<Vec<(usize, Arc<CudaBackend>)>>;
        static OPENED: std::sync::OnceLock<Opened> = std::sync::OnceLock::new();
        let mut g = OPENED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, b)) = g.iter().find(|(o, _)| *o == ordinal) {
            return Ok(b.clone());
        }
        let b = Arc::new(CudaBackend::new(ordinal)?);
        g.push((ordinal, b.clone()));
        Ok(b)
    }

    /// Open device `ordinal`: load the driver, retain its primary context.
    pub fn new(ordinal: usize) -> GpuResult<Self> {
        let nodev = |e: cu::DriverError| GpuError::NoDevice(format!("{e:?}"));
        // SAFETY: only probes whether the driver library can be loaded.
        if !unsafe { cus::is_culib_present() } {
            return Err(GpuError::NoDevice(
                "libcuda could not be loaded (no NVIDIA driver)".into(),
            ));
        }
        // The staging buffers' memory is populated while the driver starts (neither waits for
        // the other); it is registered below, once the context exists.
        let t0 = std::time::Instant::now();
        let prepin = super::staging::prepin_bytes().map(|n| {
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                (super::staging::Populated::new(n), t.elapsed().as_secs_f64())
            })
        });
        cu::init().map_err(nodev)?;
        let dev = cu::device::get(ordinal as i32).map_err(nodev)?;
        // SAFETY: `dev` is a valid device handle from the driver.
        let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(nodev)?;
        // SAFETY: `ctx` was just retained.
        unsafe { cu::ctx::set_current(ctx) }.map_err(nodev)?;
        let name = cu::device::get_name(dev).map_err(nodev)?;
        // SAFETY: attribute queries on a valid device.
        let attr = |a| unsafe { cu::device::get_attribute(dev, a) }.map_err(nodev);
        use cus::CUdevice_attribute as at;
        let maj = attr(at::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let min = attr(at::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sms = attr(at::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let cache_dir = crate::gpu::kernel_cache::cache_dir(&|k| std::env::var_os(k));
        let b = CudaBackend {
            ctx,
            device: dev,
            name,
            arch: format!("sm_{maj}{min}"),
            sms: usize::try_from(sms).unwrap_or(1).max(1),
            pdl: pdl_enabled(maj, std::env::var("METRALE_PDL").ok().as_deref()),
            include: cuda_include_dir(),
            cache_dir,
            state: Mutex::new(State {
                modules: HashMap::new(),
                entries: HashMap::new(),
                functions: Vec::new(),
                index: HashMap::new(),
                compile_errors: HashMap::new(),
                cublas: None,
                streams: Vec::new(),
                events: Vec::new(),
                reserved: HashMap::new(),
                graphs: Vec::new(),
                smem_limit: HashMap::new(),
            }),
            launches: AtomicU64::new(0),
            staging: Default::default(),
            open: Mutex::new(OpenTimes::default()),
        };
        let driver = t0.elapsed().as_secs_f64();
        let joined = prepin.and_then(|h| h.join().ok());
        let waited = t0.elapsed().as_secs_f64() - driver;
        let populate = joined.as_ref().map_or(0.0, |j| j.1);
        if let Some(mem) = joined.and_then(|j| j.0) {
            // A refusal leaves the pool empty: the first load pins its own ring.
            if let Err(e) = b
                .staging
                .keep_populated(&b, mem, super::staging::PREPIN_BUFFER_BYTES)
            {
                tracing::info!("staging buffers not pinned ahead of the first load: {e}");
            }
        }
        *b.open.lock().unwrap() = OpenTimes {
            driver,
            populate,
            waited,
            register: t0.elapsed().as_secs_f64() - driver - waited,
        };
        Ok(b)
    }

    /// Where opening the backend spent its time.
    pub fn open_times(&self) -> OpenTimes {
        *self.open.lock().unwrap()
    }

    /// Pinned device memory on this device, for `cuMemCreate` and its granularity.
    fn device_prop(&self) -> cus::CUmemAllocationProp {
        // SAFETY: a plain C struct; all-zero is its documented default before the fields below.
        let mut prop: cus::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = cus::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = cus::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.device;
        prop
    }

    /// Make this device's context current on the calling thread (for calls made outside the
    /// backend, such as NCCL's).
    pub fn make_current(&self) -> GpuResult<()> {
        self.current()
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.device
    }

    fn current(&self) -> GpuResult<()> {
        // SAFETY: the context lives as long as self (primary context, retained).
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(cuerr("cuCtxSetCurrent"))
    }

    fn event(&self, e: EventId) -> GpuResult<cus::CUevent> {
        self.state
            .lock()
            .unwrap()
            .events
            .get((e as usize).wrapping_sub(1))
            .copied()
            .ok_or_else(|| GpuError::Invalid(format!("no event {e}")))
    }

    fn stream(&self, s: StreamId) -> GpuResult<cus::CUstream> {
        if s == 0 {
            return Ok(std::ptr::null_mut());
        }
        self.state
            .lock()
            .unwrap()
            .streams
            .get(s as usize - 1)
            .copied()
            .ok_or_else(|| GpuError::Invalid(format!("no stream {s}")))
    }

    fn cublas(&self) -> GpuResult<cudarc::cublas::sys::cublasHandle_t> {
        let mut st = self.state.lock().unwrap();
        if let Some(h) = st.cublas {
            return Ok(h);
        }
        // SAFETY: only probes whether libcublas can be loaded.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(GpuError::MissingKernel {
                module: "cublas".into(),
                name: "libcublas not loadable".into(),
            });
        }
        self.current()?;
        let h = cudarc::cublas::result::create_handle().map_err(cuerr("cublasCreate"))?;
        st.cublas = Some(h);
        Ok(h)
    }
}

impl CudaBackend {
    /// Raise `f`'s dynamic shared-memory limit to `smem` when it is above the 48 KiB every
    /// function gets (once per function and size).
    fn raise_smem_limit(&self, k: KernelHandle, f: cus::CUfunction, smem: u32) -> GpuResult<()> {
        const DEFAULT_LIMIT: u32 = 48 << 10;
        if smem <= DEFAULT_LIMIT {
            return Ok(());
        }
        let mut st = self.state.lock().unwrap();
        if st
            .smem_limit
            .get(&(k.0 as usize))
            .is_some_and(|&v| v >= smem)
        {
            return Ok(());
        }
        let v = i32::try_from(smem)
            .map_err(|_| GpuError::Invalid(format!("{smem} bytes of shared memory")))?;
        // SAFETY: FFI on a loaded function of the current context.
        unsafe {
            cus::cuFuncSetAttribute(
                f,
                cus::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                v,
            )
        }
        .result()
        .map_err(cuerr("cuFuncSetAttribute"))?;
        st.smem_limit.insert(k.0 as usize, smem);
        Ok(())
    }
}

impl GpuBackend for CudaBackend {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn arch(&self) -> String {
        self.arch.clone()
    }
    fn alloc(&self, bytes: u64) -> GpuResult<DevicePtr> {
        self.current()?;
        // SAFETY: plain device allocation; freed by `free`.
        let addr =
            unsafe { cu::malloc_sync(bytes.max(1) as usize) }.map_err(cuerr("cuMemAlloc"))?;
        Ok(DevicePtr { addr, bytes })
    }
    fn free(&self, p: DevicePtr) {
        if self.current().is_err() {
            return;
        }
        let reserved = self.state.lock().unwrap().reserved.remove(&p.addr);
        match reserved {
            Some(r) => {
                for (off, len, h) in r.pieces {
                    // SAFETY: each piece was mapped at `p.addr + off` by `map_range`; no copy
                    // into the range is in flight (the caller frees after synchronizing).
                    unsafe {
                        let _ = cus::cuMemUnmap(p.addr + off, len);
                        let _ = cus::cuMemRelease(h);
                    }
                }
                // SAFETY: the range came from `cuMemAddressReserve` with this size.
                let _ = unsafe { cus::cuMemAddressFree(p.addr, r.size) };
            }
            // SAFETY: `p` came from `alloc`.
            None => {
                let _ = unsafe { cu::free_sync(p.addr) };
            }
        }
    }
    fn map_granularity(&self) -> u64 {
        let prop = self.device_prop();
        let mut g = 0usize;
        // SAFETY: `prop` and `g` are valid for the call.
        let r = unsafe {
            cus::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                cus::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        };
        if r.result().is_ok() && g > 0 {
            g as u64
        } else {
            2 << 20
        }
    }
    fn reserve(&self, bytes: u64) -> GpuResult<DevicePtr> {
        self.current()?;
        let g = self.map_granularity();
        let size = (bytes.max(1).div_ceil(g) * g) as usize;
        let mut addr: cus::CUdeviceptr = 0;
        // SAFETY: reserves address space only; released in `free`.
        unsafe { cus::cuMemAddressReserve(&mut addr, size, 0, 0, 0) }
            .result()
            .map_err(cuerr("cuMemAddressReserve"))?;
        self.state.lock().unwrap().reserved.insert(
            addr,
            Reserved {
                size,
                pieces: Vec::new(),
            },
        );
        Ok(DevicePtr { addr, bytes })
    }
    fn map_range(&self, p: DevicePtr, off: u64, len: u64) -> GpuResult<()> {
        self.current()?;
        let g = self.map_granularity();
        let size = match self.state.lock().unwrap().reserved.get(&p.addr) {
            Some(r) => r.size as u64,
            None => return Ok(()), // an ordinary allocation: already backed
        };
        if !off.is_multiple_of(g) || off >= size {
            return Err(GpuError::Invalid(format!(
                "map_range: offset {off} of a {size}-byte reservation (granularity {g})"
            )));
        }
        let len = (len.div_ceil(g) * g).min(size - off) as usize;
        let prop = self.device_prop();
        let mut h: cus::CUmemGenericAllocationHandle = 0;
        // SAFETY: creates `len` bytes of device memory (a multiple of the granularity).
        unsafe { cus::cuMemCreate(&mut h, len, &prop, 0) }
            .result()
            .map_err(cuerr("cuMemCreate"))?;
        let at = p.addr + off;
        // SAFETY: `[at, at + len)` lies inside the reservation and is not mapped yet (the caller
        // maps each piece once); the handle is released in `free`.
        let mapped = unsafe { cus::cuMemMap(at, len, 0, h, 0) }.result();
        if let Err(e) = mapped {
            // SAFETY: the handle is not mapped anywhere.
            let _ = unsafe { cus::cuMemRelease(h) };
            return Err(cuerr("cuMemMap")(e));
        }
        if let Some(r) = self.state.lock().unwrap().reserved.get_mut(&p.addr) {
            r.pieces.push((off, len, h));
        }
        // SAFETY: a plain C struct; all-zero, then the fields below.
        let mut access: cus::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        access.location = prop.location;
        access.flags = cus::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        // SAFETY: the range was just mapped; one descriptor.
        unsafe { cus::cuMemSetAccess(at, len, &access, 1) }
            .result()
            .map_err(cuerr("cuMemSetAccess"))
    }
    fn upload(&self, dst: DevicePtr, src: &[u8]) -> GpuResult<()> {
        if src.len() as u64 > dst.bytes {
            return Err(GpuError::Invalid(format!(
                "upload of {} bytes into {} bytes",
                src.len(),
                dst.bytes
            )));
        }
        self.current()?;
        // SAFETY: the destination range is inside a live allocation (checked above).
        unsafe { cu::memcpy_htod_sync(dst.addr, src) }.map_err(cuerr("cuMemcpyHtoD"))
    }
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> GpuResult<()> {
        if dst.len() as u64 > src.bytes {
            return Err(GpuError::Invalid(format!(
                "download of {} bytes from {} bytes",
                dst.len(),
                src.bytes
            )));
        }
        self.current()?;
        // SAFETY: the source range is inside a live allocation (checked above).
        unsafe { cu::memcpy_dtoh_sync(dst, src.addr) }.map_err(cuerr("cuMemcpyDtoH"))
    }
    fn fill(&self, dst: DevicePtr, byte: u8) -> GpuResult<()> {
        self.current()?;
        // SAFETY: the range is a live allocation.
        unsafe { cu::memset_d8_sync(dst.addr, byte, dst.bytes as usize) }
            .map_err(cuerr("cuMemsetD8"))
    }
    fn kernel(&self, module: &str, name: &str) -> KernelHandle {
        if let Some(&h) = self
            .state
            .lock()
            .unwrap()
            .index
            .get(&(module.to_string(), name.to_string()))
        {
            return KernelHandle(h);
        }
        let first = !self.state.lock().unwrap().modules.contains_key(module);
        if let Err(e) = self.load_module(module) {
            // Said once per module: the arms that need it fall back.
            if first {
                tracing::warn!("{e}");
            }
            return KernelHandle(0);
        }
        let mut st = self.state.lock().unwrap();
        let Some(&f) = st.entries.get(module).and_then(|e| e.get(name)) else {
            return KernelHandle(0);
        };
        st.functions.push(f);
        let h = st.functions.len() as u64;
        st.index.insert((module.into(), name.into()), h);
        KernelHandle(h)
    }
    fn launch(
        &self,
        k: KernelHandle,
        cfg: LaunchCfg,
        stream: StreamId,
        args: &[KArg],
    ) -> GpuResult<()> {
        self.launch_kernel(k, cfg, stream, args)
    }
    fn gemm_bf16(&self, gm: &GemmBf16, stream: StreamId) -> GpuResult<()> {
        let GemmBf16 {
            x,
            w,
            y,
            m,
            n,
            k,
            kw,
        } = *gm;
        use cudarc::cublas::sys as cb;
        let h = self.cublas()?;
        let s = self.stream(stream)?;
        self.current()?;
        // SAFETY: FFI on the live handle; `s` is null (the legacy stream) or a stream of ours.
        unsafe { cudarc::cublas::sys::cublasSetStream_v2(h, s as _) }
            .result()
            .map_err(cuerr("cublasSetStream"))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        self.launches.fetch_add(1, Ordering::Relaxed);
        // Row-major y[m, n] = x[m, k] w[n, k]^T is column-major y^T (n x m) = w^T... i.e.
        // C(n x m) = op(A) B with A = w as a (kw x n) column-major matrix transposed, B = x as a
        // (k x m) column-major matrix.
        // SAFETY: pointers are live device allocations of the sizes the dimensions imply.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                h,
                cb::cublasOperation_t::CUBLAS_OP_T,
                cb::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                w.addr as *const c_void,
                cb::cudaDataType::CUDA_R_16BF,
                kw as i32,
                x.addr as *const c_void,
                cb::cudaDataType::CUDA_R_16BF,
                k as i32,
                &beta as *const f32 as *const c_void,
                y.addr as *mut c_void,
                cb::cudaDataType::CUDA_R_32F,
                n as i32,
                cb::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(cuerr("cublasGemmEx"))
    }
    fn synchronize(&self, s: StreamId) -> GpuResult<()> {
        self.current()?;
        if s == 0 {
            return cu::ctx::synchronize().map_err(cuerr("cuCtxSynchronize"));
        }
        let st = self.stream(s)?;
        // SAFETY: a stream created by new_stream.
        unsafe { cu::stream::synchronize(st) }.map_err(cuerr("cuStreamSynchronize"))
    }
    fn launch_count(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }
    fn multiprocessors(&self) -> Option<usize> {
        Some(self.sms)
    }
    fn new_event(&self) -> GpuResult<EventId> {
        self.current()?;
        let e = cu::event::create(cus::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(cuerr("cuEventCreate"))?;
        let mut st = self.state.lock().unwrap();
        st.events.push(e);
        Ok(st.events.len() as EventId)
    }
    fn record_event(&self, event: EventId, stream: StreamId) -> GpuResult<()> {
        let e = self.event(event)?;
        let s = self.stream(stream)?;
        self.current()?;
        // SAFETY: an event and a stream this backend created.
        unsafe { cu::event::record(e, s) }.map_err(cuerr("cuEventRecord"))
    }
    fn elapsed_ms(&self, start: EventId, end: EventId) -> GpuResult<f32> {
        let (a, b) = (self.event(start)?, self.event(end)?);
        self.current()?;
        // SAFETY: events this backend created; the end event is waited for first.
        unsafe {
            cu::event::synchronize(b).map_err(cuerr("cuEventSynchronize"))?;
            cu::event::elapsed(a, b).map_err(cuerr("cuEventElapsedTime"))
        }
    }
    fn new_stream(&self) -> GpuResult<StreamId> {
        self.current()?;
        let s = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(cuerr("cuStreamCreate"))?;
        let mut st = self.state.lock().unwrap();
        st.streams.push(s);
        Ok(st.streams.len() as StreamId)
    }
    unsafe fn register_host(&self, ptr: *const u8, len: usize, read_only: bool) -> GpuResult<()> {
        self.current()?;
        let mut flags = 0u32;
        if read_only {
            let mut dev = 0;
            // SAFETY: querying the current context's device.
            let supported = unsafe {
                cus::cuCtxGetDevice(&mut dev)
                    .result()
                    .map_err(cuerr("cuCtxGetDevice"))?;
                cu::device::get_attribute(
                    dev,
                    cus::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
                )
                .map_err(cuerr("cuDeviceGetAttribute"))?
            };
            if supported == 0 {
                return Err(GpuError::Cuda {
                    call: "cuMemHostRegister".into(),
                    msg: "read-only host registration is not supported by this device".into(),
                });
            }
            flags |= cus::CU_MEMHOSTREGISTER_READ_ONLY;
        }
        // SAFETY: the caller keeps the range mapped until unregister_host.
        unsafe { cus::cuMemHostRegister_v2(ptr as *mut c_void, len, flags) }
            .result()
            .map_err(cuerr("cuMemHostRegister"))
    }
    unsafe fn unregister_host(&self, ptr: *const u8) {
        if self.current().is_ok() {
            // SAFETY: the caller registered `ptr` and has synchronized its copies.
            let _ = unsafe { cus::cuMemHostUnregister(ptr as *mut c_void) };
        }
    }
    fn alloc_pinned(&self, bytes: usize) -> GpuResult<*mut u8> {
        self.current()?;
        // SAFETY: plain pinned allocation, freed by free_pinned.
        unsafe { cu::malloc_host(bytes, 0) }
            .map(|p| p as *mut u8)
            .map_err(cuerr("cuMemHostAlloc"))
    }
    unsafe fn free_pinned(&self, p: *mut u8) {
        if self.current().is_ok() {
            // SAFETY: the caller passes memory from alloc_pinned with no copy in flight.
            let _ = unsafe { cu::free_host(p as *mut c_void) };
        }
    }
    fn staging_pool(&self) -> Option<&crate::gpu::staging::StagingPool> {
        Some(&self.staging)
    }
    fn capture(
        &self,
        stream: StreamId,
        f: &mut dyn FnMut() -> GpuResult<()>,
    ) -> GpuResult<GraphId> {
        if stream == 0 {
            return Err(GpuError::Invalid(
                "capture: the legacy default stream cannot be captured; pass a new_stream".into(),
            ));
        }
        let s = self.stream(stream)?;
        self.current()?;
        // SAFETY: FFI on a stream this backend created; thread-local mode refuses only this
        // thread's unsafe calls while capturing.
        unsafe {
            cus::cuStreamBeginCapture_v2(
                s,
                cus::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .result()
        .map_err(cuerr("cuStreamBeginCapture"))?;
        let ran = f();
        let mut graph: cus::CUgraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above (also when `f` failed), writing the graph handle.
        let ended = unsafe { cus::cuStreamEndCapture(s, &mut graph) }.result();
        let mut exec: cus::CUgraphExec = std::ptr::null_mut();
        let inst = match (ran, ended) {
            (Err(e), _) => Err(e),
            (Ok(()), Err(e)) => Err(cuerr("cuStreamEndCapture")(e)),
            // SAFETY: `graph` is the graph the capture produced.
            (Ok(()), Ok(())) => unsafe { cus::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }
                .result()
                .map_err(cuerr("cuGraphInstantiate")),
        };
        if !graph.is_null() {
            // SAFETY: the captured graph, no longer needed: the executable copy (if any)
            // outlives it, and a failed capture's graph is dropped here.
            let _ = unsafe { cus::cuGraphDestroy(graph) };
        }
        inst?;
        let mut st = self.state.lock().unwrap();
        st.graphs.push(exec);
        Ok(st.graphs.len() as GraphId)
    }
    fn replay(&self, g: GraphId, stream: StreamId) -> GpuResult<()> {
        let exec = self
            .state
            .lock()
            .unwrap()
            .graphs
            .get((g as usize).wrapping_sub(1))
            .copied()
            .ok_or_else(|| GpuError::Invalid(format!("no graph {g}")))?;
        let s = self.stream(stream)?;
        self.current()?;
        // SAFETY: an instantiated graph of this backend's context on one of its streams.
        unsafe { cus::cuGraphLaunch(exec, s) }
            .result()
            .map_err(cuerr("cuGraphLaunch"))
    }
    fn adopt_stream(&self, raw: u64) -> GpuResult<StreamId> {
        if raw == 0 {
            return Ok(0);
        }
        let h = raw as usize as cus::CUstream;
        let mut st = self.state.lock().unwrap();
        if let Some(i) = st.streams.iter().position(|&s| s == h) {
            return Ok(i as StreamId + 1);
        }
        st.streams.push(h);
        Ok(st.streams.len() as StreamId)
    }
    unsafe fn copy_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        stream: StreamId,
    ) -> GpuResult<()> {
        if src.bytes > dst.bytes {
            return Err(GpuError::Invalid(format!(
                "device copy of {} bytes into {} bytes",
                src.bytes, dst.bytes
            )));
        }
        let s = self.stream(stream)?;
        self.current()?;
        // SAFETY: the caller passes device memory valid until the stream is synchronized.
        unsafe { cus::cuMemcpyDtoDAsync_v2(dst.addr, src.addr, src.bytes as usize, s) }
            .result()
            .map_err(cuerr("cuMemcpyDtoDAsync"))
    }
    unsafe fn upload_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: StreamId,
    ) -> GpuResult<()> {
        if len as u64 > dst.bytes {
            return Err(GpuError::Invalid(format!(
                "upload of {len} bytes into {} bytes",
                dst.bytes
            )));
        }
        let s = self.stream(stream)?;
        self.current()?;
        // SAFETY: the caller keeps `src..src+len` valid until the stream is synchronized.
        unsafe { cus::cuMemcpyHtoDAsync_v2(dst.addr, src as *const c_void, len, s) }
            .result()
            .map_err(cuerr("cuMemcpyHtoDAsync"))
    }
}
