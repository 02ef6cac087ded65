//! The dequantizing wgmma prefill (sm_90a `nvfp4_wgmma`, `q4k_wgmma`): NVFP4 MMQ tiles or Q4_K
//! rows decoded to bf16 on the way to the tensor cores, bf16 activations (formats.md, "The
//! dequantizing wgmma GEMMs"), and the Q4_K arm's int8 down on `int8_wgmma`.

use super::super::*;

use crate::gpu::table::Kernel;
use crate::gpu::{DevicePtr, GpuResult};
use crate::model::Activation;

impl DenseFfnLayer {
    /// Whether the dequantizing GEMM `kernel` serves `m` rows: lever `dq_wgmma` from
    /// `dq_wgmma_min_rows`, the kernel and the bf16 activation kernels built, and both k a
    /// multiple of 8 (the activations' tensor map needs 16-byte rows).
    pub(crate) fn dq_wgmma_ok(&self, ctx: &ForwardContext, kernel: Kernel, m: usize) -> bool {
        let k = &self.kernels;
        ctx.levers.dq_wgmma
            && m >= ctx.levers.dq_wgmma_min_rows
            && kernel.ok()
            && k.to_bf16_il8.ok()
            && k.act_silu_il8.ok()
            && k.act_gelu_il8.ok()
            && self.hidden.is_multiple_of(8)
            && self.inter.is_multiple_of(8)
    }

    /// `count` f32 values at `x` as bf16 in the il8 order (`f32_to_bf16_il8`) in the arena.
    pub(crate) fn to_bf16_il8(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        count: usize,
    ) -> GpuResult<DevicePtr> {
        self.bf16_into_arena(ctx, self.kernels.to_bf16_il8, x, count)
    }

    /// The down GEMM's input, bf16 `[m, inter]` in the il8 order in the arena: the activation
    /// product of gate and up rounded by `act_mul_*_il8`; with a LoRA adapter the f32 product
    /// into `gate_out` first (its down delta reads it), then rounded.
    pub(crate) fn dq_down_input(&self, ctx: &mut ForwardContext, m: usize) -> GpuResult<DevicePtr> {
        let i = self.inter;
        let (g, u) = (ctx.arena.gate_out, ctx.arena.up_out);
        if self.lora_active(ctx) {
            self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
            return self.to_bf16_il8(ctx, g, m * i);
        }
        let kernel = match self.activation {
            Activation::Silu => self.kernels.act_silu_il8,
            Activation::Gelu => self.kernels.act_gelu_il8,
        };
        let dst = ctx.arena.act_bf16.view(0, (m * i * 2) as u64);
        let call = kernel.call().ptr("g", g).ptr("u", u).ptr("out", dst);
        let call = call.dim("rows", m).dim("cols", i);
        self.launch(ctx, call.dim("gs", i).dim("us", i).dim("os", i))?;
        Ok(dst)
    }

    /// Whether the NVFP4 prefill runs on `nvfp4_wgmma`: all three projections have `nvfp4_mmq`
    /// tiles and [`dq_wgmma_ok`](Self::dq_wgmma_ok).
    pub(crate) fn nvfp4_wgmma_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        self.holds(Layout::Nvfp4)
            && self
                .get(key::NVFP4_MMQ)
                .is_some_and(|t| t.iter().all(Option::is_some))
            && self.dq_wgmma_ok(ctx, self.kernels.nvfp4_wgmma, m)
    }

    /// The NVFP4 MMQ prefill on the tensor-core path: x to il8 bf16 once, gate and up through
    /// `nvfp4_wgmma`, LoRA, the bf16 activation product, down through `nvfp4_wgmma`.
    pub(crate) fn nvfp4_wgmma_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = *self.need(key::NVFP4)?;
        let Some(&[Some(t0), Some(t1), Some(t2)]) = self.get(key::NVFP4_MMQ) else {
            return Err(GpuError::NotServed(
                "nvfp4_wgmma: no nvfp4_mmq tiles for every projection".into(),
            ));
        };
        let tiles = [t0, t1, t2];
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let kernel = self.kernels.nvfp4_wgmma;
        let gemm = |p: usize, xb: DevicePtr, y: DevicePtr, ldy: usize| {
            let wp = &w[p];
            let call = kernel
                .call()
                .ptr("x", xb)
                .dim("m", m)
                .ptr("tiles", tiles[p]);
            let call = call.float("g", wp.global_scale).ptr("y", y);
            let call = call.dim("n", wp.n).dim("np", wp.n.div_ceil(128) * 128);
            call.dim("k", wp.k).dim("kp", wp.kp).dim("ldy", ldy)
        };
        let xb = self.to_bf16_il8(ctx, x, m * h)?;
        self.launch(ctx, gemm(0, xb, g, i))?;
        self.launch(ctx, gemm(1, xb, u, i))?;
        self.apply_lora_gate_up(ctx, x, m, g, u)?;
        let ab = self.dq_down_input(ctx, m)?;
        self.launch(ctx, gemm(2, ab, out, h))?;
        self.apply_lora_down(ctx, g.view(0, (m * i * 4) as u64), m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// One Q4_K projection on `q4k_wgmma`: `y [m, n] = x [m, k] . w^T`, x il8 bf16.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn q4k_wgmma_project(
        &self,
        ctx: &mut ForwardContext,
        xb: DevicePtr,
        m: usize,
        k: usize,
        kp: usize,
        w: DevicePtr,
        n: usize,
        y: DevicePtr,
    ) -> GpuResult<()> {
        let call = self.kernels.q4k_wgmma.call().ptr("x", xb).dim("m", m);
        let call = call.ptr("w", w).ptr("y", y).dim("n", n).dim("k", k);
        self.launch(ctx, call.dim("kp", kp).dim("ldy", n))
    }
}
