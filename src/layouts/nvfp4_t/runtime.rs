//! `nvfp4_t`: the transposed NVFP4 copies the `w4a16_gemm_t*` prefill GEMMs read, beside the
//! `nvfp4` base (the NVFP4 arms read them when held; no arms of its own).

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{accessors, refuse};
use crate::ffn::*;

use crate::gpu::{DevicePtr, GpuBackend, GpuResult};

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `nvfp4_t`: the transposed copies, per projection (held while any is).
    pub const NVFP4_T: Key<[Option<Nvfp4TWeight>; 3]> = Key::new(Layout::Nvfp4T);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Nvfp4T,
    builds_on: Some(Layout::Nvfp4),
    install,
    arms: &[],
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 1] = [NamedArm::new(
    "nvfp4_t",
    &[Layout::Nvfp4, Layout::Nvfp4T],
    43,
)];

/// Install this layer's `nvfp4_t` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::NVFP4_T) {
        Some(&t) => l.set_nvfp4_t_weights(t),
        None => Ok(()),
    }
}

/// The transposed NVFP4 copy (`nvfp4_t` layout) of one projection: codes `[kp, np/2]`,
/// scales `[kp/16, np]`, np = n rounded up to 64. `owned`: the layer allocated it (and frees it
/// in `finalize_nvfp4_mmq_load`); a view into a loaded pack is only dropped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nvfp4TWeight {
    pub(crate) codes: DevicePtr,
    pub(crate) scales: DevicePtr,
    pub(crate) np: usize,
    pub(crate) owned: bool,
}
accessors!(Nvfp4TWeight {
    codes: DevicePtr,
    scales: DevicePtr,
    np: usize,
    owned: bool
});

impl Nvfp4TWeight {
    /// A view of a given `_t` copy (not owned by the layer); validated against its base when
    /// installed (`set_nvfp4_t_weights`).
    pub fn new(codes: DevicePtr, scales: DevicePtr, np: usize) -> Self {
        Nvfp4TWeight {
            codes,
            scales,
            np,
            owned: false,
        }
    }

    /// The `nvfp4_t` layout's rules against the base `base`: np = n rounded up to 64, buffers
    /// that hold `[kp, np/2]` codes and `[kp/16, np]` scales.
    pub(crate) fn validate(&self, base: &Nvfp4Weight, what: &str) -> GpuResult<()> {
        let x = self;
        if x.np != base.n.div_ceil(64) * 64
            || !fits(x.codes.bytes, &[base.kp, x.np / 2])
            || !fits(x.scales.bytes, &[base.kp / 16, x.np])
        {
            return Err(refuse(
                what,
                format!(
                    "np {} / buffers do not fit the nvfp4_t layout of [{}, {}]",
                    x.np, base.n, base.kp
                ),
            ));
        }
        Ok(())
    }
}

impl DenseFfnLayer {
    /// Install the transposed `_t` copies (`nvfp4_t` layout) the `w4a16_gemm_t*` prefill GEMMs
    /// read, per projection (gate, up, down). Needs the `nvfp4` base installed first.
    pub fn set_nvfp4_t_weights(&mut self, t: [Option<Nvfp4TWeight>; 3]) -> GpuResult<()> {
        let w = self.nvfp4_base("set_nvfp4_t_weights")?;
        for (p, (x, base)) in t.iter().zip(w.iter()).enumerate() {
            if let Some(x) = x {
                x.validate(base, &format!("set_nvfp4_t_weights projection {p}"))?;
            }
        }
        self.overlays.set_slots(key::NVFP4_T, t);
        Ok(())
    }

    /// Drop the `_t` copies of the first `count` projections (gate, up, down), freeing those
    /// the layer allocated; views into a loaded pack are only dropped.
    pub(crate) fn drop_t_copies(&mut self, b: &dyn GpuBackend, count: usize) {
        let Some(&t) = self.get(key::NVFP4_T) else {
            return;
        };
        let mut left = t;
        for t in left.iter_mut().take(count) {
            if let Some(t) = t.take()
                && t.owned
            {
                b.free(t.codes);
                b.free(t.scales);
            }
        }
        self.overlays.set_slots(key::NVFP4_T, left);
    }
}
