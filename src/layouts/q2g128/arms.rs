//! The q2g128 (`q2g128`) arms: GEMV decode, q8_1 MMQ and dequantize-then-cuBLAS prefill.

use crate::ffn::*;

use crate::converters::layouts::Layout;
use crate::gpu::table::Kernel;
use crate::gpu::{DevicePtr, GpuError, GpuResult};
use crate::model::Activation;

impl DenseFfnLayer {
    /// One q2g128 projection through `q2g128_gemv` (m = 1) or `q2g128_gemv_batchm`.
    pub(crate) fn q2_gemv_project(
        &self,
        ctx: &mut ForwardContext,
        w: &Q2g128Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let k = if m == 1 {
            self.kernels.q2_gemv
        } else {
            self.kernels.q2_gemv_m
        };
        let call = k
            .call()
            .ptr("x", x)
            .dim("m", m)
            .ptr("w", w.blocks)
            .ptr("y", y);
        self.launch(ctx, w.dims(call).dim("ldy", ldy))
    }

    /// q2g128 decode: gate and up GEMVs, act-mul, down GEMV.
    pub(crate) fn q2_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = *self.need(key::Q2G128)?;
        self.gated(ctx, x, m, false, &w, Self::q2_gemv_project)
    }

    /// `forward_km_q2`: 2 and 3 rows (up to 4) through `q2g128_gemv_batchm`.
    pub fn forward_km_q2(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, x, m)?;
        if !self.holds(Layout::Q2g128) {
            return Err(GpuError::NotServed(
                "forward_km_q2: no q2g128 weights".into(),
            ));
        }
        if m > 4 {
            return Err(GpuError::NotServed(format!(
                "forward_km_q2: {m} rows, q2g128_gemv_batchm serves 1..=4"
            )));
        }
        let w = *self.need(key::Q2G128)?;
        self.gated(ctx, x, m, false, &w, Self::q2_gemv_project)
    }

    /// q2g128 prefill, SiLU only: with `METRALE_Q2G128_MMQ=1` and both kernels
    /// resolved (every group is 128 in `q2g128`), the Q2 MMQ GEMM, gate and up sharing one q8_1
    /// quantization of the input and down quantizing the activation; otherwise each projection
    /// dequantized to BF16 into one shared scratch and multiplied by the BF16 GEMM, each
    /// dequant and its GEMM on the stream before the next.
    pub(crate) fn q2_prefill_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        if self.activation != Activation::Silu {
            return Err(GpuError::NotServed(
                "q2g128 prefill serves SiLU layers only; this layer is GELU".into(),
            ));
        }
        let w = *self.need(key::Q2G128)?;
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let k = &self.kernels;
        if ctx.levers.q2g128_mmq {
            for need in [k.quant_q8_1, k.q2_mmq] {
                if !need.ok() {
                    return Err(need.missing());
                }
            }
            let xq = self.quantize_q8_1(ctx, x, m, h, w[0].kp)?;
            let q2 = k.q2_mmq;
            self.mmq_q8_1_launch(ctx, q2, xq, m, w[0].blocks, i, w[0].kp, g, i)?;
            self.mmq_q8_1_launch(ctx, q2, xq, m, w[1].blocks, i, w[1].kp, u, i)?;
            self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
            let aq = self.quantize_q8_1(ctx, g.view(0, (m * i * 4) as u64), m, i, w[2].kp)?;
            self.mmq_q8_1_launch(ctx, q2, aq, m, w[2].blocks, h, w[2].kp, out, h)?;
            return Ok(out.view(0, (m * h * 4) as u64));
        }
        if !k.q2_dequant.ok() {
            return Err(k.q2_dequant.missing());
        }
        let scratch = ctx.arena.dequant_bf16;
        let project = |l: &Self,
                       c: &mut ForwardContext,
                       w: &Q2g128Weight,
                       xf: DevicePtr,
                       xb: DevicePtr,
                       y: DevicePtr,
                       ldy: usize|
         -> GpuResult<()> {
            let dq = scratch.view(0, (w.n * w.kp * 2) as u64);
            let call = l.kernels.q2_dequant.call().ptr("w", w.blocks);
            l.launch(c, call.dim("n", w.n).dim("kp", w.kp).ptr("out", dq))?;
            let bw = Bf16Weight {
                weight: dq,
                n: w.n,
                k: w.k,
                kp: w.kp,
            };
            l.bf16_gemm_any(c, xf, xb, &bw, m, y, ldy)
        };
        let xb = self.to_bf16(ctx, x, m * h)?;
        project(self, ctx, &w[0], x, xb, g, i)?;
        project(self, ctx, &w[1], x, xb, u, i)?;
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        let ab = self.to_bf16(ctx, act, m * i)?;
        project(self, ctx, &w[2], act, ab, out, h)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// One MMQ projection over q8_1 activation blocks (`q2g128_mmq_gemm`, `q4k_mmq_gemm`: the
    /// int8 tensor-core tile of kernels/common.cuh, arguments `(xq, m, w, y, n, kp, ldy)`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mmq_q8_1_launch(
        &self,
        ctx: &mut ForwardContext,
        kernel: Kernel,
        xq: DevicePtr,
        m: usize,
        w: DevicePtr,
        n: usize,
        kp: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let call = kernel
            .call()
            .ptr("xq", xq)
            .dim("m", m)
            .ptr("w", w)
            .ptr("y", y);
        self.launch(ctx, call.dim("n", n).dim("kp", kp).dim("ldy", ldy))
    }
}
