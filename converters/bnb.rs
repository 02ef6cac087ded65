//! bitsandbytes' weight formats as transformers saves them (`quant_method: bitsandbytes`;
//! facts from bitsandbytes 0.50.2 `functional.py`, `_ops.py` and `backends/default/ops.py`,
//! checked against files its CPU backend wrote: `tests/fixtures/bnb-*`):
//!
//! - **4-bit** (NF4 or FP4, `Linear4bit`): the weight flattened row-major, two codes a byte,
//!   element `2i` in the high nibble of byte `i` and `2i + 1` in the low one (`weight` U8
//!   `[ceil(n k / 2), 1]`); one absmax per `blocksize` consecutive values of the flattened
//!   weight (blocks may run across rows); value `i` is `quant_map[q_i] * absmax[i / blocksize]`,
//!   one f32 product (`_dequantize_4bit_compute`), then rounded to the model dtype. The absmax
//!   is F32, or, double-quantized (`compress_statistics`), U8 codes of the 256-value
//!   `nested_quant_map` with an F32 `nested_absmax` per `nested_blocksize` of them and an
//!   `offset`: `absmax_j = nested_quant_map[a_j] * nested_absmax[j / nested_blocksize] + offset`,
//!   an f32 product then an f32 sum (`dequantize_4bit`: `dequantize_blockwise`, `+= offset`).
//! - **LLM.int8** (`Linear8bitLt`): I8 codes `[n, k]` and `SCB` F32 `[n]`, each row's absmax;
//!   value `(q * SCB_r) * (1 / 127)` in f32, left to right, `1 / 127` the f32 nearest
//!   `7.874015718698502e-3` (`int8_vectorwise_dequant`). bitsandbytes computes `SCB` from the
//!   weight cast to f16 (`Int8Params._quantize`), so every `SCB` is a half and `q * SCB` is
//!   exact in f32 (an 11-bit significand times a code below 2^7): [`to_q8_0_blocks`] lays such
//!   a weight into GGUF Q8_0 blocks (`d = SCB_r`) whose decode times the output scale
//!   [`INT8_SCALE`] is bitsandbytes' own, bit for bit.

use super::f16;
use super::q8_0::BlockQ8_0;

/// The multiplier of LLM.int8's dequantization: `1 / 127` as bitsandbytes writes it
/// (`7.874015718698502e-3`), rounded to f32 as the f32 tensor product does.
pub const INT8_SCALE: f32 = 7.874_015_718_698_502e-3_f64 as f32;

/// The `blocksize`s bitsandbytes' 4-bit dequantization accepts.
pub const BLOCKSIZES: [u64; 8] = [32, 64, 128, 256, 512, 1024, 2048, 4096];

/// Values in a 4-bit code table (`quant_map`).
pub const TABLE: usize = 16;

/// Values in the double quantization's code table (`nested_quant_map`).
pub const NESTED_TABLE: usize = 256;

/// Code `i` of the flattened weight: byte `i / 2`'s high nibble for even `i`, low for odd.
#[inline]
pub fn code4(packed: &[u8], i: usize) -> u8 {
    (packed[i / 2] >> (4 * (1 - (i & 1)))) & 15
}

/// The double-quantized absmax in f32: `map[a_j] * nested[j / nested_block] + offset`, an f32
/// product then an f32 sum, as bitsandbytes computes it.
pub fn nested_absmax(
    codes: &[u8],
    map: &[f32; NESTED_TABLE],
    nested: &[f32],
    nested_block: usize,
    offset: f32,
) -> Vec<f32> {
    codes
        .iter()
        .enumerate()
        .map(|(j, &a)| map[a as usize] * nested[j / nested_block] + offset)
        .collect()
}

/// Decode `out.len()` values of a 4-bit weight: `table[q_i] * absmax[i / block]`, one f32
/// product each. The caller has checked `packed` holds `ceil(out.len() / 2)` bytes and
/// `absmax` `ceil(out.len() / block)` values.
pub fn decode4(packed: &[u8], absmax: &[f32], table: &[f32; TABLE], block: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = table[code4(packed, i) as usize] * absmax[i / block];
    }
}

/// Decode an LLM.int8 weight `[n, k]`: `(q * SCB_r) * INT8_SCALE`, left to right in f32.
pub fn decode_int8(codes: &[u8], scb: &[f32], k: usize, out: &mut [f32]) {
    for (r, (row, o)) in codes
        .chunks_exact(k)
        .zip(out.chunks_exact_mut(k))
        .enumerate()
    {
        for (&q, v) in row.iter().zip(o) {
            *v = (q as i8 as f32 * scb[r]) * INT8_SCALE;
        }
    }
}

/// The LLM.int8 weight `[n, k]` (`k` a multiple of 32) as GGUF Q8_0 blocks, row after row,
/// each block's `d` its row's `SCB` and its codes the row's; with the output scale
/// [`INT8_SCALE`] they decode to bitsandbytes' values bit for bit (the module comment says
/// why; -128, which the quantizer never writes, is exact too: 2^7 times 11 bits). `None` where
/// [`q8_0_carries`] says no.
pub fn to_q8_0_blocks(codes: &[u8], scb: &[f32], n: usize, k: usize) -> Option<Vec<u8>> {
    if !q8_0_carries(scb, n, k) || codes.len() != n.checked_mul(k)? {
        return None;
    }
    let d: Vec<u16> = scb.iter().map(|&s| f16::from_f32(s)).collect();
    let mut out = Vec::with_capacity(n * k / QK * std::mem::size_of::<BlockQ8_0>());
    for (r, row) in codes.chunks_exact(k).enumerate() {
        for block in row.chunks_exact(QK) {
            out.extend_from_slice(&d[r].to_le_bytes());
            out.extend_from_slice(block);
        }
    }
    Some(out)
}

/// Values per GGUF Q8_0 block.
const QK: usize = 32;

/// Whether an LLM.int8 weight of `[n, k]` with row absmax `scb` lays into Q8_0 blocks exactly:
/// `k` whole blocks and every `SCB` a finite half.
pub fn q8_0_carries(scb: &[f32], n: usize, k: usize) -> bool {
    k.is_multiple_of(QK)
        && scb.len() == n
        && scb
            .iter()
            .all(|&s| s.is_finite() && f16::to_f32(f16::from_f32(s)) == s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_code_of_a_byte_is_its_high_nibble() {
        let packed = [0xa5u8, 0x3c];
        let codes: Vec<u8> = (0..4).map(|i| code4(&packed, i)).collect();
        assert_eq!(codes, [0xa, 0x5, 0x3, 0xc]);
    }

    #[test]
    fn four_bit_blocks_run_across_rows_of_the_flattened_weight() {
        let mut table = [0f32; TABLE];
        table
            .iter_mut()
            .enumerate()
            .for_each(|(i, t)| *t = i as f32);
        // Six values in blocks of 4: the second block holds values 4 and 5.
        let packed = [0x12u8, 0x34, 0x56];
        let mut out = [0f32; 6];
        decode4(&packed, &[1.0, 10.0], &table, 4, &mut out);
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0, 50.0, 60.0]);
    }

    #[test]
    fn nested_absmax_is_a_product_then_a_sum() {
        let mut map = [0f32; NESTED_TABLE];
        map[3] = 0.5;
        map[7] = -0.25;
        let got = nested_absmax(&[3, 7, 3], &map, &[2.0, 8.0], 2, 0.125);
        assert_eq!(got, [1.125, -0.375, 4.125]);
    }

    #[test]
    fn int8_rows_become_q8_0_blocks_that_decode_as_bitsandbytes() {
        let (n, k) = (2, 64);
        // Every code, -128 included.
        let codes: Vec<u8> = (0..n * k).map(|i| (i * 37 % 256) as u8).collect();
        let scb = [0.75f32, 3.5];
        let blocks = to_q8_0_blocks(&codes, &scb, n, k).unwrap();
        let mut want = vec![0f32; n * k];
        decode_int8(&codes, &scb, k, &mut want);
        let mut got = vec![0f32; n * k];
        crate::converters::decode_ggml(crate::GgmlType::Q8_0, &blocks, &mut got).unwrap();
        let got: Vec<u32> = got.iter().map(|v| (v * INT8_SCALE).to_bits()).collect();
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want);
        // Not a half, or rows of part blocks: not laid out.
        assert!(to_q8_0_blocks(&codes, &[0.75, 1.0 + 1e-6], n, k).is_none());
        assert!(to_q8_0_blocks(&codes, &[0.75, f32::INFINITY], n, k).is_none());
        assert!(to_q8_0_blocks(&codes[..n * 48], &scb, n, 48).is_none());
    }
}
