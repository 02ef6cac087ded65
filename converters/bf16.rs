//! bfloat16 (`BF16`, GGUF type 30): the top 16 bits of an f32.
//!
//! Encoding follows ggml's `ggml_compute_fp32_to_bf16` (ggml-impl.h): NaN becomes a quiet NaN
//! with the sign and upper mantissa kept (`(u >> 16) | 64`), everything else rounds to nearest
//! even by adding `0x7fff + lsb` before the shift. Infinity stays infinity.

/// bf16 bits to f32 (exact).
#[inline]
pub fn to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bf16 bits: round to nearest even, NaN made quiet.
#[inline]
pub fn from_f32(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

/// Encode a slice to little-endian BF16 bytes.
pub fn encode(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|&v| from_f32(v).to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even_and_quiets_nan() {
        // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
        assert_eq!(from_f32(1.0 + f32::powi(2.0, -8)), 0x3F80);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd mantissa) and 1+2^-6: goes up.
        assert_eq!(from_f32(1.0 + 3.0 * f32::powi(2.0, -8)), 0x3F82);
        // Just above halfway rounds up.
        assert_eq!(from_f32(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(from_f32(f32::INFINITY), 0x7F80);
        // A signalling NaN whose payload sits only in the low half must stay NaN.
        let snan = f32::from_bits(0x7F80_0001);
        assert!(to_f32(from_f32(snan)).is_nan());
        assert_eq!(from_f32(snan), 0x7FC0);
        // f32 max rounds to infinity, as ggml's does.
        assert_eq!(from_f32(f32::MAX), 0x7F80);
    }
}
