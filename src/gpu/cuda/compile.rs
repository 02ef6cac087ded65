//! NVRTC for the CUDA backend: where the CUDA headers are, NVRTC's version, the options every
//! module is compiled with, and the compile itself (a CUBIN, and NVRTC's log on request). Needs
//! only libnvrtc and the headers, no GPU.

use super::super::{GpuError, GpuResult, kernels};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use std::ffi::CString;

/// Where NVRTC finds `cuda_bf16.h` / `cuda_fp8.h`: `$METRALE_CUDA_INCLUDE`, else
/// `$CUDA_PATH/include`, else `/usr/local/cuda/include` when it exists.
pub fn cuda_include_dir() -> Option<String> {
    if let Ok(d) = std::env::var("METRALE_CUDA_INCLUDE") {
        return Some(d);
    }
    if let Ok(p) = std::env::var("CUDA_PATH") {
        return Some(format!("{p}/include"));
    }
    let d = "/usr/local/cuda/include";
    std::path::Path::new(d)
        .join("cuda_fp8.h")
        .exists()
        .then(|| d.to_string())
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> GpuResult<(i32, i32)> {
    // SAFETY: only probes whether libnvrtc can be loaded (loading it lazily would panic).
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(GpuError::NoDevice(
            "libnvrtc could not be loaded (set LD_LIBRARY_PATH)".into(),
        ));
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: FFI call writing two ints we own; the library is loaded on first use.
    let r = unsafe { nvrtc_sys::nvrtcVersion(&mut a, &mut b) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(GpuError::NoDevice(format!("NVRTC unavailable: {r:?}")));
    }
    Ok((a, b))
}

/// The NVRTC options used for every module.
pub fn compile_options(arch: &str, include: Option<&str>) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
    ];
    if let Some(i) = include {
        o.push(format!("-I{i}"));
    }
    o
}

/// Compile a kernel module to a CUBIN for `arch` (e.g. `sm_90`). Needs only libnvrtc and the
/// CUDA headers, no GPU: CI runs this for every module.
pub fn compile_cubin(module: &str, arch: &str, include: Option<&str>) -> GpuResult<Vec<u8>> {
    compile_with_log(module, arch, include, &[]).map(|(cubin, _)| cubin)
}

/// [`compile_cubin`] with `extra` NVRTC options, returning NVRTC's log too (with
/// `-Xptxas=-v`, ptxas's register counts and performance notes such as a serialized `wgmma`).
pub fn compile_with_log(
    module: &str,
    arch: &str,
    include: Option<&str>,
    extra: &[&str],
) -> GpuResult<(Vec<u8>, String)> {
    let src = kernels::source(module)
        .ok_or_else(|| GpuError::Invalid(format!("no kernel module {module}")))?;
    let csrc = CString::new(src).unwrap();
    let name = CString::new(format!("{module}.cu")).unwrap();
    let fail = |log: String| GpuError::Compile {
        module: module.into(),
        arch: arch.into(),
        log,
    };
    let prog = nvrtc::create_program(&csrc, Some(&name)).map_err(|e| fail(format!("{e:?}")))?;
    let mut opts = compile_options(arch, include);
    opts.extend(extra.iter().map(|o| o.to_string()));
    // SAFETY: `prog` is a live program; options are owned strings.
    let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
    // SAFETY: reading the log of a live program.
    let log = unsafe { nvrtc::get_program_log(prog) }.ok().map(|l| {
        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
        String::from_utf8_lossy(&bytes).to_string()
    });
    if compiled.is_err() {
        // SAFETY: destroying the program we created.
        let _ = unsafe { nvrtc::destroy_program(prog) };
        return Err(fail(log.unwrap_or_else(|| format!("{compiled:?}"))));
    }
    let mut size = 0usize;
    // SAFETY: size query then a copy into a buffer of that size, on a compiled program.
    let cubin = unsafe {
        let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
        if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
            let _ = nvrtc::destroy_program(prog);
            return Err(fail(format!("nvrtcGetCUBINSize: {r:?}")));
        }
        let mut buf = vec![0u8; size];
        let r = nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char);
        let _ = nvrtc::destroy_program(prog);
        if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail(format!("nvrtcGetCUBIN: {r:?}")));
        }
        buf
    };
    Ok((cubin, log.unwrap_or_default()))
}
