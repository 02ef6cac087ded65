//! Finding the dense FFN layers and recognising how each weight is stored (plain, ModelOpt or compressed-tensors NVFP4, FP8 per tensor, channel or block).

use super::*;
use crate::converters::{self, fp8_block, mxfp4_ct};
use crate::error::{Error, Result};
use safetensors::Dtype;

impl Model {
    /// The dense FFN layers wherever they stand, and the layers whose FFN is a mixture of
    /// experts. A layer is dense with gate, up and down projections, or with a fused gate+up
    /// (Phi-3: HF `mlp.gate_up_proj`, GGUF `ffn_up` of twice the down projection's columns and
    /// no `ffn_gate`), split into its halves.
    pub(super) fn find_ffn_layers(&self) -> (Vec<FfnLayer>, Vec<usize>, Vec<(usize, String)>) {
        let gguf = self.format == Format::Gguf;
        let prefix = if gguf { "blk." } else { "model.layers." };
        let count = self
            .tensors
            .iter()
            .filter_map(|t| {
                t.name
                    .strip_prefix(prefix)?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .max()
            .map_or(0, |n| n + 1);
        let (mut dense, mut moe, mut partial) = (Vec::new(), Vec::new(), Vec::new());
        for index in 0..count {
            let name = |p: &str| {
                if gguf {
                    format!("blk.{index}.ffn_{p}")
                } else {
                    format!("model.layers.{index}.mlp.{p}_proj")
                }
            };
            let [g, u, d] = ["gate", "up", "down"].map(|p| self.classify(&name(p)));
            // What a layer that is not whole lacks (a gate without its up or down, a down
            // without its up): reported by `assemble` when other layers are whole.
            let lacks: Vec<String> = [(&g, "gate"), (&u, "up"), (&d, "down")]
                .iter()
                .filter(|(w, _)| w.is_none())
                .map(|(_, p)| name(p))
                .collect();
            let some = g.is_some() || u.is_some() || d.is_some();
            let halves = |fused: FfnWeight| {
                let half = |h| FfnWeight::Half {
                    of: Box::new(fused.clone()),
                    half: h,
                };
                (half(0), half(1))
            };
            let layer = match (g, u, d) {
                (Some(gate), Some(up), Some(down)) => Some((gate, up, down)),
                // GGUF Phi-3: ffn_up holds gate and up, 2 * I rows against down's I columns.
                (None, Some(up), Some(down))
                    if gguf
                        && matches!(
                            (self.weight_shape(&up), self.weight_shape(&down)),
                            (Ok([r, _]), Ok([_, i])) if r == 2 * i
                        ) =>
                {
                    let (gate, up) = halves(up);
                    Some((gate, up, down))
                }
                (None, None, Some(down)) if !gguf => self.classify(&name("gate_up")).map(|f| {
                    let (gate, up) = halves(f);
                    (gate, up, down)
                }),
                _ => None,
            };
            match layer {
                Some((gate, up, down)) => dense.push(FfnLayer {
                    index,
                    gate,
                    up,
                    down,
                }),
                None if self.has_experts(index) => moe.push(index),
                None if some => partial.push((index, lacks.join(", "))),
                None => {}
            }
        }
        (dense, moe, partial)
    }

    /// Whether layer `index` holds mixture-of-experts tensors (GGUF `ffn_*_exps`, `ffn_gate_inp`;
    /// HF `mlp.experts.`, `mlp.shared_expert`, `block_sparse_moe.`).
    fn has_experts(&self, index: usize) -> bool {
        let prefixes = if self.format == Format::Gguf {
            [
                "ffn_gate_exps",
                "ffn_up_exps",
                "ffn_down_exps",
                "ffn_gate_inp",
            ]
            .map(|p| format!("blk.{index}.{p}"))
            .to_vec()
        } else {
            ["mlp.experts.", "mlp.shared_expert", "block_sparse_moe."]
                .map(|p| format!("model.layers.{index}.{p}"))
                .to_vec()
        };
        prefixes.iter().any(|p| self.has_prefix(p))
    }

    /// Whether some tensor's name starts with `p` (binary search over the sorted names).
    pub fn has_prefix(&self, p: &str) -> bool {
        let at = self
            .by_name
            .partition_point(|&i| self.tensors[i].name.as_str() < p);
        self.by_name
            .get(at)
            .is_some_and(|&i| self.tensors[i].name.starts_with(p))
    }

    /// The names of the expert tensors of MoE layer `index` (for messages), at most `max`.
    pub fn expert_tensors(&self, index: usize, max: usize) -> Vec<&str> {
        let p = if self.format == Format::Gguf {
            format!("blk.{index}.ffn_")
        } else {
            format!("model.layers.{index}.")
        };
        self.tensors
            .iter()
            .map(|t| t.name.as_str())
            .filter(|n| {
                n.starts_with(&p)
                    && (n.contains("_exps")
                        || n.contains("experts")
                        || n.contains("ffn_gate_inp")
                        || n.contains("shared_expert")
                        || n.contains("block_sparse_moe"))
            })
            .take(max)
            .collect()
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
        // MXFP4: U8 codes and U8 (E8M0) scales, no global scale, no `weight_shape`.
        if let (Some(packed), Some(scale), None) = (
            idx("weight_packed"),
            idx("weight_scale"),
            idx("weight_shape"),
        ) && self.tensors[scale].dtype == DType::St(Dtype::U8)
        {
            return Some(FfnWeight::CtMxfp4 { packed, scale });
        }
        if let (Some(weight), Some(scale), Some(shape)) = (
            idx("weight_packed"),
            idx("weight_scale"),
            idx("weight_shape"),
        ) {
            return Some(FfnWeight::CtInt {
                weight,
                scale,
                zero_point: idx("weight_zero_point"),
                shape: Some(shape),
                bits: self.packed_bits(weight, shape),
            });
        }
        if let (Some(qweight), Some(qzeros), Some(scales), Some("awq")) = (
            idx("qweight"),
            idx("qzeros"),
            idx("scales"),
            self.quant.method.as_deref(),
        ) {
            return Some(FfnWeight::Awq {
                qweight,
                qzeros,
                scales,
            });
        }
        if let (Some(qweight), Some(qzeros), Some(scales), Some(bits)) = (
            idx("qweight"),
            idx("qzeros"),
            idx("scales"),
            self.quant.gptq_bits,
        ) {
            return Some(FfnWeight::Gptq {
                qweight,
                qzeros,
                scales,
                g_idx: idx("g_idx"),
                bias: idx("bias"),
                bits,
            });
        }
        if let Some(w) = self.classify_bnb(prefix) {
            return Some(w);
        }
        let weight = idx("weight")?;
        let dt = self.tensors[weight].dtype;
        if let (DType::St(Dtype::I8), Some(scale)) = (dt, idx("weight_scale")) {
            return Some(FfnWeight::CtInt {
                weight,
                scale,
                zero_point: idx("weight_zero_point"),
                shape: None,
                bits: 8,
            });
        }
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
            _ => Some(match idx("scale") {
                // llama.cpp's per-tensor output scale beside a GGUF weight.
                Some(scale) if self.format == Format::Gguf => {
                    FfnWeight::GgufScaled { weight, scale }
                }
                _ => FfnWeight::Plain { weight },
            }),
        }
    }

    /// `weight_shape` of a packed integer weight: `[n, k]` from an I64 or I32 `[2]` tensor.
    pub(super) fn packed_shape(&self, shape: usize) -> Option<[u64; 2]> {
        let t = &self.tensors[shape];
        let b = self.data(shape);
        let v: Vec<u64> = match (t.dtype, &t.shape[..]) {
            (DType::St(Dtype::I64), [2]) => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .map(|v| u64::try_from(v).ok())
                .collect::<Option<_>>()?,
            (DType::St(Dtype::I32), [2]) => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .map(|v| u64::try_from(v).ok())
                .collect::<Option<_>>()?,
            _ => return None,
        };
        Some([v[0], v[1]])
    }

    /// The code width of a packed weight: the declared width (any of 1..=8 when none is
    /// declared) whose packed row length matches `k` from `weight_shape`; 0 when none does
    /// ([`Model::weight_shape`] then says why).
    pub(super) fn packed_bits(&self, packed: usize, shape: usize) -> u32 {
        let (Some([_, k]), [_, words]) =
            (self.packed_shape(shape), &self.tensors[packed].shape[..])
        else {
            return 0;
        };
        let declared: Vec<u32> = if self.quant.int_bits.is_empty() {
            (1..=converters::ct_int::MAX_BITS).rev().collect()
        } else {
            self.quant.int_bits.clone()
        };
        declared
            .into_iter()
            .find(|&b| converters::ct_int::packed_words(k, b) == Some(*words))
            .unwrap_or(0)
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

    /// A quantized weight (of any module, FFN or not) whose main tensor is `name` (`...weight`,
    /// `...weight_packed` or AWQ's `...qweight`); `None` for a plain tensor.
    pub fn quantized_weight_named(&self, name: &str) -> Option<FfnWeight> {
        let prefix = name
            .strip_suffix(".weight_packed")
            .or_else(|| name.strip_suffix(".qweight"))
            .or_else(|| name.strip_suffix(".weight"))?;
        let w = self.classify(prefix)?;
        (w.main() == self.index_of(name)? && !matches!(w, FfnWeight::Plain { .. })).then_some(w)
    }

    pub(super) fn qerr(&self, t: usize, reason: String) -> Error {
        Error::Quantized {
            file: self.file_of(t),
            tensor: self.tensors[t].name.to_string(),
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
            FfnWeight::GgufScaled { weight, scale } => {
                self.gguf_scale(scale)?;
                self.weight_shape(&FfnWeight::Plain { weight })?
            }
            FfnWeight::Plain { weight } => {
                let s = self.two_d(weight)?;
                if let DType::St(d) = self.tensors[weight].dtype
                    && matches!(
                        d,
                        Dtype::I8 | Dtype::U8 | Dtype::I16 | Dtype::I32 | Dtype::I64 | Dtype::U32
                    )
                {
                    return Err(self.qerr(
                        weight,
                        format!(
                            "{d:?} codes with no weight_scale: an integer weight this tool cannot read without its scale"
                        ),
                    ));
                }
                s
            }
            FfnWeight::Awq {
                qweight,
                qzeros,
                scales,
            } => self.awq_shape(qweight, qzeros, scales)?,
            FfnWeight::Gptq { .. } => self.gptq_shape(w)?,
            FfnWeight::Half { ref of, .. } => {
                let [n2, k] = self.weight_shape(of)?;
                if n2 % 2 != 0 {
                    return Err(self.qerr(
                        of.main(),
                        format!("a fused gate+up weight of {n2} rows (odd) cannot be split into gate and up"),
                    ));
                }
                [n2 / 2, k]
            }
            FfnWeight::ModelOptNvfp4 { weight, scale, .. }
            | FfnWeight::CtNvfp4 {
                packed: weight,
                scale,
                ..
            } => {
                let [n, kh] = self.two_d(weight)?;
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
            FfnWeight::CtMxfp4 { packed, scale } => {
                let [n, kh] = self.two_d(packed)?;
                self.expect(packed, Dtype::U8, &[n, kh], "packed E2M1 codes")?;
                let k = kh * 2;
                if !k.is_multiple_of(mxfp4_ct::GROUP as u64) {
                    return Err(self.qerr(
                        packed,
                        format!("MXFP4 K = {k} is not a multiple of {}", mxfp4_ct::GROUP),
                    ));
                }
                self.expect(
                    scale,
                    Dtype::U8,
                    &[n, k / mxfp4_ct::GROUP as u64],
                    "E8M0 group scales",
                )?;
                [n, k]
            }
            FfnWeight::Fp8Block { weight, scale_inv } => {
                let [n, k] = self.two_d(weight)?;
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
                let [n, k] = self.two_d(weight)?;
                self.expect(weight, Dtype::F8_E4M3, &[n, k], "FP8 codes")?;
                fp8_declared(weight, scale, Fp8Kind::Channel)?;
                self.expect_scale(scale, &[&[n, 1], &[n]], "weight_scale", "per-channel FP8")?;
                [n, k]
            }
            FfnWeight::Fp8Tensor { weight, scale } => {
                let [n, k] = self.two_d(weight)?;
                self.expect(weight, Dtype::F8_E4M3, &[n, k], "FP8 codes")?;
                fp8_declared(weight, scale, Fp8Kind::Tensor)?;
                self.expect_scale(scale, &[&[], &[1]], "weight_scale", "per-tensor FP8")?;
                [n, k]
            }
            FfnWeight::CtInt { .. } => self.ct_int_shape(w)?,
            FfnWeight::Bnb4 { .. } | FfnWeight::BnbInt8 { .. } => self.bnb_shape(w)?,
        })
    }

    /// A tensor's shape as `[rows, cols]`, refused unless 2-D.
    fn two_d(&self, t: usize) -> Result<[u64; 2]> {
        match self.tensors[t].shape[..] {
            [a, b] => Ok([a, b]),
            ref s => Err(self.qerr(t, format!("expected a 2-D weight, found shape {s:?}"))),
        }
    }

    /// The `[n, k]` of an AutoAWQ GEMM weight, its three tensors checked against each other.
    fn awq_shape(&self, qweight: usize, qzeros: usize, scales: usize) -> Result<[u64; 2]> {
        let [k, w8] = self.two_d(qweight)?;
        self.expect(qweight, Dtype::I32, &[k, w8], "AWQ qweight")?;
        let [groups, n] = self.two_d(scales)?;
        self.expect(scales, Dtype::F16, &[groups, n], "AWQ scales")?;
        if n != w8 * 8 || groups == 0 || !k.is_multiple_of(groups) {
            return Err(self.qerr(
                scales,
                format!(
                    "scales [{groups}, {n}] do not fit qweight [{k}, {w8}] (n = 8 x words, k a multiple of the groups)"
                ),
            ));
        }
        self.expect(qzeros, Dtype::I32, &[groups, w8], "AWQ qzeros")?;
        Ok([n, k])
    }

    /// The `[n, k]` of a GPTQ weight, its tensors checked against each other: `g_idx` a group
    /// below G for each input channel, the bias all zeros (AutoGPTQ writes one for every
    /// layer; a model with biases is not what the FFN computes).
    fn gptq_shape(&self, w: &FfnWeight) -> Result<[u64; 2]> {
        let FfnWeight::Gptq {
            qweight,
            qzeros,
            scales,
            g_idx,
            bias,
            bits,
        } = *w
        else {
            unreachable!("gptq_shape of a GPTQ weight");
        };
        let per = 32 / bits as u64;
        let [kw, n] = self.two_d(qweight)?;
        self.expect(qweight, Dtype::I32, &[kw, n], "GPTQ qweight")?;
        let k = kw * per;
        let [groups, sn] = self.two_d(scales)?;
        self.expect(scales, Dtype::F16, &[groups, sn], "GPTQ scales")?;
        if sn != n || groups == 0 || groups > k || !n.is_multiple_of(per) {
            return Err(self.qerr(
                scales,
                format!(
                    "scales [{groups}, {sn}] do not fit qweight [{kw}, {n}] at {bits} bits (n columns, 1 to k groups, n a multiple of {per})"
                ),
            ));
        }
        self.expect(qzeros, Dtype::I32, &[groups, n / per], "GPTQ qzeros")?;
        // The config's group_size must be what the scales hold (-1: one group a row).
        if let Some(gs) = self.quant.gptq_group {
            let want = match gs {
                -1 => Some(1),
                g if g > 0 => k
                    .checked_div(g as u64)
                    .filter(|_| k.is_multiple_of(g as u64)),
                _ => None,
            };
            if want != Some(groups) {
                return Err(self.qerr(
                    scales,
                    format!(
                        "quantization_config.group_size {gs} contradicts the tensors: {groups} groups of scales for k = {k} ({} values a group)",
                        k / groups
                    ),
                ));
            }
        }
        if let Some(g) = g_idx {
            self.expect(g, Dtype::I32, &[k], "GPTQ g_idx")?;
            let bad = self.data(g).chunks_exact(4).enumerate().find(|(_, b)| {
                let v = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                v < 0 || v as u64 >= groups
            });
            if let Some((i, _)) = bad {
                return Err(self.qerr(
                    g,
                    format!(
                        "input channel {i}: its group is outside the {groups} groups of the scales"
                    ),
                ));
            }
        } else if !k.is_multiple_of(groups) {
            return Err(self.qerr(
                scales,
                format!("{groups} groups do not divide k = {k} and there is no g_idx to say which channel is in which"),
            ));
        }
        if let Some(b) = bias {
            let v = self.floats(b, "bias")?;
            if v.len() as u64 != n || v.iter().any(|&x| x != 0.0) {
                return Err(self.qerr(
                    b,
                    format!(
                        "a GPTQ bias of {} values that are not all zero: the FFN has no bias term",
                        v.len()
                    ),
                ));
            }
        }
        Ok([n, k])
    }

    /// The `[n, k]` of a compressed-tensors integer weight (I8 codes, or packed words with
    /// `weight_shape`), its scale and zero point checked against it.
    fn ct_int_shape(&self, w: &FfnWeight) -> Result<[u64; 2]> {
        let FfnWeight::CtInt {
            weight,
            shape,
            bits,
            ..
        } = *w
        else {
            unreachable!("ct_int_shape of a compressed-tensors integer weight");
        };
        let [n, k] = match shape {
            None => {
                let [n, k] = self.two_d(weight)?;
                self.expect(weight, Dtype::I8, &[n, k], "int8 codes")?;
                [n, k]
            }
            Some(st) => {
                let [n, words] = self.two_d(weight)?;
                self.expect(weight, Dtype::I32, &[n, words], "packed integer codes")?;
                let [sn, k] = self.packed_shape(st).ok_or_else(|| {
                    self.qerr(
                        st,
                        "weight_shape: expected I64 or I32 [2] holding [n, k]".into(),
                    )
                })?;
                if sn != n {
                    return Err(self.qerr(
                        st,
                        format!("weight_shape [{sn}, {k}] but weight_packed has {n} rows"),
                    ));
                }
                if bits == 0 {
                    return Err(self.qerr(
                        weight,
                        format!(
                            "{words} words a row fit no code width for k = {k} (declared widths {:?}; ceil(k * bits / 32) words a row)",
                            self.quant.int_bits
                        ),
                    ));
                }
                [n, k]
            }
        };
        self.ct_int_groups(w, n, k)?;
        Ok([n, k])
    }

    /// The scale groups per row of a compressed-tensors integer weight `[n, k]`: 0 for one
    /// scale for the tensor, else `G` (a channel scale is `G = 1`) with `k % G == 0`; its scale
    /// and zero point checked against it.
    pub fn ct_int_groups(&self, w: &FfnWeight, n: u64, k: u64) -> Result<u64> {
        let FfnWeight::CtInt {
            scale,
            zero_point,
            bits,
            ..
        } = *w
        else {
            return Ok(0);
        };
        let s = self.tensors[scale].shape.clone();
        let groups = match s[..] {
            [] | [1] if n != 1 => 0,
            [m] if m == n => 1,
            [m, g] if m == n && g >= 1 && k.is_multiple_of(g) => g,
            _ => 0xffff_ffff_ffff_ffff,
        };
        let float = matches!(
            self.tensors[scale].dtype,
            DType::St(Dtype::F32) | DType::St(Dtype::BF16) | DType::St(Dtype::F16)
        );
        if groups == u64::MAX || !float {
            return Err(self.qerr(
                scale,
                format!(
                    "weight_scale {} {s:?} fits no integer scheme for weight [{n}, {k}] (per tensor [] or [1], per channel [n, 1], per group [n, G] with k divisible by G), float",
                    self.tensors[scale].dtype.name()
                ),
            ));
        }
        // The config's strategy (and group_size) must be what the scale holds.
        if let Some(decl) = self.quant.int_grouping {
            let want = match decl {
                IntGrouping::Tensor => 0,
                IntGrouping::Channel => 1,
                IntGrouping::Group(gs) => k
                    .checked_div(gs)
                    .filter(|_| k.is_multiple_of(gs))
                    .unwrap_or(u64::MAX),
            };
            // A row of one group is both a channel scale and a group of k.
            let same = want == groups
                || (groups == 1 && matches!(decl, IntGrouping::Group(gs) if gs == k));
            if !same {
                return Err(self.qerr(
                    scale,
                    format!(
                        "the config's weights strategy {decl:?} contradicts weight_scale {s:?} for weight [{n}, {k}]"
                    ),
                ));
            }
        }
        if let Some(z) = zero_point {
            let zt = &self.tensors[z];
            let g = groups.max(1);
            let words = converters::ct_int::packed_words(n, bits).unwrap_or(0);
            let ok = (zt.dtype == DType::St(Dtype::I8) && zt.shape == s)
                || (zt.dtype == DType::St(Dtype::I32) && groups > 0 && zt.shape[..] == [words, g]);
            if !ok {
                return Err(self.qerr(
                    z,
                    format!(
                        "weight_zero_point {} {:?}: expected I8 {s:?} (the scale's shape) or I32 [{words}, {g}] (packed along rows)",
                        zt.dtype.name(),
                        zt.shape
                    ),
                ));
            }
        }
        Ok(groups)
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
