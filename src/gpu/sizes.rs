//! Block and tile sizes shared by Rust and the CUDA kernels, defined once from the converters'
//! block types and layout constants. [`cuda_defines`] turns them into the `#define MP_*` lines
//! that `kernels::source` prepends to every kernel module, so neither language writes 36, 144,
//! 34 or 4608 itself.

use crate::converters::layouts::nvfp4_mmq;
use crate::converters::{
    BlockFormat, block_bytes, q2g128::Q2g128, q4_0::Q4_0, q4_1::Q4_1, q4_k::Q4K, q8_0::Q8_0,
    q8_1::Q8_1,
};

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

/// Values per q2g128 block (one group of 128).
pub const Q2G128_ELEMS: usize = Q2g128::BLOCK_ELEMS;
/// Bytes per q2g128 block: `f16 d` then 2-bit codes.
pub const Q2G128_BYTES: usize = block_bytes::<Q2g128>();
const _: () = assert!(Q2G128_BYTES == 2 + Q2G128_ELEMS / 4);

/// Values per group of the `affine` layout (its half scale and offset; GGUF's 32-value blocks).
pub const AFFINE_GROUP: usize = crate::converters::affine::GGML_GROUP;
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
// A 16-byte code chunk (32 values at 4 bits, 16 at 8) lies in one group.
const _: () = assert!(AFFINE_GROUP.is_multiple_of(32));

/// Rows, k values and bytes of one `nvfp4_mmq` tile.
pub const NVFP4_MMQ_TILE_N: usize = nvfp4_mmq::TILE_N;
/// k values per `nvfp4_mmq` tile.
pub const NVFP4_MMQ_TILE_K: usize = nvfp4_mmq::TILE_K;
/// Bytes per `nvfp4_mmq` tile.
pub const NVFP4_MMQ_TILE_BYTES: usize = nvfp4_mmq::TILE_BYTES;

/// Weight rows per block of the NVFP4 decode GEMVs: the 16 rows of one m16n8k16 MMA's A.
pub const NVFP4_GEMV_ROWS: usize = 16;

/// Warps per block of the NVFP4 dual (gate and up) decode GEMVs, which split k over them.
pub const NVFP4_GEMV_WARPS_DUAL: usize = 8;
/// Warps per block of the one-projection NVFP4 decode GEMVs (the down projection's few rows).
pub const NVFP4_GEMV_WARPS_ONE: usize = 16;

/// Weight rows per block of the BF16 decode GEMV (its 8 warps split k; `src/layouts/bf16/kernels.cu`).
pub const BF16_GEMV_ROWS: usize = 8;
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
/// Weight rows per block of the FP8 decode GEMV `w8a16_gemv_batch4` (8 warps: 4 row groups of
/// 4 rows, k split in two).
pub const FP8_GEMV_ROWS: usize = 16;
/// Weight rows per block of the FP8 tensor-core decode GEMVs `w8a16_gemv_mma*`: the 16 rows of
/// one m16n8k16 MMA's A.
pub const FP8_MMA_GEMV_ROWS: usize = 16;
/// Warps per block of `w8a16_gemv_mma` (splitting k).
pub const FP8_MMA_GEMV_WARPS: usize = 8;

/// Output rows (activation rows) per block of the sm_90a W8A8 prefill GEMM `w8a8_wgmma`: two
/// consumer warpgroups of one `wgmma` m64 each.
pub const W8A8_WGMMA_BM: usize = 128;
/// Output columns (weight rows) per block of `w8a8_wgmma`: one `wgmma` n128.
pub const W8A8_WGMMA_BN: usize = 128;
/// k bytes per shared-memory stage of the W8A8 wgmma GEMMs: one 128-byte swizzle row, four
/// `wgmma` k32 steps, and the span whose tensor-core sum is added into the f32 total.
pub const W8A8_WGMMA_BK: usize = 128;
/// Shared-memory stages of `w8a8_wgmma`'s TMA pipeline.
pub const W8A8_WGMMA_STAGES: usize = 4;
/// Threads of one `w8a8_wgmma` block: a producer warpgroup and one consumer warpgroup per 64
/// rows of the tile.
pub const W8A8_WGMMA_THREADS: usize = (1 + W8A8_WGMMA_BM / 64) * 128;
/// Registers per thread of `w8a8_wgmma`'s producer warpgroup after `setmaxnreg`.
pub const W8A8_WGMMA_PRODUCER_REGS: usize = 56;
/// Registers per thread of its consumer warpgroups after `setmaxnreg`: what the register file
/// leaves them, in steps of 8, at most 232.
pub const W8A8_WGMMA_CONSUMER_REGS: usize = {
    let left = (65536 / 128 - W8A8_WGMMA_PRODUCER_REGS) / (W8A8_WGMMA_BM / 64) / 8 * 8;
    if left > 232 { 232 } else { left }
};
/// f32 padding per row of `w8a8_wgmma`'s output tile in shared memory (bank-conflict-free
/// writes from the wgmma accumulator layout).
pub const W8A8_WGMMA_EPI_PAD: usize = 8;
/// Dynamic shared memory of one `w8a8_wgmma` block: the stages, the f32 output tile, 1024 bytes
/// to align the base to the 128-byte swizzle's 1024-byte atom, two 8-byte mbarriers per stage and
/// two for the output tile.
pub const W8A8_WGMMA_SMEM: usize =
    W8A8_WGMMA_STAGES * (W8A8_WGMMA_BM + W8A8_WGMMA_BN) * W8A8_WGMMA_BK
        + W8A8_WGMMA_BM * (W8A8_WGMMA_BN + W8A8_WGMMA_EPI_PAD) * 4
        + 1024
        + 16 * W8A8_WGMMA_STAGES
        + 16;
/// Rows per block of the decode tiling `w8a8_wgmma_m64` (one warpgroup; its row cap).
pub const W8A8_WGMMA_SMALL_BM: usize = 64;
/// Weight rows per block of `w8a8_wgmma_m64` (`wgmma` n64: twice the blocks of n128).
pub const W8A8_WGMMA_SMALL_BN: usize = 64;
/// Shared-memory stages of `w8a8_wgmma_m64`.
pub const W8A8_WGMMA_SMALL_STAGES: usize = 6;
/// Dynamic shared memory of one `w8a8_wgmma_m64` block (two fit a multiprocessor).
pub const W8A8_WGMMA_SMALL_SMEM: usize =
    W8A8_WGMMA_SMALL_STAGES * (W8A8_WGMMA_SMALL_BM + W8A8_WGMMA_SMALL_BN) * W8A8_WGMMA_BK + 1024;
const _: () =
    assert!(W8A8_WGMMA_BK == 128 && W8A8_WGMMA_BM.is_multiple_of(64) && W8A8_WGMMA_BM <= 256);
// Every installed W8A8 weight's kp is a multiple of the layout's K_ALIGN (`W8a8Weight::validate`),
// so whole stages of BK cover it.
const _: () = assert!(crate::converters::layouts::w8a8::K_ALIGN.is_multiple_of(W8A8_WGMMA_BK));
// Hopper gives a block at most 227 KiB of shared memory; the decode tiling wants two blocks.
const _: () = assert!(W8A8_WGMMA_SMEM <= 227 << 10 && 2 * W8A8_WGMMA_SMALL_SMEM <= 227 << 10);

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
// Every k stage is one nvfp4_mmq tile (64 k) and a quarter of a Q4_K block.
const _: () = assert!(NVFP4_MMQ_TILE_K == 64 && NVFP4_MMQ_TILE_N == DQ_WGMMA_BN);

/// Threads per block of the FP8 activation quantizers (`quantize_act_fp8_row`,
/// `quantize_act_mul_fp8_row`): few rows in flight, so a row's second read comes from L2.
pub const FP8_QUANT_THREADS: usize = 1024;

/// Every shared size, by the name the kernels see.
pub const SHARED: &[(&str, usize)] = &[
    ("MP_Q8_1_ELEMS", Q8_1_ELEMS),
    ("MP_Q8_1_BYTES", Q8_1_BYTES),
    ("MP_Q4K_ELEMS", Q4K_ELEMS),
    ("MP_Q4K_BYTES", Q4K_BYTES),
    ("MP_Q2G128_ELEMS", Q2G128_ELEMS),
    ("MP_Q2G128_BYTES", Q2G128_BYTES),
    ("MP_NVFP4_MMQ_TILE_N", NVFP4_MMQ_TILE_N),
    ("MP_NVFP4_MMQ_TILE_K", NVFP4_MMQ_TILE_K),
    ("MP_NVFP4_MMQ_TILE_BYTES", NVFP4_MMQ_TILE_BYTES),
    ("MP_NVFP4_GEMV_ROWS", NVFP4_GEMV_ROWS),
    ("MP_NVFP4_GEMV_WARPS_DUAL", NVFP4_GEMV_WARPS_DUAL),
    ("MP_NVFP4_GEMV_WARPS_ONE", NVFP4_GEMV_WARPS_ONE),
    ("MP_BF16_GEMV_ROWS", BF16_GEMV_ROWS),
    ("MP_Q4_0_BYTES", Q4_0_BYTES),
    ("MP_Q4_1_BYTES", Q4_1_BYTES),
    ("MP_Q8_0_BYTES", Q8_0_BYTES),
    ("MP_AFFINE_GROUP", AFFINE_GROUP),
    ("MP_AFFINE_GEMV_ROWS", AFFINE_GEMV_ROWS),
    ("MP_AFFINE_GEMV_WARPS", AFFINE_GEMV_WARPS),
    ("MP_AFFINE_GEMV_KS", AFFINE_GEMV_KS),
    ("MP_AFFINE_GATHER_SMEM", AFFINE_GATHER_SMEM),
    ("MP_FP8_GEMV_ROWS", FP8_GEMV_ROWS),
    ("MP_FP8_MMA_GEMV_ROWS", FP8_MMA_GEMV_ROWS),
    ("MP_FP8_MMA_GEMV_WARPS", FP8_MMA_GEMV_WARPS),
    ("MP_Q4K_GEMV_ROWS", Q4K_GEMV_ROWS),
    ("MP_Q4K_GEMV_M_ROWS", Q4K_GEMV_M_ROWS),
    ("MP_INT8_GEMV_ROWS", INT8_GEMV_ROWS),
    ("MP_INT8_GEMV_M_ROWS", INT8_GEMV_M_ROWS),
    ("MP_FP8_QUANT_THREADS", FP8_QUANT_THREADS),
    ("MP_W8A8_WGMMA_BM", W8A8_WGMMA_BM),
    ("MP_W8A8_WGMMA_BN", W8A8_WGMMA_BN),
    ("MP_W8A8_WGMMA_BK", W8A8_WGMMA_BK),
    ("MP_W8A8_WGMMA_STAGES", W8A8_WGMMA_STAGES),
    ("MP_W8A8_WGMMA_THREADS", W8A8_WGMMA_THREADS),
    ("MP_W8A8_WGMMA_PRODUCER_REGS", W8A8_WGMMA_PRODUCER_REGS),
    ("MP_W8A8_WGMMA_EPI_PAD", W8A8_WGMMA_EPI_PAD),
    ("MP_W8A8_WGMMA_CONSUMER_REGS", W8A8_WGMMA_CONSUMER_REGS),
    ("MP_W8A8_WGMMA_SMEM", W8A8_WGMMA_SMEM),
    ("MP_W8A8_WGMMA_SMALL_BM", W8A8_WGMMA_SMALL_BM),
    ("MP_DQ_WGMMA_BM", DQ_WGMMA_BM),
    ("MP_DQ_WGMMA_BN", DQ_WGMMA_BN),
    ("MP_DQ_WGMMA_STAGES", DQ_WGMMA_STAGES),
    ("MP_DQ_WGMMA_THREADS", DQ_WGMMA_THREADS),
    ("MP_DQ_WGMMA_SMEM", DQ_WGMMA_SMEM),
    ("MP_W8A8_WGMMA_SMALL_BN", W8A8_WGMMA_SMALL_BN),
    ("MP_W8A8_WGMMA_SMALL_STAGES", W8A8_WGMMA_SMALL_STAGES),
    ("MP_W8A8_WGMMA_SMALL_SMEM", W8A8_WGMMA_SMALL_SMEM),
];

/// The `#define`s prepended to every kernel module.
pub fn cuda_defines() -> String {
    let mut s = String::from("// Generated from src/gpu/sizes.rs: sizes shared with Rust.\n");
    for (name, v) in SHARED {
        s.push_str(&format!("#define {name} {v}\n"));
    }
    s
}
