//! Routing: the table of arms ([`ARMS`]) every forward method walks, the layouts a layer
//! holds ([`DenseFfnLayer::holds`]), and the predicates the arms ask (levers, kernels, rows).

use super::*;

use crate::converters::layouts::Layout;
use crate::gpu::{DevicePtr, GpuError, GpuResult};
use crate::model::Activation;
use std::sync::RwLock;

/// The public forward methods, as the arm table names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    when: fn(&DenseFfnLayer, &ForwardContext, usize) -> bool,
    run: Run,
}

impl Arm {
    /// An arm (a row of [`ARMS`], or of a layout registered at run time with `layout::register`):
    /// it serves `method` on a layer holding `layout`'s overlay when `when` says so, by `run` (which reads the overlay
    /// with [`DenseFfnLayer::overlay`] and launches through [`DenseFfnLayer::launch`] and
    /// [`DenseFfnLayer::gated`]). Registered with [`register_arms`].
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
            when,
            run,
        }
    }
}

/// The arms registered at run time, tried after [`ARMS`] in the order registered.
static REGISTERED_ARMS: RwLock<Vec<&'static [Arm]>> = RwLock::new(Vec::new());

/// Register the arms of layouts registered at run time (each arm's layout must be one:
/// built-in layouts' arms are [`ARMS`]). Registering the same table again does nothing.
pub fn register_arms(arms: &'static [Arm]) -> crate::Result<()> {
    if let Some(a) = arms.iter().find(|a| !matches!(a.layout, Layout::Custom(_))) {
        return Err(crate::Error::Register {
            what: format!("arm {:?}", a.name),
            reason: format!(
                "its layout {} is built in; its arms are ffn::ARMS",
                a.layout.tag()
            ),
        });
    }
    let mut reg = REGISTERED_ARMS.write().unwrap_or_else(|e| e.into_inner());
    if !reg.iter().any(|r| std::ptr::eq(*r, arms)) {
        reg.push(arms);
    }
    Ok(())
}

fn always(_: &DenseFfnLayer, _: &ForwardContext, _: usize) -> bool {
    true
}

fn prefill(
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    x: DevicePtr,
    m: usize,
) -> GpuResult<DevicePtr> {
    l.forward_prefill(c, x, m)
}

fn verify(
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    x: DevicePtr,
    m: usize,
) -> GpuResult<DevicePtr> {
    l.forward_km(c, x, m)
}

use Layout::{Bf16, Fp8, Nvfp4, Q2g128, W8a8};
use Method::{Decode, Fixed, Prefill, Small, Verify};

/// Every arm, in the order a method tries them: the first whose layout is installed and whose
/// condition holds serves the call. Adding an arm is a line here and its functions in `arms/`.
#[rustfmt::skip]
pub static ARMS: [Arm; 30] = [
    // forward: one decode row.
    Arm::new(Decode, "w8a8", W8a8, |l, c, _| l.fixed_w8a8_ok(c, 1), |l, c, x, m| l.w8a8_arm(c, x, m)),
    Arm::new(Decode, "q2g128 gemv", Q2g128, always, |l, c, x, m| l.q2_gemv_arm(c, x, m)),
    Arm::new(Decode, "fp8 fused gate+up", Fp8, |l, c, _| l.gateup_fused_plan(c), |l, c, x, _| l.fp8_fused_decode(c, x)),
    Arm::new(Decode, "fp8", Fp8, always, |l, c, x, m| l.fp8_arm(c, x, m)),
    Arm::new(Decode, "bf16 gemv", Bf16, |l, _, _| l.kernels.bf16_gemv.ok(), |l, c, x, m| l.bf16_gemv_arm(c, x, m)),
    Arm::new(Decode, "bf16 via prefill", Bf16, always, prefill),
    Arm::new(Decode, "nvfp4 w4a4", Nvfp4, |l, c, _| l.single_row_w4a4(c), verify),
    Arm::new(Decode, "nvfp4 via prefill", Nvfp4, |_, c, _| c.levers.decode_ffn_via_gemm, prefill),
    Arm::new(Decode, "nvfp4 gemv", Nvfp4, always, |l, c, x, m| l.nvfp4_gemv_arm(c, x, m)),
    // forward_k2, forward_k3.
    Arm::new(Small, "q2g128 batch-m", Q2g128, always, |l, c, x, m| l.forward_km_q2(c, x, m)),
    Arm::new(Small, "w8a8 via prefill", W8a8, always, prefill),
    Arm::new(Small, "fp8 via prefill", Fp8, always, prefill),
    Arm::new(Small, "bf16 via prefill", Bf16, always, prefill),
    Arm::new(Small, "nvfp4 w4a4", Nvfp4, |l, c, m| l.small_batch_w4a4(c) && l.can_forward_km(m), verify),
    // The batch-4 GEMVs serve 2 and 3 rows (the engine's w4a16_gemv_dual_batch2|3).
    Arm::new(Small, "nvfp4 gemv", Nvfp4, always, |l, c, x, m| l.nvfp4_gemv_arm(c, x, m)),
    // forward_km.
    Arm::new(Verify, "fp8 via prefill", Fp8, always, prefill),
    Arm::new(Verify, "bf16 via prefill", Bf16, always, prefill),
    Arm::new(Verify, "nvfp4 w4a4", Nvfp4, |l, c, m| l.km_w4a4(c, m), |l, c, x, m| l.w4a4_arm(c, x, m)),
    Arm::new(Verify, "nvfp4 batch-m", Nvfp4, |l, _, m| l.batchm_kernel(m).is_some(), |l, c, x, m| l.nvfp4_batchm_arm(c, x, m)),
    Arm::new(Verify, "nvfp4 batch-m refused", Nvfp4, always, |_, _, _, m| Err(batchm_refusal(m))),
    // forward_prefill.
    Arm::new(Prefill, "w8a8", W8a8, |l, c, m| m <= c.levers.w8a8_max_rows && l.fixed_w8a8_ok(c, m), |l, c, x, m| l.w8a8_arm(c, x, m)),
    Arm::new(Prefill, "q2g128", Q2g128, always, |l, c, x, m| l.q2_prefill_arm(c, x, m)),
    Arm::new(Prefill, "fp8", Fp8, always, |l, c, x, m| l.fp8_arm(c, x, m)),
    Arm::new(Prefill, "bf16", Bf16, always, |l, c, x, m| l.bf16_prefill_arm(c, x, m)),
    Arm::new(Prefill, "q4k mmq", Nvfp4, |l, c, _| c.levers.q4k_mmq && l.holds(Layout::Q4kMmq), |l, c, x, m| l.q4k_mmq_arm(c, x, m)),
    Arm::new(Prefill, "nvfp4 wgmma", Nvfp4, |l, c, m| l.nvfp4_wgmma_ok(c, m), |l, c, x, m| l.nvfp4_wgmma_arm(c, x, m)),
    Arm::new(Prefill, "nvfp4 gemm", Nvfp4, always, |l, c, x, m| l.nvfp4_prefill_arm(c, x, m)),
    Arm::new(Prefill, "w8a8 past its rows", W8a8, always, |_, c, _, m| Err(w8a8_rows_refusal(c, m))),
    // forward_fixed.
    Arm::new(Fixed, "w8a8", W8a8, |l, c, m| l.fixed_w8a8_ok(c, m), |l, c, x, m| l.w8a8_arm(c, x, m)),
    Arm::new(Fixed, "nvfp4 w4a4", Nvfp4, |l, c, m| l.fixed_w4a4_ok(c, m), |l, c, x, m| l.w4a4_arm(c, x, m)),
];

/// `forward_km` of an NVFP4 layer whose batch-m tier is missing, or past its rows.
fn batchm_refusal(m: usize) -> GpuError {
    match m {
        1..=16 => missing("ffn_nvfp4", "nvfp4_proj_small_m4|8|16"),
        _ => GpuError::NotServed(format!(
            "forward_km: {m} rows, the batch-m tiers serve 1..=16"
        )),
    }
}

/// A prefill past the W8A8 arm's rows on a layer with nothing else.
fn w8a8_rows_refusal(c: &ForwardContext, m: usize) -> GpuError {
    GpuError::NotServed(format!(
        "forward_prefill: {m} rows exceed the W8A8 arm's {} and no other weights are installed",
        c.levers.w8a8_max_rows
    ))
}

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
    /// Whether this layer holds `layout`'s overlay (for `nvfp4_t` and `nvfp4_mmq`: for any
    /// projection). The one place the arms' layouts are read.
    pub fn holds(&self, layout: Layout) -> bool {
        self.overlays.holds(layout)
    }

    /// The arm that serves `method` on `m` rows now, if any: the first of [`ARMS`] whose layout
    /// this layer holds and whose condition holds.
    pub fn serving_arm(
        &self,
        ctx: &ForwardContext,
        method: Method,
        m: usize,
    ) -> Option<&'static Arm> {
        let serves =
            |a: &&Arm| a.method == method && self.holds(a.layout) && (a.when)(self, ctx, m);
        ARMS.iter().find(serves).or_else(|| {
            if !self
                .overlays
                .iter()
                .any(|(l, _)| matches!(l, Layout::Custom(_)))
            {
                return None;
            }
            let reg = REGISTERED_ARMS.read().unwrap_or_else(|e| e.into_inner());
            reg.iter().flat_map(|arms| arms.iter()).find(serves)
        })
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
            && self.holds(Layout::W8a8)
            && self.activation == Activation::Silu
            && self.kernels.quant_fp8_row.ok()
            && self.kernels.w8a8.ok()
            && (1..=ctx.max_tokens).contains(&m)
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
