//! The numerics contract of every kernel, as plain row-at-a-time CPU functions. The host backend
//! runs these; GPU tests compare CUDA results against them (on all rows, or on sampled rows of a
//! large batch, since every output row depends only on its own input row). Sums are taken in f64
//! and rounded once, so the reference is at least as accurate as any kernel; quantization steps
//! that a kernel performs (activations to BF16 or FP8) are reproduced bit for bit.

use crate::converters::bf16;
use crate::converters::fp8::e4m3_to_f32;
use crate::gpu::sizes::*;
use std::sync::LazyLock;

mod rules;
pub use rules::{ElementRule, blob_rules};

/// Re-exports every built-in layout's twins (`src/layouts/TAG/twin.rs`), generated from the
/// list of built-in layouts (`layouts::builtin_layouts!`).
macro_rules! twins {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        $(#[allow(unused_imports)] pub use crate::layouts::$t::twin::*;)*
    };
}
crate::layouts::builtin_layouts!(twins);

/// E4M3 byte -> value, as f64 (exact).
pub(crate) static E4M3: LazyLock<[f64; 256]> =
    LazyLock::new(|| std::array::from_fn(|b| e4m3_to_f32(b as u8) as f64));

/// Activation rounding a kernel applies before its products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActRound {
    /// f32 activations used as they are.
    None,
    /// Activations rounded to BF16 (nearest even), as the tensor-core kernels feed them.
    Bf16,
}

impl ActRound {
    #[inline]
    /// The rounding applied to one value.
    pub fn apply(self, x: f32) -> f32 {
        match self {
            ActRound::None => x,
            ActRound::Bf16 => bf16::to_f32(bf16::from_f32(x)),
        }
    }
}

/// `silu(g) * u` in f32: `g / (1 + exp(-g)) * u`.
#[inline]
pub fn silu_mul(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// `gelu_tanh(g) * u` in f32 (the tanh approximation, as gemma's `gelu_pytorch_tanh`).
#[inline]
pub fn gelu_mul(g: f32, u: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * g * (1.0 + (C * (g + 0.044715 * g * g * g)).tanh()) * u
}

/// `stream_probe`'s output: per block of `per` 16-byte words of `words`, the XOR of its
/// little-endian 32-bit lanes.
pub fn stream_probe(words: &[u8], per: usize) -> Vec<u32> {
    words
        .chunks(16 * per.max(1))
        .map(|b| {
            b.chunks_exact(4).fold(0u32, |a, w| {
                a ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]])
            })
        })
        .collect()
}

pub(crate) fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Group `g` of 32 values of `x` (past its end 0) as the int8 activation quantizers see it (one
/// warp a group, common.cuh's `warp_amax_sum`): the values, `d = amax / 127`, `1 / d` (0 when d
/// is), and their f32 sum in the butterfly order xor 16, 8, 4, 2, 1.
pub(crate) fn warp_group_q8(x: &[f32], g: usize) -> (Vec<f32>, f32, f32, f32) {
    let v: Vec<f32> = (0..32)
        .map(|l| x.get(g * 32 + l).copied().unwrap_or(0.0))
        .collect();
    let mut s = v.clone();
    for o in [16usize, 8, 4, 2, 1] {
        let prev = s.clone();
        for l in 0..32 {
            s[l] = prev[l] + prev[l ^ o];
        }
    }
    let amax = v.iter().fold(0f32, |m, a| m.max(a.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (v, d, id, s[0])
}

/// `quantize_act_q8_1` for one row: `kp/32` blocks of `f16 d, f16 s, i8 qs[32]`; `d =
/// amax/127`, `q = roundf(x * (1/d))` with the f32 `d`, `s` = the sum of the unquantized values
/// in the kernel's butterfly order (after each step every lane holds the same value).
pub fn quantize_row_q8_1_act(x: &[f32], kp: usize) -> Vec<u8> {
    let mut out = vec![0u8; kp / Q8_1_ELEMS * Q8_1_BYTES];
    for (b, blk) in out.chunks_exact_mut(Q8_1_BYTES).enumerate() {
        let (v, d, id, sum) = warp_group_q8(x, b);
        blk[0..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        blk[2..4].copy_from_slice(&half::f16::from_f32(sum).to_le_bytes());
        for (l, &xv) in v.iter().enumerate() {
            blk[4 + l] = ((xv * id).round() as i32) as i8 as u8;
        }
    }
    out
}

/// `m` rows of q8_1 blocks (`quantize_row_q8_1_act`'s, `kp` values a row) split, as
/// `quantize_act_q8_1s` writes them (kernels/ffn_q8_1.cu, `q8_1_at`): every row's codes `[m, kp]`,
/// then every block's `d` and `s` (4 bytes, `[m, kp / 32]`). The same bytes, moved.
pub fn q8_1_split(blocks: &[u8], m: usize, kp: usize) -> Vec<u8> {
    let nb = m * kp / Q8_1_ELEMS;
    let mut out = vec![0u8; nb * Q8_1_BYTES];
    let (codes, ds) = out.split_at_mut(m * kp);
    for (i, blk) in blocks.chunks_exact(Q8_1_BYTES).take(nb).enumerate() {
        ds[4 * i..4 * i + 4].copy_from_slice(&blk[..4]);
        codes[Q8_1_ELEMS * i..Q8_1_ELEMS * (i + 1)].copy_from_slice(&blk[4..]);
    }
    out
}

/// `q8_1_split`'s inverse: `m` rows of split q8_1 back to blocks.
pub fn q8_1_join(split: &[u8], m: usize, kp: usize) -> Vec<u8> {
    let nb = m * kp / Q8_1_ELEMS;
    let mut out = vec![0u8; nb * Q8_1_BYTES];
    let (codes, ds) = split.split_at(m * kp);
    for (i, blk) in out.chunks_exact_mut(Q8_1_BYTES).enumerate() {
        blk[..4].copy_from_slice(&ds[4 * i..4 * i + 4]);
        blk[4..].copy_from_slice(&codes[Q8_1_ELEMS * i..Q8_1_ELEMS * (i + 1)]);
    }
    out
}

/// The il8 order of the dequantizing wgmma GEMMs' bf16 activations (formats.md, "The
/// dequantizing wgmma GEMMs"): within each group of 8 columns, position `p` holds column
/// `IL8[p]`.
pub const IL8: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// The position of column `c` in the il8 order.
pub fn il8_pos(c: usize) -> usize {
    (c & !7) | ((c & 3) << 1) | ((c >> 2) & 1)
}

/// f64 -> bf16 bits, rounded once to nearest even: the significand cut to bf16's 8 bits in the
/// f64 itself (exact, then a lossless f32), below bf16's normal range through f32.
pub(crate) fn bf16_from_f64(v: f64) -> u16 {
    if !v.is_finite() || v.abs() < f32::MIN_POSITIVE as f64 {
        return bf16::from_f32(v as f32);
    }
    const DROP: u32 = 52 - 7;
    let b = v.to_bits();
    let r = (b + (1u64 << (DROP - 1)) - 1 + ((b >> DROP) & 1)) & !((1u64 << DROP) - 1);
    bf16::from_f32(f64::from_bits(r) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The il8 order is a permutation of each group of 8, and `il8_pos` is its inverse.
    #[test]
    fn il8_positions_invert_the_order() {
        for c in 0..24 {
            assert_eq!(IL8[il8_pos(c) % 8] + c / 8 * 8, c);
        }
    }

    /// The bf16 Q4_K weights are the exact Q4_K values (f64 from the block's own fields) within
    /// bf16's rounding of the scale products and of the result: 3 * 2^-9 of the value, plus that
    /// of the min term where they cancel.
    #[test]
    #[cfg(feature = "harness")]
    fn q4k_bf16_weights_are_the_q4k_values_rounded() {
        use crate::converters::kquant::get_scale_min_k4;
        let mut r = crate::testing::Rand(5);
        let x = r.vec(4 * 256, 0.05);
        let e = crate::converters::layouts::q4k_mmq::encode_q4k(&x, 4, 256);
        for blk in e.parts[0].1.chunks_exact(Q4K_BYTES) {
            let got = q4k_bf16_block(blk);
            let (d, dmin) = (f16_at(blk) as f64, f16_at(&blk[2..]) as f64);
            let sc12: &[u8; 12] = blk[4..16].try_into().unwrap();
            for (i, &g) in got.iter().enumerate() {
                let (sc, m) = get_scale_min_k4(i / 32, sc12);
                let q = ((blk[16 + 32 * (i / 64) + i % 32] >> (4 * ((i / 32) % 2))) & 0xF) as f64;
                let exact = d * sc as f64 * q - dmin * m as f64;
                let bound = 3.0 * 2f64.powi(-9) * (exact.abs() + dmin * m as f64) + 1e-30;
                assert!((g as f64 - exact).abs() <= bound, "{i}: {g} vs {exact}");
                assert_eq!(bf16::to_f32(bf16::from_f32(g)), g, "{i}: not a bf16 value");
            }
        }
    }
}
