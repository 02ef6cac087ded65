//! Its block and tile sizes, shared by Rust and its CUDA module: re-exported by `gpu::sizes`,
//! and [`DEFINES`] are its `#define MP_*` lines (`gpu::sizes::cuda_defines`).

/// Its sizes, by the name the kernels see.
pub const DEFINES: &[(&str, usize)] = &[
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
    ("MP_W8A8_WGMMA_SMALL_BN", W8A8_WGMMA_SMALL_BN),
    ("MP_W8A8_WGMMA_SMALL_STAGES", W8A8_WGMMA_SMALL_STAGES),
    ("MP_W8A8_WGMMA_SMALL_SMEM", W8A8_WGMMA_SMALL_SMEM),
];

use consts::*;

/// The sizes (`gpu::sizes` re-exports these, not [`DEFINES`]).
pub mod consts {
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
        W8A8_WGMMA_SMALL_STAGES * (W8A8_WGMMA_SMALL_BM + W8A8_WGMMA_SMALL_BN) * W8A8_WGMMA_BK
            + 1024;

    /// Threads per block of the FP8 activation quantizers (`quantize_act_fp8_row`,
    /// `quantize_act_mul_fp8_row`): few rows in flight, so a row's second read comes from L2.
    pub const FP8_QUANT_THREADS: usize = 1024;
}

const _: () =
    assert!(W8A8_WGMMA_BK == 128 && W8A8_WGMMA_BM.is_multiple_of(64) && W8A8_WGMMA_BM <= 256);
// Every installed W8A8 weight's kp is a multiple of the layout's K_ALIGN (`W8a8Weight::validate`),
// so whole stages of BK cover it.
const _: () = assert!(crate::converters::layouts::w8a8::K_ALIGN.is_multiple_of(W8A8_WGMMA_BK));
// Hopper gives a block at most 227 KiB of shared memory; the decode tiling wants two blocks.
const _: () = assert!(W8A8_WGMMA_SMEM <= 227 << 10 && 2 * W8A8_WGMMA_SMALL_SMEM <= 227 << 10);
