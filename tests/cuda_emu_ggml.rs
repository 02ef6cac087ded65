//! The block-format engine's GEMV (`ggml_gemv`, `src/layouts/ggml/kernels.cu`) on the C++
//! emulator (`tests/cuda_emu/harness.rs`) against its twin (`reference::ggml_gemv_row`) bit for
//! bit, for every type of the engine, on random blocks (every code pattern; scales and mins
//! of both signs), 1 to 4 activation rows, rows shorter and longer than a warp's 32 blocks; and
//! the twin against the float64 product of the decoded weights (`converters::decode_ggml`, as
//! gguf-py decodes) with the activations.

#[path = "cuda_emu/harness.rs"]
mod harness;
use harness::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::layouts::ggml::TYPES;
use metrale_pack::gpu::reference;
use metrale_pack::gpu::sizes::{
    GGML_GEMV_MAX_M, GGML_GEMV_SPLIT_M, GGML_GEMV_SPLIT4_M, GGML_GEMV1_WARPS, Q8_1_BYTES,
    Q8_1_ELEMS,
};
use metrale_pack::testing::{Rand, ggml_random_blocks, rel_err};

/// The launch's second projection's output scale (llama.cpp's per-tensor `.scale`), not 1.
const SECOND_SCALE: f32 = -0.375;

#[test]
fn the_engine_gemv_is_its_twin_bit_for_bit_for_every_type() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(56);
    // 512 values: 16 blocks a row (lanes left idle); 2304: 72 (lanes take 2 or 3); 4864: 152
    // (three stages of 64 blocks, the last partial); 800: 25 (rows not of whole 16-byte
    // words, the buffer's last word partial; the 32-value types only).
    for (n, k) in [(12usize, 512usize), (9, 2304), (5, 4864), (6, 800)] {
        let x = r.vec(GGML_GEMV_MAX_M * k, 1.0);
        let xq: Vec<u8> = (0..GGML_GEMV_MAX_M)
            .flat_map(|row| reference::quantize_row_q8_1_act(&x[row * k..(row + 1) * k], k))
            .collect();
        for ty in TYPES
            .into_iter()
            .filter(|t| k % t.block_elems() as usize == 0)
        {
            let w = ggml_random_blocks(&mut r, ty, n, k);
            // The second projection of the launch: Q8_0 (every type runs beside another).
            let w2 = ggml_random_blocks(&mut r, GgmlType::Q8_0, n, k);
            // The shared-activation form (`ggml_gemv_sa`) on 3 and 8 rows, the cp.async
            // one-row form (`ggml_gemv1`) on one, its few-row form (`ggml_gemv_split`) on one
            // and its most, the same for four (`ggml_gemv_split4`) on 3 and 4.
            let runs = [1, 2, 3, 4, 5, 8]
                .map(|m| ("ggml_gemv", m))
                .into_iter()
                .chain([3, 8].map(|m| ("ggml_gemv_sa", m)))
                .chain([1, GGML_GEMV_SPLIT_M].map(|m| ("ggml_gemv_split", m)))
                .chain([3, GGML_GEMV_SPLIT4_M].map(|m| ("ggml_gemv_split4", m)))
                .chain([("ggml_gemv1", 1)]);
            let row_q8 = k / Q8_1_ELEMS * Q8_1_BYTES;
            for (kernel, m) in runs {
                let ldy = n + 3;
                // `ggml_gemv1` and `ggml_gemv_split` read their rows split
                // (`quantize_act_q8_1s`).
                let split =
                    kernel.starts_with("ggml_gemv1") || kernel.starts_with("ggml_gemv_split");
                let input = if split {
                    reference::q8_1_split(&xq[..m * row_q8], m, k)
                } else {
                    xq.clone()
                };
                let mut a = [
                    A::P(input),
                    A::I(m),
                    A::P(w.clone()),
                    A::I(ty as usize),
                    A::F(1.0),
                    A::P(vec![0xA5; m * ldy * 4]),
                    A::P(w2.clone()),
                    A::I(GgmlType::Q8_0 as usize),
                    A::F(SECOND_SCALE),
                    A::P(vec![0xA5; m * ldy * 4]),
                    A::I(2),
                    A::I(n),
                    A::I(k),
                    A::I(ldy),
                ];
                // A warp per weight row: 8 a block, or the one-row form's GGML_GEMV1_WARPS.
                let warps = if split { GGML_GEMV1_WARPS } else { 8 };
                launch(exe, kernel, (n.div_ceil(warps), 2), 32 * warps, &mut a);
                for (wb, t, sc, at) in [(&w, ty, 1.0, 5), (&w2, GgmlType::Q8_0, SECOND_SCALE, 9)] {
                    let got = bf32(buf(&a[at]));
                    for row in 0..m {
                        let mut want = vec![0f32; n];
                        reference::ggml_gemv_row(&xq[row * row_q8..], wb, t, sc, [n, k], &mut want);
                        let g = &got[row * ldy..row * ldy + n];
                        assert!(
                            want.iter().zip(g).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{kernel} {} (beside {}) [{n}, {k}] m {m} row {row}: {g:?} != {want:?}",
                            t.name(),
                            ty.name()
                        );
                        // Past n in each row: untouched.
                        assert!(
                            got[row * ldy + n..(row + 1) * ldy]
                                .iter()
                                .all(|v| v.to_bits() == 0xA5A5A5A5)
                        );
                    }
                }
            }
        }
    }
}

/// `k` activations that q8_1 holds exactly: per block of 32 a power-of-two scale `d` times
/// integers, one of them 127 (so `d = amax / 127` exactly) and the rest within 60 (so the
/// block's sum, at most 127 + 31 * 60 < 2048 times `d`, is exact in f16).
fn q8_1_exact(r: &mut Rand, k: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(k);
    for _ in 0..k / 32 {
        let d = 2f32.powi(-((r.next_u64() % 8) as i32) - 4);
        let at = (r.next_u64() % 32) as usize;
        for l in 0..32 {
            let q = if l == at {
                127
            } else {
                (r.next_u64() % 121) as i32 - 60
            };
            x.push(q as f32 * d);
        }
    }
    x
}

#[test]
fn the_engine_twin_is_the_decoded_product_to_f32_rounding() {
    let mut r = Rand(57);
    let (n, k) = (16usize, 1024usize);
    let x = q8_1_exact(&mut r, k);
    let xq = reference::quantize_row_q8_1_act(&x, k);
    // The activations survive q8_1 whole: the error below is the weights' path alone.
    let back: Vec<f32> = xq
        .chunks_exact(Q8_1_BYTES)
        .flat_map(|b| {
            let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            b[4..]
                .iter()
                .map(move |&q| q as i8 as f32 * d)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(back, x);
    for ty in TYPES {
        let w = ggml_random_blocks(&mut r, ty, n, k);
        let mut dec = vec![0f32; n * k];
        metrale_pack::converters::decode_ggml(ty, &w, &mut dec).unwrap();
        let want: Vec<f64> = (0..n)
            .map(|j| (0..k).map(|e| dec[j * k + e] as f64 * x[e] as f64).sum())
            .collect();
        let mut got = vec![0f32; n];
        reference::ggml_gemv_row(&xq, &w, ty, 1.0, [n, k], &mut got);
        let err = rel_err(&got, &want);
        println!("{}: {err:.2e} against the float64 product", ty.name());
        // f32 scale products and sums over 1024 values: 4e-8 .. 9e-8 measured; 1e-6. NF4's
        // dot product takes its table times 2^13 rounded (within 5.7e-5 of the absmax, about
        // 3e-5 of an RMS weight a value): 3e-4.
        let tol = if ty == GgmlType::NF4 { 3e-4 } else { 1e-6 };
        assert!(err < tol, "{}: {err:.2e}", ty.name());
    }
}

/// The prefill's dequantization (`ggml_dequant_bf16`) on the emulator against its twin, the
/// converters' decode (gguf-py's, bit for bit) rounded to BF16, bit for bit, every type.
#[test]
fn the_engine_dequantization_is_gguf_py_s_decode_in_bf16_for_every_type() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(58);
    let (n, k) = (5usize, 768usize);
    for (i, ty) in TYPES.into_iter().enumerate() {
        let w = ggml_random_blocks(&mut r, ty, n, k);
        // Every other type with an output scale (llama.cpp's per-tensor `.scale`).
        let sc = if i % 2 == 0 { 1.0 } else { -0.6875 };
        let mut a = [
            A::P(w.clone()),
            A::I(ty as usize),
            A::F(sc),
            A::I(n),
            A::I(k),
            A::P(vec![0xA5; n * k * 2]),
        ];
        launch(
            exe,
            "ggml_dequant_bf16",
            ((n * k / 32).div_ceil(256), 1),
            256,
            &mut a,
        );
        let want: Vec<u8> = reference::ggml_dequant_bf16(&w, ty, sc, n, k)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert!(buf(&a[5]) == want.as_slice(), "{}", ty.name());
    }
}

/// The gated product's q8_1 blocks in one launch (`quantize_act_mul_q8_1`, the `ggml` arms'
/// down input; `quantize_act_mul_q8_1s` split, the one-row GEMV's) against the twin's product
/// then its quantizer, bit for bit, SiLU and GELU, a row stride past the row and a padded row
/// (k = 200 of kp = 224).
#[test]
fn the_fused_act_mul_quantizer_is_its_twin_bit_for_bit() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(57);
    let (m, k, ld, kp) = (3usize, 200usize, 208usize, 224usize);
    let (g, u) = (r.vec(m * ld, 3.0), r.vec(m * ld, 1.0));
    for (act, f, kernel) in [
        (
            0usize,
            reference::silu_mul as fn(f32, f32) -> f32,
            "quantize_act_mul_q8_1",
        ),
        (1, reference::gelu_mul, "quantize_act_mul_q8_1"),
        (0, reference::silu_mul, "quantize_act_mul_q8_1s"),
        (1, reference::gelu_mul, "quantize_act_mul_q8_1s"),
    ] {
        let mut a = [
            A::P(f32b(&g)),
            A::P(f32b(&u)),
            A::I(act),
            A::I(m),
            A::I(k),
            A::I(ld),
            A::I(kp),
            A::P(vec![0xA5; m * kp / Q8_1_ELEMS * Q8_1_BYTES]),
        ];
        launch(exe, kernel, ((kp / 32).div_ceil(8), m), 256, &mut a);
        let want: Vec<u8> = (0..m)
            .flat_map(|i| {
                let row: Vec<f32> = (0..k).map(|e| f(g[i * ld + e], u[i * ld + e])).collect();
                reference::quantize_row_q8_1_act(&row, kp)
            })
            .collect();
        let want = if kernel.ends_with('s') {
            reference::q8_1_split(&want, m, kp)
        } else {
            want
        };
        assert!(buf(&a[7]) == want, "{kernel} act {act}");
    }
}
