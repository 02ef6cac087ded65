//! `ggml`: GGUF blocks per projection (any engine type, any mix), and the engine's arms.

use crate::GgmlType;
use crate::converters::layouts::{Layout, ggml};
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{projection_weight, refuse};
use crate::ffn::*;

use crate::gpu::{DevicePtr, GpuResult};

use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `ggml`: gate, up, down, each of its own type.
    pub const GGML: Key<[GgmlWeight; 3]> = Key::new(Layout::Ggml);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Ggml,
    builds_on: None,
    install,
    arms: &ARMS,
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 1] = [NamedArm::new("ggml", &[Layout::Ggml], 80)];

/// Install this layer's `ggml` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::GGML) {
        Some(&[g, u, d]) => l.set_ggml_weights(g, u, d),
        None => Ok(()),
    }
}

/// Whether the engine's kernels are there: the q8_1 quantizers (blocks and split) and the GEMVs.
fn engine(l: &DenseFfnLayer, _: &ForwardContext, _: usize) -> bool {
    let k = &l.kernels;
    k.ggml_gemv_sa.ok() && k.ggml_gemv1.ok() && k.quant_q8_1.ok() && k.quant_q8_1s.ok()
}

/// Its rows of the arm table, ranked within each method (`routing::arms`): the engine's GEMV
/// (`GGML_GEMV_MAX_M` rows a launch), and for a prefill of `GGML_PREFILL_MIN_ROWS` rows or more
/// the dequantization to BF16 and the BF16 GEMM.
#[rustfmt::skip]
static ARMS: [Arm; 4] = [
    Arm::new(Decode, "ggml gemv", Ggml, engine, |l, c, x, m| l.ggml_arm(c, x, m)).rank(27),
    Arm::new(Small, "ggml gemv", Ggml, engine, |l, c, x, m| l.ggml_arm(c, x, m)).rank(17),
    Arm::new(Verify, "ggml gemv", Ggml, engine, |l, c, x, m| l.ggml_arm(c, x, m)).rank(75),
    Arm::new(Prefill, "ggml", Ggml, engine, |l, c, x, m| l.ggml_prefill_arm(c, x, m)).rank(27),
];

/// A projection's GGUF blocks (`ggml` layout): `n` rows of `k` values of type `ty`, each row
/// padded to `kp` values (`ty.row_bytes(kp)` bytes; zeros past `k`), and the factor the
/// projection's output is multiplied by (`scale`: llama.cpp's per-tensor `.scale`, 1 where the
/// source has none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GgmlWeight {
    pub(crate) weight: DevicePtr,
    pub(crate) ty: GgmlType,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
    pub(crate) scale: f32,
}
projection_weight!(GgmlWeight, "A validated weight of `n` rows of `k` values of GGUF type `ty`, stored as rows of `kp`, its output times `scale`." {
    weight: DevicePtr,
    ty: GgmlType,
    n: usize,
    k: usize,
    kp: usize,
    scale: f32
});

impl GgmlWeight {
    /// The `ggml` layout's rules: an engine type, rows of whole blocks, a buffer that holds
    /// them, a finite output scale.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        if !self.scale.is_finite() {
            return Err(refuse(
                what,
                format!("output scale {} is not finite", self.scale),
            ));
        }
        if !ggml::TYPES.contains(&self.ty) {
            return Err(refuse(
                what,
                format!("{} is not a type of the engine", self.ty.name()),
            ));
        }
        match ggml::blob_bytes(self.ty, self.n as u64, self.kp as u64) {
            Some(need) if need <= self.weight.bytes && self.kp >= self.k => Ok(()),
            _ => Err(refuse(
                what,
                format!(
                    "{} rows of {} values (k {}) of {} do not fit {} bytes (rows are whole blocks of {})",
                    self.n,
                    self.kp,
                    self.k,
                    self.ty.name(),
                    self.weight.bytes,
                    self.ty.block_elems()
                ),
            )),
        }
    }
}

impl DenseFfnLayer {
    /// Install GGUF block weights (`ggml` layout), each projection of its own engine type.
    pub fn set_ggml_weights(
        &mut self,
        gate: GgmlWeight,
        up: GgmlWeight,
        down: GgmlWeight,
    ) -> GpuResult<()> {
        self.check_projections("set_ggml_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(key::GGML, [gate, up, down]);
        Ok(())
    }
}
