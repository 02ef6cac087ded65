//! The twin of `kernels/rules.cu`: the element rules a blob part keeps, and the first element
//! that breaks one.

/// A rule every element of a blob part keeps (formats.md, "Each layout's own rules"): the
/// `kind` and `top` of `kernels/rules.cu`'s `blob_rules`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementRule {
    /// Every little-endian half finite.
    Halves,
    /// 4-byte pairs: a finite half scale, a half zero point that is an integer code of `bits`.
    ZeroPairs {
        /// The codes' width.
        bits: u32,
    },
    /// 8-byte pairs: a finite f32 scale, an f32 zero point that is an integer code of `bits`.
    ZeroPairsF32 {
        /// The codes' width.
        bits: u32,
    },
    /// Every little-endian f32 finite.
    F32,
    /// No byte is the E4M3 NaN (`S.1111.111`).
    E4m3,
}

impl ElementRule {
    /// The kernel's `kind`.
    pub fn kind(self) -> usize {
        match self {
            ElementRule::Halves => 0,
            ElementRule::ZeroPairs { .. } => 1,
            ElementRule::ZeroPairsF32 { .. } => 2,
            ElementRule::F32 => 3,
            ElementRule::E4m3 => 4,
        }
    }

    /// The kernel's `top`: the largest code of the zero forms (0 for the others).
    pub fn top(self) -> usize {
        match self {
            ElementRule::ZeroPairs { bits } | ElementRule::ZeroPairsF32 { bits } => {
                (1usize << bits.min(16)) - 1
            }
            _ => 0,
        }
    }

    /// Bytes of one element.
    pub fn elem_bytes(self) -> usize {
        match self {
            ElementRule::Halves => 2,
            ElementRule::ZeroPairs { .. } | ElementRule::F32 => 4,
            ElementRule::ZeroPairsF32 { .. } => 8,
            ElementRule::E4m3 => 1,
        }
    }

    /// The rule of the kernel's `kind` and `top`, if `kind` names one.
    pub fn from_kind(kind: usize, top: usize) -> Option<ElementRule> {
        let bits = (top + 1).trailing_zeros();
        Some(match kind {
            0 => ElementRule::Halves,
            1 => ElementRule::ZeroPairs { bits },
            2 => ElementRule::ZeroPairsF32 { bits },
            3 => ElementRule::F32,
            4 => ElementRule::E4m3,
            _ => return None,
        })
    }
}

/// `blob_rules`: the lowest index of the first `n` elements of `p` that breaks `rule`, or
/// `u32::MAX` when none does (the kernel's atomic minimum over its threads).
pub fn blob_rules(p: &[u8], n: usize, rule: ElementRule) -> u32 {
    let h = |i: usize| u16::from_le_bytes([p[2 * i], p[2 * i + 1]]);
    let w = |i: usize| u32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]]);
    let half_ok = |v: u16| v & 0x7c00 != 0x7c00;
    let f32_ok = |v: u32| v & 0x7f80_0000 != 0x7f80_0000;
    let top = rule.top() as f32;
    let code = |z: f32| z == z.trunc() && z >= 0.0 && z <= top;
    let ok = |i: usize| match rule {
        ElementRule::Halves => half_ok(h(i)),
        ElementRule::ZeroPairs { .. } => {
            let v = w(i);
            half_ok(v as u16) && code(crate::converters::f16::to_f32((v >> 16) as u16))
        }
        ElementRule::ZeroPairsF32 { .. } => f32_ok(w(2 * i)) && code(f32::from_bits(w(2 * i + 1))),
        ElementRule::F32 => f32_ok(w(i)),
        ElementRule::E4m3 => p[i] & 0x7f != 0x7f,
    };
    (0..n).find(|&i| !ok(i)).map_or(u32::MAX, |i| i as u32)
}
