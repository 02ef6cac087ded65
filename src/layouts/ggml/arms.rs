//! The `ggml` arms: every projection through the block-format engine's GEMV (`ggml_gemv1` for
//! one row, `ggml_gemv_split` for two and `ggml_gemv_split4` for three or four, their
//! activations split, up to the levers' rows: gate and up two, down four; `ggml_gemv_sa` past
//! them) over q8_1 activations
//! (`quantize_act_q8_1`, `quantize_act_q8_1s`), at most
//! `GGML_GEMV_MAX_M` rows a launch; past `GGML_PREFILL_MIN_ROWS` rows, each projection
//! dequantized to BF16 (`ggml_dequant_bf16`) and multiplied by the BF16 GEMM. Either way each
//! input is prepared once: the layer's input for gate and up together, the act-mul's output for
//! down.

use crate::ffn::{Bf16Weight, DenseFfnLayer, ForwardContext, GgmlWeight, key};
use crate::gpu::sizes::{
    GGML_GEMV_MAX_M, GGML_GEMV_SPLIT_M, GGML_GEMV_SPLIT4_M, GGML_PREFILL_MIN_ROWS, Q8_1_BYTES,
    Q8_1_ELEMS,
};
use crate::gpu::{DevicePtr, GpuResult};

/// A projection's input made ready for its product: `(layer, ctx, x, m, k, kp)`, `x` f32
/// `[m, k]`, the weight's rows padded to `kp`.
type Prepare =
    fn(&DenseFfnLayer, &mut ForwardContext, DevicePtr, usize, usize, usize) -> GpuResult<DevicePtr>;

/// The down projection's input made ready from gate's and up's outputs `(layer, ctx, g, u,
/// m, i, kp)` (`[m, i]` each): the f32 gated product and its prepared form.
type PrepareAct = fn(
    &DenseFfnLayer,
    &mut ForwardContext,
    DevicePtr,
    DevicePtr,
    usize,
    usize,
    usize,
) -> GpuResult<(DevicePtr, DevicePtr)>;

/// `y [m, n] = x . w^T` with row stride `ldy`, from the f32 input and its prepared form; with
/// a second `(weight, y2)` of the same shape (up beside gate), `y2 = x . weight^T` too.
type Project = fn(
    &DenseFfnLayer,
    &mut ForwardContext,
    &GgmlWeight,
    Option<(&GgmlWeight, DevicePtr)>,
    (DevicePtr, DevicePtr),
    usize,
    DevicePtr,
    usize,
) -> GpuResult<()>;

impl DenseFfnLayer {
    /// The gated FFN on `m` rows through the engine's GEMV.
    pub(crate) fn ggml_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = *self.need(key::GGML)?;
        // Up to the levers' rows (gate and up two, down four by default): the activations
        // split, for `ggml_gemv1`, `ggml_gemv_split` and `ggml_gemv_split4`
        // (kernels/ffn_q8_1.cu, `q8_1_at`); more, `ggml_gemv_sa` on q8_1 blocks.
        let (gu, down) = Self::ggml_split_rows(ctx);
        let prep = match m <= gu {
            true => Self::ggml_q8_1::<true> as Prepare,
            false => Self::ggml_q8_1::<false> as Prepare,
        };
        let prep_act = match m <= down {
            true => Self::ggml_act_q8_1::<true> as PrepareAct,
            false => Self::ggml_act_q8_1::<false> as PrepareAct,
        };
        let project = |split: bool| match split {
            true => Self::ggml_gemv_project::<true> as Project,
            false => Self::ggml_gemv_project::<false> as Project,
        };
        let projects = (project(m <= gu), project(m <= down));
        self.ggml_chain(ctx, x, m, &w, (prep, prep_act), projects)
    }

    /// The most rows the GEMV takes with its activations split, for gate and up and for down:
    /// the levers `ggml_split_max_rows` and `ggml_down_split_max_rows`, each from one
    /// (`ggml_gemv1`) to `ggml_gemv_split4`'s rows.
    fn ggml_split_rows(ctx: &ForwardContext) -> (usize, usize) {
        let l = &ctx.levers;
        let within = |r: usize| r.clamp(1, GGML_GEMV_SPLIT4_M);
        (
            within(l.ggml_split_max_rows),
            within(l.ggml_down_split_max_rows),
        )
    }

    /// Prefill: up to `GGML_PREFILL_MIN_ROWS - 1` rows on the engine's GEMV, more with each
    /// projection dequantized to BF16 and multiplied by the BF16 GEMM (cuBLAS; without it, the
    /// BF16 GEMV), the activations rounded to BF16.
    pub(crate) fn ggml_prefill_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        if m < GGML_PREFILL_MIN_ROWS {
            return self.ggml_arm(ctx, x, m);
        }
        let w = *self.need(key::GGML)?;
        let prep = (
            Self::ggml_round as Prepare,
            Self::ggml_act_round as PrepareAct,
        );
        let project = Self::ggml_dequant_project as Project;
        self.ggml_chain(ctx, x, m, &w, prep, (project, project))
    }

    /// Gate and up on the input prepared once, in one projection call (two, each on its own
    /// prepared input, where their padded rows differ), the act-mul, and down on its output
    /// prepared; `project` for gate and up, `project_down` for down.
    fn ggml_chain(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        [g, u, d]: &[GgmlWeight; 3],
        (prepare, prepare_act): (Prepare, PrepareAct),
        (project, project_down): (Project, Project),
    ) -> GpuResult<DevicePtr> {
        let (h, i) = (self.hidden, self.inter);
        let (go, uo, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let xg = prepare(self, ctx, x, m, h, g.kp)?;
        if u.kp == g.kp {
            project(self, ctx, g, Some((u, uo)), (x, xg), m, go, i)?;
        } else {
            project(self, ctx, g, None, (x, xg), m, go, i)?;
            let xu = prepare(self, ctx, x, m, h, u.kp)?;
            project(self, ctx, u, None, (x, xu), m, uo, i)?;
        }
        let a = prepare_act(self, ctx, go, uo, m, i, d.kp)?;
        project_down(self, ctx, d, None, a, m, out, h)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// The input to q8_1 blocks (`quantize_act_q8_1`), split where `SPLIT`
    /// (`quantize_act_q8_1s`, the one-row GEMV's), in the arena.
    fn ggml_q8_1<const SPLIT: bool>(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        k: usize,
        kp: usize,
    ) -> GpuResult<DevicePtr> {
        let kq = if SPLIT {
            self.kernels.quant_q8_1s
        } else {
            self.kernels.quant_q8_1
        };
        self.quantize_q8_1_by(kq, ctx, x, m, (k, kp))
    }

    /// The gated product to q8_1 blocks in one launch (`quantize_act_mul_q8_1`; split where
    /// `SPLIT`, `quantize_act_mul_q8_1s`); its f32 form is not made (the GEMV reads the blocks
    /// only).
    #[allow(clippy::too_many_arguments)]
    fn ggml_act_q8_1<const SPLIT: bool>(
        &self,
        ctx: &mut ForwardContext,
        g: DevicePtr,
        u: DevicePtr,
        m: usize,
        i: usize,
        kp: usize,
    ) -> GpuResult<(DevicePtr, DevicePtr)> {
        let kernel = if SPLIT {
            self.kernels.quant_act_q8_1s
        } else {
            self.kernels.quant_act_q8_1
        };
        let out = ctx
            .arena
            .act_q8_1
            .view(0, (m * kp / Q8_1_ELEMS * Q8_1_BYTES) as u64);
        let call = kernel.call().ptr("g", g).ptr("u", u);
        let call = call
            .dim("act", self.activation.kernel_arg())
            .dim("m", m)
            .dim("k", i)
            .dim("ld", i);
        self.launch(ctx, call.dim("kp", kp).ptr("out", out))?;
        Ok((DevicePtr::NULL, out))
    }

    /// The gated product in place of gate's output, then rounded to BF16.
    #[allow(clippy::too_many_arguments)]
    fn ggml_act_round(
        &self,
        ctx: &mut ForwardContext,
        g: DevicePtr,
        u: DevicePtr,
        m: usize,
        i: usize,
        kp: usize,
    ) -> GpuResult<(DevicePtr, DevicePtr)> {
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let a = g.view(0, (m * i * 4) as u64);
        Ok((a, self.ggml_round(ctx, a, m, i, kp)?))
    }

    /// The `m` rows rounded to BF16 (the BF16 GEMM's input).
    fn ggml_round(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        k: usize,
        _kp: usize,
    ) -> GpuResult<DevicePtr> {
        self.to_bf16(ctx, x, m * k)
    }

    /// The engine's GEMV on the q8_1 rows `xq` (split where `SPLIT`), `GGML_GEMV_MAX_M` rows a
    /// launch, both projections in one launch.
    #[allow(clippy::too_many_arguments)]
    fn ggml_gemv_project<const SPLIT: bool>(
        &self,
        ctx: &mut ForwardContext,
        w: &GgmlWeight,
        second: Option<(&GgmlWeight, DevicePtr)>,
        (_, xq): (DevicePtr, DevicePtr),
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let (n, kp) = (w.n, w.kp);
        let row_q8 = kp / Q8_1_ELEMS * Q8_1_BYTES;
        let rows_of = |y: DevicePtr, r0: usize, rows: usize| {
            y.view((r0 * ldy * 4) as u64, (((rows - 1) * ldy + n) * 4) as u64)
        };
        for r0 in (0..m).step_by(GGML_GEMV_MAX_M) {
            let rows = (m - r0).min(GGML_GEMV_MAX_M);
            let xv = xq.view((r0 * row_q8) as u64, (rows * row_q8) as u64);
            // Split activations: one row, stages by cp.async, more launch blocks an SM
            // (`ggml_gemv1`); two, the same form for two rows (`ggml_gemv_split`); three or
            // four, for four (`ggml_gemv_split4`). Blocks: the activations shared by a launch
            // block's warps (`ggml_gemv_sa`). Each the fastest form for its rows and shape on
            // an H100 (BENCHMARKS.md; at two rows `ggml_gemv_split` took 0.72-0.84x
            // `ggml_gemv_sa`'s time on both llama-8B shapes for most types; at four on the down
            // shape `ggml_gemv_split4` 0.82-0.92x, on the gate shape 0.82-1.12x).
            let call = match m {
                1 => self.kernels.ggml_gemv1.call(),
                _ if !SPLIT => self.kernels.ggml_gemv_sa.call(),
                m if m <= GGML_GEMV_SPLIT_M => self.kernels.ggml_gemv_split.call(),
                _ => self.kernels.ggml_gemv_split4.call(),
            };
            let call = call.ptr("xq", xv).dim("m", rows);
            let call = call.ptr("w", w.weight).dim("ty", w.ty as u32 as usize);
            let call = call.float("sc", w.scale);
            let call = call.ptr("y", rows_of(y, r0, rows));
            let call = match second {
                Some((w2, y2)) => call
                    .ptr("w2", w2.weight)
                    .dim("ty2", w2.ty as u32 as usize)
                    .float("sc2", w2.scale)
                    .ptr("y2", rows_of(y2, r0, rows))
                    .dim("projs", 2),
                None => call
                    .ptr("w2", DevicePtr::NULL)
                    .dim("ty2", 0)
                    .float("sc2", 1.0)
                    .ptr("y2", DevicePtr::NULL)
                    .dim("projs", 1),
            };
            self.launch(ctx, call.dim("n", n).dim("kp", kp).dim("ldy", ldy))?;
        }
        Ok(())
    }

    /// `y [m, n] = xb . bf16(w)^T`: `w` dequantized into the arena's BF16 scratch, then the
    /// BF16 GEMM on the rounded rows `xb` (its GEMV fallback reads the f32 rows); the second
    /// projection after it, the same way.
    #[allow(clippy::too_many_arguments)]
    fn ggml_dequant_project(
        &self,
        ctx: &mut ForwardContext,
        w: &GgmlWeight,
        second: Option<(&GgmlWeight, DevicePtr)>,
        (x, xb): (DevicePtr, DevicePtr),
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        if let Some((w2, y2)) = second {
            self.ggml_dequant_project(ctx, w, None, (x, xb), m, y, ldy)?;
            return self.ggml_dequant_project(ctx, w2, None, (x, xb), m, y2, ldy);
        }
        let dq = ctx.arena.dequant_bf16.view(0, (w.n * w.kp * 2) as u64);
        let call = self.kernels.ggml_dequant.call().ptr("w", w.weight);
        let call = call.dim("ty", w.ty as u32 as usize).float("sc", w.scale);
        let call = call.dim("n", w.n);
        self.launch(ctx, call.dim("kp", w.kp).ptr("out", dq))?;
        let bw = Bf16Weight {
            weight: dq,
            n: w.n,
            k: w.k,
            kp: w.kp,
        };
        self.bf16_gemm_any(ctx, x, xb, &bw, m, y, ldy)
    }
}
