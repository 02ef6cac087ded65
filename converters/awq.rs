//! AutoAWQ's GEMM packing of 4-bit weights (transformers `quant_method: awq`, `version: gemm`):
//! I32 `qweight [k, n/8]`, I32 `qzeros [G, n/8]`, F16 `scales [G, n]` (the weight transposed:
//! rows are input channels). Facts from AutoAWQ 0.2.9 (`WQLinear_GEMM.from_linear`,
//! `utils/packing_utils.py`): word `c` of a row holds output columns `8c .. 8c+8`, column
//! `8c + ORDER[i]` at bits `4i .. 4i+4` with `ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`; the zero points
//! are packed the same way; `w[j, i] = (q[i, j] - z[i / g, j]) * s[i / g, j]` with
//! `g = k / G`. AutoAWQ computes that in F16 (one rounding); the f32 decode here is exact
//! (a 4-bit difference times an F16 scale), so rounding it to F16 gives the library's bits.

use super::int_source::{IntWeight, by_output};

/// The nibble that holds column offset `o` of a word: the inverse of AWQ's packing order.
pub const NIBBLE_OF: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// The 4-bit code of column `j` in a row of packed words (bytes of little-endian u32).
#[inline]
fn code(row: &[u8], j: usize) -> i16 {
    let w = j / 8;
    let word = u32::from_le_bytes([row[4 * w], row[4 * w + 1], row[4 * w + 2], row[4 * w + 3]]);
    ((word >> (4 * NIBBLE_OF[j % 8])) & 0xF) as i16
}

/// The codes `[n, k]` (output rows) and zero points `[n, groups]` of a weight, unsigned
/// 4-bit values: `qweight` is `[k, n/8]` words, `qzeros` `[groups, n/8]`.
pub fn codes(
    qweight: &[u8],
    qzeros: &[u8],
    n: usize,
    k: usize,
    groups: usize,
) -> (Vec<u8>, Vec<u32>) {
    let rw = n / 8 * 4;
    let mut q = vec![0u8; n * k];
    for i in 0..k {
        let row = &qweight[i * rw..(i + 1) * rw];
        for j in 0..n {
            q[j * k + i] = code(row, j) as u8;
        }
    }
    let mut z = vec![0u32; n * groups];
    for g in 0..groups {
        let row = &qzeros[g * rw..(g + 1) * rw];
        for j in 0..n {
            z[j * groups + g] = code(row, j) as u32;
        }
    }
    (q, z)
}

/// The weight `[n, k]` as 4-bit integer groups of `group` values (`s * (q - z)`, AutoAWQ's
/// decode before its F16 rounding), from `qweight [k, n/8]` and `qzeros [k/group, n/8]` words
/// and the `scales [k/group, n]` as f32.
pub fn to_int(
    qweight: &[u8],
    qzeros: &[u8],
    scales: &[f32],
    [n, k]: [usize; 2],
    group: usize,
) -> IntWeight {
    let groups = k.checked_div(group).unwrap_or(0);
    let (codes, zeros) = self::codes(qweight, qzeros, n, k, groups);
    IntWeight {
        bits: 4,
        group,
        rows: n,
        cols: k,
        codes,
        scales: by_output(scales, n, groups),
        zeros,
    }
}

/// Pack 4-bit codes `[n, k]` (output rows) and zero points `[n, groups]` as AutoAWQ stores
/// them: `qweight [k, n/8]` and `qzeros [groups, n/8]` words, little-endian bytes (the inverse
/// of [`codes`]; test sources and `gpu-check` rows).
pub fn pack(q: &[u8], z: &[u32], n: usize, k: usize, groups: usize) -> (Vec<u8>, Vec<u8>) {
    let word = |get: &dyn Fn(usize) -> u32, row_words: usize, w: usize| {
        (0..8).fold(0u32, |acc, o| {
            acc | (get(8 * (w % row_words) + o) & 0xF) << (4 * NIBBLE_OF[o])
        })
    };
    let rw = n / 8;
    let qweight = (0..k * rw)
        .flat_map(|w| word(&|j| u32::from(q[j * k + w / rw]), rw, w).to_le_bytes())
        .collect();
    let qzeros = (0..groups * rw)
        .flat_map(|w| word(&|j| z[j * groups + w / rw], rw, w).to_le_bytes())
        .collect();
    (qweight, qzeros)
}

/// Decode to `[n, k]` (output rows): `qweight` is `[k, n/8]` words, `qzeros` `[groups, n/8]`,
/// `scales` `[groups, n]`.
pub fn decode(qweight: &[u8], qzeros: &[u8], scales: &[f32], n: usize, k: usize, out: &mut [f32]) {
    let groups = scales.len() / n.max(1);
    let g = k / groups.max(1);
    let rw = n / 8 * 4;
    for i in 0..k {
        let (qrow, zrow) = (
            &qweight[i * rw..(i + 1) * rw],
            &qzeros[(i / g) * rw..(i / g + 1) * rw],
        );
        for j in 0..n {
            let q = code(qrow, j) - code(zrow, j);
            out[j * k + i] = q as f32 * scales[(i / g) * n + j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packing_order_is_undone() {
        // One word per row holding columns 0..8 as AWQ packs them: column ORDER[i] at nibble i.
        const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
        let cols: [u32; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut word = 0u32;
        for (i, &o) in ORDER.iter().enumerate() {
            word |= cols[o] << (4 * i);
        }
        let row = word.to_le_bytes();
        let zeros = 0u32.to_le_bytes();
        let mut out = vec![0f32; 8];
        decode(&row, &zeros, &[1.0; 8], 8, 1, &mut out);
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        // pack inverts codes.
        let q: Vec<u8> = (0..16 * 64).map(|i| (i * 7 % 16) as u8).collect();
        let z: Vec<u32> = (0..16 * 2).map(|i| (i % 16) as u32).collect();
        let (qw, qz) = pack(&q, &z, 16, 64, 2);
        assert_eq!(codes(&qw, &qz, 16, 64, 2), (q, z));
    }
}
