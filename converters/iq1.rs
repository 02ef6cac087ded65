//! `IQ1_S` (GGUF type 19) and `IQ1_M` (29): indices into an 8-value ternary grid (-1, 0, 1) with
//! a shift of +-1/8 (ggml-common.h `block_iq1_s`, `block_iq1_m`, `IQ1S_DELTA`; grid in
//! [`super::iq_grid`]). Decoded in gguf-py 0.19.0's f32 order: `dl * (grid + delta)`.
//!
//! - IQ1_S: per 32 values one u16 of `qh`: 3 high index bits for each of its 4 grid rows (bits
//!   `3l..3l+3`), the scale in bits 12..15 (`dl = d * (2 s + 1)`), the delta's sign in bit 15.
//! - IQ1_M: no `d` field: the f16 scale is the top 4 bits of each of the 4 u16 `scales` (first
//!   word lowest); each u16 also holds four 3-bit scales (`dl = d * (2 s + 1)` per 16 values).
//!   Each `qh` nibble gives its grid row 3 high index bits and the delta's sign (bit 3).

use super::iq_grid::grid;
use super::iq_grids;
use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

const QK_K: usize = 256;
/// `IQ1S_DELTA`.
pub const DELTA: f32 = 0.125;

/// ggml `block_iq1_s`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq1S {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Low 8 bits of the grid indices.
    pub qs: [u8; QK_K / 8],
    /// Per 32 values one u16: high index bits, scale, delta sign.
    pub qh: [u8; QK_K / 32 * 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq1S>() == 2 + QK_K / 8 + QK_K / 16);

/// ggml `block_iq1_m`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq1M {
    /// Low 8 bits of the grid indices.
    pub qs: [u8; QK_K / 8],
    /// Per grid row a nibble: 3 high index bits and the delta's sign.
    pub qh: [u8; QK_K / 16],
    /// Four u16: 3-bit scales, and the f16 scale in their top nibbles.
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq1M>() == QK_K / 8 + QK_K / 16 + QK_K / 32);

/// The IQ1_S format.
pub struct Iq1S;

impl BlockFormat for Iq1S {
    type Block = BlockIq1S;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "IQ1_S";
    fn decode_block(b: &BlockIq1S, out: &mut [f32]) {
        let g = grid(&iq_grids::IQ1_S);
        let d = f16_le(b.d);
        for ib in 0..QK_K / 32 {
            let qh = u16::from_le_bytes([b.qh[2 * ib], b.qh[2 * ib + 1]]);
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 == 0 { DELTA } else { -DELTA };
            for l in 0..4 {
                let t = ib * 4 + l;
                let idx = b.qs[t] as usize | (((qh >> (3 * l)) & 7) as usize) << 8;
                for (j, &v) in g.row(idx).iter().enumerate() {
                    out[t * 8 + j] = dl * (v + delta);
                }
            }
        }
    }
}

/// The IQ1_M format.
pub struct Iq1M;

impl BlockFormat for Iq1M {
    type Block = BlockIq1M;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "IQ1_M";
    fn decode_block(b: &BlockIq1M, out: &mut [f32]) {
        let g = grid(&iq_grids::IQ1_S);
        let sc: [u16; 4] =
            std::array::from_fn(|i| u16::from_le_bytes([b.scales[2 * i], b.scales[2 * i + 1]]));
        let bits = (sc[0] & 0xF000) >> 12
            | (sc[1] & 0xF000) >> 8
            | (sc[2] & 0xF000) >> 4
            | (sc[3] & 0xF000);
        let d = f16_le(bits.to_le_bytes());
        for t in 0..QK_K / 8 {
            let nib = (b.qh[t / 2] >> (4 * (t % 2))) & 0xF;
            let idx = b.qs[t] as usize | ((nib & 7) as usize) << 8;
            let delta = if nib & 8 == 0 { DELTA } else { -DELTA };
            // One 3-bit scale per 16 values: four to each u16.
            let u = t / 2;
            let s = (sc[u / 4] >> (3 * (u % 4))) & 7;
            let dl = d * (2 * s + 1) as f32;
            for (j, &v) in g.row(idx).iter().enumerate() {
                out[t * 8 + j] = dl * (v + delta);
            }
        }
    }
}
