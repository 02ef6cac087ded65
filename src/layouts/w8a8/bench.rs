//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): the W8A8 arm (activations quantized, then the wgmma or mma.sync GEMM).

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::testing::*;

/// The W8A8 arm serves every prefill row count timed.
const ALL: (&str, &str) = ("METRALE_W8A8_MAX_ROWS", "4096");

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 2] = [
    bench("w8a8 (quantize + wgmma GEMM)", install_w8a8, &[ALL], Some(1.0), true),
    bench("w8a8 portable (mma.sync GEMM)", install_w8a8, &[ALL, ("METRALE_W8A8_WGMMA", "0")], Some(1.0), true),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 1] = [SmallArm {
    name: "w8a8",
    install: install_w8a8,
    levers: &[],
}];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
