//! Its block and tile sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`,
//! and [`DEFINES`] are its `#define MP_*` lines (`gpu::sizes::cuda_defines`).

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[
    ("MP_NVFP4_MMQ_TILE_N", NVFP4_MMQ_TILE_N),
    ("MP_NVFP4_MMQ_TILE_K", NVFP4_MMQ_TILE_K),
    ("MP_NVFP4_MMQ_TILE_BYTES", NVFP4_MMQ_TILE_BYTES),
];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
    use crate::converters::layouts::nvfp4_mmq;

    /// Rows, k values and bytes of one `nvfp4_mmq` tile.
    pub const NVFP4_MMQ_TILE_N: usize = nvfp4_mmq::TILE_N;

    /// k values per `nvfp4_mmq` tile.
    pub const NVFP4_MMQ_TILE_K: usize = nvfp4_mmq::TILE_K;

    /// Bytes per `nvfp4_mmq` tile.
    pub const NVFP4_MMQ_TILE_BYTES: usize = nvfp4_mmq::TILE_BYTES;
}
