//! `nvfp4`: E2M1 codes and E4M3 block scales per 16, the base of the NVFP4 family.

use crate::converters::layouts::{crop, nvfp4};
use crate::error::Result;
use crate::ffn::Nvfp4Weight;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;
use crate::manifest::ConvertOptions;
use crate::model::Activation;
use crate::model::{FfnWeight, Model};

pub struct Nvfp4;

/// Whether an NVFP4 layout keeps `w`: NVFP4 sources (ModelOpt, compressed-tensors) are carried.
pub(crate) fn keeps_nvfp4(w: &FfnWeight) -> bool {
    matches!(
        w,
        FfnWeight::ModelOptNvfp4 { .. } | FfnWeight::CtNvfp4 { .. }
    )
}

/// What the NVFP4 layouts keep.
pub(crate) const KEEPS_NVFP4: &str = "NVFP4 (ModelOpt, compressed-tensors)";

/// Bytes of the `codes` and `scales` parts of `nvfp4` and `nvfp4_t` (the same counts, laid out
/// differently).
pub(crate) fn codes_scales_bytes(part: &str, [np, kp]: [u64; 2]) -> Option<u64> {
    match part {
        "codes" => np.checked_mul(kp / 2),
        "scales" => np.checked_mul(kp / 16),
        _ => None,
    }
}

/// Encode projection `proj` as a rearrangement of the layer's NVFP4 base (`nvfp4_t`,
/// `nvfp4_mmq`): `f(codes, scales, global_scale, n, kp)`.
pub(crate) fn from_base(
    cx: &mut EncodeCx,
    proj: Proj,
    f: fn(&[u8], &[u8], f32, usize, usize) -> Encoded,
) -> Result<Option<Encoded>> {
    let pi = source_index(proj);
    let [n, _] = cx.shape(pi)?;
    let base = cx.nvfp4_base(pi)?;
    let (codes, scales) = (&base.parts[0].1, &base.parts[1].1);
    Ok(Some(f(codes, scales, base.scalars[0].1, n, base.padded[1])))
}

/// Decode NVFP4 codes and scales of padded width `kp` back to the logical `[n, k]`.
pub(crate) fn decode_base(b: &BlobRead, codes: &[u8], scales: &[u8]) -> Vec<f32> {
    let ([n, k], kp) = (b.shape, b.padded[1]);
    let full = nvfp4::decode_padded(codes, scales, b.scalar("global_scale"), n, kp);
    crop(&full, kp, n, k)
}

impl LayoutSpec for Nvfp4 {
    fn keeps(&self, _: &Model, w: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        keeps_nvfp4(w)
    }
    // The NVFP4 base: the default for every float source.
    fn float_default(&self, _act: Activation) -> bool {
        true
    }
    fn keeps_what(&self) -> &'static str {
        KEEPS_NVFP4
    }
    fn layout(&self) -> Layout {
        Layout::Nvfp4
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &["codes", "scales"]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, ru(k, nvfp4::K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, padded: [u64; 2], _: u64) -> Option<u64> {
        codes_scales_bytes(part, padded)
    }
    fn scalar_names(&self) -> &'static [&'static str] {
        &["global_scale"]
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        Ok(Some((*cx.nvfp4_base(source_index(proj))?).clone()))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        Ok(decode_base(b, b.part("codes")?, b.part("scales")?))
    }
    fn scale_rule(&self) -> Option<ElementRule> {
        Some(ElementRule::E4m3)
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        if !v.all("codes") || !v.all("scales") {
            return;
        }
        o.overlays.set(
            key::NVFP4,
            [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
                let (codes, fe) = v.get(p, "codes").expect("checked");
                let (scales, _) = v.get(p, "scales").expect("checked");
                let (n, k, _, kp) = dims(fe);
                Nvfp4Weight {
                    codes,
                    scales,
                    global_scale: fe.scalars.get("global_scale").copied().unwrap_or(0.0),
                    n,
                    k,
                    kp,
                }
            }),
        );
    }
}
