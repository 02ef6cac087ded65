//! `lora`: a PEFT adapter's A and B per targeted projection, BF16, with rank and scaling.

use crate::converters::layouts::lora;
use crate::error::Result;
use crate::ffn::LoraWeight;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;
use crate::manifest::ConvertOptions;
use crate::model::{FfnWeight, Model};

pub struct Lora;

impl LayoutSpec for Lora {
    /// It holds an adapter, not the weights: nothing is quantized.
    fn keeps(&self, _: &Model, _: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        true
    }
    fn layout(&self) -> Layout {
        Layout::Lora
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &["a", "b"]
    }
    fn padded_shape(&self, _: Proj, shape: [u64; 2]) -> Option<[u64; 2]> {
        Some(shape)
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], rank: u64) -> Option<u64> {
        match part {
            "a" => rank.checked_mul(kp)?.checked_mul(2),
            "b" => np.checked_mul(rank)?.checked_mul(2),
            _ => None,
        }
    }
    fn scalar_names(&self) -> &'static [&'static str] {
        &["rank", "scaling"]
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let adapter = cx
            .lora
            .expect("Plan::new requires an adapter for the lora layout");
        let index = cx.layer.index;
        if !adapter.targets(index, proj) {
            return Ok(None); // served as identity
        }
        let pi = source_index(proj);
        let [fnn, fk] = cx.full_shape(pi)?;
        let [n, k] = cx.shape(pi)?;
        let (mut a, mut b, rank, scaling) = adapter.matrices(index, proj, fnn, fk)?;
        // A tensor-parallel slice: W's rows are B's rows, W's columns are A's columns.
        // Zero-padded like the weight it adapts.
        match cx.cut(pi) {
            None => {}
            Some((false, [lo, hi])) => {
                b = b[lo as usize * rank..hi as usize * rank].to_vec();
                b.resize(n * rank, 0.0);
            }
            Some((true, [lo, hi])) => {
                let w = (hi - lo) as usize;
                let mut cut = vec![0f32; rank * k];
                for r in 0..rank {
                    cut[r * k..r * k + w]
                        .copy_from_slice(&a[r * fk + lo as usize..r * fk + hi as usize]);
                }
                a = cut;
            }
        }
        Ok(Some(lora::encode(&a, &b, n, k, rank, scaling)))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let [n, k] = b.shape;
        let rank = b.scalar("rank") as usize;
        Ok(lora::decode_delta(
            b.part("a")?,
            b.part("b")?,
            n,
            k,
            rank,
            b.scalar("scaling"),
        ))
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        let lora = [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
            let (a, fe) = v.get(p, "a")?;
            let (b, _) = v.get(p, "b")?;
            Some(LoraWeight {
                a,
                b,
                n: fe.shape[0] as usize,
                k: fe.shape[1] as usize,
                rank: fe.scalars.get("rank").copied().unwrap_or(0.0) as usize,
                scaling: fe.scalars.get("scaling").copied().unwrap_or(0.0),
            })
        });
        if lora.iter().any(Option::is_some) {
            o.overlays.set(key::LORA, lora);
        }
    }
}
