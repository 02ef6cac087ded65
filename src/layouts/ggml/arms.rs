//! The `ggml` arms: every projection through the block-format engine's GEMV (`ggml_gemv`) over
//! q8_1 activations (`quantize_act_q8_1`), at most `GGML_GEMV_MAX_M` rows a launch; past
//! `GGML_PREFILL_MIN_ROWS` rows, each projection dequantized to BF16 (`ggml_dequant_bf16`) and
//! multiplied by the BF16 GEMM.

use crate::ffn::{Bf16Weight, DenseFfnLayer, ForwardContext, GgmlWeight, key};
use crate::gpu::sizes::{GGML_GEMV_MAX_M, GGML_PREFILL_MIN_ROWS};
use crate::gpu::{DevicePtr, GpuResult};

impl DenseFfnLayer {
    /// The gated FFN on `m` rows through the engine.
    pub(crate) fn ggml_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = *self.need(key::GGML)?;
        self.gated(ctx, x, m, false, &w, Self::ggml_project)
    }

    /// `y [m, n] = x [m, k] . w^T` (row stride `ldy`): each launch's rows quantized to q8_1,
    /// then the engine's GEMV on them.
    fn ggml_project(
        &self,
        ctx: &mut ForwardContext,
        w: &GgmlWeight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let (n, k, kp) = (w.n, w.k, w.kp);
        for r0 in (0..m).step_by(GGML_GEMV_MAX_M) {
            let rows = (m - r0).min(GGML_GEMV_MAX_M);
            let xv = x.view((r0 * k * 4) as u64, (rows * k * 4) as u64);
            let xq = self.quantize_q8_1(ctx, xv, rows, k, kp)?;
            let yv = y.view((r0 * ldy * 4) as u64, (((rows - 1) * ldy + n) * 4) as u64);
            let call = self.kernels.ggml_gemv.call().ptr("xq", xq).dim("m", rows);
            let call = call.ptr("w", w.weight).dim("ty", w.ty as u32 as usize);
            self.launch(
                ctx,
                call.ptr("y", yv).dim("n", n).dim("kp", kp).dim("ldy", ldy),
            )?;
        }
        Ok(())
    }

    /// Prefill: up to `GGML_PREFILL_MIN_ROWS - 1` rows on the engine's GEMV, more with each
    /// projection dequantized to BF16 and multiplied by the BF16 GEMM (cuBLAS; without it, the
    /// BF16 GEMV), the activations rounded to BF16.
    pub(crate) fn ggml_prefill_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        if m < GGML_PREFILL_MIN_ROWS {
            return self.ggml_arm(ctx, x, m);
        }
        let w = *self.need(key::GGML)?;
        self.gated(ctx, x, m, false, &w, Self::ggml_dequant_project)
    }

    /// `y [m, n] = bf16(x) . bf16(w)^T`: `w` dequantized into the arena's BF16 scratch.
    fn ggml_dequant_project(
        &self,
        ctx: &mut ForwardContext,
        w: &GgmlWeight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let dq = ctx.arena.dequant_bf16.view(0, (w.n * w.kp * 2) as u64);
        let call = self.kernels.ggml_dequant.call().ptr("w", w.weight);
        let call = call
            .dim("ty", w.ty as u32 as usize)
            .dim("n", w.n)
            .dim("kp", w.kp);
        self.launch(ctx, call.ptr("out", dq))?;
        let bw = Bf16Weight {
            weight: dq,
            n: w.n,
            k: w.k,
            kp: w.kp,
        };
        let xb = self.to_bf16(ctx, x, m * w.k)?;
        self.bf16_gemm_any(ctx, x, xb, &bw, m, y, ldy)
    }
}
