//! `bf16`: BF16 rows padded to the GEMM's K alignment (BF16 sources carried byte for byte).

use crate::GgmlType;
use crate::converters::layouts::bf16;
use crate::error::Result;
use crate::ffn::Bf16Weight;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;
use crate::manifest::ConvertOptions;
use crate::model::DType;
use crate::model::{FfnWeight, Model};
use safetensors::Dtype;

pub struct Bf16;

impl LayoutSpec for Bf16 {
    /// Every float source's values are kept (BF16 byte for byte, or widened to it).
    fn keeps(&self, _: &Model, _: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        true
    }
    fn keeps_what(&self) -> &'static str {
        "every float source's values (BF16 byte for byte)"
    }
    fn layout(&self) -> Layout {
        Layout::Bf16
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &[""]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, ru(k, bf16::K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], _: u64) -> Option<u64> {
        match part {
            "" => np.checked_mul(kp)?.checked_mul(2),
            _ => None,
        }
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let pi = source_index(proj);
        let [n, k] = cx.shape(pi)?;
        let w = cx.weight(pi);
        let full = cx.full_shape(pi)?.map(|d| d as u64);
        let carried = match cx.model.tensors[w.main()].dtype {
            DType::Ggml(GgmlType::BF16) | DType::St(Dtype::BF16)
                if matches!(w, FfnWeight::Plain { .. }) =>
            {
                cx.stored(pi, w.main(), full, (1, 2), 1)
            }
            _ => None,
        };
        Ok(Some(match carried {
            Some(b) => bf16::carry(&b, n, k),
            None => bf16::encode(&cx.dense(pi)?, n, k),
        }))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, k], kp) = (b.shape, b.padded[1]);
        Ok(bf16::decode(b.part("")?, n, k, kp))
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        if !v.all("") {
            return;
        }
        o.overlays.set(
            key::BF16,
            [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
                let (weight, fe) = v.get(p, "").expect("checked");
                let (n, k, _, kp) = dims(fe);
                Bf16Weight { weight, n, k, kp }
            }),
        );
    }
}
