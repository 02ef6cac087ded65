//! `affine`: affine integer groups (`converters/affine.rs`, `w = s * q + b` per group) for the
//! affine arms. Parts `codes` (row-major `[n, kp]` codes: 4-bit pairs, value `2i` in the low
//! nibble, or bytes) and `scales` (per group of each row, the half `s` then the half `b`:
//! `[n, kp / group]` pairs of 4 bytes); K zero-padded to [`K_ALIGN`] with zero codes, scales and
//! offsets, so padded values decode to +0. Scalars `bits` (4 or 8) and `group` (32).
//!
//! GGUF Q4_0, Q4_1 and Q8_0 sources are carried: every weight decodes as gguf-py decodes the
//! source (`AffineGroups::from_ggml`). Any other source is quantized with ggml's Q8_0 reference
//! rule (`converters/q8_0.rs`) and carried from that.

use super::{Encoded, round_up};
use crate::GgmlType;
use crate::converters::affine::{AffineError, AffineGroups, GGML_GROUP, code_at};
use crate::converters::f16;

/// K alignment: a multiple of every group this layout stores and of the kernels' 128-value
/// chunks.
pub const K_ALIGN: usize = 128;

/// Bytes per group in the `scales` part (half `s`, half `b`).
pub const PAIR_BYTES: usize = 4;

/// Bits, group and the padded K of an `affine` blob are valid: 4 or 8 bits, a group of
/// [`GGML_GROUP`] (the only one stored so far) dividing `kp`.
pub fn valid(bits: u32, group: usize, kp: usize) -> bool {
    matches!(bits, 4 | 8) && group == GGML_GROUP && kp.is_multiple_of(K_ALIGN)
}

/// Bytes of the `codes` part of `[n, kp]` at `bits`.
pub fn codes_bytes(n: u64, kp: u64, bits: u32) -> Option<u64> {
    n.checked_mul(kp)?
        .checked_mul(u64::from(bits))
        .map(|b| b / 8)
}

/// Bytes of one row of `kp` values at `bits` in groups of `group`: its codes and scale pairs.
pub fn row_bytes(kp: usize, bits: u32, group: usize) -> usize {
    kp * bits as usize / 8 + kp / group * PAIR_BYTES
}

/// Bytes of the `scales` part of `[n, kp]` in groups of `group`.
pub fn scales_bytes(n: u64, kp: u64, group: u64) -> Option<u64> {
    n.checked_mul(kp.checked_div(group)?)?
        .checked_mul(PAIR_BYTES as u64)
}

/// The parts of `a` (`[n, k]`), K padded to `kp`.
pub fn from_groups(a: &AffineGroups) -> Encoded {
    let (n, k, bits, group) = (a.rows, a.cols, a.bits as usize, a.group);
    let kp = round_up(k, K_ALIGN);
    let (row_in, row_out) = (k * bits / 8, kp * bits / 8);
    let mut codes = vec![0u8; n * row_out];
    for r in 0..n {
        codes[r * row_out..r * row_out + row_in]
            .copy_from_slice(&a.codes[r * row_in..(r + 1) * row_in]);
    }
    let (g_in, g_out) = (k / group, kp / group);
    let mut scales = vec![0u8; n * g_out * PAIR_BYTES];
    for r in 0..n {
        for g in 0..g_in {
            let at = (r * g_out + g) * PAIR_BYTES;
            scales[at..at + 2].copy_from_slice(&a.scales[r * g_in + g].to_le_bytes());
            scales[at + 2..at + 4].copy_from_slice(&a.offsets[r * g_in + g].to_le_bytes());
        }
    }
    Encoded {
        parts: vec![("codes", codes), ("scales", scales)],
        padded: [n, kp],
        scalars: vec![("bits", bits as f32), ("group", group as f32)],
    }
}

/// Carry `[n, k]` of GGUF type `ty` (Q4_0, Q4_1 or Q8_0) stored at `raw`.
pub fn carry(ty: GgmlType, raw: &[u8], n: usize, k: usize) -> Result<Encoded, AffineError> {
    Ok(from_groups(&AffineGroups::from_ggml(ty, raw, n, k)?))
}

/// Encode f32 `[n, k]` (any source this layout does not carry): ggml's Q8_0 rule per group of
/// 32 (K zero-padded to a group first), then carried; a weight whose group's scale or offset
/// would not be a finite half (|w| near 65504 and above, NaN) is refused by row and group.
pub fn encode(x: &[f32], n: usize, k: usize) -> Result<Encoded, AffineError> {
    let k32 = round_up(k, GGML_GROUP);
    let raw = crate::converters::encode_to_vec::<crate::converters::q8_0::Q8_0>(&super::pad(
        x, n, k, n, k32,
    ));
    // Values past k (a partial group's padding) decode to zero.
    carry(GgmlType::Q8_0, &raw, n, k32)
}

/// Decode to f32 `[n, k]`: `s * q + b`, one product then one sum, as the codec decodes.
pub fn decode(
    codes: &[u8],
    scales: &[u8],
    (bits, group): (u32, usize),
    [n, k]: [usize; 2],
    kp: usize,
) -> Vec<f32> {
    let (row, g_row) = (kp * bits as usize / 8, kp / group);
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        let codes = &codes[r * row..(r + 1) * row];
        for c in 0..k {
            let at = (r * g_row + c / group) * PAIR_BYTES;
            let s = f16::to_f32(u16::from_le_bytes([scales[at], scales[at + 1]]));
            let b = f16::to_f32(u16::from_le_bytes([scales[at + 2], scales[at + 3]]));
            out.push(s * code_at(codes, c, bits) as f32 + b);
        }
    }
    out
}
