//! Its CUDA modules by name, as `gpu::kernels` embeds them (the name is the prebuilt
//! cubin's and the NVRTC cache's key).

/// `(module, source)`.
pub const MODULES: &[(&str, &str)] = &[
    ("ffn_w8a8", include_str!("kernels.cu")),
    ("ffn_w8a8_wgmma", include_str!("kernels_wgmma.cu")),
];
