//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): its GEMVs to 4 rows and its dequantizing prefill, for each of its schemes.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::check::bench_decode::affine_bench_scheme;
use crate::check::bench_decode::part;
use crate::gpu::sizes::{AFFINE_GEMV_BLOCK_ROWS, AFFINE_GEMV_KS_BLOCK_ROWS, AFFINE_GROUP};
use crate::testing::*;

/// 4-bit codes and a 4-byte scale pair per 32 values.
const AFFINE4_BPE: f64 = 0.5 + 4.0 / AFFINE_GROUP as f64;
/// 8-bit codes and a 4-byte scale pair per 32 values.
const AFFINE8_BPE: f64 = 1.0 + 4.0 / AFFINE_GROUP as f64;
/// int4 g128: 4-bit codes and a 4-byte pair (half scale, half zero point) per 128.
const AFFINE4_G128_BPE: f64 = 0.5 + 4.0 / 128.0;
/// int8 per channel: 8-bit codes and one 8-byte pair a row (under 0.1%: not counted).
const AFFINE8_CHANNEL_BPE: f64 = 1.0;

/// The scheme the arm `name` times: gate and up GEMVs, then the down projection on the
/// k-split form (m = 1, one projection).
fn gemvs(name: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    let row = |k: usize| affine_bench_scheme(name, k).row_bytes(k);
    vec![
        part(i, row(h), AFFINE_GEMV_BLOCK_ROWS),
        part(i, row(h), AFFINE_GEMV_BLOCK_ROWS),
        part(h, row(i), AFFINE_GEMV_KS_BLOCK_ROWS),
    ]
}

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 7] = [
    // Integer weights carried from the source: GEMVs to 4 rows, BF16 dequantization then the BF16 GEMM.
    bench("affine 4-bit (Q4_1) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Q4_1), &[], Some(AFFINE4_BPE), true).probe(gemvs),
    bench("affine 4-bit g128 (int4, half zero points) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Int4G128), &[], Some(AFFINE4_G128_BPE), true).probe(gemvs),
    bench("affine 4-bit g128 act-order (GPTQ desc_act: activations gathered) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Int4G128Perm), &[], Some(AFFINE4_G128_BPE), true).probe(gemvs),
    bench("affine 8-bit (Q8_0) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Q8_0), &[], Some(AFFINE8_BPE), true).probe(gemvs),
    bench("affine 8-bit per channel (int8, f32 zero points) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Int8Channel), &[], Some(AFFINE8_CHANNEL_BPE), true).probe(gemvs),
    // The down input's quantization inside the gate and up launch (one row).
    bench("affine 4-bit g128 (int4, half zero points), fused down input", |b, l, w| install_affine(b, l, w, AffineKind::Int4G128), &[("METRALE_AFFINE_FUSED_ACT", "1")], Some(AFFINE4_G128_BPE), false).probe(gemvs),
    bench("affine 8-bit per channel (int8, f32 zero points), fused down input", |b, l, w| install_affine(b, l, w, AffineKind::Int8Channel), &[("METRALE_AFFINE_FUSED_ACT", "1")], Some(AFFINE8_CHANNEL_BPE), false).probe(gemvs),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 1] = [SmallArm {
    name: "affine 4-bit",
    install: |b, l, w| install_affine(b, l, w, AffineKind::Q4_1),
    levers: &[],
}];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
