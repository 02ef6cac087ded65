//! The host reference backend: "device" memory in host vectors and every kernel name of
//! `kernels/*.cu` implemented with the [`reference`](mod@super::reference) numerics, so routing and
//! layer logic run in CI without a GPU. Kernels can be hidden to exercise fall-through paths.

use super::reference::{self, ActRound};
use super::{
    DevicePtr, EventId, GemmBf16, GpuBackend, GpuError, GpuResult, KArg, KernelHandle, LaunchCfg,
    StreamId, kernels, table,
};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashSet};
// Every lock recovers from poisoning: a panic on one thread (a caller's bug) must not make
// every later load or forward of the process's shared backend fail.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

pub(crate) mod impls;

/// The CPU implementation of the runtime.
pub struct HostBackend {
    mem: Mutex<BTreeMap<u64, Vec<u8>>>,
    next: AtomicU64,
    /// `(module, entry point)` by handle - 1: every entry point parsed from the sources.
    names: &'static [(String, String)],
    hidden: HashSet<String>,
    no_blas: bool,
    launches: AtomicU64,
    events: Mutex<Vec<Option<std::time::Instant>>>,
    pinned: Mutex<std::collections::HashMap<usize, usize>>,
    /// Reserved allocations by base address: which [`HOST_MAP_GRANULE`]s are mapped. Reading
    /// or writing an unmapped granule is an error, so tests catch a copy issued before its
    /// range was mapped.
    reserved: Mutex<std::collections::HashMap<u64, Vec<bool>>>,
    /// The staging buffers a load gave back, as the CUDA backend keeps them.
    staging: crate::gpu::staging::StagingPool,
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        // SAFETY: the buffers loads gave back, host copies are synchronous.
        unsafe { self.staging.release_all(self) };
    }
}

/// The host backend's `map_range` granularity.
pub const HOST_MAP_GRANULE: u64 = 64 << 10;

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// (module, kernel) of every entry point of every module, parsed from the sources once per
/// process: parsing them for each backend took a third of the `loader` fuzz target's time.
fn all_kernels() -> &'static [(String, String)] {
    static NAMES: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names = Vec::new();
        for (m, _) in kernels::MODULES.iter() {
            for n in kernels::entry_points(m) {
                names.push((m.to_string(), n));
            }
        }
        names
    })
}

impl HostBackend {
    /// Every kernel of every module available, and BLAS.
    pub fn new() -> Self {
        HostBackend {
            mem: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0x1000_0000),
            names: all_kernels(),
            hidden: HashSet::new(),
            no_blas: false,
            launches: AtomicU64::new(0),
            events: Mutex::new(Vec::new()),
            pinned: Mutex::new(std::collections::HashMap::new()),
            reserved: Mutex::new(std::collections::HashMap::new()),
            staging: Default::default(),
        }
    }

    /// The process's shared host backend (what a loader's `"cpu"` device names: the Python
    /// package and the C ABI load onto it, so its live allocations count all their packs).
    pub fn shared() -> &'static std::sync::Arc<HostBackend> {
        static HOST: std::sync::OnceLock<std::sync::Arc<HostBackend>> = std::sync::OnceLock::new();
        HOST.get_or_init(|| std::sync::Arc::new(HostBackend::new()))
    }

    /// How many device allocations are live (allocated and not yet freed): what a test of
    /// `Drop` counts.
    pub fn live_allocations(&self) -> usize {
        self.mem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Where the bytes of `p` lie in this process's memory: what a zero-copy view of a host
    /// "device" buffer (a DLPack export) points at. Valid until the allocation is freed.
    pub fn host_address(&self, p: DevicePtr) -> GpuResult<*mut u8> {
        let (base, off) = self.locate(p)?;
        let mut mem = self.mem.lock().unwrap_or_else(PoisonError::into_inner);
        let v = mem.get_mut(&base).expect("located above");
        // SAFETY: `off + p.bytes` lies inside the allocation (checked by `locate`).
        Ok(unsafe { v.as_mut_ptr().add(off) })
    }

    /// The same, with the named kernels missing (`"gemm_bf16"` hides BLAS).
    pub fn without(names: &[&str]) -> Self {
        let mut b = Self::new();
        b.hidden = names.iter().map(|s| s.to_string()).collect();
        b.no_blas = b.hidden.contains("gemm_bf16");
        b
    }

    fn locate(&self, p: DevicePtr) -> GpuResult<(u64, usize)> {
        let mem = self.mem.lock().unwrap_or_else(PoisonError::into_inner);
        let (&base, v) = mem
            .range(..=p.addr)
            .next_back()
            .ok_or_else(|| GpuError::Invalid(format!("host backend: {p:?} is not allocated")))?;
        let off = (p.addr - base) as usize;
        if usize::try_from(p.bytes)
            .ok()
            .and_then(|b| off.checked_add(b))
            .is_none_or(|end| end > v.len())
        {
            return Err(GpuError::Invalid(format!(
                "host backend: {p:?} overruns its allocation of {} bytes",
                v.len()
            )));
        }
        Ok((base, off))
    }

    /// Every granule of `[off, off + len)` of allocation `base` mapped, if it is a reservation.
    fn check_mapped(&self, base: u64, off: usize, len: usize) -> GpuResult<()> {
        if let Some(g) = self
            .reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&base)
        {
            let (a, b) = (off as u64 / HOST_MAP_GRANULE, (off + len) as u64);
            let b = b.div_ceil(HOST_MAP_GRANULE);
            if (a..b).any(|i| !g.get(i as usize).copied().unwrap_or(false)) {
                return Err(GpuError::Invalid(format!(
                    "host backend: access to [{off}, {}) of a reservation before it was mapped",
                    off + len
                )));
            }
        }
        Ok(())
    }

    pub(crate) fn read(&self, p: DevicePtr) -> GpuResult<Vec<u8>> {
        let (base, off) = self.locate(p)?;
        self.check_mapped(base, off, p.bytes as usize)?;
        Ok(
            self.mem.lock().unwrap_or_else(PoisonError::into_inner)[&base]
                [off..off + p.bytes as usize]
                .to_vec(),
        )
    }

    /// A bf16 buffer in the il8 order (a whole number of 8-groups) as f32 in column order
    /// (exact).
    pub(crate) fn read_bf16_il8(&self, p: DevicePtr) -> GpuResult<Vec<f32>> {
        let v: Vec<f32> = self
            .read(p)?
            .chunks_exact(2)
            .map(|c| crate::converters::bf16::to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        Ok((0..v.len() / 8 * 8)
            .map(|c| v[super::reference::il8_pos(c)])
            .collect())
    }

    pub(crate) fn read_f32(&self, p: DevicePtr) -> GpuResult<Vec<f32>> {
        Ok(self
            .read(p)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    pub(crate) fn write(&self, p: DevicePtr, off_bytes: usize, data: &[u8]) -> GpuResult<()> {
        let (base, off) = self.locate(p)?;
        self.check_mapped(base, off + off_bytes, data.len())?;
        if off_bytes + data.len() > p.bytes as usize {
            return Err(GpuError::Invalid(format!(
                "host backend: write of {} bytes at +{off_bytes} overruns {p:?}",
                data.len()
            )));
        }
        self.mem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&base)
            .unwrap()[off + off_bytes..off + off_bytes + data.len()]
            .copy_from_slice(data);
        Ok(())
    }

    pub(crate) fn write_f32(&self, p: DevicePtr, off_elems: usize, v: &[f32]) -> GpuResult<()> {
        self.write(
            p,
            off_elems * 4,
            &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
        )
    }

    /// Compute `m` output rows of `n` values (row `r` by `f(r, row)`, rows in parallel) and
    /// write them into `y` at row stride `ldy`.
    pub(crate) fn write_rows(
        &self,
        y: DevicePtr,
        ldy: usize,
        m: usize,
        n: usize,
        f: impl Fn(usize, &mut [f32]) + Sync,
    ) -> GpuResult<()> {
        let rows: Vec<Vec<f32>> = (0..m)
            .into_par_iter()
            .map(|r| {
                let mut row = vec![0f32; n];
                f(r, &mut row);
                row
            })
            .collect();
        for (r, row) in rows.iter().enumerate() {
            self.write_f32(y, r * ldy, row)?;
        }
        Ok(())
    }

    /// The kernel table's description of handle `k`.
    fn spec_of(&self, k: KernelHandle) -> GpuResult<&'static table::KernelSpec> {
        let (m, n) = self
            .names
            .get((k.0 as usize).wrapping_sub(1))
            .ok_or_else(|| GpuError::Invalid(format!("host backend: bad kernel handle {}", k.0)))?;
        table::spec(m, n)
            .ok_or_else(|| GpuError::Invalid(format!("{m}::{n} is not in the kernel table")))
    }
}

impl GpuBackend for HostBackend {
    fn name(&self) -> String {
        "host reference".into()
    }
    fn arch(&self) -> String {
        "host".into()
    }
    fn alloc(&self, bytes: u64) -> GpuResult<DevicePtr> {
        // Reserved fallibly and filled before the lock is taken: a size the process cannot
        // hold is an error, never an abort (or a panic holding the lock).
        let len = usize::try_from(bytes)
            .ok()
            .filter(|&n| n <= isize::MAX as usize - 512)
            .ok_or_else(|| GpuError::Invalid(format!("host backend: alloc of {bytes} bytes")))?;
        let mut v = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|e| GpuError::Invalid(format!("host backend: alloc of {bytes} bytes: {e}")))?;
        v.resize(len, 0xA5u8);
        let addr = self
            .next
            .fetch_add(bytes.div_ceil(256) * 256 + 256, Ordering::Relaxed);
        self.mem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(addr, v);
        Ok(DevicePtr { addr, bytes })
    }
    fn free(&self, p: DevicePtr) {
        self.mem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&p.addr);
        self.reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&p.addr);
    }
    fn reserve(&self, bytes: u64) -> GpuResult<DevicePtr> {
        let p = self.alloc(bytes)?;
        let granules = bytes.div_ceil(HOST_MAP_GRANULE) as usize;
        self.reserved
            .lock()
            .unwrap()
            .insert(p.addr, vec![false; granules]);
        Ok(p)
    }
    fn map_range(&self, p: DevicePtr, off: u64, len: u64) -> GpuResult<()> {
        let mut r = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(g) = r.get_mut(&p.addr) else {
            return Ok(());
        };
        if !off.is_multiple_of(HOST_MAP_GRANULE) {
            return Err(GpuError::Invalid(format!(
                "map_range: offset {off} is not a multiple of {HOST_MAP_GRANULE}"
            )));
        }
        let (a, b) = (
            off / HOST_MAP_GRANULE,
            (off + len).div_ceil(HOST_MAP_GRANULE),
        );
        for i in a..b.min(g.len() as u64) {
            g[i as usize] = true;
        }
        Ok(())
    }
    fn map_granularity(&self) -> u64 {
        HOST_MAP_GRANULE
    }
    fn upload(&self, dst: DevicePtr, src: &[u8]) -> GpuResult<()> {
        self.write(
            DevicePtr {
                addr: dst.addr,
                bytes: src.len() as u64,
            },
            0,
            src,
        )
    }
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> GpuResult<()> {
        dst.copy_from_slice(&self.read(DevicePtr {
            addr: src.addr,
            bytes: dst.len() as u64,
        })?);
        Ok(())
    }
    fn fill(&self, dst: DevicePtr, byte: u8) -> GpuResult<()> {
        self.write(dst, 0, &vec![byte; dst.bytes as usize])
    }
    fn kernel(&self, module: &str, name: &str) -> KernelHandle {
        if self.hidden.contains(name) {
            return KernelHandle(0);
        }
        match self
            .names
            .iter()
            .position(|(m, n)| m == module && n == name)
        {
            Some(i) => KernelHandle(i as u64 + 1),
            None => KernelHandle(0),
        }
    }
    fn launch(
        &self,
        k: KernelHandle,
        _cfg: LaunchCfg,
        _stream: StreamId,
        a: &[KArg],
    ) -> GpuResult<()> {
        self.launches.fetch_add(1, Ordering::Relaxed);
        let spec = self.spec_of(k)?;
        let args = table::Args::new(spec, a)?;
        args.check_rows()?;
        self.run_kernel(spec, &args)
    }
    fn gemm_bf16(&self, gm: &GemmBf16, _s: StreamId) -> GpuResult<()> {
        let GemmBf16 {
            x,
            w,
            y,
            m,
            n,
            k,
            kw,
        } = *gm;
        if self.no_blas {
            return Err(GpuError::MissingKernel {
                module: "cublas".into(),
                name: "gemm_bf16".into(),
            });
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        let xb = self.read(x)?;
        let xf: Vec<f32> = xb
            .chunks_exact(2)
            .map(|c| crate::converters::bf16::to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        let wb = self.read(w)?;
        let rows: Vec<Vec<f32>> = (0..m)
            .into_par_iter()
            .map(|r| {
                let mut row = vec![0f32; n];
                reference::bf16_row(
                    &xf[r * k..(r + 1) * k],
                    &wb,
                    n,
                    k,
                    kw,
                    ActRound::None,
                    &mut row,
                );
                row
            })
            .collect();
        for (r, row) in rows.iter().enumerate() {
            self.write_f32(y, r * n, row)?;
        }
        Ok(())
    }
    fn synchronize(&self, _s: StreamId) -> GpuResult<()> {
        Ok(())
    }
    fn launch_count(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }
    fn new_stream(&self) -> GpuResult<StreamId> {
        Ok(1)
    }
    fn new_event(&self) -> GpuResult<EventId> {
        let mut ev = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        ev.push(None);
        Ok(ev.len() as EventId)
    }
    fn record_event(&self, event: EventId, _stream: StreamId) -> GpuResult<()> {
        // Host work is synchronous: the event completes when it is recorded.
        let mut ev = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = ev
            .get_mut((event as usize).wrapping_sub(1))
            .ok_or_else(|| GpuError::Invalid(format!("no event {event}")))?;
        *slot = Some(std::time::Instant::now());
        Ok(())
    }
    fn elapsed_ms(&self, start: EventId, end: EventId) -> GpuResult<f32> {
        let ev = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let get = |e: EventId| {
            ev.get((e as usize).wrapping_sub(1))
                .copied()
                .flatten()
                .ok_or_else(|| GpuError::Invalid(format!("event {e} not recorded")))
        };
        Ok(get(end)?
            .saturating_duration_since(get(start)?)
            .as_secs_f32()
            * 1e3)
    }
    unsafe fn register_host(
        &self,
        _ptr: *const u8,
        _len: usize,
        _read_only: bool,
    ) -> GpuResult<()> {
        if self.hidden.contains("register_host") {
            return Err(GpuError::Cuda {
                call: "cuMemHostRegister".into(),
                msg: "refused (hidden on the host backend)".into(),
            });
        }
        Ok(())
    }
    unsafe fn unregister_host(&self, _ptr: *const u8) {}
    fn staging_pool(&self) -> Option<&crate::gpu::staging::StagingPool> {
        Some(&self.staging)
    }
    fn alloc_pinned(&self, bytes: usize) -> GpuResult<*mut u8> {
        // Page-aligned like cuMemHostAlloc's memory (O_DIRECT reads into it need that).
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 4096)
            .map_err(|e| GpuError::Invalid(format!("alloc_pinned({bytes}): {e}")))?;
        // SAFETY: a non-zero-sized layout; the pointer is checked for null below.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(GpuError::Invalid(format!(
                "alloc_pinned({bytes}): out of memory"
            )));
        }
        self.pinned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(p as usize, bytes.max(1));
        Ok(p)
    }
    unsafe fn free_pinned(&self, p: *mut u8) {
        if let Some(len) = self
            .pinned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(p as usize))
        {
            // SAFETY: `p` was allocated by alloc_pinned with this size and alignment, and is
            // freed once (removed from the table above).
            unsafe {
                std::alloc::dealloc(p, std::alloc::Layout::from_size_align_unchecked(len, 4096))
            };
        }
    }
    unsafe fn upload_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        _stream: StreamId,
    ) -> GpuResult<()> {
        // SAFETY: the caller guarantees `src..src+len` is valid.
        let s = unsafe { std::slice::from_raw_parts(src, len) };
        self.upload(dst, s)
    }
}
