//! `Q6_K` (GGUF type 14): `u8 ql[128], u8 qh[64], i8 scales[16], f16 d` per 256.
//! For element e with `h = e / 128`, `r = e % 128`: low 4 bits are nibble `r / 64` of
//! `ql[64h + r % 64]`, high 2 bits are bits `2 * (r / 32)..` of `qh[32h + r % 32]`;
//! `y = d * scales[e / 16] * (q - 32)` (ggml-common.h `block_q6_K`).

use super::kquant::QK_K;
use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q6_K`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of each quant.
    pub ql: [u8; 128],
    /// High bit of each quant.
    pub qh: [u8; 64],
    /// Sub-block scales (and minimums), packed.
    pub scales: [i8; 16],
    /// Scale (f16 bits).
    pub d: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// The Q6_K format.
pub struct Q6K;

impl BlockFormat for Q6K {
    type Block = BlockQ6K;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "Q6_K";
    fn decode_block(b: &BlockQ6K, out: &mut [f32]) {
        let d = f16_le(b.d);
        for (e, o) in out.iter_mut().enumerate().take(QK_K) {
            let (h, r) = (e / 128, e % 128);
            let lo = (b.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
            let hi = (b.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            let q = (lo | (hi << 4)) as i8 - 32;
            *o = (d * b.scales[e / 16] as f32) * q as f32;
        }
    }
}
