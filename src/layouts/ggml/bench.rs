//! The `ggml` lines of `bench-gpu`'s decode-kernel section (`check::bench_decode`): every type
//! of the engine alone on the llama-8B gate (14336 x 4096) and down (4096 x 14336) shapes at
//! m = 1, 2, 4 and 8, timed as llama.cpp's `test-backend-ops perf -o MUL_MAT` times its peer
//! (`../shared/tools/ggml-peer.sh`): the f32 activations quantized to q8_1, then the GEMV; and
//! each type's prefill dequantization to BF16.

use super::codec::TYPES;
use crate::check::bench_decode::per_call;
use crate::gpu::sizes::*;
use crate::gpu::table::Kernels;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, alloc_upload, upload_f32};
use crate::testing::*;

/// The llama-8B projection shapes `(name, n, k)`.
const SHAPES: [(&str, usize, usize); 2] = [
    ("gate 14336x4096", 14336, 4096),
    ("down 4096x14336", 4096, 14336),
];

/// Rows timed per shape.
const ROWS: [usize; 4] = [1, 2, 4, 8];

/// Push one line per (type, shape, m) and one per type's dequantization.
pub(crate) fn kernel_lines(
    b: &dyn GpuBackend,
    ceiling: f64,
    rng: &mut Rand,
    push: &mut dyn FnMut(String),
) -> GpuResult<()> {
    let ks = Kernels::resolve(b);
    if !ks.ggml_gemv.ok() || !ks.quant_q8_1.ok() {
        return Ok(());
    }
    const MAX_K: usize = 14336;
    let m_max = ROWS[ROWS.len() - 1];
    let x = b.alloc((m_max * MAX_K * 4) as u64)?;
    upload_f32(b, x, &rng.vec(m_max * MAX_K, 1.0))?;
    let xq = b.alloc((m_max * MAX_K / Q8_1_ELEMS * Q8_1_BYTES) as u64)?;
    let y = b.alloc((m_max * MAX_K * 4) as u64)?;
    let dq = b.alloc((14336 * 4096 * 2) as u64)?;
    for ty in TYPES {
        // One buffer serves both shapes: n * k is the same, and a random block is a block.
        let w = alloc_upload(b, &ggml_random_blocks(rng, ty, 4096, 14336))?;
        let bytes = w.bytes as f64;
        for (shape, n, k) in SHAPES {
            for m in ROWS {
                let call = || {
                    let q = ks.quant_q8_1.call().ptr("x", x).dim("m", m).dim("k", k);
                    q.dim("kp", k).ptr("out", xq).finish()?.run(b, 0)?;
                    let row_q8 = k / Q8_1_ELEMS * Q8_1_BYTES;
                    for r0 in (0..m).step_by(GGML_GEMV_MAX_M) {
                        let rows = (m - r0).min(GGML_GEMV_MAX_M);
                        let xv = xq.view((r0 * row_q8) as u64, (rows * row_q8) as u64);
                        let c = ks.ggml_gemv.call().ptr("xq", xv).dim("m", rows).ptr("w", w);
                        let c = c.ptr("w2", DevicePtr::NULL).dim("ty2", 0);
                        let c = c.ptr("y2", DevicePtr::NULL).dim("projs", 1);
                        let c = c
                            .dim("ty", ty as u32 as usize)
                            .ptr("y", y.view((r0 * n * 4) as u64, (rows * n * 4) as u64));
                        c.dim("n", n)
                            .dim("kp", k)
                            .dim("ldy", n)
                            .finish()?
                            .run(b, 0)?;
                    }
                    Ok(())
                };
                let t = per_call(b, call)?;
                push(format!(
                    "ggml kernel {:<7} gemv {shape} m={m} {:>7.1} us {:>6.0} GB/s {:>5.1}% of copy ceiling",
                    ty.name(),
                    t * 1e6,
                    bytes / t / 1e9,
                    100.0 * bytes / t / ceiling
                ));
            }
        }
        let (n, k) = (4096usize, 14336usize);
        let call = || {
            let c = ks
                .ggml_dequant
                .call()
                .ptr("w", w)
                .dim("ty", ty as u32 as usize);
            c.dim("n", n)
                .dim("kp", k)
                .ptr("out", dq)
                .finish()?
                .run(b, 0)
        };
        let t = per_call(b, call)?;
        let rw = bytes + (n * k * 2) as f64; // read + written
        push(format!(
            "ggml kernel {:<7} dequant_bf16 down 4096x14336 {:>7.1} us {:>6.0} GB/s read+written {:>5.1}% of copy ceiling",
            ty.name(),
            t * 1e6,
            rw / t / 1e9,
            100.0 * rw / t / ceiling
        ));
        b.free(w);
    }
    for p in [x, xq, y, dq] {
        b.free(p);
    }
    Ok(())
}
