//! `nvfp4`: the engine's primary weights. ModelOpt NVFP4 bytes with K zero-padded to a multiple
//! of [`K_ALIGN`]: part `codes` `[n, kp/2]` (element 2i low nibble), part `scales` E4M3
//! `[n, kp/16]`, scalar `global_scale` (`weight_scale_2`). Padding codes and scales are 0.

use crate::converters::layouts::{Encoded, pad, pad_rows_bytes, round_up};
use crate::converters::nvfp4_modelopt;

/// K is padded to a multiple of 64 (32-byte code rows, 4-byte scale rows).
pub const K_ALIGN: usize = 64;

/// Encode an f32 `[n, k]` weight.
pub fn encode(x: &[f32], n: usize, k: usize) -> Encoded {
    let kp = round_up(k, K_ALIGN);
    let w = nvfp4_modelopt::encode(&pad(x, n, k, n, kp), n, kp);
    Encoded {
        parts: vec![("codes", w.codes), ("scales", w.scales)],
        padded: [n, kp],
        scalars: vec![("global_scale", w.global_scale)],
    }
}

/// Carry ModelOpt bytes unchanged (only padded): `codes [n, k/2]`, `scales [n, k/16]`.
pub fn from_modelopt(
    codes: &[u8],
    scales: &[u8],
    global_scale: f32,
    n: usize,
    k: usize,
) -> Encoded {
    let kp = round_up(k, K_ALIGN);
    Encoded {
        parts: vec![
            ("codes", pad_rows_bytes(codes, n, k / 2, kp / 2, n)),
            ("scales", pad_rows_bytes(scales, n, k / 16, kp / 16, n)),
        ],
        padded: [n, kp],
        scalars: vec![("global_scale", global_scale)],
    }
}

/// Decode to the padded `[n, kp]` f32 matrix.
pub fn decode_padded(
    codes: &[u8],
    scales: &[u8],
    global_scale: f32,
    n: usize,
    kp: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; n * kp];
    nvfp4_modelopt::decode(codes, scales, global_scale, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_zero_and_carry_equals_encode() {
        let (n, k) = (3, 80); // pads to 128
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i * 31 % 17) as f32 - 8.0) * 0.1)
            .collect();
        let e = encode(&x, n, k);
        assert_eq!(e.padded, [3, 128]);
        let codes = &e.parts[0].1;
        assert!(codes[40..64].iter().all(|&b| b == 0));
        // Encoding the unpadded weight (k = 80 is a multiple of 16) then padding the bytes gives the same.
        let w = nvfp4_modelopt::encode(&x, n, k);
        assert_eq!(from_modelopt(&w.codes, &w.scales, w.global_scale, n, k), e);
    }
}
