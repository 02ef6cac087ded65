//! `lora`: a PEFT LoRA adapter for the FFN projections, for the engine's `set_lora_weights`
//! (NVFP4 base only). Per projection: part `a` = `lora_A` `[r, in]` and part `b` = `lora_B`
//! `[out, r]`, both BF16 row-major (nearest even); scalar `scaling` = `lora_alpha / r`.
//! The adapter's effect is `dW = scaling * B @ A`, applied as `y += scaling * B (A x)`.

use crate::converters::layouts::Encoded;

/// The largest adapter rank a `lora` layout holds: the runtime's `lora_xa` scratch in the arena
/// is sized by it.
pub const LORA_MAX_RANK: usize = 256;
use crate::converters::bf16;

/// Encode A `[r, k]` and B `[n, r]`.
pub fn encode(a: &[f32], b: &[f32], n: usize, k: usize, r: usize, scaling: f32) -> Encoded {
    assert_eq!(a.len(), r * k);
    assert_eq!(b.len(), n * r);
    Encoded {
        parts: vec![("a", bf16::encode(a)), ("b", bf16::encode(b))],
        padded: [n, k],
        scalars: vec![("scaling", scaling), ("rank", r as f32)],
    }
}

/// Decode the adapter's dense delta `scaling * B @ A`, f32 `[n, k]`, accumulated in f64.
pub fn decode_delta(a: &[u8], b: &[u8], n: usize, k: usize, r: usize, scaling: f32) -> Vec<f32> {
    let f = |v: &[u8]| -> Vec<f32> {
        v.chunks_exact(2)
            .map(|x| bf16::to_f32(u16::from_le_bytes([x[0], x[1]])))
            .collect()
    };
    let (a, b) = (f(a), f(b));
    let mut out = vec![0f32; n * k];
    for i in 0..n {
        for j in 0..k {
            let s: f64 = (0..r)
                .map(|t| b[i * r + t] as f64 * a[t * k + j] as f64)
                .sum();
            out[i * k + j] = (s * scaling as f64) as f32;
        }
    }
    out
}
