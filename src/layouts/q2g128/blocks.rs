//! `q2g128` (q2g128): this project's packed 2-bit format with 128-element groups along K,
//! the weights of the engine's `set_q2_weights` overlay. It is not ggml's `Q2_0` (type 42,
//! 64-element blocks) and has no GGUF type id; in packs it is stored as I8 blobs.
//!
//! Block (34 bytes per 128 elements, 2.125 bits per weight): `f16 d`, then `u8 qs[32]`;
//! element `32s + l` (s in 0..4, l in 0..32) is bits `2s..2s+2` of `qs[l]`, so one 32-byte load
//! gives a warp one byte per lane. Value: `y = d * (q - 2)`, codes 0..3 meaning -2, -1, 0, +1.
//!
//! Encoder (the Q4_0 reference quantizer's rule at 2 bits): `m` = the element of largest
//! magnitude (first on ties, sign kept), `d = m / -2`, `id = d ? 1/d : 0`,
//! `q = min(3, trunc(x * id + 2.5))`; `d` stored rounded to f16. The extreme element maps
//! exactly to -2 * d = m.

use crate::converters::{BlockEncode, BlockFormat, f16_le, to_f16_le};
use bytemuck::{Pod, Zeroable};

/// One q2g128 group.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ2g128 {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Quants.
    pub qs: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ2g128>() == 34);

/// The q2g128 format.
pub struct Q2g128;

impl BlockFormat for Q2g128 {
    type Block = BlockQ2g128;
    const BLOCK_ELEMS: usize = 128;
    const NAME: &'static str = "q2g128";
    fn decode_block(b: &BlockQ2g128, out: &mut [f32]) {
        let d = f16_le(b.d);
        for (e, o) in out.iter_mut().enumerate().take(128) {
            let q = (b.qs[e % 32] >> (2 * (e / 32))) & 3;
            *o = d * (q as i32 - 2) as f32;
        }
    }
}

impl BlockEncode for Q2g128 {
    fn encode_block(x: &[f32], y: &mut BlockQ2g128) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in &x[..128] {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -2.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y.d = to_f16_le(d);
        y.qs = [0; 32];
        for (e, &v) in x[..128].iter().enumerate() {
            let q = ((v * id + 2.5) as i32).clamp(0, 3) as u8;
            y.qs[e % 32] |= q << (2 * (e / 32));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extreme_maps_exactly_and_codes_are_nearest() {
        let x: Vec<f32> = (0..128)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.25)
            .collect();
        let mut b = BlockQ2g128::zeroed();
        Q2g128::encode_block(&x, &mut b);
        let mut y = [0f32; 128];
        Q2g128::decode_block(&b, &mut y);
        let d = f16_le(b.d) as f64;
        for i in 0..128 {
            // Codes are the nearest of the 4 levels within the grid [-2d, d] (d<0 flips it).
            let err = (x[i] as f64 - y[i] as f64).abs();
            let lo = (-2.0 * d).min(d);
            let hi = (-2.0 * d).max(d);
            let clamped = (x[i] as f64).clamp(lo, hi);
            assert!(
                err <= (x[i] as f64 - clamped).abs() + d.abs() * 0.5 + 1e-3,
                "i={i}"
            );
        }
        // -3.5 is the extreme (i = 0 gives -14 * 0.25); it decodes within f16 rounding of d.
        assert!((y[0] + 3.5).abs() < 1e-3);
    }
}
