//! The affine (`affine`) arms: the decode GEMVs (one to sixteen rows, over activations
//! quantized to int8 per group) and the prefill through BF16.

use crate::ffn::*;

use crate::gpu::{DevicePtr, GemmBf16, GpuError, GpuResult};
use crate::model::Activation;

impl DenseFfnLayer {
    /// The affine kernels' `act` argument for this layer's act-mul: 1 SiLU, 2 GELU.
    fn affine_act(&self) -> usize {
        match self.activation {
            Activation::Silu => 1,
            Activation::Gelu => 2,
        }
    }

    /// The affine GEMVs' activations: `x`'s `m` rows (or with `act` 1 or 2, SiLU or GELU of `x`
    /// times `u`), `k` values at row stride `ld`, quantized for `w` (`affine_quantize_act`,
    /// gathered through `w`'s column permutation if it has one) into the context's
    /// `act_codes` and `act_scale`.
    #[allow(clippy::too_many_arguments)]
    fn affine_quantize(
        &self,
        ctx: &mut ForwardContext,
        w: &AffineWeight,
        x: DevicePtr,
        u: DevicePtr,
        act: usize,
        m: usize,
        ld: usize,
    ) -> GpuResult<()> {
        let call = self.kernels.affine_quant.call().ptr("x", x).ptr("u", u);
        let call = call.dim("act", act).dim("m", m).dim("k", w.k).dim("ld", ld);
        let call = call.dim("kp", w.kp).dim("bits", w.scheme.bits as usize);
        let (xq, xs) = (ctx.arena.act_codes, ctx.arena.act_scale);
        self.launch(ctx, call.ptr("xq", xq).ptr("xs", xs).ptr("perm", w.perm))
    }

    /// One affine projection (`w` into `y`), or two over the same activations in one launch
    /// (gate and up, `also`), of the activations [`Self::affine_quantize`] left, through
    /// `affine{4,8}_gemv` (m = 1) or its batch-4 or batch-16 form; outputs at row stride `ldy`.
    fn affine_gemv(
        &self,
        ctx: &mut ForwardContext,
        (w, y): (&AffineWeight, DevicePtr),
        also: Option<(&AffineWeight, DevicePtr)>,
        m: usize,
        ldy: usize,
    ) -> GpuResult<()> {
        let acts = (ctx.arena.act_codes, ctx.arena.act_scale);
        self.affine_gemv_of(ctx, acts, (w, y), also, m, ldy)
    }

    /// [`Self::affine_gemv`] over the activation codes and scales `(xq, xs)`.
    fn affine_gemv_of(
        &self,
        ctx: &mut ForwardContext,
        (xq, xs): (DevicePtr, DevicePtr),
        (w, y): (&AffineWeight, DevicePtr),
        also: Option<(&AffineWeight, DevicePtr)>,
        m: usize,
        ldy: usize,
    ) -> GpuResult<()> {
        let k = &self.kernels;
        // One projection of one row: k split across a block's warps (the down projection's few
        // rows give the one-warp form too few warps to keep the memory busy).
        let kernel = match (w.scheme.bits, m) {
            (4, 1) if also.is_none() => k.affine4_gemv_ks,
            (_, 1) if also.is_none() => k.affine8_gemv_ks,
            (4, 1) => k.affine4_gemv,
            (4, 2..=4) => k.affine4_gemv_m,
            (4, _) => k.affine4_gemv_m16,
            (_, 1) => k.affine8_gemv,
            (_, 2..=4) => k.affine8_gemv_m,
            _ => k.affine8_gemv_m16,
        };
        let (u, yu) = also.unwrap_or((w, y));
        let call = kernel.call().ptr("xq", xq).ptr("xs", xs).dim("m", m);
        let call = call.ptr("cg", w.codes).ptr("sg", w.scales).ptr("yg", y);
        let call = call.ptr("cu", u.codes).ptr("su", u.scales).ptr("yu", yu);
        let call = call.dim("projs", 1 + also.is_some() as usize).dim("n", w.n);
        let call = call.dim("form", w.scheme.form as usize);
        let call = call.dim("gshift", w.scheme.group_shift(w.kp) as usize);
        self.launch(ctx, call.dim("kp", w.kp).dim("ldy", ldy))
    }

    /// Gate and up of one row in one launch (`affine{4,8}_gemv_act`) into the arena's gate and
    /// up outputs, with the act-mul (`act` 1 SiLU, 2 GELU) quantized for `d` inside it: the
    /// down input's codes and scales (in the arena's `act_down`).
    fn affine_gate_up_act(
        &self,
        ctx: &mut ForwardContext,
        [g, u, d]: [&AffineWeight; 3],
        act: usize,
    ) -> GpuResult<(DevicePtr, DevicePtr)> {
        let (go, uo) = (ctx.arena.gate_out, ctx.arena.up_out);
        let (dq, ds, cnt) = ctx.arena.act_down_parts(d.kp);
        let k = &self.kernels;
        let kernel = if g.scheme.bits == 4 {
            k.affine4_gemv_act
        } else {
            k.affine8_gemv_act
        };
        let (xq, xs) = (ctx.arena.act_codes, ctx.arena.act_scale);
        let call = kernel.call().ptr("xq", xq).ptr("xs", xs).dim("m", 1);
        let call = call.ptr("cg", g.codes).ptr("sg", g.scales).ptr("yg", go);
        let call = call.ptr("cu", u.codes).ptr("su", u.scales).ptr("yu", uo);
        let call = call.dim("n", g.n).dim("kp", g.kp);
        let call = call.dim("form", g.scheme.form as usize);
        let call = call.dim("gshift", g.scheme.group_shift(g.kp) as usize);
        let call = call
            .dim("act", act)
            .ptr("dq", dq)
            .ptr("ds", ds)
            .dim("kpd", d.kp);
        let call = call.dim("bitsd", d.scheme.bits as usize).ptr("cnt", cnt);
        self.launch(ctx, call)?;
        Ok((dq, ds))
    }

    /// Affine decode (and up to [`AFFINE_GEMV_MAX_ROWS`] rows): the input quantized once for
    /// gate and up and their GEMVs in one launch (two, if up's scheme is not gate's, with the
    /// input quantized again for other bits), the act-mul fused into the down input's
    /// quantization (with the lever `affine_fused_act`, for one row and a down projection
    /// without act-order, inside the gate and up launch), the down GEMV.
    pub(crate) fn affine_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, x, m)?;
        let [g, u, d] = *self.need(key::AFFINE)?;
        let (h, i) = (self.hidden, self.inter);
        let (go, uo, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        self.affine_quantize(ctx, &g, x, x, 0, m, h)?;
        // Act-order weights gather their activations: gate's serve up only through the same
        // permutation (the install shares one buffer where the converter found them equal).
        let same_perm = u.perm == g.perm;
        let act = self.affine_act();
        let dual = u.scheme == g.scheme && u.kp == g.kp && same_perm;
        if m == 1 && dual && d.perm.is_null() && d.k == i && ctx.levers.affine_fused_act {
            // One row: the down input quantized inside the gate and up launch.
            let (dq, ds) = self.affine_gate_up_act(ctx, [&g, &u, &d], act)?;
            self.affine_gemv_of(ctx, (dq, ds), (&d, out), None, m, h)?;
            return Ok(out.view(0, (m * h * 4) as u64));
        }
        if dual {
            self.affine_gemv(ctx, (&g, go), Some((&u, uo)), m, i)?;
        } else {
            self.affine_gemv(ctx, (&g, go), None, m, i)?;
            if u.scheme.bits != g.scheme.bits || !same_perm {
                self.affine_quantize(ctx, &u, x, x, 0, m, h)?;
            }
            self.affine_gemv(ctx, (&u, uo), None, m, i)?;
        }
        self.affine_quantize(ctx, &d, go, uo, act, m, i)?;
        self.affine_gemv(ctx, (&d, out), None, m, h)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// One affine projection for prefill without cuBLAS: dequantized to BF16 `[n, kp]` in the
    /// source's column order (act-order columns read back through the inverse permutation),
    /// then the BF16 GEMV on the activations rounded to BF16.
    fn affine_prefill_project(
        &self,
        ctx: &mut ForwardContext,
        w: &AffineWeight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let bw = self.affine_dequant(ctx, w, true)?;
        let xb = self.to_bf16(ctx, x, m * w.k)?;
        self.bf16_gemm_any(ctx, x, xb, &bw, m, y, ldy)
    }

    /// The prefill's BF16 activations for `w` in the arena (`affine_gather_bf16`): `x`'s `m`
    /// rows of `w.k` values at row stride `ld` (with `act` 1 or 2, SiLU or GELU of `x` times
    /// `u`), rounded, in `w`'s stored column order where it has a permutation.
    fn affine_bf16_input(
        &self,
        ctx: &mut ForwardContext,
        w: &AffineWeight,
        (x, u): (DevicePtr, DevicePtr),
        act: usize,
        m: usize,
        ld: usize,
    ) -> GpuResult<DevicePtr> {
        let xb = ctx.arena.act_bf16.view(0, (m * w.k * 2) as u64);
        let call = self.kernels.affine_gather.call().ptr("x", x).ptr("u", u);
        let call = call.dim("act", act).ptr("perm", w.perm).dim("m", m);
        self.launch(ctx, call.dim("k", w.k).dim("ld", ld).ptr("y", xb))?;
        Ok(xb)
    }

    /// `y [m, w.n] = xb . w^T` on cuBLAS, `w` dequantized to BF16 as stored (act-order columns
    /// in their stored order, which `xb` follows).
    fn affine_gemm(
        &self,
        ctx: &mut ForwardContext,
        w: &AffineWeight,
        xb: DevicePtr,
        m: usize,
        y: DevicePtr,
    ) -> GpuResult<()> {
        let bw = self.affine_dequant(ctx, w, false)?;
        let gemm = GemmBf16 {
            x: xb,
            w: bw.weight,
            y,
            m,
            n: w.n,
            k: w.k,
            kw: w.kp,
        };
        ctx.backend.gemm_bf16(&gemm, ctx.stream)?;
        ctx.record("cublas_gemm_bf16");
        Ok(())
    }

    /// Affine prefill on cuBLAS: the input rounded to BF16 once for gate and up (gathered into
    /// their stored column order when they share a permutation, as act-order checkpoints'
    /// gate and up do), each projection dequantized to BF16 and multiplied, and the act-mul
    /// fused into the down input's rounding (and gathering): no f32 act-mul pass, no second
    /// conversion of the input.
    fn affine_prefill_cublas(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        [g, u, d]: &[AffineWeight; 3],
    ) -> GpuResult<DevicePtr> {
        let (h, i) = (self.hidden, self.inter);
        let (go, uo, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let xb = self.affine_bf16_input(ctx, g, (x, x), 0, m, h)?;
        self.affine_gemm(ctx, g, xb, m, go)?;
        let xb = if u.perm == g.perm && u.k == g.k {
            xb
        } else {
            self.affine_bf16_input(ctx, u, (x, x), 0, m, h)?
        };
        self.affine_gemm(ctx, u, xb, m, uo)?;
        let act = self.affine_act();
        let ab = self.affine_bf16_input(ctx, d, (go, uo), act, m, i)?;
        self.affine_gemm(ctx, d, ab, m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// `w` dequantized to BF16 `[n, kp]` in the context's scratch: in the source's column order
    /// (`source_order`, reading act-order columns through the inverse permutation) or as
    /// stored.
    fn affine_dequant(
        &self,
        ctx: &mut ForwardContext,
        w: &AffineWeight,
        source_order: bool,
    ) -> GpuResult<Bf16Weight> {
        let dq = ctx.arena.dequant_bf16.view(0, (w.n * w.kp * 2) as u64);
        let perm = if source_order {
            w.perm
        } else {
            DevicePtr::NULL
        };
        let call = self.kernels.affine_dequant.call().ptr("codes", w.codes);
        let call = call.ptr("sb", w.scales).dim("n", w.n).dim("kp", w.kp);
        let call = call.dim("form", w.scheme.form as usize);
        let call = call.dim("gshift", w.scheme.group_shift(w.kp) as usize);
        let call = call.dim("bits", w.scheme.bits as usize).ptr("perm", perm);
        self.launch(ctx, call.ptr("out", dq))?;
        Ok(Bf16Weight {
            weight: dq,
            n: w.n,
            k: w.k,
            kp: w.kp,
        })
    }

    /// Affine prefill: up to [`AFFINE_GEMV_MAX_ROWS`] rows on the GEMVs (each weight read once
    /// for every row), more with each projection dequantized to BF16 and multiplied by the BF16
    /// GEMM (cuBLAS; without it, the BF16 GEMV over the weights in the source's order).
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
        match self.affine_prefill_cublas(ctx, x, m, &w) {
            Err(GpuError::MissingKernel { .. }) => {
                self.gated(ctx, x, m, false, &w, Self::affine_prefill_project)
            }
            r => r,
        }
    }
}
