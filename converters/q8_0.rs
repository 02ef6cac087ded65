//! `Q8_0` (GGUF type 8): `f16 d, i8 qs[32]`, `y = q * d`.
//!
//! Encoder = ggml `quantize_row_q8_0_ref`: `amax = max |x|`, `d = amax / 127` (f32),
//! `id = d ? 1/d : 0`, `q = roundf(x * id)` (half away from zero) with the f32 `id`, and `d`
//! stored rounded to f16.

use super::{BlockEncode, BlockFormat, f16_le, to_f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q8_0`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Quants.
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// The Q8_0 format.
pub struct Q8_0;

impl BlockFormat for Q8_0 {
    type Block = BlockQ8_0;
    const BLOCK_ELEMS: usize = 32;
    const NAME: &'static str = "Q8_0";
    fn decode_block(b: &BlockQ8_0, out: &mut [f32]) {
        let d = f16_le(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

impl BlockEncode for Q8_0 {
    fn encode_block(x: &[f32], out: &mut BlockQ8_0) {
        let (d, id) = q8_scale(x);
        out.d = to_f16_le(d);
        for (q, &v) in out.qs.iter_mut().zip(x) {
            *q = roundf_small(v * id) as i8;
        }
    }
}

/// C `roundf` (half away from zero) for |x| < 2^31, bit-exact: `x - trunc(x)` is exact in f32.
#[inline]
pub(crate) fn roundf_small(x: f32) -> i32 {
    let t = x as i32;
    let frac = x - t as f32;
    if frac >= 0.5 {
        t + 1
    } else if frac <= -0.5 {
        t - 1
    } else {
        t
    }
}

/// `(d, 1/d)` of ggml's 8-bit reference quantizers: `amax / 127`, inverse 0 for an all-zero block.
pub(crate) fn q8_scale(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

#[cfg(test)]
mod tests {
    #[test]
    fn roundf_small_is_half_away_from_zero() {
        for (x, r) in [
            (0.5f32, 1),
            (-0.5, -1),
            (1.5, 2),
            (2.5, 3),
            (-2.5, -3),
            (0.49999997, 0),
            (126.6, 127),
            (-0.2, 0),
        ] {
            assert_eq!(super::roundf_small(x), r, "{x}");
            assert_eq!(x.round() as i32, r, "{x}");
        }
    }
}
