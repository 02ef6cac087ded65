//! FP8 scalars: E4M3 "fn" (`F8_E4M3` in safetensors: bias 7, no infinities, `S.1111.111` is NaN,
//! max 448) and E5M2 (`F8_E5M2`: bias 15, IEEE-like, the top byte of an IEEE half).
//! Source of the encodings: OCP 8-bit floating point spec v1.0 / arXiv 2209.05433.

/// E4M3FN byte to f32 (exact; 0x7F and 0xFF are NaN): a lookup in [`E4M3_TABLE`].
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    E4M3_TABLE[b as usize]
}

/// Every E4M3FN byte's value. A table instead of the arithmetic: the per-element `powi` was the
/// largest cost of decoding an FP8 blob (perf of the `pack` fuzz target, 2026-12-02).
pub static E4M3_TABLE: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_exact(i as u8);
        i += 1;
    }
    t
};

/// One E4M3FN value from its fields: normal `(1 + man/8) * 2^(exp-7)` written as the f32 with
/// those exponent and mantissa bits, subnormal `man * 2^-9`; both exact.
const fn e4m3_exact(b: u8) -> f32 {
    let exp = ((b >> 3) & 0xF) as u32;
    let man = (b & 7) as u32;
    if exp == 15 && man == 7 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        man as f32 * f32::from_bits((127 - 9) << 23)
    } else {
        f32::from_bits(((exp + 127 - 7) << 23) | (man << 20))
    };
    if b & 0x80 != 0 { -mag } else { mag }
}

/// f32 to E4M3FN: round to nearest even, saturating to ±448 (finite inputs never become NaN),
/// NaN to 0x7F with its sign.
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 31) as u8) << 7;
    if x.is_nan() {
        return sign | 0x7F;
    }
    let a = x.abs();
    if a >= 448.0 {
        return sign | 0x7E;
    }
    let e = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
    if e < -6 {
        // Subnormal range of E4M3: multiples of 2^-9. a * 512 is exact (power of two).
        let q = (a * 512.0).round_ties_even() as u8; // 0..=8; 8 is the smallest normal (0x08)
        return sign | q;
    }
    let m = a.to_bits() & 0x7F_FFFF;
    let mut mant = m >> 20;
    let rem = m & 0xF_FFFF;
    if rem > 0x8_0000 || (rem == 0x8_0000 && mant & 1 == 1) {
        mant += 1;
    }
    let mut exp = (e + 7) as u32;
    if mant == 8 {
        mant = 0;
        exp += 1;
    }
    if exp > 15 || (exp == 15 && mant == 7) {
        return sign | 0x7E;
    }
    sign | ((exp << 3) as u8) | mant as u8
}

/// E5M2 byte to f32 (exact): the byte is the high half of an IEEE binary16.
#[inline]
pub fn e5m2_to_f32(b: u8) -> f32 {
    super::f16::to_f32((b as u16) << 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table equals the spec's arithmetic bit for bit (NaNs as NaN).
    #[test]
    fn table_matches_the_formula() {
        for b in 0u8..=255 {
            let exp = ((b >> 3) & 0xF) as i32;
            let man = (b & 7) as f32;
            let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
            let want = if exp == 15 && b & 7 == 7 {
                f32::NAN
            } else if exp == 0 {
                sign * man * f32::powi(2.0, -9)
            } else {
                sign * (1.0 + man / 8.0) * f32::powi(2.0, exp - 7)
            };
            let got = e4m3_to_f32(b);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{b:#04x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn every_finite_e4m3_round_trips() {
        for b in 0u8..=255 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                assert!(b & 0x7F == 0x7F);
                continue;
            }
            // -0.0 encodes back to 0x80, +0.0 to 0x00.
            assert_eq!(f32_to_e4m3(v), b, "byte {b:#04x} value {v}");
        }
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), f32::powi(2.0, -9));
    }

    #[test]
    fn rounding_is_nearest_even_and_saturates() {
        // Halfway between 1.0 (0x38) and 1.125 (0x39): ties to even -> 1.0.
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // Halfway between 1.125 (odd) and 1.25: up.
        assert_eq!(f32_to_e4m3(1.1875), 0x3A);
        // Halfway between subnormals 1*2^-9 and 2*2^-9: to even (2).
        assert_eq!(f32_to_e4m3(1.5 * f32::powi(2.0, -9)), 0x02);
        assert_eq!(f32_to_e4m3(1000.0), 0x7E);
        assert_eq!(f32_to_e4m3(-1e9), 0xFE);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
        // 464 is halfway between 448 and the (nonexistent) 480: saturates, no NaN.
        assert_eq!(f32_to_e4m3(464.0), 0x7E);
    }

    #[test]
    fn e5m2_matches_half_top_byte() {
        assert_eq!(e5m2_to_f32(0x3C), 1.0);
        assert_eq!(e5m2_to_f32(0x7C), f32::INFINITY);
        assert_eq!(e5m2_to_f32(0x01), f32::powi(2.0, -16));
        assert!(e5m2_to_f32(0x7F).is_nan());
    }
}
