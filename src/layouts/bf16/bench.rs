//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): the BF16 GEMV chain and cuBLAS prefill.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::check::bench_decode::part;
use crate::gpu::sizes::BF16_GEMV_ROWS;
use crate::testing::*;

/// The W8A8 arm serves every prefill row count timed.
const W8A8_ALL: (&str, &str) = ("METRALE_W8A8_MAX_ROWS", "4096");

/// One GEMV a projection, 2 bytes a weight.
fn gemvs(_: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    vec![
        part(i, 2 * h, BF16_GEMV_ROWS),
        part(i, 2 * h, BF16_GEMV_ROWS),
        part(h, 2 * i, BF16_GEMV_ROWS),
    ]
}

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 1] = [
    bench("bf16 GEMV chain", install_bf16, &[W8A8_ALL], Some(2.0), true).probe(gemvs),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 1] = [SmallArm {
    name: "bf16",
    install: install_bf16,
    levers: &[],
}];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
