//! Finding the dense FFN layers and recognising how each weight is stored (plain, ModelOpt or compressed-tensors NVFP4, FP8 per tensor, channel or block).

use super::*;
use crate::converters::fp8_block;
use crate::error::{Error, Result};
use safetensors::Dtype;

impl Model {
    pub(super) fn find_ffn_layers(&self) -> Vec<FfnLayer> {
        let mut layers = Vec::new();
        for index in 0.. {
            let names: [String; 3] = match self.format {
                Format::Gguf => ["gate", "up", "down"].map(|p| format!("blk.{index}.ffn_{p}")),
                Format::Safetensors => {
                    ["gate", "up", "down"].map(|p| format!("model.layers.{index}.mlp.{p}_proj"))
                }
            };
            let [g, u, d] = names.map(|n| self.classify(&n));
            let (Some(gate), Some(up), Some(down)) = (g, u, d) else {
                break;
            };
            layers.push(FfnLayer {
                index,
                gate,
                up,
                down,
            });
        }
        layers
    }

    pub(super) fn classify(&self, prefix: &str) -> Option<FfnWeight> {
        let idx = |s: &str| self.index_of(&format!("{prefix}.{s}"));
        if let (Some(packed), Some(scale), Some(global_scale)) = (
            idx("weight_packed"),
            idx("weight_scale"),
            idx("weight_global_scale"),
        ) {
            return Some(FfnWeight::CtNvfp4 {
                packed,
                scale,
                global_scale,
            });
        }
        let weight = idx("weight")?;
        let dt = self.tensors[weight].dtype;
        match (
            dt,
            idx("weight_scale"),
            idx("weight_scale_2"),
            idx("weight_scale_inv"),
        ) {
            (DType::St(Dtype::U8), Some(scale), Some(scale_2), _) => {
                Some(FfnWeight::ModelOptNvfp4 {
                    weight,
                    scale,
                    scale_2,
                    input_scale: idx("input_scale"),
                })
            }
            (DType::St(Dtype::F8_E4M3), _, _, Some(scale_inv)) => {
                Some(FfnWeight::Fp8Block { weight, scale_inv })
            }
            (DType::St(Dtype::F8_E4M3), Some(scale), None, None) => {
                Some(match self.fp8_kind(weight, scale) {
                    Fp8Kind::Tensor => FfnWeight::Fp8Tensor { weight, scale },
                    Fp8Kind::Channel => FfnWeight::Fp8Channel { weight, scale },
                    Fp8Kind::Block => FfnWeight::Fp8Block {
                        weight,
                        scale_inv: scale,
                    },
                })
            }
            _ => Some(FfnWeight::Plain { weight }),
        }
    }

    /// The FP8 strategies a `weight_scale` of this full shape fits, for a `[n, k]` weight.
    pub(super) fn fp8_fits(&self, weight: usize, scale: usize) -> Vec<Fp8Kind> {
        let s = &self.tensors[scale].shape;
        let [n, k] = match self.tensors[weight].shape[..] {
            [n, k] => [n, k],
            _ => return Vec::new(),
        };
        let (gn, gk) = fp8_block::scale_grid(n as usize, k as usize);
        let mut v = Vec::new();
        if s.is_empty() || s[..] == [1] {
            v.push(Fp8Kind::Tensor);
        }
        if s[..] == [n, 1] || s[..] == [n] {
            v.push(Fp8Kind::Channel);
        }
        if s[..] == [gn as u64, gk as u64] {
            v.push(Fp8Kind::Block);
        }
        v
    }

    /// The strategy of an FP8 `weight_scale`: the declared one its shape fits (the config
    /// decides; shapes never by element count), else the one its shape fits. A shape that fits
    /// none is reported by [`Model::weight_shape`].
    pub(super) fn fp8_kind(&self, weight: usize, scale: usize) -> Fp8Kind {
        let fits = self.fp8_fits(weight, scale);
        let pick = if self.quant.fp8.is_empty() {
            fits.first()
        } else {
            fits.iter().find(|k| self.quant.fp8.contains(k))
        };
        pick.copied()
            .or_else(|| self.quant.fp8.first().copied())
            .unwrap_or(Fp8Kind::Channel)
    }

    /// A quantized weight (NVFP4 or FP8, of any module, FFN or not) whose main tensor is `name`
    /// (`...weight` or `...weight_packed`); `None` for a plain tensor.
    pub fn quantized_weight_named(&self, name: &str) -> Option<FfnWeight> {
        let prefix = name
            .strip_suffix(".weight_packed")
            .or_else(|| name.strip_suffix(".weight"))?;
        let w = self.classify(prefix)?;
        (w.main() == self.index_of(name)? && !matches!(w, FfnWeight::Plain { .. })).then_some(w)
    }

    pub(super) fn qerr(&self, t: usize, reason: String) -> Error {
        Error::Quantized {
            file: self.file_of(t),
            tensor: self.tensors[t].name.clone(),
            reason,
        }
    }

    pub(super) fn expect(&self, t: usize, dtype: Dtype, shape: &[u64], what: &str) -> Result<()> {
        let tt = &self.tensors[t];
        if tt.dtype != DType::St(dtype) || tt.shape != shape {
            return Err(self.qerr(
                t,
                format!(
                    "{what}: expected {dtype:?} {shape:?}, found {} {:?}",
                    tt.dtype.name(),
                    tt.shape
                ),
            ));
        }
        Ok(())
    }

    /// A scale companion must have exactly `want` as its shape and a float dtype.
    pub(super) fn expect_scale(
        &self,
        t: usize,
        want: &[&[u64]],
        what: &str,
        scheme: &str,
    ) -> Result<()> {
        let tt = &self.tensors[t];
        let float = matches!(
            tt.dtype,
            DType::St(Dtype::F32) | DType::St(Dtype::BF16) | DType::St(Dtype::F16)
        );
        if !float || !want.contains(&&tt.shape[..]) {
            return Err(self.qerr(
                t,
                format!(
                    "{what}: {scheme} needs a float scale of shape {}, found {} {:?}",
                    want.iter()
                        .map(|s| format!("{s:?}"))
                        .collect::<Vec<_>>()
                        .join(" or "),
                    tt.dtype.name(),
                    tt.shape
                ),
            ));
        }
        Ok(())
    }

    /// The logical `[out, in]` shape of an FFN weight, its companions checked against it.
    pub fn weight_shape(&self, w: &FfnWeight) -> Result<[u64; 2]> {
        let two = |t: usize| -> Result<[u64; 2]> {
            match self.tensors[t].shape[..] {
                [a, b] => Ok([a, b]),
                ref s => Err(self.qerr(t, format!("expected a 2-D weight, found shape {s:?}"))),
            }
        };
        // An FP8 scale that the config's declared scheme does not fit is named with both shapes.
        let fp8_declared = |weight: usize, scale: usize, kind: Fp8Kind| -> Result<()> {
            let fits = self.fp8_fits(weight, scale);
            if !fits.contains(&kind)
                || (!self.quant.fp8.is_empty() && !self.quant.fp8.contains(&kind))
            {
                let declared = if self.quant.fp8.is_empty() {
                    "no FP8 scheme declared".to_string()
                } else {
                    format!(
                        "the config declares {}",
                        self.quant
                            .fp8
                            .iter()
                            .map(|k| k.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                return Err(self.qerr(
                    scale,
                    format!(
                        "scale shape {:?} fits no FP8 scheme {declared} for weight {} {:?} (per-tensor [] or [1], per-channel [n, 1], block [ceil(n/128), ceil(k/128)])",
                        self.tensors[scale].shape,
                        self.tensors[weight].name,
                        self.tensors[weight].shape
                    ),
                ));
            }
            Ok(())
        };
        Ok(match *w {
            FfnWeight::Plain { weight } => two(weight)?,
            FfnWeight::ModelOptNvfp4 { weight, scale, .. }
            | FfnWeight::CtNvfp4 {
                packed: weight,
                scale,
                ..
            } => {
                let [n, kh] = two(weight)?;
                self.expect(weight, Dtype::U8, &[n, kh], "packed E2M1 codes")?;
                let k = kh * 2;
                if k % 16 != 0 {
                    return Err(self.qerr(weight, format!("NVFP4 K = {k} is not a multiple of 16")));
                }
                self.expect(scale, Dtype::F8_E4M3, &[n, k / 16], "block scales")?;
                match *w {
                    FfnWeight::ModelOptNvfp4 { scale_2, .. } => {
                        self.scalar_f32(scale_2, "weight_scale_2")?;
                    }
                    FfnWeight::CtNvfp4 { global_scale, .. } => {
                        self.scalar_f32(global_scale, "weight_global_scale")?;
                    }
                    _ => {}
                }
                [n, k]
            }
            FfnWeight::Fp8Block { weight, scale_inv } => {
                let [n, k] = two(weight)?;
                self.expect(weight, Dtype::F8_E4M3, &[n, k], "FP8 codes")?;
                let (gn, gk) = fp8_block::scale_grid(n as usize, k as usize);
                if self.tensors[scale_inv].name.ends_with("weight_scale") {
                    fp8_declared(weight, scale_inv, Fp8Kind::Block)?;
                }
                self.expect_scale(
                    scale_inv,
                    &[&[gn as u64, gk as u64]],
                    "block scales",
                    "block FP8",
                )?;
                [n, k]
            }
            FfnWeight::Fp8Channel { weight, scale } => {
                let [n, k] = two(weight)?;
                self.expect(weight, Dtype::F8_E4M3, &[n, k], "FP8 codes")?;
                fp8_declared(weight, scale, Fp8Kind::Channel)?;
                self.expect_scale(scale, &[&[n, 1], &[n]], "weight_scale", "per-channel FP8")?;
                [n, k]
            }
            FfnWeight::Fp8Tensor { weight, scale } => {
                let [n, k] = two(weight)?;
                self.expect(weight, Dtype::F8_E4M3, &[n, k], "FP8 codes")?;
                fp8_declared(weight, scale, Fp8Kind::Tensor)?;
                self.expect_scale(scale, &[&[], &[1]], "weight_scale", "per-tensor FP8")?;
                [n, k]
            }
        })
    }

    /// The FFN weight whose main tensor is `name`, if any.
    pub fn ffn_weight_named(&self, name: &str) -> Option<&FfnWeight> {
        let i = self.index_of(name)?;
        self.ffn_layers
            .iter()
            .flat_map(|l| [&l.gate, &l.up, &l.down])
            .find(|w| w.main() == i)
    }
}
