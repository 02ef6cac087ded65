//! `Q5_1` (GGUF type 7): `f16 d, f16 m, u8 qh[4], u8 qs[16]`; `y = d * q + m` with 5-bit q built
//! as in Q5_0 (ggml-common.h `block_q5_1`).

use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q5_1`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Minimum (f16 bits).
    pub m: [u8; 2],
    /// High bit of each quant.
    pub qh: [u8; 4],
    /// Quants.
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// The Q5_1 format.
pub struct Q5_1;

impl BlockFormat for Q5_1 {
    type Block = BlockQ5_1;
    const BLOCK_ELEMS: usize = 32;
    const NAME: &'static str = "Q5_1";
    fn decode_block(b: &BlockQ5_1, out: &mut [f32]) {
        let (d, m) = (f16_le(b.d), f16_le(b.m));
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..16 {
            let lo = (b.qs[j] & 0xF) as u32 | (((qh >> j) & 1) << 4);
            let hi = (b.qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
            out[j] = d * lo as f32 + m;
            out[j + 16] = d * hi as f32 + m;
        }
    }
}
