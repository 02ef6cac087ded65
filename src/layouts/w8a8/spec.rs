//! `w8a8`: int8 codes with per-row f32 scales for the W8A8 decode arm.

use crate::converters::layouts::w8a8;
use crate::error::Result;
use crate::ffn::W8a8Weight;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;

pub struct W8a8;

impl LayoutSpec for W8a8 {
    fn gelu_refusal(&self) -> Option<&'static str> {
        Some("layout w8a8 is refused for GELU layers (set_w8a8_decode_weights refuses a GELU FFN)")
    }
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
        Ok(Some(w8a8::encode(&cx.dense(pi)?, n, k)))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, k], kp) = (b.shape, b.padded[1]);
        Ok(w8a8::decode(b.part("codes")?, b.part("scales")?, n, k, kp))
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
