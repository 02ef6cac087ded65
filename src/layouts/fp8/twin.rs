//! The CPU twins of FP8 weights (block scales, and with FP8 activations on the W8A8 GEMMs): part of
//! the kernels' numerics contract (`gpu::reference`, mounted there and re-exported).

use crate::gpu::reference::E4M3;
use crate::gpu::reference::*;
use rayon::prelude::*;

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
