//! The affine (`affine`) arms: the decode GEMVs (one to sixteen rows, over activations
//! quantized to int8 per group) and the prefill through BF16.

use super::super::*;

use crate::gpu::{DevicePtr, GemmBf16, GpuError, GpuResult};

impl DenseFfnLayer {
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
        let k = &self.kernels;
        let kernel = match (w.scheme.bits, m) {
            (4, 1) => k.affine4_gemv,
            (4, 2..=4) => k.affine4_gemv_m,
            (4, _) => k.affine4_gemv_m16,
            (_, 1) => k.affine8_gemv,
            (_, 2..=4) => k.affine8_gemv_m,
            _ => k.affine8_gemv_m16,
        };
        let (u, yu) = also.unwrap_or((w, y));
        let (xq, xs) = (ctx.arena.act_codes, ctx.arena.act_scale);
        let call = kernel.call().ptr("xq", xq).ptr("xs", xs).dim("m", m);
        let call = call.ptr("cg", w.codes).ptr("sg", w.scales).ptr("yg", y);
        let call = call.ptr("cu", u.codes).ptr("su", u.scales).ptr("yu", yu);
        let call = call.dim("projs", 1 + also.is_some() as usize).dim("n", w.n);
        let call = call.dim("form", w.scheme.form as usize);
        let call = call.dim("gshift", w.scheme.group_shift(w.kp) as usize);
        self.launch(ctx, call.dim("kp", w.kp).dim("ldy", ldy))
    }

    /// Affine decode (and up to [`AFFINE_GEMV_MAX_ROWS`] rows): the input quantized once for
    /// gate and up and their GEMVs in one launch (two, if up's scheme is not gate's, with the
    /// input quantized again for other bits), the act-mul fused into the down input's quantization, the down
    /// GEMV.
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
        if u.scheme == g.scheme && u.kp == g.kp && same_perm {
            self.affine_gemv(ctx, (&g, go), Some((&u, uo)), m, i)?;
        } else {
            self.affine_gemv(ctx, (&g, go), None, m, i)?;
            if u.scheme.bits != g.scheme.bits || !same_perm {
                self.affine_quantize(ctx, &u, x, x, 0, m, h)?;
            }
            self.affine_gemv(ctx, (&u, uo), None, m, i)?;
        }
        let act = match self.activation {
            Activation::Silu => 1,
            Activation::Gelu => 2,
        };
        self.affine_quantize(ctx, &d, go, uo, act, m, i)?;
        self.affine_gemv(ctx, (&d, out), None, m, h)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// One affine projection for prefill: dequantized to BF16 `[n, kp]` into the context's
    /// scratch (`affine_dequant_bf16`, each weight rounded to nearest even), then the BF16 GEMM
    /// on the activations rounded to BF16. Act-order weights stay in their stored column order
    /// and the activations are gathered into it (`affine_gather_bf16`); without cuBLAS, the
    /// dequantization reads them back into the source's order for the BF16 GEMV.
    fn affine_prefill_project(
        &self,
        ctx: &mut ForwardContext,
        w: &AffineWeight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let gathered = !w.perm.is_null();
        let bw = self.affine_dequant(ctx, w, !gathered)?;
        if gathered {
            let xb = ctx.arena.act_bf16.view(0, (m * w.k * 2) as u64);
            let call = self
                .kernels
                .affine_gather
                .call()
                .ptr("x", x)
                .ptr("perm", w.perm);
            self.launch(ctx, call.dim("m", m).dim("k", w.k).ptr("y", xb))?;
            let gemm = GemmBf16 {
                x: xb,
                w: bw.weight,
                y,
                m,
                n: w.n,
                k: w.k,
                kw: w.kp,
            };
            match ctx.backend.gemm_bf16(&gemm, ctx.stream) {
                Ok(()) => {
                    ctx.record("cublas_gemm_bf16");
                    return Ok(());
                }
                Err(GpuError::MissingKernel { .. }) => {
                    self.affine_dequant(ctx, w, true)?;
                }
                Err(e) => return Err(e),
            }
        }
        let xb = self.to_bf16(ctx, x, m * w.k)?;
        self.bf16_gemm_any(ctx, x, xb, &bw, m, y, ldy)
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
        let dq = ctx
            .arena
            .q2_dequant_scratch
            .view(0, (w.n * w.kp * 2) as u64);
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
