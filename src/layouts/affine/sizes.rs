//! Its block and tile sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`,
//! and [`DEFINES`] are its `#define MP_*` lines (`gpu::sizes::cuda_defines`).

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[
    ("MP_Q4_0_BYTES", Q4_0_BYTES),
    ("MP_Q4_1_BYTES", Q4_1_BYTES),
    ("MP_Q8_0_BYTES", Q8_0_BYTES),
    ("MP_AFFINE_GROUP", AFFINE_GROUP),
    ("MP_AFFINE_GEMV_ROWS", AFFINE_GEMV_ROWS),
    ("MP_AFFINE_GEMV_WARPS", AFFINE_GEMV_WARPS),
    ("MP_AFFINE_GEMV_KS", AFFINE_GEMV_KS),
    ("MP_AFFINE_GATHER_SMEM", AFFINE_GATHER_SMEM),
];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
    use crate::converters::{block_bytes, q4_0::Q4_0, q4_1::Q4_1, q8_0::Q8_0};

    /// Values per group of the `affine` layout (its half scale and offset; GGUF's 32-value blocks).
    pub const AFFINE_GROUP: usize = crate::layouts::affine::groups::GGML_GROUP;

    /// Bytes of the GGUF blocks `affine_from_ggml` carries (ggml-common.h): Q4_0 `f16 d, qs[16]`,
    /// Q4_1 `f16 d, f16 m, qs[16]`, Q8_0 `f16 d, i8 qs[32]`.
    pub const Q4_0_BYTES: usize = block_bytes::<Q4_0>();

    /// See [`Q4_0_BYTES`].
    pub const Q4_1_BYTES: usize = block_bytes::<Q4_1>();

    /// See [`Q4_0_BYTES`].
    pub const Q8_0_BYTES: usize = block_bytes::<Q8_0>();
    const _: () = assert!(Q4_0_BYTES == 2 + AFFINE_GROUP / 2);
    const _: () = assert!(Q4_1_BYTES == 2 + 2 + AFFINE_GROUP / 2);
    const _: () = assert!(Q8_0_BYTES == 2 + AFFINE_GROUP);

    /// Weight rows per warp of the `affine` decode GEMVs (each lane takes whole groups of k, the
    /// rows sharing each activation load).
    pub const AFFINE_GEMV_ROWS: usize = 2;

    /// Warps per block of the `affine` decode GEMVs.
    pub const AFFINE_GEMV_WARPS: usize = 4;

    /// Weight rows per block of the `affine` decode GEMVs.
    pub const AFFINE_GEMV_BLOCK_ROWS: usize = AFFINE_GEMV_ROWS * AFFINE_GEMV_WARPS;

    /// The k slices of the `affine` GEMVs' `_ks` forms (one projection, one activation row): a
    /// block's warps split k this many ways, so a projection of few rows (the down projection) runs
    /// this many times the warps.
    pub const AFFINE_GEMV_KS: usize = 4;

    /// Weight rows per block of the `_ks` forms.
    pub const AFFINE_GEMV_KS_BLOCK_ROWS: usize = AFFINE_GEMV_BLOCK_ROWS / AFFINE_GEMV_KS;
    const _: () = assert!(AFFINE_GEMV_WARPS.is_multiple_of(AFFINE_GEMV_KS));

    /// The most activation rows the `affine` decode GEMVs take (their batch-16 forms); a prefill of
    /// more dequantizes to BF16.
    pub const AFFINE_GEMV_MAX_ROWS: usize = 16;

    /// The longest row `affine_gather_bf16` stages in shared memory (BF16 values: 32 KB); longer
    /// rows are read from global memory.
    pub const AFFINE_GATHER_SMEM: usize = 16384;
}
