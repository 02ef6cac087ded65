//! IEEE binary16 (`F16`, GGUF type 1): conversions by the `half` crate, round to nearest even,
//! as ggml's `GGML_FP32_TO_FP16` (F16C `vcvtps2ph` with rounding mode 0, or its C fallback).

/// Half bits to f32 (exact).
#[inline]
pub fn to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 to half bits, round to nearest even.
#[inline]
pub fn from_f32(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// Encode a slice to little-endian F16 bytes.
pub fn encode(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|&v| from_f32(v).to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_to_nearest_even_at_the_halfway_point() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
        assert_eq!(super::from_f32(1.0 + f32::powi(2.0, -11)), 0x3C00);
        // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even).
        assert_eq!(super::from_f32(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3C02);
        assert_eq!(super::to_f32(0x3C01), 1.0 + f32::powi(2.0, -10));
    }
}
