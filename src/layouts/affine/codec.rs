//! `affine`: affine integer groups (`groups.rs`) for the affine arms. Parts `codes`
//! (row-major `[n, kp]` codes: 4-bit pairs, value `2i` in the low nibble, or bytes) and `scales`
//! (per group of each row its pair in the blob's form: the half `s` then the half `b` or `z`,
//! 4 bytes, or the f32 `s` then the f32 `z`, 8 bytes: `[n, kp / group]` pairs); K zero-padded to
//! [`K_ALIGN`]. Scalars `bits` (4 or 8), `group` (32 times a power of two dividing `kp`, or `kp`:
//! one group a row), `form` (0 offset, 1 zero, 2 zero f32; a blob without it is form 0) and
//! `perm` (1: the columns are stored sorted by group and `scales` ends with the permutation,
//! [`perm_bytes`]; absent: in source order).
//!
//! GGUF Q4_0, Q4_1 and Q8_0 sources are carried in the offset form (`AffineGroups::from_ggml`),
//! AutoAWQ and compressed-tensors integer weights in a zero form (`AffineGroups::from_int`):
//! every weight decodes as the source library decodes it. Any other source is quantized with
//! ggml's Q8_0 reference rule (`converters/q8_0.rs`) and carried from that.

use crate::GgmlType;
use crate::converters::f16;
use crate::converters::layouts::{Encoded, round_up};
use crate::layouts::affine::groups::{AffineError, AffineGroups, Form, GGML_GROUP, code_at};

/// K alignment: a multiple of every group this layout stores and of the kernels' 128-value
/// chunks.
pub const K_ALIGN: usize = 128;

/// A blob's code width, group and form (its scalars).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheme {
    /// Bits per code: 4 or 8.
    pub bits: u32,
    /// Values per group.
    pub group: usize,
    /// What a group's pair holds.
    pub form: Form,
}

impl Scheme {
    /// GGUF's: groups of 32 in the offset form.
    pub const fn ggml(bits: u32) -> Scheme {
        Scheme {
            bits,
            group: GGML_GROUP,
            form: Form::Offset,
        }
    }

    /// The scheme valid for rows padded to `kp`: 4 or 8 bits, `kp % K_ALIGN == 0`, a group of
    /// 32 times a power of two dividing `kp`, or `kp` itself.
    pub fn valid(&self, kp: usize) -> bool {
        matches!(self.bits, 4 | 8)
            && kp.is_multiple_of(K_ALIGN)
            && self.group.is_multiple_of(GGML_GROUP)
            && crate::layouts::affine::groups::group_carried(self.group, kp)
    }

    /// How far the kernels shift a 32-value group's index right for its pair's: log2 of the
    /// group over 32, or 31 (every index to pair 0) for a group that is the whole row.
    pub fn group_shift(&self, kp: usize) -> u32 {
        let per = self.group / GGML_GROUP;
        if self.group == kp && !per.is_power_of_two() {
            31
        } else {
            per.trailing_zeros()
        }
    }

    /// The scheme of a kernel's arguments (`bits`, `form`, `gshift`; [`Scheme::group_shift`]
    /// inverted), if they name one.
    pub fn from_args(bits: u32, form: u32, gshift: u32, kp: usize) -> Option<Scheme> {
        let group = match gshift {
            31 => kp,
            0..=25 => GGML_GROUP << gshift,
            _ => return None,
        };
        let sc = Scheme {
            bits,
            group,
            form: Form::from_number(form)?,
        };
        sc.valid(kp).then_some(sc)
    }

    /// Bytes of one row of `kp` values: its codes and pairs.
    pub fn row_bytes(&self, kp: usize) -> usize {
        kp * self.bits as usize / 8 + kp / self.group * self.form.pair_bytes()
    }

    /// Bytes of the `scales` part of `[n, kp]`.
    pub fn scales_bytes(&self, n: u64, kp: u64) -> Option<u64> {
        n.checked_mul(kp.checked_div(self.group as u64)?)?
            .checked_mul(self.form.pair_bytes() as u64)
    }
}

/// Bytes of the `codes` part of `[n, kp]` at `bits`.
pub fn codes_bytes(n: u64, kp: u64, bits: u32) -> Option<u64> {
    n.checked_mul(kp)?
        .checked_mul(u64::from(bits))
        .map(|b| b / 8)
}

/// The group a blob of rows padded to `kp` stores for a source in groups of
/// `own.group`: its own where the layout stores it at `kp` (dividing it), else (one group a
/// row) `kp`.
pub fn stored_group(own: Scheme, kp: usize) -> usize {
    if own.valid(kp) { own.group } else { kp }
}

/// A group's pair bytes in `form`: halves (exact: the codec keeps half values in the half
/// forms) or f32s.
fn pair(form: Form, s: f32, t: f32) -> Vec<u8> {
    match form {
        Form::ZeroF32 => [s.to_le_bytes(), t.to_le_bytes()].concat(),
        _ => [
            f16::from_f32(s).to_le_bytes(),
            f16::from_f32(t).to_le_bytes(),
        ]
        .concat(),
    }
}

/// The parts of `a` (`[n, k]`), K padded to `kp`: padded groups get codes 0 and a zero pair; a
/// row that is one group gets its zero point as the padded codes (all pad decodes to 0).
pub fn from_groups(a: &AffineGroups) -> Encoded {
    let (n, k, bits) = (a.rows, a.cols, a.bits as usize);
    let kp = round_up(k, K_ALIGN);
    let own = Scheme {
        bits: a.bits,
        group: a.group,
        form: a.form,
    };
    let group = stored_group(own, kp);
    let (row_in, row_out) = (k * bits / 8, kp * bits / 8);
    let (g_in, g_out) = (k / a.group, kp / group);
    let mut codes = vec![0u8; n * row_out];
    for r in 0..n {
        let out = &mut codes[r * row_out..(r + 1) * row_out];
        if group != a.group {
            // One group a row: the pad is the zero point.
            let z = a.terms[r] as u8;
            let fill = if bits == 4 { z | (z << 4) } else { z };
            out[row_in..].fill(fill);
        }
        out[..row_in].copy_from_slice(&a.codes[r * row_in..(r + 1) * row_in]);
    }
    let pb = a.form.pair_bytes();
    let mut scales = vec![0u8; n * g_out * pb];
    for r in 0..n {
        for g in 0..g_in {
            let (at, i) = ((r * g_out + g) * pb, r * g_in + g);
            scales[at..at + pb].copy_from_slice(&pair(a.form, a.scales[i], a.terms[i]));
        }
    }
    let mut scalars = vec![
        ("bits", bits as f32),
        ("group", group as f32),
        ("form", a.form as u32 as f32),
    ];
    if let Some(perm) = &a.perm {
        // The padding columns stay where they are; then the inverse.
        let full: Vec<u32> = perm.iter().copied().chain(k as u32..kp as u32).collect();
        let mut inv = vec![0u32; kp];
        for (c, &p) in full.iter().enumerate() {
            inv[p as usize] = c as u32;
        }
        scales.extend(full.iter().chain(&inv).flat_map(|v| v.to_le_bytes()));
        scalars.push(("perm", 1.0));
    }
    Encoded {
        parts: vec![("codes", codes), ("scales", scales)],
        padded: [n, kp],
        scalars,
    }
}

/// Bytes of the column permutation a blob of rows padded to `kp` appends to its `scales`
/// part when its scalar `perm` is not 0: `kp` little-endian u32, the source column of each
/// stored column (the padding's its own), then `kp` more, its inverse (the stored column of
/// each source column: the prefill's dequantization reads through it).
pub fn perm_bytes(kp: u64) -> Option<u64> {
    kp.checked_mul(8)
}

/// The column permutation and its inverse after the `pairs` bytes of a `scales` part, `2 kp`
/// entries.
pub fn perm_of(scales: &[u8], pairs: usize, kp: usize) -> Vec<u32> {
    scales[pairs..pairs + 8 * kp]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Whether `perm_inv` (`2 kp` entries) is a permutation of `0..kp` whose first `k` entries
/// permute `0..k` (the padding its own), followed by its inverse.
pub fn perm_valid(perm_inv: &[u32], k: usize, kp: usize) -> bool {
    let (perm, inv) = perm_inv.split_at(kp);
    perm.len() == kp
        && inv.len() == kp
        && perm.iter().enumerate().all(|(c, &p)| {
            let inside = if c < k {
                (p as usize) < k
            } else {
                p as usize == c
            };
            inside && inv[p as usize] as usize == c
        })
}

/// `[n, k]` values in stored column order put in the source's: `out[r, perm[c]] = v[r, c]`.
pub fn unpermute(v: &[f32], [n, k]: [usize; 2], perm: &[u32]) -> Vec<f32> {
    let mut out = vec![0f32; n * k];
    for r in 0..n {
        for c in 0..k {
            out[r * k + perm[c] as usize] = v[r * k + c];
        }
    }
    out
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
    let raw = crate::converters::encode_to_vec::<crate::converters::q8_0::Q8_0>(
        &crate::converters::layouts::pad(x, n, k, n, k32),
    );
    // Values past k (a partial group's padding) decode to zero.
    carry(GgmlType::Q8_0, &raw, n, k32)
}

/// A group's `(s, t)` from its pair at byte `at` of `scales` in `form`.
pub fn pair_at(scales: &[u8], at: usize, form: Form) -> (f32, f32) {
    let f = |i: usize| f32::from_le_bytes([scales[i], scales[i + 1], scales[i + 2], scales[i + 3]]);
    let h = |i: usize| f16::to_f32(u16::from_le_bytes([scales[i], scales[i + 1]]));
    match form {
        Form::ZeroF32 => (f(at), f(at + 4)),
        _ => (h(at), h(at + 2)),
    }
}

/// Decode to f32 `[n, k]` ([`Form::weight`]), as the codec decodes.
pub fn decode(codes: &[u8], scales: &[u8], sc: Scheme, [n, k]: [usize; 2], kp: usize) -> Vec<f32> {
    let (row, g_row, pb) = (
        kp * sc.bits as usize / 8,
        kp / sc.group,
        sc.form.pair_bytes(),
    );
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        let codes = &codes[r * row..(r + 1) * row];
        for c in 0..k {
            let (s, t) = pair_at(scales, (r * g_row + c / sc.group) * pb, sc.form);
            out.push(sc.form.weight(s, t, code_at(codes, c, sc.bits)));
        }
    }
    out
}
