//! Its block and tile sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`,
//! and [`DEFINES`] are its `#define MP_*` lines (`gpu::sizes::cuda_defines`).

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[("MP_BF16_GEMV_ROWS", BF16_GEMV_ROWS)];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
    /// Weight rows per block of the BF16 decode GEMV (its 8 warps split k; `src/layouts/bf16/kernels.cu`).
    pub const BF16_GEMV_ROWS: usize = 8;
}
