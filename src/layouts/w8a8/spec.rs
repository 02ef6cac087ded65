//! `w8a8`: int8 codes with per-row f32 scales for the W8A8 decode arm.

use crate::converters::layouts::w8a8;
use crate::error::Result;
use crate::ffn::W8a8Weight;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;
use crate::manifest::ConvertOptions;
use crate::model::{FfnWeight, Model};

pub struct W8a8;

/// Whether `w` is an E4M3 weight with one scale per row or one for the tensor: what this layout
/// stores as the source does.
fn fp8_rows(w: &FfnWeight) -> Option<(usize, usize)> {
    match *w {
        FfnWeight::Fp8Channel { weight, scale } | FfnWeight::Fp8Tensor { weight, scale } => {
            Some((weight, scale))
        }
        FfnWeight::Half { ref of, .. } => fp8_rows(of),
        _ => None,
    }
}

impl W8a8 {
    /// Source weight `pi`'s E4M3 codes and row scales, cut to the rank's slice (scale rows cut
    /// with the rows; a column cut keeps them whole; padded rows get scale 0, as encoding
    /// zeros gives): `None` for other sources, and where a scale or code is not finite (the
    /// encoder then refuses it, or with `--allow-nonfinite` encodes it).
    fn carried(cx: &EncodeCx, pi: usize) -> Result<Option<(Vec<u8>, Vec<f32>)>> {
        let Some((weight, scale)) = fp8_rows(cx.weight(pi)) else {
            return Ok(None);
        };
        let [fnn, fk] = cx.full_shape(pi)?;
        let mut s = cx.model.floats(scale, "weight_scale")?;
        if let FfnWeight::Half { half, .. } = *cx.weight(pi)
            && s.len() != 1
        {
            s = s
                .get(half as usize * fnn..(half as usize + 1) * fnn)
                .unwrap_or_default()
                .to_vec();
        }
        if s.len() == 1 {
            s = vec![s[0]; fnn];
        }
        let Some(codes) = cx.stored(pi, weight, [fnn as u64, fk as u64], (1, 1), 1) else {
            return Ok(None);
        };
        if s.len() != fnn
            || s.iter().any(|v| !v.is_finite())
            || codes.iter().any(|&c| c & 0x7f == 0x7f)
        {
            return Ok(None);
        }
        if let Some((false, [lo, hi])) = cx.cut(pi) {
            s = s[lo as usize..hi as usize].to_vec();
            s.resize(s.len() + cx.pad() as usize, 0.0);
        }
        Ok(Some((codes.into_owned(), s)))
    }
}

impl LayoutSpec for W8a8 {
    fn layout(&self) -> Layout {
        Layout::W8a8
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &["codes", "scales"]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, ru(k, w8a8::K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], _: u64) -> Option<u64> {
        match part {
            "codes" => np.checked_mul(kp),
            "scales" => np.checked_mul(4),
            _ => None,
        }
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let pi = source_index(proj);
        let [n, k] = cx.shape(pi)?;
        Ok(Some(match Self::carried(cx, pi)? {
            Some((codes, scales)) => w8a8::carry(&codes, &scales, n, k),
            None => w8a8::encode(&cx.dense(pi)?, n, k),
        }))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, k], kp) = (b.shape, b.padded[1]);
        Ok(w8a8::decode(b.part("codes")?, b.part("scales")?, n, k, kp))
    }
    fn keeps(&self, _: &Model, w: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        fp8_rows(w).is_some()
    }
    fn default_rank(&self) -> Option<u8> {
        Some(20)
    }
    fn keeps_what(&self) -> &'static str {
        "FP8 per channel, FP8 per tensor"
    }
    fn scale_rule(&self) -> Option<ElementRule> {
        Some(ElementRule::F32)
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        if !v.all("codes") || !v.all("scales") {
            return;
        }
        o.overlays.set(
            key::W8A8,
            [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
                let (weight, fe) = v.get(p, "codes").expect("checked");
                let (scale, _) = v.get(p, "scales").expect("checked");
                let (n, k, _, kp) = dims(fe);
                W8a8Weight {
                    weight,
                    scale,
                    n,
                    k,
                    kp,
                }
            }),
        );
    }
}
