//! `Q8_1` (GGUF type 9): `f16 d, f16 s, i8 qs[32]` with `s = d * sum(qs)` (36 bytes, ggml's
//! `sizeof(block_q8_1)`; gguf-py 0.19.0's size table says 40, a leftover of f32 `d`/`s`).
//!
//! Encoder = ggml `quantize_row_q8_1_ref`: as Q8_0, then `s = fp16(sum(q) * d)` with the integer
//! sum of the rounded codes. (The GPU MMQ arms' activation blocks take `s` from the unquantized
//! inputs instead, formats.md "q8_1 activations and int8 requantization"; that is a different layout.)

use super::q8_0::{q8_scale, roundf_small};
use super::{BlockEncode, BlockFormat, f16_le, to_f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q8_1`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// `d` times the sum of the quants (f16 bits).
    pub s: [u8; 2],
    /// Quants.
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

/// The Q8_1 format.
pub struct Q8_1;

impl BlockFormat for Q8_1 {
    type Block = BlockQ8_1;
    const BLOCK_ELEMS: usize = 32;
    const NAME: &'static str = "Q8_1";
    fn decode_block(b: &BlockQ8_1, out: &mut [f32]) {
        let d = f16_le(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

impl BlockEncode for Q8_1 {
    fn encode_block(x: &[f32], out: &mut BlockQ8_1) {
        let (d, id) = q8_scale(x);
        out.d = to_f16_le(d);
        let mut sum = 0i32;
        for (q, &v) in out.qs.iter_mut().zip(x) {
            *q = roundf_small(v * id) as i8;
            sum += *q as i32;
        }
        out.s = to_f16_le(sum as f32 * d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_field_is_d_times_code_sum() {
        let x: Vec<f32> = (0..32).map(|i| i as f32 - 10.3).collect();
        let mut b = BlockQ8_1::zeroed();
        Q8_1::encode_block(&x, &mut b);
        let d = f16_le(b.d);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        // amax is x[31] = 20.7; s uses the f32 d, not the f16-rounded one.
        let d32 = 20.7f32 / 127.0;
        assert_eq!(b.s, to_f16_le(sum as f32 * d32));
        assert_eq!(d, f16_le(to_f16_le(d32)));
        assert_eq!(b.qs[31], 127);
    }
}
