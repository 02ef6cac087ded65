//! `fp8`: block-scaled FP8 E4M3, 128x128 blocks with f32 scales (DeepSeek semantics; see
//! `converters/fp8_block.rs`). Each projection's N and K are zero-padded to multiples of 128, so
//! that blocks never straddle a boundary. Gate and up are stored once, as the fused
//! `[2*interp, hiddenp]` weight (`blk.N.ffn_gate_up.fp8`): rows `[0, inter)` are gate, rows
//! `[interp, interp + inter)` are up (interp = inter rounded up to 128), and its scale grid is
//! gate's grid followed by up's; the engine's gate and up are views into it
//! (`set_fp8_gate_up_fused`). Parts: `codes` `[np, kp]` E4M3, `scales` f32 `[np/128, kp/128]`.
//! A block-FP8 source is carried unchanged (codes padded with 0x00, scales as they are).

use crate::converters::fp8_block;
use crate::converters::layouts::{
    Encoded, crop, f32_bytes, f32_from, pad, pad_rows_bytes, round_up,
};

/// N and K alignment of every FP8 part.
pub const ALIGN: usize = 128;

/// Encode f32 `[n, k]`.
pub fn encode(x: &[f32], n: usize, k: usize) -> Encoded {
    let (np, kp) = (round_up(n, ALIGN), round_up(k, ALIGN));
    let (codes, scales) = fp8_block::encode(&pad(x, n, k, np, kp), np, kp);
    Encoded {
        parts: vec![("codes", codes), ("scales", f32_bytes(&scales))],
        padded: [np, kp],
        scalars: vec![],
    }
}

/// Carry block-FP8 source bytes (`codes [n, k]`, `scale_inv [ceil(n/128), ceil(k/128)]`).
pub fn carry(codes: &[u8], scale_inv: &[f32], n: usize, k: usize) -> Encoded {
    let (np, kp) = (round_up(n, ALIGN), round_up(k, ALIGN));
    Encoded {
        parts: vec![
            ("codes", pad_rows_bytes(codes, n, k, kp, np)),
            ("scales", f32_bytes(scale_inv)),
        ],
        padded: [np, kp],
        scalars: vec![],
    }
}

/// Fuse gate and up encodings (each already padded to 128 rows) into gate_up.
pub fn fuse(gate: Encoded, up: Encoded) -> Encoded {
    assert_eq!(gate.padded[1], up.padded[1]);
    let mut parts = Vec::new();
    for ((name, g), (_, u)) in gate.parts.into_iter().zip(up.parts) {
        let mut v = g;
        v.extend_from_slice(&u);
        parts.push((name, v));
    }
    Encoded {
        parts,
        padded: [gate.padded[0] + up.padded[0], gate.padded[1]],
        scalars: vec![],
    }
}

/// Decode to the padded f32 matrix `[np, kp]`.
pub fn decode_padded(codes: &[u8], scales: &[u8], np: usize, kp: usize) -> Vec<f32> {
    let mut out = vec![0f32; np * kp];
    fp8_block::decode(codes, &f32_from(scales), np, kp, &mut out);
    out
}

/// Decode a fused gate_up to f32 `[2*inter, k]` (gate rows then up rows, padding removed).
pub fn decode_fused(codes: &[u8], scales: &[u8], inter: usize, k: usize, kp: usize) -> Vec<f32> {
    let interp = round_up(inter, ALIGN);
    let full = decode_padded(codes, scales, 2 * interp, kp);
    let mut out = crop(&full[..interp * kp], kp, inter, k);
    out.extend(crop(&full[interp * kp..], kp, inter, k));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_equals_encoding_the_concatenation() {
        let (inter, k) = (130, 200);
        let g: Vec<f32> = (0..inter * k).map(|i| (i as f32 * 0.013).sin()).collect();
        let u: Vec<f32> = (0..inter * k)
            .map(|i| (i as f32 * 0.029).cos() * 3.0)
            .collect();
        let f = fuse(encode(&g, inter, k), encode(&u, inter, k));
        assert_eq!(f.padded, [512, 256]);
        // Same as encoding [gate; pad; up; pad] in one go.
        let mut cat = pad(&g, inter, k, 256, 256);
        cat.extend(pad(&u, inter, k, 256, 256));
        let (c, s) = fp8_block::encode(&cat, 512, 256);
        assert_eq!(f.parts[0].1, c);
        assert_eq!(f.parts[1].1, f32_bytes(&s));
        let y = decode_fused(&f.parts[0].1, &f.parts[1].1, inter, k, 256);
        assert_eq!(y.len(), 2 * inter * k);
        assert!((y[inter * k] - u[0]).abs() <= u[0].abs() / 16.0 + 1e-3);
    }
}
