//! `IQ2_XXS` (GGUF type 16), `IQ2_XS` (17) and `IQ2_S` (22): 2-bit-ish codes as indices into an
//! 8-value lattice grid with 8 signs per row (ggml-common.h `block_iq2_xxs`, `block_iq2_xs`,
//! `block_iq2_s`; grids in [`super::iq_grid`]). Decoded in gguf-py 0.19.0's f32 order:
//! `db = d * (0.5 + s) * 0.25` per 4-bit scale `s`, then `(db * grid) * sign`.
//!
//! - IQ2_XXS: per 32 values two u32: the first's 4 bytes index 4 grid rows, the second holds the
//!   scale (bits 28..32) and 4 seven-bit sign indices into `ksigns` (bits `7l..7l+7`).
//! - IQ2_XS: per 8 values one u16: grid index (9 bits) and a sign index (bits 9..16); one 4-bit
//!   scale per 16 values (low nibble first).
//! - IQ2_S: per 8 values a grid index of `qs` plus 2 high bits from `qh` (bits `2t%8`), signs as
//!   one byte per 8 values; one 4-bit scale per 16 values.

use super::iq_grid::{grid, ksigns, sign};
use super::iq_grids;
use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

const QK_K: usize = 256;

/// ggml `block_iq2_xxs`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq2Xxs {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Per 32 values: two u32 (grid indices; scale and signs).
    pub qs: [u8; QK_K / 8 * 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xxs>() == 2 + QK_K / 4);

/// ggml `block_iq2_xs`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq2Xs {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Per 8 values one u16: grid index and sign index.
    pub qs: [u8; QK_K / 8 * 2],
    /// 4-bit scales, two a byte.
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xs>() == 2 + QK_K / 4 + QK_K / 32);

/// ggml `block_iq2_s`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq2S {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Low 8 bits of the grid indices, then one sign byte per 8 values.
    pub qs: [u8; QK_K / 4],
    /// High 2 bits of the grid indices, four a byte.
    pub qh: [u8; QK_K / 32],
    /// 4-bit scales, two a byte.
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq2S>() == 2 + QK_K / 4 + QK_K / 16);

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// `(db * grid[j]) * sign(j)` for the 8 values of one grid row.
fn row8(db: f32, g: &[f32], signs: u8, out: &mut [f32]) {
    for j in 0..8 {
        out[j] = db * g[j] * sign(signs, j);
    }
}

/// The IQ2_XXS format.
pub struct Iq2Xxs;

impl BlockFormat for Iq2Xxs {
    type Block = BlockIq2Xxs;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "IQ2_XXS";
    fn decode_block(b: &BlockIq2Xxs, out: &mut [f32]) {
        let g = grid(&iq_grids::IQ2_XXS);
        let d = f16_le(b.d);
        for ib in 0..QK_K / 32 {
            let (aux0, aux1) = (u32_at(&b.qs, 2 * ib), u32_at(&b.qs, 2 * ib + 1));
            let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
            for l in 0..4 {
                let idx = (aux0 >> (8 * l)) & 0xFF;
                let at = ib * 32 + l * 8;
                row8(
                    db,
                    g.row(idx as usize),
                    ksigns(aux1 >> (7 * l)),
                    &mut out[at..at + 8],
                );
            }
        }
    }
}

/// The IQ2_XS format.
pub struct Iq2Xs;

impl BlockFormat for Iq2Xs {
    type Block = BlockIq2Xs;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "IQ2_XS";
    fn decode_block(b: &BlockIq2Xs, out: &mut [f32]) {
        let g = grid(&iq_grids::IQ2_XS);
        let d = f16_le(b.d);
        for t in 0..QK_K / 8 {
            let q = u16::from_le_bytes([b.qs[2 * t], b.qs[2 * t + 1]]) as u32;
            let s = (b.scales[t / 4] >> (4 * ((t / 2) % 2))) & 0xF;
            let db = d * (0.5 + s as f32) * 0.25;
            row8(
                db,
                g.row((q & 511) as usize),
                ksigns(q >> 9),
                &mut out[t * 8..t * 8 + 8],
            );
        }
    }
}

/// The IQ2_S format.
pub struct Iq2S;

impl BlockFormat for Iq2S {
    type Block = BlockIq2S;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "IQ2_S";
    fn decode_block(b: &BlockIq2S, out: &mut [f32]) {
        let g = grid(&iq_grids::IQ2_S);
        let d = f16_le(b.d);
        let (qs, signs) = b.qs.split_at(QK_K / 8);
        for t in 0..QK_K / 8 {
            let hi = ((b.qh[t / 4] >> (2 * (t % 4))) & 3) as usize;
            let idx = qs[t] as usize | hi << 8;
            let s = (b.scales[t / 4] >> (4 * ((t / 2) % 2))) & 0xF;
            let db = d * (0.5 + s as f32) * 0.25;
            row8(db, g.row(idx), signs[t], &mut out[t * 8..t * 8 + 8]);
        }
    }
}
