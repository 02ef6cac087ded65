//! `nvfp4_t`: the NVFP4 codes and scales transposed for the `_t` prefill GEMM.

use crate::converters::layouts::{nvfp4, nvfp4_t};
use crate::error::Result;
use crate::ffn::Nvfp4TWeight;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;
use crate::layouts::nvfp4::spec::{
    KEEPS_NVFP4, codes_scales_bytes, decode_base, from_base, keeps_nvfp4,
};
use crate::manifest::ConvertOptions;
use crate::model::Activation;
use crate::model::{FfnWeight, Model};

pub struct Nvfp4T;

impl LayoutSpec for Nvfp4T {
    fn keeps(&self, _: &Model, w: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        keeps_nvfp4(w)
    }
    // GELU layers keep the transposed `_t` copies for prefill (`finalize_nvfp4_mmq_load` skips them).
    fn float_default(&self, act: Activation) -> bool {
        act == Activation::Gelu
    }
    fn keeps_what(&self) -> &'static str {
        KEEPS_NVFP4
    }
    fn layout(&self) -> Layout {
        Layout::Nvfp4T
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &["codes", "scales"]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([ru(n, nvfp4_t::N_ALIGN)?, ru(k, nvfp4::K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, padded: [u64; 2], _: u64) -> Option<u64> {
        codes_scales_bytes(part, padded)
    }
    fn scalar_names(&self) -> &'static [&'static str] {
        &["global_scale"]
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        from_base(cx, proj, nvfp4_t::from_nvfp4)
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, _], [np, kp]) = (b.shape, b.padded);
        let (c, s) = nvfp4_t::to_nvfp4(b.part("codes")?, b.part("scales")?, n, np, kp);
        Ok(decode_base(b, &c, &s))
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        let t = [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
            let (codes, fe) = v.get(p, "codes")?;
            let (scales, _) = v.get(p, "scales")?;
            Some(Nvfp4TWeight {
                codes,
                scales,
                np: dims(fe).2,
                owned: false,
            })
        });
        o.overlays.set_slots(key::NVFP4_T, t);
    }
}
