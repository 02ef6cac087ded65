//! compressed-tensors' `mxfp4-pack-quantized` (llm-compressor's MXFP4A16): `weight_packed` U8
//! `[n, k/2]`, element `2i` of a row in the low nibble of byte `i` and `2i + 1` in the high one
//! (compressed-tensors 0.20 `pack_fp4_to_uint8`), and `weight_scale` U8 `[n, k/32]`, one E8M0
//! exponent per 32 values of a row (its `decompress_mx_scale`: `2^(e - 127)`); a value is
//! `E2M1[q] * 2^(e - 127)` in f32 (its `dequantize`), an exact product; code 8 is -0.0 there
//! (its `unpack_fp4_from_uint8` table).
//!
//! These are GGUF MXFP4's values (`mxfp4.rs`: the E2M1 table doubled, the scale halved), so
//! [`to_gguf_blocks`] lays a weight into GGUF MXFP4 blocks that decode to the same values bit
//! for bit but the sign of code 8's zero (ggml's int8 table holds +0), except where a scale
//! byte is 255 (NaN in the OCP MX spec v1.0; compressed-tensors
//! decodes it as 2^128 = inf, ggml as 2^127): that weight is not laid out.

use super::mxfp4::BlockMxfp4;
use super::nvfp4_modelopt::e2m1_to_f32;

/// Values per scale (the MX block size).
pub const GROUP: usize = 32;

/// The scale byte the OCP MX spec reserves for NaN.
pub const NAN_SCALE: u8 = 255;

/// `2^(e - 127)` as f32, as compressed-tensors decompresses an E8M0 scale (via bfloat16,
/// where every such power is exact): 2^-127 (subnormal) for 0, infinity for 255.
pub fn e8m0(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(0x0040_0000),
        NAN_SCALE => f32::INFINITY,
        e => f32::from_bits((e as u32) << 23),
    }
}

/// Code `i` (0..k) of a packed row.
#[inline]
fn code(row: &[u8], i: usize) -> u8 {
    (row[i / 2] >> (4 * (i & 1))) & 15
}

/// Decode `[n, k]` values (`k` a multiple of [`GROUP`]) from the packed codes and E8M0 scales
/// into `out`, each `E2M1[q] * 2^(e - 127)` (one f32 product: compressed-tensors' own result).
pub fn decode(packed: &[u8], scales: &[u8], n: usize, k: usize, out: &mut [f32]) {
    for r in 0..n {
        let row = &packed[r * k / 2..(r + 1) * k / 2];
        let s = &scales[r * k / GROUP..(r + 1) * k / GROUP];
        for (c, o) in out[r * k..(r + 1) * k].iter_mut().enumerate() {
            *o = e2m1_to_f32(code(row, c)) * e8m0(s[c / GROUP]);
        }
    }
}

/// The weight `[n, k]` as GGUF MXFP4 blocks (`k / 32` a row, row after row): each block's
/// exponent is the group's scale byte, element `j` the low nibble of `qs[j]`, element `j + 16`
/// the high one. `None` where a scale byte is [`NAN_SCALE`] (ggml would decode it otherwise).
pub fn to_gguf_blocks(packed: &[u8], scales: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    if scales[..n * k / GROUP].contains(&NAN_SCALE) {
        return None;
    }
    let mut out = Vec::with_capacity(n * k / GROUP * std::mem::size_of::<BlockMxfp4>());
    for r in 0..n {
        let row = &packed[r * k / 2..(r + 1) * k / 2];
        for b in 0..k / GROUP {
            out.push(scales[r * k / GROUP + b]);
            out.extend(
                (0..16).map(|j| code(row, GROUP * b + j) | code(row, GROUP * b + j + 16) << 4),
            );
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converters::{BlockFormat, mxfp4::Mxfp4};

    /// Every code and every scale byte but 255: the GGUF blocks decode (ggml's way) to the
    /// compressed-tensors values bit for bit, but +0 for its -0; a 255 is not laid out.
    #[test]
    fn gguf_blocks_decode_to_the_same_values() {
        let (n, k) = (255usize, 64usize);
        let packed: Vec<u8> = (0..n * k / 2).map(|i| (i * 37 % 256) as u8).collect();
        let scales: Vec<u8> = (0..n * k / GROUP).map(|i| (i % 255) as u8).collect();
        let mut want = vec![0f32; n * k];
        decode(&packed, &scales, n, k, &mut want);
        let blocks = to_gguf_blocks(&packed, &scales, n, k).unwrap();
        let mut got = vec![0f32; n * k];
        for (b, o) in blocks.chunks_exact(17).zip(got.chunks_exact_mut(GROUP)) {
            Mxfp4::decode_block(bytemuck::from_bytes(b), o);
        }
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.to_bits(), if *w == 0.0 { 0 } else { w.to_bits() });
        }
        let mut bad = scales.clone();
        bad[7] = NAN_SCALE;
        assert!(to_gguf_blocks(&packed, &bad, n, k).is_none());
    }
}
