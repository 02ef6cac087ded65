//! The test-data helpers of the `w8a8` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay, and the weights as it holds them.

use crate::converters::layouts::{self};
use crate::ffn::{DenseFfnLayer, W8a8Weight};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

/// Install the W8A8 decode weights.
pub fn install_w8a8(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let up = |x: &[f32], n: usize, k: usize| -> GpuResult<W8a8Weight> {
        let e = layouts::w8a8::encode(x, n, k);
        Ok(W8a8Weight {
            weight: alloc_upload(b, &e.parts[0].1)?,
            scale: alloc_upload(b, &e.parts[1].1)?,
            n,
            k,
            kp: e.padded[1],
        })
    };
    layer.set_w8a8_decode_weights(
        [up(&w.gate, i, h)?, up(&w.up, i, h)?, up(&w.down, h, i)?],
        h,
        i,
    )
}
