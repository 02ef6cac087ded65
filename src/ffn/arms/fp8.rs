//! The FP8 arms (W8A16 GEMV/GEMM, the fused gate+up decode) and W8A8.

use super::super::*;

use crate::gpu::{DevicePtr, GpuResult, KArg, KernelHandle, LaunchCfg, ModelLevers};

impl DenseFfnLayer {
    /// The FP8 projection kernel for `m` rows: the first that resolved of batch-4 GEMV (m <= 4),
    /// tensor-core m16 (5..=32 with `ffn_m16_tc`), batch-16 GEMV (5..=32 with
    /// `METRALE_FFN_BATCH16`), the pipelined tensor-core GEMM, the base GEMM.
    pub(crate) fn fp8_kernel_for(&self, lev: &ModelLevers, m: usize) -> GpuResult<KernelHandle> {
        let k = &self.kernels;
        Ok(if m <= 4 && k.fp8_b4.ok() {
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
            return Err(missing("ffn_fp8", "w8a16_gemm"));
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
        kernel: KernelHandle,
        w: &Fp8Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let k = &self.kernels;
        let (cap, tile) = if kernel == k.fp8_b4 {
            (4, "gemv4")
        } else if kernel == k.fp8_b16 {
            (16, "gemv16")
        } else if kernel == k.fp8_m16 {
            (16, "m16")
        } else if kernel == k.fp8_pipe {
            (usize::MAX, "tc64")
        } else {
            (usize::MAX, "simt64")
        };
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(cap);
            let grid = match tile {
                "gemv4" => (w.n.div_ceil(32) as u32, 1, 1),
                "gemv16" => (w.n.div_ceil(16) as u32, 1, 1),
                "m16" => ((w.np / 128) as u32, 1, 1),
                "tc64" => ((w.np / 128) as u32, rows.div_ceil(64) as u32, 1),
                _ => (w.n.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1),
            };
            let block = match tile {
                "gemv4" | "gemv16" | "simt64" => (256, 1, 1),
                _ => (128, 1, 1),
            };
            let xs = x.view((r0 * w.k * 4) as u64, (rows * w.k * 4) as u64);
            let ys = y.view(
                (r0 * ldy * 4) as u64,
                ((rows - 1) * ldy * 4 + w.n * 4) as u64,
            );
            let i = |v: usize| KArg::Dim(v);
            let args = [
                KArg::Ptr(xs),
                i(rows),
                KArg::Ptr(w.weight),
                KArg::Ptr(w.scale),
                KArg::Ptr(ys),
                i(w.n),
                i(w.k),
                i(w.kp),
                i(ldy),
            ];
            self.launch(
                ctx,
                kernel,
                LaunchCfg {
                    grid,
                    block,
                    smem: 0,
                },
                &args,
            )?;
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
        let ov = self.fp8.as_ref().unwrap();
        self.gated(
            ctx,
            x,
            m,
            false,
            &[ov.gate, ov.up, ov.down],
            Self::fp8_project,
        )
    }

    pub(crate) fn fp8_fused_decode(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
    ) -> GpuResult<DevicePtr> {
        let ov = self.fp8.as_ref().unwrap();
        let fused = ov.fused.unwrap();
        let interp = fused.np / 2;
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        self.fp8_project(ctx, &fused, x, 1, g, 2 * interp)?;
        let up_part = g.view((interp * 4) as u64, (i * 4) as u64);
        self.act_mul(ctx, g, up_part, u, 1, i, 2 * interp, 2 * interp, i)?;
        self.fp8_project(ctx, &ov.down, u.view(0, (i * 4) as u64), 1, out, h)?;
        Ok(out.view(0, (h * 4) as u64))
    }

    pub(crate) fn w8a8_project(
        &self,
        ctx: &mut ForwardContext,
        w: &W8a8Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let (q, s) = (ctx.arena.act_codes, ctx.arena.act_scale);
        let i = |v: usize| KArg::Dim(v);
        let cfg = LaunchCfg::grid(m, 1, 256);
        self.launch(
            ctx,
            self.kernels.quant_fp8_row,
            cfg,
            &[
                KArg::Ptr(x),
                i(m),
                i(w.k),
                i(w.kp),
                KArg::Ptr(q),
                KArg::Ptr(s),
            ],
        )?;
        let cfg = LaunchCfg::grid(w.n.div_ceil(128), m.div_ceil(64), 128);
        let args = [
            KArg::Ptr(q),
            KArg::Ptr(s),
            i(m),
            KArg::Ptr(w.weight),
            KArg::Ptr(w.scale),
            KArg::Ptr(y),
            i(w.n),
            i(w.kp),
            i(ldy),
        ];
        self.launch(ctx, self.kernels.w8a8, cfg, &args)
    }

    pub(crate) fn w8a8_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.gated(ctx, x, m, false, &self.w8a8.unwrap(), Self::w8a8_project)
    }
}
