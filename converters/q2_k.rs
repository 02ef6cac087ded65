//! `Q2_K` (GGUF type 10): super-blocks of 256 in 16 sub-blocks of 16.
//! `u8 scales[16]` (low nibble scale, high nibble min), `u8 qs[64]`, `f16 d`, `f16 dmin`.
//! Element `128h + 32s + l` is bits `2s..2s+2` of `qs[32h + l]`; `y = d*sc*q - dmin*m`
//! (ggml-common.h `block_q2_K`).
//!
//! Encoder = ggml `quantize_row_q2_K_ref`: per sub-block weights `|x|`,
//! `make_qkx2_quants(nmax 3, rmin -0.5, rdelta 0.1, nstep 15, mean absolute deviation)`, scales
//! and mins to 4 bits against their maxima, then requantization with the f16-rounded d and dmin.

use super::kquant::{QK_K, make_qkx2_quants, nearest_int};
use super::{BlockEncode, BlockFormat, f16_le, to_f16_le};
use bytemuck::{Pod, Zeroable};

/// ggml `block_q2_K`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Sub-block scales (and minimums), packed.
    pub scales: [u8; 16],
    /// Quants.
    pub qs: [u8; 64],
    /// Scale (f16 bits).
    pub d: [u8; 2],
    /// Scale of the minimums (f16 bits).
    pub dmin: [u8; 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// The Q2_K format.
pub struct Q2K;

impl BlockFormat for Q2K {
    type Block = BlockQ2K;
    const BLOCK_ELEMS: usize = QK_K;
    const NAME: &'static str = "Q2_K";
    fn decode_block(b: &BlockQ2K, out: &mut [f32]) {
        let d = f16_le(b.d);
        let dmin = f16_le(b.dmin);
        for (e, o) in out.iter_mut().enumerate().take(QK_K) {
            let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let q = (b.qs[32 * h + l] >> (2 * s)) & 3;
            let sc = b.scales[e / 16];
            let dl = d * (sc & 0xF) as f32;
            let ml = dmin * (sc >> 4) as f32;
            *o = dl * q as f32 - ml;
        }
    }
}

impl BlockEncode for Q2K {
    fn encode_block(x: &[f32], y: &mut BlockQ2K) {
        const Q4SCALE: f32 = 15.0;
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 16];
        let mut weights = [0f32; 16];
        let mut mins = [0f32; 16];
        let mut scales = [0f32; 16];
        let mut max_scale = 0f32;
        let mut max_min = 0f32;
        for j in 0..16 {
            let xs: &[f32; 16] = x[16 * j..16 * j + 16].try_into().unwrap();
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(
                3,
                xs,
                &weights,
                (&mut l[16 * j..16 * j + 16]).try_into().unwrap(),
                &mut laux,
                -0.5,
                0.1,
                15,
                true,
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
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (ys, &s) in y.scales.iter_mut().zip(&scales) {
                *ys = nearest_int(iscale * s) as u8;
            }
            y.d = to_f16_le(max_scale / Q4SCALE);
        } else {
            y.scales = [0; 16];
            y.d = to_f16_le(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (ys, &m) in y.scales.iter_mut().zip(&mins) {
                *ys |= (nearest_int(iscale * m) << 4) as u8;
            }
            y.dmin = to_f16_le(max_min / Q4SCALE);
        } else {
            y.dmin = to_f16_le(0.0);
        }
        let (df, dminf) = (f16_le(y.d), f16_le(y.dmin));
        for j in 0..16 {
            let d = df * (y.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue; // keeps make_qkx2_quants' codes, as ggml does
            }
            let dm = dminf * (y.scales[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3);
                l[16 * j + ii] = q as u8;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let b = 128 * h + i;
                y.qs[32 * h + i] = l[b] | (l[b + 32] << 2) | (l[b + 64] << 4) | (l[b + 96] << 6);
            }
        }
    }
}
