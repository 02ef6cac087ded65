//! The public forward methods, the launch helper and the activation.

use super::*;

use crate::gpu::table::Call;
use crate::gpu::{DevicePtr, GpuError, GpuResult};
use crate::model::Activation;

impl DenseFfnLayer {
    /// One decode row. Returns `output` holding `[1, hidden]`.
    pub fn forward(&self, ctx: &mut ForwardContext, input: DevicePtr) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, 1)?;
        if self.w8a8.is_some() && self.fixed_w8a8_ok(ctx, 1) {
            return self.w8a8_arm(ctx, input, 1);
        }
        if self.q2.is_some() {
            return self.q2_gemv_arm(ctx, input, 1);
        }
        if self.fp8.is_some() {
            if self.gateup_fused_plan(ctx) {
                return self.fp8_fused_decode(ctx, input);
            }
            return self.fp8_arm(ctx, input, 1);
        }
        if let Some(w) = self.bf16 {
            if self.kernels.bf16_gemv.ok() {
                return self.bf16_gemv_arm(ctx, input, 1, &w);
            }
            return self.forward_prefill(ctx, input, 1);
        }
        if self.weights.nvfp4.is_some() {
            if self.single_row_w4a4(ctx) {
                return self.forward_km(ctx, input, 1);
            }
            if ctx.levers.decode_ffn_via_gemm {
                return self.forward_prefill(ctx, input, 1);
            }
            return self.nvfp4_gemv_arm(ctx, input, 1);
        }
        Err(GpuError::NotServed("forward: no weights installed".into()))
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
        if self.q2.is_some() {
            return self.forward_km_q2(ctx, input, m);
        }
        if self.w8a8.is_some() || self.fp8.is_some() || self.bf16.is_some() {
            return self.forward_prefill(ctx, input, m);
        }
        if self.weights.nvfp4.is_some() {
            if self.small_batch_w4a4(ctx) && self.can_forward_km(m) {
                return self.forward_km(ctx, input, m);
            }
            // The batch-4 GEMVs serve 2 and 3 rows (the engine's w4a16_gemv_dual_batch2|3).
            return self.nvfp4_gemv_arm(ctx, input, m);
        }
        Err(GpuError::NotServed("forward: no weights installed".into()))
    }

    /// `m` verify rows: FP8/BF16 layers go to `forward_prefill`; NVFP4 through the batch-m tier.
    pub fn forward_km(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, m)?;
        if self.fp8.is_some() || self.bf16.is_some() {
            return self.forward_prefill(ctx, input, m);
        }
        if let Some(w) = self.weights.nvfp4 {
            if self.km_w4a4(ctx, m) {
                return self.w4a4_arm(ctx, input, m);
            }
            let Some(k) = self.batchm_kernel(m) else {
                return Err(match m {
                    1..=16 => missing("ffn_nvfp4", "nvfp4_proj_small_m4|8|16"),
                    _ => GpuError::NotServed(format!(
                        "forward_km: {m} rows, the batch-m tiers serve 1..=16"
                    )),
                });
            };
            let pw = [(k, w[0]), (k, w[1]), (k, w[2])];
            return self.gated(ctx, input, m, true, &pw, Self::nvfp4_small_m_project);
        }
        Err(GpuError::NotServed(
            "forward_km: no NVFP4 or FP8 weights".into(),
        ))
    }

    /// Prefill of `num_tokens` rows. Arm order: declared W8A8 (up to `w8a8_max_rows`), packed
    /// Q2, FP8, BF16, NVFP4: the first installed serves the call.
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
        let out = if self.w8a8.is_some()
            && m <= ctx.levers.w8a8_max_rows
            && self.fixed_w8a8_ok(ctx, m)
        {
            self.w8a8_arm(ctx, input, m)
        } else if self.q2.is_some() {
            self.q2_prefill_arm(ctx, input, m)
        } else if self.fp8.is_some() {
            self.fp8_arm(ctx, input, m)
        } else if let Some(w) = self.bf16 {
            self.bf16_prefill_arm(ctx, input, m, &w)
        } else if self.weights.nvfp4.is_some() && ctx.levers.q4k_mmq && self.weights.q4k.is_some() {
            self.q4k_mmq_arm(ctx, input, m)
        } else if self.nvfp4_wgmma_ok(ctx, m) {
            self.nvfp4_wgmma_arm(ctx, input, m)
        } else if let Some(w) = self.weights.nvfp4 {
            let pw = [(0, w[0]), (1, w[1]), (2, w[2])];
            self.gated(ctx, input, m, true, &pw, Self::w4a16_prefill_gemm)
        } else if self.w8a8.is_some() {
            Err(GpuError::NotServed(format!(
                "forward_prefill: {m} rows exceed the W8A8 arm's {} and no other weights are installed",
                ctx.levers.w8a8_max_rows
            )))
        } else {
            Err(GpuError::NotServed(
                "forward_prefill: no weights installed".into(),
            ))
        }?;
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
        if self.fixed_w8a8_ok(ctx, m) {
            return self.w8a8_arm(ctx, input, m);
        }
        if self.fixed_w4a4_ok(ctx, m) {
            return self.w4a4_arm(ctx, input, m);
        }
        Err(GpuError::NotServed("forward_fixed: no fixed-quantization arm serves this layer (needs SiLU and W8A8 weights with the W8A8 kernels, or NVFP4 weights with quantize_act_nvfp4 and nvfp4_proj_mx)".into()))
    }

    // ---- arms ----

    /// Finish `call` by the kernel table (argument order, row cap, grid) and launch it on the
    /// context's stream, recording its name in the trace.
    pub(crate) fn launch(&self, ctx: &mut ForwardContext, call: Call) -> GpuResult<()> {
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
    /// place, down into `output`.
    pub(crate) fn gated<W>(
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
}
