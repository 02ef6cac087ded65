//! `nvfp4_t`: the NVFP4 codes and scales transposed for the `_t` prefill GEMM.

use super::*;
use crate::converters::layouts::{crop, nvfp4, nvfp4_t};
use crate::ffn::Nvfp4TWeight;

pub struct Nvfp4T;

impl LayoutSpec for Nvfp4T {
    fn layout(&self) -> Layout {
        Layout::Nvfp4T
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &["codes", "scales"]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([ru(n, nvfp4_t::N_ALIGN)?, ru(k, nvfp4::K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], _: u64) -> Option<u64> {
        match part {
            "codes" => np.checked_mul(kp / 2),
            "scales" => np.checked_mul(kp / 16),
            _ => None,
        }
    }
    fn scalar_names(&self) -> &'static [&'static str] {
        &["global_scale"]
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let pi = source_index(proj);
        let [n, _] = cx.shape(pi)?;
        let base = cx.nvfp4_base(pi)?;
        let (codes, scales) = (&base.parts[0].1, &base.parts[1].1);
        let (g, kp) = (base.scalars[0].1, base.padded[1]);
        Ok(Some(nvfp4_t::from_nvfp4(codes, scales, g, n, kp)))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, k], [np, kp]) = (b.shape, b.padded);
        let (c, s) = nvfp4_t::to_nvfp4(b.part("codes")?, b.part("scales")?, n, np, kp);
        let full = nvfp4::decode_padded(&c, &s, b.scalar("global_scale"), n, kp);
        Ok(crop(&full, kp, n, k))
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        o.nvfp4_t = [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
            let (codes, fe) = v.get(p, "codes")?;
            let (scales, _) = v.get(p, "scales")?;
            Some(Nvfp4TWeight {
                codes,
                scales,
                np: dims(fe).2,
                owned: false,
            })
        });
    }
}
