//! The test-data helpers of the `bf16` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay, and the weights as it holds them.

use crate::converters::layouts::{self};
use crate::ffn::{Bf16Weight, DenseFfnLayer};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

/// Install the BF16 overlay.
pub fn install_bf16(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let up = |x: &[f32], n: usize, k: usize| -> GpuResult<Bf16Weight> {
        let e = layouts::bf16::encode(x, n, k);
        Ok(Bf16Weight {
            weight: alloc_upload(b, &e.parts[0].1)?,
            n,
            k,
            kp: e.padded[1],
        })
    };
    layer.set_bf16_weights(up(&w.gate, i, h)?, up(&w.up, i, h)?, up(&w.down, h, i)?)
}
