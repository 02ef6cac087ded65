//! The test-data helpers of the `q4k_mmq` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay, and the weights as it holds them.

use crate::converters::layouts::{self};
use crate::ffn::{DenseFfnLayer, Q4kDown, Q4kMmqWeights};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

/// Install the NVFP4 base and the converter's `q4k_mmq` copies of its decoded values (as a pack
/// gives them): gate/up Q4_K, down int8 rows (or Q4_K with `down_q4k`).
pub fn install_nvfp4_q4k(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
    down_q4k: bool,
) -> GpuResult<()> {
    install_nvfp4(b, layer, w)?;
    install_q4k(b, layer, &nvfp4_decoded(w), down_q4k)
}

/// Install the `q4k_mmq` layout alone (no NVFP4 base), encoded from the values `wd`: gate and
/// up as Q4_K, down as int8 rows (or Q4_K), as a `q4k_mmq`-only pack holds them.
pub fn install_q4k(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    wd: &DenseWeights,
    down_q4k: bool,
) -> GpuResult<()> {
    let (h, i) = (wd.hidden, wd.inter);
    let q = |x: &[f32], n: usize, k: usize| layouts::q4k_mmq::encode_q4k(x, n, k);
    let (ge, ue) = (q(&wd.gate, i, h), q(&wd.up, i, h));
    let down = if down_q4k {
        Q4kDown::Q4k(alloc_upload(b, &q(&wd.down, h, i).parts[0].1)?)
    } else {
        let e = layouts::q4k_mmq::encode_int8(&wd.down, h, i);
        Q4kDown::Int8 {
            codes: alloc_upload(b, &e.parts[0].1)?,
            scales: alloc_upload(b, &e.parts[1].1)?,
        }
    };
    layer.set_q4k_mmq_weights(Q4kMmqWeights::new(
        alloc_upload(b, &ge.parts[0].1)?,
        alloc_upload(b, &ue.parts[0].1)?,
        down,
        (h, i),
        (ge.padded[1], i.div_ceil(256) * 256),
    )?)
}

/// The weights the Q4_K MMQ arm holds: gate/up Q4_K of the NVFP4-decoded values, down int8 rows
/// (or Q4_K).
pub fn q4k_mmq_decoded(w: &DenseWeights, down_q4k: bool) -> DenseWeights {
    let wd = nvfp4_decoded(w);
    let (h, i) = (w.hidden, w.inter);
    let q4k = |x: &[f32], n: usize, k: usize| {
        let e = layouts::q4k_mmq::encode_q4k(x, n, k);
        layouts::q4k_mmq::decode_q4k(&e.parts[0].1, n, k, e.padded[1])
    };
    let down = if down_q4k {
        q4k(&wd.down, h, i)
    } else {
        let e = layouts::q4k_mmq::encode_int8(&wd.down, h, i);
        layouts::q4k_mmq::decode_int8(&e.parts[0].1, &e.parts[1].1, h, i, e.padded[1])
    };
    DenseWeights {
        gate: q4k(&wd.gate, i, h),
        up: q4k(&wd.up, i, h),
        down,
        hidden: h,
        inter: i,
    }
}
