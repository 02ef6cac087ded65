//! The `q4k_mmq` arms: the decode GEMVs over its bytes, and the Q4_K MMQ prefill, each with
//! its int8 or Q4_K down projection.

use crate::ffn::*;

use crate::gpu::{DevicePtr, GpuResult};

impl DenseFfnLayer {
    /// The Q4_K MMQ prefill (`METRALE_Q4K_MMQ=1` with the copies built or given): activations
    /// to q8_1 blocks once for gate and up, the Q4_K dot-product GEMMs, act-mul, then down
    /// through the int8 GEMM after `requant_a_bf16_int8` (or q8_1 + Q4_K GEMM).
    pub(crate) fn q4k_mmq_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let q = *self.need(key::Q4K_MMQ)?;
        let k = self.kernels;
        if !k.q4k_gemm.ok() {
            return Err(k.q4k_gemm.missing());
        }
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        // The bf16 tensor-core path (formats.md, "Q4_K on the bf16 tensor-core path") where
        // it is built, else the q8_1 MMQ GEMMs.
        let dq = self.dq_wgmma_ok(ctx, k.q4k_wgmma, m);
        let qk = k.q4k_gemm;
        if dq {
            let xb = self.to_bf16_il8(ctx, x, m * h)?;
            self.q4k_wgmma_project(ctx, xb, m, h, q.kp_gate, q.gate, i, g)?;
            self.q4k_wgmma_project(ctx, xb, m, h, q.kp_gate, q.up, i, u)?;
        } else {
            let xq = self.quantize_q8_1(ctx, x, m, h, q.kp_gate)?;
            self.mmq_q8_1_launch(ctx, qk, xq, m, q.gate, i, q.kp_gate, g, i)?;
            self.mmq_q8_1_launch(ctx, qk, xq, m, q.up, i, q.kp_gate, u, i)?;
        }
        self.apply_lora_gate_up(ctx, x, m, g, u)?;
        let act = g.view(0, (m * i * 4) as u64);
        if let (true, Q4kDown::Q4k(dw)) = (dq, q.down) {
            let ab = self.dq_down_input(ctx, m)?;
            self.q4k_wgmma_project(ctx, ab, m, i, q.kp_down, dw, h, out)?;
            self.apply_lora_down(ctx, act, m, out)?;
            return Ok(out.view(0, (m * h * 4) as u64));
        }
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        match q.down {
            Q4kDown::Int8 { codes, scales } => {
                if !k.int8_gemm.ok() {
                    return Err(k.int8_gemm.missing());
                }
                let kp = q.kp_down;
                let aq = ctx.arena.act_codes.view(0, (m * kp) as u64);
                let sa = ctx.arena.act_scale.view(0, (m * 4) as u64);
                let call = k.requant_int8.call().ptr("x", act).dim("m", m);
                let call = call.dim("k", i).dim("kp", kp);
                self.launch(ctx, call.ptr("qc", aq).ptr("qs", sa))?;
                // The exact int8 sums on the sm_90a tensor-core path with the dequantizing
                // GEMMs' lever (the same bits), else on mma.sync.
                let gemm = if ctx.levers.dq_wgmma && k.int8_wgmma.ok() {
                    k.int8_wgmma
                } else {
                    k.int8_gemm
                };
                let call = gemm.call().ptr("aq", aq).ptr("sa", sa).dim("m", m);
                let call = call.ptr("wq", codes).ptr("sw", scales).ptr("y", out);
                self.launch(ctx, call.dim("n", h).dim("kp", kp).dim("ldy", h))?;
            }
            Q4kDown::Q4k(dw) => {
                let aq = self.quantize_q8_1(ctx, act, m, i, q.kp_down)?;
                self.mmq_q8_1_launch(ctx, qk, aq, m, dw, h, q.kp_down, out, h)?;
            }
        }
        self.apply_lora_down(ctx, act, m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// The `q4k_mmq` decode (1 to 4 rows): gate and up through `q4k_gemv` over the Q4_K rows
    /// with f32 activations, LoRA, act-mul, then down through `int8_rows_gemv` (int8 rows) or
    /// `q4k_gemv` (Q4_K rows); the batch-4 kernels for 2-4 rows.
    pub(crate) fn q4k_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let q = *self.need(key::Q4K_MMQ)?;
        let k = self.kernels;
        let (q4, i8) = if m == 1 {
            (k.q4k_gemv, k.int8_gemv)
        } else {
            (k.q4k_gemv_m, k.int8_gemv_m)
        };
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (ctx.arena.gate_out, ctx.arena.up_out, ctx.arena.output);
        let q4k = |w: DevicePtr, x: DevicePtr, n: usize, kk: usize, kp: usize, y: DevicePtr| {
            let call = q4.call().ptr("x", x).dim("m", m).ptr("w", w).ptr("y", y);
            call.dim("n", n).dim("k", kk).dim("kp", kp).dim("ldy", n)
        };
        self.launch(ctx, q4k(q.gate, x, i, h, q.kp_gate, g))?;
        self.launch(ctx, q4k(q.up, x, i, h, q.kp_gate, u))?;
        self.apply_lora_gate_up(ctx, x, m, g, u)?;
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        let down = match q.down {
            Q4kDown::Int8 { codes, scales } => {
                let call = i8.call().ptr("x", act).dim("m", m).ptr("wq", codes);
                let call = call.ptr("sw", scales).ptr("y", out).dim("n", h);
                call.dim("k", i).dim("kp", q.kp_down).dim("ldy", h)
            }
            Q4kDown::Q4k(dw) => q4k(dw, act, h, i, q.kp_down, out),
        };
        self.launch(ctx, down)?;
        self.apply_lora_down(ctx, act, m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }
}
