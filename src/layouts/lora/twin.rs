//! The CPU twins of LoRA (the A and B products): part of the kernels' numerics contract
//! (`gpu::reference`, mounted there and re-exported).

use crate::converters::bf16;

/// LoRA's first product for one activation row: `xa[t] = sum_i bf16(A[t, i]) * x[i]`, `t < r`
/// (A the `lora` layout's part `a`, BF16 `[r, k]`).
pub fn lora_a_row(x: &[f32], a: &[u8], k: usize, r: usize) -> Vec<f32> {
    (0..r)
        .map(|t| {
            let row = &a[2 * t * k..2 * (t + 1) * k];
            row.chunks_exact(2)
                .zip(x)
                .map(|(w, &xv)| bf16::to_f32(u16::from_le_bytes([w[0], w[1]])) as f64 * xv as f64)
                .sum::<f64>() as f32
        })
        .collect()
}

/// LoRA's second product added into one output row: `y[j] += scaling * sum_t bf16(B[j, t]) *
/// xa[t]` (B the part `b`, BF16 `[n, r]`); the sum in f64, one f32 rounding, one f32 add.
pub fn lora_b_row(xa: &[f32], b: &[u8], n: usize, r: usize, scaling: f32, y: &mut [f32]) {
    for (j, out) in y[..n].iter_mut().enumerate() {
        let s: f64 = b[2 * j * r..2 * (j + 1) * r]
            .chunks_exact(2)
            .zip(xa)
            .map(|(w, &v)| bf16::to_f32(u16::from_le_bytes([w[0], w[1]])) as f64 * v as f64)
            .sum();
        *out += (scaling as f64 * s) as f32;
    }
}
