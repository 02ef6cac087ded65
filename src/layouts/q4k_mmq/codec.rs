//! `q4k_mmq`: what `finalize_q4k_load` builds for the Q4_K MMQ prefill arm.
//! Gate and up: canonical ggml `block_q4_K`, row after row, each row's K zero-padded to a
//! multiple of [`K_ALIGN`] (one superblock per MMQ K step); single part. Down, by default
//! (`Int8`): int8 codes `[n, kp]` (part `codes`) with f32 per-row scales `[n]` (part `scales`),
//! `d = amax/127`, `q = roundf(x * (1/d))` (the Q8_0 rule per row), `y = q * d`; with
//! `--q4k-down q4k` (`METRALE_Q4K_MMQ_DOWN_Q4K`) down is Q4_K like gate and up. Where the source
//! already is Q4_K with K a multiple of 256 its bytes are carried unchanged.

use crate::converters::layouts::{Encoded, crop, pad, round_up};
use crate::converters::q4_k::Q4K;
use crate::converters::q8_0::{q8_scale, roundf_small};
use crate::converters::{decode_blocks, encode_to_vec};
use rayon::prelude::*;

/// K is padded to a multiple of 256 (QK_K).
pub const K_ALIGN: usize = 256;

/// How the down projection is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DownFormat {
    /// Int8 rows with f32 row scales (the default).
    Int8,
    /// Q4_K rows like gate and up.
    Q4k,
}

/// Q4_K rows of an f32 `[n, k]` weight.
pub fn encode_q4k(x: &[f32], n: usize, k: usize) -> Encoded {
    let kp = round_up(k, K_ALIGN);
    Encoded {
        parts: vec![("", encode_to_vec::<Q4K>(&pad(x, n, k, n, kp)))],
        padded: [n, kp],
        scalars: vec![],
    }
}

/// Source Q4_K bytes carried unchanged (k % 256 == 0).
pub fn carry_q4k(bytes: &[u8], n: usize, k: usize) -> Encoded {
    assert_eq!(k % K_ALIGN, 0);
    Encoded {
        parts: vec![("", bytes.to_vec())],
        padded: [n, k],
        scalars: vec![],
    }
}

/// Int8 rows with f32 per-row scales.
pub fn encode_int8(x: &[f32], n: usize, k: usize) -> Encoded {
    let kp = round_up(k, K_ALIGN);
    let mut codes = vec![0u8; n * kp];
    let scales: Vec<f32> = codes
        .par_chunks_mut(kp)
        .zip(x.par_chunks(k))
        .map(|(c, row)| {
            let (d, id) = q8_scale(row);
            for (q, &v) in c.iter_mut().zip(row) {
                *q = roundf_small(v * id) as i8 as u8;
            }
            d
        })
        .collect();
    Encoded {
        parts: vec![
            ("codes", codes),
            ("scales", crate::converters::layouts::f32_bytes(&scales)),
        ],
        padded: [n, kp],
        scalars: vec![],
    }
}

/// Decode Q4_K rows to f32 `[n, k]`.
pub fn decode_q4k(bytes: &[u8], n: usize, k: usize, kp: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * kp];
    decode_blocks::<Q4K>(bytes, &mut out);
    crop(&out, kp, n, k)
}

/// Decode int8 rows to f32 `[n, k]`.
pub fn decode_int8(codes: &[u8], scales: &[u8], n: usize, k: usize, kp: usize) -> Vec<f32> {
    let s = crate::converters::layouts::f32_from(scales);
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        out.extend(
            codes[r * kp..r * kp + k]
                .iter()
                .map(|&q| q as i8 as f32 * s[r]),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn int8_rows_hit_127_and_pad_with_zero() {
        let (n, k) = (2, 300);
        let x: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.7).cos()).collect();
        let e = super::encode_int8(&x, n, k);
        assert_eq!(e.padded, [2, 512]);
        let c = &e.parts[0].1;
        assert!(c[300..512].iter().all(|&b| b == 0));
        assert!(c[..300].iter().any(|&b| b as i8 == 127 || b as i8 == -127));
        let y = super::decode_int8(c, &e.parts[1].1, n, k, 512);
        for i in 0..n * k {
            assert!((x[i] - y[i]).abs() <= 0.5 / 127.0 + 1e-6, "{i}");
        }
    }
}
