//! compressed-tensors integer weights: `int-quantized` (one signed `int8` code per byte) and
//! `pack-quantized` (`bits`-bit codes, 1 to 8, packed densely into little-endian `int32` words),
//! with a float scale per tensor, per output row or per group of `group` columns, and for
//! asymmetric schemes a zero point of the scale's shape.
//!
//! Facts from compressed-tensors 0.20.0 (`compressors/pack_quantized/helpers.py`,
//! `quantization/lifecycle/forward_helpers.py`), written here from their description:
//! - packing: a code `q` in `[-2^(b-1), 2^(b-1))` is stored as `q + 2^(b-1)`; a row of `k`
//!   codes is one little-endian bit stream, code `i` at bits `i*b .. i*b+b` (groups of 32 codes
//!   fill exactly `b` words), cut to `ceil(k*b/32)` words;
//! - the zero point of a packed asymmetric weight is packed the same way along dimension 0:
//!   column `g` of the `[ceil(n*b/32), G]` word matrix is the stream of the `n` zero points of
//!   group `g`;
//! - `w = (q - z) * s` in the scale's dtype. Every `q - z` (|q - z| <= 255) and every product of
//!   it with a BF16, F16 or F32 scale is exact in f32, so [`decode`] gives the library's f32
//!   decode bit for bit, and its BF16/F16 decode after one rounding.

/// The most bits a packed code has.
pub const MAX_BITS: u32 = 8;

/// `ceil(count * bits / 32)`: the words a stream of `count` codes takes (`None` on overflow).
pub fn packed_words(count: u64, bits: u32) -> Option<u64> {
    count.checked_mul(bits as u64).map(|b| b.div_ceil(32))
}

/// Code `i` of the little-endian bit stream `words` (bytes of `u32` words), offset removed.
fn code(words: &[u8], i: usize, bits: u32) -> i8 {
    let bit = i * bits as usize;
    let (byte, shift) = (bit / 8, bit % 8);
    // Two bytes always hold a code of at most 8 bits starting at any bit of the first.
    let lo = words[byte] as u16;
    let hi = words.get(byte + 1).copied().unwrap_or(0) as u16;
    let v = ((lo | hi << 8) >> shift) & ((1u16 << bits) - 1);
    (v as i16 - (1i16 << (bits - 1))) as i8
}

/// Unpack `rows` streams of `count` codes, each `row_words` words long, into `[rows, count]`.
pub fn unpack_rows(
    words: &[u8],
    rows: usize,
    row_words: usize,
    count: usize,
    bits: u32,
) -> Vec<i8> {
    assert!((1..=MAX_BITS).contains(&bits));
    let mut out = Vec::with_capacity(rows * count);
    for r in 0..rows {
        let row = &words[r * row_words * 4..(r + 1) * row_words * 4];
        out.extend((0..count).map(|i| code(row, i, bits)));
    }
    out
}

/// Unpack a zero-point matrix packed along dimension 0: `[words_n, groups]` words holding, per
/// column, the stream of `n` codes; returns `[n, groups]`.
pub fn unpack_cols(words: &[u8], words_n: usize, groups: usize, n: usize, bits: u32) -> Vec<i8> {
    // Column g as its own little-endian stream of words_n words.
    let mut out = vec![0i8; n * groups];
    let mut col = vec![0u8; words_n * 4];
    for g in 0..groups {
        for w in 0..words_n {
            let at = (w * groups + g) * 4;
            col[w * 4..w * 4 + 4].copy_from_slice(&words[at..at + 4]);
        }
        for r in 0..n {
            out[r * groups + g] = code(&col, r, bits);
        }
    }
    out
}

/// `w[r, c] = (q[r, c] - z[r, c / group]) * s[r, c / group]` over `[n, k]`, where the scale and
/// zero point hold `groups = k / group` values per row (`scales.len() == 1`: one for the tensor).
pub fn decode(
    codes: &[i8],
    scales: &[f32],
    zeros: Option<&[i8]>,
    n: usize,
    k: usize,
    out: &mut [f32],
) {
    assert_eq!(codes.len(), n * k);
    assert_eq!(out.len(), n * k);
    let per_tensor = scales.len() == 1;
    let groups = if per_tensor {
        1
    } else {
        scales.len() / n.max(1)
    };
    let group = k / groups.max(1);
    for r in 0..n {
        for c in 0..k {
            let si = if per_tensor {
                0
            } else {
                r * groups + c / group
            };
            let z = zeros.map_or(0, |z| z[si] as i16);
            let q = codes[r * k + c] as i16 - z;
            out[r * k + c] = q as f32 * scales[si];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packing as the library describes it: code i at bit i*b of the row's stream.
    fn pack(codes: &[i8], bits: u32) -> Vec<u8> {
        let words = packed_words(codes.len() as u64, bits).unwrap() as usize;
        let mut stream = vec![0u32; words + 1];
        for (i, &q) in codes.iter().enumerate() {
            let v = (q as i32 + (1 << (bits - 1))) as u32;
            let bit = i * bits as usize;
            stream[bit / 32] |= v << (bit % 32);
            if bit % 32 + bits as usize > 32 {
                stream[bit / 32 + 1] |= v >> (32 - bit % 32);
            }
        }
        stream[..words]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }

    #[test]
    fn every_width_unpacks_what_was_packed_across_word_boundaries() {
        for bits in 1..=MAX_BITS {
            let lo = -(1i32 << (bits - 1));
            let codes: Vec<i8> = (0..77)
                .map(|i| (lo + (i * 7) % (1 << bits)) as i8)
                .collect();
            let words = pack(&codes, bits);
            assert_eq!(words.len() / 4, packed_words(77, bits).unwrap() as usize);
            assert_eq!(
                unpack_rows(&words, 1, words.len() / 4, 77, bits),
                codes,
                "{bits} bits"
            );
        }
    }

    #[test]
    fn affine_decode_per_group_with_zero_points() {
        let codes: Vec<i8> = vec![-8, 7, 0, 1, 2, -3, 4, 5];
        let mut out = vec![0f32; 8];
        decode(
            &codes,
            &[0.5, 2.0, 1.0, -1.0],
            Some(&[1, 0, -2, 3]),
            2,
            4,
            &mut out,
        );
        assert_eq!(out, [-4.5, 3.0, 0.0, 2.0, 4.0, -1.0, -1.0, -2.0]);
        decode(&codes, &[0.25], None, 2, 4, &mut out);
        assert_eq!(out[0], -2.0);
    }
}
