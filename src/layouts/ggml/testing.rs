//! The test-data helpers of the `ggml` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay as a mix of engine types, as llama-quantize mixes
//! them.

use crate::GgmlType;
use crate::converters::layouts::{pad, round_up};
use crate::converters::{encode_to_vec, q4_0::Q4_0, q4_k::Q4K, q8_0::Q8_0};
use crate::ffn::{DenseFfnLayer, GgmlWeight};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

/// `x` (`[n, k]`) as GGUF blocks of `ty` (Q4_0, Q4_K or Q8_0: this crate's quantizers).
pub fn ggml_blocks(x: &[f32], ty: GgmlType) -> Vec<u8> {
    match ty {
        GgmlType::Q4_0 => encode_to_vec::<Q4_0>(x),
        GgmlType::Q4_K => encode_to_vec::<Q4K>(x),
        GgmlType::Q8_0 => encode_to_vec::<Q8_0>(x),
        _ => unreachable!("ggml_blocks: {ty:?} has no quantizer here (libgguf's in the tests)"),
    }
}

/// Install the `ggml` overlay: gate as Q4_K (Q4_0 where rows are not whole super-blocks), up as
/// Q4_0, down as Q8_0, rows zero-padded to whole blocks of 32.
pub fn install_ggml(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let up = |x: &[f32], n: usize, k: usize, ty: GgmlType| -> GpuResult<GgmlWeight> {
        let ty = if !k.is_multiple_of(256) && ty == GgmlType::Q4_K {
            GgmlType::Q4_0
        } else {
            ty
        };
        let kp = round_up(k, 32);
        let blocks = ggml_blocks(&pad(x, n, k, n, kp), ty);
        GgmlWeight::new(alloc_upload(b, &blocks)?, ty, n, k, kp)
    };
    layer.set_ggml_weights(
        up(&w.gate, i, h, GgmlType::Q4_K)?,
        up(&w.up, i, h, GgmlType::Q4_0)?,
        up(&w.down, h, i, GgmlType::Q8_0)?,
    )
}
