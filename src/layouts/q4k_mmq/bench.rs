//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): the Q4_K MMQ prefills beside the NVFP4 base, and its own GEMV chains.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::check::bench_decode::part;
use crate::gpu::sizes::{INT8_GEMV_ROWS, Q4K_BYTES, Q4K_ELEMS, Q4K_GEMV_ROWS};
use crate::testing::*;

/// Q4_K bytes per element (the int8 down adds its row scales, under 0.1%: not counted).
const Q4K_BPE: f64 = Q4K_BYTES as f64 / Q4K_ELEMS as f64;

/// A Q4_K row of `k` values, in bytes.
fn q4k(k: usize) -> usize {
    k / Q4K_ELEMS * Q4K_BYTES
}

/// The Q4_K GEMVs of gate and up, then the int8 down's.
fn int8_down(_: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    vec![
        part(i, q4k(h), Q4K_GEMV_ROWS),
        part(i, q4k(h), Q4K_GEMV_ROWS),
        part(h, i, INT8_GEMV_ROWS),
    ]
}

/// Three Q4_K GEMVs.
fn q4k_down(_: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    vec![
        part(i, q4k(h), Q4K_GEMV_ROWS),
        part(i, q4k(h), Q4K_GEMV_ROWS),
        part(h, q4k(i), Q4K_GEMV_ROWS),
    ]
}

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 5] = [
    bench("Q4_K MMQ (wgmma, int8 down)", |b, l, w| install_nvfp4_q4k(b, l, w, false), &[("METRALE_Q4K_MMQ", "1")], None, true),
    bench("Q4_K MMQ (wgmma, Q4_K down)", |b, l, w| install_nvfp4_q4k(b, l, w, true), &[("METRALE_Q4K_MMQ", "1")], None, true),
    bench("Q4_K MMQ (mma.sync, int8 down)", |b, l, w| install_nvfp4_q4k(b, l, w, false), &[("METRALE_Q4K_MMQ", "1"), ("METRALE_DQ_WGMMA", "0")], None, true),
    bench("q4k GEMV chain (int8 down)", |b, l, w| install_q4k(b, l, w, false), &[], Some((2.0 * Q4K_BPE + 1.0) / 3.0), false).probe(int8_down),
    bench("q4k GEMV chain (Q4_K down)", |b, l, w| install_q4k(b, l, w, true), &[], Some(Q4K_BPE), false).probe(q4k_down),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 0] = [];

/// Its kernel lines: none of its own.
pub(crate) static KERNELS: &[KernelLines] = &[];
