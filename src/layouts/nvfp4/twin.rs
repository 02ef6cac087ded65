//! The CPU twins of NVFP4 (W4A16 and W4A4): part of the kernels' numerics contract
//! (`gpu::reference`, mounted there and re-exported).

use crate::gpu::reference::E4M3;
use crate::gpu::reference::*;
use rayon::prelude::*;

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
