//! The affine (`affine`) arms: the decode GEMVs (one to four rows) and the prefill through BF16.

use super::super::*;

use crate::gpu::{DevicePtr, GpuResult};

impl DenseFfnLayer {
    /// One affine projection through `affine{4,8}_gemv` (m = 1) or its batch-4 form (m <= 4).
    pub(crate) fn affine_gemv_project(
        &self,
        ctx: &mut ForwardContext,
        w: &AffineWeight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let k = &self.kernels;
        let kernel = match (w.bits, m) {
            (4, 1) => k.affine4_gemv,
            (4, _) => k.affine4_gemv_m,
            (_, 1) => k.affine8_gemv,
            _ => k.affine8_gemv_m,
        };
        let call = kernel
            .call()
            .ptr("x", x)
            .dim("m", m)
            .ptr("codes", w.codes)
            .ptr("sb", w.scales)
            .ptr("y", y);
        self.launch(ctx, w.dims(call).dim("ldy", ldy))
    }

    /// Affine decode (and 2-4 rows): gate and up GEMVs, act-mul, down GEMV.
    pub(crate) fn affine_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, x, m)?;
        let w = *self.need(key::AFFINE)?;
        self.gated(ctx, x, m, false, &w, Self::affine_gemv_project)
    }

    /// One affine projection for prefill: dequantized to BF16 `[n, kp]` into the context's
    /// scratch (`affine_dequant_bf16`, each weight rounded to nearest even), then the BF16 GEMM
    /// on the activations rounded to BF16.
    fn affine_prefill_project(
        &self,
        ctx: &mut ForwardContext,
        w: &AffineWeight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let dq = ctx
            .arena
            .q2_dequant_scratch
            .view(0, (w.n * w.kp * 2) as u64);
        let call = self.kernels.affine_dequant.call().ptr("codes", w.codes);
        let call = call.ptr("sb", w.scales).dim("n", w.n).dim("kp", w.kp);
        self.launch(ctx, call.dim("bits", w.bits as usize).ptr("out", dq))?;
        let bw = Bf16Weight {
            weight: dq,
            n: w.n,
            k: w.k,
            kp: w.kp,
        };
        let xb = self.to_bf16(ctx, x, m * w.k)?;
        self.bf16_gemm_any(ctx, x, xb, &bw, m, y, ldy)
    }

    /// Affine prefill: up to [`AFFINE_GEMV_MAX_ROWS`] rows on the GEMVs (each weight read once
    /// for every row), more with each projection dequantized to BF16 and multiplied by the BF16
    /// GEMM.
    pub(crate) fn affine_prefill_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        if m <= AFFINE_GEMV_MAX_ROWS {
            return self.affine_gemv_arm(ctx, x, m);
        }
        self.check_rows(ctx, x, m)?;
        let w = *self.need(key::AFFINE)?;
        self.gated(ctx, x, m, false, &w, Self::affine_prefill_project)
    }
}
