//! Its sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`, and [`DEFINES`]
//! are its `#define MP_*` lines (`gpu::sizes::cuda_defines`). The block sizes are the
//! converters' block types' (`converters/q*.rs`, ggml-common.h's layouts).

use crate::converters::{BlockFormat, block_bytes};
use crate::converters::{
    bnb, iq1, iq2, iq3, iq4, mxfp4, nvfp4, q2_k, q3_k, q4_0, q4_1, q5_0, q5_1, q5_k, q6_k, q8_0,
};

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[
    ("MP_GGML_GEMV_MAX_M", GGML_GEMV_MAX_M),
    ("MP_GGML_QK", GGML_QK),
    ("MP_GGML_STAGE", GGML_STAGE),
    ("MP_GGML_STAGE_BYTES_MAX", GGML_STAGE_BYTES_MAX),
    ("MP_GGML_GEMV1_WARPS", GGML_GEMV1_WARPS),
    ("MP_GGML_GEMV_SPLIT_M", GGML_GEMV_SPLIT_M),
    ("MP_GGML_GEMV1_BUFS", GGML_GEMV1_BUFS),
    ("MP_GGML_GEMV1_BLOCKS", GGML_GEMV1_BLOCKS),
    ("MP_GGML_GEMV_SPLIT4_M", GGML_GEMV_SPLIT4_M),
    ("MP_GGML_QK_K", GGML_QK_K),
    ("MP_GGML_Q4_0_BYTES", GGML_Q4_0_BYTES),
    ("MP_GGML_Q4_1_BYTES", GGML_Q4_1_BYTES),
    ("MP_GGML_Q5_0_BYTES", GGML_Q5_0_BYTES),
    ("MP_GGML_Q5_1_BYTES", GGML_Q5_1_BYTES),
    ("MP_GGML_Q8_0_BYTES", GGML_Q8_0_BYTES),
    ("MP_GGML_Q5K_BYTES", GGML_Q5K_BYTES),
    ("MP_GGML_Q6K_BYTES", GGML_Q6K_BYTES),
    ("MP_GGML_Q2K_BYTES", GGML_Q2K_BYTES),
    ("MP_GGML_Q3K_BYTES", GGML_Q3K_BYTES),
    ("MP_GGML_IQ4_NL_BYTES", GGML_IQ4_NL_BYTES),
    ("MP_GGML_IQ4_XS_BYTES", GGML_IQ4_XS_BYTES),
    ("MP_GGML_MXFP4_BYTES", GGML_MXFP4_BYTES),
    ("MP_GGML_QK_NVFP4", GGML_QK_NVFP4),
    ("MP_GGML_NVFP4_BYTES", GGML_NVFP4_BYTES),
    ("MP_GGML_IQ2_XXS_BYTES", GGML_IQ2_XXS_BYTES),
    ("MP_GGML_IQ2_XS_BYTES", GGML_IQ2_XS_BYTES),
    ("MP_GGML_IQ2_S_BYTES", GGML_IQ2_S_BYTES),
    ("MP_GGML_IQ3_XXS_BYTES", GGML_IQ3_XXS_BYTES),
    ("MP_GGML_IQ3_S_BYTES", GGML_IQ3_S_BYTES),
    ("MP_GGML_IQ1_S_BYTES", GGML_IQ1_S_BYTES),
    ("MP_GGML_IQ1_M_BYTES", GGML_IQ1_M_BYTES),
    ("MP_GGML_QK_NF4", GGML_QK_NF4),
    ("MP_GGML_NF4_BYTES", GGML_NF4_BYTES),
];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
    use super::*;
    /// Activation rows one launch of the engine's GEMV (`ggml_gemv`) takes.
    pub const GGML_GEMV_MAX_M: usize = 8;
    /// Weight rows per block of `ggml_gemv` (8 warps of one row).
    pub const GGML_GEMV_ROWS: usize = 8;
    /// The fewest prefill rows that take the dequantization and the BF16 GEMM rather than the
    /// GEMV (which reads the weights once per 4 rows): the crossover measured on the H200 for
    /// the integer-group GEMVs over int8 activations (BENCHMARKS.md); not yet measured for this
    /// engine.
    pub const GGML_PREFILL_MIN_ROWS: usize = 17;
    /// Values per stage of `ggml_gemv` (a warp reads its row into shared memory a stage at a
    /// time): 64 blocks of 32, 8 super-blocks.
    pub const GGML_STAGE: usize = 2048;
    /// The most bytes of a stage of any type (Q8_0's 64 blocks of 34).
    pub const GGML_STAGE_BYTES_MAX: usize = GGML_STAGE / GGML_QK * GGML_Q8_0_BYTES;
    /// Warps (weight rows) per launch block of the one-row GEMV (`ggml_gemv1`).
    pub const GGML_GEMV1_WARPS: usize = 4;
    /// Stage buffers per warp of `ggml_gemv1`, filled by cp.async (all but one in flight): with
    /// [`GGML_GEMV1_WARPS`], 4 * 3 * (2176 + 32) = 26496 bytes of shared memory a launch block.
    pub const GGML_GEMV1_BUFS: usize = 3;
    /// Activation rows of the one-row GEMV's form for a few (`ggml_gemv_split`, the layer's at
    /// two rows: on an H100, 0.72-0.84x `ggml_gemv_sa`'s time there for most types; at 8 rows
    /// its older form measured slower on the down shape).
    pub const GGML_GEMV_SPLIT_M: usize = 2;
    /// Launch blocks of the one-row GEMV (`ggml_gemv1`) per SM its registers leave room for
    /// (`__launch_bounds__`: 65536 / (128 * 8) = 64 registers a thread, none spilled).
    pub const GGML_GEMV1_BLOCKS: usize = 8;
    /// Activation rows of the split form's larger size (`ggml_gemv_split4`, under the
    /// one-row GEMV's register bound).
    pub const GGML_GEMV_SPLIT4_M: usize = 4;
    /// Values per block of the 32-value types (ggml's `QK4_0` .. `QK8_0`).
    pub const GGML_QK: usize = q8_0::Q8_0::BLOCK_ELEMS;
    /// Values per K-quant super-block (ggml's `QK_K`).
    pub const GGML_QK_K: usize = q6_k::Q6K::BLOCK_ELEMS;
    /// Bytes per Q4_0 block: `f16 d, u8 qs[16]`.
    pub const GGML_Q4_0_BYTES: usize = block_bytes::<q4_0::Q4_0>();
    /// Bytes per Q4_1 block: `f16 d, f16 m, u8 qs[16]`.
    pub const GGML_Q4_1_BYTES: usize = block_bytes::<q4_1::Q4_1>();
    /// Bytes per Q5_0 block: `f16 d, u8 qh[4], u8 qs[16]`.
    pub const GGML_Q5_0_BYTES: usize = block_bytes::<q5_0::Q5_0>();
    /// Bytes per Q5_1 block: `f16 d, f16 m, u8 qh[4], u8 qs[16]`.
    pub const GGML_Q5_1_BYTES: usize = block_bytes::<q5_1::Q5_1>();
    /// Bytes per Q8_0 block: `f16 d, i8 qs[32]`.
    pub const GGML_Q8_0_BYTES: usize = block_bytes::<q8_0::Q8_0>();
    /// Bytes per Q5_K super-block: `f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]`.
    pub const GGML_Q5K_BYTES: usize = block_bytes::<q5_k::Q5K>();
    /// Bytes per Q6_K super-block: `u8 ql[128], u8 qh[64], i8 scales[16], f16 d`.
    pub const GGML_Q6K_BYTES: usize = block_bytes::<q6_k::Q6K>();
    /// Bytes per Q2_K super-block: `u8 scales[16], u8 qs[64], f16 d, f16 dmin`.
    pub const GGML_Q2K_BYTES: usize = block_bytes::<q2_k::Q2K>();
    /// Bytes per Q3_K super-block: `u8 hmask[32], u8 qs[64], u8 scales[12], f16 d`.
    pub const GGML_Q3K_BYTES: usize = block_bytes::<q3_k::Q3K>();
    /// Bytes per IQ4_NL block: `f16 d, u8 qs[16]`.
    pub const GGML_IQ4_NL_BYTES: usize = block_bytes::<iq4::Iq4Nl>();
    /// Bytes per IQ4_XS super-block: `f16 d, u16 scales_h, u8 scales_l[4], u8 qs[128]`.
    pub const GGML_IQ4_XS_BYTES: usize = block_bytes::<iq4::Iq4Xs>();
    /// Bytes per MXFP4 block: `u8 e (E8M0), u8 qs[16]`.
    pub const GGML_MXFP4_BYTES: usize = block_bytes::<mxfp4::Mxfp4>();
    /// Values per GGUF NVFP4 block (ggml's `QK_NVFP4`): four sub-blocks of 16.
    pub const GGML_QK_NVFP4: usize = nvfp4::Nvfp4Gguf::BLOCK_ELEMS;
    /// Bytes per GGUF NVFP4 block: `u8 d[4]` (UE4M3), `u8 qs[32]`.
    pub const GGML_NVFP4_BYTES: usize = block_bytes::<nvfp4::Nvfp4Gguf>();
    /// Bytes per IQ2_XXS super-block: `f16 d, u16 qs[32]`.
    pub const GGML_IQ2_XXS_BYTES: usize = block_bytes::<iq2::Iq2Xxs>();
    /// Bytes per IQ2_XS super-block: `f16 d, u16 qs[32], u8 scales[8]`.
    pub const GGML_IQ2_XS_BYTES: usize = block_bytes::<iq2::Iq2Xs>();
    /// Bytes per IQ2_S super-block: `f16 d, u8 qs[64], u8 qh[8], u8 scales[8]`.
    pub const GGML_IQ2_S_BYTES: usize = block_bytes::<iq2::Iq2S>();
    /// Bytes per IQ3_XXS super-block: `f16 d, u8 qs[96]`.
    pub const GGML_IQ3_XXS_BYTES: usize = block_bytes::<iq3::Iq3Xxs>();
    /// Bytes per IQ3_S super-block: `f16 d, u8 qs[64], u8 qh[8], u8 signs[32], u8 scales[4]`.
    pub const GGML_IQ3_S_BYTES: usize = block_bytes::<iq3::Iq3S>();
    /// Bytes per IQ1_S super-block: `f16 d, u8 qs[32], u16 qh[8]`.
    pub const GGML_IQ1_S_BYTES: usize = block_bytes::<iq1::Iq1S>();
    /// Bytes per IQ1_M super-block: `u8 qs[32], u8 qh[16], u16 scales[4]` (the f16 d in the
    /// scales' top nibbles).
    pub const GGML_IQ1_M_BYTES: usize = block_bytes::<iq1::Iq1M>();
    /// Values per engine NF4 block (bitsandbytes, `converters::bnb`): 64 of a row.
    pub const GGML_QK_NF4: usize = bnb::Nf4::BLOCK_ELEMS;
    /// Bytes per engine NF4 block: `f32 absmax, u8 qs[32]`.
    pub const GGML_NF4_BYTES: usize = block_bytes::<bnb::Nf4>();
}

const _: () = assert!(GGML_QK == 32 && GGML_QK_K == 256);
const _: () = assert!(GGML_Q4_0_BYTES == 2 + GGML_QK / 2 && GGML_Q4_1_BYTES == 4 + GGML_QK / 2);
const _: () = assert!(GGML_Q5_0_BYTES == 6 + GGML_QK / 2 && GGML_Q5_1_BYTES == 8 + GGML_QK / 2);
const _: () = assert!(GGML_Q8_0_BYTES == 2 + GGML_QK);
const _: () = assert!(GGML_Q5K_BYTES == 4 + 12 + GGML_QK_K / 8 + GGML_QK_K / 2);
const _: () = assert!(GGML_Q6K_BYTES == GGML_QK_K / 2 + GGML_QK_K / 4 + GGML_QK_K / 16 + 2);
const _: () = assert!(GGML_Q2K_BYTES == GGML_QK_K / 16 + GGML_QK_K / 4 + 4);
const _: () = assert!(GGML_Q3K_BYTES == GGML_QK_K / 8 + GGML_QK_K / 4 + 12 + 2);
const _: () = assert!(GGML_IQ4_NL_BYTES == 2 + GGML_QK / 2 && GGML_MXFP4_BYTES == 1 + GGML_QK / 2);
const _: () = assert!(
    GGML_QK_NVFP4 == 2 * GGML_QK && GGML_NVFP4_BYTES == GGML_QK_NVFP4 / 16 + GGML_QK_NVFP4 / 2
);
const _: () = assert!(GGML_QK_NF4 == 2 * GGML_QK && GGML_NF4_BYTES == 4 + GGML_QK_NF4 / 2);
const _: () = assert!(GGML_IQ4_XS_BYTES == 4 + GGML_QK_K / 64 + GGML_QK_K / 2);
const _: () = assert!(GGML_IQ2_XXS_BYTES == 2 + GGML_QK_K / 4);
const _: () = assert!(GGML_IQ2_XS_BYTES == 2 + GGML_QK_K / 4 + GGML_QK_K / 32);
const _: () = assert!(GGML_IQ2_S_BYTES == 2 + GGML_QK_K / 4 + GGML_QK_K / 16);
const _: () = assert!(GGML_IQ3_XXS_BYTES == 2 + 3 * GGML_QK_K / 8);
const _: () = assert!(
    GGML_IQ3_S_BYTES == 2 + GGML_QK_K / 4 + GGML_QK_K / 32 + GGML_QK_K / 8 + GGML_QK_K / 64
);

/// Each engine type's stage: whole 16-byte words, no more than the largest.
const _: () = {
    let types = super::codec::TYPES;
    let mut i = 0;
    while i < types.len() {
        let (elems, bytes) = (
            types[i].block_elems() as usize,
            types[i].block_bytes() as usize,
        );
        let sb = GGML_STAGE / elems * bytes;
        assert!(
            GGML_STAGE.is_multiple_of(elems) && sb.is_multiple_of(16) && sb <= GGML_STAGE_BYTES_MAX
        );

        i += 1;
    }
};
