//! Integer checkpoints' weights in their own terms (codes, scales, zero points), for the
//! `affine` layout to carry without re-quantizing: AutoAWQ GEMM, GPTQ and compressed-tensors
//! `int-quantized` / `pack-quantized` (`converters::awq`, `converters::gptq`,
//! `converters::ct_int`).

use super::*;
use crate::converters::affine::{AffineGroups, group_carried};
use crate::converters::int_source::IntSource;
use crate::converters::{awq, ct_int, gptq};

impl Model {
    /// The signed codes `[n, k]` of compressed-tensors integer weight `w`, its signed zero points
    /// (asymmetric schemes: as stored, `[n, G]` or the scale's shape) and its scale groups per
    /// row ([`Model::ct_int_groups`]: 0 for one scale for the tensor).
    pub(super) fn ct_int_codes(
        &self,
        w: &FfnWeight,
        n: usize,
        k: usize,
    ) -> Result<(Vec<i8>, Option<Vec<i8>>, usize)> {
        let FfnWeight::CtInt {
            weight,
            zero_point,
            shape: packed,
            bits,
            ..
        } = *w
        else {
            unreachable!("ct_int_codes of a compressed-tensors integer weight");
        };
        let groups = self.ct_int_groups(w, n as u64, k as u64)? as usize;
        let codes: Vec<i8> = match packed {
            None => self.data(weight).iter().map(|&b| b as i8).collect(),
            Some(_) => {
                let words = self.tensors[weight].shape[1] as usize;
                ct_int::unpack_rows(self.data(weight), n, words, k, bits)
            }
        };
        let zeros = zero_point.map(|z| {
            if self.tensors[z].dtype == DType::St(Dtype::I8) {
                self.data(z).iter().map(|&b| b as i8).collect()
            } else {
                let words_n = self.tensors[z].shape[0] as usize;
                ct_int::unpack_cols(self.data(z), words_n, groups.max(1), n, bits)
            }
        });
        Ok((codes, zeros, groups))
    }

    /// Each input channel's group of GPTQ weight `w` of `k` channels in `groups` groups: its
    /// `g_idx`, or `i / (k / groups)` without one (the shape check made both valid).
    pub(super) fn gptq_g_idx(&self, w: &FfnWeight, k: usize, groups: usize) -> Vec<i32> {
        match *w {
            FfnWeight::Gptq { g_idx: Some(g), .. } => self
                .data(g)
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            _ => {
                let group = k / groups.max(1);
                (0..k).map(|i| (i / group.max(1)) as i32).collect()
            }
        }
    }

    /// The values per group of GPTQ weight `w` of `[n, k]`: `k / G`, where the groups divide
    /// the row and each holds that many channels (in order, or with act-order anywhere).
    fn gptq_group(&self, w: &FfnWeight, [n, k]: [u64; 2]) -> Option<u64> {
        let FfnWeight::Gptq { scales, .. } = *w else {
            return None;
        };
        let groups = self.tensors[scales].shape.first().copied()?;
        let group = k.checked_div(groups)?;
        let g_idx = self.gptq_g_idx(w, k as usize, groups as usize);
        let mut count = vec![0u64; groups as usize];
        for &g in &g_idx {
            count[g as usize] += 1;
        }
        (n > 0 && group * groups == k && count.iter().all(|&c| c == group)).then_some(group)
    }

    /// Whether GPTQ weights `a` and `b` have the same channel order: the same `g_idx` (gate and
    /// up, quantized from one input's Hessian), so their sorted columns are the same.
    pub fn same_column_order(&self, a: &FfnWeight, b: &FfnWeight) -> bool {
        match (a, b) {
            (FfnWeight::Gptq { g_idx: Some(x), .. }, FfnWeight::Gptq { g_idx: Some(y), .. }) => {
                self.data(*x) == self.data(*y)
            }
            _ => false,
        }
    }

    /// Whether `w` is a GPTQ weight with act-order (`desc_act`): channels whose groups are not
    /// contiguous (the `affine` layout sorts them and gathers the activations).
    pub fn gptq_act_order(&self, w: &FfnWeight) -> bool {
        let w = match w {
            FfnWeight::Half { of, .. } => of,
            w => w,
        };
        let FfnWeight::Gptq { scales, .. } = *w else {
            return false;
        };
        let Ok([_, k]) = self.weight_shape(w) else {
            return false;
        };
        let groups = self.tensors[scales].shape[0] as usize;
        let g_idx = self.gptq_g_idx(w, k as usize, groups);
        !gptq::ordered(&g_idx, k as usize / groups.max(1))
    }

    /// The source's bits per code and values per group of integer weight `w` of `[n, k]`, if
    /// it is one (AutoAWQ or compressed-tensors integer; one scale for the tensor or a row:
    /// the whole row is the group).
    fn int_scheme(&self, w: &FfnWeight, [n, k]: [u64; 2]) -> Option<(u32, u64)> {
        match *w {
            FfnWeight::Awq { scales, .. } => {
                let groups = self.tensors[scales].shape.first().copied()?;
                Some((4, k.checked_div(groups)?))
            }
            FfnWeight::CtInt { bits, .. } => {
                let groups = self.ct_int_groups(w, n, k).ok()?.max(1);
                Some((bits, k.checked_div(groups)?))
            }
            FfnWeight::Gptq { bits, .. } => Some((bits, self.gptq_group(w, [n, k])?)),
            FfnWeight::Half { ref of, .. } => self.int_scheme(of, self.weight_shape(of).ok()?),
            _ => None,
        }
    }

    /// Whether `w` is an integer weight the `affine` layout carries: AutoAWQ, GPTQ without
    /// act-order, or compressed-tensors codes of 1 to 8 bits, in groups of 32 times a power of two dividing
    /// the row, or one group a row or tensor.
    pub fn int_carried(&self, w: &FfnWeight) -> bool {
        let Ok(shape) = self.weight_shape(w) else {
            return false;
        };
        self.int_scheme(w, shape).is_some_and(|(bits, group)| {
            (1..=8).contains(&bits) && group_carried(group as usize, shape[1] as usize)
        })
    }

    /// Integer weight `w` as affine integer groups, every weight `s * (q - z)` as its library
    /// decodes it (`None` for a weight that is not an integer one). Refuses, naming the tensor,
    /// what [`AffineGroups::from_int`] refuses.
    pub fn int_groups(&self, w: &FfnWeight) -> Result<Option<AffineGroups>> {
        let Ok(shape) = self.weight_shape(w) else {
            return Ok(None);
        };
        let Some((_, group)) = self.int_scheme(w, shape) else {
            return Ok(None);
        };
        let (n, k, group) = (shape[0] as usize, shape[1] as usize, group as usize);
        let groups = match *w {
            FfnWeight::Half { ref of, half } => {
                let Some(full) = self.int_groups(of)? else {
                    return Ok(None);
                };
                return Ok(Some(full.rows_range(half as usize * n, n)));
            }
            FfnWeight::Awq {
                qweight,
                qzeros,
                scales,
            } => {
                let s = self.floats(scales, "scales")?;
                let (qw, qz) = (self.data(qweight), self.data(qzeros));
                AffineGroups::from_int(&awq::to_int(qw, qz, &s, [n, k], group).source())
            }
            FfnWeight::Gptq {
                qweight,
                qzeros,
                scales,
                bits,
                ..
            } => {
                let s = self.floats(scales, "scales")?;
                let (qw, qz) = (self.data(qweight), self.data(qzeros));
                let g_idx = self.gptq_g_idx(w, k, k / group);
                let (int, group_of) = gptq::to_int(qw, qz, &s, &g_idx, bits, [n, k], group)
                    .map_err(|e| self.qerr(w.main(), format!("as affine integer groups: {e}")))?;
                AffineGroups::from_int_grouped(&int.source(), &group_of)
            }
            FfnWeight::CtInt { scale, bits, .. } => {
                let half = 1i32 << (bits - 1);
                let lift = |q: i8| (q as i32 + half) as u32;
                let (q, zeros, stored) = self.ct_int_codes(w, n, k)?;
                let codes: Vec<u8> = q.into_iter().map(|q| lift(q) as u8).collect();
                let mut s = self.floats(scale, "weight_scale")?;
                let mut z: Vec<u32> = match zeros {
                    None => vec![half as u32; s.len()],
                    Some(z) => z.into_iter().map(lift).collect(),
                };
                if stored == 0 {
                    // One scale (and zero point) for the tensor: each row's.
                    s = vec![s[0]; n];
                    z = vec![z[0]; n];
                }
                AffineGroups::from_int(&IntSource {
                    bits,
                    group,
                    rows: n,
                    cols: k,
                    codes: &codes,
                    scales: &s,
                    zeros: &z,
                })
            }
            _ => return Ok(None),
        };
        groups
            .map(Some)
            .map_err(|e| self.qerr(w.main(), format!("as affine integer groups: {e}")))
    }
}
