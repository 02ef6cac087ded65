//! Loading the kernel modules: the prebuilt cubin for this target when its source is the one it
//! was built from, else NVRTC (cached on disk, keyed by source, options, arch and NVRTC
//! version); every entry point indexed by name.

use super::{CudaBackend, State, compile_cubin, compile_options, cuerr, nvrtc_version};
use crate::gpu::{GpuError, GpuResult, kernels};
use cudarc::driver::{result as cu, sys as cus};
use std::collections::HashMap;
use std::ffi::c_void;

/// Every kernel of a loaded module, by name (driver 12.4+: `cuModuleEnumerateFunctions`).
fn module_entries(m: cus::CUmodule) -> GpuResult<HashMap<String, cus::CUfunction>> {
    let mut n: std::ffi::c_uint = 0;
    // SAFETY: FFI; `m` is a loaded module and `n` a live local the call writes.
    unsafe { cus::cuModuleGetFunctionCount(&mut n, m) }
        .result()
        .map_err(cuerr("cuModuleGetFunctionCount"))?;
    let mut fs: Vec<cus::CUfunction> = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: FFI; `fs` has room for the `n` handles the call writes.
    unsafe { cus::cuModuleEnumerateFunctions(fs.as_mut_ptr(), n, m) }
        .result()
        .map_err(cuerr("cuModuleEnumerateFunctions"))?;
    let mut out = HashMap::new();
    for f in fs {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: FFI; `f` is a function of the loaded module; the driver owns the returned
        // NUL-terminated name for the module's lifetime, and it is copied at once.
        unsafe { cus::cuFuncGetName(&mut name, f) }
            .result()
            .map_err(cuerr("cuFuncGetName"))?;
        // SAFETY: as above: a valid NUL-terminated string from the driver.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        out.insert(name, f);
    }
    Ok(out)
}

impl CudaBackend {
    /// Compile (or load from the disk cache) and load a module.
    pub fn load_module(&self, module: &str) -> GpuResult<()> {
        let mut st = self.state.lock().unwrap();
        if st.modules.contains_key(module) {
            return match st.compile_errors.get(module) {
                Some(e) => Err(GpuError::Compile {
                    module: module.into(),
                    arch: self.arch.clone(),
                    log: e.clone(),
                }),
                None => Ok(()),
            };
        }
        let src = kernels::source(module)
            .ok_or_else(|| GpuError::Invalid(format!("no kernel module {module}")))?;
        let Some(arch) = kernels::module_arch(module, &self.arch) else {
            let e = GpuError::Compile {
                module: module.into(),
                arch: self.arch.clone(),
                log: "written for another architecture's instructions; its arms use the \
                      portable kernels"
                    .into(),
            };
            st.modules.insert(module.into(), None);
            st.compile_errors.insert(module.into(), e.to_string());
            return Err(e);
        };
        // Built ahead of time for this target from this source: no NVRTC at all.
        let why = match crate::gpu::prebuilt::cubin(module, &arch) {
            Ok(_) if std::env::var_os("METRALE_NO_PREBUILT").is_some() => {
                "METRALE_NO_PREBUILT is set".to_string()
            }
            Ok(cubin) => match self.load_image(&mut st, module, cubin) {
                Ok(()) => return Ok(()),
                Err(e) => format!("its prebuilt {arch} cubin did not load ({e})"),
            },
            Err(crate::gpu::prebuilt::Missing::Target) => format!("no prebuilt cubin for {arch}"),
            Err(crate::gpu::prebuilt::Missing::Stale) => {
                "its source changed since the prebuilt cubin was built".to_string()
            }
        };
        tracing::warn!("kernel module {module}: {why}; compiling it with NVRTC");
        let ver = nvrtc_version()?;
        let opts = compile_options(&arch, self.include.as_deref());
        let key =
            xxhash_rust::xxh3::xxh3_64(format!("{src}\0{opts:?}\0{arch}\0{ver:?}").as_bytes());
        let path = self
            .cache_dir
            .join(format!("{module}-{arch}-{key:016x}.cubin"));
        // A private folder and a sealed file only (gpu/kernel_cache.rs): a cubin another user
        // could plant is never loaded.
        let cache = crate::gpu::kernel_cache::read(&self.cache_dir, &path, key);
        let cubin = match cache {
            Some(b) => b,
            None => match compile_cubin(module, &arch, self.include.as_deref()) {
                Ok(b) => {
                    if let Err(why) =
                        crate::gpu::kernel_cache::write(&self.cache_dir, &path, key, &b)
                    {
                        tracing::warn!("kernel cache: not cached ({why})");
                    }
                    b
                }
                Err(e) => {
                    st.modules.insert(module.into(), None);
                    st.compile_errors.insert(module.into(), e.to_string());
                    return Err(e);
                }
            },
        };
        self.load_image(&mut st, module, &cubin)
    }

    /// Load a CUBIN image as `module` and index its entry points.
    fn load_image(&self, st: &mut State, module: &str, cubin: &[u8]) -> GpuResult<()> {
        self.current()?;
        // SAFETY: `cubin` is a complete CUBIN image (NVRTC's output, compiled now or ahead of
        // time for this device's arch); the driver copies it and validates it.
        let m = unsafe { cu::module::load_data(cubin.as_ptr() as *const c_void) }
            .map_err(cuerr("cuModuleLoadData"))?;
        let entries = module_entries(m)?;
        st.entries.insert(module.into(), entries);
        st.modules.insert(module.into(), Some(m));
        Ok(())
    }
}
