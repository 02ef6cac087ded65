//! `IQ3_XXS` (GGUF type 18) and `IQ3_S` (21): indices into a 4-value lattice grid with one sign
//! per value (ggml-common.h `block_iq3_xxs`, `block_iq3_s`; grids in [`super::iq_grid`]).
//! Decoded in gguf-py 0.19.0's f32 order, `(db * grid) * sign`:
//!
//! - IQ3_XXS: 64 grid-index bytes (4 values each), then per 32 values one u32: scale in bits
//!   28..32 (`db = d * (0.5 + s) * 0.5`) and 4 seven-bit sign indices into `ksigns`.
//! - IQ3_S: 64 grid-index bytes plus a ninth bit from `qh` (bit `t % 8` of byte `t / 8`), one
//!   sign bit per value (32 bytes), one 4-bit scale per 32 values (`db = d * (1 + 2 s)`).

use super::iq_grid::{grid, ksigns, sign};
use super::iq_grids;
use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

const QK_K: usize = 256;

/// ggml `block_iq3_xxs`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq3Xxs {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// 64 grid indices, then 8 u32 of scale and sign indices.
    pub qs: [u8; 3 * QK_K / 8],
}
const _: () = assert!(std::mem::size_of::<BlockIq3Xxs>() == 2 + 3 * QK_K / 8);

/// ggml `block_iq3_s`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq3S {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Low 8 bits of the grid indices.
    pub qs: [u8; QK_K / 4],
    /// Ninth bits of the grid indices.
    pub qh: [u8; QK_K / 32],
    /// One sign bit per value.
    pub signs: [u8; QK_K / 8],
    /// 4-bit scales, two a byte.
    pub scales: [u8; QK_K / 64],
}
const _: () =
    assert!(std::mem::size_of::<BlockIq3S>() == 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64);

/// The IQ3_XXS format.
pub struct Iq3Xxs;

impl BlockFormat for Iq3Xxs {
    type Block = BlockIq3Xxs;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "IQ3_XXS";
    fn decode_block(b: &BlockIq3Xxs, out: &mut [f32]) {
        let g = grid(&iq_grids::IQ3_XXS);
        let d = f16_le(b.d);
        let (idx, ss) = b.qs.split_at(QK_K / 4);
        for ib in 0..QK_K / 32 {
            let aux =
                u32::from_le_bytes([ss[4 * ib], ss[4 * ib + 1], ss[4 * ib + 2], ss[4 * ib + 3]]);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for l in 0..4 {
                let s = ksigns(aux >> (7 * l));
                for j in 0..8 {
                    let e = ib * 32 + l * 8 + j;
                    out[e] = db * g.row(idx[e / 4] as usize)[e % 4] * sign(s, j);
                }
            }
        }
    }
}

/// The IQ3_S format.
pub struct Iq3S;

impl BlockFormat for Iq3S {
    type Block = BlockIq3S;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "IQ3_S";
    fn decode_block(b: &BlockIq3S, out: &mut [f32]) {
        let g = grid(&iq_grids::IQ3_S);
        let d = f16_le(b.d);
        for (e, o) in out.iter_mut().enumerate().take(QK_K) {
            let t = e / 4;
            let idx = b.qs[t] as usize | (((b.qh[t / 8] >> (t % 8)) & 1) as usize) << 8;
            let ib = e / 32;
            let s = (b.scales[ib / 2] >> (4 * (ib % 2))) & 0xF;
            let db = d * (1 + 2 * s as u32) as f32;
            *o = db * g.row(idx)[e % 4] * sign(b.signs[e / 8], e % 8);
        }
    }
}
