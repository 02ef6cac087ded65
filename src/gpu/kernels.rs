//! The CUDA kernel sources, compiled into the binary so a deployed engine needs no source tree.
//! Each module is one file in `kernels/`; the host backend implements the same names.

/// (module, source) of every kernel file.
pub const MODULES: &[(&str, &str)] = &[
    ("ffn_act", include_str!("../../kernels/ffn_act.cu")),
    ("ffn_fp8", include_str!("../../kernels/ffn_fp8.cu")),
    ("ffn_w8a8", include_str!("../../kernels/ffn_w8a8.cu")),
    ("ffn_bf16", include_str!("../../kernels/ffn_bf16.cu")),
    ("ffn_nvfp4", include_str!("../../kernels/ffn_nvfp4.cu")),
];

/// The source of a module.
pub fn source(module: &str) -> Option<&'static str> {
    MODULES.iter().find(|(m, _)| *m == module).map(|(_, s)| *s)
}

/// The `extern "C" __global__` entry points a module defines (parsed from its source).
pub fn entry_points(module: &str) -> Vec<String> {
    let Some(src) = source(module) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in src.lines() {
        let l = line.trim_start();
        if let Some(rest) = l.strip_prefix("extern \"C\" __global__ void ")
            && let Some(name) = rest.split('(').next()
        {
            out.push(name.trim().to_string());
        }
    }
    out
}
