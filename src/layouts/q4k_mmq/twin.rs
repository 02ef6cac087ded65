//! The CPU twins of `q4k_mmq` (the Q4_K and int8-row GEMVs, the MMQ GEMMs, the bf16 tensor-core
//! path): part of the kernels' numerics contract (`gpu::reference`, mounted there and re-exported).

use crate::converters::bf16;
use crate::gpu::reference::*;
use crate::gpu::reference::{bf16_from_f64, f16_at};
use crate::gpu::sizes::*;
use rayon::prelude::*;

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
pub(super) fn q4k_subblocks(blk: &[u8]) -> impl Iterator<Item = (usize, f64, f64, [u8; 32])> + '_ {
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
