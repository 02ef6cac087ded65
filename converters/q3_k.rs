//! `Q3_K` (GGUF type 11): `u8 hmask[32], u8 qs[64], u8 scales[12], f16 d` per 256.
//! Low 2 bits of element `128h + 32s + l` are bits `2s..` of `qs[32h + l]`; its high bit is
//! bit `e / 32` of `hmask[e % 32]`, and a *clear* high bit subtracts 4. The 16 6-bit scales are
//! the low nibbles of `scales[0..8]` then their high nibbles, with 2 more bits from
//! `scales[8..12]`, minus 32. `y = d * sc * q` (ggml-common.h `block_q3_K`).

use super::kquant::QK_K;
use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q3_K`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bit of each quant.
    pub hmask: [u8; 32],
    /// Quants.
    pub qs: [u8; 64],
    /// Sub-block scales (and minimums), packed.
    pub scales: [u8; 12],
    /// Scale (f16 bits).
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// The Q3_K format.
pub struct Q3K;

impl BlockFormat for Q3K {
    type Block = BlockQ3K;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "Q3_K";
    fn decode_block(b: &BlockQ3K, out: &mut [f32]) {
        let d = f16_le(b.d);
        let mut dl = [0f32; 16];
        for (i, v) in dl.iter_mut().enumerate() {
            let lo = if i < 8 {
                b.scales[i] & 0xF
            } else {
                b.scales[i - 8] >> 4
            };
            let hi = (b.scales[8 + i % 4] >> (2 * (i / 4))) & 3;
            let sc = ((lo | (hi << 4)) as i8).wrapping_sub(32);
            *v = d * sc as f32;
        }
        for (e, o) in out.iter_mut().enumerate().take(QK_K) {
            let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let ql = ((b.qs[32 * h + l] >> (2 * s)) & 3) as i8;
            let qh = ((b.hmask[e % 32] >> (e / 32)) & 1) ^ 1;
            let q = ql - ((qh << 2) as i8);
            *o = dl[e / 16] * q as f32;
        }
    }
}
