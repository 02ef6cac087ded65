//! Per-row FP8 E4M3 weights with one f32 scale per output row (the W8A8 decode weights, and
//! compressed-tensors' `float-quantized` channel strategy with `weight_scale [n, 1]`).
//! `scale[i] = amax(row i) / 448`, `q = e4m3_rne_sat(x / scale)`; zero rows get scale 0, codes 0.

use super::fp8::{e4m3_to_f32, f32_to_e4m3};
use super::fp8_block::E4M3_MAX;
use rayon::prelude::*;

/// Encode a row-major `[n, k]` matrix: (codes `[n, k]`, scales `[n]`).
pub fn encode(x: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(x.len(), n * k);
    let mut codes = vec![0u8; n * k];
    let scales: Vec<f32> = codes
        .par_chunks_mut(k.max(1))
        .zip(x.par_chunks(k.max(1)))
        .map(|(c, row)| {
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / E4M3_MAX;
            if scale != 0.0 {
                for (q, &v) in c.iter_mut().zip(row) {
                    *q = f32_to_e4m3(v / scale);
                }
            }
            scale
        })
        .collect();
    (codes, scales)
}

/// Decode codes `[n, k]` with row scales `[n]`.
pub fn decode(codes: &[u8], scales: &[f32], k: usize, out: &mut [f32]) {
    for ((o, c), &s) in out.chunks_mut(k).zip(codes.chunks(k)).zip(scales) {
        for (y, &q) in o.iter_mut().zip(c) {
            *y = e4m3_to_f32(q) * s;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn row_max_maps_to_448_and_error_is_bounded() {
        let (n, k) = (3, 50);
        let x: Vec<f32> = (0..n * k)
            .map(|i| (i as f32 * 0.37).sin() * (1 + i / k) as f32)
            .collect();
        let (c, s) = super::encode(&x, n, k);
        let mut y = vec![0f32; n * k];
        super::decode(&c, &s, k, &mut y);
        for r in 0..n {
            let row = &c[r * k..(r + 1) * k];
            assert!(
                row.iter().any(|&b| b & 0x7F == 0x7E),
                "row {r} has no 448 code"
            );
        }
        for i in 0..n * k {
            assert!(
                (x[i] - y[i]).abs() <= x[i].abs() / 16.0 + s[i / k] * 2e-3,
                "i={i}"
            );
        }
    }
}
