//! `fp8`: E4M3 with 128x128 block scales, gate and up fused, and the FP8 arms.

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{projection_weight, refuse, shape_args};
use crate::ffn::*;

use crate::gpu::{DevicePtr, GpuError, GpuResult};

use crate::ffn::routing::{always, prefill};
use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `fp8`: gate, up, down and the fused gate+up they may view.
    pub const FP8: Key<Fp8Overlay> = Key::new(Layout::Fp8);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Fp8,
    builds_on: None,
    install,
    arms: &ARMS,
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 1] = [NamedArm::new("fp8", &[Layout::Fp8], 20)];

/// Install this layer's `fp8` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    let Some(f) = o.get(key::FP8) else {
        return Ok(());
    };
    l.set_fp8_weights(f.gate, f.up, f.down)?;
    match f.fused {
        Some(fused) => l.set_fp8_gate_up_fused(fused),
        None => Ok(()),
    }
}

/// Its rows of the arm table, ranked within each method (`routing::arms`).
#[rustfmt::skip]
static ARMS: [Arm; 5] = [
    Arm::new(Decode, "fp8 fused gate+up", Fp8, |l, c, _| l.gateup_fused_plan(c), |l, c, x, _| l.fp8_fused_decode(c, x)).rank(30),
    Arm::new(Decode, "fp8", Fp8, always, |l, c, x, m| l.fp8_arm(c, x, m)).rank(40),
    Arm::new(Small, "fp8 via prefill", Fp8, always, prefill).rank(30),
    Arm::new(Verify, "fp8 via prefill", Fp8, always, prefill).rank(10),
    Arm::new(Prefill, "fp8", Fp8, always, |l, c, x, m| l.fp8_arm(c, x, m)).rank(30),
];

/// Block-scaled FP8 weight (`fp8` layout): E4M3 `[np, kp]`, f32 scales `[np/128, kp/128]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Weight {
    pub(crate) weight: DevicePtr,
    pub(crate) scale: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) np: usize,
    pub(crate) kp: usize,
}
projection_weight!(Fp8Weight, "A validated FP8 weight of `[n, k]` stored as `[np, kp]`." {
    weight: DevicePtr,
    scale: DevicePtr,
    n: usize,
    k: usize,
    np: usize,
    kp: usize
});

impl Fp8Weight {
    /// The `fp8` layout's rules: k % 16, np and kp % 128, buffers that hold `[np, kp]` codes and
    /// `[np/128, kp/128]` f32 scales.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let w = self;
        if !w.k.is_multiple_of(16)
            || !w.kp.is_multiple_of(128)
            || !w.np.is_multiple_of(128)
            || w.kp < w.k
            || w.np < w.n
        {
            return Err(refuse(
                what,
                format!(
                    "n {} / np {} / k {} / kp {} do not fit the fp8 layout (k % 16, np and kp % 128)",
                    w.n, w.np, w.k, w.kp
                ),
            ));
        }
        if !fits(w.weight.bytes, &[w.np, w.kp])
            || !fits(w.scale.bytes, &[w.np / 128, w.kp / 128, 4])
        {
            return Err(refuse(
                what,
                format!("buffers too small for [{}, {}]", w.np, w.kp),
            ));
        }
        Ok(())
    }

    /// A view of rows `[row0, row0 + n)` of a fused weight (row0 a multiple of 128).
    pub fn rows(&self, row0: usize, n: usize) -> Fp8Weight {
        assert!(row0.is_multiple_of(128));
        let np = round_up(n, 128);
        Fp8Weight {
            weight: self
                .weight
                .view((row0 * self.kp) as u64, (np * self.kp) as u64),
            scale: self.scale.view(
                (row0 / 128 * self.kp / 128 * 4) as u64,
                (np / 128 * self.kp / 128 * 4) as u64,
            ),
            n,
            k: self.k,
            np,
            kp: self.kp,
        }
    }
}

/// The FP8 overlay: gate, up, down and, optionally, the fused gate+up they view.
#[derive(Clone, Debug)]
pub struct Fp8Overlay {
    pub(crate) gate: Fp8Weight,
    pub(crate) up: Fp8Weight,
    pub(crate) down: Fp8Weight,
    pub(crate) fused: Option<Fp8Weight>,
}

shape_args!(Fp8Weight);

impl DenseFfnLayer {
    /// Install the native block-scaled FP8 overlay (`fp8` layout).
    pub fn set_fp8_weights(
        &mut self,
        gate: Fp8Weight,
        up: Fp8Weight,
        down: Fp8Weight,
    ) -> GpuResult<()> {
        self.check_projections("set_fp8_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(
            key::FP8,
            Fp8Overlay {
                gate,
                up,
                down,
                fused: None,
            },
        );
        Ok(())
    }

    /// Install the fused `[2*inter, hidden]` FP8 gate+up weight whose views the installed gate
    /// and up are (gate = rows `[0, inter)`, up = rows `[interp, interp + inter)`).
    pub fn set_fp8_gate_up_fused(&mut self, fused: Fp8Weight) -> GpuResult<()> {
        let interp = round_up(self.inter, 128);
        let mut ov = self.get(key::FP8).cloned().ok_or_else(|| {
            GpuError::Order("set_fp8_gate_up_fused: install set_fp8_weights first".into())
        })?;
        debug_assert_eq!(
            ov.gate.weight.addr, fused.weight.addr,
            "gate must be a view of the fused weight"
        );
        if ov.gate.weight.addr != fused.weight.addr
            || ov.up.weight.addr != fused.weight.addr + (interp * fused.kp) as u64
        {
            return Err(GpuError::Shape(
                "set_fp8_gate_up_fused: gate and up are not views of the fused weight".into(),
            ));
        }
        if fused.n != 2 * interp || fused.k != self.hidden {
            return Err(GpuError::Shape(format!(
                "set_fp8_gate_up_fused: shape [{}, {}], needs [{}, {}]",
                fused.n,
                fused.k,
                2 * interp,
                self.hidden
            )));
        }
        fused.validate("set_fp8_gate_up_fused")?;
        ov.fused = Some(fused);
        self.overlays.set(key::FP8, ov);
        Ok(())
    }
}
