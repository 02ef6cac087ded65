//! The LoRA delta on the NVFP4 base (`lora`).

use crate::ffn::*;

use crate::gpu::{DevicePtr, GpuResult};

impl DenseFfnLayer {
    /// `out += scaling * B (A x)` for one projection's adapter: `lora_a` then `lora_b_add`.
    pub(crate) fn lora_project(
        &self,
        ctx: &mut ForwardContext,
        l: &LoraWeight,
        x: DevicePtr,
        m: usize,
        out: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let k = &self.kernels;
        if !k.lora_b.ok() {
            return Err(k.lora_b.missing());
        }
        let xa = ctx.arena.lora_xa.view(0, (m * l.rank * 4) as u64);
        let call = k
            .lora_a
            .call()
            .ptr("x", x)
            .dim("m", m)
            .dim("k", l.k)
            .dim("ldx", l.k);
        self.launch(ctx, call.ptr("a", l.a).dim("r", l.rank).ptr("xa", xa))?;
        let call = k.lora_b.call().ptr("xa", xa).dim("m", m).dim("r", l.rank);
        let call = call.ptr("b", l.b).float("scaling", l.scaling).ptr("y", out);
        self.launch(ctx, call.dim("n", l.n).dim("ldy", ldy))
    }

    /// After the gate and up projections, before the activation: `gate_out += dW_gate x`,
    /// `up_out += dW_up x`. No launch without an adapter or with `METRALE_LORA_NO_FFN=1`.
    pub fn apply_lora_gate_up(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        gate_out: DevicePtr,
        up_out: DevicePtr,
    ) -> GpuResult<()> {
        if !self.lora_active(ctx) {
            return Ok(());
        }
        let w = *self.need(key::LORA)?;
        if let Some(l) = w[0] {
            self.lora_project(ctx, &l, x, m, gate_out, self.inter)?;
        }
        if let Some(l) = w[1] {
            self.lora_project(ctx, &l, x, m, up_out, self.inter)?;
        }
        Ok(())
    }

    /// After the down projection: `output += dW_down act` on the materialised
    /// `silu(gate) * up`. No launch without an adapter or with `METRALE_LORA_NO_FFN=1`.
    pub fn apply_lora_down(
        &self,
        ctx: &mut ForwardContext,
        act: DevicePtr,
        m: usize,
        output: DevicePtr,
    ) -> GpuResult<()> {
        if !self.lora_active(ctx) {
            return Ok(());
        }
        if let Some(l) = self.need(key::LORA)?[2] {
            self.lora_project(ctx, &l, act, m, output, self.hidden)?;
        }
        Ok(())
    }
}
