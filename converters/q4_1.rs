//! `Q4_1` (GGUF type 3): `f16 d, f16 m`, 16 bytes of nibbles (element j low nibble of `qs[j]`,
//! j+16 high); `y = d * q + m` (ggml-common.h `block_q4_1`).
//!
//! Encoder (ggml-quants.c `quantize_row_q4_1_ref`): `min`, `max` of the block,
//! `d = (max - min) / 15`, `id = d ? 1/d : 0`, `q = min(15, trunc((x - min) * id + 0.5))`; `d`
//! and `m = min` stored rounded to f16.

use super::{BlockEncode, BlockFormat, f16_le, to_f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q4_1`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Minimum (f16 bits).
    pub m: [u8; 2],
    /// Quants.
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// The Q4_1 format.
pub struct Q4_1;

impl BlockFormat for Q4_1 {
    type Block = BlockQ4_1;
    const BLOCK_ELEMS: usize = 32;
    const NAME: &'static str = "Q4_1";
    fn decode_block(b: &BlockQ4_1, out: &mut [f32]) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        for j in 0..16 {
            out[j] = d * (b.qs[j] & 0xF) as f32 + m;
            out[j + 16] = d * (b.qs[j] >> 4) as f32 + m;
        }
    }
}

impl BlockEncode for Q4_1 {
    fn encode_block(x: &[f32], y: &mut BlockQ4_1) {
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in &x[..32] {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = to_f16_le(d);
        y.m = to_f16_le(min);
        let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        for j in 0..16 {
            y.qs[j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}
