//! Affine integer groups, the codec of the integer layout the issue "carry integer-quantized
//! weights without re-quantizing" asks for: `w = s * q + b` for each group of `group`
//! consecutive values of a row, `q` an unsigned 4- or 8-bit code, the group's scale `s` and
//! offset `b` IEEE halves (formats.md, "Affine integer groups").
//!
//! GGUF Q4_0, Q4_1 and Q8_0 blocks (32 values) become groups of 32 with every weight decoding
//! bit for bit as gguf-py decodes the source (facts: ggml-common.h `block_q4_0`, `block_q4_1`,
//! `block_q8_0`; gguf-py 0.19.0 `quants.py`):
//! - Q4_0 `d * (q - 8)`: `s = d`, `b = -8 d`;
//! - Q4_1 `d * q + m`: `s = d`, `b = m`;
//! - Q8_0 `d * q` (q signed): code `q + 128`, `s = d`, `b = -128 d`.
//!
//! `s * q` is exact in f32 (an 11-bit significand times an integer below 2^8), so `s * q + b`
//! rounds once, as `d * q + m` does; for Q4_0 and Q8_0 both terms are multiples of `d` whose sum
//! `d * (q - z)` is itself exact, so there is no rounding at all, as in the source. One
//! difference: where `q` is the zero point, `s * q + b` is +0 and the source's `d * 0` is -0 for
//! a negative `d` (equal as numbers; a product or a sum with it is the same but for a zero's
//! sign). `-8 d` and `-128 d` are exact halves unless they overflow (|d| above 8188 or 511.75):
//! such a block, or one whose scale or minimum is not finite, is refused, naming row and group.

use super::f16;
use crate::GgmlType;

/// Values per group of the GGUF formats this codec carries.
pub const GGML_GROUP: usize = 32;

/// Rows of affine integer groups: codes, then a scale and an offset per group.
#[derive(Clone, Debug, PartialEq)]
pub struct AffineGroups {
    /// Bits per code: 4 (two codes a byte, value `2i` in the low nibble) or 8.
    pub bits: u32,
    /// Values per group (a divisor of `cols`).
    pub group: usize,
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Codes, `[rows, cols * bits / 8]` row-major.
    pub codes: Vec<u8>,
    /// Group scales, IEEE half bits `[rows, cols / group]`.
    pub scales: Vec<u16>,
    /// Group offsets, IEEE half bits `[rows, cols / group]`.
    pub offsets: Vec<u16>,
}

/// Why a source block cannot be carried exactly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AffineError {
    /// The source type is not one this codec carries.
    #[error("{0} is not carried as affine integer groups (Q4_0, Q4_1 and Q8_0 are)")]
    Type(String),
    /// The bytes do not hold `rows` rows of `cols` values of the type.
    #[error("{ty}: {bytes} bytes are not {rows} rows of {cols} values")]
    Shape {
        /// The source type.
        ty: String,
        /// Bytes given.
        bytes: usize,
        /// Rows asked for.
        rows: usize,
        /// Values per row asked for.
        cols: usize,
    },
    /// A block's scale or minimum is NaN or infinite.
    #[error("row {row}, block {group}: its {field} is not finite")]
    NonFinite {
        /// Row.
        row: usize,
        /// Block (group) within the row.
        group: usize,
        /// `d` or `m`.
        field: &'static str,
    },
    /// `-z * d` does not fit a half (|d| too large for the zero point `z`).
    #[error("row {row}, block {group}: the offset -{zero} * d overflows a half")]
    OffsetOverflow {
        /// Row.
        row: usize,
        /// Block (group) within the row.
        group: usize,
        /// The zero point (8 for Q4_0, 128 for Q8_0).
        zero: u32,
    },
}

/// The half `v`, if `v` is one exactly (and finite).
fn exact_half(v: f32) -> Option<u16> {
    let h = f16::from_f32(v);
    (f16::to_f32(h) == v && v.is_finite()).then_some(h)
}

/// The offset `b` of one source block (at `row`, `group`), or why the block cannot be carried.
fn block_offset(ty: GgmlType, b: &[u8], row: usize, group: usize) -> Result<u16, AffineError> {
    let finite = |at: usize, field: &'static str| {
        let bits = u16::from_le_bytes([b[at], b[at + 1]]);
        if f16::to_f32(bits).is_finite() {
            Ok(bits)
        } else {
            Err(AffineError::NonFinite { row, group, field })
        }
    };
    let d = f16::to_f32(finite(0, "d")?);
    let zero_offset = |zero: u32| {
        exact_half(-(zero as f32) * d).ok_or(AffineError::OffsetOverflow { row, group, zero })
    };
    match ty {
        GgmlType::Q4_1 => finite(2, "m"),
        GgmlType::Q4_0 => zero_offset(8),
        _ => zero_offset(128),
    }
}

/// Append one source block's 32 codes in row order: 4-bit pairs (value `2i` low) from ggml's
/// nibbles (value j in the low nibble of `qs[j]`, j + 16 in its high), or Q8_0's signed
/// bytes plus 128.
fn push_codes(ty: GgmlType, b: &[u8], codes: &mut Vec<u8>) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let qs = &b[b.len() - 16..];
            let q = |j: usize| if j < 16 { qs[j] & 0xF } else { qs[j - 16] >> 4 };
            codes.extend((0..16).map(|i| q(2 * i) | (q(2 * i + 1) << 4)));
        }
        _ => codes.extend(b[2..].iter().map(|&q| (q as i8 as i32 + 128) as u8)),
    }
}

/// The code of value `c` in a row of codes at `bits` (4: two a byte, value `2i` in the low
/// nibble; 8: one a byte).
pub fn code_at(row: &[u8], c: usize, bits: u32) -> u32 {
    match bits {
        4 => u32::from((row[c / 2] >> (4 * (c % 2))) & 0xF),
        _ => u32::from(row[c]),
    }
}

/// The code width at which GGUF type `ty` is carried (Q4_0 and Q4_1: 4 bits, Q8_0: 8), or `None`
/// for a type this codec does not carry.
pub fn carried_bits(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => Some(4),
        GgmlType::Q8_0 => Some(8),
        _ => None,
    }
}

impl AffineGroups {
    /// `rows` rows of `cols` values of GGUF type `ty` (Q4_0, Q4_1, Q8_0) at `raw` as groups of
    /// [`GGML_GROUP`], every weight decoding as the source's.
    pub fn from_ggml(
        ty: GgmlType,
        raw: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<AffineGroups, AffineError> {
        let bits = carried_bits(ty).ok_or_else(|| AffineError::Type(ty.name().to_string()))?;
        let block_bytes = ty.block_bytes() as usize;
        let groups = cols / GGML_GROUP;
        let shape = || AffineError::Shape {
            ty: ty.name().to_string(),
            bytes: raw.len(),
            rows,
            cols,
        };
        let want = rows
            .checked_mul(groups)
            .and_then(|g| g.checked_mul(block_bytes));
        if !cols.is_multiple_of(GGML_GROUP) || want != Some(raw.len()) {
            return Err(shape());
        }
        let mut out = AffineGroups {
            bits,
            group: GGML_GROUP,
            rows,
            cols,
            codes: Vec::with_capacity(rows * cols * bits as usize / 8),
            scales: Vec::with_capacity(rows * groups),
            offsets: Vec::with_capacity(rows * groups),
        };
        for (i, b) in raw.chunks_exact(block_bytes).enumerate() {
            let (row, group) = (i / groups, i % groups);
            let d_bits = u16::from_le_bytes([b[0], b[1]]);
            out.offsets.push(block_offset(ty, b, row, group)?);
            out.scales.push(d_bits);
            push_codes(ty, b, &mut out.codes);
        }
        Ok(out)
    }

    /// The code of value `c` of row `r`.
    fn code(&self, r: usize, c: usize) -> u32 {
        let row = self.cols * self.bits as usize / 8;
        code_at(&self.codes[r * row..(r + 1) * row], c, self.bits)
    }

    /// Every weight, f32 `[rows, cols]`: `s * q + b` (one product, then one sum; no fused
    /// multiply-add, though the product is exact, so a fused one gives the same bits).
    pub fn decode(&self) -> Vec<f32> {
        let groups = self.cols / self.group;
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            for c in 0..self.cols {
                let g = r * groups + c / self.group;
                let (s, b) = (f16::to_f32(self.scales[g]), f16::to_f32(self.offsets[g]));
                out.push(s * self.code(r, c) as f32 + b);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q4_0_block(d: f32, codes: [u8; 32]) -> Vec<u8> {
        let mut b = f16::from_f32(d).to_le_bytes().to_vec();
        b.extend((0..16).map(|j| codes[j] | (codes[j + 16] << 4)));
        b
    }

    #[test]
    fn q4_0_codes_land_in_row_order_with_the_zero_point_folded() {
        let codes: [u8; 32] = std::array::from_fn(|i| (i % 16) as u8);
        let raw = q4_0_block(0.5, codes);
        let a = AffineGroups::from_ggml(GgmlType::Q4_0, &raw, 1, 32).unwrap();
        let want: Vec<f32> = codes.iter().map(|&q| 0.5 * (q as f32 - 8.0)).collect();
        assert_eq!(a.decode(), want);
        assert_eq!(a.codes[0], 0x10);
        assert_eq!(f16::to_f32(a.offsets[0]), -4.0);
    }

    #[test]
    fn blocks_that_cannot_be_carried_exactly_are_refused_by_row_and_block() {
        let mut raw = q4_0_block(0.5, [0; 32]);
        raw.extend(q4_0_block(9000.0, [0; 32]));
        let e = AffineGroups::from_ggml(GgmlType::Q4_0, &raw, 1, 64).unwrap_err();
        assert_eq!(
            e,
            AffineError::OffsetOverflow {
                row: 0,
                group: 1,
                zero: 8
            }
        );
        let nan = q4_0_block(f32::NAN, [0; 32]);
        let e = AffineGroups::from_ggml(GgmlType::Q4_0, &nan, 1, 32).unwrap_err();
        assert!(
            e.to_string()
                .contains("row 0, block 0: its d is not finite"),
            "{e}"
        );
        let e = AffineGroups::from_ggml(GgmlType::Q4_0, &raw, 2, 64).unwrap_err();
        assert!(matches!(e, AffineError::Shape { .. }), "{e}");
        let e = AffineGroups::from_ggml(GgmlType::Q4_K, &raw, 1, 64).unwrap_err();
        assert_eq!(e, AffineError::Type("Q4_K".into()));
    }
}
