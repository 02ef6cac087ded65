//! Block-scaled FP8 E4M3 weights, 128x128 blocks (DeepSeek-V3 semantics).
//!
//! A `[n, k]` weight is stored as E4M3FN bytes `[n, k]`, row-major, plus an f32 scale grid
//! `[ceil(n/128), ceil(k/128)]` row-major (`weight_scale_inv` in DeepSeek checkpoints, multiplied
//! despite its name): `w[i][j] = e4m3(q[i][j]) * scale[i/128][j/128]`. Encoding: per block,
//! `scale = amax / 448`, `q = e4m3_rne_sat(x / scale)`; an all-zero block gets scale 0 and codes 0.
//! Partial edge blocks take their amax over the elements that exist (the same as zero padding).

use super::fp8::{e4m3_to_f32, f32_to_e4m3};
use rayon::prelude::*;

/// Block edge along both dimensions.
pub const BLOCK: usize = 128;
/// Largest finite E4M3FN value.
pub const E4M3_MAX: f32 = 448.0;

/// Scale-grid shape `[ceil(n/128), ceil(k/128)]`.
pub fn scale_grid(n: usize, k: usize) -> (usize, usize) {
    (n.div_ceil(BLOCK), k.div_ceil(BLOCK))
}

/// Encode a row-major `[n, k]` f32 matrix: returns (E4M3 codes `[n, k]`, scales `[gn, gk]`).
pub fn encode(x: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<f32>) {
    assert_eq!(x.len(), n * k);
    let (gn, gk) = scale_grid(n, k);
    let mut codes = vec![0u8; n * k];
    let mut scales = vec![0f32; gn * gk];
    // One band of 128 rows at a time, in parallel; each band owns its rows and scale row.
    codes
        .par_chunks_mut(BLOCK * k.max(1))
        .zip(scales.par_chunks_mut(gk.max(1)))
        .enumerate()
        .for_each(|(bi, (crows, srow))| {
            let r0 = bi * BLOCK;
            let rows = crows.len() / k.max(1);
            for (bj, s) in srow.iter_mut().enumerate() {
                let c0 = bj * BLOCK;
                let c1 = (c0 + BLOCK).min(k);
                let mut amax = 0f32;
                for r in 0..rows {
                    for &v in &x[(r0 + r) * k + c0..(r0 + r) * k + c1] {
                        amax = amax.max(v.abs());
                    }
                }
                let scale = amax / E4M3_MAX;
                *s = scale;
                if scale == 0.0 {
                    continue;
                }
                for r in 0..rows {
                    for c in c0..c1 {
                        crows[r * k + c] = f32_to_e4m3(x[(r0 + r) * k + c] / scale);
                    }
                }
            }
        });
    (codes, scales)
}

/// Decode codes `[n, k]` and scales `[ceil(n/128), ceil(k/128)]` to f32 `[n, k]`.
pub fn decode(codes: &[u8], scales: &[f32], n: usize, k: usize, out: &mut [f32]) {
    let (_, gk) = scale_grid(n, k);
    for i in 0..n {
        for j in 0..k {
            out[i * k + j] = e4m3_to_f32(codes[i * k + j]) * scales[(i / BLOCK) * gk + j / BLOCK];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_error_is_bounded_by_half_an_e4m3_step() {
        let (n, k) = (200, 300); // partial blocks in both directions
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.01)
            .collect();
        let (c, s) = encode(&x, n, k);
        assert_eq!(s.len(), 2 * 3);
        let mut y = vec![0f32; n * k];
        decode(&c, &s, n, k, &mut y);
        for i in 0..n * k {
            let sc = s[(i / k / BLOCK) * 3 + (i % k) / BLOCK] as f64;
            // E4M3 has 3 mantissa bits: relative step 2^-3, so error <= 2^-4 * |x| (+ subnormal step).
            let err = (x[i] as f64 - y[i] as f64).abs();
            assert!(
                err <= (x[i].abs() as f64) / 16.0 + sc * f64::powi(2.0, -10),
                "i={i} err={err}"
            );
        }
        // The block max encodes exactly to 448 * scale.
        assert!(c.contains(&0x7E) || c.contains(&0xFE));
    }

    #[test]
    fn zero_block_gets_zero_scale() {
        let x = vec![0f32; 128 * 128];
        let (c, s) = encode(&x, 128, 128);
        assert_eq!(s, vec![0.0]);
        assert!(c.iter().all(|&b| b == 0));
    }
}
