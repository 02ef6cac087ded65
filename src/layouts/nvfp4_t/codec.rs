//! `nvfp4_t`: the transposed NVFP4 copy that the `w4a16_gemm_t*` prefill kernels read. From the
//! `nvfp4` layout of `[n, kp]` with n zero-padded to a multiple of [`N_ALIGN`]:
//! part `codes` `[kp, np/2]`: byte `(kk, j)` = code(row 2j, col kk) | code(row 2j+1, col kk) << 4;
//! part `scales` `[kp/16, np]`: the scale matrix transposed; scalar `global_scale` as nvfp4.

use crate::converters::layouts::{Encoded, round_up};

/// N (the packed dimension here) is padded to a multiple of 64.
pub const N_ALIGN: usize = 64;

fn code_at(codes: &[u8], kp: usize, r: usize, c: usize) -> u8 {
    (codes[r * kp / 2 + c / 2] >> (4 * (c % 2))) & 0xF
}

/// Transpose an `nvfp4` encoding (`codes [n, kp/2]`, `scales [n, kp/16]`).
pub fn from_nvfp4(codes: &[u8], scales: &[u8], global_scale: f32, n: usize, kp: usize) -> Encoded {
    let np = round_up(n, N_ALIGN);
    let mut ct = vec![0u8; kp * np / 2];
    for kk in 0..kp {
        for j in 0..n.div_ceil(2) {
            let lo = code_at(codes, kp, 2 * j, kk);
            let hi = if 2 * j + 1 < n {
                code_at(codes, kp, 2 * j + 1, kk)
            } else {
                0
            };
            ct[kk * np / 2 + j] = lo | (hi << 4);
        }
    }
    let g = kp / 16;
    let mut st = vec![0u8; g * np];
    for r in 0..n {
        for gi in 0..g {
            st[gi * np + r] = scales[r * g + gi];
        }
    }
    Encoded {
        parts: vec![("codes", ct), ("scales", st)],
        padded: [np, kp],
        scalars: vec![("global_scale", global_scale)],
    }
}

/// Undo the transpose: back to `nvfp4` bytes (`codes [n, kp/2]`, `scales [n, kp/16]`).
pub fn to_nvfp4(ct: &[u8], st: &[u8], n: usize, np: usize, kp: usize) -> (Vec<u8>, Vec<u8>) {
    let mut codes = vec![0u8; n * kp / 2];
    for r in 0..n {
        for kk in 0..kp {
            let c = (ct[kk * np / 2 + r / 2] >> (4 * (r % 2))) & 0xF;
            codes[r * kp / 2 + kk / 2] |= c << (4 * (kk % 2));
        }
    }
    let g = kp / 16;
    let mut scales = vec![0u8; n * g];
    for r in 0..n {
        for gi in 0..g {
            scales[r * g + gi] = st[gi * np + r];
        }
    }
    (codes, scales)
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_round_trips_with_odd_n() {
        let (n, kp) = (5, 64);
        let codes: Vec<u8> = (0..n * kp / 2).map(|i| (i * 7 + 3) as u8).collect();
        let scales: Vec<u8> = (0..n * kp / 16).map(|i| i as u8 + 1).collect();
        let e = super::from_nvfp4(&codes, &scales, 0.5, n, kp);
        assert_eq!(e.padded, [64, 64]);
        // Row 1, col 0 is the high nibble of byte (0, 0).
        assert_eq!(e.parts[0].1[0] >> 4, codes[kp / 2] & 0xF);
        let (c2, s2) = super::to_nvfp4(&e.parts[0].1, &e.parts[1].1, n, 64, kp);
        assert_eq!((c2, s2), (codes, scales));
    }
}
