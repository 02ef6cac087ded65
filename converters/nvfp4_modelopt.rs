//! NVFP4 as NVIDIA ModelOpt stores it in safetensors, the engine's primary weight format.
//!
//! A `[n, k]` weight (k a multiple of 16) is three tensors:
//! - `weight` U8 `[n, k/2]`: E2M1 codes, element `2i` in the low nibble of byte i, `2i+1` in
//!   the high nibble; code bit 3 is the sign, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6;
//! - `weight_scale` F8_E4M3 `[n, k/16]`: one scale per 16 consecutive elements along k;
//! - `weight_scale_2` F32 scalar: the global scale, `amax(W) / (6 * 448)`.
//!
//! `w = E2M1[code] * e4m3(weight_scale) * weight_scale_2`.
//!
//! Encoder (ModelOpt `NVFP4QTensor` semantics): `s2 = amax / 2688`; per 16-block
//! `scale = e4m3_rne(block_amax / (6 * s2))`; `code = e2m1_rne(x / (scale * s2))` where E2M1
//! rounding is to the nearest magnitude with ties to the even code (ModelOpt's `_cast_fp4`: the
//! bounds 0.75, 1.75, 3.5 round up, 0.25, 1.25, 2.5, 5 round down; above 6 clamps to 6), and the
//! sign bit is set for any negative input, so small negatives give code 8 (-0). A block whose
//! scale is 0 stores codes 0; an all-zero tensor stores `s2 = 0`.

use super::fp8::{e4m3_to_f32, f32_to_e4m3};
use rayon::prelude::*;

/// Elements per scale block.
pub const GROUP: usize = 16;
/// E2M1 magnitudes by the low 3 bits of a code.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// An NVFP4 weight in ModelOpt's byte layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Weight {
    /// `[n, k/2]` packed codes.
    pub codes: Vec<u8>,
    /// `[n, k/16]` E4M3 scale bytes.
    pub scales: Vec<u8>,
    /// `weight_scale_2`.
    pub global_scale: f32,
}

/// Value of a 4-bit E2M1 code.
#[inline]
pub fn e2m1_to_f32(code: u8) -> f32 {
    let m = E2M1[(code & 7) as usize];
    if code & 8 != 0 { -m } else { m }
}

/// Magnitude code (0..=7) of |v| rounded to E2M1, ties to the even code.
#[inline]
pub fn e2m1_magnitude_code(a: f32) -> u8 {
    // (bound, rounds up at equality) between code i and i+1.
    const BOUNDS: [(f32, bool); 7] = [
        (0.25, false),
        (0.75, true),
        (1.25, false),
        (1.75, true),
        (2.5, false),
        (3.5, true),
        (5.0, false),
    ];
    let mut code = 0u8;
    for &(b, up) in &BOUNDS {
        if a > b || (a == b && up) {
            code += 1;
        } else {
            break;
        }
    }
    code
}

/// Encode a row-major `[n, k]` f32 weight (k % 16 == 0) to ModelOpt NVFP4.
pub fn encode(x: &[f32], n: usize, k: usize) -> Nvfp4Weight {
    assert_eq!(x.len(), n * k);
    assert_eq!(k % GROUP, 0, "NVFP4 needs k % 16 == 0");
    let amax = x
        .par_iter()
        .fold(|| 0f32, |m, v| m.max(v.abs()))
        .reduce(|| 0f32, f32::max);
    let s2 = amax / (6.0 * 448.0);
    let groups = n * k / GROUP;
    let mut scales = vec![0u8; groups];
    let mut codes = vec![0u8; n * k / 2];
    if s2 != 0.0 {
        let six_s2 = 6.0 * s2;
        scales
            .par_iter_mut()
            .zip(codes.par_chunks_mut(GROUP / 2))
            .zip(x.par_chunks(GROUP))
            .for_each(|((sc, cs), xs)| {
                let bmax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                *sc = f32_to_e4m3(bmax / six_s2);
                let denom = e4m3_to_f32(*sc) * s2;
                if denom == 0.0 {
                    return;
                }
                for (c, pair) in cs.iter_mut().zip(xs.chunks(2)) {
                    *c = code_of(pair[0] / denom) | (code_of(pair[1] / denom) << 4);
                }
            });
    }
    Nvfp4Weight {
        codes,
        scales,
        global_scale: s2,
    }
}

#[inline]
fn code_of(v: f32) -> u8 {
    let sign = if v < 0.0 { 8 } else { 0 };
    sign | e2m1_magnitude_code(v.abs())
}

/// Decode ModelOpt NVFP4 tensors of a `[n, k]` weight to f32, in the order
/// `(E2M1 * scale) * global_scale`.
pub fn decode(codes: &[u8], scales: &[u8], global_scale: f32, out: &mut [f32]) {
    out.par_chunks_mut(GROUP)
        .zip(codes.par_chunks(GROUP / 2))
        .zip(scales.par_iter())
        .for_each(|((o, cs), &sc)| {
            let s = e4m3_to_f32(sc);
            for (i, &c) in cs.iter().enumerate() {
                o[2 * i] = e2m1_to_f32(c & 0xF) * s * global_scale;
                o[2 * i + 1] = e2m1_to_f32(c >> 4) * s * global_scale;
            }
        });
}

/// How a source checkpoint combines the E4M3 block scale with its global scale into one factor,
/// in the library's own order of operations, so that decoding is bit-identical to the library's
/// own f32 dequantization (`E2M1 * combined`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BlockScale {
    /// ModelOpt `NVFP4QTensor.dequantize`: `per_block_scale = scale * weight_scale_2`; its E2M1
    /// table maps code 8 to +0 (not -0).
    TimesGlobal(f32),
    /// compressed-tensors `_dequantize`: `scale = scale / weight_global_scale`.
    OverGlobal(f32),
}

/// Decode a source checkpoint's NVFP4 weight as its library does: `E2M1 * combined(scale)`.
pub fn decode_source(codes: &[u8], scales: &[u8], how: BlockScale, out: &mut [f32]) {
    out.par_chunks_mut(GROUP)
        .zip(codes.par_chunks(GROUP / 2))
        .zip(scales.par_iter())
        .for_each(|((o, cs), &sc)| {
            let (s, plus_zero) = match how {
                BlockScale::TimesGlobal(g) => (e4m3_to_f32(sc) * g, true),
                BlockScale::OverGlobal(g) => (e4m3_to_f32(sc) / g, false),
            };
            let val = |c: u8| {
                if plus_zero && c & 7 == 0 {
                    0.0
                } else {
                    e2m1_to_f32(c) * s
                }
            };
            for (i, &c) in cs.iter().enumerate() {
                o[2 * i] = val(c & 0xF);
                o[2 * i + 1] = val(c >> 4);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_rounding_ties_to_even_code() {
        let cases = [
            (0.25, 0),
            (0.26, 1),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
            (5.01, 7),
            (100.0, 7),
        ];
        for (v, c) in cases {
            assert_eq!(e2m1_magnitude_code(v), c, "{v}");
        }
    }

    #[test]
    fn encode_decode_error_is_within_half_a_step() {
        let (n, k) = (4, 64);
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let w = encode(&x, n, k);
        assert_eq!(w.codes.len(), n * k / 2);
        assert_eq!(w.scales.len(), n * k / 16);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(w.global_scale, amax / 2688.0);
        let mut y = vec![0f32; n * k];
        decode(&w.codes, &w.scales, w.global_scale, &mut y);
        for g in 0..n * k / 16 {
            let step = e4m3_to_f32(w.scales[g]) as f64 * w.global_scale as f64;
            for i in g * 16..g * 16 + 16 {
                // Largest E2M1 gap is 2 (4 -> 6), so error <= 1 * step; plus scale rounding.
                let err = (x[i] as f64 - y[i] as f64).abs();
                assert!(
                    err <= step * 1.0 + x[i].abs() as f64 / 16.0,
                    "i={i} err={err}"
                );
            }
        }
    }

    #[test]
    fn zero_tensor_encodes_to_zeros() {
        let w = encode(&[0.0; 32], 1, 32);
        assert_eq!(w.global_scale, 0.0);
        assert!(w.codes.iter().chain(&w.scales).all(|&b| b == 0));
    }
}
