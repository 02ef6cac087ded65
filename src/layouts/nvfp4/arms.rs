//! The NVFP4 arms: W4A16 decode GEMVs and prefill GEMMs, W4A4.

use crate::ffn::*;

use crate::gpu::table::{Call, Kernel};
use crate::gpu::{DevicePtr, GpuResult};
use crate::model::Activation;

impl DenseFfnLayer {
    /// The NVFP4 prefill GEMM of projection `p`: with `nvfp4_mmq` tiles, the MMQ GEMM;
    /// otherwise with a `_t` copy, m <= 64, k % 32 == 0 and `ffn_small_m`: `w4a16_gemm_t_k64`
    /// when k >= `w4a16_k64_min_k` and k % 64 == 0, else `w4a16_gemm_t`; otherwise with a `_t`
    /// copy `w4a16_gemm_t_m128_v2` (k % 64 == 0) or `w4a16_gemm_t_m128`; without `_t` or those
    /// kernels, the base `w4a16_gemm` over the `nvfp4` layout.
    pub(crate) fn w4a16_prefill_gemm(
        &self,
        ctx: &mut ForwardContext,
        pw: &(usize, Nvfp4Weight),
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let (p, w) = *pw;
        let kk = &self.kernels;
        let np128 = w.n.div_ceil(128) * 128;
        if let Some(tiles) = self.get(key::NVFP4_MMQ).and_then(|t| t[p])
            && kk.nvfp4_mmq_gemm.ok()
        {
            let call = kk.nvfp4_mmq_gemm.call().ptr("x", x).dim("m", m);
            let call = call
                .ptr("tiles", tiles)
                .float("g", w.global_scale)
                .ptr("y", y);
            let call = w.dims(call.dim("np", np128)).dim("ldy", ldy);
            return self.launch(ctx, call);
        }
        if let Some(t) = self.get(key::NVFP4_T).and_then(|t| t[p]) {
            let lev = &ctx.levers;
            let small = m <= 64 && w.k % 32 == 0 && lev.ffn_small_m;
            let k64 = w.k % 64 == 0;
            let pick = if small {
                if k64 && w.k >= lev.w4a16_k64_min_k && kk.nvfp4_gemm_t_k64.ok() {
                    Some(kk.nvfp4_gemm_t_k64)
                } else if kk.nvfp4_gemm_t.ok() {
                    Some(kk.nvfp4_gemm_t)
                } else {
                    None
                }
            } else if k64 && kk.nvfp4_gemm_t_m128_v2.ok() {
                Some(kk.nvfp4_gemm_t_m128_v2)
            } else if w.k % 32 == 0 && kk.nvfp4_gemm_t_m128.ok() {
                Some(kk.nvfp4_gemm_t_m128)
            } else {
                None
            };
            if let Some(k) = pick {
                let call = k.call().ptr("x", x).dim("m", m).ptr("ct", t.codes);
                let call = call
                    .ptr("st", t.scales)
                    .float("g", w.global_scale)
                    .ptr("y", y);
                let call = w.dims(call.dim("np", t.np)).dim("ldy", ldy);
                return self.launch(ctx, call);
            }
        }
        self.launch(ctx, nvfp4_args(kk.nvfp4_gemm, &w, x, m, y, ldy))
    }

    /// `forward_km`'s W4A16 projection through the batch-m tier kernel it carries.
    pub(crate) fn nvfp4_small_m_project(
        &self,
        ctx: &mut ForwardContext,
        kw: &(Kernel, Nvfp4Weight),
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        self.launch(ctx, nvfp4_args(kw.0, &kw.1, x, m, y, ldy))
    }

    /// `forward_km` of an NVFP4 layer through its batch-m tier.
    pub(crate) fn nvfp4_batchm_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = *self.need(key::NVFP4)?;
        let k = self
            .batchm_kernel(m)
            .ok_or_else(|| missing("ffn_nvfp4", "nvfp4_proj_small_m4|8|16"))?;
        let pw = [(k, w[0]), (k, w[1]), (k, w[2])];
        self.gated(ctx, x, m, true, &pw, Self::nvfp4_small_m_project)
    }

    /// The NVFP4 prefill on the mma.sync GEMM.
    pub(crate) fn nvfp4_prefill_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = *self.need(key::NVFP4)?;
        let pw = [(0, w[0]), (1, w[1]), (2, w[2])];
        self.gated(ctx, x, m, true, &pw, Self::w4a16_prefill_gemm)
    }

    /// NVFP4 decode (m <= 3): fused gate+up GEMV (`w4a16_gemv_dual`, `_batch2|3`), then either
    /// act-mul and the down GEMV (split SiLU: the default, and always with GELU or a LoRA
    /// adapter; `w4a16_gemv_ksplit` when k >= `w4a16_gemv_ksplit_min_k`, a lever off by
    /// default) or, with `METRALE_FFN_SILU_FUSED_DOWN` on a SiLU layer, the SiLU-fused down GEMV.
    pub(crate) fn nvfp4_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let k = &self.kernels;
        let pick = |fixed: Kernel, base: Kernel| if fixed.ok() { fixed } else { base };
        let (dual, down) = match m {
            2 => (
                pick(k.nvfp4_gemv_dual_b2, k.nvfp4_gemv_dual),
                pick(k.nvfp4_gemv_b2, k.nvfp4_gemv),
            ),
            3 => (
                pick(k.nvfp4_gemv_dual_b3, k.nvfp4_gemv_dual),
                pick(k.nvfp4_gemv_b3, k.nvfp4_gemv),
            ),
            _ => (k.nvfp4_gemv_dual, k.nvfp4_gemv),
        };
        let w = *self.need(key::NVFP4)?;
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let call = dual.call().ptr("x", x).dim("m", m);
        let call = call.ptr("cg", w[0].codes).ptr("sg", w[0].scales);
        let call = call.float("gg", w[0].global_scale).ptr("yg", g);
        let call = call.ptr("cu", w[1].codes).ptr("su", w[1].scales);
        let call = call.float("gu", w[1].global_scale).ptr("yu", u);
        let call = call
            .dim("n", i)
            .dim("k", h)
            .dim("kp", w[0].kp)
            .dim("ldy", i);
        self.launch(ctx, call)?;
        self.apply_lora_gate_up(ctx, x, m, g, u)?;
        let d = w[2];
        if self.activation == Activation::Silu
            && ctx.levers.ffn_silu_fused_down
            && k.nvfp4_silu_down.ok()
            && !self.lora_active(ctx)
        {
            let call = k
                .nvfp4_silu_down
                .call()
                .ptr("gate", g)
                .ptr("up", u)
                .dim("m", m);
            let call = call.ptr("codes", d.codes).ptr("scales", d.scales);
            let call = call.float("g", d.global_scale).ptr("y", out);
            let call = call.dim("n", h).dim("k", i).dim("kp", d.kp);
            self.launch(ctx, call.dim("ldy", h).dim("ldx", i))?;
            return Ok(out.view(0, (m * h * 4) as u64));
        }
        if !down.ok() {
            return Err(down.missing());
        }
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        let ksplit = ctx.levers.w4a16_gemv_ksplit_min_k;
        if ksplit > 0 && d.k >= ksplit && k.nvfp4_gemv_ksplit.ok() {
            let call = nvfp4_args(k.nvfp4_gemv_ksplit, &d, act, m, out, h);
            self.launch(ctx, call)?;
        } else {
            self.launch(ctx, nvfp4_args(down, &d, act, m, out, h))?;
        }
        self.apply_lora_down(ctx, act, m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// Quantize `m` rows of `k` f32 activations to NVFP4 (`quantize_act_nvfp4`) into the arena:
    /// codes `[m, kp/2]` then scales `[m, kp/16]` in `act_codes`, globals in `act_scale`.
    pub(crate) fn quantize_nvfp4(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        k: usize,
        kp: usize,
    ) -> GpuResult<(DevicePtr, DevicePtr, DevicePtr)> {
        let qc = ctx.arena.act_codes.view(0, (m * kp / 2) as u64);
        let qs = ctx
            .arena
            .act_codes
            .view((m * kp / 2) as u64, (m * kp / 16) as u64);
        let qg = ctx.arena.act_scale.view(0, (m * 4) as u64);
        let call = self.kernels.quant_nvfp4.call().ptr("x", x).dim("m", m);
        let call = call.dim("k", k).dim("kp", kp);
        self.launch(ctx, call.ptr("qc", qc).ptr("qs", qs).ptr("qg", qg))?;
        Ok((qc, qs, qg))
    }

    /// One W4A4 projection (`nvfp4_proj_mx`) over quantized activations.
    pub(crate) fn w4a4_project(
        &self,
        ctx: &mut ForwardContext,
        q: (DevicePtr, DevicePtr, DevicePtr),
        m: usize,
        w: &Nvfp4Weight,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let call = self.kernels.nvfp4_proj_mx.call();
        let call = call
            .ptr("qc", q.0)
            .ptr("qs", q.1)
            .ptr("qg", q.2)
            .dim("m", m);
        let call = call.ptr("codes", w.codes).ptr("scales", w.scales);
        let call = call.float("gw", w.global_scale).ptr("y", y);
        self.launch(ctx, call.dim("n", w.n).dim("kp", w.kp).dim("ldy", ldy))
    }

    /// The GPU check's view of the W4A4 gate projection: quantize `m` rows of `x` and run
    /// `nvfp4_proj_mx` over the gate weight into `y` (`[m, inter]`); returns the quantized
    /// activations (codes, scales, globals) in the arena.
    #[doc(hidden)]
    pub fn w4a4_gate_for_check(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
    ) -> GpuResult<(DevicePtr, DevicePtr, DevicePtr)> {
        let w = *self.need(key::NVFP4)?;
        let q = self.quantize_nvfp4(ctx, x, m, self.hidden, w[0].kp)?;
        self.w4a4_project(ctx, q, m, &w[0], y, self.inter)?;
        Ok(q)
    }

    /// The W4A4 arm: NVFP4 activations into gate and up (one quantization shared), act-mul,
    /// NVFP4 activations into down. Every row is quantized and reduced on its own, in the same
    /// order at every m.
    pub(crate) fn w4a4_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = *self.need(key::NVFP4)?;
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let q = self.quantize_nvfp4(ctx, x, m, h, w[0].kp)?;
        self.w4a4_project(ctx, q, m, &w[0], g, i)?;
        self.w4a4_project(ctx, q, m, &w[1], u, i)?;
        self.apply_lora_gate_up(ctx, x, m, g, u)?;
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        let q = self.quantize_nvfp4(ctx, act, m, i, w[2].kp)?;
        self.w4a4_project(ctx, q, m, &w[2], out, h)?;
        self.apply_lora_down(ctx, act, m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }
}

/// The arguments of an NVFP4 projection kernel over the `nvfp4` layout (`x, m, codes, scales,
/// g, y, n, k, kp, ldy`: the GEMVs, the batch-m tiers, `w4a16_gemm`).
pub(crate) fn nvfp4_args(
    k: Kernel,
    w: &Nvfp4Weight,
    x: DevicePtr,
    m: usize,
    y: DevicePtr,
    ldy: usize,
) -> Call {
    let call = k.call().ptr("x", x).dim("m", m);
    let call = call.ptr("codes", w.codes).ptr("scales", w.scales);
    w.dims(call.float("g", w.global_scale).ptr("y", y))
        .dim("ldy", ldy)
}
