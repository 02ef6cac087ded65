//! The numerics contract of every kernel, as plain row-at-a-time CPU functions. The host backend
//! runs these; GPU tests compare CUDA results against them (on all rows, or on sampled rows of a
//! large batch, since every output row depends only on its own input row). Sums are taken in f64
//! and rounded once, so the reference is at least as accurate as any kernel; quantization steps
//! that a kernel performs (activations to BF16 or FP8) are reproduced bit for bit.

use crate::converters::affine::{Form, code_at};
use crate::converters::bf16;
use crate::converters::fp8::{e4m3_to_f32, f32_to_e4m3};
use crate::converters::layouts::affine::{Scheme, pair_at};
use crate::gpu::sizes::*;
use rayon::prelude::*;
use std::sync::LazyLock;

mod rules;
pub use rules::{ElementRule, blob_rules};

/// E4M3 byte -> value, as f64 (exact).
static E4M3: LazyLock<[f64; 256]> =
    LazyLock::new(|| std::array::from_fn(|b| e4m3_to_f32(b as u8) as f64));

/// Activation rounding a kernel applies before its products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActRound {
    /// f32 activations used as they are.
    None,
    /// Activations rounded to BF16 (nearest even), as the tensor-core kernels feed them.
    Bf16,
}

impl ActRound {
    #[inline]
    /// The rounding applied to one value.
    pub fn apply(self, x: f32) -> f32 {
        match self {
            ActRound::None => x,
            ActRound::Bf16 => bf16::to_f32(bf16::from_f32(x)),
        }
    }
}

/// `silu(g) * u` in f32: `g / (1 + exp(-g)) * u`.
#[inline]
pub fn silu_mul(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// `gelu_tanh(g) * u` in f32 (the tanh approximation, as gemma's `gelu_pytorch_tanh`).
#[inline]
pub fn gelu_mul(g: f32, u: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * g * (1.0 + (C * (g + 0.044715 * g * g * g)).tanh()) * u
}

/// One output row of the block-scaled FP8 weight product:
/// `y[j] = sum_kb s[j/128][kb] * sum_{i in kb} e4m3(w[j][i]) * a(x[i])` for `j < n`.
#[allow(clippy::too_many_arguments)]
pub fn fp8_block_row(
    x: &[f32],
    w: &[u8],
    s: &[f32],
    n: usize,
    k: usize,
    kp: usize,
    round: ActRound,
    y: &mut [f32],
) {
    let gk = kp / 128;
    let lut = &*E4M3;
    let xr: Vec<f64> = x[..k].iter().map(|&v| round.apply(v) as f64).collect();
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let mut acc = 0f64;
        for kb in 0..gk {
            let mut part = 0f64;
            for i in kb * 128..((kb + 1) * 128).min(k) {
                part += lut[w[j * kp + i] as usize] * xr[i];
            }
            acc += part * s[(j / 128) * gk + kb] as f64;
        }
        *out = acc as f32;
    });
}

/// Per-row FP8 activation quantization: `(codes [kp], scale)`; `scale = amax / 448`, codes
/// `e4m3_rne_sat(x / scale)`, zero padding; an all-zero row gets scale 0 and codes 0.
pub fn quantize_row_fp8(x: &[f32], kp: usize) -> (Vec<u8>, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 448.0;
    let mut q = vec![0u8; kp];
    if scale != 0.0 {
        for (c, &v) in q.iter_mut().zip(x) {
            *c = f32_to_e4m3(v / scale);
        }
    }
    (q, scale)
}

/// One output row of the W8A8 product: `y[j] = sx * sw[j] * sum_i e4m3(q[i]) * e4m3(w[j][i])`.
pub fn w8a8_row(q: &[u8], sx: f32, w: &[u8], sw: &[f32], n: usize, kp: usize, y: &mut [f32]) {
    let lut = &*E4M3;
    let qf: Vec<f64> = q[..kp].iter().map(|&c| lut[c as usize]).collect();
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let acc: f64 = w[j * kp..(j + 1) * kp]
            .iter()
            .zip(&qf)
            .map(|(&c, &a)| lut[c as usize] * a)
            .sum();
        *out = (acc * sx as f64 * sw[j] as f64) as f32;
    });
}

/// Per-group FP8 activation quantization, groups of 128 columns (the FP8 arm's W8A8 prefill):
/// `(codes [kp], scales [kp / 128])`, each group quantized as [`quantize_row_fp8`] quantizes a
/// row (columns past `x` are zeros; a group of zeros gets scale 0).
pub fn quantize_row_fp8_g128(x: &[f32], kp: usize) -> (Vec<u8>, Vec<f32>) {
    let mut codes = vec![0u8; kp];
    let mut scales = vec![0f32; kp / 128];
    for (g, s) in scales.iter_mut().enumerate() {
        let (lo, hi) = ((g * 128).min(x.len()), ((g + 1) * 128).min(x.len()));
        let (c, sc) = quantize_row_fp8(&x[lo..hi], 128);
        codes[g * 128..(g + 1) * 128].copy_from_slice(&c);
        *s = sc;
    }
    (codes, scales)
}

/// One output row of the FP8 arm's W8A8 prefill (block-scaled `fp8` weight, per-group FP8
/// activations): `y[j] = sum_kb s[j/128][kb] * sx[kb] * sum_{i in kb} e4m3(q[i]) * e4m3(w[j][i])`.
pub fn fp8_w8a8_block_row(
    q: &[u8],
    sx: &[f32],
    w: &[u8],
    s: &[f32],
    n: usize,
    kp: usize,
    y: &mut [f32],
) {
    let lut = &*E4M3;
    let gk = kp / 128;
    let qf: Vec<f64> = q[..kp].iter().map(|&c| lut[c as usize]).collect();
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let mut acc = 0f64;
        for kb in 0..gk {
            let part: f64 = (kb * 128..(kb + 1) * 128)
                .map(|i| lut[w[j * kp + i] as usize] * qf[i])
                .sum();
            acc += part * sx[kb] as f64 * s[(j / 128) * gk + kb] as f64;
        }
        *out = acc as f32;
    });
}

/// One output row of an NVFP4 (`nvfp4` layout) weight product:
/// `y[j] = g * sum_groups e4m3(s[j, grp]) * sum_{i in grp, i < k} E2M1[code(j, i)] * a(x[i])`.
#[allow(clippy::too_many_arguments)]
pub fn nvfp4_row(
    x: &[f32],
    codes: &[u8],
    scales: &[u8],
    g: f32,
    n: usize,
    k: usize,
    kp: usize,
    round: ActRound,
    y: &mut [f32],
) {
    use crate::converters::nvfp4_modelopt::e2m1_to_f32;
    let lut = &*E4M3;
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let mut acc = 0f64;
        for grp in 0..k.div_ceil(16) {
            let mut part = 0f64;
            for i in grp * 16..(grp * 16 + 16).min(k) {
                let c = (codes[j * kp / 2 + i / 2] >> (4 * (i % 2))) & 0xF;
                part += e2m1_to_f32(c) as f64 * round.apply(x[i]) as f64;
            }
            acc += part * lut[scales[j * kp / 16 + grp] as usize];
        }
        *out = (acc * g as f64) as f32;
    });
}

/// `stream_probe`'s output: per block of `per` 16-byte words of `words`, the XOR of its
/// little-endian 32-bit lanes.
pub fn stream_probe(words: &[u8], per: usize) -> Vec<u32> {
    words
        .chunks(16 * per.max(1))
        .map(|b| {
            b.chunks_exact(4).fold(0u32, |a, w| {
                a ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]])
            })
        })
        .collect()
}

/// One output row of a BF16 weight product: `y[j] = sum_i bf16(w[j][i]) * a(x[i])`.
pub fn bf16_row(
    x: &[f32],
    w: &[u8],
    n: usize,
    k: usize,
    kp: usize,
    round: ActRound,
    y: &mut [f32],
) {
    let xr: Vec<f64> = x[..k].iter().map(|&v| round.apply(v) as f64).collect();
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let row = &w[2 * j * kp..2 * (j * kp + k)];
        let acc: f64 = row
            .chunks_exact(2)
            .zip(&xr)
            .map(|(wb, &xv)| bf16::to_f32(u16::from_le_bytes([wb[0], wb[1]])) as f64 * xv)
            .sum();
        *out = acc as f32;
    });
}

/// Per-row NVFP4 activation quantization (the W4A4 arms): the weight encoder's rules
/// (`converters::nvfp4_modelopt::encode`) on the row padded with zeros to `kp`:
/// `g = amax / 2688`, group scale `e4m3(group_amax / (6 g))`, codes E2M1-nearest of
/// `x / (e4m3(s) * g)`. Returns `(codes [kp/2], scales [kp/16], g)`.
pub fn quantize_row_nvfp4(x: &[f32], kp: usize) -> (Vec<u8>, Vec<u8>, f32) {
    let mut row = vec![0f32; kp];
    row[..x.len()].copy_from_slice(x);
    let e = crate::converters::nvfp4_modelopt::encode(&row, 1, kp);
    (e.codes, e.scales, e.global_scale)
}

/// One output row of the W4A4 product over NVFP4 activations `(qa, sa, ga)` (one row, `kp`
/// elements) and an `nvfp4` weight:
/// `y[j] = ga * gw * sum_groups e4m3(sa) * e4m3(sw[j]) * sum_i E2M1(a_i) * E2M1(w[j, i])`.
#[allow(clippy::too_many_arguments)]
pub fn w4a4_row(
    qa: &[u8],
    sa: &[u8],
    ga: f32,
    codes: &[u8],
    scales: &[u8],
    gw: f32,
    n: usize,
    kp: usize,
    y: &mut [f32],
) {
    use crate::converters::nvfp4_modelopt::e2m1_to_f32;
    let lut = &*E4M3;
    let code = |c: &[u8], i: usize| (c[i / 2] >> (4 * (i % 2))) & 0xF;
    let a: Vec<f64> = (0..kp).map(|i| e2m1_to_f32(code(qa, i)) as f64).collect();
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let wrow = &codes[j * kp / 2..(j + 1) * kp / 2];
        let mut acc = 0f64;
        for grp in 0..kp / 16 {
            let part: f64 = (grp * 16..grp * 16 + 16)
                .map(|i| e2m1_to_f32(code(wrow, i)) as f64 * a[i])
                .sum();
            acc += part * lut[sa[grp] as usize] * lut[scales[j * kp / 16 + grp] as usize];
        }
        *out = (acc * ga as f64 * gw as f64) as f32;
    });
}

/// LoRA's first product for one activation row: `xa[t] = sum_i bf16(A[t, i]) * x[i]`, `t < r`
/// (A the `lora` layout's part `a`, BF16 `[r, k]`).
pub fn lora_a_row(x: &[f32], a: &[u8], k: usize, r: usize) -> Vec<f32> {
    (0..r)
        .map(|t| {
            let row = &a[2 * t * k..2 * (t + 1) * k];
            row.chunks_exact(2)
                .zip(x)
                .map(|(w, &xv)| bf16::to_f32(u16::from_le_bytes([w[0], w[1]])) as f64 * xv as f64)
                .sum::<f64>() as f32
        })
        .collect()
}

/// LoRA's second product added into one output row: `y[j] += scaling * sum_t bf16(B[j, t]) *
/// xa[t]` (B the part `b`, BF16 `[n, r]`); the sum in f64, one f32 rounding, one f32 add.
pub fn lora_b_row(xa: &[f32], b: &[u8], n: usize, r: usize, scaling: f32, y: &mut [f32]) {
    for (j, out) in y[..n].iter_mut().enumerate() {
        let s: f64 = b[2 * j * r..2 * (j + 1) * r]
            .chunks_exact(2)
            .zip(xa)
            .map(|(w, &v)| bf16::to_f32(u16::from_le_bytes([w[0], w[1]])) as f64 * v as f64)
            .sum();
        *out += (scaling as f64 * s) as f32;
    }
}

fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// One output row of a packed q2g128 (`q2g128` layout) product:
/// `y[j] = sum_blocks d * sum_e (q - 2) * x[e]` (x beyond k is 0), in f64.
pub fn q2_row(x: &[f32], w: &[u8], n: usize, k: usize, kp: usize, y: &mut [f32]) {
    let nb = kp / 128;
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let mut acc = 0f64;
        for b in 0..nb {
            let blk = &w[(j * nb + b) * Q2G128_BYTES..(j * nb + b + 1) * Q2G128_BYTES];
            let d = f16_at(blk) as f64;
            let mut part = 0f64;
            for e in 0..128 {
                let q = (blk[2 + e % 32] >> (2 * (e / 32))) & 3;
                let i = b * 128 + e;
                if i < k {
                    part += (q as f64 - 2.0) * x[i] as f64;
                }
            }
            acc += d * part;
        }
        *out = acc as f32;
    });
}

/// The `(s, t)` pair of value `c` of row `j` of an `affine` blob (t the offset or zero point).
fn affine_pair(sb: &[u8], sc: Scheme, kp: usize, j: usize, c: usize) -> (f32, f32) {
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

/// `q2g128_dequant_bf16`: BF16 bytes `[n, kp]`, each `bf16_rn(d * (q - 2))`.
pub fn q2_dequant_bf16(w: &[u8], n: usize, kp: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * kp * 2);
    for blk in w[..n * kp / Q2G128_ELEMS * Q2G128_BYTES].chunks_exact(Q2G128_BYTES) {
        let d = f16_at(blk);
        for e in 0..128 {
            let q = (blk[2 + e % 32] >> (2 * (e / 32))) & 3;
            out.extend_from_slice(&bf16::from_f32(d * (q as i32 - 2) as f32).to_le_bytes());
        }
    }
    out
}

/// Group `g` of 32 values of `x` (past its end 0) as the int8 activation quantizers see it (one
/// warp a group, common.cuh's `warp_amax_sum`): the values, `d = amax / 127`, `1 / d` (0 when d
/// is), and their f32 sum in the butterfly order xor 16, 8, 4, 2, 1.
fn warp_group_q8(x: &[f32], g: usize) -> (Vec<f32>, f32, f32, f32) {
    let v: Vec<f32> = (0..32)
        .map(|l| x.get(g * 32 + l).copied().unwrap_or(0.0))
        .collect();
    let mut s = v.clone();
    for o in [16usize, 8, 4, 2, 1] {
        let prev = s.clone();
        for l in 0..32 {
            s[l] = prev[l] + prev[l ^ o];
        }
    }
    let amax = v.iter().fold(0f32, |m, a| m.max(a.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (v, d, id, s[0])
}

/// `quantize_act_q8_1` for one row: `kp/32` blocks of `f16 d, f16 s, i8 qs[32]`; `d =
/// amax/127`, `q = roundf(x * (1/d))` with the f32 `d`, `s` = the sum of the unquantized values
/// in the kernel's butterfly order (after each step every lane holds the same value).
pub fn quantize_row_q8_1_act(x: &[f32], kp: usize) -> Vec<u8> {
    let mut out = vec![0u8; kp / Q8_1_ELEMS * Q8_1_BYTES];
    for (b, blk) in out.chunks_exact_mut(Q8_1_BYTES).enumerate() {
        let (v, d, id, sum) = warp_group_q8(x, b);
        blk[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        blk[2..4].copy_from_slice(&half::f16::from_f32(sum).to_le_bytes());
        for (l, &xv) in v.iter().enumerate() {
            blk[4 + l] = ((xv * id).round() as i32) as i8 as u8;
        }
    }
    out
}

/// One output row of the Q2 MMQ product over one row of q8_1 activation blocks:
/// `y[j] = sum_b dw * sum_s (dx * sum_l q * xq - 2 * sx)`, in f64.
pub fn q2_mmq_row(xq: &[u8], w: &[u8], n: usize, kp: usize, y: &mut [f32]) {
    let nb = kp / 128;
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let mut acc = 0f64;
        for b in 0..nb {
            let blk = &w[(j * nb + b) * Q2G128_BYTES..(j * nb + b + 1) * Q2G128_BYTES];
            let dw = f16_at(blk) as f64;
            for s in 0..4 {
                let xb = &xq[(4 * b + s) * Q8_1_BYTES..(4 * b + s + 1) * Q8_1_BYTES];
                let dot: i64 = (0..32)
                    .map(|l| ((blk[2 + l] >> (2 * s)) & 3) as i64 * (xb[4 + l] as i8) as i64)
                    .sum();
                acc += dw * (f16_at(xb) as f64 * dot as f64 - 2.0 * f16_at(&xb[2..]) as f64);
            }
        }
        *out = acc as f32;
    });
}

/// One output row of the Q4_K MMQ product over one row of q8_1 activation blocks:
/// `y[j] = sum_superblocks sum_sub (d*sc * dx * sum_l q * xq - dmin*m * sx)`, in f64.
pub fn q4k_mmq_row(xq: &[u8], w: &[u8], n: usize, kp: usize, y: &mut [f32]) {
    let nsb = kp / 256;
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let mut acc = 0f64;
        for sb in 0..nsb {
            let blk = &w[(j * nsb + sb) * Q4K_BYTES..(j * nsb + sb + 1) * Q4K_BYTES];
            for (sub, dsc, dm, q) in q4k_subblocks(blk) {
                let xb = &xq[(sb * 8 + sub) * Q8_1_BYTES..(sb * 8 + sub + 1) * Q8_1_BYTES];
                let dot: i64 = (0..32)
                    .map(|l| q[l] as i64 * (xb[4 + l] as i8) as i64)
                    .sum();
                acc += dsc * f16_at(xb) as f64 * dot as f64 - dm * f16_at(&xb[2..]) as f64;
            }
        }
        *out = acc as f32;
    });
}

/// Each sub-block of 32 of one Q4_K super-block `blk`: its index, `d * sc` and `dmin * m` in
/// f64, and its 32 codes (ggml's Q4_K: sub-block pair p holds `qs[32p .. 32p+32)`, the low
/// nibbles the even sub-block, the high ones the odd).
fn q4k_subblocks(blk: &[u8]) -> impl Iterator<Item = (usize, f64, f64, [u8; 32])> + '_ {
    use crate::converters::kquant::get_scale_min_k4;
    let (d, dmin) = (f16_at(blk) as f64, f16_at(&blk[2..]) as f64);
    let sc12: &[u8; 12] = blk[4..16].try_into().unwrap();
    (0..8).map(move |sub| {
        let (sc, m) = get_scale_min_k4(sub, sc12);
        let q = std::array::from_fn(|l| (blk[16 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0xF);
        (sub, d * sc as f64, dmin * m as f64, q)
    })
}

/// One output row of the Q4_K decode GEMV (`q4k_gemv`) over f32 activations (`x` beyond `k`
/// is 0): `y[j] = sum_superblocks sum_sub (d*sc * sum_l q * x - dmin*m * sum_l x)`, in f64.
pub fn q4k_row(x: &[f32], w: &[u8], n: usize, k: usize, kp: usize, y: &mut [f32]) {
    let nsb = kp / 256;
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let mut acc = 0f64;
        for sb in 0..nsb {
            let blk = &w[(j * nsb + sb) * Q4K_BYTES..(j * nsb + sb + 1) * Q4K_BYTES];
            for (sub, dsc, dm, q) in q4k_subblocks(blk) {
                let (mut dot, mut sum) = (0f64, 0f64);
                for (l, &q) in q.iter().enumerate() {
                    let e = sb * 256 + sub * 32 + l;
                    let xv = if e < k { x[e] as f64 } else { 0.0 };
                    dot += q as f64 * xv;
                    sum += xv;
                }
                acc += dsc * dot - dm * sum;
            }
        }
        *out = acc as f32;
    });
}

/// One output row of the int8-rows decode GEMV (`int8_rows_gemv`) over f32 activations:
/// `y[j] = sw[j] * sum_e wq[j, e] * x[e]` (`x` beyond `k` is 0), in f64.
pub fn int8_rows_row(
    x: &[f32],
    wq: &[u8],
    sw: &[f32],
    n: usize,
    k: usize,
    kp: usize,
    y: &mut [f32],
) {
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let dot: f64 = (0..k)
            .map(|e| (wq[j * kp + e] as i8) as f64 * x[e] as f64)
            .sum();
        *out = (sw[j] as f64 * dot) as f32;
    });
}

/// The il8 order of the dequantizing wgmma GEMMs' bf16 activations (formats.md, "The
/// dequantizing wgmma GEMMs"): within each group of 8 columns, position `p` holds column
/// `IL8[p]`.
pub const IL8: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// The position of column `c` in the il8 order.
pub fn il8_pos(c: usize) -> usize {
    (c & !7) | ((c & 3) << 1) | ((c >> 2) & 1)
}

/// f64 -> bf16 bits, rounded once to nearest even: the significand cut to bf16's 8 bits in the
/// f64 itself (exact, then a lossless f32), below bf16's normal range through f32.
fn bf16_from_f64(v: f64) -> u16 {
    if !v.is_finite() || v.abs() < f32::MIN_POSITIVE as f64 {
        return bf16::from_f32(v as f32);
    }
    const DROP: u32 = 52 - 7;
    let b = v.to_bits();
    let r = (b + (1u64 << (DROP - 1)) - 1 + ((b >> DROP) & 1)) & !((1u64 << DROP) - 1);
    bf16::from_f32(f64::from_bits(r) as f32)
}

/// The 256 bf16 weights of one Q4_K block on the bf16 tensor-core path (formats.md, "Q4_K on
/// the bf16 tensor-core path"): `d1 = bf16(f32(d) * sc)`, `m1 = bf16(f32(dmin) * m)`,
/// `w = bf16(q * d1 - m1)` rounded once, as f32.
pub fn q4k_bf16_block(blk: &[u8]) -> [f32; 256] {
    use crate::converters::kquant::get_scale_min_k4;
    let (d, dmin) = (f16_at(blk), f16_at(&blk[2..]));
    let sc12: &[u8; 12] = blk[4..16].try_into().unwrap();
    let mut out = [0f32; 256];
    for sub in 0..8 {
        let (sc, m) = get_scale_min_k4(sub, sc12);
        let d1 = bf16::to_f32(bf16::from_f32(d * sc as f32)) as f64;
        let m1 = bf16::to_f32(bf16::from_f32(dmin * m as f32)) as f64;
        for l in 0..32 {
            let q = (blk[16 + 32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0xF;
            out[32 * sub + l] = bf16::to_f32(bf16_from_f64(q as f64 * d1 - m1));
        }
    }
    out
}

/// The bf16 weights of `n` Q4_K rows (`[n, kp / 256]` blocks) on the bf16 tensor-core path, as
/// f32 `[n, kp]`: [`q4k_bf16_block`] on every block, decoded once for all the rows of a product.
pub fn q4k_bf16_weights(w: &[u8], n: usize, kp: usize) -> Vec<f32> {
    w[..n * kp / 256 * Q4K_BYTES]
        .par_chunks_exact(Q4K_BYTES)
        .flat_map_iter(q4k_bf16_block)
        .collect()
}

/// One output row of `q4k_wgmma`: `y[j] = sum_i x[i] * wd[j, i]` over bf16 activations `x`
/// (`k` values, as f32) and the decoded weights `wd` ([`q4k_bf16_weights`], `[n, kp]`), summed
/// in f64.
pub fn q4k_bf16_row(x: &[f32], wd: &[f32], n: usize, k: usize, kp: usize, y: &mut [f32]) {
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let acc: f64 = x[..k]
            .iter()
            .zip(&wd[j * kp..j * kp + k])
            .map(|(&xv, &wv)| xv as f64 * wv as f64)
            .sum();
        *out = acc as f32;
    });
}

/// `requant_a_bf16_int8` for one row: `a = bf16(x)`, `d = amax(a)/127`, `q = roundf(a * (1/d))`
/// (zero beyond k). Returns `(codes [kp], d)`.
pub fn requant_row_bf16_int8(x: &[f32], kp: usize) -> (Vec<u8>, f32) {
    let a: Vec<f32> = x.iter().map(|&v| ActRound::Bf16.apply(v)).collect();
    let amax = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = vec![0u8; kp];
    for (c, &v) in q.iter_mut().zip(&a) {
        *c = ((v * id).round() as i32) as i8 as u8;
    }
    (q, d)
}

/// One output row of the int8 GEMM: `y[j] = sum_i a[i] * w[j, i] * sa * sw[j]` (exact integer
/// sum, scales applied in f64).
pub fn int8_row(a: &[u8], sa: f32, w: &[u8], sw: &[f32], n: usize, kp: usize, y: &mut [f32]) {
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let s: i64 = a[..kp]
            .iter()
            .zip(&w[j * kp..(j + 1) * kp])
            .map(|(&p, &q)| (p as i8) as i64 * (q as i8) as i64)
            .sum();
        *out = (s as f64 * sa as f64 * sw[j] as f64) as f32;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The il8 order is a permutation of each group of 8, and `il8_pos` is its inverse.
    #[test]
    fn il8_positions_invert_the_order() {
        for c in 0..24 {
            assert_eq!(IL8[il8_pos(c) % 8] + c / 8 * 8, c);
        }
    }

    /// The bf16 Q4_K weights are the exact Q4_K values (f64 from the block's own fields) within
    /// bf16's rounding of the scale products and of the result: 3 * 2^-9 of the value, plus that
    /// of the min term where they cancel.
    #[test]
    #[cfg(feature = "harness")]
    fn q4k_bf16_weights_are_the_q4k_values_rounded() {
        use crate::converters::kquant::get_scale_min_k4;
        let mut r = crate::testing::Rand(5);
        let x = r.vec(4 * 256, 0.05);
        let e = crate::converters::layouts::q4k_mmq::encode_q4k(&x, 4, 256);
        for blk in e.parts[0].1.chunks_exact(Q4K_BYTES) {
            let got = q4k_bf16_block(blk);
            let (d, dmin) = (f16_at(blk) as f64, f16_at(&blk[2..]) as f64);
            let sc12: &[u8; 12] = blk[4..16].try_into().unwrap();
            for (i, &g) in got.iter().enumerate() {
                let (sc, m) = get_scale_min_k4(i / 32, sc12);
                let q = ((blk[16 + 32 * (i / 64) + i % 32] >> (4 * ((i / 32) % 2))) & 0xF) as f64;
                let exact = d * sc as f64 * q - dmin * m as f64;
                let bound = 3.0 * 2f64.powi(-9) * (exact.abs() + dmin * m as f64) + 1e-30;
                assert!((g as f64 - exact).abs() <= bound, "{i}: {g} vs {exact}");
                assert_eq!(bf16::to_f32(bf16::from_f32(g)), g, "{i}: not a bf16 value");
            }
        }
    }
}
