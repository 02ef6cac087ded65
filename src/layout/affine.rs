//! `affine`: integer codes (4 or 8 bits) with a half scale and offset per group of 32, carrying
//! GGUF Q4_0, Q4_1 and Q8_0 sources exactly (`converters/affine.rs`), for the affine arms.

use super::*;
use crate::GgmlType;
use crate::converters::affine::GGML_GROUP;
use crate::converters::layouts::affine;
use crate::ffn::AffineWeight;
use crate::model::DType;

pub struct Affine;

/// The GGUF types this layout carries (the others are quantized to Q8_0 first).
const CARRIED: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

/// A blob's `bits` and `group` scalars, if both are whole numbers.
fn bits_group(s: &BTreeMap<String, f32>) -> Option<(u32, u64)> {
    let whole = |k: &str| {
        s.get(k)
            .filter(|v| v.fract() == 0.0 && **v >= 1.0 && **v <= 65536.0)
            .map(|&v| v as u64)
    };
    Some((u32::try_from(whole("bits")?).ok()?, whole("group")?))
}

impl LayoutSpec for Affine {
    fn layout(&self) -> Layout {
        Layout::Affine
    }
    fn keeps(&self, model: &Model, w: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        matches!(w, FfnWeight::Plain { weight }
            if matches!(model.tensors[*weight].dtype, DType::Ggml(t) if CARRIED.contains(&t)))
    }
    fn keeps_what(&self) -> &'static str {
        "GGUF Q4_0, Q4_1 and Q8_0 (codes, scales and offsets as stored; others quantized to Q8_0)"
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &["codes", "scales"]
    }
    fn scalar_names(&self) -> &'static [&'static str] {
        &["bits", "group"]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, ru(k, affine::K_ALIGN)?])
    }
    /// At 8 bits in groups of 32, what a float source becomes (the size `metrale-pack layouts`
    /// lists beside the error it measures on a float layer); a pack's blobs are checked by
    /// [`LayoutSpec::part_bytes_with`] at their own bits and group (4-bit: 5 bits a weight).
    fn part_bytes(&self, part: &str, padded: [u64; 2], _: u64) -> Option<u64> {
        let s = BTreeMap::from([("bits".into(), 8.0), ("group".into(), GGML_GROUP as f32)]);
        self.part_bytes_with(part, padded, &s)
    }
    fn part_bytes_with(
        &self,
        part: &str,
        [np, kp]: [u64; 2],
        s: &BTreeMap<String, f32>,
    ) -> Option<u64> {
        let (bits, group) = bits_group(s)?;
        if !affine::valid(bits, group as usize, kp as usize) {
            return None;
        }
        match part {
            "codes" => affine::codes_bytes(np, kp, bits),
            "scales" => affine::scales_bytes(np, kp, group),
            _ => None,
        }
    }
    fn check_scalars(
        &self,
        s: &BTreeMap<String, f32>,
        [_, kp]: [u64; 2],
    ) -> std::result::Result<(), String> {
        match bits_group(s) {
            Some((bits, group)) if affine::valid(bits, group as usize, kp as usize) => Ok(()),
            _ => Err(format!(
                "bits {:?} and group {:?}: affine stores 4 or 8 bits in groups of {GGML_GROUP}",
                s.get("bits"),
                s.get("group")
            )),
        }
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let pi = source_index(proj);
        let [n, k] = cx.shape(pi)?;
        let w = cx.weight(pi);
        let t = w.main();
        let carried = match cx.model.tensors[t].dtype {
            DType::Ggml(ty) if CARRIED.contains(&ty) && k % GGML_GROUP == 0 => {
                let full = cx.full_shape(pi)?.map(|d| d as u64);
                let block = (GGML_GROUP as u64, ty.block_bytes());
                cx.stored(pi, t, full, block, 1).map(|raw| (ty, raw))
            }
            _ => None,
        };
        let enc = match carried {
            Some((ty, raw)) => affine::carry(ty, &raw, n, k),
            None => affine::encode(&cx.dense(pi)?, n, k),
        };
        enc.map(Some).map_err(|e| Error::Tensor {
            file: cx.model.file_of(t),
            tensor: cx.model.tensors[t].name.to_string(),
            field: "values",
            reason: format!("as affine integer groups: {e}"),
        })
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let (bits, group) = bits_group(b.scalars).ok_or_else(|| Error::Tensor {
            file: b.file.into(),
            tensor: b.name.into(),
            field: "ffn.scalars",
            reason: "affine needs whole bits and group".into(),
        })?;
        Ok(affine::decode(
            b.part("codes")?,
            b.part("scales")?,
            (bits, group as usize),
            b.shape,
            b.padded[1],
        ))
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        if !v.all("codes") || !v.all("scales") {
            return;
        }
        o.overlays.set(
            key::AFFINE,
            [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
                let (codes, fe) = v.get(p, "codes").expect("checked");
                let (scales, _) = v.get(p, "scales").expect("checked");
                let (n, k, _, kp) = dims(fe);
                let (bits, group) = bits_group(&fe.scalars).expect("checked when the pack opened");
                AffineWeight {
                    codes,
                    scales,
                    n,
                    k,
                    kp,
                    bits,
                    group: group as usize,
                }
            }),
        );
    }
}
