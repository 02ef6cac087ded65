//! `q4k_mmq`: gate and up as Q4_K blocks for the Q4_K MMQ prefill; down as int8 with per-row
//! scales (`--q4k-down int8`, the default) or as Q4_K.

use crate::GgmlType;
use crate::converters::layouts::q4k_mmq;
use crate::converters::{BlockFormat, block_bytes, q4_k::Q4K};
use crate::error::Result;
use crate::ffn::{LayerOverlays, key};
use crate::ffn::{Q4kDown, Q4kMmqWeights};
use crate::layout::*;
use crate::manifest::ConvertOptions;
use crate::model::DType;
use crate::model::{FfnWeight, Model};

pub struct Q4kMmq;

impl LayoutSpec for Q4kMmq {
    /// Q4_K sources are carried; the down projection as int8 rows (`--q4k-down int8`, the
    /// default) is re-quantized.
    fn keeps(&self, model: &Model, w: &FfnWeight, down: bool, opts: &ConvertOptions) -> bool {
        matches!(w, FfnWeight::Plain { weight }
            if model.tensors[*weight].dtype == DType::Ggml(GgmlType::Q4_K))
            && !(down && opts.q4k_down == DownFormat::Int8)
    }
    fn default_rank(&self) -> Option<u8> {
        Some(30)
    }
    fn keeps_what(&self) -> &'static str {
        "Q4_K gate/up; down too with --q4k-down q4k (the default when every down is Q4_K)"
    }
    fn layout(&self) -> Layout {
        Layout::Q4kMmq
    }
    fn parts(&self, proj: Proj, down: DownFormat) -> &'static [&'static str] {
        if proj == Proj::Down && down == DownFormat::Int8 {
            &["codes", "scales"]
        } else {
            &[""]
        }
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, ru(k, q4k_mmq::K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], _: u64) -> Option<u64> {
        match part {
            "" => np
                .checked_mul(kp / Q4K::BLOCK_ELEMS as u64)?
                .checked_mul(block_bytes::<Q4K>() as u64),
            "codes" => np.checked_mul(kp),
            "scales" => np.checked_mul(4),
            _ => None,
        }
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let pi = source_index(proj);
        let [n, k] = cx.shape(pi)?;
        let w = cx.weight(pi);
        let full = cx.full_shape(pi)?.map(|d| d as u64);
        let block = (Q4K::BLOCK_ELEMS as u64, block_bytes::<Q4K>() as u64);
        let q4k_src = (matches!(
            cx.model.tensors[w.main()].dtype,
            DType::Ggml(GgmlType::Q4_K)
        ) && k % q4k_mmq::K_ALIGN == 0)
            .then(|| cx.stored(pi, w.main(), full, block, 1))
            .flatten();
        Ok(Some(
            if proj == Proj::Down && cx.opts.q4k_down == DownFormat::Int8 {
                q4k_mmq::encode_int8(&cx.dense(pi)?, n, k)
            } else if let Some(b) = q4k_src {
                q4k_mmq::carry_q4k(&b, n, k)
            } else {
                q4k_mmq::encode_q4k(&cx.dense(pi)?, n, k)
            },
        ))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, k], kp) = (b.shape, b.padded[1]);
        Ok(if b.has("codes") {
            q4k_mmq::decode_int8(b.part("codes")?, b.part("scales")?, n, k, kp)
        } else {
            q4k_mmq::decode_q4k(b.part("")?, n, k, kp)
        })
    }
    fn scale_rule(&self) -> Option<ElementRule> {
        // The int8 down's row scales (a Q4_K blob has no such part); Q4_K blocks are the
        // source's own bytes.
        Some(ElementRule::F32)
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        let (Some((gate, gfe)), Some((up, _))) = (v.get(Proj::Gate, ""), v.get(Proj::Up, ""))
        else {
            return;
        };
        let down = match (
            v.get(Proj::Down, "codes"),
            v.get(Proj::Down, "scales"),
            v.get(Proj::Down, ""),
        ) {
            (Some((codes, dfe)), Some((scales, _)), _) => (Q4kDown::Int8 { codes, scales }, dfe),
            (_, _, Some((d, dfe))) => (Q4kDown::Q4k(d), dfe),
            _ => return,
        };
        o.overlays.set(
            key::Q4K_MMQ,
            Q4kMmqWeights {
                gate,
                up,
                down: down.0,
                hidden: dims(gfe).1,
                inter: dims(gfe).0,
                kp_gate: dims(gfe).3,
                kp_down: dims(down.1).3,
                owned: false,
            },
        );
    }
}
