//! The BF16 arms: the batch-4 GEMV and the cuBLAS GEMM.

use crate::ffn::*;

use crate::gpu::table::Kernel;
use crate::gpu::{DevicePtr, GemmBf16, GpuError, GpuResult};

impl DenseFfnLayer {
    pub(crate) fn bf16_gemv(
        &self,
        ctx: &mut ForwardContext,
        w: &Bf16Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let call = self.kernels.bf16_gemv.call().ptr("x", x).dim("m", m);
        let call = call.ptr("w", w.weight).ptr("y", y);
        self.launch(ctx, w.dims(call).dim("ldy", ldy))
    }

    pub(crate) fn bf16_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = self.need(key::BF16)?;
        self.gated(ctx, x, m, false, w, Self::bf16_gemv)
    }

    /// `y = x . W^T` for a BF16 weight in the arena's dequantization scratch: cuBLAS when the
    /// backend has it, else the BF16 GEMV four rows at a time.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bf16_gemm_any(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        xb: DevicePtr,
        w: &Bf16Weight,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let r = ctx.backend.gemm_bf16(
            &GemmBf16 {
                x: xb,
                w: w.weight,
                y,
                m,
                n: w.n,
                k: w.k,
                kw: w.kp,
            },
            ctx.stream,
        );
        match r {
            Ok(()) => {
                ctx.record("cublas_gemm_bf16");
                Ok(())
            }
            Err(GpuError::MissingKernel { .. }) => {
                if !self.kernels.bf16_gemv.ok() {
                    return Err(missing(
                        "cublas",
                        "gemm_bf16 (and ffn_bf16::bf16_gemv_batch4)",
                    ));
                }
                for r0 in (0..m).step_by(4) {
                    let rows = 4.min(m - r0);
                    let xv = x.view((r0 * w.k * 4) as u64, (rows * w.k * 4) as u64);
                    let yv = y.view((r0 * ldy * 4) as u64, (rows * ldy * 4) as u64);
                    self.bf16_gemv(ctx, w, xv, rows, yv, ldy)?;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn to_bf16(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        count: usize,
    ) -> GpuResult<DevicePtr> {
        self.bf16_into_arena(ctx, self.kernels.to_bf16, x, count)
    }

    /// `count` f32 values at `x` through the conversion `kernel` (`f32_to_bf16` or its il8
    /// order) into the arena's bf16 buffer.
    pub(crate) fn bf16_into_arena(
        &self,
        ctx: &mut ForwardContext,
        kernel: Kernel,
        x: DevicePtr,
        count: usize,
    ) -> GpuResult<DevicePtr> {
        let dst = ctx.arena.act_bf16.view(0, (count * 2) as u64);
        let call = kernel.call().ptr("x", x).ptr("y", dst);
        self.launch(ctx, call.dim("count", count))?;
        Ok(dst)
    }

    pub(crate) fn bf16_prefill_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = self.need(key::BF16)?;
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let xb = self.to_bf16(ctx, x, m * h)?;
        let st = ctx.stream;
        let blas = ctx.backend.gemm_bf16(
            &GemmBf16 {
                x: xb,
                w: w[0].weight,
                y: g,
                m,
                n: i,
                k: h,
                kw: w[0].kp,
            },
            st,
        );
        if let Err(GpuError::MissingKernel { .. }) = blas {
            // No BLAS: the GEMV serves narrow batches, nothing else can.
            if m <= 4 && self.kernels.bf16_gemv.ok() {
                return self.bf16_gemv_arm(ctx, x, m);
            }
            return Err(missing("cublas", "gemm_bf16"));
        }
        blas?;
        ctx.record("cublas_gemm_bf16");
        ctx.backend.gemm_bf16(
            &GemmBf16 {
                x: xb,
                w: w[1].weight,
                y: u,
                m,
                n: i,
                k: h,
                kw: w[1].kp,
            },
            st,
        )?;
        ctx.record("cublas_gemm_bf16");
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let gb = self.to_bf16(ctx, g, m * i)?;
        ctx.backend.gemm_bf16(
            &GemmBf16 {
                x: gb,
                w: w[2].weight,
                y: out,
                m,
                n: h,
                k: i,
                kw: w[2].kp,
            },
            st,
        )?;
        ctx.record("cublas_gemm_bf16");
        Ok(out.view(0, (m * h * 4) as u64))
    }
}
