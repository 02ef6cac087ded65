//! The `affine` kernels on the C++ emulator (`tests/cuda_emu/harness.rs`): the activation
//! quantizer, the GEMVs and the dequantization against their references for every test source
//! kind (act-order included); the GPU carries of GGUF blocks, AutoAWQ and GPTQ tensors writing
//! the converter's bytes and flagging what it refuses; `affine_gather_bf16` against its twin.

#[path = "cuda_emu/harness.rs"]
mod harness;
use harness::*;
use metrale_pack::gpu::reference;
use metrale_pack::testing::{Rand, rel_err};

#[test]
fn affine_from_gptq_writes_the_converters_bytes() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(41);
    // Groups of 128 in rows of 2176 (17 groups), and one group a row of 208 values (padded to
    // 256 with the row's zero point).
    for (n, k, group) in [(32usize, 2176usize, 128usize), (16, 208, 208)] {
        let x = r.vec(n * k, 0.3);
        for bits in [4, 8] {
            let ([qw, qz, sc], g) = metrale_pack::testing::gptq_tensors(&x, n, k, bits, group);
            let want = metrale_pack::converters::layouts::affine::from_groups(&g);
            let kp = want.padded[1];
            let sgroup = metrale_pack::testing::affine_scheme(&want).group;
            let ordered: Vec<u8> = (0..k)
                .flat_map(|i| ((i / group) as i32).to_le_bytes())
                .collect();
            for case in 0..4 {
                let (mut sc, mut qz, mut gi) = (sc.clone(), qz.clone(), ordered.clone());
                match case {
                    1 => sc[6..8].copy_from_slice(&half::f16::INFINITY.to_le_bytes()),
                    2 => qz[0] |= ((1u16 << bits) - 1) as u8,
                    3 => gi[..4].copy_from_slice(&1i32.to_le_bytes()),
                    _ => {}
                }
                let mut a = [
                    A::P(qw.clone()),
                    A::P(qz),
                    A::P(sc),
                    A::P(gi),
                    A::I(bits as usize),
                    A::I(n),
                    A::I(k),
                    A::I(kp),
                    A::I(group),
                    A::I(sgroup),
                    A::P(vec![0xA5; want.parts[0].1.len()]),
                    A::P(vec![0xA5; want.parts[1].1.len()]),
                    A::P(vec![0; 4]),
                ];
                let grid = ((n * kp / 32).div_ceil(256), 1);
                launch(exe, "affine_from_gptq", grid, 256, &mut a);
                let what = format!("[{n}, {k}] {bits}-bit case {case}");
                let flag = u32::from_le_bytes(buf(&a[12])[..4].try_into().unwrap());
                assert_eq!(flag, [0, 1, 2, 4][case], "{what}: flag");
                if case == 0 {
                    assert!(buf(&a[10]) == want.parts[0].1, "{what}: codes");
                    assert!(buf(&a[11]) == want.parts[1].1, "{what}: scale pairs");
                }
            }
        }
    }
}

#[test]
fn affine_gather_bf16_matches_its_twin() {
    let Some(exe) = emulator() else { return };
    // A row staged in shared memory, and one longer than the stage (read from global memory);
    // the input and each act-mul, through the permutation and in order; rows at a stride past k.
    let long = metrale_pack::gpu::sizes::AFFINE_GATHER_SMEM + 96;
    for (m, k) in [(5usize, 2200usize), (2, long)] {
        let ld = k + 8;
        let x = Rand(43).vec(m * ld, 1.0);
        let u = Rand(44).vec(m * ld, 1.0);
        let perm = metrale_pack::testing::act_order(k);
        for (act, gathered) in [(0usize, true), (1, true), (2, true), (1, false), (0, false)] {
            let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|v| v.to_le_bytes()).collect() };
            // An empty buffer is the null pointer (no permutation).
            let pb: Vec<u8> = if gathered {
                perm.iter().flat_map(|v| v.to_le_bytes()).collect()
            } else {
                Vec::new()
            };
            let mut a = [
                A::P(bytes(&x)),
                A::P(bytes(&u)),
                A::I(act),
                A::P(pb),
                A::I(m),
                A::I(k),
                A::I(ld),
                A::P(vec![0xA5; m * k * 2]),
            ];
            launch(exe, "affine_gather_bf16", (m, 1), 256, &mut a);
            let v: Vec<f32> = (0..m)
                .flat_map(|r| {
                    metrale_pack::gpu::reference::affine_act_row(&x, &u, act, r, k, ld).unwrap()
                })
                .collect();
            let want = metrale_pack::gpu::reference::affine_gather_bf16(
                &v,
                gathered.then_some(&perm[..]),
                m,
                k,
            );
            assert!(
                buf(&a[7]) == want,
                "k = {k}, act {act}, gathered {gathered}"
            );
        }
    }
}

#[test]
fn affine_gemvs_and_dequant_match_the_references() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(29);
    use metrale_pack::testing::{AffineKind, affine_encoded, affine_scheme};
    for kind in AffineKind::ALL {
        // k = 2200: a partial 32-value group, padding to 2304 (one group a row: the zero
        // point pads it); int4 in groups of 128: k = 2176, 17 groups, 68 of 32. Rows past the
        // last block of 8.
        let k = if matches!(kind, AffineKind::Int4G128 | AffineKind::Int4G128Perm) {
            2176
        } else {
            2200usize
        };
        let n = 150usize;
        let w = r.vec(n * k, 0.05);
        let (g, u) = (r.vec(5 * k, 2.0), r.vec(5 * k, 1.0));
        let e = affine_encoded(&w, n, k, kind);
        let (codes, sb, kp) = (e.parts[0].1.clone(), e.parts[1].1.clone(), e.padded[1]);
        let sc = affine_scheme(&e);
        let bits = sc.bits;
        let (form, gshift) = (sc.form as usize, sc.group_shift(kp) as usize);
        let groups = kp / 32;
        // Act-order: the quantizer gathers each value from its source column, the
        // dequantization scatters it back.
        let perm = metrale_pack::testing::affine_perm(&e);
        let perm_arg = || {
            A::P(
                perm.iter()
                    .flatten()
                    .flat_map(|p| p.to_le_bytes())
                    .collect(),
            )
        };
        // The quantizer: plain (act 0) and with SiLU / GELU of g times u fused (act 1, 2),
        // against the twin on the same products (the emulator's expf is the host's, as the
        // twin's).
        for (act, m) in [(0usize, 5usize), (1, 3), (2, 2)] {
            let mut a = [
                A::P(f32b(&g[..m * k])),
                A::P(f32b(&u[..m * k])),
                A::I(act),
                A::I(m),
                A::I(k),
                A::I(k),
                A::I(kp),
                A::I(bits as usize),
                A::P(vec![0xA5; m * kp]),
                A::P(vec![0xA5; m * groups * 16]),
                perm_arg(),
            ];
            launch(
                exe,
                "affine_quantize_act",
                (groups.div_ceil(8), m),
                256,
                &mut a,
            );
            let xs = bf32(buf(&a[9]));
            for i in 0..m {
                let v: Vec<f32> = (0..k)
                    .map(|c| match act {
                        0 => g[i * k + c],
                        1 => reference::silu_mul(g[i * k + c], u[i * k + c]),
                        _ => reference::gelu_mul(g[i * k + c], u[i * k + c]),
                    })
                    .collect();
                let v = match &perm {
                    Some(p) => (0..k).map(|c| v[p[c] as usize]).collect(),
                    None => v,
                };
                let (q, d) = reference::affine_quantize_act_row(&v, kp, bits);
                assert!(
                    buf(&a[8])[i * kp..(i + 1) * kp] == q[..],
                    "act {act} codes row {i}"
                );
                let got = &xs[i * groups * 4..(i + 1) * groups * 4];
                assert!(
                    got.iter().zip(&d).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "act {act} scales row {i}"
                );
            }
        }
        // The GEMVs over the twin's activations of up to 16 rows.
        let quantized: Vec<_> = (0..16)
            .map(|i| reference::affine_quantize_act_row(&g[(i % 5) * k..(i % 5 + 1) * k], kp, bits))
            .collect();
        let xq: Vec<u8> = quantized.iter().flat_map(|(q, _)| q.clone()).collect();
        let xs: Vec<f32> = quantized.iter().flat_map(|(_, d)| d.clone()).collect();
        // A second projection (gate and up in one launch: blockIdx.y 1) of other weights.
        let e2 = affine_encoded(&r.vec(n * k, 0.05), n, k, kind);
        let (codes2, sb2) = (e2.parts[0].1.clone(), e2.parts[1].1.clone());
        for (suffix, m, projs) in [
            ("", 1usize, 1usize),
            ("_batch4", 3, 2),
            ("_batch16", 3, 1),
            ("_batch16", 11, 2),
            ("_ks", 1, 1),
        ] {
            let name = format!("affine{bits}_gemv{suffix}");
            let want = |c: &[u8], s: &[u8]| {
                rows64(m, n, |i, row| {
                    let (q, d) = &quantized[i];
                    reference::affine_q8_row(q, d, c, s, sc, n, kp, row)
                })
            };
            let mut a = [
                A::P(xq[..m * kp].to_vec()),
                A::P(f32b(&xs[..m * groups * 4])),
                A::I(m),
                A::P(codes.clone()),
                A::P(sb.clone()),
                A::P(f32b(&vec![f32::NAN; m * n])),
                A::P(codes2.clone()),
                A::P(sb2.clone()),
                A::P(f32b(&vec![f32::NAN; m * n])),
                A::I(projs),
                A::I(n),
                A::I(kp),
                A::I(form),
                A::I(gshift),
                A::I(n),
            ];
            let spec = metrale_pack::gpu::table::spec("ffn_affine", &name).unwrap();
            use metrale_pack::gpu::sizes::{AFFINE_GEMV_BLOCK_ROWS, AFFINE_GEMV_KS_BLOCK_ROWS};
            // The `_ks` form splits k across a block's warps: fewer rows a block.
            let rows = if suffix == "_ks" {
                AFFINE_GEMV_KS_BLOCK_ROWS
            } else {
                AFFINE_GEMV_BLOCK_ROWS
            };
            launch(
                exe,
                &name,
                (n.div_ceil(rows), projs),
                spec.grid.threads,
                &mut a,
            );
            let err = rel_err(&bf32(buf(&a[5])), &want(&codes, &sb));
            assert!(err < 2e-6, "{name} {kind:?}: {err}");
            if projs == 2 {
                let err = rel_err(&bf32(buf(&a[8])), &want(&codes2, &sb2));
                assert!(err < 2e-6, "{name} {kind:?} second projection: {err}");
            }
        }
        let mut a = [
            A::P(codes.clone()),
            A::P(sb.clone()),
            A::I(n),
            A::I(kp),
            A::I(bits as usize),
            A::I(form),
            A::I(gshift),
            A::P(vec![0xA5; n * kp * 2]),
            perm_arg(),
        ];
        let threads = n * kp / 8;
        launch(
            exe,
            "affine_dequant_bf16",
            (threads.div_ceil(256), 1),
            256,
            &mut a,
        );
        let want = match &perm {
            Some(p) => reference::affine_dequant_bf16_perm(&codes, &sb, sc, n, kp, p),
            None => reference::affine_dequant_bf16(&codes, &sb, sc, n, kp),
        };
        assert!(buf(&a[7]) == want, "{kind:?} dequant bytes");
    }
}

#[test]
fn affine_from_ggml_writes_the_converters_bytes() {
    use metrale_pack::GgmlType;
    use metrale_pack::testing::gen_model::encode_as;
    let Some(exe) = emulator() else { return };
    let mut r = Rand(31);
    // k = 2208: 69 groups of 32, padded to 2304 (three groups of zeros a row).
    let (n, k) = (37usize, 2208usize);
    let kp = 2304;
    let x = r.vec(n * k, 0.3);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let mut raw = encode_as(ty, &x).unwrap();
        let want = metrale_pack::converters::layouts::affine::carry(ty, &raw, n, k).unwrap();
        for broken in [false, true] {
            if broken {
                // Row 5, block 7: a d whose -z d is not a half (Q4_0, Q8_0) or not finite (Q4_1).
                let bb = ty.block_bytes() as usize;
                let at = (5 * (k / 32) + 7) * bb;
                let d = if ty == GgmlType::Q4_1 {
                    f32::INFINITY
                } else {
                    9000.0
                };
                raw[at..at + 2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
            }
            let bits = if ty == GgmlType::Q8_0 { 8 } else { 4 };
            let mut a = [
                A::P(raw.clone()),
                A::I(ty as usize),
                A::I(n),
                A::I(k),
                A::I(kp),
                A::P(vec![0xA5; n * kp * bits / 8]),
                A::P(vec![0xA5; n * kp / 32 * 4]),
                A::P(vec![0; 4]),
            ];
            launch(
                exe,
                "affine_from_ggml",
                ((n * kp / 32).div_ceil(256), 1),
                256,
                &mut a,
            );
            let flag = buf(&a[7]) != [0u8; 4];
            assert_eq!(flag, broken, "{ty:?} flag");
            if !broken {
                assert!(buf(&a[5]) == want.parts[0].1, "{ty:?} codes");
                assert!(buf(&a[6]) == want.parts[1].1, "{ty:?} scale pairs");
            }
        }
    }
}

#[test]
fn affine_from_awq_writes_the_converters_bytes() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(37);
    // Groups of 128 in rows of 2176 (17 groups, no padding), and one group a row of 200 values
    // (padded to 256 with the row's zero point).
    for (n, k, group) in [(24usize, 2176usize, 128usize), (16, 200, 200)] {
        let x = r.vec(n * k, 0.3);
        let ([qw, qz, mut sc], g) = metrale_pack::testing::awq_tensors(&x, n, k, group);
        let want = metrale_pack::converters::layouts::affine::from_groups(&g);
        let kp = want.padded[1];
        let sgroup = metrale_pack::testing::affine_scheme(&want).group;
        for broken in [false, true] {
            if broken {
                // Group 0 of row 3: an infinite scale.
                sc[6..8].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
            }
            let mut a = [
                A::P(qw.clone()),
                A::P(qz.clone()),
                A::P(sc.clone()),
                A::I(n),
                A::I(k),
                A::I(kp),
                A::I(group),
                A::I(sgroup),
                A::P(vec![0xA5; n * kp / 2]),
                A::P(vec![0xA5; want.parts[1].1.len()]),
                A::P(vec![0; 4]),
            ];
            launch(
                exe,
                "affine_from_awq",
                ((n * kp / 32).div_ceil(256), 1),
                256,
                &mut a,
            );
            assert_eq!(buf(&a[10]) != [0u8; 4], broken, "[{n}, {k}] flag");
            if !broken {
                assert!(buf(&a[8]) == want.parts[0].1, "[{n}, {k}] codes");
                assert!(buf(&a[9]) == want.parts[1].1, "[{n}, {k}] scale pairs");
            }
        }
    }
}

/// The gate and up GEMVs with the down input's quantization fused (`affine{4,8}_gemv_act`):
/// both outputs within 2e-6 of the twin over the same activation codes, the down input's codes
/// and scales bit for bit those `affine_quantize_act` gives the act-mul of the kernel's own
/// outputs (its last group partial, the groups past n to the padded k zero), and the arrival
/// counters back at zero.
#[test]
fn affine_gemv_act_fuses_the_down_inputs_quantization() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(47);
    use metrale_pack::testing::{AffineKind, affine_encoded, affine_scheme};
    // n = 150: a last group of 22 rows (blocks of 8: three of gate and three of up), padded to
    // kpd = 256 for 4-bit down weights and 160 for 8-bit.
    let (n, k) = (150usize, 2176usize);
    for (kind, act, bitsd, kpd) in [
        (AffineKind::Int4G128, 1usize, 4u32, 256usize),
        (AffineKind::Q8_0, 2, 8, 160),
    ] {
        let eg = affine_encoded(&r.vec(n * k, 0.05), n, k, kind);
        let eu = affine_encoded(&r.vec(n * k, 0.05), n, k, kind);
        let sc = affine_scheme(&eg);
        let kp = eg.padded[1];
        let (form, gshift) = (sc.form as usize, sc.group_shift(kp) as usize);
        let x = r.vec(k, 1.0);
        let (xq, xs) = reference::affine_quantize_act_row(&x, kp, sc.bits);
        let name = format!("affine{}_gemv_act", sc.bits);
        let mut a = [
            A::P(xq.clone()),
            A::P(f32b(&xs)),
            A::I(1),
            A::P(eg.parts[0].1.clone()),
            A::P(eg.parts[1].1.clone()),
            A::P(f32b(&vec![f32::NAN; n])),
            A::P(eu.parts[0].1.clone()),
            A::P(eu.parts[1].1.clone()),
            A::P(f32b(&vec![f32::NAN; n])),
            A::I(n),
            A::I(kp),
            A::I(form),
            A::I(gshift),
            A::I(act),
            A::P(vec![0xA5; kpd]),
            A::P(vec![0xA5; kpd / 32 * 16]),
            A::I(kpd),
            A::I(bitsd as usize),
            A::P(vec![0; kpd / 32 * 4]),
        ];
        let rows = metrale_pack::gpu::sizes::AFFINE_GEMV_BLOCK_ROWS;
        launch(exe, &name, (n.div_ceil(rows), 2), 128, &mut a);
        let (yg, yu) = (bf32(buf(&a[5])), bf32(buf(&a[8])));
        for (y, e) in [(&yg, &eg), (&yu, &eu)] {
            let mut want = vec![0f32; n];
            reference::affine_q8_row(&xq, &xs, &e.parts[0].1, &e.parts[1].1, sc, n, kp, &mut want);
            let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            assert!(rel_err(y, &want) < 2e-6, "{name}: {}", rel_err(y, &want));
        }
        let v = reference::affine_act_row(&yg, &yu, act, 0, n, n).unwrap();
        let (q, d) = reference::affine_quantize_act_row(&v, kpd, bitsd);
        assert!(buf(&a[14]) == q, "{name}: down input codes");
        assert!(
            bf32(buf(&a[15]))
                .iter()
                .zip(&d)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: scales"
        );
        assert!(
            buf(&a[18]).iter().all(|&b| b == 0),
            "{name}: counters reset"
        );
    }
}
