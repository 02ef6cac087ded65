//! The CUDA kernel sources, compiled into the binary so a deployed engine needs no source tree.
//! Each module is one file in `kernels/`; the host backend implements the same names.

/// (module, source) of every kernel file.
pub const MODULES: &[(&str, &str)] = &[
    ("ffn_act", include_str!("../../kernels/ffn_act.cu")),
    ("ffn_fp8", include_str!("../../kernels/ffn_fp8.cu")),
    ("ffn_w8a8", include_str!("../../kernels/ffn_w8a8.cu")),
    ("ffn_bf16", include_str!("../../kernels/ffn_bf16.cu")),
    ("ffn_nvfp4", include_str!("../../kernels/ffn_nvfp4.cu")),
    ("ffn_lora", include_str!("../../kernels/ffn_lora.cu")),
    ("ffn_q8_1", include_str!("../../kernels/ffn_q8_1.cu")),
    ("ffn_q2g128", include_str!("../../kernels/ffn_q2g128.cu")),
    ("ffn_q4k_mmq", include_str!("../../kernels/ffn_q4k_mmq.cu")),
];

/// The helpers every module may share (`kernels/common.cuh`).
pub const COMMON: &str = include_str!("../../kernels/common.cuh");

/// The line by which a module includes [`COMMON`].
const INCLUDE_COMMON: &str = "#include \"common.cuh\"";

/// The source of a module as NVRTC compiles it: the shared sizes' `#define`s
/// (`sizes::cuda_defines`), then the module with its `#include "common.cuh"` replaced by the
/// shared helpers' text.
pub fn source(module: &str) -> Option<String> {
    MODULES
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, s)| super::sizes::cuda_defines() + &s.replacen(INCLUDE_COMMON, COMMON, 1))
}

/// The `extern "C" __global__` entry points a module defines (parsed from its source): direct
/// definitions (with or without `__launch_bounds__(..)`), and instantiations `MACRO(name, ..)`
/// of a `#define MACRO(NAME, ..)` whose body defines an `extern "C"` kernel.
pub fn entry_points(module: &str) -> Vec<String> {
    let Some(src) = source(module) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut macros: Vec<String> = Vec::new();
    let mut in_define: Option<String> = None;
    for line in src.lines() {
        let l = line.trim_start();
        if let Some(m) = in_define.take() {
            if l.contains("extern \"C\"") {
                macros.push(m);
            } else if line.trim_end().ends_with('\\') {
                in_define = Some(m);
            }
            continue;
        }
        if let Some(rest) = l.strip_prefix("#define ") {
            let name = rest.split('(').next().unwrap_or("").trim().to_string();
            if rest.contains("extern \"C\"") {
                macros.push(name);
            } else if line.trim_end().ends_with('\\') {
                in_define = Some(name);
            }
            continue;
        }
        if let Some(rest) = l.strip_prefix("extern \"C\" __global__ void ") {
            let rest = match rest.strip_prefix("__launch_bounds__(") {
                Some(r) => r.split_once(')').map_or("", |(_, t)| t).trim_start(),
                None => rest,
            };
            if let Some(name) = rest.split('(').next() {
                out.push(name.trim().to_string());
            }
            continue;
        }
        for m in &macros {
            if let Some(args) = l.strip_prefix(m.as_str()).and_then(|r| r.strip_prefix('('))
                && let Some(name) = args.split([',', ')']).next()
            {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_common_header_is_inlined_and_defines_no_kernel() {
        assert!(!super::COMMON.contains("extern \"C\""));
        for (m, raw) in super::MODULES {
            let s = super::source(m).unwrap();
            assert!(!s.contains(super::INCLUDE_COMMON), "{m}");
            assert_eq!(
                raw.contains(super::INCLUDE_COMMON),
                s.contains("block_amax"),
                "{m}"
            );
        }
    }

    #[test]
    fn entry_points_include_launch_bounds_and_macro_instances() {
        let e = super::entry_points("ffn_nvfp4");
        for want in [
            "w4a16_gemv",
            "w4a16_gemv_batch2",
            "w4a16_gemv_dual_batch3",
            "nvfp4_proj_small_m16",
            "w4a16_gemm_t_m128_v2",
            "nvfp4_mmq_gemm",
            "nvfp4_proj_mx",
        ] {
            assert!(e.iter().any(|n| n == want), "{want} not in {e:?}");
        }
        assert!(
            !e.iter()
                .any(|n| n.contains("NAME") || n.contains("__launch")),
            "{e:?}"
        );
    }
}
