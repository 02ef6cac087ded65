//! The test-data helpers of the `q2g128` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay, and the weights as it holds them.

use crate::converters::layouts::{self};
use crate::ffn::{DenseFfnLayer, Q2g128Weight};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

/// Install the packed q2g128 overlay (`q2g128` layout) encoded from the f32 weights.
pub fn install_q2(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let up = |x: &[f32], n: usize, k: usize| -> GpuResult<Q2g128Weight> {
        let e = layouts::q2g128::encode(x, n, k);
        Ok(Q2g128Weight {
            blocks: alloc_upload(b, &e.parts[0].1)?,
            n,
            k,
            kp: e.padded[1],
        })
    };
    layer.set_q2_weights(up(&w.gate, i, h)?, up(&w.up, i, h)?, up(&w.down, h, i)?)
}

/// The weights as the `q2g128` layout holds them; with `bf16`, each value then rounded to BF16
/// (what `q2g128_dequant_bf16` feeds the BF16 GEMM).
pub fn q2_decoded(w: &DenseWeights, bf16: bool) -> DenseWeights {
    decoded(w, |x, n, k| {
        let e = layouts::q2g128::encode(x, n, k);
        let v = layouts::q2g128::decode(&e.parts[0].1, n, k, e.padded[1]);
        if bf16 { bf16_rounded(v) } else { v }
    })
}
