//! bitsandbytes checkpoints (`quant_method: bitsandbytes`, as transformers saves them):
//! recognising a 4-bit (NF4, FP4) or LLM.int8 weight by its companions, checking them against
//! the quant state, and decoding as bitsandbytes does (`converters::bnb`).

use super::*;
use crate::converters::bnb;
use crate::error::Result;
use safetensors::Dtype;

/// The most bytes a 4-bit weight's JSON quant state may hold (bitsandbytes writes about 170).
pub const MAX_STATE_BYTES: u64 = 4096;

/// The suffixes of a 4-bit weight's quant state, NF4's first.
const STATE_SUFFIXES: [&str; 2] = [
    "weight.quant_state.bitsandbytes__nf4",
    "weight.quant_state.bitsandbytes__fp4",
];

/// What a 4-bit weight's quant state says, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Bnb4State {
    /// The weight's `[n, k]`.
    pub shape: [u64; 2],
    /// Values per absmax.
    pub blocksize: u64,
    /// Absmax values per nested absmax and the offset, when double-quantized.
    pub nested: Option<(u64, f32)>,
}

impl Model {
    /// The bitsandbytes weight under `prefix` (`model.layers.0.mlp.up_proj`), if its companions
    /// say it is one.
    pub(super) fn classify_bnb(&self, prefix: &str) -> Option<FfnWeight> {
        let idx = |s: &str| self.index_of(&format!("{prefix}.{s}"));
        let weight = idx("weight")?;
        if let Some((state, nf4)) = STATE_SUFFIXES
            .iter()
            .enumerate()
            .find_map(|(i, s)| Some((idx(s)?, i == 0)))
        {
            let nested = idx("weight.nested_absmax").zip(idx("weight.nested_quant_map"));
            return Some(FfnWeight::Bnb4 {
                weight,
                absmax: idx("weight.absmax")?,
                quant_map: idx("weight.quant_map")?,
                nested,
                state,
                nf4,
            });
        }
        let scb = idx("SCB")?;
        Some(FfnWeight::BnbInt8 {
            weight,
            scb,
            format: idx("weight_format"),
        })
    }

    /// The checked quant state of 4-bit weight `w`: a JSON object of at most
    /// [`MAX_STATE_BYTES`] whose `quant_type` is the one its name says, `shape` two positive
    /// dimensions, `blocksize` one bitsandbytes accepts, and `nested_blocksize` and
    /// `nested_offset` exactly where the nested tensors are.
    pub fn bnb4_state(&self, w: &FfnWeight) -> Result<Bnb4State> {
        let FfnWeight::Bnb4 {
            state, nf4, nested, ..
        } = *w
        else {
            unreachable!("bnb4_state of a bitsandbytes 4-bit weight");
        };
        let t = &self.tensors[state];
        if t.dtype != DType::St(Dtype::U8) || t.bytes > MAX_STATE_BYTES {
            return Err(self.qerr(
                state,
                format!(
                    "the quant state must be U8 bytes of JSON, at most {MAX_STATE_BYTES}; found {} of {} bytes",
                    t.dtype.name(),
                    t.bytes
                ),
            ));
        }
        let bad =
            |field: &str, why: String| self.qerr(state, format!("quant state {field}: {why}"));
        let v: serde_json::Value = serde_json::from_slice(self.data(state))
            .map_err(|e| bad("(the JSON)", e.to_string()))?;
        let want = if nf4 { "nf4" } else { "fp4" };
        let qt = v.get("quant_type").and_then(|q| q.as_str());
        if qt != Some(want) {
            return Err(bad(
                "quant_type",
                format!("{qt:?}, where its name says {want:?}"),
            ));
        }
        let whole = |field: &str| -> Result<u64> {
            v.get(field).and_then(|x| x.as_u64()).ok_or_else(|| {
                bad(
                    field,
                    format!("{:?}: a whole number is expected", v.get(field)),
                )
            })
        };
        let shape = match v.get("shape").and_then(|s| s.as_array()).map(|s| &s[..]) {
            Some([a, b]) => match (a.as_u64(), b.as_u64()) {
                (Some(a), Some(b)) if a > 0 && b > 0 => [a, b],
                _ => {
                    return Err(bad(
                        "shape",
                        format!("{a}, {b}: two positive dimensions expected"),
                    ));
                }
            },
            other => return Err(bad("shape", format!("{other:?}: [out, in] expected"))),
        };
        let blocksize = whole("blocksize")?;
        if !bnb::BLOCKSIZES.contains(&blocksize) {
            return Err(bad(
                "blocksize",
                format!(
                    "{blocksize}: bitsandbytes uses one of {:?}",
                    bnb::BLOCKSIZES
                ),
            ));
        }
        let nested = match (nested, v.get("nested_blocksize")) {
            (None, None) => None,
            (Some(_), Some(_)) => {
                let nb = whole("nested_blocksize")?;
                if !(1..=bnb::BLOCKSIZES[7]).contains(&nb) {
                    return Err(bad("nested_blocksize", format!("{nb}: 1 to 4096 expected")));
                }
                let off = v.get("nested_offset").and_then(|x| x.as_f64());
                let off = off
                    .map(|o| o as f32)
                    .filter(|o| o.is_finite())
                    .ok_or_else(|| {
                        bad(
                            "nested_offset",
                            format!("{:?}: a finite number is expected", v.get("nested_offset")),
                        )
                    })?;
                Some((nb, off))
            }
            (Some(_), None) => {
                return Err(bad(
                    "nested_blocksize",
                    "absent, but the weight has nested_absmax and nested_quant_map".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(bad(
                    "nested_blocksize",
                    "present, but the weight lacks nested_absmax or nested_quant_map".into(),
                ));
            }
        };
        Ok(Bnb4State {
            shape,
            blocksize,
            nested,
        })
    }

    /// The `[n, k]` of bitsandbytes weight `w`, its companions checked against it (dtype and
    /// element count each; products checked).
    pub(super) fn bnb_shape(&self, w: &FfnWeight) -> Result<[u64; 2]> {
        let count = |t: usize, dtype: Dtype, want: u64, what: &str| -> Result<()> {
            let tt = &self.tensors[t];
            if tt.dtype != DType::St(dtype) || tt.elems() != want {
                return Err(self.qerr(
                    t,
                    format!(
                        "{what}: expected {want} {dtype:?} values, found {} {:?}",
                        tt.dtype.name(),
                        tt.shape
                    ),
                ));
            }
            Ok(())
        };
        match *w {
            FfnWeight::BnbInt8 {
                weight,
                scb,
                format,
            } => {
                let [n, k] = match self.tensors[weight].shape[..] {
                    [n, k] => [n, k],
                    ref s => {
                        return Err(
                            self.qerr(weight, format!("expected a 2-D weight, found shape {s:?}"))
                        );
                    }
                };
                self.expect(weight, Dtype::I8, &[n, k], "LLM.int8 codes")?;
                count(scb, Dtype::F32, n, "SCB (each row's absmax)")?;
                if let Some(f) = format {
                    count(f, Dtype::U8, 1, "weight_format")?;
                    if self.data(f) != [0] {
                        return Err(self.qerr(
                            f,
                            format!(
                                "weight_format {}: only bitsandbytes' row format (0) is read",
                                self.data(f)[0]
                            ),
                        ));
                    }
                }
                Ok([n, k])
            }
            FfnWeight::Bnb4 {
                weight,
                absmax,
                quant_map,
                nested,
                ..
            } => {
                let st = self.bnb4_state(w)?;
                let [n, k] = st.shape;
                let too_big = || self.qerr(weight, format!("shape [{n}, {k}] overflows"));
                let elems = n.checked_mul(k).ok_or_else(too_big)?;
                count(weight, Dtype::U8, elems.div_ceil(2), "packed 4-bit codes")?;
                count(quant_map, Dtype::F32, bnb::TABLE as u64, "quant_map")?;
                let blocks = elems.div_ceil(st.blocksize);
                match (nested, st.nested) {
                    (Some((nabs, nmap)), Some((nb, _))) => {
                        count(absmax, Dtype::U8, blocks, "double-quantized absmax")?;
                        count(nabs, Dtype::F32, blocks.div_ceil(nb), "nested_absmax")?;
                        count(
                            nmap,
                            Dtype::F32,
                            bnb::NESTED_TABLE as u64,
                            "nested_quant_map",
                        )?;
                    }
                    _ => count(absmax, Dtype::F32, blocks, "absmax")?,
                }
                Ok([n, k])
            }
            _ => unreachable!("bnb_shape of a bitsandbytes weight"),
        }
    }

    /// Decode bitsandbytes weight `w` of `len` values as bitsandbytes does, in f32 (its shape
    /// checked by [`Model::weight_shape`] first).
    pub(super) fn bnb_decode(&self, w: &FfnWeight, k: usize, len: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; len];
        match *w {
            FfnWeight::BnbInt8 { weight, scb, .. } => {
                let s = self.floats(scb, "SCB")?;
                bnb::decode_int8(self.data(weight), &s, k, &mut out);
            }
            FfnWeight::Bnb4 { weight, .. } => {
                let (table, am, st) = self.bnb4_parts(w)?;
                bnb::decode4(
                    self.data(weight),
                    &am,
                    &table,
                    st.blocksize as usize,
                    &mut out,
                );
            }
            _ => unreachable!("bnb_decode of a bitsandbytes weight"),
        }
        Ok(out)
    }

    /// 4-bit weight `w`'s code table, its absmax in f32 (double quantization undone, as
    /// bitsandbytes does) and its quant state (its shape checked by [`Model::weight_shape`]
    /// first).
    fn bnb4_parts(&self, w: &FfnWeight) -> Result<([f32; bnb::TABLE], Vec<f32>, Bnb4State)> {
        let FfnWeight::Bnb4 {
            absmax,
            quant_map,
            nested,
            ..
        } = *w
        else {
            unreachable!("bnb4_parts of a bitsandbytes 4-bit weight");
        };
        let st = self.bnb4_state(w)?;
        let table: [f32; bnb::TABLE] = self
            .floats(quant_map, "quant_map")?
            .try_into()
            .map_err(|_| self.qerr(quant_map, "quant_map: 16 values expected".into()))?;
        let am = match (nested, st.nested) {
            (Some((nabs, nmap)), Some((nb, offset))) => {
                let map: [f32; bnb::NESTED_TABLE] = self
                    .floats(nmap, "nested_quant_map")?
                    .try_into()
                    .map_err(|_| self.qerr(nmap, "nested_quant_map: 256 values expected".into()))?;
                let nested = self.floats(nabs, "nested_absmax")?;
                bnb::nested_absmax(self.data(absmax), &map, &nested, nb as usize, offset)
            }
            _ => self.floats(absmax, "absmax")?,
        };
        Ok((table, am, st))
    }

    /// Whether 4-bit weight `w` lays into the engine's NF4 blocks ([`bnb::nf4_carries`]).
    pub fn bnb_nf4_carried(&self, w: &FfnWeight) -> bool {
        let (FfnWeight::Bnb4 { quant_map, .. }, Ok([_, k]), Ok(st)) =
            (w, self.weight_shape(w), self.bnb4_state(w))
        else {
            return false;
        };
        let table: Option<[f32; bnb::TABLE]> = self
            .floats(*quant_map, "quant_map")
            .ok()
            .and_then(|t| t.try_into().ok());
        table.is_some_and(|t| bnb::nf4_carries(&t, st.blocksize as usize, k as usize))
    }

    /// NF4 weight `w` `[n, k]` (its shape checked by [`Model::weight_shape`]) as the engine's NF4
    /// blocks (`converters::bnb::to_engine_blocks`), where it lays into them
    /// ([`bnb::nf4_carries`]): its quant state read and its absmax decoded once.
    pub fn bnb_nf4_blocks(&self, w: &FfnWeight, [n, k]: [usize; 2]) -> Option<Vec<u8>> {
        let FfnWeight::Bnb4 { weight, .. } = *w else {
            return None;
        };
        let (table, am, st) = self.bnb4_parts(w).ok()?;
        let bs = st.blocksize as usize;
        bnb::nf4_carries(&table, bs, k)
            .then(|| bnb::to_engine_blocks(self.data(weight), &am, bs, n, k))
    }

    /// Whether LLM.int8 weight `w` lays into GGUF Q8_0 blocks exactly
    /// ([`bnb::q8_0_carries`]).
    pub fn bnb_int8_carried(&self, w: &FfnWeight) -> bool {
        let FfnWeight::BnbInt8 { scb, .. } = *w else {
            return false;
        };
        match (self.weight_shape(w), self.floats(scb, "SCB")) {
            (Ok([n, k]), Ok(s)) => bnb::q8_0_carries(&s, n as usize, k as usize),
            _ => false,
        }
    }

    /// LLM.int8 weight `w` `[n, k]` as GGUF Q8_0 blocks to decode with the output scale
    /// [`bnb::INT8_SCALE`] (`converters::bnb::to_q8_0_blocks`), where it can be laid out so.
    pub fn bnb_int8_q8_0(&self, w: &FfnWeight, [n, k]: [usize; 2]) -> Option<Vec<u8>> {
        let FfnWeight::BnbInt8 { weight, scb, .. } = *w else {
            return None;
        };
        let s = self.floats(scb, "SCB").ok()?;
        bnb::to_q8_0_blocks(self.data(weight), &s, n, k)
    }
}
