//! `ggml`: the source's GGUF blocks per projection, any type of the block-format engine (float
//! sources as Q8_0).

use crate::GgmlType;
use crate::converters::layouts::ggml;
use crate::converters::mxfp4_ct;
use crate::error::Result;
use crate::ffn::GgmlWeight;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;
use crate::manifest::ConvertOptions;
use crate::model::DType;
use crate::model::{FfnWeight, Model};
use std::borrow::Cow;
use std::collections::BTreeMap;

pub struct Ggml;

/// A blob's engine type from its `type` scalar (a whole GGUF id of [`ggml::TYPES`]).
fn blob_type(s: &BTreeMap<String, f32>) -> Option<GgmlType> {
    let v = *s.get("type")?;
    (v.fract() == 0.0 && (0.0..=255.0).contains(&v))
        .then(|| ggml::engine_type(v as u32))
        .flatten()
}

/// A blob's output scale: its `output_scale` scalar, 1 where it records none.
fn blob_scale(s: &BTreeMap<String, f32>) -> f32 {
    s.get(ggml::OUTPUT_SCALE).copied().unwrap_or(1.0)
}

/// The engine type weight `w` of `model` is stored in, if it is one (a fused gate+up's half:
/// its fused tensor's).
fn source_type(model: &Model, w: &FfnWeight) -> Option<GgmlType> {
    match w {
        FfnWeight::Half { of, .. } => source_type(model, of),
        FfnWeight::Plain { weight } | FfnWeight::GgufScaled { weight, .. } => {
            match model.tensors[*weight].dtype {
                DType::Ggml(t) if ggml::TYPES.contains(&t) => Some(t),
                _ => None,
            }
        }
        // Re-laid as GGUF MXFP4 blocks, the same values (`converters::mxfp4_ct`), where no
        // scale is the NaN byte.
        FfnWeight::CtMxfp4 { scale, .. } => {
            (!model.data(*scale).contains(&mxfp4_ct::NAN_SCALE)).then_some(GgmlType::MXFP4)
        }
        // LLM.int8 as Q8_0 blocks of `d = SCB` with the output scale 1/127, the same values
        // (`converters::bnb`), where every SCB is a half.
        FfnWeight::BnbInt8 { .. } => model.bnb_int8_carried(w).then_some(GgmlType::Q8_0),
        // NF4 as the engine's own NF4 blocks (`converters::bnb`), the same values.
        FfnWeight::Bnb4 { .. } => model.bnb_nf4_carried(w).then_some(GgmlType::NF4),
        _ => None,
    }
}

/// A source weight's whole `[n, k]` as GGUF blocks of its engine type: a GGUF weight's own
/// bytes, or compressed-tensors' MXFP4 re-laid; `None` where it cannot be laid out (a NaN
/// scale) or is another scheme. A fused gate+up's half gives its fused tensor's blocks (whose
/// rows `EncodeCx::stored_in` takes its half of).
fn source_blocks<'m>(model: &'m Model, w: &FfnWeight, [n, k]: [usize; 2]) -> Option<Cow<'m, [u8]>> {
    match *w {
        FfnWeight::Half { ref of, .. } => {
            let [n2, k2] = model.weight_shape(of).ok()?;
            source_blocks(
                model,
                of,
                [usize::try_from(n2).ok()?, usize::try_from(k2).ok()?],
            )
        }
        FfnWeight::Plain { weight } | FfnWeight::GgufScaled { weight, .. } => {
            Some(Cow::Borrowed(model.data(weight)))
        }
        FfnWeight::CtMxfp4 { packed, scale } => {
            mxfp4_ct::to_gguf_blocks(model.data(packed), model.data(scale), n, k).map(Cow::Owned)
        }
        FfnWeight::BnbInt8 { .. } => model.bnb_int8_q8_0(w, [n, k]).map(Cow::Owned),
        FfnWeight::Bnb4 { .. } => model.bnb_nf4_blocks(w, [n, k]).map(Cow::Owned),
        _ => None,
    }
}

/// The output scale of weight `w` (llama.cpp's per-tensor `.scale`), if it has one.
fn source_scale(model: &Model, w: &FfnWeight) -> Result<Option<f32>> {
    match w {
        FfnWeight::Half { of, .. } => source_scale(model, of),
        FfnWeight::GgufScaled { scale, .. } => model.gguf_scale(*scale).map(Some),
        FfnWeight::BnbInt8 { .. } => Ok(Some(crate::converters::bnb::INT8_SCALE)),
        _ => Ok(None),
    }
}

impl LayoutSpec for Ggml {
    fn layout(&self) -> Layout {
        Layout::Ggml
    }
    fn keeps(&self, model: &Model, w: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        source_type(model, w).is_some()
    }
    fn default_rank(&self) -> Option<u8> {
        Some(50)
    }
    fn keeps_what(&self) -> &'static str {
        // The engine's GGUF types, from its one list.
        static WHAT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            let names: Vec<&str> = crate::converters::layouts::ggml::TYPES
                .iter()
                .filter(|t| t.in_gguf())
                .map(|t| t.name())
                .collect();
            format!(
                "GGUF {} blocks byte for byte, any mix per projection; compressed-tensors MXFP4, bitsandbytes LLM.int8 and NF4 as the same values in MXFP4, Q8_0 and the engine's NF4 blocks (float sources as Q8_0)",
                names.join(", ")
            )
        });
        &WHAT
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &[""]
    }
    fn scalar_names(&self) -> &'static [&'static str] {
        &["type"]
    }
    /// Recorded where the source has llama.cpp's per-tensor output scale.
    fn optional_scalars(&self) -> &'static [&'static str] {
        &[ggml::OUTPUT_SCALE]
    }
    /// Rows of whole blocks of 32 (a GGUF source's already are; a float source is padded).
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, ru(k, ggml::SUB_BLOCK)?])
    }
    /// As Q8_0, what a float source becomes (`metrale-pack layouts` sizes); a pack's blobs are
    /// checked at their own type by [`LayoutSpec::part_bytes_with`].
    fn part_bytes(&self, part: &str, [n, kp]: [u64; 2], _: u64) -> Option<u64> {
        part.is_empty()
            .then(|| ggml::blob_bytes(GgmlType::Q8_0, n, kp))
            .flatten()
    }
    fn part_bytes_with(
        &self,
        part: &str,
        [n, kp]: [u64; 2],
        s: &BTreeMap<String, f32>,
    ) -> Option<u64> {
        part.is_empty()
            .then(|| ggml::blob_bytes(blob_type(s)?, n, kp))
            .flatten()
    }
    fn check_scalars(
        &self,
        s: &BTreeMap<String, f32>,
        [_, kp]: [u64; 2],
    ) -> std::result::Result<(), String> {
        match blob_type(s) {
            Some(t) if kp.is_multiple_of(t.block_elems()) => Ok(()),
            Some(t) => Err(format!(
                "rows of {kp} values are not whole {} blocks of {}",
                t.name(),
                t.block_elems()
            )),
            None => Err(format!(
                "type {:?}: ggml carries the GGUF types {}",
                s.get("type"),
                ggml::TYPES
                    .map(|t| format!("{} ({})", t.name(), t as u32))
                    .join(", ")
            )),
        }
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let pi = source_index(proj);
        let [n, k] = cx.shape(pi)?;
        let w = cx.weight(pi);
        // Carried where the (tensor-parallel) rows are whole blocks and the cut and its
        // padding split none. A slice that splits the source's blocks is stored as a float
        // source is (Q8_0 of the decoded slice, as converting the slice gguf-py writes then
        // would): the fidelity table shows what that costs.
        let carried =
            source_type(cx.model, w).filter(|t| k.is_multiple_of(t.block_elems() as usize));
        if let Some(ty) = carried {
            let full = cx.full_shape(pi)?.map(|d| d as u64);
            let block = (ty.block_elems(), ty.block_bytes());
            let blocks = source_blocks(cx.model, w, full.map(|d| d as usize));
            if let Some(raw) = blocks
                .as_deref()
                .and_then(|b| cx.stored_in(pi, b, full, block, 1))
            {
                let scale = source_scale(cx.model, w)?;
                return Ok(Some(ggml::carry(ty, &raw, n, k, scale)));
            }
        }
        Ok(Some(ggml::encode(&cx.dense(pi)?, n, k)))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ty = blob_type(b.scalars).ok_or_else(|| b.bad("", "no engine type".into()))?;
        let ([n, k], kp) = (b.shape, b.padded[1]);
        ggml::decode(ty, b.part("")?, [n, k, kp], blob_scale(b.scalars))
            .map_err(|e| b.bad("", e.to_string()))
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        if !v.all("") {
            return;
        }
        let w = [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
            let (weight, fe) = v.get(p, "").expect("checked");
            let (n, k, _, kp) = dims(fe);
            let (ty, sc) = (blob_type(&fe.scalars)?, blob_scale(&fe.scalars));
            GgmlWeight::new(weight, ty, n, k, kp, sc).ok()
        });
        if let [Some(g), Some(u), Some(d)] = w {
            o.overlays.set(key::GGML, [g, u, d]);
        }
    }
}
