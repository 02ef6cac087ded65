//! Routing predicates: which arm serves a call of `m` rows under the levers.

use super::*;

use crate::gpu::{DevicePtr, GpuError, GpuResult};
use crate::model::Activation;

impl DenseFfnLayer {
    /// A LoRA adapter is installed and `METRALE_LORA_NO_FFN` is off.
    pub fn lora_active(&self, ctx: &ForwardContext) -> bool {
        self.lora.is_some() && !ctx.levers.lora_no_ffn
    }

    /// Whether an FP8 overlay is installed.
    pub fn has_fp8(&self) -> bool {
        self.fp8.is_some()
    }

    // ---- routing predicates ----

    /// The rows the narrow (GEMV) arms serve: 16 with `METRALE_FFN_BATCH16` and its kernel, else 4.
    pub fn narrow_rows(&self, ctx: &ForwardContext) -> usize {
        if ctx.levers.ffn_batch16 && self.kernels.fp8_b16.ok() {
            16
        } else {
            4
        }
    }

    /// The NVFP4 batch-m tier kernel for `m` rows, if resolved.
    pub fn batchm_kernel(&self, m: usize) -> Option<crate::gpu::table::Kernel> {
        let k = match m {
            1..=4 => self.kernels.nvfp4_small_m4,
            5..=8 => self.kernels.nvfp4_small_m8,
            9..=16 => self.kernels.nvfp4_small_m16,
            _ => return None,
        };
        k.ok().then_some(k)
    }

    /// `forward_km(m)` is available: a batch-m tier resolved and the layer has NVFP4 gate
    /// weights or an FP8 overlay.
    pub fn can_forward_km(&self, m: usize) -> bool {
        self.batchm_kernel(m).is_some() && (self.weights.nvfp4.is_some() || self.fp8.is_some())
    }

    /// W4A4 for 2-3 rows (NVFP4 layers, `METRALE_SMALL_BATCH_W4A4`, the W4A4 tier resolved).
    pub fn small_batch_w4a4(&self, ctx: &ForwardContext) -> bool {
        ctx.levers.small_batch_w4a4
            && self.weights.nvfp4.is_some()
            && self.kernels.nvfp4_proj_mx.ok()
    }

    /// W4A4 for one decode row (NVFP4 layers, `METRALE_SINGLE_ROW_W4A4`, the tier resolved).
    pub fn single_row_w4a4(&self, ctx: &ForwardContext) -> bool {
        ctx.levers.single_row_w4a4
            && self.weights.nvfp4.is_some()
            && self.kernels.nvfp4_proj_mx.ok()
    }

    /// The fixed activation-quantization path serves `m` rows: the W8A8 arm or the W4A4 arm.
    pub fn fixed_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        self.fixed_w8a8_ok(ctx, m) || self.fixed_w4a4_ok(ctx, m)
    }

    /// The fixed W8A8 arm: W8A8 weights installed, SiLU, its two kernels resolved, and the
    /// declared format `w8a8` or none.
    pub fn fixed_w8a8_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        let declared = ctx
            .levers
            .activation_quantization
            .as_deref()
            .is_none_or(|f| f == "w8a8");
        declared
            && self.w8a8.is_some()
            && self.activation == Activation::Silu
            && self.kernels.quant_fp8_row.ok()
            && self.kernels.w8a8.ok()
            && (1..=ctx.max_tokens).contains(&m)
    }

    /// The fixed W4A4 arm: SiLU layers with NVFP4 weights (the format is NVFP4) when no format
    /// or A4 (`w4a4`, `a4`, `nvfp4`) is declared, `quantize_act_nvfp4` and `nvfp4_proj_mx`
    /// resolved. NVFP4 activation quantization at every row count.
    pub fn fixed_w4a4_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        self.weights.nvfp4.is_some()
            && self.activation == Activation::Silu
            && ctx
                .levers
                .activation_quantization
                .as_deref()
                .is_none_or(declared_a4)
            && self.kernels.quant_nvfp4.ok()
            && self.kernels.nvfp4_proj_mx.ok()
            && (1..=ctx.max_tokens).contains(&m)
    }

    /// `forward_km(m)` of an NVFP4 layer runs W4A4: one row with `single_row_w4a4`, 2-3 rows
    /// with `small_batch_w4a4`, any row count with A4 declared.
    pub(crate) fn km_w4a4(&self, ctx: &ForwardContext, m: usize) -> bool {
        let declared = ctx
            .levers
            .activation_quantization
            .as_deref()
            .is_some_and(declared_a4);
        (m == 1 && self.single_row_w4a4(ctx))
            || ((2..=3).contains(&m) && self.small_batch_w4a4(ctx))
            || (declared
                && self.weights.nvfp4.is_some()
                && self.kernels.nvfp4_proj_mx.ok()
                && self.kernels.quant_nvfp4.ok())
    }

    /// The fused FP8 gate+up GEMV serves decode: fused weight installed, lever on, kernel resolved.
    pub fn gateup_fused_plan(&self, ctx: &ForwardContext) -> bool {
        self.fp8.as_ref().is_some_and(|o| o.fused.is_some())
            && ctx.levers.ffn_gateup_fused
            && self.kernels.fp8_b4.ok()
    }

    // ---- methods ----

    pub(crate) fn check_rows(
        &self,
        ctx: &ForwardContext,
        input: DevicePtr,
        m: usize,
    ) -> GpuResult<()> {
        if m == 0 || m > ctx.max_tokens {
            return Err(GpuError::Shape(format!(
                "{m} rows: the context holds 1..={}",
                ctx.max_tokens
            )));
        }
        if input.bytes < (m * self.hidden * 4) as u64 {
            return Err(GpuError::Shape(format!(
                "input holds {} bytes, {m} rows of {} f32 need {}",
                input.bytes,
                self.hidden,
                m * self.hidden * 4
            )));
        }
        Ok(())
    }
}
