//! `w8a8`: per-row FP8 E4M3 weights with f32 row scales, the `set_w8a8_decode_weights` overlay
//! ([inter, hidden] gate/up, [hidden, inter] down). K zero-padded to a multiple of 128.
//! Parts: `codes` `[n, kp]`, `scales` f32 `[n]`. See `converters/fp8_row.rs`.

use crate::converters::fp8_row;
use crate::converters::layouts::{
    Encoded, crop, f32_bytes, f32_from, pad, pad_rows_bytes, round_up,
};

/// K alignment.
pub const K_ALIGN: usize = 128;

/// Encode f32 `[n, k]`.
pub fn encode(x: &[f32], n: usize, k: usize) -> Encoded {
    let kp = round_up(k, K_ALIGN);
    let (codes, scales) = fp8_row::encode(&pad(x, n, k, n, kp), n, kp);
    Encoded {
        parts: vec![("codes", codes), ("scales", f32_bytes(&scales))],
        padded: [n, kp],
        scalars: vec![],
    }
}

/// Carry E4M3 codes `[n, k]` and their f32 row scales `[n]` as they are (compressed-tensors'
/// FP8 channel and tensor strategies, ModelOpt FP8): each row zero-padded to the k alignment,
/// nothing re-quantized, so the pack decodes to exactly what the source does.
pub fn carry(codes: &[u8], scales: &[f32], n: usize, k: usize) -> Encoded {
    assert_eq!(codes.len(), n * k);
    assert_eq!(scales.len(), n);
    let kp = round_up(k, K_ALIGN);
    Encoded {
        parts: vec![
            ("codes", pad_rows_bytes(codes, n, k, kp, n)),
            ("scales", f32_bytes(scales)),
        ],
        padded: [n, kp],
        scalars: vec![],
    }
}

/// Decode to f32 `[n, k]`.
pub fn decode(codes: &[u8], scales: &[u8], n: usize, k: usize, kp: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * kp];
    fp8_row::decode(codes, &f32_from(scales), kp, &mut out);
    crop(&out, kp, n, k)
}
