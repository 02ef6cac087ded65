//! `MXFP4` (GGUF type 39): 32 values, `u8 e` (E8M0 shared exponent), 16 bytes of E2M1 nibbles;
//! element j is the low nibble of `qs[j]`, element j+16 the high nibble. ggml stores the E2M1
//! table doubled (`kvalues_mxfp4` = 0,1,2,3,4,6,8,12 and negatives) and halves the scale:
//! `y = e8m0_half(e) * kvalues[q]`, `e8m0_half(e) = 2^(e-128)` (for e < 2 built as the f32 bits
//! `0x00200000 << e`, as ggml's `ggml_e8m0_to_fp32_half`). OCP MX spec v1.0.

use super::BlockFormat;
use bytemuck::{Pod, Zeroable};

/// E2M1 values times two, indexed by the 4-bit code (bit 3 = sign).
pub const KVALUES_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml `block_mxfp4`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockMxfp4 {
    /// Shared exponent (E8M0).
    pub e: u8,
    /// Quants.
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

/// Half of the E8M0 scale, as ggml computes it.
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e - 1) as u32) << 23
    };
    f32::from_bits(bits)
}

/// The MXFP4 format.
pub struct Mxfp4;

impl BlockFormat for Mxfp4 {
    type Block = BlockMxfp4;
    const BLOCK_ELEMS: usize = 32;
    const NAME: &'static str = "MXFP4";
    fn decode_block(b: &BlockMxfp4, out: &mut [f32]) {
        let d = e8m0_to_f32_half(b.e);
        for j in 0..16 {
            out[j] = d * KVALUES_X2[(b.qs[j] & 0xF) as usize] as f32;
            out[j + 16] = d * KVALUES_X2[(b.qs[j] >> 4) as usize] as f32;
        }
    }
}
