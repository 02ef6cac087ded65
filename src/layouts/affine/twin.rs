//! The CPU twins of affine (the activation quantizer, the GEMVs, the dequantization and the act-
//! order gather): part of the kernels' numerics contract (`gpu::reference`, mounted there and re-
//! exported).

use crate::converters::bf16;
use crate::converters::layouts::affine::{Scheme, pair_at};
use crate::gpu::reference::warp_group_q8;
use crate::gpu::reference::*;
use crate::gpu::sizes::*;
use crate::layouts::affine::groups::{Form, code_at};
use rayon::prelude::*;

/// The `(s, t)` pair of value `c` of row `j` of an `affine` blob (t the offset or zero point).
pub(super) fn affine_pair(sb: &[u8], sc: Scheme, kp: usize, j: usize, c: usize) -> (f32, f32) {
    let i = j * (kp / sc.group) + c / sc.group;
    pair_at(sb, i * sc.form.pair_bytes(), sc.form)
}

/// The byte of value `l` (< 32) of a group in the affine GEMVs' quantized activations: at 4
/// bits each 8-value word holds its even values in bytes 0-3 and its odd ones in 4-7 (where the
/// nibble masks put the codes), at 8 bits the value order (`affine_act_pos` in
/// src/layouts/affine/kernels.cu).
pub fn affine_act_pos(l: usize, bits: u32) -> usize {
    if bits == 4 {
        (l & !7) | ((l & 1) << 2) | ((l & 7) >> 1)
    } else {
        l
    }
}

/// `affine_quantize_act` for one row of values `v` (already activated): int8 codes `[kp]` at
/// [`affine_act_pos`] and per group of 32 `(d, sum, codes' sum as i32 bits, 0)`:
/// `d = amax / 127`, `q = roundf(v * (1/d))` with the f32 `d`, `sum` the f32 sum of the group in
/// the kernel's butterfly order; values past `v.len()` are 0. Bit-identical to the kernel.
pub fn affine_quantize_act_row(v: &[f32], kp: usize, bits: u32) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; kp];
    let mut ds = Vec::with_capacity(kp / 8);
    for g in 0..kp / 32 {
        let (vals, d, id, sum) = warp_group_q8(v, g);
        let mut qsum = 0i32;
        for (l, &xv) in vals.iter().enumerate() {
            let c = (xv * id).round() as i32;
            q[g * 32 + affine_act_pos(l, bits)] = c as i8 as u8;
            qsum += c;
        }
        ds.extend_from_slice(&[d, sum, f32::from_bits(qsum as u32), 0.0]);
    }
    (q, ds)
}

/// One activation row's output of an `affine` decode GEMV (`affine{4,8}_gemv` and their batch
/// forms) over its quantized activations (`xq`, `xs` of [`affine_quantize_act_row`]):
/// `y[j] = sum_g s * (d * dot) + (b + z s) * sum` over groups of 32 in f64, `dot` the integer
/// product of the group's codes centred on `z = 2^(bits - 1)` and its activation codes, `s`
/// and `b` its weight group's (`b = -(s z)` rounded to f32 in the zero forms: the kernel's
/// terms).
#[allow(clippy::too_many_arguments)]
pub fn affine_q8_row(
    xq: &[u8],
    xs: &[f32],
    codes: &[u8],
    sb: &[u8],
    sc: Scheme,
    n: usize,
    kp: usize,
    y: &mut [f32],
) {
    let bits = sc.bits;
    let (groups, row, z) = (
        kp / AFFINE_GROUP,
        kp * bits as usize / 8,
        1i64 << (bits - 1),
    );
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let codes = &codes[j * row..(j + 1) * row];
        let mut acc = 0f64;
        for g in 0..groups {
            let (s, t) = affine_pair(sb, sc, kp, j, g * AFFINE_GROUP);
            let off = if sc.form == Form::Offset { t } else { -(s * t) };
            let (s, b) = (s as f64, off as f64 + z as f64 * s as f64);
            let dot: i64 = (0..AFFINE_GROUP)
                .map(|l| {
                    let q = code_at(codes, g * AFFINE_GROUP + l, bits);
                    (q as i64 - z) * (xq[g * AFFINE_GROUP + affine_act_pos(l, bits)] as i8) as i64
                })
                .sum();
            acc += s * (xs[4 * g] as f64 * dot as f64) + b * xs[4 * g + 1] as f64;
        }
        *out = acc as f32;
    });
}

/// `affine_dequant_bf16`: BF16 bytes `[n, kp]`, each weight as the layout decodes it
/// (`layouts::affine::decode` of the padded rows: `s * q + b`, whose product is exact, so the
/// kernel's `fmaf` gives the same bits, or `s * (q - z)`) rounded to BF16.
pub fn affine_dequant_bf16(codes: &[u8], sb: &[u8], sc: Scheme, n: usize, kp: usize) -> Vec<u8> {
    crate::converters::layouts::affine::decode(codes, sb, sc, [n, kp], kp)
        .into_iter()
        .flat_map(|w| bf16::from_f32(w).to_le_bytes())
        .collect()
}

/// `affine_gather_bf16`: BF16 bytes of the `m` rows of `v [m, k]` (each row the values the
/// kernel forms: `x`, or SiLU/GELU of `x` times `u`, `affine_gather_values`), in the stored
/// column order `bf16(v[r, perm[c]])` (0 for an entry past k), or as they are without `perm`.
pub fn affine_gather_bf16(v: &[f32], perm: Option<&[u32]>, m: usize, k: usize) -> Vec<u8> {
    (0..m * k)
        .flat_map(|i| {
            let src = perm.map_or(i % k, |p| p[i % k] as usize);
            let v = if src < k { v[i / k * k + src] } else { 0.0 };
            bf16::from_f32(v).to_le_bytes()
        })
        .collect()
}

/// The values `affine_gather_bf16` (and `affine_quantize_act`) form from row `r` of `x` and `u`
/// (`k` values at row stride `ld`): `x` (act 0), `silu_mul(x, u)` (1) or `gelu_mul(x, u)` (2);
/// `None` if the row lies past either buffer.
pub fn affine_act_row(
    x: &[f32],
    u: &[f32],
    act: usize,
    r: usize,
    k: usize,
    ld: usize,
) -> Option<Vec<f32>> {
    let row = |v: &[f32]| v.get(r * ld..r * ld + k).map(<[f32]>::to_vec);
    match act {
        0 => row(x),
        _ => {
            let f = if act == 1 { silu_mul } else { gelu_mul };
            let (g, u) = (row(x)?, row(u)?);
            Some(g.iter().zip(&u).map(|(&a, &b)| f(a, b)).collect())
        }
    }
}

/// [`affine_dequant_bf16`] with the columns of each row put back in the source's order:
/// stored value `c` to column `perm[c]` (the first `kp` entries of `perm`, a permutation:
/// act-order weights; the kernel reads the same through the inverse that follows them).
pub fn affine_dequant_bf16_perm(
    codes: &[u8],
    sb: &[u8],
    sc: Scheme,
    n: usize,
    kp: usize,
    perm: &[u32],
) -> Vec<u8> {
    let stored = affine_dequant_bf16(codes, sb, sc, n, kp);
    let mut out = vec![0u8; stored.len()];
    for r in 0..n {
        for (c, &to) in perm[..kp]
            .iter()
            .enumerate()
            .filter(|(_, t)| (**t as usize) < kp)
        {
            let (from, to) = (2 * (r * kp + c), 2 * (r * kp + to as usize));
            out[to..to + 2].copy_from_slice(&stored[from..from + 2]);
        }
    }
    out
}
