//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): the FP8 GEMV chains (fused gate+up or not) and its prefills.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::check::bench_decode::part;
use crate::gpu::sizes::FP8_GEMV_ROWS;
use crate::testing::*;

/// FP8: 1 byte and a scale per 128x128 block.
pub(crate) const FP8_BPE: f64 = 1.0 + 4.0 / 16384.0;
/// The W8A8 arm serves every prefill row count timed.
pub(crate) const W8A8_ALL: (&str, &str) = ("METRALE_W8A8_MAX_ROWS", "4096");

/// The fused gate+up GEMV (2 x n rows), then the down GEMV.
fn fused(_: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    vec![part(2 * i, h, FP8_GEMV_ROWS), part(h, i, FP8_GEMV_ROWS)]
}

/// One GEMV a projection.
fn unfused(_: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    vec![
        part(i, h, FP8_GEMV_ROWS),
        part(i, h, FP8_GEMV_ROWS),
        part(h, i, FP8_GEMV_ROWS),
    ]
}

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 5] = [
    bench("fp8 fused gate+up GEMV chain", |b, l, w| install_fp8(b, l, w, true), &[W8A8_ALL], Some(FP8_BPE), false).probe(fused),
    // The decode default before session 17: the f32 FFMA GEMV for 1..4 rows.
    bench("fp8 fused gate+up, FFMA GEMVs", |b, l, w| install_fp8(b, l, w, true), &[W8A8_ALL, ("METRALE_FP8_GEMV_MMA", "0")], Some(FP8_BPE), false).probe(fused),
    // The tensor-core GEMV from one row (1..8 rows; W8A8 from 9).
    bench("fp8 fused gate+up, tensor-core GEMV from 1 row", |b, l, w| install_fp8(b, l, w, true), &[W8A8_ALL, ("METRALE_FP8_GEMV_MMA_MIN_ROWS", "1"), ("METRALE_FP8_W8A8_MIN_ROWS", "9")], Some(FP8_BPE), false).probe(fused),
    // Prefill from fp8_w8a8_min_rows rows: the W8A8 GEMM (per-group FP8 activations, fp8_wgmma).
    bench("fp8 GEMV / W8A8 prefill", |b, l, w| install_fp8(b, l, w, false), &[W8A8_ALL], Some(FP8_BPE), true).probe(unfused),
    // The w8a16 contract: bf16 activations, the mma.sync GEMMs.
    bench("fp8 w8a16 (mma.sync prefill)", |b, l, w| install_fp8(b, l, w, false), &[W8A8_ALL, ("METRALE_FP8_W8A8", "0")], Some(FP8_BPE), true).probe(unfused),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 1] = [SmallArm {
    name: "fp8 fused gate+up",
    install: |b, l, w| install_fp8(b, l, w, true),
    levers: &[],
}];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
