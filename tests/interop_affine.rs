//! The affine integer groups codec (`converters::affine`) against gguf-py 0.19.0: GGUF Q4_0,
//! Q4_1 and Q8_0 rows carried as groups decode bit for bit as `gguf.quants.dequantize` decodes
//! the source bytes (but for the sign of a zero weight, see below), on random blocks whose
//! scales span the half range the codec accepts (subnormal to the largest before the offset
//! overflows), every code and sign.

mod common;

use common::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::affine::{AffineError, AffineGroups};

/// A random finite half as the block's `d` (or `m`): a random exponent across the half range
/// up to `max`, random sign and significand; some blocks zero.
fn random_scale(rng: &mut Rng, max: f32) -> [u8; 2] {
    let v = if rng.next_u64().is_multiple_of(17) {
        0.0
    } else {
        let e = (rng.next_u64() % 40) as i32 - 24; // 2^-24 (the least subnormal) .. 2^15
        let m = 1.0 + rng.uniform();
        let s = if rng.next_u64().is_multiple_of(2) {
            1.0
        } else {
            -1.0
        };
        (s * m * 2f32.powi(e)).clamp(-max, max)
    };
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

#[test]
fn q4_0_q4_1_q8_0_carried_as_groups_decode_as_gguf_py_bit_for_bit() {
    let mut rng = Rng::fresh("affine");
    let dir = tempfile::tempdir().unwrap();
    let (rows, cols) = (7usize, 512usize);
    for (ty, bytes, max_d) in [
        (GgmlType::Q4_0, 18usize, 8188.0f32),
        (GgmlType::Q4_1, 20, 65504.0),
        (GgmlType::Q8_0, 34, 511.75),
    ] {
        let mut raw = rng.bytes(rows * cols / 32 * bytes);
        for b in raw.chunks_exact_mut(bytes) {
            b[..2].copy_from_slice(&random_scale(&mut rng, max_d));
            if ty == GgmlType::Q4_1 {
                b[2..4].copy_from_slice(&random_scale(&mut rng, 65504.0));
            }
        }
        let theirs = gguf_py_dequant(ty, &raw, dir.path());
        let a = AffineGroups::from_ggml(ty, &raw, rows, cols).unwrap();
        assert_eq!(a.codes.len(), rows * cols * a.bits as usize / 8);
        // Bit for bit, but for the sign of a zero weight: `s * q + b` sums to +0 where
        // `d * (q - z)` keeps d's sign (Q4_0 and Q8_0 only; formats.md).
        let ours = a.decode();
        let mut signed_zeros = 0;
        for (i, (o, t)) in ours.iter().zip(&theirs).enumerate() {
            if *o == 0.0 && *t == 0.0 && o.to_bits() != t.to_bits() {
                assert_ne!(ty, GgmlType::Q4_1, "element {i}");
                assert_eq!(o.to_bits(), 0, "element {i}: the codec's zero is +0");
                signed_zeros += 1;
            }
        }
        let theirs_unsigned: Vec<f32> = theirs
            .iter()
            .map(|&t| if t == 0.0 { 0.0 } else { t })
            .collect();
        assert_bits_eq(ty.name(), &ours, &theirs_unsigned);
        // Every group of this many random blocks holds some code at its zero point.
        assert!(ty == GgmlType::Q4_1 || signed_zeros > 0, "{ty}");
    }
}

#[test]
fn a_q8_0_scale_whose_offset_overflows_a_half_is_refused() {
    let mut raw = vec![0u8; 34];
    raw[..2].copy_from_slice(&half::f16::from_f32(600.0).to_bits().to_le_bytes());
    assert_eq!(
        AffineGroups::from_ggml(GgmlType::Q8_0, &raw, 1, 32).unwrap_err(),
        AffineError::OffsetOverflow {
            row: 0,
            group: 0,
            zero: 128
        }
    );
}
