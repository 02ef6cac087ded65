//! `affine`: integer codes (4 or 8 bits) with a half scale and offset per group of 32, and the
//! affine arms (decode GEMVs; prefill dequantized to BF16 for the BF16 GEMM).

use super::super::*;
use super::Runtime;
use super::super::weights::{accessors, projection_weight, refuse};

use crate::converters::layouts::affine;
use crate::gpu::sizes::AFFINE_GROUP;
use crate::gpu::{DevicePtr, GpuResult};

use super::super::routing::always;
use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(super) mod keys {
    use super::*;
    /// `affine`: gate, up, down.
    pub const AFFINE: Key<[AffineWeight; 3]> = Key::new(Layout::Affine);
}

/// Its entry in the runtime registry.
pub(super) const RUNTIME: Runtime = Runtime {
    layout: Layout::Affine,
    builds_on: None,
    install,
    arms: &ARMS,
};

/// Install this layer's `affine` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::AFFINE) {
        Some(&[g, u, d]) => l.set_affine_weights(g, u, d),
        None => Ok(()),
    }
}

pub use crate::gpu::sizes::AFFINE_GEMV_MAX_ROWS;

/// Its rows of the arm table, ranked within each method (`routing::arms`).
#[rustfmt::skip]
static ARMS: [Arm; 3] = [
    Arm::new(Decode, "affine gemv", Affine, always, |l, c, x, m| l.affine_gemv_arm(c, x, m)).rank(25),
    Arm::new(Small, "affine batch", Affine, |_, _, m| m <= AFFINE_GEMV_MAX_ROWS, |l, c, x, m| l.affine_gemv_arm(c, x, m)).rank(15),
    Arm::new(Prefill, "affine", Affine, always, |l, c, x, m| l.affine_prefill_arm(c, x, m)).rank(25),
];

/// Affine integer weight (`affine` layout): codes `[n, kp]` at `bits` (4: two a byte; 8), and
/// per group of [`AFFINE_GROUP`] values the half scale then the half offset (`sb`, 4 bytes a
/// group).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AffineWeight {
    pub(crate) codes: DevicePtr,
    pub(crate) scales: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
    pub(crate) bits: u32,
    pub(crate) group: usize,
}
projection_weight!(AffineWeight, "A validated affine weight of `[n, k]` stored as `[n, kp]`." {
    codes: DevicePtr,
    scales: DevicePtr,
    n: usize,
    k: usize,
    kp: usize,
    bits: u32,
    group: usize
});

impl AffineWeight {
    /// The `affine` layout's rules: 4 or 8 bits, groups of [`AFFINE_GROUP`], kp % 128, buffers
    /// that hold the codes and the scale pairs.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let w = self;
        let fits_all = affine::codes_bytes(w.n as u64, w.kp as u64, w.bits)
            .is_some_and(|b| b <= w.codes.bytes)
            && affine::scales_bytes(w.n as u64, w.kp as u64, w.group as u64)
                .is_some_and(|b| b <= w.scales.bytes);
        if !affine::valid(w.bits, w.group, w.kp) || w.kp < w.k || !fits_all {
            return Err(refuse(
                what,
                format!(
                    "bits {} / group {} / kp {} / {} and {} bytes do not fit the affine layout of [{}, {}] (4 or 8 bits, groups of {AFFINE_GROUP}, kp % {})",
                    w.bits,
                    w.group,
                    w.kp,
                    w.codes.bytes,
                    w.scales.bytes,
                    w.n,
                    w.k,
                    affine::K_ALIGN
                ),
            ));
        }
        Ok(())
    }
}

impl DenseFfnLayer {
    /// Install the affine integer overlay (`affine` layout). Its arms: decode and up to
    /// [`AFFINE_GEMV_MAX_ROWS`] rows through the affine GEMVs, prefill dequantized to BF16 (one projection at a time into the
    /// context's scratch) and multiplied by the BF16 GEMM.
    pub fn set_affine_weights(
        &mut self,
        gate: AffineWeight,
        up: AffineWeight,
        down: AffineWeight,
    ) -> GpuResult<()> {
        self.check_projections("set_affine_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(key::AFFINE, [gate, up, down]);
        Ok(())
    }
}
