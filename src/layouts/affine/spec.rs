//! `affine`: integer codes (4 or 8 bits) with a scale and an offset or zero point per group,
//! carrying GGUF Q4_0, Q4_1 and Q8_0, AutoAWQ and compressed-tensors integer sources exactly
//! (`groups.rs`), for the affine arms.

use crate::GgmlType;
use crate::converters::layouts::affine::{self, Scheme};
use crate::error::{Error, Result};
use crate::ffn::AffineWeight;
use crate::ffn::{LayerOverlays, key};
use crate::gpu::DevicePtr;
use crate::layout::*;
use crate::layouts::affine::groups::{AffineGroups, Form, GGML_GROUP};
use crate::manifest::ConvertOptions;
use crate::model::DType;
use crate::model::{FfnWeight, Model};
use std::collections::BTreeMap;

pub struct Affine;

/// The GGUF types this layout carries (the others are quantized to Q8_0 first).
const CARRIED: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

/// A blob's scheme from its scalars `bits`, `group` and `form` (whole numbers; a blob without
/// `form`, written before the zero forms, is in the offset form).
fn scheme(s: &BTreeMap<String, f32>) -> Option<Scheme> {
    let whole = |k: &str| {
        s.get(k)
            .filter(|v| v.fract() == 0.0 && **v >= 0.0 && **v <= 1048576.0)
            .map(|&v| v as u64)
    };
    Some(Scheme {
        bits: u32::try_from(whole("bits")?).ok()?,
        group: usize::try_from(whole("group")?).ok()?,
        form: match s.get("form") {
            None => Form::Offset,
            Some(_) => Form::from_number(u32::try_from(whole("form")?).ok()?)?,
        },
    })
}

/// A blob's `perm` scalar: 0 (or absent) for columns in source order, 1 for columns sorted by
/// group with the permutation after the pairs, 2 for the same on an up projection whose
/// permutation the converter found equal to its gate's (the install shares gate's, so one
/// quantization of the input serves both); `None` for another value.
fn permuted(s: &BTreeMap<String, f32>) -> Option<u32> {
    match s.get("perm") {
        None => Some(0),
        Some(&v) if v == 0.0 || v == 1.0 || v == 2.0 => Some(v as u32),
        Some(_) => None,
    }
}

/// Source weight `pi` of the layer as integer groups (`None`: no integer weight), cut to the
/// rank's slice in a TP pack. A down projection's slice that splits a group is refused, naming
/// the tensor, the slice and the group (vLLM likewise refuses a TP size whose slices split
/// the checkpoint's groups): carrying it would mean re-quantizing.
fn int_source(cx: &EncodeCx, pi: usize) -> Result<Option<AffineGroups>> {
    let Some(full) = cx.model.int_groups(cx.weight(pi))? else {
        return Ok(None);
    };
    let pad = cx.pad() as usize;
    let group = full.group;
    if full.perm.is_some() && cx.cut(pi).is_some() {
        let t = cx.weight(pi).main();
        return Err(Error::Tensor {
            file: cx.model.file_of(t),
            tensor: cx.model.tensors[t].name.to_string(),
            field: "values",
            reason: "act-order groups (g_idx) are carried with their columns sorted by group; a tensor-parallel slice of them is not built yet (convert without --tp, or name a re-quantizing layout with --allow-requantize)".into(),
        });
    }
    match cx.cut(pi) {
        None => Ok(Some(full)),
        Some((false, [lo, hi])) => Ok(Some(
            full.rows_range(lo as usize, (hi - lo) as usize).pad_rows(pad),
        )),
        Some((true, [lo, hi])) => full
            .cols_range(lo as usize, hi as usize)
            .and_then(|g| g.pad_cols(pad))
            .map(Some)
            .ok_or_else(|| {
                let t = cx.weight(pi).main();
                Error::Tensor {
                    file: cx.model.file_of(t),
                    tensor: cx.model.tensors[t].name.to_string(),
                    field: "values",
                    reason: format!(
                        "the tensor-parallel slice of columns [{lo}, {hi}) (padded by {pad}) splits its groups of {group}: \
                         carried integer groups need slices of whole groups (choose a TP size that divides the groups, or name a re-quantizing layout with --allow-requantize)"
                    ),
                }
            }),
    }
}

impl LayoutSpec for Affine {
    fn layout(&self) -> Layout {
        Layout::Affine
    }
    fn keeps(&self, model: &Model, w: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        let ggml = matches!(w, FfnWeight::Plain { weight }
            if matches!(model.tensors[*weight].dtype, DType::Ggml(t) if CARRIED.contains(&t)));
        ggml || model.int_carried(w)
    }
    fn default_rank(&self) -> Option<u8> {
        Some(40)
    }
    fn keeps_what(&self) -> &'static str {
        "GGUF Q4_0, Q4_1 and Q8_0, AutoAWQ, GPTQ and compressed-tensors int1-8 (codes, scales, offsets and zero points as stored, act-order columns sorted by group; others quantized to Q8_0)"
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &["codes", "scales"]
    }
    fn scalar_names(&self) -> &'static [&'static str] {
        &["bits", "group"]
    }
    /// `form`, since 2026-12-03: a blob without it (written before) is in the offset form;
    /// `perm` (act-order columns), only where it is 1.
    fn optional_scalars(&self) -> &'static [&'static str] {
        &["form", "perm"]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, ru(k, affine::K_ALIGN)?])
    }
    /// At 8 bits in groups of 32, what a float source becomes (the size `metrale-pack layouts`
    /// lists beside the error it measures on a float layer); a pack's blobs are checked by
    /// [`LayoutSpec::part_bytes_with`] at their own bits and group (4-bit: 5 bits a weight).
    fn part_bytes(&self, part: &str, padded: [u64; 2], _: u64) -> Option<u64> {
        let s = BTreeMap::from([
            ("bits".into(), 8.0),
            ("group".into(), GGML_GROUP as f32),
            ("form".into(), 0.0),
        ]);
        self.part_bytes_with(part, padded, &s)
    }
    fn part_bytes_with(
        &self,
        part: &str,
        [np, kp]: [u64; 2],
        s: &BTreeMap<String, f32>,
    ) -> Option<u64> {
        let sc = scheme(s).filter(|sc| sc.valid(kp as usize))?;
        let perm = if permuted(s)? > 0 {
            affine::perm_bytes(kp)?
        } else {
            0
        };
        match part {
            "codes" => affine::codes_bytes(np, kp, sc.bits),
            "scales" => sc.scales_bytes(np, kp)?.checked_add(perm),
            _ => None,
        }
    }
    fn check_scalars(
        &self,
        s: &BTreeMap<String, f32>,
        [_, kp]: [u64; 2],
    ) -> std::result::Result<(), String> {
        match (scheme(s), permuted(s)) {
            (Some(sc), Some(_)) if sc.valid(kp as usize) => Ok(()),
            _ => Err(format!(
                "bits {:?}, group {:?}, form {:?} and perm {:?}: affine stores 4 or 8 bits in groups of 32 times a power of two dividing the padded row (or the whole row), form 0, 1 or 2, perm 0 or 1",
                s.get("bits"),
                s.get("group"),
                s.get("form"),
                s.get("perm")
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
        if carried.is_none()
            && let Some(groups) = int_source(cx, pi)?
        {
            let mut e = affine::from_groups(&groups);
            // Up sorted as gate is: say so, so the install shares one permutation.
            let gate = cx.weight(source_index(Proj::Gate));
            if proj == Proj::Up && groups.perm.is_some() && cx.model.same_column_order(gate, w) {
                e.scalars.retain(|(s, _)| *s != "perm");
                e.scalars.push(("perm", 2.0));
            }
            return Ok(Some(e));
        }
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
        let (sc, perm) = checked_perm(b)?;
        let (scales, kp) = (b.part("scales")?, b.padded[1]);
        let v = affine::decode(b.part("codes")?, scales, sc, b.shape, kp);
        Ok(match perm {
            Some(perm) => affine::unpermute(&v, b.shape, &perm),
            None => v,
        })
    }
    fn element_rules(
        &self,
        s: &BTreeMap<String, f32>,
        [np, kp]: [usize; 2],
    ) -> Vec<(&'static str, ElementRule, Option<usize>)> {
        // The pairs (a permuted blob's `scales` goes on with its permutation).
        let Some(sc) = scheme(s) else {
            return Vec::new();
        };
        let pairs = np * (kp / sc.group.max(1));
        vec![match sc.form {
            Form::Offset => ("scales", ElementRule::Halves, Some(2 * pairs)),
            Form::Zero => (
                "scales",
                ElementRule::ZeroPairs { bits: sc.bits },
                Some(pairs),
            ),
            Form::ZeroF32 => (
                "scales",
                ElementRule::ZeroPairsF32 { bits: sc.bits },
                Some(pairs),
            ),
        }]
    }
    fn check_structure(&self, b: &BlobRead) -> Result<()> {
        checked_perm(b).map(|_| ())
    }
    fn check_blob(&self, b: &BlobRead) -> Result<()> {
        // The structure, then the pairs by the element rule's twin (what the loader's
        // `blob_rules` launch checks), the first bad one named by row and group.
        let (sc, _) = checked_perm(b)?;
        let scales = b.part("scales")?;
        for (part, rule, count) in self.element_rules(b.scalars, b.padded) {
            let n = count.unwrap_or(0);
            if n.checked_mul(rule.elem_bytes())
                .is_none_or(|e| e > scales.len())
            {
                return Err(b.bad(part, format!("{n} elements of {rule:?} pass the part")));
            }
            let i = crate::gpu::reference::blob_rules(scales, n, rule);
            if i != u32::MAX {
                return Err(Error::Tensor {
                    file: b.file.into(),
                    tensor: format!("{}.scales", b.name),
                    field: "pairs",
                    reason: pair_reason(scales, sc, b.padded[1], i, rule),
                });
            }
        }
        Ok(())
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        if !v.all("codes") || !v.all("scales") {
            return;
        }
        let mut w = [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
            let (codes, fe) = v.get(p, "codes").expect("checked");
            let (scales, _) = v.get(p, "scales").expect("checked");
            let (n, k, np, kp) = dims(fe);
            let sc = scheme(&fe.scalars).expect("checked when the pack opened");
            let pairs = sc.scales_bytes(np as u64, kp as u64).expect("checked");
            let perm = if permuted(&fe.scalars).unwrap_or(0) > 0 {
                scales.view(pairs, 8 * kp as u64)
            } else {
                DevicePtr::NULL
            };
            let shared = permuted(&fe.scalars) == Some(2);
            (
                AffineWeight {
                    codes,
                    scales: scales.view(0, pairs),
                    n,
                    k,
                    kp,
                    scheme: sc,
                    perm,
                },
                shared,
            )
        });
        // Up's permutation equal to gate's: gate's buffer, so the arm sees one.
        if w[1].1 && !w[0].0.perm.is_null() && w[0].0.kp == w[1].0.kp {
            w[1].0.perm = w[0].0.perm;
        }
        o.overlays.set(key::AFFINE, w.map(|(a, _)| a));
    }
}

/// A blob's scheme and, when its columns are stored permuted, its permutation, checked to be
/// one (of the row's columns, the padding its own, followed by its inverse).
fn checked_perm(b: &BlobRead) -> Result<(affine::Scheme, Option<Vec<u32>>)> {
    let sc = scheme(b.scalars).ok_or_else(|| Error::Tensor {
        file: b.file.into(),
        tensor: b.name.into(),
        field: "ffn.scalars",
        reason: "affine needs whole bits, group and form".into(),
    })?;
    if permuted(b.scalars).unwrap_or(0) == 0 {
        return Ok((sc, None));
    }
    let (scales, kp) = (b.part("scales")?, b.padded[1]);
    let pairs = sc.scales_bytes(b.padded[0] as u64, kp as u64).unwrap_or(0) as usize;
    let perm = affine::perm_of(scales, pairs, kp);
    if !affine::perm_valid(&perm, b.shape[1], kp) {
        return Err(Error::Tensor {
            file: b.file.into(),
            tensor: format!("{}.scales", b.name),
            field: "permutation",
            reason: "the column permutation is not a permutation of the row's columns followed by its inverse".into(),
        });
    }
    Ok((sc, Some(perm)))
}

/// Why the pair holding element `i` of `rule` (a half of the offset form, a pair of the zero
/// forms) breaks it: its row and group, and which of its numbers.
fn pair_reason(scales: &[u8], sc: Scheme, kp: usize, i: u32, rule: ElementRule) -> String {
    let pair = match rule {
        ElementRule::Halves => i as usize / 2,
        _ => i as usize,
    };
    let groups = (kp / sc.group).max(1);
    let (r, g) = (pair / groups, pair % groups);
    let (s, t) = affine::pair_at(scales, pair * sc.form.pair_bytes(), sc.form);
    if !s.is_finite() {
        format!("row {r}, group {g}: scale {s} is not finite")
    } else if sc.form == Form::Offset {
        format!("row {r}, group {g}: offset {t} is not finite")
    } else if !t.is_finite() {
        format!("row {r}, group {g}: zero point {t} is not finite")
    } else {
        format!(
            "row {r}, group {g}: zero point {t} is not an integer code of {} bits (0 to {})",
            sc.bits,
            rule.top()
        )
    }
}
