//! Its block and tile sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`,
//! and [`DEFINES`] are its `#define MP_*` lines (`gpu::sizes::cuda_defines`).

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[
    ("MP_Q2G128_ELEMS", Q2G128_ELEMS),
    ("MP_Q2G128_BYTES", Q2G128_BYTES),
];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
    use crate::converters::{BlockFormat, block_bytes, q2g128::Q2g128};

    /// Values per q2g128 block (one group of 128).
    pub const Q2G128_ELEMS: usize = Q2g128::BLOCK_ELEMS;

    /// Bytes per q2g128 block: `f16 d` then 2-bit codes.
    pub const Q2G128_BYTES: usize = block_bytes::<Q2g128>();
    const _: () = assert!(Q2G128_BYTES == 2 + Q2G128_ELEMS / 4);
}
