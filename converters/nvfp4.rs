//! `NVFP4` as GGUF type 40 stores it: 64 values in 4 sub-blocks of 16, `u8 d[4]` (one unsigned
//! E4M3 scale per sub-block), `u8 qs[32]`; sub-block s owns `qs[8s..8s+8]`, element j of it is
//! the low nibble of `qs[8s+j]` and element j+8 the high nibble. ggml halves the UE4M3 scale and
//! doubles the E2M1 table (`kvalues_mxfp4`), and treats scale bytes 0x00 and 0x7F as zero.
//! The per-tensor f32 scale is a separate tensor in GGUF and is not applied here (gguf-py
//! 0.19.0's `NVFP4.dequantize_blocks` does not apply it either).
//!
//! This is not the ModelOpt safetensors byte layout: see `nvfp4_modelopt`.

use super::BlockFormat;
use super::mxfp4::KVALUES_X2;
use bytemuck::{Pod, Zeroable};

/// ggml `block_nvfp4`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockNvfp4 {
    /// Scale (f16 bits).
    pub d: [u8; 4],
    /// Quants.
    pub qs: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockNvfp4>() == 36);

/// Unsigned E4M3 (bias 7, bit 7 ignored) times 0.5, with 0x00 and 0x7F decoding to 0,
/// in gguf-py's float32 operation order.
#[inline]
pub fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = ((x >> 3) & 0xF) as i32;
    let man = (x & 7) as f32;
    let raw = if exp == 0 {
        man * f32::powi(2.0, -9)
    } else {
        (1.0 + man / 8.0) * f32::powi(2.0, exp - 7)
    };
    raw * 0.5
}

/// The GGUF NVFP4 block format.
pub struct Nvfp4Gguf;

impl BlockFormat for Nvfp4Gguf {
    type Block = BlockNvfp4;
    const BLOCK_ELEMS: usize = 64;
    const NAME: &'static str = "NVFP4";
    fn decode_block(b: &BlockNvfp4, out: &mut [f32]) {
        for s in 0..4 {
            let d = ue4m3_to_f32_half(b.d[s]);
            for j in 0..8 {
                let q = b.qs[8 * s + j];
                out[16 * s + j] = d * KVALUES_X2[(q & 0xF) as usize] as f32;
                out[16 * s + j + 8] = d * KVALUES_X2[(q >> 4) as usize] as f32;
            }
        }
    }
}
