//! Its block and tile sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`,
//! and [`DEFINES`] are its `#define MP_*` lines (`gpu::sizes::cuda_defines`).

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[
    ("MP_FP8_GEMV_ROWS", FP8_GEMV_ROWS),
    ("MP_FP8_MMA_GEMV_ROWS", FP8_MMA_GEMV_ROWS),
    ("MP_FP8_MMA_GEMV_WARPS", FP8_MMA_GEMV_WARPS),
];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
    /// Weight rows per block of the FP8 decode GEMV `w8a16_gemv_batch4` (8 warps: 4 row groups of
    /// 4 rows, k split in two).
    pub const FP8_GEMV_ROWS: usize = 16;

    /// Weight rows per block of the FP8 tensor-core decode GEMVs `w8a16_gemv_mma*`: the 16 rows of
    /// one m16n8k16 MMA's A.
    pub const FP8_MMA_GEMV_ROWS: usize = 16;

    /// Warps per block of `w8a16_gemv_mma` (splitting k).
    pub const FP8_MMA_GEMV_WARPS: usize = 8;
}
