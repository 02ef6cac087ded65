//! The CPU twins of W8A8 (FP8 activations per row, FP8 weights per row): part of the kernels'
//! numerics contract (`gpu::reference`, mounted there and re-exported).

use crate::converters::fp8::f32_to_e4m3;
use crate::gpu::reference::E4M3;
use rayon::prelude::*;

/// Per-row FP8 activation quantization: `(codes [kp], scale)`; `scale = amax / 448`, codes
/// `e4m3_rne_sat(x / scale)`, zero padding; an all-zero row gets scale 0 and codes 0.
pub fn quantize_row_fp8(x: &[f32], kp: usize) -> (Vec<u8>, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax / 448.0;
    let mut q = vec![0u8; kp];
    if scale != 0.0 {
        for (c, &v) in q.iter_mut().zip(x) {
            *c = f32_to_e4m3(v / scale);
        }
    }
    (q, scale)
}

/// One output row of the W8A8 product: `y[j] = sx * sw[j] * sum_i e4m3(q[i]) * e4m3(w[j][i])`.
pub fn w8a8_row(q: &[u8], sx: f32, w: &[u8], sw: &[f32], n: usize, kp: usize, y: &mut [f32]) {
    let lut = &*E4M3;
    let qf: Vec<f64> = q[..kp].iter().map(|&c| lut[c as usize]).collect();
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let acc: f64 = w[j * kp..(j + 1) * kp]
            .iter()
            .zip(&qf)
            .map(|(&c, &a)| lut[c as usize] * a)
            .sum();
        *out = (acc * sx as f64 * sw[j] as f64) as f32;
    });
}
