//! The test-data helpers of the `ggml` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay as a mix of engine types, as llama-quantize mixes
//! them.

use crate::GgmlType;
use crate::converters::layouts::{pad, round_up};
use crate::converters::{encode_to_vec, q4_0::Q4_0, q4_k::Q4K, q8_0::Q8_0};
use crate::ffn::{DenseFfnLayer, GgmlWeight};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

/// Where a block of engine type `ty` keeps its f16 scales (and mins or offsets).
fn half_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[0],
        GgmlType::IQ3_XXS | GgmlType::IQ3_S | GgmlType::IQ1_S => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// `n` rows of `k` values of engine type `ty` (`k` whole blocks): random bytes, each block's
/// f16 fields set to halves of magnitude 2^-12 .. 2^-4 and either sign (IQ1_M's d, spread over
/// its scale words, too; MXFP4's E8M0 exponent to 2^-12 .. 2^3; NVFP4's UE4M3 scales to
/// 2^-10 .. 2^-1 with any mantissa and bit 7, which ggml ignores; NF4's f32 absmax like the
/// halves), so every code pattern occurs
/// and every value is finite.
pub fn ggml_random_blocks(r: &mut Rand, ty: GgmlType, n: usize, k: usize) -> Vec<u8> {
    let bytes = ty.block_bytes() as usize;
    let mut w: Vec<u8> = (0..n * k / ty.block_elems() as usize * bytes)
        .map(|_| r.next_u64() as u8)
        .collect();
    for blk in w.chunks_exact_mut(bytes) {
        for &at in half_fields(ty) {
            let mag = 2f32.powf(-12.0 + 8.0 * (r.next_u64() % 1024) as f32 / 1024.0);
            let v = if r.next_u64() & 1 == 0 { mag } else { -mag };
            blk[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        if ty == GgmlType::MXFP4 {
            blk[0] = 116 + (r.next_u64() % 16) as u8;
        }
        if ty == GgmlType::NF4 {
            // Its f32 absmax: 2^-12 .. 2^-4, either sign.
            let mag = 2f32.powf(-12.0 + 8.0 * (r.next_u64() % 1024) as f32 / 1024.0);
            let v = if r.next_u64() & 1 == 0 { mag } else { -mag };
            blk[..4].copy_from_slice(&v.to_le_bytes());
        }
        if ty == GgmlType::NVFP4 {
            for d in &mut blk[..4] {
                let x = r.next_u64();
                *d = ((1 + x % 10) << 3) as u8 | (x >> 8) as u8 & 0x87;
            }
        }
        if ty == GgmlType::IQ1_M {
            // Its f16 d is the top nibbles of its four scale words (first word lowest).
            let mag = 2f32.powf(-12.0 + 8.0 * (r.next_u64() % 1024) as f32 / 1024.0);
            let v = if r.next_u64() & 1 == 0 { mag } else { -mag };
            let d = half::f16::from_f32(v).to_bits();
            for i in 0..4 {
                let at = 48 + 2 * i + 1;
                blk[at] = (blk[at] & 0x0F) | (((d >> (4 * i)) & 15) as u8) << 4;
            }
        }
    }
    w
}

/// Install the `ggml` overlay with gate, up and down of the engine types `types`: this crate's
/// quantizers where it has one (Q4_0, Q4_K, Q8_0; rows zero-padded to whole blocks of 32),
/// random blocks of the type otherwise (what `bench-gpu` times: the bytes, not the values; rows
/// of whole blocks).
pub fn install_ggml_types(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
    types: [GgmlType; 3],
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let mut r = Rand(types.iter().map(|t| *t as u64).sum());
    let mut up = |x: &[f32], n: usize, k: usize, ty: GgmlType| -> GpuResult<GgmlWeight> {
        let (blocks, kp) = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::Q8_0 => {
                let kp = round_up(k, 32);
                (ggml_blocks(&pad(x, n, k, n, kp), ty), kp)
            }
            _ => (ggml_random_blocks(&mut r, ty, n, k), k),
        };
        GgmlWeight::new(alloc_upload(b, &blocks)?, ty, n, k, kp, 1.0)
    };
    let [tg, tu, td] = types;
    let (g, u) = (up(&w.gate, i, h, tg)?, up(&w.up, i, h, tu)?);
    layer.set_ggml_weights(g, u, up(&w.down, h, i, td)?)
}

/// `x` (`[n, k]`) as GGUF blocks of `ty` (Q4_0, Q4_K or Q8_0: this crate's quantizers).
pub fn ggml_blocks(x: &[f32], ty: GgmlType) -> Vec<u8> {
    match ty {
        GgmlType::Q4_0 => encode_to_vec::<Q4_0>(x),
        GgmlType::Q4_K => encode_to_vec::<Q4K>(x),
        GgmlType::Q8_0 => encode_to_vec::<Q8_0>(x),
        _ => unreachable!("ggml_blocks: {ty:?} has no quantizer here (libgguf's in the tests)"),
    }
}

/// Install the `ggml` overlay: gate as Q4_K (Q4_0 where rows are not whole super-blocks), up as
/// Q4_0, down as Q8_0, rows zero-padded to whole blocks of 32.
pub fn install_ggml(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    // Q4_K where the gate's rows are whole super-blocks.
    let gate = if w.hidden.is_multiple_of(256) {
        GgmlType::Q4_K
    } else {
        GgmlType::Q4_0
    };
    install_ggml_types(b, layer, w, [gate, GgmlType::Q4_0, GgmlType::Q8_0])
}
