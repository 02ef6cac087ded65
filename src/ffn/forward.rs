//! The public forward methods, the launch helper and the activation.

use super::*;

use crate::gpu::sizes::{Q8_1_BYTES, Q8_1_ELEMS};
use crate::gpu::table::{Call, Kernel};
use crate::gpu::{DevicePtr, GpuResult};
use crate::model::Activation;

impl DenseFfnLayer {
    /// One decode row. Returns `output` holding `[1, hidden]`. The arms it tries, in order, are
    /// the `Decode` rows of [`arms`].
    pub fn forward(&self, ctx: &mut ForwardContext, input: DevicePtr) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, 1)?;
        self.route(ctx, Method::Decode, input, 1)
    }

    /// Two rows: FP8/BF16 layers go to `forward_prefill`.
    pub fn forward_k2(&self, ctx: &mut ForwardContext, input: DevicePtr) -> GpuResult<DevicePtr> {
        self.forward_small(ctx, input, 2)
    }

    /// Three rows: FP8/BF16 layers go to `forward_prefill`.
    pub fn forward_k3(&self, ctx: &mut ForwardContext, input: DevicePtr) -> GpuResult<DevicePtr> {
        self.forward_small(ctx, input, 3)
    }

    pub(crate) fn forward_small(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, m)?;
        self.route(ctx, Method::Small, input, m)
    }

    /// `m` verify rows: FP8/BF16 layers go to `forward_prefill`; NVFP4 through the batch-m tier.
    pub fn forward_km(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, m)?;
        self.route(ctx, Method::Verify, input, m)
    }

    /// Prefill of `num_tokens` rows. Arm order: declared W8A8 (up to `w8a8_max_rows`), packed
    /// Q2, FP8, BF16, NVFP4 (the `Prefill` rows of [`arms`]): the first installed serves the call.
    pub fn forward_prefill(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        num_tokens: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, num_tokens)?;
        let t0 = if ctx.profile {
            ctx.backend.synchronize(ctx.stream)?;
            Some(std::time::Instant::now())
        } else {
            None
        };
        let m = num_tokens;
        let out = self.route(ctx, Method::Prefill, input, m)?;
        if let Some(t0) = t0 {
            ctx.backend.synchronize(ctx.stream)?;
            tracing::info!(
                "FFN prefill [dense_total] N={m}: {}µs",
                t0.elapsed().as_micros()
            );
        }
        Ok(out)
    }

    /// The same as `forward_prefill`.
    pub fn forward_batched(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        num_tokens: usize,
    ) -> GpuResult<DevicePtr> {
        self.forward_prefill(ctx, input, num_tokens)
    }

    /// The fixed `--activation-quantization` path: one activation format (per-row FP8 for W8A8,
    /// per-row NVFP4 for W4A4) at every row count, so a row's output bits do not depend on the
    /// batch.
    pub fn forward_fixed(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, m)?;
        self.route(ctx, Method::Fixed, input, m)
    }

    // ---- arms ----

    /// Finish `call` by the kernel table (argument order, row cap, grid) and launch it on the
    /// context's stream, recording its name in the trace (what a registered layout's arms
    /// launch through too).
    pub fn launch(&self, ctx: &mut ForwardContext, call: Call) -> GpuResult<()> {
        let l = call.finish()?;
        ctx.record(l.spec.name);
        l.run(ctx.backend.as_ref(), ctx.stream)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn act_mul(
        &self,
        ctx: &mut ForwardContext,
        g: DevicePtr,
        u: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
        gs: usize,
        us: usize,
        os: usize,
    ) -> GpuResult<()> {
        let k = match self.activation {
            Activation::Silu => self.kernels.act_silu,
            Activation::Gelu => self.kernels.act_gelu,
        };
        let call = k.call().ptr("g", g).ptr("u", u).ptr("out", out);
        let call = call.dim("rows", rows).dim("cols", cols);
        self.launch(ctx, call.dim("gs", gs).dim("us", us).dim("os", os))
    }

    /// The gated FFN through one projection function: gate and up into the arena, act-mul in
    /// place, down into `output` (with `lora`, the installed adapter on each projection).
    /// `project(layer, ctx, weight, x, m, y, ldy)` writes `y [m, n] = x [m, k] . w^T` with row
    /// stride `ldy`; the weights are gate, up, down.
    #[allow(clippy::type_complexity)]
    pub fn gated<W>(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        lora: bool,
        w: &[W; 3],
        project: fn(
            &Self,
            &mut ForwardContext,
            &W,
            DevicePtr,
            usize,
            DevicePtr,
            usize,
        ) -> GpuResult<()>,
    ) -> GpuResult<DevicePtr> {
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        project(self, ctx, &w[0], x, m, g, i)?;
        project(self, ctx, &w[1], x, m, u, i)?;
        if lora {
            self.apply_lora_gate_up(ctx, x, m, g, u)?;
        }
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        project(self, ctx, &w[2], act, m, out, h)?;
        if lora {
            self.apply_lora_down(ctx, act, m, out)?;
        }
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// Quantize `m` rows of `k` activations to q8_1 blocks (`quantize_act_q8_1`) into the arena.
    pub(crate) fn quantize_q8_1(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        k: usize,
        kp: usize,
    ) -> GpuResult<DevicePtr> {
        self.quantize_q8_1_by(self.kernels.quant_q8_1, ctx, x, m, (k, kp))
    }

    /// `quantize_q8_1` by the quantizer `kq` (one of the table's with its parameters: the
    /// blocks, or split).
    pub(crate) fn quantize_q8_1_by(
        &self,
        kq: Kernel,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        (k, kp): (usize, usize),
    ) -> GpuResult<DevicePtr> {
        let out = ctx
            .arena
            .act_q8_1
            .view(0, (m * kp / Q8_1_ELEMS * Q8_1_BYTES) as u64);
        let call = kq.call().ptr("x", x).dim("m", m).dim("k", k).dim("kp", kp);
        self.launch(ctx, call.ptr("out", out))?;
        Ok(out)
    }
}
