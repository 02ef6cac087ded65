//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): the `_t` prefill GEMMs.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::testing::*;

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 1] = [
    bench("nvfp4 _t GEMMs", install_nvfp4_t, &[], None, true),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 0] = [];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
