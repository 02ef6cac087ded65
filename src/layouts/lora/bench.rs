//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): none (its adapter rides on the NVFP4 arms).

use crate::check::bench::{BenchArm, KernelLines, SmallArm};

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 0] = [
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 0] = [];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
