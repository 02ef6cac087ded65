//! The test-data helpers of the `nvfp4_t` layout (`testing`, re-exported there): the NVFP4 base
//! installed with its `nvfp4_t` copy.

use crate::converters::layouts::{self, Encoded};
use crate::ffn::{DenseFfnLayer, Nvfp4TWeight};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::layouts::nvfp4::testing::{install_nvfp4_encoded, nvfp4_encoded};
use crate::testing::*;

/// Install the NVFP4 base and its transposed `_t` copies (`nvfp4_t` layout, owned by the layer).
pub fn install_nvfp4_t(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let enc = nvfp4_encoded(w);
    install_nvfp4_encoded(b, layer, &enc)?;
    let t = |(e, n, _): &(Encoded, usize, usize)| -> GpuResult<Option<Nvfp4TWeight>> {
        let t = layouts::nvfp4_t::from_nvfp4(&e.parts[0].1, &e.parts[1].1, 0.0, *n, e.padded[1]);
        Ok(Some(Nvfp4TWeight {
            codes: alloc_upload(b, &t.parts[0].1)?,
            scales: alloc_upload(b, &t.parts[1].1)?,
            np: t.padded[0],
            owned: true,
        }))
    };
    layer.set_nvfp4_t_weights([t(&enc[0])?, t(&enc[1])?, t(&enc[2])?])
}
