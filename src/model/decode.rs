//! Decoding tensors and FFN weights to f32.

use super::*;
use crate::converters::{self, ct_int, fp8, fp8_block, fp8_row, mxfp4_ct, nvfp4_modelopt};
use crate::error::{Error, Result};
use safetensors::Dtype;

impl Model {
    /// Values of a scale tensor stored as F32, BF16 or F16 (the libraries write all three), as
    /// f32 (exact: every BF16 and F16 value is an f32).
    pub fn floats(&self, t: usize, what: &str) -> Result<Vec<f32>> {
        let b = self.data(t);
        Ok(match self.tensors[t].dtype {
            DType::St(Dtype::F32) => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::St(Dtype::BF16) => b
                .chunks_exact(2)
                .map(|c| converters::bf16::to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            DType::St(Dtype::F16) => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            ref other => {
                return Err(self.qerr(
                    t,
                    format!("{what}: expected F32, BF16 or F16, found {}", other.name()),
                ));
            }
        })
    }

    /// Decode a plain tensor (any ggml type with a decoder, or a safetensors float/int type) to
    /// f32 in its logical shape.
    pub fn decode_tensor(&self, i: usize) -> Result<Vec<f32>> {
        let t = &self.tensors[i];
        let bytes = self.data(i);
        let n = t.elems() as usize;
        let codec_err = |err| Error::Codec {
            file: self.file_of(i),
            tensor: t.name.to_string(),
            err,
        };
        let mut out = vec![0f32; n];
        let Some(ggml) = t.dtype.as_ggml() else {
            let DType::St(d) = t.dtype else {
                unreachable!("every ggml type maps to itself")
            };
            let dec: fn(u8) -> f32 = match d {
                Dtype::U8 => |b| b as f32,
                Dtype::F8_E4M3 => fp8::e4m3_to_f32,
                Dtype::F8_E5M2 => fp8::e5m2_to_f32,
                other => {
                    return Err(Error::Unsupported {
                        file: self.file_of(i),
                        reason: format!(
                            "tensor {}: decoding safetensors dtype {other:?} is not supported",
                            t.name
                        ),
                    });
                }
            };
            out.iter_mut().zip(bytes).for_each(|(o, &b)| *o = dec(b));
            return Ok(out);
        };
        converters::decode_ggml(ggml, bytes, &mut out).map_err(codec_err)?;
        Ok(out)
    }

    /// The value of a GGUF per-tensor output scale (`blk.N.ffn_X.scale`): one finite F32, as
    /// llama.cpp loads it (`[1]`).
    pub fn gguf_scale(&self, t: usize) -> Result<f32> {
        let tt = &self.tensors[t];
        let b = self.data(t);
        if tt.dtype != DType::Ggml(GgmlType::F32) || tt.elems() != 1 || b.len() != 4 {
            return Err(self.qerr(
                t,
                format!(
                    "an output scale must be one F32 value (llama.cpp's [1]); found {} {:?}",
                    tt.dtype.name(),
                    tt.shape
                ),
            ));
        }
        let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if !v.is_finite() {
            return Err(self.qerr(t, format!("the output scale is {v}, not finite")));
        }
        Ok(v)
    }

    /// A one-element scale (`[]` or `[1]`) stored as F32, BF16 or F16.
    pub fn scalar_f32(&self, t: usize, what: &str) -> Result<f32> {
        let tt = &self.tensors[t];
        if !(tt.shape.is_empty() || tt.shape[..] == [1]) {
            return Err(self.qerr(
                t,
                format!(
                    "{what}: expected one value (shape [] or [1]), found {} {:?}",
                    tt.dtype.name(),
                    tt.shape
                ),
            ));
        }
        let v = self.floats(t, what)?;
        v.first()
            .copied()
            .ok_or_else(|| self.qerr(t, format!("{what}: no value")))
    }

    /// Decode a quantized or plain weight to f32 `[out, in]`, applying its scales in the order
    /// its library does (so the result equals the library's own f32 dequantization bit for bit).
    pub fn decode_weight(&self, w: &FfnWeight) -> Result<(Vec<f32>, [u64; 2])> {
        let shape = self.weight_shape(w)?;
        let (n, k) = (shape[0] as usize, shape[1] as usize);
        let len = n
            .checked_mul(k)
            .ok_or_else(|| self.qerr(w.main(), format!("shape {shape:?} overflows")))?;
        let out = match *w {
            FfnWeight::Plain { weight } => self.decode_tensor(weight)?,
            // llama.cpp multiplies the projection's output by the scale: the weight's values
            // times it, one f32 product each.
            FfnWeight::GgufScaled { weight, scale } => {
                let s = self.gguf_scale(scale)?;
                let mut out = self.decode_tensor(weight)?;
                out.iter_mut().for_each(|v| *v *= s);
                out
            }
            FfnWeight::Awq {
                qweight,
                qzeros,
                scales,
            } => {
                let s = self.floats(scales, "scales")?;
                let mut out = vec![0f32; len];
                converters::awq::decode(self.data(qweight), self.data(qzeros), &s, n, k, &mut out);
                out
            }
            FfnWeight::Gptq {
                qweight,
                qzeros,
                scales,
                bits,
                ..
            } => {
                let s = self.floats(scales, "scales")?;
                let g_idx = self.gptq_g_idx(w, k, s.len() / n.max(1));
                let mut out = vec![0f32; len];
                converters::gptq::decode(
                    self.data(qweight),
                    self.data(qzeros),
                    &s,
                    &g_idx,
                    bits,
                    [n, k],
                    &mut out,
                )
                .map_err(|e| {
                    let z = converters::gptq::GptqError::Zero(e);
                    self.qerr(qzeros, z.to_string())
                })?;
                out
            }
            FfnWeight::Half { ref of, half } => {
                let (mut full, _) = self.decode_weight(of)?;
                let at = half as usize * len;
                full.truncate(at + len);
                full.drain(..at);
                full
            }
            FfnWeight::ModelOptNvfp4 {
                weight,
                scale,
                scale_2,
                ..
            } => {
                let s2 = self.scalar_f32(scale_2, "weight_scale_2")?;
                let mut out = vec![0f32; len];
                nvfp4_modelopt::decode_source(
                    self.data(weight),
                    self.data(scale),
                    nvfp4_modelopt::BlockScale::TimesGlobal(s2),
                    &mut out,
                );
                out
            }
            FfnWeight::CtNvfp4 {
                packed,
                scale,
                global_scale,
            } => {
                let g = self.scalar_f32(global_scale, "weight_global_scale")?;
                let mut out = vec![0f32; len];
                nvfp4_modelopt::decode_source(
                    self.data(packed),
                    self.data(scale),
                    nvfp4_modelopt::BlockScale::OverGlobal(g),
                    &mut out,
                );
                out
            }
            FfnWeight::CtMxfp4 { packed, scale } => {
                let mut out = vec![0f32; len];
                mxfp4_ct::decode(self.data(packed), self.data(scale), n, k, &mut out);
                out
            }
            FfnWeight::Fp8Block { weight, scale_inv } => {
                let mut out = vec![0f32; len];
                let s = self.floats(scale_inv, "block scales")?;
                fp8_block::decode(self.data(weight), &s, n, k, &mut out);
                out
            }
            FfnWeight::CtInt { scale, .. } => {
                let (codes, zeros, _) = self.ct_int_codes(w, n, k)?;
                let s = self.floats(scale, "weight_scale")?;
                let mut out = vec![0f32; len];
                ct_int::decode(&codes, &s, zeros.as_deref(), n, k, &mut out);
                out
            }
            FfnWeight::Bnb4 { .. } | FfnWeight::BnbInt8 { .. } => self.bnb_decode(w, k, len)?,
            FfnWeight::Fp8Channel { weight, scale } | FfnWeight::Fp8Tensor { weight, scale } => {
                let mut s = self.floats(scale, "weight_scale")?;
                if s.len() == 1 {
                    s = vec![s[0]; n];
                }
                let mut out = vec![0f32; len];
                fp8_row::decode(self.data(weight), &s, k, &mut out);
                out
            }
        };
        Ok((out, shape))
    }
}
