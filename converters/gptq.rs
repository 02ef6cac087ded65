//! GPTQ's own packing (transformers / AutoGPTQ `quant_method: gptq`, the "gptq" (v1)
//! checkpoint format): I32 `qweight [k * bits / 32, n]`, I32 `qzeros [G, n * bits / 32]`,
//! F16 `scales [G, n]`, I32 `g_idx [k]` (the group of each input channel). Facts from AutoGPTQ
//! 0.7.1 (`nn_modules/qlinear/qlinear_cuda.py` and `qlinear_cuda_old.py`, `pack` and the
//! torch path of `forward`), written here from their description:
//! - `bits` of 2, 4 or 8 divide a 32-bit word: code `i` of a column (input channel `i`) is in
//!   word `i / (32 / bits)` at bits `bits * (i % (32 / bits))`; zero point `j` of a group row
//!   likewise, along the outputs. (3-bit codes straddle words and are not read.)
//! - v1 stores each zero point minus one, and the decode adds it back:
//!   `w[j, i] = s[g, j] * (q[i, j] - (zq[g, j] + 1))` with `g = g_idx[i]`. A zero point of 0
//!   is stored as -1 (all ones), which AutoGPTQ's packing also ORs into the word's higher
//!   fields, and its two decoders then disagree (`qlinear_cuda_old` masks after the +1,
//!   `qlinear_cuda` before): such a field is refused, naming row and group.
//! - Without act-order (`desc_act: false`) `g_idx[i] = i / group`; with it the groups follow
//!   the Hessian's order and `g_idx` is any map with `group` channels a group, which [`to_int`]
//!   returns beside the codes (a layout that carries act-order sorts the channels by it).
//! - The library computes `w` in F16 (one rounding); every `s * (q - z)` with `|q - z| < 2^8`
//!   and an F16 scale is exact in f32, so [`decode`] gives its f32 decode bit for bit.

use super::int_source::{IntWeight, by_output};

/// The code widths whose codes stay inside one word (3 is GPTQ's other width).
pub const BITS: [u32; 3] = [2, 4, 8];

/// Field `i` of `bits` bits in a stream of little-endian u32 words given as bytes.
#[inline]
fn field(words: &[u8], i: usize, bits: u32) -> u32 {
    let per = 32 / bits as usize;
    let w = i / per;
    let word = u32::from_le_bytes([
        words[4 * w],
        words[4 * w + 1],
        words[4 * w + 2],
        words[4 * w + 3],
    ]);
    (word >> (bits as usize * (i % per))) & ((1u32 << bits) - 1)
}

/// Whether `g_idx` is the order without act-order: `g_idx[i] = i / group`.
pub fn ordered(g_idx: &[i32], group: usize) -> bool {
    g_idx
        .iter()
        .enumerate()
        .all(|(i, &g)| group > 0 && g as i64 == (i / group) as i64)
}

/// A group row's zero points that cannot be decoded (the first row and group with a v1
/// field of all ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmbiguousZero {
    /// The output row.
    pub row: usize,
    /// The group.
    pub group: usize,
}

/// The codes `[n, k]` (output rows, unsigned) and zero points `[n, groups]` (the v1 field plus
/// one) of a weight with `qweight [k * bits / 32, n]` and `qzeros [groups, n * bits / 32]`.
pub fn codes(
    qweight: &[u8],
    qzeros: &[u8],
    bits: u32,
    [n, k]: [usize; 2],
    groups: usize,
) -> Result<(Vec<u8>, Vec<u32>), AmbiguousZero> {
    let all_ones = (1u32 << bits) - 1;
    let zrow = n * bits as usize / 8;
    let mut z = vec![0u32; n * groups];
    for g in 0..groups {
        let row = &qzeros[g * zrow..(g + 1) * zrow];
        for j in 0..n {
            let f = field(row, j, bits);
            if f == all_ones {
                return Err(AmbiguousZero { row: j, group: g });
            }
            z[j * groups + g] = f + 1;
        }
    }
    // qweight is [k / per, n] words: word (i / per, j) holds code i of column j.
    let per = 32 / bits as usize;
    let mut q = vec![0u8; n * k];
    for i in 0..k {
        let shift = bits as usize * (i % per);
        let base = (i / per) * n * 4;
        for j in 0..n {
            let b = &qweight[base + 4 * j..base + 4 * j + 4];
            let word = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            q[j * k + i] = ((word >> shift) & all_ones) as u8;
        }
    }
    Ok((q, z))
}

/// The weight `[n, k]` as integer groups of `group` values (`k` for one group a row), from
/// the packed tensors and the `scales [k / group, n]` as f32, in group order as stored, and
/// each input channel's group `g_idx` as given (with act-order not in order: a layout sorts
/// the columns by it, and checks it below the groups).
pub fn to_int(
    qweight: &[u8],
    qzeros: &[u8],
    scales: &[f32],
    g_idx: &[i32],
    bits: u32,
    [n, k]: [usize; 2],
    group: usize,
) -> Result<(IntWeight, Vec<u32>), GptqError> {
    let groups = k.checked_div(group).unwrap_or(0);
    let (codes, zeros) = self::codes(qweight, qzeros, bits, [n, k], groups)?;
    let w = IntWeight {
        bits,
        group,
        rows: n,
        cols: k,
        codes,
        scales: by_output(scales, n, groups),
        zeros,
    };
    Ok((w, g_idx.iter().map(|&g| g as u32).collect()))
}

/// Why a GPTQ weight is not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GptqError {
    /// A v1 zero point field of all ones.
    #[error(
        "row {}, group {}: its zero point is stored as all ones (a zero point of 0 written as -1, which GPTQ's v1 packing spreads into the word's other fields; its decoders disagree on it)",
        .0.row,
        .0.group
    )]
    Zero(AmbiguousZero),
}

impl From<AmbiguousZero> for GptqError {
    fn from(z: AmbiguousZero) -> Self {
        GptqError::Zero(z)
    }
}

/// Decode to `[n, k]` (output rows), any `g_idx` (act-order included): `w[j, i] =
/// s[g, j] * (q - z)` with `g = g_idx[i]`; `scales` is `[groups, n]`.
pub fn decode(
    qweight: &[u8],
    qzeros: &[u8],
    scales: &[f32],
    g_idx: &[i32],
    bits: u32,
    [n, k]: [usize; 2],
    out: &mut [f32],
) -> Result<(), AmbiguousZero> {
    let groups = scales.len() / n.max(1);
    let (q, z) = codes(qweight, qzeros, bits, [n, k], groups)?;
    for j in 0..n {
        for i in 0..k {
            let g = g_idx[i] as usize;
            let d = q[j * k + i] as i32 - z[j * groups + g] as i32;
            out[j * k + i] = scales[g * n + j] * d as f32;
        }
    }
    Ok(())
}

/// Pack unsigned codes `[n, k]` and zero points `[n, groups]` as GPTQ v1 stores them
/// (`qweight [k * bits / 32, n]`, `qzeros [groups, n * bits / 32]` words, little-endian bytes;
/// each zero point stored minus one): the inverse of [`codes`], for test sources.
pub fn pack(
    q: &[u8],
    z: &[u32],
    bits: u32,
    [n, k]: [usize; 2],
    groups: usize,
) -> (Vec<u8>, Vec<u8>) {
    let per = 32 / bits as usize;
    let mut qweight = vec![0u32; k / per * n];
    for j in 0..n {
        for i in 0..k {
            qweight[(i / per) * n + j] |= u32::from(q[j * k + i]) << (bits as usize * (i % per));
        }
    }
    let zw = n / per;
    let mut qzeros = vec![0u32; groups * zw];
    for g in 0..groups {
        for j in 0..n {
            let v = (z[j * groups + g].wrapping_sub(1)) & ((1u32 << bits) - 1);
            qzeros[g * zw + j / per] |= v << (bits as usize * (j % per));
        }
    }
    let bytes = |w: Vec<u32>| w.into_iter().flat_map(u32::to_le_bytes).collect();
    (bytes(qweight), bytes(qzeros))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_follow_the_word_order_and_zero_points_are_one_more() {
        // 4 bits: word (0, j) holds input channels 0..8 of column j; zero fields of 7 decode to 8.
        let qweight: Vec<u8> = (0..8).flat_map(|_| 0x7654_3210u32.to_le_bytes()).collect();
        let qzeros = 0x7777_7777u32.to_le_bytes();
        let mut out = vec![0f32; 64];
        decode(&qweight, &qzeros, &[0.5; 8], &[0; 8], 4, [8, 8], &mut out).unwrap();
        assert_eq!(out[..8], [-4.0, -3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5]);
        assert_eq!(out[56..], out[..8]);
        // A zero point stored as all ones is refused, naming its row and group.
        let ones = 0xFFFF_FFF7u32.to_le_bytes();
        assert_eq!(
            codes(&qweight, &ones, 4, [8, 8], 1),
            Err(AmbiguousZero { row: 1, group: 0 })
        );
    }

    #[test]
    fn pack_inverts_codes_at_every_width() {
        for bits in BITS {
            let (n, k, groups) = (16usize, 64usize, 2usize);
            let top = 1u32 << bits;
            let q: Vec<u8> = (0..n * k).map(|i| (i * 7 % top as usize) as u8).collect();
            let z: Vec<u32> = (0..n * groups)
                .map(|i| 1 + (i as u32 % (top - 1)))
                .collect();
            let (qw, qz) = pack(&q, &z, bits, [n, k], groups);
            assert_eq!(qw.len(), k * bits as usize / 32 * n * 4);
            assert_eq!(codes(&qw, &qz, bits, [n, k], groups), Ok((q, z)), "{bits}");
        }
    }

    #[test]
    fn ordered_is_the_order_without_act_order() {
        assert!(ordered(&[0, 0, 1, 1], 2));
        assert!(!ordered(&[0, 1, 0, 1], 2));
        assert!(!ordered(&[0, 0, 1, 1], 0));
    }
}
