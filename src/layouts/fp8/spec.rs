//! `fp8`: E4M3 codes with f32 scales per 128x128 block, gate and up fused into one `gate_up`
//! weight (the fused decode GEMV), down on its own.

use crate::converters::layouts::{crop, fp8};
use crate::error::Result;
use crate::ffn::{Fp8Overlay, Fp8Weight};
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;
use crate::manifest::ConvertOptions;
use crate::model::{FfnWeight, Model};

pub struct Fp8;

impl Fp8 {
    /// One source weight as FP8: block-scaled FP8 sources are carried, others encoded.
    fn one(cx: &mut EncodeCx, pi: usize) -> Result<Encoded> {
        let [n, k] = cx.shape(pi)?;
        let m = cx.model;
        let [fnn, fk] = cx.full_shape(pi)?.map(|d| d as u64);
        let b = fp8::ALIGN as u64;
        let carried = match *cx.weight(pi) {
            FfnWeight::Fp8Block { weight, scale_inv } => {
                let grid = [fnn.div_ceil(b), fk.div_ceil(b)];
                let scales =
                    crate::converters::layouts::f32_bytes(&m.floats(scale_inv, "block scales")?);
                match cx.cut(pi) {
                    // Cut on a block boundary: the codes and the grid's rows or columns.
                    Some((cols, [lo, hi])) if lo % b == 0 && cx.pad() == 0 => {
                        let codes = cx.stored(pi, weight, [fnn, fk], (1, 1), 1);
                        let (a, e) = (lo / b, hi.div_ceil(b));
                        let s = crate::converters::slice::slice_bytes(
                            &scales,
                            grid,
                            (1, 4),
                            cols,
                            [a, e],
                        );
                        codes.zip(s).map(|(c, s)| (c.into_owned(), s))
                    }
                    Some(_) => None,
                    None => Some((m.data(weight).to_vec(), scales)),
                }
            }
            _ => None,
        };
        Ok(match carried {
            Some((codes, scales)) => {
                fp8::carry(&codes, &crate::converters::layouts::f32_from(&scales), n, k)
            }
            None => fp8::encode(&cx.dense(pi)?, n, k),
        })
    }
}

impl LayoutSpec for Fp8 {
    fn keeps(&self, _: &Model, w: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        matches!(w, FfnWeight::Fp8Block { .. })
    }
    fn default_rank(&self) -> Option<u8> {
        Some(10)
    }
    fn keeps_what(&self) -> &'static str {
        "FP8 block (128x128)"
    }
    fn layout(&self) -> Layout {
        Layout::Fp8
    }
    fn projections(&self) -> &'static [Proj] {
        &[Proj::GateUp, Proj::Down]
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &["codes", "scales"]
    }
    fn padded_shape(&self, proj: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        if proj == Proj::GateUp {
            // `[2 * inter, hidden]`: each half padded on its own.
            if n % 2 != 0 {
                return None;
            }
            return Some([ru(n / 2, fp8::ALIGN)?.checked_mul(2)?, ru(k, fp8::ALIGN)?]);
        }
        Some([ru(n, fp8::ALIGN)?, ru(k, fp8::ALIGN)?])
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], _: u64) -> Option<u64> {
        match part {
            "codes" => np.checked_mul(kp),
            "scales" => (np / fp8::ALIGN as u64)
                .checked_mul(kp / fp8::ALIGN as u64)?
                .checked_mul(4),
            _ => None,
        }
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        Ok(Some(match proj {
            Proj::GateUp => {
                let g = Self::one(cx, 0)?;
                let u = Self::one(cx, 1)?;
                fp8::fuse(g, u)
            }
            p => Self::one(cx, source_index(p))?,
        }))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, k], [np, kp]) = (b.shape, b.padded);
        let (codes, scales) = (b.part("codes")?, b.part("scales")?);
        Ok(if b.proj == Proj::GateUp {
            fp8::decode_fused(codes, scales, n / 2, k, kp)
        } else {
            crop(&fp8::decode_padded(codes, scales, np, kp), kp, n, k)
        })
    }
    fn scale_rule(&self) -> Option<ElementRule> {
        Some(ElementRule::F32)
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        let (Some((fc, ffe)), Some((fs, _)), Some((dc, dfe)), Some((ds, _))) = (
            v.get(Proj::GateUp, "codes"),
            v.get(Proj::GateUp, "scales"),
            v.get(Proj::Down, "codes"),
            v.get(Proj::Down, "scales"),
        ) else {
            return;
        };
        let (_, k, np, kp) = dims(ffe);
        let fused = Fp8Weight {
            weight: fc,
            scale: fs,
            n: np,
            k,
            np,
            kp,
        };
        let interp = np / 2;
        let (n, k, np, kp) = dims(dfe);
        let down = Fp8Weight {
            weight: dc,
            scale: ds,
            n,
            k,
            np,
            kp,
        };
        o.overlays.set(
            key::FP8,
            Fp8Overlay {
                gate: fused.rows(0, v.inter),
                up: fused.rows(interp, v.inter),
                down,
                fused: Some(fused),
            },
        );
    }
}
