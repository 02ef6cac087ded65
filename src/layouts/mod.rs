//! Every built-in layout, one folder each (docs/contributing.md, "A built-in layout is one
//! folder"), and the one list that names them: [`builtin_layouts!`]. Each layer's registry is
//! generated from that list and re-exports the parts of its own layer; this module only
//! declares the folders.

/// The built-in layouts, the one place that lists them: calls `$m!` with every layout's folder,
/// its `Layout` variant and a line saying what it is, in `Layout` order (the order of a pack's blobs), then the folders in
/// install order (the NVFP4 base first, then what builds on it, `lora` before `fp8`, `bf16` and
/// `q2g128`, which its validator refuses, then the layouts that stand alone). Every folder has
/// the same parts (`spec`, `runtime`, `twin`, ...), some of them empty.
macro_rules! builtin_layouts {
    ($m:path) => {
        $m! {
            layouts: [
                nvfp4 Nvfp4 "ModelOpt NVFP4 codes and scales, K padded to 64.",
                nvfp4_t Nvfp4T "the transposed NVFP4 copy of the `_t` prefill GEMMs.",
                nvfp4_mmq Nvfp4Mmq "NVFP4 repacked into the MMQ prefill tiles.",
                q4k_mmq Q4kMmq "Q4_K gate and up, int8 or Q4_K down, for the Q4_K MMQ prefill.",
                fp8 Fp8 "E4M3 with 128x128 block scales, gate and up fused.",
                w8a8 W8a8 "E4M3 with per-row scales for the W8A8 arm.",
                bf16 Bf16 "BF16 rows, K padded to 8.",
                q2g128 Q2g128 "2-bit codes with one f16 scale per group of 128.",
                lora Lora "a PEFT adapter's A and B in BF16 with its scaling.",
                affine Affine "integer codes (4 or 8 bits) with a half scale and offset per group.",
                ggml Ggml "GGUF blocks per projection as the source stores them (the block-format engine)."
            ],
            install: [nvfp4, nvfp4_t, nvfp4_mmq, lora, q4k_mmq, fp8, bf16, w8a8, q2g128, affine, ggml]
        }
    };
}
pub(crate) use builtin_layouts;

pub mod affine;
pub mod bf16;
pub mod fp8;
pub mod ggml;
pub mod lora;
pub mod nvfp4;
pub mod nvfp4_mmq;
pub mod nvfp4_t;
pub mod q2g128;
pub mod q4k_mmq;
pub mod w8a8;
