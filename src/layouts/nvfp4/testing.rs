//! The test-data helpers of the `nvfp4` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay, and the weights as it holds them.

use crate::converters::layouts::{self, Encoded};
use crate::ffn::{DenseFfnLayer, Nvfp4Weight};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

/// Each projection's `nvfp4` encoding with its `(n, k)`: gate, up, down.
pub(crate) fn nvfp4_encoded(w: &DenseWeights) -> [(Encoded, usize, usize); 3] {
    let (h, i) = (w.hidden, w.inter);
    [(&w.gate, i, h), (&w.up, i, h), (&w.down, h, i)]
        .map(|(x, n, k)| (layouts::nvfp4::encode(x, n, k), n, k))
}

/// Upload `enc` (from [`nvfp4_encoded`]) and install it as the NVFP4 base.
pub(crate) fn install_nvfp4_encoded(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    enc: &[(Encoded, usize, usize); 3],
) -> GpuResult<()> {
    let up = |(e, n, k): &(Encoded, usize, usize)| -> GpuResult<Nvfp4Weight> {
        Ok(Nvfp4Weight {
            codes: alloc_upload(b, &e.parts[0].1)?,
            scales: alloc_upload(b, &e.parts[1].1)?,
            global_scale: e.scalars[0].1,
            n: *n,
            k: *k,
            kp: e.padded[1],
        })
    };
    layer.set_nvfp4_weights([up(&enc[0])?, up(&enc[1])?, up(&enc[2])?])
}

/// Install the NVFP4 base (`nvfp4` layout) encoded from the f32 weights.
pub fn install_nvfp4(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    install_nvfp4_encoded(b, layer, &nvfp4_encoded(w))
}

/// The weights as the `nvfp4` layout holds them (encode, then decode).
pub fn nvfp4_decoded(w: &DenseWeights) -> DenseWeights {
    decoded(w, |x, n, k| {
        let e = layouts::nvfp4::encode(x, n, k);
        let kp = e.padded[1];
        layouts::crop(
            &layouts::nvfp4::decode_padded(&e.parts[0].1, &e.parts[1].1, e.scalars[0].1, n, kp),
            kp,
            n,
            k,
        )
    })
}
