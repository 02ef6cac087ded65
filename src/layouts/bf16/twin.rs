//! The CPU twins of BF16: part of the kernels' numerics contract
//! (`gpu::reference`, mounted there and re-exported).

use crate::converters::bf16;
use crate::gpu::reference::*;
use rayon::prelude::*;

/// One output row of a BF16 weight product: `y[j] = sum_i bf16(w[j][i]) * a(x[i])`.
pub fn bf16_row(
    x: &[f32],
    w: &[u8],
    n: usize,
    k: usize,
    kp: usize,
    round: ActRound,
    y: &mut [f32],
) {
    let xr: Vec<f64> = x[..k].iter().map(|&v| round.apply(v) as f64).collect();
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let row = &w[2 * j * kp..2 * (j * kp + k)];
        let acc: f64 = row
            .chunks_exact(2)
            .zip(&xr)
            .map(|(wb, &xv)| bf16::to_f32(u16::from_le_bytes([wb[0], wb[1]])) as f64 * xv)
            .sum();
        *out = acc as f32;
    });
}
