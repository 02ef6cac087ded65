//! `nvfp4`: the NVFP4 base (ModelOpt codes and E4M3 block scales, K padded to 64) that the
//! `nvfp4_t`, `nvfp4_mmq`, `lora` and `q4k_mmq` overlays build on, and the NVFP4 arms.

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{projection_weight, refuse, shape_args};
use crate::ffn::*;
use crate::gpu::ModelLevers;

use crate::gpu::{DevicePtr, GpuError, GpuResult};

use crate::ffn::routing::{always, prefill, verify};
use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `nvfp4`: the NVFP4 base of gate, up and down.
    pub const NVFP4: Key<[Nvfp4Weight; 3]> = Key::new(Layout::Nvfp4);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Nvfp4,
    builds_on: None,
    install,
    arms: &ARMS,
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 3] = [
    NamedArm::new("nvfp4", &[Layout::Nvfp4], 40),
    NamedArm::new("nvfp4 silu fused down", &[Layout::Nvfp4], 41).levers(fused_down),
    NamedArm::new("nvfp4 fixed (W4A4)", &[Layout::Nvfp4], 42).fixed(),
];

/// The levers of the `nvfp4 silu fused down` arm.
fn fused_down() -> ModelLevers {
    ModelLevers {
        ffn_silu_fused_down: true,
        ..ModelLevers::default()
    }
}

/// Install this layer's `nvfp4` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::NVFP4) {
        Some(&w) => l.set_nvfp4_weights(w),
        None => Ok(()),
    }
}

/// Its rows of the arm table, ranked within each method (`routing::arms`).
#[rustfmt::skip]
static ARMS: [Arm; 11] = [
    Arm::new(Decode, "nvfp4 w4a4", Nvfp4, |l, c, _| l.single_row_w4a4(c), verify).rank(70),
    Arm::new(Decode, "nvfp4 via prefill", Nvfp4, |_, c, _| c.levers.decode_ffn_via_gemm, prefill).rank(80),
    Arm::new(Decode, "nvfp4 gemv", Nvfp4, always, |l, c, x, m| l.nvfp4_gemv_arm(c, x, m)).rank(90),
    Arm::new(Small, "nvfp4 w4a4", Nvfp4, |l, c, m| l.small_batch_w4a4(c) && l.can_forward_km(m), verify).rank(50),
    // The batch-4 GEMVs serve 2 and 3 rows (the engine's w4a16_gemv_dual_batch2|3).
    Arm::new(Small, "nvfp4 gemv", Nvfp4, always, |l, c, x, m| l.nvfp4_gemv_arm(c, x, m)).rank(60),
    Arm::new(Verify, "nvfp4 w4a4", Nvfp4, |l, c, m| l.km_w4a4(c, m), |l, c, x, m| l.w4a4_arm(c, x, m)).rank(30),
    Arm::new(Verify, "nvfp4 batch-m", Nvfp4, |l, _, m| l.batchm_kernel(m).is_some(), |l, c, x, m| l.nvfp4_batchm_arm(c, x, m)).rank(40),
    Arm::new(Verify, "nvfp4 batch-m refused", Nvfp4, always, |_, _, _, m| Err(batchm_refusal(m))).rank(50),
    Arm::new(Prefill, "nvfp4 wgmma", Nvfp4, |l, c, m| l.nvfp4_wgmma_ok(c, m), |l, c, x, m| l.nvfp4_wgmma_arm(c, x, m)).rank(60),
    Arm::new(Prefill, "nvfp4 gemm", Nvfp4, always, |l, c, x, m| l.nvfp4_prefill_arm(c, x, m)).rank(70),
    Arm::new(Fixed, "nvfp4 w4a4", Nvfp4, |l, c, m| l.fixed_w4a4_ok(c, m), |l, c, x, m| l.w4a4_arm(c, x, m)).rank(20),
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

/// The NVFP4 base (`nvfp4` layout) of one projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nvfp4Weight {
    pub(crate) codes: DevicePtr,
    pub(crate) scales: DevicePtr,
    pub(crate) global_scale: f32,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
}
projection_weight!(Nvfp4Weight, "A validated NVFP4 weight of `[n, k]` stored as `[n, kp]` (codes `[n, kp/2]`, E4M3 block scales `[n, kp/16]`)." {
    codes: DevicePtr,
    scales: DevicePtr,
    global_scale: f32,
    n: usize,
    k: usize,
    kp: usize,
});

impl Nvfp4Weight {
    /// The `nvfp4` layout's rules: k % 32, kp % 64, buffers that hold its codes and scales.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let x = self;
        if !x.k.is_multiple_of(32)
            || !x.kp.is_multiple_of(64)
            || x.kp < x.k
            || !fits(x.codes.bytes, &[x.n, x.kp / 2])
            || !fits(x.scales.bytes, &[x.n, x.kp / 16])
        {
            return Err(refuse(
                what,
                format!(
                    "k {} / kp {} / buffers do not fit the nvfp4 layout (k % 32, kp % 64)",
                    x.k, x.kp
                ),
            ));
        }
        Ok(())
    }
}

shape_args!(Nvfp4Weight);

impl DenseFfnLayer {
    /// Install the NVFP4 base (`nvfp4` layout: ModelOpt codes and scales, K padded to 64).
    pub fn set_nvfp4_weights(&mut self, w: [Nvfp4Weight; 3]) -> GpuResult<()> {
        self.check_projections("set_nvfp4_weights", [Some(&w[0]), Some(&w[1]), Some(&w[2])])?;
        self.overlays.set(key::NVFP4, w);
        Ok(())
    }

    /// The installed NVFP4 base, which the overlays built from it (`_t` copies, MMQ tiles, Q4_K
    /// copies) need first; `what` names the refusing method.
    pub(crate) fn nvfp4_base(&self, what: &str) -> GpuResult<[Nvfp4Weight; 3]> {
        self.get(key::NVFP4)
            .copied()
            .ok_or_else(|| GpuError::Order(format!("{what}: install the nvfp4 base first")))
    }
}
