//! The test-data helpers of the `fp8` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay, and the weights as it holds them.

use crate::converters::layouts::{self, Encoded};
use crate::ffn::{DenseFfnLayer, Fp8Weight};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

pub(super) fn upload_fp8(
    b: &dyn GpuBackend,
    e: &Encoded,
    n: usize,
    k: usize,
) -> GpuResult<Fp8Weight> {
    Ok(Fp8Weight {
        weight: alloc_upload(b, &e.parts[0].1)?,
        scale: alloc_upload(b, &e.parts[1].1)?,
        n,
        k,
        np: e.padded[0],
        kp: e.padded[1],
    })
}

/// Install the FP8 overlay (and, with `fused`, the fused gate+up that gate and up view).
pub fn install_fp8(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
    fused: bool,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let ge = layouts::fp8::encode(&w.gate, i, h);
    let ue = layouts::fp8::encode(&w.up, i, h);
    let down = upload_fp8(b, &layouts::fp8::encode(&w.down, h, i), h, i)?;
    if fused {
        let interp = ge.padded[0];
        let f = layouts::fp8::fuse(ge, ue);
        let fw = upload_fp8(b, &f, 2 * interp, h)?;
        layer.set_fp8_weights(fw.rows(0, i), fw.rows(interp, i), down)?;
        layer.set_fp8_gate_up_fused(fw)
    } else {
        layer.set_fp8_weights(upload_fp8(b, &ge, i, h)?, upload_fp8(b, &ue, i, h)?, down)
    }
}
