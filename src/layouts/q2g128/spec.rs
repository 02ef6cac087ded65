//! `q2g128`: 2-bit weights in groups of 128 (ggml's Q2_0 with group 128) for the q2g128 arms.

use crate::converters::layouts::q2g128;
use crate::converters::{BlockFormat, block_bytes, q2g128::Q2g128 as Block};
use crate::error::Result;
use crate::ffn::Q2g128Weight;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;

pub struct Q2g128;

impl LayoutSpec for Q2g128 {
    fn layout(&self) -> Layout {
        Layout::Q2g128
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &[""]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, ru(k, q2g128::K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], _: u64) -> Option<u64> {
        match part {
            "" => np
                .checked_mul(kp / Block::BLOCK_ELEMS as u64)?
                .checked_mul(block_bytes::<Block>() as u64),
            _ => None,
        }
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let pi = source_index(proj);
        let [n, k] = cx.shape(pi)?;
        Ok(Some(q2g128::encode(&cx.dense(pi)?, n, k)))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, k], kp) = (b.shape, b.padded[1]);
        Ok(q2g128::decode(b.part("")?, n, k, kp))
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        if !v.all("") {
            return;
        }
        o.overlays.set(
            key::Q2G128,
            [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
                let (blocks, fe) = v.get(p, "").expect("checked");
                let (n, k, _, kp) = dims(fe);
                Q2g128Weight { blocks, n, k, kp }
            }),
        );
    }
}
