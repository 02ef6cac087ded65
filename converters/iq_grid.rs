//! What the IQ1, IQ2 and IQ3 codecs share: their lattice grids, unpacked once from
//! [`super::iq_grids`], and the sign table of the IQ2/IQ3 types.
//!
//! Facts (ggml-common.h; gguf-py 0.19.0 `gguf.quants`): each grid row is `cols` values; a grid
//! stored as hexadecimal digits (two per byte, high digit first) holds per byte
//! `8 / bits` indices (`bits = ceil(log2(map.len()))`), low bits first, every `8 / (8 / bits)`
//! bits, each index selecting `map[index]`. `ksigns_iq2xs[i]` is `i` with bit 7 set when `i`
//! has an odd number of set bits (so every sign byte negates an even number of values).

use super::iq_grids::GridData;
use std::sync::OnceLock;

/// A grid unpacked to f32 rows.
pub struct Grid {
    cols: usize,
    values: Vec<f32>,
}

impl Grid {
    /// Row `i`.
    #[inline]
    pub fn row(&self, i: usize) -> &[f32] {
        &self.values[i * self.cols..(i + 1) * self.cols]
    }
    /// Every value, row after row.
    pub fn values(&self) -> &[f32] {
        &self.values
    }
}

fn hex_digit(c: u8) -> u8 {
    (if c > 0x40 { c + 9 } else { c }) & 0x0F
}

/// Unpack `g` (its hexadecimal indices into its value map).
pub fn unpack(g: &GridData) -> Grid {
    let bits = usize::BITS - (g.map.len() - 1).leading_zeros();
    let per_byte = 8 / bits;
    let step = 8 / per_byte;
    let mut values = Vec::with_capacity(g.rows * g.cols);
    for pair in g.hex.chunks_exact(2) {
        let byte = hex_digit(pair[0]) << 4 | hex_digit(pair[1]);
        for k in 0..per_byte {
            let idx = (byte >> (k * step)) & ((1u8 << bits) - 1);
            values.push(g.map[idx as usize]);
        }
    }
    assert_eq!(values.len(), g.rows * g.cols, "grid size");
    Grid {
        cols: g.cols,
        values,
    }
}

/// The grid of `g`, unpacked on first use.
pub fn grid(g: &'static GridData) -> &'static Grid {
    static GRIDS: [OnceLock<Grid>; 6] = [const { OnceLock::new() }; 6];
    use super::iq_grids as d;
    let slot = [
        &d::IQ2_XXS,
        &d::IQ2_XS,
        &d::IQ2_S,
        &d::IQ3_XXS,
        &d::IQ3_S,
        &d::IQ1_S,
    ]
    .iter()
    .position(|x| std::ptr::eq(*x, g))
    .expect("a grid of iq_grids");
    GRIDS[slot].get_or_init(|| unpack(g))
}

/// `ksigns_iq2xs[i]`: `i` with the parity of its bits in bit 7.
#[inline]
pub fn ksigns(i: u32) -> u8 {
    let i = (i & 0x7F) as u8;
    i | (((i.count_ones() & 1) as u8) << 7)
}

/// `+1.0` or `-1.0` for bit `j` of sign byte `s`.
#[inline]
pub fn sign(s: u8, j: usize) -> f32 {
    if (s >> j) & 1 == 0 { 1.0 } else { -1.0 }
}
