//! `Q4_K` (GGUF type 12): super-blocks of 256 in 8 sub-blocks of 32.
//! `f16 d, f16 dmin, u8 scales[12]` (6-bit scale and min per sub-block, see
//! [`get_scale_min_k4`]), `u8 qs[128]`: element `64c + l` is the low nibble of `qs[32c + l]`,
//! element `64c + 32 + l` the high nibble; `y = d*sc*q - dmin*m` (ggml-common.h `block_q4_K`).
//!
//! Encoder = ggml `quantize_row_q4_K_ref` (no importance matrix): per sub-block the weights
//! `sqrt(mean(x^2)) + |x|`, `make_qkx2_quants(nmax 15, rmin -1, rdelta 0.1, nstep 20)`, the
//! scales and mins to 6 bits against their maxima, `d = fp16(max_scale/63)`,
//! `dmin = fp16(max_min/63)`, then every element requantized with the f16-rounded d and dmin.

use super::kquant::{QK_K, get_scale_min_k4, make_qkx2_quants, nearest_int};
use super::{BlockEncode, BlockFormat, f16_le, to_f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q4_K`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Scale of the minimums (f16 bits).
    pub dmin: [u8; 2],
    /// Sub-block scales (and minimums), packed.
    pub scales: [u8; 12],
    /// Quants.
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// The Q4_K format.
pub struct Q4K;

impl BlockFormat for Q4K {
    type Block = BlockQ4K;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "Q4_K";
    fn decode_block(b: &BlockQ4K, out: &mut [f32]) {
        let d = f16_le(b.d);
        let dmin = f16_le(b.dmin);
        for c in 0..4 {
            for nib in 0..2 {
                let (sc, m) = get_scale_min_k4(2 * c + nib, &b.scales);
                let dl = d * sc as f32;
                let ml = dmin * m as f32;
                for l in 0..32 {
                    let q = (b.qs[32 * c + l] >> (4 * nib)) & 0xF;
                    out[64 * c + 32 * nib + l] = dl * q as f32 - ml;
                }
            }
        }
    }
}

impl BlockEncode for Q4K {
    fn encode_block(x: &[f32], y: &mut BlockQ4K) {
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 32];
        let mut weights = [0f32; 32];
        let mut mins = [0f32; 8];
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        let mut max_min = 0f32;
        for j in 0..8 {
            let xs: &[f32; 32] = x[32 * j..32 * j + 32].try_into().unwrap();
            let mut sum_x2 = 0f32;
            for &v in xs {
                sum_x2 += v * v;
            }
            let av_x = (sum_x2 / 32.0).sqrt();
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = av_x + v.abs();
            }
            let (s, m) = make_qkx2_quants(
                15,
                xs,
                &weights,
                (&mut l[32 * j..32 * j + 32]).try_into().unwrap(),
                &mut laux,
                -1.0,
                0.1,
                20,
                false,
            );
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let inv_scale = if max_scale > 0.0 {
            63.0 / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        y.scales = [0; 12];
        for j in 0..8 {
            let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
            let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
            if j < 4 {
                y.scales[j] = ls;
                y.scales[j + 4] = lm;
            } else {
                y.scales[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
                y.scales[j - 4] |= (ls >> 4) << 6;
                y.scales[j] |= (lm >> 4) << 6;
            }
        }
        y.d = to_f16_le(max_scale / 63.0);
        y.dmin = to_f16_le(max_min / 63.0);
        let (df, dminf) = (f16_le(y.d), f16_le(y.dmin));
        for j in 0..8 {
            let (sc, m) = get_scale_min_k4(j, &y.scales);
            let d = df * sc as f32;
            if d == 0.0 {
                continue; // keeps make_qkx2_quants' codes, as ggml does
            }
            let dm = dminf * m as f32;
            for ii in 0..32 {
                let q = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, 15);
                l[32 * j + ii] = q as u8;
            }
        }
        for c in 0..4 {
            for i in 0..32 {
                y.qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}
