//! `Q5_0` (GGUF type 6): `f16 d`, `u8 qh[4]` (bit j of the little-endian u32 is the 5th bit of
//! element j), 16 bytes of low nibbles as in Q4_0; `y = d * (q - 16)` (ggml-common.h).

use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q5_0`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// High bit of each quant.
    pub qh: [u8; 4],
    /// Quants.
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// The Q5_0 format.
pub struct Q5_0;

impl BlockFormat for Q5_0 {
    type Block = BlockQ5_0;
    const BLOCK_ELEMS: usize = 32;
    const NAME: &'static str = "Q5_0";
    fn decode_block(b: &BlockQ5_0, out: &mut [f32]) {
        let d = f16_le(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..16 {
            let lo = (b.qs[j] & 0xF) as u32 | (((qh >> j) & 1) << 4);
            let hi = (b.qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
            out[j] = d * (lo as i32 - 16) as f32;
            out[j + 16] = d * (hi as i32 - 16) as f32;
        }
    }
}
