//! The test-data helpers of the `nvfp4_mmq` layout (`testing`, re-exported there): the NVFP4 base
//! installed with its `nvfp4_mmq` copy.

use crate::converters::layouts::{self, Encoded};
use crate::ffn::DenseFfnLayer;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, alloc_upload};
use crate::layouts::nvfp4::testing::{install_nvfp4_encoded, nvfp4_encoded};
use crate::testing::*;

/// Install the NVFP4 base and the converter's `nvfp4_mmq` tiles (as a pack gives them).
pub fn install_nvfp4_mmq(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let enc = nvfp4_encoded(w);
    install_nvfp4_encoded(b, layer, &enc)?;
    let t = |(e, n, _): &(Encoded, usize, usize)| -> GpuResult<Option<DevicePtr>> {
        let t = layouts::nvfp4_mmq::from_nvfp4(&e.parts[0].1, &e.parts[1].1, 0.0, *n, e.padded[1]);
        Ok(Some(alloc_upload(b, &t.parts[0].1)?))
    };
    layer.set_nvfp4_mmq_tiles([t(&enc[0])?, t(&enc[1])?, t(&enc[2])?])
}
