//! Its block and tile sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`,
//! and [`DEFINES`] are its `#define MP_*` lines (`gpu::sizes::cuda_defines`).

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[
    ("MP_Q4K_GEMV_ROWS", Q4K_GEMV_ROWS),
    ("MP_Q4K_GEMV_M_ROWS", Q4K_GEMV_M_ROWS),
    ("MP_INT8_GEMV_ROWS", INT8_GEMV_ROWS),
    ("MP_INT8_GEMV_M_ROWS", INT8_GEMV_M_ROWS),
];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
    /// Weight rows per block of the `q4k_mmq` decode GEMV `q4k_gemv` (8 warps of 4 rows: each
    /// activation load serves 4 rows; 2 rows kept 123 registers and ran 16% slower, BENCHMARKS.md).
    pub const Q4K_GEMV_ROWS: usize = 32;

    /// Weight rows per block of its batch-4 form `q4k_gemv_batch4` (8 warps of 2 rows).
    pub const Q4K_GEMV_M_ROWS: usize = 16;

    /// Weight rows per block of the int8-rows decode GEMV `int8_rows_gemv` (8 warps of 2 rows; one
    /// row a warp doubled the occupancy and ran 39% slower: twice the activation loads per weight
    /// byte, BENCHMARKS.md).
    pub const INT8_GEMV_ROWS: usize = 16;

    /// Weight rows per block of its batch-4 form `int8_rows_gemv_batch4` (8 warps of 2 rows).
    pub const INT8_GEMV_M_ROWS: usize = 16;
}
