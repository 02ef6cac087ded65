//! CI has no GPU, so it runs these kernel modules' CUDA sources as C++ on the host instead:
//! `ffn_q8_1`, `ffn_q2g128`, `ffn_q4k_mmq` (its MMQ GEMMs, encoders and decode GEMVs), `ffn_lora`, the NVFP4 GEMVs (on an m16n8k16 bf16 MMA
//! stand-in) with `w4a16_gemv_ksplit`, the FP8, BF16 and affine GEMVs, and the emulable part of
//! `common.cuh`, including the int8 MMQ tile (`tests/cuda_emu_w8a8.rs` runs the W8A8 kernels).
//! The stand-ins for the CUDA builtins they use are in `tests/cuda_emu/prelude.h`: one IEEE
//! operation each, `-ffp-contract=off`, m16n8k32 int8 and m16n8k16 bf16 MMAs with the PTX
//! fragment layout, and an E4M3 encoder (round to nearest even, saturating). A block runs as host
//! threads with real barriers for `__syncthreads`, the warp shuffles and the MMAs. Each kernel is
//! launched over its whole grid and compared with the CPU twins: bit for bit where the contract
//! says so (the Q4_K and int8 encoders, the q8_1, int8 and FP8 activation quantizers, the BF16
//! dequantization), within 2e-6 of the f64 references otherwise. This catches indexing,
//! launch-shape and operation-order mistakes without a GPU.
//! It does not model the device compiler: on the H200, byte stores of the q8_1 f16 header lost
//! their low bytes, and only `gpu-check` there, which repeats every comparison, caught it.

#[path = "cuda_emu/harness.rs"]
mod harness;
use harness::*;
use metrale_pack::converters::layouts;
use metrale_pack::gpu::reference;
use metrale_pack::testing::{Rand, rel_err};
use std::path::Path;

const N: usize = 40; // output rows: not a multiple of 8 (GEMV blocks) or 256
const K: usize = 576; // not a multiple of 128 or 256: padding everywhere

#[test]
fn encoders_match_the_converter_byte_for_byte() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(97);
    // (rows, k): k not a multiple of 256, exactly 256, and 64 x 4096 (where a reassociated product
    // in the Q4_K search shows).
    for (n, k) in [(5usize, 576usize), (3, 256), (64, 4096)] {
        let mut w = r.vec(n * k, 0.05);
        // Row 0 all zero; row 1 one outlier; row 2 constant: the encoders' edge cases.
        w[..k].fill(0.0);
        w[k + 7] = 3.0;
        w[2 * k..3 * k].fill(-0.02);
        let e = layouts::nvfp4::encode(&w, n, k);
        let (codes, scales, g, kp_nv) = (
            e.parts[0].1.clone(),
            e.parts[1].1.clone(),
            e.scalars[0].1,
            e.padded[1],
        );
        let values = layouts::crop(
            &layouts::nvfp4::decode_padded(&codes, &scales, g, n, kp_nv),
            kp_nv,
            n,
            k,
        );
        let want = layouts::q4k_mmq::encode_q4k(&values, n, k);
        let kp_q = want.padded[1];
        let mut a = [
            A::P(codes.clone()),
            A::P(scales.clone()),
            A::F(g),
            A::I(n),
            A::I(k),
            A::I(kp_nv),
            A::I(kp_q),
            A::P(vec![0xA5; n * kp_q / 256 * 144]),
        ];
        launch(
            exe,
            "nvfp4_to_q4k",
            ((n * kp_q / 256).div_ceil(64), 1),
            64,
            &mut a,
        );
        let (got, want) = (buf(&a[7]), &want.parts[0].1);
        if let Some(i) = got.iter().zip(want.iter()).position(|(x, y)| x != y) {
            panic!(
                "nvfp4_to_q4k [{n}, {k}]: byte {i} (row {}, block {}, offset {}) is {:#04x}, the converter's {:#04x}",
                i / (kp_q / 256 * 144),
                i / 144 % (kp_q / 256),
                i % 144,
                got[i],
                want[i]
            );
        }
        let want8 = layouts::q4k_mmq::encode_int8(&values, n, k);
        let mut a = [
            A::P(codes),
            A::P(scales),
            A::F(g),
            A::I(n),
            A::I(k),
            A::I(kp_nv),
            A::I(kp_q),
            A::P(vec![0xA5; n * kp_q]),
            A::P(vec![0xA5; n * 4]),
        ];
        launch(exe, "nvfp4_to_int8_rows", (n, 1), 256, &mut a);
        assert!(buf(&a[7]) == want8.parts[0].1, "int8 codes [{n}, {k}]");
        assert!(buf(&a[8]) == want8.parts[1].1, "int8 scales [{n}, {k}]");
    }
}

#[test]
fn activation_quantizers_match_their_cpu_twins_bit_for_bit() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(5);
    let m = 5;
    let mut x = r.vec(m * K, 1.0);
    x[K..2 * K].fill(0.0); // an all-zero row
    x[2 * K + 3] = 40.0; // an outlier
    let kp = 640;
    let mut a = [
        A::P(f32b(&x)),
        A::I(m),
        A::I(K),
        A::I(kp),
        A::P(vec![0xA5; m * kp / 32 * 36]),
    ];
    launch(
        exe,
        "quantize_act_q8_1",
        ((kp / 32).div_ceil(8), m),
        256,
        &mut a,
    );
    let want: Vec<u8> = (0..m)
        .flat_map(|i| reference::quantize_row_q8_1_act(&x[i * K..(i + 1) * K], kp))
        .collect();
    assert!(buf(&a[4]) == want, "quantize_act_q8_1");
    // The same blocks split (the one-row engine GEMV's input).
    a[4] = A::P(vec![0xA5; m * kp / 32 * 36]);
    launch(
        exe,
        "quantize_act_q8_1s",
        ((kp / 32).div_ceil(8), m),
        256,
        &mut a,
    );
    assert!(
        buf(&a[4]) == reference::q8_1_split(&want, m, kp),
        "quantize_act_q8_1s"
    );
    let kp = 768;
    let mut a = [
        A::P(f32b(&x)),
        A::I(m),
        A::I(K),
        A::I(kp),
        A::P(vec![0xA5; m * kp]),
        A::P(vec![0xA5; m * 4]),
    ];
    launch(exe, "requant_a_bf16_int8", (m, 1), 256, &mut a);
    for i in 0..m {
        let (q, d) = reference::requant_row_bf16_int8(&x[i * K..(i + 1) * K], kp);
        assert!(
            buf(&a[4])[i * kp..(i + 1) * kp] == q[..],
            "requant codes row {i}"
        );
        assert_eq!(
            bf32(buf(&a[5]))[i].to_bits(),
            d.to_bits(),
            "requant scale row {i}"
        );
    }
}

#[test]
fn q2_kernels_match_the_references() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(11);
    let w = r.vec(N * K, 0.05);
    let e = layouts::q2g128::encode(&w, N, K);
    let (blocks, kp) = (e.parts[0].1.clone(), e.padded[1]);
    let x = r.vec(4 * K, 1.0);
    for (name, m) in [("q2g128_gemv", 1usize), ("q2g128_gemv_batchm", 3)] {
        let mut a = [
            A::P(f32b(&x)),
            A::I(m),
            A::P(blocks.clone()),
            A::P(f32b(&vec![f32::NAN; m * N])),
            A::I(N),
            A::I(K),
            A::I(kp),
            A::I(N),
        ];
        launch(exe, name, (N.div_ceil(8), 1), 256, &mut a);
        let want = rows64(m, N, |i, row| {
            reference::q2_row(&x[i * K..(i + 1) * K], &blocks, N, K, kp, row)
        });
        let err = rel_err(&bf32(buf(&a[3])), &want);
        assert!(err < 2e-6, "{name}: {err}");
    }
    let mut a = [
        A::P(blocks.clone()),
        A::I(N),
        A::I(kp),
        A::P(vec![0xA5; N * kp * 2]),
    ];
    launch(
        exe,
        "q2g128_dequant_bf16",
        ((N * kp / 128 * 32).div_ceil(256), 1),
        256,
        &mut a,
    );
    assert!(
        buf(&a[3]) == reference::q2_dequant_bf16(&blocks, N, kp),
        "dequant bytes"
    );
    // MMQ over the twin's q8_1 blocks (their bits are checked above).
    let m = 5;
    let xm = r.vec(m * K, 1.0);
    assert_mmq_q8_1(
        exe,
        "q2g128_mmq_gemm",
        &xm,
        m,
        &blocks,
        kp,
        reference::q2_mmq_row,
    );
}

/// Launch the q8_1 MMQ GEMM `name` over the CPU twin's q8_1 blocks of `x` (`m` rows of `K`)
/// and weight `w` (`N` rows, padded k `kp`), and compare with the f64 `reference` row.
fn assert_mmq_q8_1(
    exe: &Path,
    name: &str,
    x: &[f32],
    m: usize,
    w: &[u8],
    kp: usize,
    reference: fn(&[u8], &[u8], usize, usize, &mut [f32]),
) {
    let bs = kp / 32 * 36;
    let xq: Vec<u8> = (0..m)
        .flat_map(|i| reference::quantize_row_q8_1_act(&x[i * K..(i + 1) * K], kp))
        .collect();
    let mut a = [
        A::P(xq.clone()),
        A::I(m),
        A::P(w.to_vec()),
        A::P(f32b(&vec![f32::NAN; m * N])),
        A::I(N),
        A::I(kp),
        A::I(N),
    ];
    launch(exe, name, (N.div_ceil(128), m.div_ceil(64)), 128, &mut a);
    let want = rows64(m, N, |i, row| {
        reference(&xq[i * bs..(i + 1) * bs], w, N, kp, row)
    });
    let err = rel_err(&bf32(buf(&a[3])), &want);
    assert!(err < 2e-6, "{name}: {err}");
}

#[test]
fn q4k_and_int8_gemms_and_lora_match_the_references() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(13);
    let w = r.vec(N * K, 0.05);
    let q = layouts::q4k_mmq::encode_q4k(&w, N, K);
    let (qw, kp) = (q.parts[0].1.clone(), q.padded[1]);
    let m = 70; // two row tiles of the MMQ GEMMs (64 + 6)
    let x = r.vec(m * K, 1.0);
    assert_mmq_q8_1(exe, "q4k_mmq_gemm", &x, m, &qw, kp, reference::q4k_mmq_row);
    // int8 rows x int8 activations.
    let e8 = layouts::q4k_mmq::encode_int8(&w, N, K);
    let sw = bf32(&e8.parts[1].1);
    let (aq, sa): (Vec<u8>, Vec<f32>) = (0..m)
        .map(|i| reference::requant_row_bf16_int8(&x[i * K..(i + 1) * K], kp))
        .fold((Vec::new(), Vec::new()), |(mut c, mut s), (q, d)| {
            c.extend(q);
            s.push(d);
            (c, s)
        });
    let mut a = [
        A::P(aq.clone()),
        A::P(f32b(&sa)),
        A::I(m),
        A::P(e8.parts[0].1.clone()),
        A::P(e8.parts[1].1.clone()),
        A::P(f32b(&vec![f32::NAN; m * N])),
        A::I(N),
        A::I(kp),
        A::I(N),
    ];
    launch(
        exe,
        "q4k_mmq_int8_down_gemm",
        (N.div_ceil(128), m.div_ceil(64)),
        128,
        &mut a,
    );
    let want = rows64(m, N, |i, row| {
        reference::int8_row(
            &aq[i * kp..(i + 1) * kp],
            sa[i],
            &e8.parts[0].1,
            &sw,
            N,
            kp,
            row,
        )
    });
    let err = rel_err(&bf32(buf(&a[5])), &want);
    assert!(err < 2e-6, "q4k_mmq_int8_down_gemm: {err}");
    // LoRA: xa = A x, then y += scaling * B xa on top of an existing output.
    let rank = 12;
    let le = layouts::lora::encode(
        &r.vec(rank * K, 0.1),
        &r.vec(N * rank, 0.5),
        N,
        K,
        rank,
        0.25,
    );
    let (am, bm) = (le.parts[0].1.clone(), le.parts[1].1.clone());
    let mut a = [
        A::P(f32b(&x)),
        A::I(m),
        A::I(K),
        A::I(K),
        A::P(am.clone()),
        A::I(rank),
        A::P(f32b(&vec![f32::NAN; m * rank])),
    ];
    launch(exe, "lora_a", (rank.div_ceil(8), m), 256, &mut a);
    let xa_got = bf32(buf(&a[6]));
    let want: Vec<f64> = (0..m)
        .flat_map(|i| reference::lora_a_row(&x[i * K..(i + 1) * K], &am, K, rank))
        .map(|v| v as f64)
        .collect();
    let err = rel_err(&xa_got, &want);
    assert!(err < 2e-6, "lora_a: {err}");
    let y0 = r.vec(m * N, 1.0);
    let mut a = [
        A::P(f32b(&xa_got)),
        A::I(m),
        A::I(rank),
        A::P(bm.clone()),
        A::F(0.25),
        A::P(f32b(&y0)),
        A::I(N),
        A::I(N),
    ];
    launch(exe, "lora_b_add", (N.div_ceil(256), m), 256, &mut a);
    let want = rows64(m, N, |i, row| {
        row.copy_from_slice(&y0[i * N..(i + 1) * N]);
        reference::lora_b_row(&xa_got[i * rank..(i + 1) * rank], &bm, N, rank, 0.25, row)
    });
    let err = rel_err(&bf32(buf(&a[5])), &want);
    assert!(err < 2e-6, "lora_b_add: {err}");
}

/// The q4k_mmq decode GEMVs over f32 activations: Q4_K rows (`q4k_gemv`, its batch-4 form) and
/// int8 rows with f32 row scales (`int8_rows_gemv`), at a k that is a multiple of 4 (16-byte
/// activation loads) and one that is not (element loads), each against the f64 twin.
#[test]
fn q4k_decode_gemvs_match_the_references() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(17);
    for k in [K, K - 6] {
        let w = r.vec(N * k, 0.05);
        let q = layouts::q4k_mmq::encode_q4k(&w, N, k);
        let (qw, kp) = (q.parts[0].1.clone(), q.padded[1]);
        let e8 = layouts::q4k_mmq::encode_int8(&w, N, k);
        let sw = bf32(&e8.parts[1].1);
        for (name, m) in [
            ("q4k_gemv", 1usize),
            ("q4k_gemv_batch4", 4),
            ("q4k_gemv_batch4", 3),
            ("int8_rows_gemv", 1),
            ("int8_rows_gemv_batch4", 2),
        ] {
            let x = r.vec(m * k, 1.0);
            let y0 = A::P(f32b(&vec![f32::NAN; m * N]));
            let dims = [A::I(N), A::I(k), A::I(kp), A::I(N)];
            let (mut a, yi): (Vec<A>, usize) = if name.starts_with("q4k") {
                let head = vec![A::P(f32b(&x)), A::I(m), A::P(qw.clone()), y0];
                (head.into_iter().chain(dims).collect(), 3)
            } else {
                let head = vec![
                    A::P(f32b(&x)),
                    A::I(m),
                    A::P(e8.parts[0].1.clone()),
                    A::P(e8.parts[1].1.clone()),
                    y0,
                ];
                (head.into_iter().chain(dims).collect(), 4)
            };
            use metrale_pack::gpu::sizes::*;
            let per_block = match name {
                "q4k_gemv" => Q4K_GEMV_ROWS,
                "q4k_gemv_batch4" => Q4K_GEMV_M_ROWS,
                "int8_rows_gemv" => INT8_GEMV_ROWS,
                _ => INT8_GEMV_M_ROWS,
            };
            launch(exe, name, (N.div_ceil(per_block), 1), 256, &mut a);
            let want = rows64(m, N, |i, row| {
                let xi = &x[i * k..(i + 1) * k];
                if name.starts_with("q4k") {
                    reference::q4k_row(xi, &qw, N, k, kp, row)
                } else {
                    reference::int8_rows_row(xi, &e8.parts[0].1, &sw, N, k, kp, row)
                }
            });
            let err = rel_err(&bf32(buf(&a[yi])), &want);
            assert!(err < 2e-6, "{name} k={k} m={m}: {err}");
        }
    }
}

#[test]
fn nvfp4_gemvs_including_the_k_split_match_the_reference() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(17);
    // Long rows (the k-split's case), k not a multiple of the 128-value chunk, and a row count
    // that leaves partial blocks.
    let (n, k) = (37usize, 8192usize + 576);
    let w = r.vec(n * k, 0.05);
    let e = layouts::nvfp4::encode(&w, n, k);
    let (codes, scales, g, kp) = (
        e.parts[0].1.clone(),
        e.parts[1].1.clone(),
        e.scalars[0].1,
        e.padded[1],
    );
    let x = r.vec(16 * k, 1.0);
    let rows = metrale_pack::ffn::NVFP4_GEMV_COLS;
    // The tensor-core GEMVs at 3 rows and the 16-row tier (two MMA column tiles) at 11.
    for (name, grid, m) in [
        ("w4a16_gemv", n.div_ceil(rows), 3),
        ("nvfp4_proj_small_m16", n.div_ceil(rows), 11),
        ("w4a16_gemv_ksplit", n.div_ceil(4), 3),
    ] {
        let round = metrale_pack::gpu::table::spec("ffn_nvfp4", name)
            .unwrap()
            .round;
        let want = rows64(m, n, |i, row| {
            reference::nvfp4_row(
                &x[i * k..(i + 1) * k],
                &codes,
                &scales,
                g,
                n,
                k,
                kp,
                round,
                row,
            )
        });
        let mut a = [
            A::P(f32b(&x[..m * k])),
            A::I(m),
            A::P(codes.clone()),
            A::P(scales.clone()),
            A::F(g),
            A::P(f32b(&vec![f32::NAN; m * n])),
            A::I(n),
            A::I(k),
            A::I(kp),
            A::I(n),
        ];
        let threads = metrale_pack::gpu::table::spec("ffn_nvfp4", name)
            .unwrap()
            .grid
            .threads;
        launch(exe, name, (grid, 1), threads, &mut a);
        let err = rel_err(&bf32(buf(&a[5])), &want);
        assert!(err < 2e-6, "{name}: {err}");
    }
    let m = 3;
    // The SiLU-fused down GEMV: x = silu(gate) * up formed in registers.
    let (gate, up) = (r.vec(m * k, 2.0), r.vec(m * k, 1.0));
    let act: Vec<f32> = gate
        .iter()
        .zip(&up)
        .map(|(&a, &b)| reference::silu_mul(a, b))
        .collect();
    let want = rows64(m, n, |i, row| {
        reference::nvfp4_row(
            &act[i * k..(i + 1) * k],
            &codes,
            &scales,
            g,
            n,
            k,
            kp,
            metrale_pack::gpu::table::spec("ffn_nvfp4", "w4a16_gemv_silu_down")
                .unwrap()
                .round,
            row,
        )
    });
    let mut a = [
        A::P(f32b(&gate)),
        A::P(f32b(&up)),
        A::I(m),
        A::P(codes.clone()),
        A::P(scales.clone()),
        A::F(g),
        A::P(f32b(&vec![f32::NAN; m * n])),
        A::I(n),
        A::I(k),
        A::I(kp),
        A::I(n),
        A::I(k),
    ];
    launch(
        exe,
        "w4a16_gemv_silu_down",
        (n.div_ceil(rows), 1),
        metrale_pack::gpu::sizes::NVFP4_GEMV_WARPS_ONE * 32,
        &mut a,
    );
    // expf on the host and in CUDA may differ in the last bit: 1e-5.
    let err = rel_err(&bf32(buf(&a[6])), &want);
    assert!(err < 1e-5, "w4a16_gemv_silu_down: {err}");
}

#[test]
fn fp8_tensor_core_gemvs_match_the_reference() {
    use metrale_pack::gpu::sizes::FP8_MMA_GEMV_ROWS;
    use metrale_pack::gpu::table::spec;
    let Some(exe) = emulator() else { return };
    let mut r = Rand(29);
    // Rows that leave a partial block and cut a 128-row scale band; k a multiple of 128 and k
    // ending 16 values into a 32-value lane span (a chunk partly past k). Weights spanning the
    // E4M3 subnormals (|w| / block max below 2^-6) and the top of the range.
    for (n, k) in [(150usize, 2176usize), (37, 2160)] {
        let mut w = r.vec(n * k, 0.05);
        for (i, v) in w.iter_mut().enumerate() {
            if i % 7 == 0 {
                *v *= 1e-5;
            }
        }
        let x = r.vec(16 * k, 1.0);
        let e = layouts::fp8::encode(&w, n, k);
        let (codes, scales, kp) = (e.parts[0].1.clone(), e.parts[1].1.clone(), e.padded[1]);
        let sf = bf32(&scales);
        for (name, m) in [
            ("w8a16_gemv_mma", 1usize),
            ("w8a16_gemv_mma", 3),
            ("w8a16_gemv_mma", 8),
            ("w8a16_gemv_mma_ilp", 1),
            ("w8a16_gemv_mma_ilp", 5),
        ] {
            let s = spec("ffn_fp8", name).unwrap();
            assert_eq!(s.round, reference::ActRound::Bf16, "{name}");
            let want = rows64(m, n, |i, row| {
                reference::fp8_block_row(
                    &x[i * k..(i + 1) * k],
                    &codes,
                    &sf,
                    n,
                    k,
                    kp,
                    s.round,
                    row,
                )
            });
            let mut a = [
                A::P(f32b(&x[..m * k])),
                A::I(m),
                A::P(codes.clone()),
                A::P(scales.clone()),
                A::P(f32b(&vec![f32::NAN; m * n])),
                A::I(n),
                A::I(k),
                A::I(kp),
                A::I(n),
            ];
            launch(
                exe,
                name,
                (n.div_ceil(FP8_MMA_GEMV_ROWS), 1),
                s.grid.threads,
                &mut a,
            );
            let err = rel_err(&bf32(buf(&a[4])), &want);
            assert!(err < 2e-6, "{name} n={n} k={k} m={m}: {err}");
        }
    }
}

#[test]
fn fp8_and_bf16_gemvs_match_the_reference() {
    use metrale_pack::gpu::table::spec;
    let Some(exe) = emulator() else { return };
    let mut r = Rand(23);
    // Rows that leave partial blocks and a 128-row scale band cut; k not a multiple of the
    // 512-value step (FP8) or the 1024-value unrolled step (BF16).
    let (n, k) = (150usize, 2176usize);
    let w = r.vec(n * k, 0.05);
    let x = r.vec(16 * k, 1.0);
    let e = layouts::fp8::encode(&w, n, k);
    let (codes, scales, kp) = (e.parts[0].1.clone(), e.parts[1].1.clone(), e.padded[1]);
    let sf = bf32(&scales);
    let mut outs = Vec::new();
    for (name, m, rows) in [
        (
            "w8a16_gemv_batch4",
            3usize,
            metrale_pack::gpu::sizes::FP8_GEMV_ROWS,
        ),
        ("w8a16_gemv_batch16", 13, 16),
        (
            "w8a16_gemv_batch4_cvt",
            3,
            metrale_pack::gpu::sizes::FP8_GEMV_ROWS,
        ),
    ] {
        let s = spec("ffn_fp8", name).unwrap();
        let want = rows64(m, n, |i, row| {
            reference::fp8_block_row(&x[i * k..(i + 1) * k], &codes, &sf, n, k, kp, s.round, row)
        });
        let mut a = [
            A::P(f32b(&x[..m * k])),
            A::I(m),
            A::P(codes.clone()),
            A::P(scales.clone()),
            A::P(f32b(&vec![f32::NAN; m * n])),
            A::I(n),
            A::I(k),
            A::I(kp),
            A::I(n),
        ];
        launch(exe, name, (n.div_ceil(rows), 1), s.grid.threads, &mut a);
        let err = rel_err(&bf32(buf(&a[4])), &want);
        assert!(err < 2e-6, "{name}: {err}");
        outs.push(buf(&a[4]).to_vec());
    }
    // The half-precision decode of w8a16_gemv_batch4 equals the per-byte conversion of
    // w8a16_gemv_batch4_cvt bit for bit (both at m = 3; every finite code is exact either way).
    assert_eq!(outs[0], outs[2], "w8a16_gemv_batch4 against its _cvt form");
    let e = layouts::bf16::encode(&w, n, k);
    let (wb, kp) = (e.parts[0].1.clone(), e.padded[1]);
    for (name, m, rows) in [
        (
            "bf16_gemv_batch4",
            4usize,
            metrale_pack::gpu::sizes::BF16_GEMV_ROWS,
        ),
        (
            "bf16_gemv_batch4",
            1,
            metrale_pack::gpu::sizes::BF16_GEMV_ROWS,
        ),
    ] {
        let s = spec("ffn_bf16", name).unwrap();
        let want = rows64(m, n, |i, row| {
            reference::bf16_row(&x[i * k..(i + 1) * k], &wb, n, k, kp, s.round, row)
        });
        let mut a = [
            A::P(f32b(&x[..m * k])),
            A::I(m),
            A::P(wb.clone()),
            A::P(f32b(&vec![f32::NAN; m * n])),
            A::I(n),
            A::I(k),
            A::I(kp),
            A::I(n),
        ];
        launch(exe, name, (n.div_ceil(rows), 1), s.grid.threads, &mut a);
        let err = rel_err(&bf32(buf(&a[3])), &want);
        assert!(err < 2e-6, "{name}: {err}");
    }
}

#[test]
fn stream_probe_reads_every_word_of_its_blocks() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(29);
    // 1000 words in blocks of 300: a partial last block, and more words per block than one
    // pass of 256 threads x PROBE_U loads covers only in the first block's second pass.
    let (count, per) = (1000usize, 300usize);
    let words: Vec<u8> = r
        .vec(count * 4, 1.0)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let blocks = count.div_ceil(per);
    let mut a = [
        A::P(words.clone()),
        A::I(count),
        A::I(per),
        A::P(vec![0xAB; blocks * 4]),
    ];
    launch(exe, "stream_probe", (blocks, 1), 256, &mut a);
    let want: Vec<u8> = reference::stream_probe(&words, per)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(buf(&a[3]), &want[..]);
    assert_eq!(want.len(), blocks * 4);
}

#[test]
fn blob_rules_finds_the_first_bad_element_of_every_kind_as_its_twin() {
    use reference::ElementRule as R;
    let Some(exe) = emulator() else { return };
    let mut r = Rand(31);
    // Valid elements of each rule, then one or two bad ones planted; every kind also once whole.
    let half = |v: f32| metrale_pack::converters::f16::from_f32(v).to_le_bytes();
    let rules = [
        R::Halves,
        R::ZeroPairs { bits: 4 },
        R::ZeroPairsF32 { bits: 8 },
        R::F32,
        R::E4m3,
    ];
    for rule in rules {
        let n = 5000usize;
        let mut p = Vec::with_capacity(n * rule.elem_bytes());
        for i in 0..n {
            let s = r.vec(1, 1.0)[0];
            let z = (i % (rule.top() + 1)) as f32;
            match rule {
                R::Halves => p.extend(half(s)),
                R::ZeroPairs { .. } => p.extend([half(s), half(z)].concat()),
                R::ZeroPairsF32 { .. } => p.extend([s.to_le_bytes(), z.to_le_bytes()].concat()),
                R::F32 => p.extend(s.to_le_bytes()),
                R::E4m3 => p.push((i % 127) as u8),
            }
        }
        let bads: Vec<(usize, Vec<u8>)> = match rule {
            R::Halves => vec![
                (4001, half(f32::INFINITY).to_vec()),
                (4500, vec![0x00, 0x7e]),
            ],
            R::ZeroPairs { .. } => vec![
                (3000, [half(1.0), half(16.0)].concat()),
                (3100, [half(f32::NAN), half(0.0)].concat()),
            ],
            R::ZeroPairsF32 { .. } => {
                vec![(2500, [1f32.to_le_bytes(), 2.5f32.to_le_bytes()].concat())]
            }
            R::F32 => vec![(4999, f32::NEG_INFINITY.to_le_bytes().to_vec())],
            R::E4m3 => vec![(1234, vec![0xff]), (2345, vec![0x7f])],
        };
        for planted in [false, true] {
            let mut q = p.clone();
            if planted {
                for (i, b) in &bads {
                    let e = rule.elem_bytes();
                    q[i * e..(i + 1) * e].copy_from_slice(b);
                }
            }
            let want = reference::blob_rules(&q, n, rule);
            assert_eq!(want == u32::MAX, !planted, "{rule:?}: the twin itself");
            if planted {
                assert_eq!(want as usize, bads[0].0, "{rule:?}");
            }
            let blocks = n.div_ceil(metrale_pack::gpu::table::RULES_BLOCK_ELEMS);
            let mut a = [
                A::P(q),
                A::I(n),
                A::I(rule.kind()),
                A::I(rule.top()),
                A::P(vec![0xff; 12]),
                A::I(1),
            ];
            launch(exe, "blob_rules", (blocks, 1), 256, &mut a);
            let got = buf(&a[4]);
            assert_eq!(
                &got[4..8],
                &want.to_le_bytes(),
                "{rule:?} planted {planted}"
            );
            assert_eq!(&got[..4], &[0xff; 4], "{rule:?}: another slot written");
        }
    }
}
