//! Block and tile sizes shared by Rust and the CUDA kernels, defined once from the converters'
//! block types and layout constants. [`cuda_defines`] turns them into the `#define MP_*` lines
//! that `kernels::source` prepends to every kernel module, so neither language writes 36, 144,
//! 34 or 4608 itself.

use crate::converters::{BlockFormat, block_bytes, q4_k::Q4K, q8_1::Q8_1};

/// Values per q8_1 activation block (ggml's `QK8_1`).
pub const Q8_1_ELEMS: usize = Q8_1::BLOCK_ELEMS;
/// Bytes per q8_1 block: `f16 d, f16 s, i8 qs[32]`.
pub const Q8_1_BYTES: usize = block_bytes::<Q8_1>();
const _: () = assert!(Q8_1_BYTES == 2 + 2 + Q8_1_ELEMS);

/// Values per Q4_K super-block (ggml's `QK_K`).
pub const Q4K_ELEMS: usize = Q4K::BLOCK_ELEMS;
/// Bytes per Q4_K super-block: `f16 d, f16 dmin, u8 scales[12], u8 qs[QK_K/2]`.
pub const Q4K_BYTES: usize = block_bytes::<Q4K>();
const _: () = assert!(Q4K_BYTES == 2 + 2 + 12 + Q4K_ELEMS / 2);

// A 16-byte code chunk (32 values at 4 bits, 16 at 8) lies in one group.
const _: () = assert!(AFFINE_GROUP.is_multiple_of(32));

/// Output rows per block of the dequantizing wgmma GEMMs (`nvfp4_wgmma`, `q4k_wgmma`): two
/// consumer warpgroups of one `wgmma` m64 each.
pub const DQ_WGMMA_BM: usize = 128;
/// Output columns (weight rows) per block of the dequantizing GEMMs: one `wgmma` n128, one
/// decoder thread per weight row.
pub const DQ_WGMMA_BN: usize = 128;
/// Shared-memory stages of the dequantizing GEMMs (64 k each: one 128-byte bf16 swizzle row;
/// even: the two decoder warpgroups take every other one).
pub const DQ_WGMMA_STAGES: usize = 6;
/// Threads of one dequantizing GEMM block: two decoder warpgroups, two consumers.
pub const DQ_WGMMA_THREADS: usize = 4 * 128;
/// Dynamic shared memory of one dequantizing GEMM block: the stages (A then B, 128 bytes a
/// row), the 1024-byte alignment and two mbarriers per stage.
pub const DQ_WGMMA_SMEM: usize =
    DQ_WGMMA_STAGES * (DQ_WGMMA_BM + DQ_WGMMA_BN) * 128 + 1024 + 16 * DQ_WGMMA_STAGES;
const _: () = assert!(DQ_WGMMA_SMEM <= 227 << 10);
// Every k stage is one NVFP4 MMQ tile (64 k) and a quarter of a Q4_K block.
const _: () = assert!(NVFP4_MMQ_TILE_K == 64 && NVFP4_MMQ_TILE_N == DQ_WGMMA_BN);

/// The sizes every layout shares (q8_1 activations, the Q4_K block, the dequantizing wgmma
/// GEMMs), by the name the kernels see; each layout's own are in its folder (`sizes.rs`).
pub const SHARED: &[(&str, usize)] = &[
    ("MP_Q8_1_ELEMS", Q8_1_ELEMS),
    ("MP_Q8_1_BYTES", Q8_1_BYTES),
    ("MP_Q4K_ELEMS", Q4K_ELEMS),
    ("MP_Q4K_BYTES", Q4K_BYTES),
    ("MP_DQ_WGMMA_BM", DQ_WGMMA_BM),
    ("MP_DQ_WGMMA_BN", DQ_WGMMA_BN),
    ("MP_DQ_WGMMA_STAGES", DQ_WGMMA_STAGES),
    ("MP_DQ_WGMMA_THREADS", DQ_WGMMA_THREADS),
    ("MP_DQ_WGMMA_SMEM", DQ_WGMMA_SMEM),
];

/// Generates the re-exports of every built-in layout's sizes and [`cuda_defines`] from the list
/// of built-in layouts (`layouts::builtin_layouts!`).
macro_rules! layout_sizes {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        $(#[allow(unused_imports)] pub use crate::layouts::$t::sizes::consts::*;)*

        /// The `#define`s prepended to every kernel module: [`SHARED`], then each built-in
        /// layout's (`src/layouts/TAG/sizes.rs`) in `Layout` order.
        pub fn cuda_defines() -> String {
            let mut s = String::from("// Generated from src/gpu/sizes.rs: sizes shared with Rust.\n");
            let all = SHARED.iter()$(.chain(crate::layouts::$t::sizes::DEFINES))*;
            for (name, v) in all {
                s.push_str(&format!("#define {name} {v}\n"));
            }
            s
        }
    };
}
crate::layouts::builtin_layouts!(layout_sizes);
