//! `bf16`: BF16 `[n, kp]` row-major, K zero-padded to a multiple of 8 (16-byte rows); single part.
//! Encoding rounds to nearest even (`converters/bf16.rs`); a BF16 source is carried unchanged.

use crate::converters::bf16;
use crate::converters::layouts::{Encoded, crop, pad, pad_rows_bytes, round_up};

/// K alignment.
pub const K_ALIGN: usize = 8;

/// Encode f32 `[n, k]`.
pub fn encode(x: &[f32], n: usize, k: usize) -> Encoded {
    let kp = round_up(k, K_ALIGN);
    Encoded {
        parts: vec![("", bf16::encode(&pad(x, n, k, n, kp)))],
        padded: [n, kp],
        scalars: vec![],
    }
}

/// Carry BF16 source bytes.
pub fn carry(bytes: &[u8], n: usize, k: usize) -> Encoded {
    let kp = round_up(k, K_ALIGN);
    Encoded {
        parts: vec![("", pad_rows_bytes(bytes, n, 2 * k, 2 * kp, n))],
        padded: [n, kp],
        scalars: vec![],
    }
}

/// Decode to f32 `[n, k]`.
pub fn decode(bytes: &[u8], n: usize, k: usize, kp: usize) -> Vec<f32> {
    let full: Vec<f32> = bytes
        .chunks_exact(2)
        .map(|b| bf16::to_f32(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    crop(&full, kp, n, k)
}
