//! `IQ4_NL` (GGUF type 20) and `IQ4_XS` (23): 4-bit indices into a fixed non-linear table of 16
//! values (ggml-common.h `kvalues_iq4nl`, `block_iq4_nl`, `block_iq4_xs`). Decoded as gguf-py
//! 0.19.0's `dequantize` does, in f32: `IQ4_NL` `d * kv[q]`; `IQ4_XS` per 32 values
//! `dl = d * (ls - 32)` (6-bit `ls`: 4 low bits in `scales_l`, 2 high in `scales_h`), then
//! `dl * kv[q]`. In each 32 values, the first 16 are the low nibbles of 16 bytes, the next 16
//! the high nibbles.

use super::{BlockFormat, f16_le};
use bytemuck::{Pod, Zeroable};

/// The non-linear 4-bit values.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
const QK4_NL: usize = 32;
const QK_K: usize = 256;

/// ggml `block_iq4_nl`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq4Nl {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Two indices a byte.
    pub qs: [u8; QK4_NL / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 2 + QK4_NL / 2);

/// ggml `block_iq4_xs`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq4Xs {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// The 2 high bits of each sub-block scale (u16, little-endian).
    pub scales_h: [u8; 2],
    /// The 4 low bits of each sub-block scale, two a byte.
    pub scales_l: [u8; QK_K / 64],
    /// Two indices a byte.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 4 + QK_K / 64 + QK_K / 2);

fn nibbles(qs: &[u8], scale: f32, out: &mut [f32]) {
    for j in 0..16 {
        out[j] = scale * KVALUES[(qs[j] & 0xF) as usize] as f32;
        out[j + 16] = scale * KVALUES[(qs[j] >> 4) as usize] as f32;
    }
}

/// The IQ4_NL format.
pub struct Iq4Nl;

impl BlockFormat for Iq4Nl {
    type Block = BlockIq4Nl;
    const BLOCK_ELEMS: usize = QK4_NL;
    const NAME: &'static str = "IQ4_NL";
    fn decode_block(b: &BlockIq4Nl, out: &mut [f32]) {
        nibbles(&b.qs, f16_le(b.d), out);
    }
}

/// The IQ4_XS format.
pub struct Iq4Xs;

impl BlockFormat for Iq4Xs {
    type Block = BlockIq4Xs;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "IQ4_XS";
    fn decode_block(b: &BlockIq4Xs, out: &mut [f32]) {
        let d = f16_le(b.d);
        let sh = u16::from_le_bytes(b.scales_h);
        for ib in 0..QK_K / 32 {
            let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
            let hi = ((sh >> (2 * ib)) & 3) as u8;
            let dl = d * ((lo | hi << 4) as i32 - 32) as f32;
            nibbles(
                &b.qs[ib * 16..ib * 16 + 16],
                dl,
                &mut out[ib * 32..ib * 32 + 32],
            );
        }
    }
}
