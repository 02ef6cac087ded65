//! The CPU twins of q2g128 (the GEMVs, the BF16 dequantization, the MMQ GEMM): part of the kernels'
//! numerics contract (`gpu::reference`, mounted there and re-exported).

use crate::converters::bf16;
use crate::gpu::reference::f16_at;
use crate::gpu::sizes::*;
use rayon::prelude::*;

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
