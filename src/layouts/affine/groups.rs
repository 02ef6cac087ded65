//! Affine integer groups, the codec of the integer layout the issue "carry integer-quantized
//! weights without re-quantizing" asks for: each group of `group` consecutive values of a row
//! holds unsigned 4- or 8-bit codes `q` and two numbers, in one of three [`Form`]s
//! (formats.md, "Affine integer groups"):
//! - [`Form::Offset`]: `w = s * q + b`, the scale `s` and offset `b` IEEE halves (GGUF);
//! - [`Form::Zero`]: `w = s * (q - z)`, `s` a half and the zero point `z` an integer held as a
//!   half (AutoAWQ, compressed-tensors with F16 scales, or BF16 or F32 ones that are halves);
//! - [`Form::ZeroF32`]: the same with `s` and `z` as f32 (any other float scale).
//!
//! The zero forms carry integer checkpoints exactly (`from_int`): `q - z` is an integer below
//! 2^8 in magnitude, so `s * (q - z)` rounds once in f32, as the libraries compute it
//! (AutoAWQ in F16: one more rounding of this exact value; compressed-tensors in the scale's
//! dtype: the same product, see `ct_int.rs`).
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

use crate::GgmlType;
use crate::converters::f16;
pub use crate::converters::int_source::{IntSource, by_output};

/// Values per group of the GGUF formats this codec carries, and the least group of any source.
pub const GGML_GROUP: usize = 32;

/// How a group's two numbers are stored and what they mean (the `form` scalar of the layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `w = s * q + b`: half `s`, half `b`.
    Offset = 0,
    /// `w = s * (q - z)`: half `s`, the integer `z` as a half.
    Zero = 1,
    /// `w = s * (q - z)`: f32 `s`, the integer `z` as an f32.
    ZeroF32 = 2,
}

impl Form {
    /// Every form, by its number.
    pub const ALL: [Form; 3] = [Form::Offset, Form::Zero, Form::ZeroF32];

    /// Bytes of one group's pair: two halves, or two f32s.
    pub const fn pair_bytes(self) -> usize {
        match self {
            Form::ZeroF32 => 8,
            _ => 4,
        }
    }

    /// The form numbered `v` (the layout's scalar).
    pub fn from_number(v: u32) -> Option<Form> {
        Form::ALL.get(v as usize).copied()
    }

    /// `w` of code `q` in a group of scale `s` and second number `t` (`b` or `z`): `s * q + b`,
    /// one product then one sum (the product is exact, so a fused multiply-add gives the same
    /// bits), or `s * (q - z)` (the difference is exact).
    #[inline]
    pub fn weight(self, s: f32, t: f32, q: u32) -> f32 {
        match self {
            Form::Offset => s * q as f32 + t,
            _ => s * (q as f32 - t),
        }
    }
}

/// Rows of affine integer groups: codes, then a scale and a second number per group.
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
    /// What the two numbers of a group are.
    pub form: Form,
    /// Codes, `[rows, cols * bits / 8]` row-major.
    pub codes: Vec<u8>,
    /// Group scales `s`, `[rows, cols / group]` (halves as f32 in the half forms).
    pub scales: Vec<f32>,
    /// Each group's second number, `[rows, cols / group]`: the offset `b` ([`Form::Offset`]) or
    /// the zero point `z` (the zero forms).
    pub terms: Vec<f32>,
    /// The source column of each stored column (`None`: the same), where the source's groups
    /// are not contiguous (GPTQ's act-order) and the columns were sorted by group.
    pub perm: Option<Vec<u32>>,
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
    /// Groups of a column map that do not each hold `group` columns.
    #[error(
        "the group indices do not put {group} input channels in every group (channel {column} is where another group's should be)"
    )]
    Permuted {
        /// The first column out of place once sorted.
        column: usize,
        /// Columns a group must hold.
        group: usize,
    },
    /// A block's scale or minimum is NaN or infinite.
    #[error("row {row}, block {group}: its {field} is not finite")]
    NonFinite {
        /// Row.
        row: usize,
        /// Block (group) within the row.
        group: usize,
        /// `d`, `m` or `scale`.
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
    /// The group size is not one the layout stores.
    #[error(
        "groups of {group} values in rows of {cols}: carried are groups of 32, 64, 128, ... (32 times a power of two) dividing the row, or the whole row"
    )]
    Group {
        /// Values per group.
        group: usize,
        /// Values per row.
        cols: usize,
    },
    /// A code or zero point is not below 2^bits.
    #[error("row {row}, group {group}: its {field} {value} is not a {bits}-bit code")]
    Code {
        /// Row.
        row: usize,
        /// Group within the row.
        group: usize,
        /// `code` or `zero point`.
        field: &'static str,
        /// The value.
        value: u32,
        /// The source's bits.
        bits: u32,
    },
}

/// The half `v`, if `v` is one exactly (and finite).
fn exact_half(v: f32) -> Option<u16> {
    let h = f16::from_f32(v);
    (f16::to_f32(h) == v && v.is_finite()).then_some(h)
}

/// Whether groups of `group` values are carried in rows of `cols`: 32 times a power of two
/// dividing the row, or the whole row (one group: per channel).
pub fn group_carried(group: usize, cols: usize) -> bool {
    group == cols
        || (group >= GGML_GROUP
            && group.is_multiple_of(GGML_GROUP)
            && (group / GGML_GROUP).is_power_of_two()
            && cols.is_multiple_of(group))
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

/// The stored code width of a source with `bits`-bit codes (1 to 8): 4 up to 4 bits, else 8.
pub fn stored_bits(bits: u32) -> u32 {
    if bits <= 4 { 4 } else { 8 }
}

impl IntSource<'_> {
    /// The source fits the layout: a group size it stores, slices that fit the shape, finite
    /// scales, codes and zero points below `2^bits` (naming row and group).
    pub fn check(&self) -> Result<(), AffineError> {
        let (rows, cols, group, bits) = (self.rows, self.cols, self.group, self.bits);
        if !(1..=8).contains(&bits) || group == 0 || !group_carried(group, cols) {
            return Err(AffineError::Group { group, cols });
        }
        let groups = cols / group;
        let fits = |len: usize, per: usize| rows.checked_mul(per) == Some(len);
        if !fits(self.codes.len(), cols)
            || !fits(self.scales.len(), groups)
            || !fits(self.zeros.len(), groups)
        {
            let (ty, bytes) = (format!("int{bits}"), self.codes.len());
            return Err(AffineError::Shape {
                ty,
                bytes,
                rows,
                cols,
            });
        }
        let code = |row, group, field, value| AffineError::Code {
            row,
            group,
            field,
            value,
            bits,
        };
        let limit = 1u32 << bits;
        for (i, (&s, &z)) in self.scales.iter().zip(self.zeros).enumerate() {
            let (row, group) = (i / groups, i % groups);
            if !s.is_finite() {
                let field = "scale";
                return Err(AffineError::NonFinite { row, group, field });
            }
            if z >= limit {
                return Err(code(row, group, "zero point", z));
            }
        }
        match self.codes.iter().position(|&q| u32::from(q) >= limit) {
            Some(i) => Err(code(
                i / cols,
                i % cols / group,
                "code",
                self.codes[i].into(),
            )),
            None => Ok(()),
        }
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
            form: Form::Offset,
            codes: Vec::with_capacity(rows * cols * bits as usize / 8),
            scales: Vec::with_capacity(rows * groups),
            terms: Vec::with_capacity(rows * groups),
            perm: None,
        };
        for (i, b) in raw.chunks_exact(block_bytes).enumerate() {
            let (row, group) = (i / groups, i % groups);
            let d_bits = u16::from_le_bytes([b[0], b[1]]);
            out.terms
                .push(f16::to_f32(block_offset(ty, b, row, group)?));
            out.scales.push(f16::to_f32(d_bits));
            push_codes(ty, b, &mut out.codes);
        }
        Ok(out)
    }

    /// An integer checkpoint's weight ([`IntSource`]) in a zero form, every weight
    /// `s * (q - z)` as the source defines it: codes of up to 4 bits stored at 4, others at 8;
    /// [`Form::Zero`] where every scale is a half, else [`Form::ZeroF32`]. Refuses what
    /// [`IntSource::check`] refuses.
    pub fn from_int(src: &IntSource) -> Result<AffineGroups, AffineError> {
        src.check()?;
        let (rows, cols, group) = (src.rows, src.cols, src.group);
        let bits = stored_bits(src.bits);
        if bits == 4 && !cols.is_multiple_of(2) {
            return Err(AffineError::Group { group, cols });
        }
        // Narrower codes move to the middle of the stored width, code and zero point alike
        // (`s * (q - z)` unchanged): the decode GEMVs centre on 2^(stored - 1), and the
        // activation rounding they see grows with |q - centre| (2-bit codes at 0..3 would
        // carry it about 6 times over).
        let shift = (1u8 << (bits - 1)) - (1u8 << (src.bits - 1));
        let codes = match bits {
            4 => src
                .codes
                .chunks_exact(2)
                .map(|p| (p[0] + shift) | ((p[1] + shift) << 4))
                .collect(),
            _ => src.codes.iter().map(|&q| q + shift).collect(),
        };
        let halves = src.scales.iter().all(|&s| exact_half(s).is_some());
        Ok(AffineGroups {
            bits,
            group,
            rows,
            cols,
            form: if halves { Form::Zero } else { Form::ZeroF32 },
            codes,
            scales: src.scales.to_vec(),
            terms: src
                .zeros
                .iter()
                .map(|&z| (z + u32::from(shift)) as f32)
                .collect(),
            perm: None,
        })
    }

    /// Rows `start .. start + count` (one half of a fused gate and up projection).
    pub fn rows_range(&self, start: usize, count: usize) -> AffineGroups {
        let (row, groups) = (self.cols * self.bits as usize / 8, self.cols / self.group);
        AffineGroups {
            rows: count,
            codes: self.codes[start * row..(start + count) * row].to_vec(),
            scales: self.scales[start * groups..(start + count) * groups].to_vec(),
            terms: self.terms[start * groups..(start + count) * groups].to_vec(),
            perm: self.perm.clone(),
            ..*self
        }
    }

    /// `extra` rows appended whose every weight is +0 (codes 0, scale 0, zero point or offset
    /// 0): a tensor-parallel slice's padding.
    pub fn pad_rows(mut self, extra: usize) -> AffineGroups {
        let (row, groups) = (self.cols * self.bits as usize / 8, self.cols / self.group);
        self.rows += extra;
        self.codes.resize(self.rows * row, 0);
        self.scales.resize(self.rows * groups, 0.0);
        self.terms.resize(self.rows * groups, 0.0);
        self
    }

    /// `extra` columns appended to every row whose weights are 0 (a tensor-parallel slice's
    /// padding), if they are whole groups (codes 0 in a zero pair) or the row is one group
    /// (codes at its zero point, the group widened); `None` otherwise.
    pub fn pad_cols(self, extra: usize) -> Option<AffineGroups> {
        if extra == 0 {
            return Some(self);
        }
        if self.perm.is_some() {
            return None;
        }
        let per_row = self.group == self.cols;
        let cols = self.cols + extra;
        if !(per_row || extra.is_multiple_of(self.group))
            || self.form == Form::Offset && per_row
            || self.bits == 4 && !cols.is_multiple_of(2)
        {
            return None;
        }
        let (bpv, groups) = (self.bits as usize, self.cols / self.group);
        let (row, new_row, new_groups) = (
            self.cols * bpv / 8,
            cols * bpv / 8,
            if per_row { 1 } else { cols / self.group },
        );
        let mut out = AffineGroups {
            cols,
            group: if per_row { cols } else { self.group },
            codes: Vec::with_capacity(self.rows * new_row),
            scales: Vec::with_capacity(self.rows * new_groups),
            terms: Vec::with_capacity(self.rows * new_groups),
            ..self
        };
        for r in 0..self.rows {
            let fill = if per_row {
                let z = self.terms[r] as u8;
                if bpv == 4 { z | (z << 4) } else { z }
            } else {
                0
            };
            out.codes
                .extend_from_slice(&self.codes[r * row..(r + 1) * row]);
            out.codes.resize((r + 1) * new_row, fill);
            let g = &self.scales[r * groups..(r + 1) * groups];
            out.scales.extend_from_slice(g);
            out.scales.resize((r + 1) * new_groups, 0.0);
            out.terms
                .extend_from_slice(&self.terms[r * groups..(r + 1) * groups]);
            out.terms.resize((r + 1) * new_groups, 0.0);
        }
        Some(out)
    }

    /// Columns `lo .. hi` of every row (a tensor-parallel slice of a down projection), if the
    /// cut splits no group and no code byte: one group a row keeps its pair, whatever the cut.
    pub fn cols_range(&self, lo: usize, hi: usize) -> Option<AffineGroups> {
        let per_row = self.group == self.cols;
        let aligned = lo.is_multiple_of(self.group) && hi.is_multiple_of(self.group);
        let split_byte = self.bits == 4 && !(lo.is_multiple_of(2) && hi.is_multiple_of(2));
        if lo >= hi || hi > self.cols || split_byte || !(per_row || aligned) || self.perm.is_some()
        {
            return None;
        }
        let (bpv, groups) = (self.bits as usize, self.cols / self.group);
        let (g_lo, g_hi) = if per_row {
            (0, 1)
        } else {
            (lo / self.group, hi / self.group)
        };
        let row = self.cols * bpv / 8;
        let mut out = AffineGroups {
            cols: hi - lo,
            group: if per_row { hi - lo } else { self.group },
            codes: Vec::with_capacity(self.rows * (hi - lo) * bpv / 8),
            scales: Vec::with_capacity(self.rows * (g_hi - g_lo)),
            terms: Vec::with_capacity(self.rows * (g_hi - g_lo)),
            perm: None,
            ..*self
        };
        for r in 0..self.rows {
            out.codes
                .extend_from_slice(&self.codes[r * row + lo * bpv / 8..r * row + hi * bpv / 8]);
            out.scales
                .extend_from_slice(&self.scales[r * groups + g_lo..r * groups + g_hi]);
            out.terms
                .extend_from_slice(&self.terms[r * groups + g_lo..r * groups + g_hi]);
        }
        Some(out)
    }

    /// The code of value `c` of row `r`.
    fn code(&self, r: usize, c: usize) -> u32 {
        let row = self.cols * self.bits as usize / 8;
        code_at(&self.codes[r * row..(r + 1) * row], c, self.bits)
    }

    /// Every weight, f32 `[rows, cols]` in the source's column order ([`Form::weight`]).
    pub fn decode(&self) -> Vec<f32> {
        let groups = self.cols / self.group;
        let mut out = vec![0f32; self.rows * self.cols];
        for r in 0..self.rows {
            for c in 0..self.cols {
                let g = r * groups + c / self.group;
                let q = self.code(r, c);
                let at = self.perm.as_ref().map_or(c, |p| p[c] as usize);
                out[r * self.cols + at] = self.form.weight(self.scales[g], self.terms[g], q);
            }
        }
        out
    }

    /// The integer source with its columns sorted by group where `group_of` (each column's
    /// group) is not in order (GPTQ's act-order): every group must hold `src.group` columns.
    /// The stored columns are then contiguous groups and [`AffineGroups::perm`] says where each
    /// came from; the stable sort keeps a group's columns in source order.
    pub fn from_int_grouped(
        src: &IntSource,
        group_of: &[u32],
    ) -> Result<AffineGroups, AffineError> {
        let (rows, cols, group) = (src.rows, src.cols, src.group);
        if group_of.len() != cols || group == 0 || !cols.is_multiple_of(group) {
            return Err(AffineError::Group { group, cols });
        }
        if group_of
            .iter()
            .enumerate()
            .all(|(c, &g)| g as usize == c / group)
        {
            return AffineGroups::from_int(src);
        }
        let mut perm: Vec<u32> = (0..cols as u32).collect();
        perm.sort_by_key(|&c| group_of[c as usize]);
        // Sorted, column c belongs to group c / group exactly when each group has `group`.
        if let Some(c) = (0..cols).find(|&c| group_of[perm[c] as usize] as usize != c / group) {
            return Err(AffineError::Permuted {
                column: perm[c] as usize,
                group,
            });
        }
        let codes: Vec<u8> = (0..rows * cols)
            .map(|i| src.codes[i / cols * cols + perm[i % cols] as usize])
            .collect();
        let mut out = AffineGroups::from_int(&IntSource {
            codes: &codes,
            ..*src
        })?;
        out.perm = Some(perm);
        Ok(out)
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
    fn narrow_codes_move_to_the_middle_of_the_stored_width_with_their_zero_points() {
        // 2-bit codes 0..3 with zero point 2 are stored as 6..9 with zero point 8 (3-bit: +4;
        // 5-bit at 8 bits: +112); every weight s * (q - z) is the same.
        for (bits, shift) in [(2u32, 6u32), (3, 4), (4, 0), (5, 112), (8, 0)] {
            let top = (1u8 << bits) - 1;
            let codes: Vec<u8> = (0..64).map(|i| (i as u8 * 7) % (top + 1)).collect();
            let z = u32::from(top / 2 + 1);
            let src = IntSource {
                bits,
                group: 32,
                rows: 1,
                cols: 64,
                codes: &codes,
                scales: &[0.5, 0.25],
                zeros: &[z, z],
            };
            let a = AffineGroups::from_int(&src).unwrap();
            assert_eq!(a.terms, [(z + shift) as f32; 2], "{bits}");
            let want: Vec<f32> = (0..64)
                .map(|i| [0.5, 0.25][i / 32] * (codes[i] as f32 - z as f32))
                .collect();
            assert_eq!(a.decode(), want, "{bits}");
            assert_eq!(a.code(0, 1), u32::from(codes[1]) + shift, "{bits}");
        }
    }

    #[test]
    fn q4_0_codes_land_in_row_order_with_the_zero_point_folded() {
        let codes: [u8; 32] = std::array::from_fn(|i| (i % 16) as u8);
        let raw = q4_0_block(0.5, codes);
        let a = AffineGroups::from_ggml(GgmlType::Q4_0, &raw, 1, 32).unwrap();
        let want: Vec<f32> = codes.iter().map(|&q| 0.5 * (q as f32 - 8.0)).collect();
        assert_eq!(a.decode(), want);
        assert_eq!(a.codes[0], 0x10);
        assert_eq!(a.terms[0], -4.0);
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

    fn int_source<'a>(
        bits: u32,
        group: usize,
        codes: &'a [u8],
        scales: &'a [f32],
        zeros: &'a [u32],
    ) -> IntSource<'a> {
        // One row of all the codes.
        IntSource {
            bits,
            group,
            rows: 1,
            cols: codes.len(),
            codes,
            scales,
            zeros,
        }
    }

    #[test]
    fn integer_groups_decode_as_scale_times_code_minus_zero_in_the_narrowest_form() {
        let codes: Vec<u8> = (0..64).map(|i| (i * 5 % 16) as u8).collect();
        let zeros = [3u32, 12];
        // F16-exact scales: the half form; an F32 scale that is no half: the f32 form.
        for (scales, form) in [
            ([0.5f32, -0.125], Form::Zero),
            ([0.1f32, 2.0], Form::ZeroF32),
        ] {
            let a = AffineGroups::from_int(&int_source(4, 32, &codes, &scales, &zeros)).unwrap();
            assert_eq!((a.form, a.bits), (form, 4));
            let want: Vec<f32> = (0..64)
                .map(|c| scales[c / 32] * (codes[c] as f32 - zeros[c / 32] as f32))
                .collect();
            assert_eq!(a.decode(), want);
        }
        // 3-bit codes are stored at 4 bits; 5-bit ones at 8.
        let small: Vec<u8> = codes.iter().map(|q| q % 8).collect();
        let a = AffineGroups::from_int(&int_source(3, 64, &small, &[1.0], &[4])).unwrap();
        assert_eq!((a.bits, a.group), (4, 64));
        let a = AffineGroups::from_int(&int_source(5, 64, &codes, &[1.0], &[16])).unwrap();
        assert_eq!((a.bits, a.codes.len()), (8, 64));
    }

    #[test]
    fn integer_groups_refuse_what_the_layout_cannot_hold_by_row_and_group() {
        let codes = vec![1u8; 96];
        let e = AffineGroups::from_int(&int_source(4, 48, &codes, &[1.0, 1.0], &[0, 0]));
        assert_eq!(
            e.unwrap_err(),
            AffineError::Group {
                group: 48,
                cols: 96
            }
        );
        let e = AffineGroups::from_int(&int_source(4, 32, &codes, &[1.0, f32::NAN, 1.0], &[0; 3]));
        assert_eq!(
            e.unwrap_err(),
            AffineError::NonFinite {
                row: 0,
                group: 1,
                field: "scale"
            }
        );
        let e = AffineGroups::from_int(&int_source(4, 32, &codes, &[1.0; 3], &[0, 0, 16]));
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("group 2: its zero point 16 is not a 4-bit code")
        );
        let mut bad = codes.clone();
        bad[40] = 9;
        let e = AffineGroups::from_int(&int_source(3, 32, &bad, &[1.0; 3], &[0; 3]));
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("row 0, group 1: its code 9")
        );
        // The whole row is one group, whatever its length.
        let odd = vec![2u8; 40];
        let a = AffineGroups::from_int(&int_source(8, 40, &odd, &[0.5], &[1])).unwrap();
        assert_eq!(a.decode(), vec![0.5; 40]);
    }

    #[test]
    fn tensor_parallel_cuts_keep_whole_groups_and_pad_with_zero_weights() {
        let codes: Vec<u8> = (0..128).map(|i| (i % 16) as u8).collect();
        let a = AffineGroups::from_int(&int_source(
            4,
            32,
            &codes,
            &[0.5, 1.0, 2.0, 4.0],
            &[1, 2, 3, 4],
        ))
        .unwrap();
        let full = a.decode();
        // Whole groups: the columns' weights; padded by a group of zeros.
        let cut = a.cols_range(32, 96).unwrap().pad_cols(32).unwrap();
        let mut want = full[32..96].to_vec();
        want.extend([0.0; 32]);
        assert_eq!(cut.decode(), want);
        // A cut inside a group, or padding by part of one: no carry.
        assert!(a.cols_range(16, 96).is_none());
        assert!(a.cols_range(32, 96).unwrap().pad_cols(16).is_none());
        // One group a row: any even cut, padded at the zero point.
        let row = AffineGroups::from_int(&int_source(8, 128, &codes, &[0.25], &[7])).unwrap();
        let cut = row.cols_range(10, 50).unwrap().pad_cols(8).unwrap();
        let mut want = row.decode()[10..50].to_vec();
        want.extend([0.0; 8]);
        assert_eq!(cut.decode(), want);
        assert_eq!(cut.group, 48);
    }
}
