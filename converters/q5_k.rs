//! `Q5_K` (GGUF type 13): `f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]` per 256.
//! Low nibbles as Q4_K; the 5th bit of element e is bit `e / 32` of `qh[e % 32]`;
//! `y = d*sc*q - dmin*m` (ggml-common.h `block_q5_K`).

use super::kquant::{QK_K, get_scale_min_k4};
use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q5_K`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Scale of the minimums (f16 bits).
    pub dmin: [u8; 2],
    /// Sub-block scales (and minimums), packed.
    pub scales: [u8; 12],
    /// High bit of each quant.
    pub qh: [u8; 32],
    /// Quants.
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// The Q5_K format.
pub struct Q5K;

impl BlockFormat for Q5K {
    type Block = BlockQ5K;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "Q5_K";
    fn decode_block(b: &BlockQ5K, out: &mut [f32]) {
        let d = f16_le(b.d);
        let dmin = f16_le(b.dmin);
        for c in 0..4 {
            for nib in 0..2 {
                let (sc, m) = get_scale_min_k4(2 * c + nib, &b.scales);
                let dl = d * sc as f32;
                let ml = dmin * m as f32;
                for l in 0..32 {
                    let e = 64 * c + 32 * nib + l;
                    let lo = (b.qs[32 * c + l] >> (4 * nib)) & 0xF;
                    let hi = (b.qh[l] >> (e / 32)) & 1;
                    out[e] = dl * (lo | (hi << 4)) as f32 - ml;
                }
            }
        }
    }
}
