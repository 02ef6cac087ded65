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
//!
//! The block-format engine carries an NF4 weight as its own block type (`GgmlType::NF4`, not a
//! GGUF type): [`BlockNf4`], 64 values of one row, the f32 absmax then 32 code bytes, values
//! `32 h + e` of half `h` in the low (`e < 16`) or high nibble of `qs[16 h + e % 16]` (GGUF
//! Q4_0's order within each half, what the engine's 16-entry tables read);
//! [`to_engine_blocks`] re-lays a weight whose quant map is [`NF4`] and whose absmax blocks
//! hold whole 64-value blocks of a row. Decoded, `NF4[q] * absmax`: bitsandbytes' value bit for
//! bit. The GEMV's integer dot product takes the table as [`NF4_X8192`] (each value times
//! 2^13, rounded: within 5.7e-5 of the absmax), split into two int8 tables `128 hi + lo`.

use super::q8_0::BlockQ8_0;
use super::{BlockFormat, f16};
use bytemuck::{Pod, Zeroable};

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

/// bitsandbytes' NF4 table (`functional.get_4bit_type("nf4")`, the `quant_map` it saves), as
/// f32 bits.
pub const NF4: [f32; TABLE] = {
    const BITS: [u32; TABLE] = [
        0xbf80_0000,
        0xbf32_39b1,
        0xbf06_6b30,
        0xbeca_32a0,
        0xbe91_a24d,
        0xbe3d_353f,
        0xbdba_7871,
        0x0000_0000,
        0x3da2_faff,
        0x3e24_cae3,
        0x3e7c_04dd,
        0x3ead_033a,
        0x3ee1_a4b8,
        0x3f10_07ab,
        0x3f39_13b3,
        0x3f80_0000,
    ];
    let mut t = [0f32; TABLE];
    let mut i = 0;
    while i < TABLE {
        t[i] = f32::from_bits(BITS[i]);
        i += 1;
    }
    t
};

/// [`NF4`] times 2^13, each rounded to the nearest integer: the engine GEMV's weights.
pub const NF4_X8192: [i16; TABLE] = [
    -8192, -5703, -4301, -3235, -2330, -1514, -746, 0, 652, 1318, 2016, 2768, 3610, 4609, 5922,
    8192,
];
/// [`NF4_X8192`] as `128 hi + lo`, `hi = (t + 64) >> 7`: the high int8 table.
pub const NF4_HI: [i8; TABLE] = [
    -64, -45, -34, -25, -18, -12, -6, 0, 5, 10, 16, 22, 28, 36, 46, 64,
];
/// The low int8 table (`lo = t - 128 hi`, in -64 ..= 63).
pub const NF4_LO: [i8; TABLE] = [
    0, 57, 51, -35, -26, 22, 22, 0, 12, 38, -32, -48, 26, 1, 34, 0,
];

/// Values per engine NF4 block.
pub const NF4_BLOCK: usize = 64;

/// The engine's NF4 block: 64 values of a row.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockNf4 {
    /// The f32 absmax, little-endian.
    pub absmax: [u8; 4],
    /// Two halves of 16 bytes: value `32 h + e` in the low (`e < 16`) or high nibble of
    /// `qs[16 h + e % 16]`.
    pub qs: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockNf4>() == 4 + NF4_BLOCK / 2);

/// The engine's NF4 block format (`GgmlType::NF4`).
pub struct Nf4;

impl BlockFormat for Nf4 {
    type Block = BlockNf4;
    const BLOCK_ELEMS: usize = NF4_BLOCK;
    const NAME: &'static str = "NF4";
    fn decode_block(b: &BlockNf4, out: &mut [f32]) {
        let absmax = f32::from_le_bytes(b.absmax);
        for (l, o) in out.iter_mut().enumerate().take(NF4_BLOCK) {
            let (h, e) = (l / 32, l % 32);
            let q = b.qs[16 * h + e % 16] >> (4 * (e / 16));
            *o = NF4[(q & 15) as usize] * absmax;
        }
    }
}

/// Whether a 4-bit weight of `[n, k]` in absmax blocks of `blocksize` with code table `table`
/// lays into engine NF4 blocks: the table is [`NF4`] bit for bit, and every 64 values of a
/// row share one absmax (`blocksize` a multiple of 64 dividing `k`).
pub fn nf4_carries(table: &[f32; TABLE], blocksize: usize, k: usize) -> bool {
    table
        .iter()
        .zip(&NF4)
        .all(|(a, b)| a.to_bits() == b.to_bits())
        && blocksize.is_multiple_of(NF4_BLOCK)
        && blocksize > 0
        && k.is_multiple_of(blocksize)
}

/// A 4-bit NF4 weight `[n, k]` (packed codes, its f32 absmax per `blocksize` values) as engine
/// NF4 blocks, row after row; the caller has checked [`nf4_carries`] and the lengths.
pub fn to_engine_blocks(
    packed: &[u8],
    absmax: &[f32],
    blocksize: usize,
    n: usize,
    k: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * k / NF4_BLOCK * std::mem::size_of::<BlockNf4>());
    for r in 0..n {
        for g in 0..k / NF4_BLOCK {
            let at = r * k + g * NF4_BLOCK;
            out.extend_from_slice(&absmax[at / blocksize].to_le_bytes());
            for h in 0..2 {
                for e in 0..16 {
                    let lo = code4(packed, at + 32 * h + e);
                    let hi = code4(packed, at + 32 * h + e + 16);
                    out.push(lo | hi << 4);
                }
            }
        }
    }
    out
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
    fn the_integer_tables_are_the_nf4_table_times_8192() {
        for i in 0..TABLE {
            let t = NF4_X8192[i] as i32;
            assert_eq!(t, (NF4[i] as f64 * 8192.0).round() as i32, "{i}");
            assert_eq!(128 * NF4_HI[i] as i32 + NF4_LO[i] as i32, t, "{i}");
            assert!((-64..64).contains(&(NF4_LO[i] as i32)));
        }
    }

    #[test]
    fn nf4_engine_blocks_decode_as_bitsandbytes() {
        let (n, k, bs) = (3, 128, 128);
        let packed: Vec<u8> = (0..n * k / 2).map(|i| (i * 73 % 256) as u8).collect();
        let absmax = [0.5f32, -3.25, 1e-3];
        assert!(nf4_carries(&NF4, bs, k));
        let blocks = to_engine_blocks(&packed, &absmax, bs, n, k);
        let mut got = vec![0f32; n * k];
        crate::converters::decode_blocks::<Nf4>(&blocks, &mut got);
        let mut want = vec![0f32; n * k];
        decode4(&packed, &absmax, &NF4, bs, &mut want);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        let mut other = NF4;
        other[3] = -0.4;
        assert!(!nf4_carries(&other, bs, k));
        assert!(!nf4_carries(&NF4, 32, k));
        assert!(!nf4_carries(&NF4, 128, 192));
    }

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
