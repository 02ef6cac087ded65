//! Its CUDA module by name, as `gpu::kernels` embeds them (the name is the prebuilt
//! cubin's and the NVRTC cache's key).

/// `(module, source)`.
pub const MODULES: &[(&str, &str)] = &[("ffn_ggml", include_str!("kernels.cu"))];
