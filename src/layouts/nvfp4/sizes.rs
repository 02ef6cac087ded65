//! Its block and tile sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`,
//! and [`DEFINES`] are its `#define MP_*` lines (`gpu::sizes::cuda_defines`).

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[
    ("MP_NVFP4_GEMV_ROWS", NVFP4_GEMV_ROWS),
    ("MP_NVFP4_GEMV_WARPS_DUAL", NVFP4_GEMV_WARPS_DUAL),
    ("MP_NVFP4_GEMV_WARPS_ONE", NVFP4_GEMV_WARPS_ONE),
];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
    /// Weight rows per block of the NVFP4 decode GEMVs: the 16 rows of one m16n8k16 MMA's A.
    pub const NVFP4_GEMV_ROWS: usize = 16;

    /// Warps per block of the NVFP4 dual (gate and up) decode GEMVs, which split k over them.
    pub const NVFP4_GEMV_WARPS_DUAL: usize = 8;

    /// Warps per block of the one-projection NVFP4 decode GEMVs (the down projection's few rows).
    pub const NVFP4_GEMV_WARPS_ONE: usize = 16;
}
