//! The FP8 arms (W8A16 GEMV/GEMM, the fused gate+up decode) and W8A8.

use crate::ffn::*;

use crate::gpu::table::Kernel;
use crate::gpu::{DevicePtr, GpuError, GpuResult, ModelLevers};

impl DenseFfnLayer {
    /// The FP8 projection kernel for `m` rows: the first that resolved of the tensor-core GEMV
    /// (`fp8_gemv_mma_min_rows..=8` rows with `fp8_gemv_mma`), batch-4 GEMV (m <= 4),
    /// tensor-core m16 (5..=32 with `ffn_m16_tc`), batch-16 GEMV (5..=32 with
    /// `METRALE_FFN_BATCH16`), the pipelined tensor-core GEMM, the base GEMM.
    pub(crate) fn fp8_kernel_for(&self, lev: &ModelLevers, m: usize) -> GpuResult<Kernel> {
        let k = &self.kernels;
        let cap = k.fp8_mma.spec.row_cap.unwrap_or(0);
        let mma = lev.fp8_gemv_mma && (lev.fp8_gemv_mma_min_rows..=cap).contains(&m);
        Ok(if mma && k.fp8_mma.ok() {
            k.fp8_mma
        } else if m <= 4 && k.fp8_b4.ok() {
            k.fp8_b4
        } else if (5..=32).contains(&m) && lev.ffn_m16_tc && k.fp8_m16.ok() {
            k.fp8_m16
        } else if (5..=32).contains(&m) && lev.ffn_batch16 && k.fp8_b16.ok() {
            k.fp8_b16
        } else if k.fp8_pipe.ok() {
            k.fp8_pipe
        } else if k.fp8_base.ok() {
            k.fp8_base
        } else {
            return Err(k.fp8_base.missing());
        })
    }

    /// One FP8 projection `y[m, ldy] = x[m, k] . W^T`, by the routed kernel.
    pub(crate) fn fp8_project(
        &self,
        ctx: &mut ForwardContext,
        w: &Fp8Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let kernel = self.fp8_kernel_for(&ctx.levers, m)?;
        self.fp8_launch(ctx, kernel, w, x, m, y, ldy)
    }

    /// Launch FP8 projection kernel `kernel` over `m` rows (in chunks of its row cap).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fp8_launch(
        &self,
        ctx: &mut ForwardContext,
        kernel: Kernel,
        w: &Fp8Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let cap = kernel.spec.row_cap.unwrap_or(usize::MAX);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(cap);
            let xs = x.view((r0 * w.k * 4) as u64, (rows * w.k * 4) as u64);
            let ys = y.view(
                (r0 * ldy * 4) as u64,
                ((rows - 1) * ldy * 4 + w.n * 4) as u64,
            );
            let call = kernel.call().ptr("x", xs).dim("m", rows);
            let call = call.ptr("w", w.weight).ptr("s", w.scale).ptr("y", ys);
            self.launch(ctx, w.dims(call).dim("ldy", ldy))?;
            r0 += rows;
        }
        Ok(())
    }

    pub(crate) fn fp8_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        if self.fp8_w8a8_ok(ctx, m) {
            return self.fp8_w8a8_arm(ctx, x, m);
        }
        let ov = self.need(key::FP8)?;
        self.gated(
            ctx,
            x,
            m,
            false,
            &[ov.gate, ov.up, ov.down],
            Self::fp8_project,
        )
    }

    /// The down projection's input of the quantizing arms: `act(gate, up)` of the arena's gate
    /// and up outputs (`[m, inter]`) quantized by `fused` (per row or per 128-column group) into
    /// the arena's activation codes and scales, padded to `kp`.
    fn quantize_act_product(
        &self,
        ctx: &mut ForwardContext,
        fused: Kernel,
        m: usize,
        kp: usize,
    ) -> GpuResult<()> {
        let i = self.inter;
        let act = self.activation.kernel_arg();
        let (g, u) = (ctx.arena.gate_out, ctx.arena.up_out);
        let (q, s) = (ctx.arena.act_codes, ctx.arena.act_scale);
        let call = fused
            .call()
            .ptr("g", g)
            .ptr("u", u)
            .dim("gs", i)
            .dim("us", i);
        let call = call.dim("act", act).dim("m", m).dim("k", i).dim("kp", kp);
        self.launch(ctx, call.ptr("q", q).ptr("sx", s))
    }

    /// The FP8 arm runs W8A8 (lever `fp8_w8a8`, from `fp8_w8a8_min_rows` rows, the three
    /// kernels resolved, gate and up on one k).
    pub(crate) fn fp8_w8a8_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        let k = &self.kernels;
        let Some(ov) = self.get(key::FP8) else {
            return false;
        };
        ctx.levers.fp8_w8a8
            && m >= ctx.levers.fp8_w8a8_min_rows
            && k.quant_fp8_g128.ok()
            && k.quant_fp8_act_g128.ok()
            && k.fp8_wgmma.ok()
            && ov.gate.k == ov.up.k
            && ov.gate.kp == ov.up.kp
            && ov.down.k == self.inter
    }

    /// The FP8 arm's W8A8 prefill: x quantized once per 128-column group for gate and up, the
    /// activation product quantized from gate and up by one kernel, three `fp8_wgmma` GEMMs.
    fn fp8_w8a8_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let ov = self.need(key::FP8)?;
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let (q, s) = (ctx.arena.act_codes, ctx.arena.act_scale);
        let k = &self.kernels;
        let call = k
            .quant_fp8_g128
            .call()
            .ptr("x", x)
            .dim("m", m)
            .dim("k", ov.gate.k);
        self.launch(ctx, call.dim("kp", ov.gate.kp).ptr("q", q).ptr("sx", s))?;
        let gemm = |w: &Fp8Weight, y: DevicePtr, ldy: usize| {
            let call = k.fp8_wgmma.call().ptr("q", q).ptr("sx", s).dim("m", m);
            let call = call.ptr("w", w.weight).ptr("s", w.scale).ptr("y", y);
            call.dim("n", w.n).dim("kp", w.kp).dim("ldy", ldy)
        };
        self.launch(ctx, gemm(&ov.gate, g, i))?;
        self.launch(ctx, gemm(&ov.up, u, i))?;
        self.quantize_act_product(ctx, k.quant_fp8_act_g128, m, ov.down.kp)?;
        self.launch(ctx, gemm(&ov.down, out, h))?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    pub(crate) fn fp8_fused_decode(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
    ) -> GpuResult<DevicePtr> {
        let ov = self.need(key::FP8)?;
        let fused = ov
            .fused
            .ok_or_else(|| GpuError::NotServed("the fused FP8 gate+up is not installed".into()))?;
        let interp = fused.np / 2;
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        self.fp8_project(ctx, &fused, x, 1, g, 2 * interp)?;
        let up_part = g.view((interp * 4) as u64, (i * 4) as u64);
        self.act_mul(ctx, g, up_part, u, 1, i, 2 * interp, 2 * interp, i)?;
        self.fp8_project(ctx, &ov.down, u.view(0, (i * 4) as u64), 1, out, h)?;
        Ok(out.view(0, (h * 4) as u64))
    }

    /// Quantize `m` rows of `x` (`w.k` values each) to FP8 codes and row scales in the arena.
    fn w8a8_quantize(
        &self,
        ctx: &mut ForwardContext,
        w: &W8a8Weight,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<()> {
        let (q, s) = (ctx.arena.act_codes, ctx.arena.act_scale);
        let call = self.kernels.quant_fp8_row.call().ptr("x", x).dim("m", m);
        let call = call.dim("k", w.k).dim("kp", w.kp).ptr("q", q).ptr("sx", s);
        self.launch(ctx, call)
    }

    /// `y = quantized rows . w^T` over the codes [`w8a8_quantize`](Self::w8a8_quantize) left.
    fn w8a8_gemm(
        &self,
        ctx: &mut ForwardContext,
        w: &W8a8Weight,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let (q, s) = (ctx.arena.act_codes, ctx.arena.act_scale);
        // One kernel family per device for every m, so a row's bits never depend on the batch:
        // the sm_90a wgmma GEMMs where they were built (lever `w8a8_wgmma`; their two tilings
        // give the same bits), else the portable GEMM, whose decode GEMV (within its row cap,
        // with its lever) reproduces its bits.
        let k = &self.kernels;
        let (wgmma, small, gemv) = (k.w8a8_wgmma, k.w8a8_wgmma_m64, k.w8a8_gemv);
        let fits = |kernel: Kernel| kernel.spec.row_cap.is_some_and(|cap| m <= cap);
        // (Their whole 128-byte k stages cover every installed kp: sizes.rs asserts the W8A8
        // rows' alignment is a multiple.)
        let kernel = if ctx.levers.w8a8_wgmma && small.ok() && fits(small) {
            small
        } else if ctx.levers.w8a8_wgmma && wgmma.ok() {
            wgmma
        } else if ctx.levers.w8a8_decode_gemv && fits(gemv) && gemv.ok() {
            gemv
        } else {
            self.kernels.w8a8_gemm
        };
        let call = kernel.call().ptr("q", q).ptr("sx", s).dim("m", m);
        let call = call.ptr("w", w.weight).ptr("sw", w.scale).ptr("y", y);
        self.launch(ctx, call.dim("n", w.n).dim("kp", w.kp).dim("ldy", ldy))
    }

    /// One W8A8 projection: quantize `x`, then the GEMM.
    pub(crate) fn w8a8_project(
        &self,
        ctx: &mut ForwardContext,
        w: &W8a8Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        self.w8a8_quantize(ctx, w, x, m)?;
        self.w8a8_gemm(ctx, w, m, y, ldy)
    }

    /// The W8A8 layer: `x` quantized once for gate and up (same k), then the down projection on
    /// the quantized activation product: one fused kernel from gate and up where it resolved
    /// (`quantize_act_mul_fp8_row`, the same codes as act-mul then quantize, without the f32
    /// product in memory), else act-mul in place and the quantizer.
    pub(crate) fn w8a8_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = *self.need(key::W8A8)?;
        if w[0].k != w[1].k || w[0].kp != w[1].kp {
            return self.gated(ctx, x, m, false, &w, Self::w8a8_project);
        }
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        self.w8a8_quantize(ctx, &w[0], x, m)?;
        self.w8a8_gemm(ctx, &w[0], m, g, i)?;
        self.w8a8_gemm(ctx, &w[1], m, u, i)?;
        let fused = self.kernels.quant_fp8_act;
        if fused.ok() && w[2].k == i {
            self.quantize_act_product(ctx, fused, m, w[2].kp)?;
            self.w8a8_gemm(ctx, &w[2], m, out, h)?;
        } else {
            self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
            let act = g.view(0, (m * i * 4) as u64);
            self.w8a8_project(ctx, &w[2], act, m, out, h)?;
        }
        Ok(out.view(0, (m * h * 4) as u64))
    }
}
