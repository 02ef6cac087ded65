//! Its CUDA module by name, as `gpu::kernels` embeds them (the name is the prebuilt
//! cubin's and the NVRTC cache's key): `kernels.cu` (the GEMV) with the IQ entries
//! (`kernels_iq.cuh`, after the IQ grids of `grids.rs`) and the stages (`kernels_stage.cuh`:
//! block geometry, stage words, cp.async) at its marker line, then the prefill's
//! dequantization (`kernels_dequant.cuh`).

use std::sync::LazyLock;

/// The line of `kernels.cu` the IQ entries replace.
const MARKER: &str = "// ---- the IQ entries: the grids (grids.rs), then kernels_iq.cuh; then kernels_stage.cuh ----";

/// `(module, source)`.
pub static MODULES: LazyLock<[(&str, &str); 1]> = LazyLock::new(|| {
    let main = include_str!("kernels.cu");
    assert!(main.contains(MARKER), "kernels.cu lacks its IQ marker");
    let iq = super::grids::cuda_text()
        + include_str!("kernels_iq.cuh")
        + include_str!("kernels_stage.cuh");
    let source = main.replacen(MARKER, &iq, 1) + include_str!("kernels_dequant.cuh");
    let source: &'static str = Box::leak(source.into_boxed_str());
    [("ffn_ggml", source)]
});
