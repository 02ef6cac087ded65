//! Routing: the table of arms ([`arms`]) every forward method walks, the layouts a layer
//! holds ([`DenseFfnLayer::holds`]), and the predicates the arms ask (levers, kernels, rows).

use super::*;

use super::layouts::arms;
use crate::converters::layouts::Layout;
use crate::gpu::{DevicePtr, GpuError, GpuResult};
use crate::model::Activation;

/// The public forward methods, as the arm table names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    /// `forward`: one decode row.
    Decode,
    /// `forward_k2`, `forward_k3`: two or three rows.
    Small,
    /// `forward_km`: `m` verify rows.
    Verify,
    /// `forward_prefill` (and `forward_batched`).
    Prefill,
    /// `forward_fixed`: one activation format at every row count.
    Fixed,
}

/// What an arm runs: the layer, the context, the input, the rows.
pub type Run = fn(&DenseFfnLayer, &mut ForwardContext, DevicePtr, usize) -> GpuResult<DevicePtr>;

/// One arm: the method it serves, the layout whose overlay it needs, whether it serves `m` rows
/// now (levers, kernels, rows), and what it runs.
pub struct Arm {
    /// The method.
    pub method: Method,
    /// Its name (what `DenseFfnLayer::serving_arm` answers).
    pub name: &'static str,
    /// The layout it needs installed.
    pub layout: Layout,
    /// Its place among its method's arms (lower first; see [`arms`]).
    pub rank: u16,
    when: fn(&DenseFfnLayer, &ForwardContext, usize) -> bool,
    run: Run,
}

impl Arm {
    /// An arm, a row of a layout's [`Runtime::arms`]: it serves `method` on a layer holding
    /// `layout`'s overlay when `when` says so, by `run` (which reads the overlay with
    /// [`DenseFfnLayer::get`] or [`DenseFfnLayer::overlay`] and launches through
    /// [`DenseFfnLayer::launch`] and [`DenseFfnLayer::gated`]), at rank 0.
    pub const fn new(
        method: Method,
        name: &'static str,
        layout: Layout,
        when: fn(&DenseFfnLayer, &ForwardContext, usize) -> bool,
        run: Run,
    ) -> Arm {
        Arm {
            method,
            name,
            layout,
            rank: 0,
            when,
            run,
        }
    }

    /// This arm at `rank` among its method's arms.
    pub const fn rank(self, rank: u16) -> Arm {
        Arm { rank, ..self }
    }
}

pub(crate) fn always(_: &DenseFfnLayer, _: &ForwardContext, _: usize) -> bool {
    true
}

pub(crate) fn prefill(
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    x: DevicePtr,
    m: usize,
) -> GpuResult<DevicePtr> {
    l.forward_prefill(c, x, m)
}

pub(crate) fn verify(
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    x: DevicePtr,
    m: usize,
) -> GpuResult<DevicePtr> {
    l.forward_km(c, x, m)
}

use Method::{Decode, Fixed, Prefill, Small, Verify};

/// Why no arm served a method.
fn none_serves(method: Method) -> GpuError {
    GpuError::NotServed(
        match method {
            Decode | Small => "forward: no weights installed",
            Verify => "forward_km: no NVFP4 or FP8 weights",
            Prefill => "forward_prefill: no weights installed",
            Fixed => "forward_fixed: no fixed-quantization arm serves this layer (needs SiLU and W8A8 weights with the W8A8 kernels, or NVFP4 weights with quantize_act_nvfp4 and nvfp4_proj_mx)",
        }
        .into(),
    )
}

impl DenseFfnLayer {
    /// Whether this layer holds `layout`'s overlay (for a layout with an overlay per
    /// projection: for any projection). The one place the arms' layouts are read.
    pub fn holds(&self, layout: Layout) -> bool {
        self.overlays.holds(layout)
    }

    /// The arm that serves `method` on `m` rows now, if any: the first of [`arms`] whose layout
    /// this layer holds and whose condition holds.
    pub fn serving_arm(
        &self,
        ctx: &ForwardContext,
        method: Method,
        m: usize,
    ) -> Option<&'static Arm> {
        let serves =
            |a: &&Arm| a.method == method && self.holds(a.layout) && (a.when)(self, ctx, m);
        arms().iter().copied().find(serves)
    }

    /// Run `method` on `m` rows through the arm that serves it.
    pub(crate) fn route(
        &self,
        ctx: &mut ForwardContext,
        method: Method,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        match self.serving_arm(ctx, method, m) {
            Some(a) => (a.run)(self, ctx, x, m),
            None => Err(none_serves(method)),
        }
    }

    /// A LoRA adapter is installed and `METRALE_LORA_NO_FFN` is off.
    pub fn lora_active(&self, ctx: &ForwardContext) -> bool {
        self.holds(Layout::Lora) && !ctx.levers.lora_no_ffn
    }

    /// Whether an FP8 overlay is installed.
    pub fn has_fp8(&self) -> bool {
        self.holds(Layout::Fp8)
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
        self.batchm_kernel(m).is_some() && (self.holds(Layout::Nvfp4) || self.holds(Layout::Fp8))
    }

    /// W4A4 for 2-3 rows (NVFP4 layers, `METRALE_SMALL_BATCH_W4A4`, the W4A4 tier resolved).
    pub fn small_batch_w4a4(&self, ctx: &ForwardContext) -> bool {
        ctx.levers.small_batch_w4a4 && self.holds(Layout::Nvfp4) && self.kernels.nvfp4_proj_mx.ok()
    }

    /// W4A4 for one decode row (NVFP4 layers, `METRALE_SINGLE_ROW_W4A4`, the tier resolved).
    pub fn single_row_w4a4(&self, ctx: &ForwardContext) -> bool {
        ctx.levers.single_row_w4a4 && self.holds(Layout::Nvfp4) && self.kernels.nvfp4_proj_mx.ok()
    }

    /// The fixed activation-quantization path serves `m` rows: the W8A8 arm
    /// (`fixed_w8a8_ok`, in its layout's folder) or the W4A4 arm.
    pub fn fixed_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        self.fixed_w8a8_ok(ctx, m) || self.fixed_w4a4_ok(ctx, m)
    }

    /// The fixed W4A4 arm: SiLU layers with NVFP4 weights (the format is NVFP4) when no format
    /// or A4 (`w4a4`, `a4`, `nvfp4`) is declared, `quantize_act_nvfp4` and `nvfp4_proj_mx`
    /// resolved. NVFP4 activation quantization at every row count.
    pub fn fixed_w4a4_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        self.holds(Layout::Nvfp4)
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
                && self.holds(Layout::Nvfp4)
                && self.kernels.nvfp4_proj_mx.ok()
                && self.kernels.quant_nvfp4.ok())
    }

    /// The fused FP8 gate+up GEMV serves decode: fused weight installed, lever on, kernel resolved.
    pub fn gateup_fused_plan(&self, ctx: &ForwardContext) -> bool {
        self.get(key::FP8).is_some_and(|o| o.fused.is_some())
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
