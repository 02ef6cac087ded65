//! Kernel launches: the arguments as the driver takes them, and programmatic dependent launches
//! (sm_90), by which the kernel table's `dependent` kernels start while the stream's previous
//! kernel ends (kernels/common.cuh, `pdl_wait`).

use super::{CudaBackend, cu, cuerr, cus, tmap};
use crate::gpu::{GpuError, GpuResult, KArg, KernelHandle, LaunchCfg, StreamId};
use std::ffi::c_void;
use std::sync::atomic::Ordering;

/// Whether a device of compute capability `major` launches the kernel table's `dependent`
/// kernels as programmatic dependents (PTX `griddepcontrol` needs sm_90): yes from 9 on, unless
/// `env` (`METRALE_PDL`) is `0` (the in-order launches, for comparison).
pub fn pdl_enabled(major: i32, env: Option<&str>) -> bool {
    major >= 9 && env.map(str::trim) != Some("0")
}

impl CudaBackend {
    /// [`GpuBackend::launch`]: the kernel's arguments as the driver takes them, then
    /// `cuLaunchKernel`, or [`Self::launch_dependent`] for a `dependent` launch.
    pub(super) fn launch_kernel(
        &self,
        k: KernelHandle,
        cfg: LaunchCfg,
        stream: StreamId,
        args: &[KArg],
    ) -> GpuResult<()> {
        let f = {
            let st = self.state.lock().unwrap();
            *st.functions
                .get((k.0 as usize).wrapping_sub(1))
                .ok_or_else(|| GpuError::Invalid(format!("bad kernel handle {}", k.0)))?
        };
        let s = self.stream(stream)?;
        self.current()?;
        self.raise_smem_limit(k, f, cfg.smem)?;
        // Scalars and pointers as u64 slots; tensor maps encoded into their own 64-byte aligned
        // slots (a kernel takes them by value).
        let mut vals: Vec<u64> = Vec::with_capacity(args.len());
        let mut maps: Vec<cus::CUtensorMap> = Vec::new();
        for a in args {
            vals.push(match *a {
                KArg::Ptr(p) => p.addr,
                KArg::I32(v) => v as u32 as u64,
                KArg::F32(v) => v.to_bits() as u64,
                KArg::Dim(v) => i32::try_from(v).map_err(|_| {
                    GpuError::Invalid(format!("kernel argument {v} does not fit an int"))
                })? as u32 as u64,
                KArg::Tmap(t) => {
                    maps.push(tmap::encode_tmap(&t)?);
                    0
                }
            });
        }
        let mut next_map = maps.iter_mut();
        let mut params: Vec<*mut c_void> = args
            .iter()
            .zip(vals.iter_mut())
            .map(|(a, v)| match a {
                KArg::Tmap(_) => next_map.next().map_or(std::ptr::null_mut(), |m| {
                    m as *mut cus::CUtensorMap as *mut c_void
                }),
                _ => v as *mut u64 as *mut c_void,
            })
            .collect();
        self.launches.fetch_add(1, Ordering::Relaxed);
        if cfg.dependent && self.pdl {
            return self.launch_dependent(f, cfg, s, &mut params);
        }
        // SAFETY: `f` is a loaded function; each parameter points at a u64 whose low bytes hold
        // the little-endian i32/f32/pointer the kernel signature expects (x86-64 and CUDA are both
        // little-endian), or at an encoded tensor map, alive until the launch call returns (the
        // driver copies them).
        unsafe { cu::launch_kernel(f, cfg.grid, cfg.block, cfg.smem, s, &mut params) }
            .map_err(cuerr("cuLaunchKernel"))?;
        Ok(())
    }

    /// Launch `f` as a programmatic dependent of the previous kernel on stream `s`
    /// (`cuLaunchKernelEx` with programmatic stream serialization: it may start once every block
    /// of that kernel has called `griddepcontrol.launch_dependents` or ended; its own
    /// `griddepcontrol.wait` orders it after that kernel's writes).
    fn launch_dependent(
        &self,
        f: cus::CUfunction,
        cfg: LaunchCfg,
        s: cus::CUstream,
        params: &mut [*mut c_void],
    ) -> GpuResult<()> {
        let mut attr = cus::CUlaunchAttribute {
            id: cus::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: Default::default(),
            value: cus::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let lc = cus::CUlaunchConfig {
            gridDimX: cfg.grid.0,
            gridDimY: cfg.grid.1,
            gridDimZ: cfg.grid.2,
            blockDimX: cfg.block.0,
            blockDimY: cfg.block.1,
            blockDimZ: cfg.block.2,
            sharedMemBytes: cfg.smem,
            hStream: s,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `f` is a loaded function, `lc` and its one attribute live across the call, and
        // `params` holds one pointer per kernel parameter, as for `cuLaunchKernel` (the driver
        // copies them before it returns).
        unsafe { cus::cuLaunchKernelEx(&lc, f, params.as_mut_ptr(), std::ptr::null_mut()).result() }
            .map_err(cuerr("cuLaunchKernelEx"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn programmatic_launches_from_sm_90_unless_switched_off() {
        assert!(super::pdl_enabled(9, None));
        assert!(super::pdl_enabled(10, Some("1")));
        assert!(!super::pdl_enabled(9, Some("0")));
        assert!(!super::pdl_enabled(9, Some(" 0 ")));
        assert!(!super::pdl_enabled(8, None));
    }
}
