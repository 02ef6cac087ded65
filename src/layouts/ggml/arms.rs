//! The `ggml` arms: every projection through the block-format engine's GEMV (`ggml_gemv`) over
//! q8_1 activations (`quantize_act_q8_1`), at most `GGML_GEMV_MAX_M` rows a launch.

use crate::ffn::{DenseFfnLayer, ForwardContext, GgmlWeight, key};
use crate::gpu::sizes::GGML_GEMV_MAX_M;
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
}
