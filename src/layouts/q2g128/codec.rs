//! `q2g128`: q2g128 blocks (`blocks.rs`) row after row, K zero-padded to a
//! multiple of 128; single part. The `set_q2_weights` overlay.

use crate::converters::layouts::{Encoded, crop, pad, round_up};
use crate::converters::q2g128::Q2g128;
use crate::converters::{decode_blocks, encode_to_vec};

/// K alignment (one group).
pub const K_ALIGN: usize = 128;

/// Encode f32 `[n, k]`.
pub fn encode(x: &[f32], n: usize, k: usize) -> Encoded {
    let kp = round_up(k, K_ALIGN);
    Encoded {
        parts: vec![("", encode_to_vec::<Q2g128>(&pad(x, n, k, n, kp)))],
        padded: [n, kp],
        scalars: vec![],
    }
}

/// Decode to f32 `[n, k]`.
pub fn decode(bytes: &[u8], n: usize, k: usize, kp: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * kp];
    decode_blocks::<Q2g128>(bytes, &mut out);
    crop(&out, kp, n, k)
}
