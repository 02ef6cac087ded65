//! `Q4_0` (GGUF type 2): 32 values, `f16 d` then 16 bytes of nibbles; element j is the low nibble
//! of `qs[j]`, element j+16 the high nibble; `y = d * (q - 8)` (ggml-common.h `block_q4_0`).
//!
//! Encoder (ggml-quants.c `quantize_row_q4_0_ref`): `max` = the element of largest magnitude
//! (first on ties, sign kept), `d = max / -8`, `id = d ? 1/d : 0`,
//! `q = min(15, trunc(x * id + 8.5))`; `d` stored rounded to f16.

use super::{BlockEncode, BlockFormat, f16_le, to_f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q4_0`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Quants.
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// The Q4_0 format.
pub struct Q4_0;

impl BlockFormat for Q4_0 {
    type Block = BlockQ4_0;
    const BLOCK_ELEMS: usize = 32;
    const NAME: &'static str = "Q4_0";
    fn decode_block(b: &BlockQ4_0, out: &mut [f32]) {
        let d = f16_le(b.d);
        for j in 0..16 {
            out[j] = d * ((b.qs[j] & 0xF) as i32 - 8) as f32;
            out[j + 16] = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
        }
    }
}

impl BlockEncode for Q4_0 {
    fn encode_block(x: &[f32], y: &mut BlockQ4_0) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in &x[..32] {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = to_f16_le(d);
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for j in 0..16 {
            y.qs[j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}
