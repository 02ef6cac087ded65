//! `DenseFfnLayer` on the host reference backend, the overlays beside the NVFP4 base: LoRA on
//! every NVFP4 arm, packed q2g128, the Q4_K MMQ prefill, and pack-given copies validated.

mod common;

use common::ffn::*;
use metrale_pack::converters::layouts;
use metrale_pack::ffn::{DenseFfnLayer, key};
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::gpu::reference::ActRound;
use metrale_pack::gpu::{DevicePtr, ModelLevers};
use metrale_pack::model::Activation;
use metrale_pack::testing::*;

#[test]
fn lora_on_every_nvfp4_arm_and_its_refusals() {
    let mut r = Rand(53);
    let w = DenseWeights::random(&mut r, H, I);
    let wd = nvfp4_decoded(&w);
    let ad = LoraAdapter::random(&mut r, H, I, 8);
    let want_w = ad.applied_to(&wd);
    let delta = ad.delta(H, I);
    let lora = ["lora_a", "lora_b_add"];
    // (levers, method, m, tolerance): split-SiLU decode (the fused-down lever is ignored with an
    // adapter), k2/k3, the batch-m tier, prefill through the base GEMM and the _t GEMM.
    for (lev, install_t, method, m, tol) in [
        (
            levers(&[("METRALE_FFN_SILU_FUSED_DOWN", "1")]),
            false,
            "forward",
            1,
            1e-5,
        ),
        (levers(&[]), false, "k2", 2, 1e-5),
        (levers(&[]), false, "k3", 3, 1e-5),
        (levers(&[]), false, "km", 7, 1e-5),
        (levers(&[]), false, "prefill", 9, 1e-2),
        (levers(&[]), true, "prefill", 40, 1e-2),
        (
            levers(&[("METRALE_DECODE_FFN_VIA_GEMM", "1")]),
            false,
            "forward",
            1,
            1e-2,
        ),
    ] {
        let mut c = ctx(HostBackend::new(), lev);
        let mut l = DenseFfnLayer::new(&c);
        if install_t {
            install_nvfp4_t(c.backend.as_ref(), &mut l, &w).unwrap();
        } else {
            install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
        }
        ad.install(c.backend.as_ref(), &mut l).unwrap();
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &l, method, x, m).unwrap();
        // Two adapter products after gate and up (before the activation), one after down.
        assert_eq!(count(&c.trace, lora[0]), 3, "{method} m={m}: {:?}", c.trace);
        assert_eq!(count(&c.trace, lora[1]), 3);
        assert_eq!(count(&c.trace, "w4a16_gemv_silu_down"), 0);
        let act = c
            .trace
            .iter()
            .position(|k| k.starts_with("act_mul"))
            .unwrap();
        assert!(
            c.trace[..act]
                .iter()
                .filter(|k| k.starts_with("lora"))
                .count()
                == 4
        );
        // The decode GEMVs round their input to bf16 (formats.md); the adapter's products
        // read it in f32: base over rounded inputs plus the adapter's delta over unrounded ones.
        let want = if tol < 1e-4 {
            ffn_f64_parts(&xs, m, &wd, Some(&delta), Activation::Silu, ActRound::Bf16)
        } else {
            ffn_f64(&xs, m, &want_w, Activation::Silu)
        };
        let e = rel_err(&y, &want);
        assert!(e < tol, "{method} m={m}: {e}");
        // The adapter changes the result (a test that could fail).
        assert!(rel_err(&y, &ffn_f64(&xs, m, &wd, Activation::Silu)) > 1e-2);
    }
    // W4A4 (single row): the adapter's products land around the W4A4 projections.
    let mut c = ctx(
        HostBackend::new(),
        levers(&[("METRALE_SINGLE_ROW_W4A4", "1")]),
    );
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    ad.install(c.backend.as_ref(), &mut l).unwrap();
    let (x, _) = input(&c, &mut r, 1);
    run(&mut c, &l, "forward", x, 1).unwrap();
    assert_eq!(
        c.trace,
        [
            "quantize_act_nvfp4",
            "nvfp4_proj_mx",
            "nvfp4_proj_mx",
            "lora_a",
            "lora_b_add",
            "lora_a",
            "lora_b_add",
            "act_mul_silu",
            "quantize_act_nvfp4",
            "nvfp4_proj_mx",
            "lora_a",
            "lora_b_add"
        ]
    );
    // METRALE_LORA_NO_FFN=1: no adapter launches, the base result bit for bit.
    let mut c = ctx(HostBackend::new(), levers(&[("METRALE_LORA_NO_FFN", "1")]));
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    let (x, _) = input(&c, &mut r, 1);
    let base = run(&mut c, &l, "forward", x, 1).unwrap();
    ad.install(c.backend.as_ref(), &mut l).unwrap();
    let off = run(&mut c, &l, "forward", x, 1).unwrap();
    assert_eq!(count(&c.trace, "lora_a") + count(&c.trace, "lora_b_add"), 0);
    assert!(
        base.iter()
            .zip(&off)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );

    // Refusals, with the words that say why.
    let cases: [(&str, HostBackend, Activation, &str); 4] = [
        (
            "fp8",
            HostBackend::new(),
            Activation::Silu,
            "FP8, BF16 or q2g128",
        ),
        (
            "bf16",
            HostBackend::new(),
            Activation::Silu,
            "FP8, BF16 or q2g128",
        ),
        (
            "gelu",
            HostBackend::new(),
            Activation::Gelu,
            "split-SiLU decode path",
        ),
        (
            "no gemv",
            HostBackend::without(&["w4a16_gemv"]),
            Activation::Silu,
            "split-SiLU decode path",
        ),
    ];
    for (what, b, act, words) in cases {
        let c = ctx(b, levers(&[]));
        let mut l = DenseFfnLayer::new_with_activation(&c, act);
        install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
        match what {
            "fp8" => install_fp8(c.backend.as_ref(), &mut l, &w, false).unwrap(),
            "bf16" => install_bf16(c.backend.as_ref(), &mut l, &w).unwrap(),
            _ => {}
        }
        let e = ad
            .install(c.backend.as_ref(), &mut l)
            .unwrap_err()
            .to_string();
        assert!(e.contains(words), "{what}: {e}");
    }
    // A rank above the arena's scratch is refused.
    let big = LoraAdapter::random(&mut r, H, I, 300);
    let c = ctx(HostBackend::new(), levers(&[]));
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    let e = big
        .install(c.backend.as_ref(), &mut l)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 300"), "{e}");
}

#[test]
fn packed_q2_decode_small_batches_prefill_paths_and_refusals() {
    let mut r = Rand(61);
    let w = DenseWeights::random(&mut r, H, I);
    let wq = q2_decoded(&w, false);
    let wb = q2_decoded(&w, true);
    let mut c = ctx(HostBackend::new(), levers(&[]));
    let mut l = DenseFfnLayer::new(&c);
    install_q2(c.backend.as_ref(), &mut l, &w).unwrap();
    for (method, m, k) in [
        ("forward", 1, "q2g128_gemv"),
        ("k2", 2, "q2g128_gemv_batchm"),
        ("k3", 3, "q2g128_gemv_batchm"),
    ] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &l, method, x, m).unwrap();
        assert_eq!(c.trace, [k, k, "act_mul_silu", k], "{method}");
        let e = rel_err(&y, &ffn_f64(&xs, m, &wq, Activation::Silu));
        assert!(e < 1e-5, "{method}: {e}");
    }
    // No q2g128 arm in forward_km.
    assert!(!l.can_forward_km(2));
    let (x, _) = input(&c, &mut r, 2);
    let e = run(&mut c, &l, "km", x, 2).unwrap_err().to_string();
    assert!(e.contains("no NVFP4 or FP8 weights"), "{e}");
    // Prefill: dequantize each projection to BF16, then the BF16 GEMM.
    let dq = [
        "f32_to_bf16",
        "q2g128_dequant_bf16",
        "cublas_gemm_bf16",
        "q2g128_dequant_bf16",
        "cublas_gemm_bf16",
        "act_mul_silu",
        "f32_to_bf16",
        "q2g128_dequant_bf16",
        "cublas_gemm_bf16",
    ];
    for m in [1usize, 6, 33] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &l, "prefill", x, m).unwrap();
        assert_eq!(c.trace, dq);
        let e = rel_err(&y, &ffn_f64(&xs, m, &wb, Activation::Silu));
        assert!(e < 1e-2, "prefill m={m}: {e}");
    }
    // Without BLAS the BF16 GEMV serves the same products four rows at a time.
    let mut c2 = ctx(HostBackend::without(&["gemm_bf16"]), levers(&[]));
    let mut l2 = DenseFfnLayer::new(&c2);
    install_q2(c2.backend.as_ref(), &mut l2, &w).unwrap();
    let (x, xs) = input(&c2, &mut r, 9);
    let y = run(&mut c2, &l2, "prefill", x, 9).unwrap();
    assert_eq!(count(&c2.trace, "bf16_gemv_batch4"), 9);
    let e = rel_err(&y, &ffn_f64(&xs, 9, &wb, Activation::Silu));
    assert!(e < 1e-2, "gemv fallback: {e}");
    // The native MMQ path: one q8_1 quantization shared by gate and up, one for down.
    let mut c3 = ctx(HostBackend::new(), levers(&[("METRALE_Q2G128_MMQ", "1")]));
    let mut l3 = DenseFfnLayer::new(&c3);
    install_q2(c3.backend.as_ref(), &mut l3, &w).unwrap();
    let (x, xs) = input(&c3, &mut r, 17);
    let y = run(&mut c3, &l3, "prefill", x, 17).unwrap();
    assert_eq!(
        c3.trace,
        [
            "quantize_act_q8_1",
            "q2g128_mmq_gemm",
            "q2g128_mmq_gemm",
            "act_mul_silu",
            "quantize_act_q8_1",
            "q2g128_mmq_gemm"
        ]
    );
    // 8-bit activations per 32 values: 2e-2 of the f64 FFN on the q2 weights.
    let e = rel_err(&y, &ffn_f64(&xs, 17, &wq, Activation::Silu));
    assert!(e < 2e-2, "mmq: {e}");
    // Missing kernels are named; GELU prefill is refused with the reason.
    for (hide, lev, words) in [
        (
            "q2g128_mmq_gemm",
            vec![("METRALE_Q2G128_MMQ", "1")],
            "ffn_q2g128::q2g128_mmq_gemm",
        ),
        (
            "q2g128_dequant_bf16",
            vec![],
            "ffn_q2g128::q2g128_dequant_bf16",
        ),
        ("q2g128_gemv", vec![], "ffn_q2g128::q2g128_gemv"),
    ] {
        let mut c = ctx(HostBackend::without(&[hide]), levers(&lev));
        let mut l = DenseFfnLayer::new(&c);
        install_q2(c.backend.as_ref(), &mut l, &w).unwrap();
        let method = if hide == "q2g128_gemv" {
            "forward"
        } else {
            "prefill"
        };
        let (x, _) = input(&c, &mut r, 1);
        let e = run(&mut c, &l, method, x, 1).unwrap_err().to_string();
        assert!(e.contains(words), "{hide}: {e}");
    }
    let mut cg = ctx(HostBackend::new(), levers(&[]));
    let mut lg = DenseFfnLayer::new_with_activation(&cg, Activation::Gelu);
    install_q2(cg.backend.as_ref(), &mut lg, &w).unwrap();
    let (x, _) = input(&cg, &mut r, 5);
    let e = run(&mut cg, &lg, "prefill", x, 5).unwrap_err().to_string();
    assert!(e.contains("SiLU layers only"), "{e}");
    // finalize_nvfp4_mmq_load returns at once for a q2g128 layer; LoRA is refused.
    let mut l4 = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l4, &w).unwrap();
    install_q2(c.backend.as_ref(), &mut l4, &w).unwrap();
    assert!(!l4.finalize_nvfp4_mmq_load(&mut c, H, I, 0).unwrap());
    let e = LoraAdapter::random(&mut r, H, I, 4)
        .install(c.backend.as_ref(), &mut l4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("q2g128"), "{e}");
}

#[test]
fn finalize_q4k_load_and_the_q4k_mmq_prefill() {
    let mut r = Rand(71);
    let w = DenseWeights::random(&mut r, H, I);
    let wd = nvfp4_decoded(&w);
    let mmq = levers(&[("METRALE_Q4K_MMQ", "1")]);
    let mut c = ctx(HostBackend::new(), mmq.clone());
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4_t(c.backend.as_ref(), &mut l, &w).unwrap();
    let t0 = l.get(key::NVFP4_T).unwrap()[0].unwrap().codes();
    c.trace.clear();
    assert!(l.finalize_q4k_load(&mut c, H, I, 0).unwrap());
    assert_eq!(
        c.trace,
        ["nvfp4_to_q4k", "nvfp4_to_q4k", "nvfp4_to_int8_rows"]
    );
    assert!(l.get(key::NVFP4_T).is_none());
    assert!(
        c.backend.download(t0, &mut [0u8; 4]).is_err(),
        "_t copy not freed"
    );
    // The built bytes are the converter's (and so ggml's reference quantizer's) for the NVFP4
    // values the layer holds.
    let q = *l.get(key::Q4K_MMQ).unwrap();
    let bytes = |p: DevicePtr| {
        let mut v = vec![0u8; p.bytes as usize];
        c.backend.download(p, &mut v).unwrap();
        v
    };
    let ge = layouts::q4k_mmq::encode_q4k(&wd.gate, I, H);
    assert!(bytes(q.gate()) == ge.parts[0].1);
    let de = layouts::q4k_mmq::encode_int8(&wd.down, H, I);
    match q.down() {
        metrale_pack::ffn::Q4kDown::Int8 { codes, scales } => {
            assert!(bytes(codes) == de.parts[0].1 && bytes(scales) == de.parts[1].1);
        }
        other => panic!("{other:?}"),
    }
    // Prefill with METRALE_Q4K_MMQ: by default (HARDWARE.toml `dq_wgmma`) bf16 activations
    // into the Q4_K wgmma GEMM, the int8 down on int8_wgmma; with the lever off q8_1
    // activations shared by gate and up and the mma.sync int8 down.
    let paths: [(bool, [&str; 6]); 2] = [
        (
            false,
            [
                "quantize_act_q8_1",
                "q4k_mmq_gemm",
                "q4k_mmq_gemm",
                "act_mul_silu",
                "requant_a_bf16_int8",
                "q4k_mmq_int8_down_gemm",
            ],
        ),
        (
            true,
            [
                "f32_to_bf16_il8",
                "q4k_wgmma",
                "q4k_wgmma",
                "act_mul_silu",
                "requant_a_bf16_int8",
                "int8_wgmma",
            ],
        ),
    ];
    // (The wgmma path draws its inputs from a second generator, so the later cases see the
    // inputs they always saw.)
    let mut r2 = Rand(72);
    for (dq, want) in paths {
        c.levers.dq_wgmma = dq;
        for m in [1usize, 5, 40] {
            let (x, xs) = input(&c, if dq { &mut r2 } else { &mut r }, m);
            let y = run(&mut c, &l, "prefill", x, m).unwrap();
            assert_eq!(c.trace, want, "dq_wgmma {dq}, m={m}");
            // 8-bit activations somewhere: 2e-2 of the f64 FFN on the weights the arm holds.
            let e = rel_err(
                &y,
                &ffn_f64(&xs, m, &q4k_mmq_decoded(&w, false), Activation::Silu),
            );
            assert!(e < 2e-2, "dq_wgmma {dq}, m={m}: {e}");
        }
    }
    // Run again, or given the copies (a pack): nothing to do, no launch.
    let n0 = c.backend.launch_count();
    assert!(!l.finalize_q4k_load(&mut c, H, I, 0).unwrap());
    assert_eq!(c.backend.launch_count(), n0);
    // METRALE_Q4K_MMQ_DOWN_Q4K, or the int8 kernels missing: down is Q4_K.
    let no_dq = ("METRALE_DQ_WGMMA", "0");
    for (b, lev) in [
        (
            HostBackend::new(),
            levers(&[
                ("METRALE_Q4K_MMQ", "1"),
                ("METRALE_Q4K_MMQ_DOWN_Q4K", "1"),
                no_dq,
            ]),
        ),
        (
            HostBackend::without(&["q4k_mmq_int8_down_gemm"]),
            levers(&[("METRALE_Q4K_MMQ", "1"), no_dq]),
        ),
    ] {
        let mut c = ctx(b, lev);
        let mut l = DenseFfnLayer::new(&c);
        install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
        assert!(l.finalize_q4k_load(&mut c, H, I, 0).unwrap());
        assert_eq!(c.trace, ["nvfp4_to_q4k"; 3]);
        let (x, xs) = input(&c, &mut r, 3);
        let y = run(&mut c, &l, "prefill", x, 3).unwrap();
        assert_eq!(c.trace[4..], ["quantize_act_q8_1", "q4k_mmq_gemm"]);
        let e = rel_err(
            &y,
            &ffn_f64(&xs, 3, &q4k_mmq_decoded(&w, true), Activation::Silu),
        );
        assert!(e < 2e-2, "{e}");
    }
    // The Q4_K down on the wgmma path: the activation product rounded to bf16 once.
    let mut c = ctx(
        HostBackend::new(),
        levers(&[("METRALE_Q4K_MMQ", "1"), ("METRALE_Q4K_MMQ_DOWN_Q4K", "1")]),
    );
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    assert!(l.finalize_q4k_load(&mut c, H, I, 0).unwrap());
    let (x, xs) = input(&c, &mut r, 7);
    let y = run(&mut c, &l, "prefill", x, 7).unwrap();
    assert_eq!(
        c.trace,
        [
            "f32_to_bf16_il8",
            "q4k_wgmma",
            "q4k_wgmma",
            "act_mul_silu_il8",
            "q4k_wgmma"
        ]
    );
    let e = rel_err(
        &y,
        &ffn_f64(&xs, 7, &q4k_mmq_decoded(&w, true), Activation::Silu),
    );
    assert!(e < 1e-2, "{e}");
    // Returns at once: no lever, FP8 or q2g128 layers, each of the four kernels missing.
    let cases: Vec<(HostBackend, ModelLevers, &str)> = vec![
        (HostBackend::new(), levers(&[]), ""),
        (HostBackend::new(), mmq.clone(), "fp8"),
        (HostBackend::new(), mmq.clone(), "q2"),
        (HostBackend::without(&["nvfp4_to_q4k"]), mmq.clone(), ""),
        (
            HostBackend::without(&["nvfp4_to_int8_rows"]),
            mmq.clone(),
            "",
        ),
        (
            HostBackend::without(&["quantize_act_q8_1"]),
            mmq.clone(),
            "",
        ),
        (HostBackend::without(&["q4k_mmq_gemm"]), mmq.clone(), ""),
    ];
    for (b, lev, extra) in cases {
        let mut c = ctx(b, lev);
        let mut l = DenseFfnLayer::new(&c);
        install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
        match extra {
            "fp8" => install_fp8(c.backend.as_ref(), &mut l, &w, false).unwrap(),
            "q2" => install_q2(c.backend.as_ref(), &mut l, &w).unwrap(),
            _ => {}
        }
        let n0 = c.backend.launch_count();
        assert!(!l.finalize_q4k_load(&mut c, H, I, 0).unwrap());
        assert_eq!(c.backend.launch_count(), n0);
        assert!(l.get(key::Q4K_MMQ).is_none());
    }
    // Given copies (a pack) serve the same prefill with no load-time launch.
    let mut c = ctx(HostBackend::new(), mmq);
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4_q4k(c.backend.as_ref(), &mut l, &w, false).unwrap();
    let n0 = c.backend.launch_count();
    assert!(!l.finalize_q4k_load(&mut c, H, I, 0).unwrap());
    assert_eq!(c.backend.launch_count(), n0);
    let (x, _) = input(&c, &mut r, 2);
    run(&mut c, &l, "prefill", x, 2).unwrap();
    assert_eq!(count(&c.trace, "q4k_wgmma"), 2);
}

#[test]
fn pack_given_tiles_and_q4k_copies_are_validated_with_checked_sizes() {
    use metrale_pack::ffn::{Q4kDown, Q4kMmqWeights};
    let c = ctx(HostBackend::new(), ModelLevers::default());
    let mut r = Rand(41);
    let w = DenseWeights::random(&mut r, H, I);
    let mut l = DenseFfnLayer::new(&c);
    // Before the base: refused.
    let small = c.backend.alloc(64).unwrap();
    assert!(l.set_nvfp4_mmq_tiles([Some(small), None, None]).is_err());
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    // A buffer too small for the projection's tiles: refused, naming the layout.
    let e = l
        .set_nvfp4_mmq_tiles([Some(small), None, None])
        .unwrap_err()
        .to_string();
    assert!(e.contains("nvfp4_mmq"), "{e}");
    assert!(l.set_nvfp4_mmq_tiles([None, None, None]).is_ok());
    // Q4_K copies whose sizes overflow (a hostile manifest's kp) are refused, not a panic.
    // Its constructor refuses them with the layout's name, and so does the layer for copies of
    // another layer's shape.
    let q = |kp_gate: usize, kp_down: usize| {
        let down = Q4kDown::Int8 {
            codes: small,
            scales: small,
        };
        Q4kMmqWeights::new(small, small, down, (H, I), (kp_gate, kp_down))
    };
    for (kg, kd) in [
        (usize::MAX / 256 * 256, 512),
        (512, usize::MAX / 256 * 256),
        (512, 512),
    ] {
        let e = q(kg, kd).unwrap_err().to_string();
        assert!(e.contains("q4k_mmq"), "{e}");
    }
    let big = c.backend.alloc(1 << 22).unwrap();
    let down = Q4kDown::Q4k(big);
    let kp = |k: usize| k.div_ceil(256) * 256;
    let other = Q4kMmqWeights::new(big, big, down, (2 * H, I), (kp(2 * H), kp(I)));
    let e = l
        .set_q4k_mmq_weights(other.unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("this layer is"), "{e}");
    assert!(l.get(key::Q4K_MMQ).is_none());
}

#[test]
fn affine_decode_small_batches_and_prefill_compute_the_f64_ffn_of_the_carried_weights() {
    let mut r = Rand(83);
    let w = DenseWeights::random(&mut r, H, I);
    for (kind, act) in [
        (AffineKind::Q8_0, Activation::Silu),
        (AffineKind::Q4_1, Activation::Gelu),
        (AffineKind::Int4G128, Activation::Silu),
        (AffineKind::Int8Channel, Activation::Gelu),
        // Act-order: gate and up share one permutation (one quantization), down its own.
        (AffineKind::Int4G128Perm, Activation::Silu),
    ] {
        let four = !matches!(kind, AffineKind::Q8_0 | AffineKind::Int8Channel);
        let (g1, ga, d1, gm, g16) = if four {
            (
                "affine4_gemv",
                "affine4_gemv_act",
                "affine4_gemv_ks",
                "affine4_gemv_batch4",
                "affine4_gemv_batch16",
            )
        } else {
            (
                "affine8_gemv",
                "affine8_gemv_act",
                "affine8_gemv_ks",
                "affine8_gemv_batch4",
                "affine8_gemv_batch16",
            )
        };
        let aq = "affine_quantize_act";
        let wq = affine_decoded(&w, kind, false);
        let wb = affine_decoded(&w, kind, true);
        let mut c = ctx(HostBackend::new(), levers(&[]));
        let mut l = DenseFfnLayer::new_with_activation(&c, act);
        install_affine(c.backend.as_ref(), &mut l, &w, kind).unwrap();
        // The GEMVs multiply activations quantized to int8 per 32 values (the act-mul fused
        // into the down input's quantization): about 0.5% from the f64 FFN of the carried
        // weights at full precision.
        // One row: gate and up in one launch, down on the k-split form; with the lever
        // `affine_fused_act` the down input's quantization inside the gate and up launch (not
        // for an act-order down, whose quantizer gathers).
        let fused: &[&str] = if kind == AffineKind::Int4G128Perm {
            &[aq, g1, aq, d1]
        } else {
            &[aq, ga, d1]
        };
        for (method, m, want, lever) in [
            ("forward", 1, &[aq, g1, aq, d1][..], false),
            ("forward", 1, fused, true),
            ("k2", 2, &[aq, gm, aq, gm][..], true),
            ("k3", 3, &[aq, gm, aq, gm][..], false),
        ] {
            c.levers.affine_fused_act = lever;
            let (x, xs) = input(&c, &mut r, m);
            let y = run(&mut c, &l, method, x, m).unwrap();
            assert_eq!(c.trace, want, "{method} fused {lever}");
            let e = rel_err(&y, &ffn_f64(&xs, m, &wq, act));
            assert!(e < 2e-2, "{kind:?} {method}: {e}");
        }
        c.levers.affine_fused_act = false;
        // Prefill: the input rounded to BF16 once for gate and up (gathered into the stored
        // column order for act-order: gate and up share the permutation), each projection
        // dequantized to BF16 as stored, then the BF16 GEMM; the act-mul fused into the down
        // input's rounding (and gathering).
        let dq = [
            "affine_gather_bf16",
            "affine_dequant_bf16",
            "cublas_gemm_bf16",
            "affine_dequant_bf16",
            "cublas_gemm_bf16",
            "affine_gather_bf16",
            "affine_dequant_bf16",
            "cublas_gemm_bf16",
        ];
        for (m, k) in [(4, gm), (5, g16), (16, g16)] {
            let (x, xs) = input(&c, &mut r, m);
            let y = run(&mut c, &l, "prefill", x, m).unwrap();
            assert_eq!(
                c.trace,
                [aq, k, aq, k],
                "a {m}-row prefill stays on the GEMVs"
            );
            let e = rel_err(&y, &ffn_f64(&xs, m, &wq, act));
            assert!(e < 2e-2, "{kind:?} prefill m={m}: {e}");
        }
        for m in [17usize, 33] {
            let (x, xs) = input(&c, &mut r, m);
            let y = run(&mut c, &l, "prefill", x, m).unwrap();
            assert_eq!(c.trace, dq, "m={m}");
            let e = rel_err(&y, &ffn_f64(&xs, m, &wb, act));
            assert!(e < 1e-2, "{kind:?} prefill m={m}: {e}");
        }
        // The carried weights are close to the f32 ones (8 bits: ~0.4%; 4 bits: ~5%).
        let (x, xs) = input(&c, &mut r, 1);
        let y = run(&mut c, &l, "forward", x, 1).unwrap();
        let e = rel_err(&y, &ffn_f64(&xs, 1, &w, act));
        assert!(
            e < if four { 0.15 } else { 0.02 },
            "{four}: {e} against f32"
        );
    }
}

#[test]
fn finalize_affine_load_builds_the_converters_bytes_from_gguf_blocks_and_refuses_bad_ones() {
    use metrale_pack::GgmlType;
    use metrale_pack::ffn::GgufBlocks;
    use metrale_pack::testing::gen_model::encode_as;
    let mut r = Rand(89);
    let w = DenseWeights::random(&mut r, H, I);
    let mut c = ctx(HostBackend::new(), levers(&[]));
    // Gate Q4_0, up Q4_1, down Q8_0: every carried type, K padded from 192 / 320 to 256 / 384.
    let tys = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];
    let shapes = [(I, H), (I, H), (H, I)];
    let xs = [&w.gate, &w.up, &w.down];
    let raws: Vec<Vec<u8>> = (0..3).map(|p| encode_as(tys[p], xs[p]).unwrap()).collect();
    let backend = c.backend.clone();
    let up = |bytes: &[u8]| {
        let p = backend.alloc(bytes.len() as u64).unwrap();
        backend.upload(p, bytes).unwrap();
        p
    };
    let blocks: Vec<GgufBlocks> = (0..3)
        .map(|p| GgufBlocks {
            raw: up(&raws[p]),
            ty: tys[p],
            n: shapes[p].0,
            k: shapes[p].1,
        })
        .collect();
    let blocks = [blocks[0], blocks[1], blocks[2]];
    let mut l = DenseFfnLayer::new(&c);
    l.finalize_affine_load(&mut c, blocks, 0).unwrap();
    assert_eq!(c.trace, ["affine_from_ggml"; 3]);
    let got = *l.get(key::AFFINE).unwrap();
    for p in 0..3 {
        let (n, k) = shapes[p];
        let e = layouts::affine::carry(tys[p], &raws[p], n, k).unwrap();
        let mut codes = vec![0u8; e.parts[0].1.len()];
        c.backend
            .download(got[p].codes().view(0, codes.len() as u64), &mut codes)
            .unwrap();
        let mut sb = vec![0u8; e.parts[1].1.len()];
        c.backend
            .download(got[p].scales().view(0, sb.len() as u64), &mut sb)
            .unwrap();
        assert!(
            codes == e.parts[0].1 && sb == e.parts[1].1,
            "projection {p}"
        );
    }
    // A Q4_0 block whose -8 d overflows a half, a type the layout does not carry, and blocks
    // too short for the shape are refused naming the projection; the layer keeps no overlay.
    let mut bad = raws[0].clone();
    bad[0..2].copy_from_slice(&half::f16::from_f32(9000.0).to_le_bytes());
    for (blocks, want) in [
        (
            [
                GgufBlocks {
                    raw: up(&bad),
                    ..blocks[0]
                },
                blocks[1],
                blocks[2],
            ],
            "gate",
        ),
        (
            [
                blocks[0],
                GgufBlocks {
                    ty: GgmlType::Q5_0,
                    ..blocks[1]
                },
                blocks[2],
            ],
            "up",
        ),
        (
            [
                blocks[0],
                blocks[1],
                GgufBlocks {
                    k: 2 * I,
                    ..blocks[2]
                },
            ],
            "down",
        ),
    ] {
        let mut l = DenseFfnLayer::new(&c);
        let e = l
            .finalize_affine_load(&mut c, blocks, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
        assert!(l.get(key::AFFINE).is_none(), "{e}");
    }
}

#[test]
fn finalize_affine_awq_load_builds_the_converters_bytes_from_autoawq_tensors() {
    use metrale_pack::ffn::{AwqTensors, FfnConfig, ForwardContext};
    use metrale_pack::gpu::GpuBackend;
    use metrale_pack::model::{FfnWeight, Model};
    // The tensors AutoAWQ 0.2.9 wrote (groups of 64), uploaded as they are.
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/awq-gemm-g64-f16");
    let m = Model::open(&dir).unwrap();
    let b = std::sync::Arc::new(HostBackend::new());
    let cfg = FfnConfig {
        hidden: 256,
        inter: 384,
    };
    let mut c = ForwardContext::new(b.clone(), cfg, 16, levers(&[])).unwrap();
    c.tracing = true;
    let up = |bytes: &[u8]| {
        let p = b.alloc(bytes.len() as u64).unwrap();
        b.upload(p, bytes).unwrap();
        p
    };
    let l0 = &m.ffn_layers[0];
    let ws = [&l0.gate, &l0.up, &l0.down];
    let tensors: Vec<AwqTensors> = ws
        .iter()
        .map(|w| {
            let FfnWeight::Awq {
                qweight,
                qzeros,
                scales,
            } = **w
            else {
                panic!("{w:?}")
            };
            let [n, k] = m.weight_shape(w).unwrap().map(|d| d as usize);
            let groups = m.tensors[scales].shape[0] as usize;
            AwqTensors {
                qweight: up(m.data(qweight)),
                qzeros: up(m.data(qzeros)),
                scales: up(m.data(scales)),
                n,
                k,
                group: k / groups,
            }
        })
        .collect();
    let tensors = [tensors[0], tensors[1], tensors[2]];
    let mut l = DenseFfnLayer::new(&c);
    l.finalize_affine_awq_load(&mut c, tensors, 0).unwrap();
    assert_eq!(c.trace, ["affine_from_awq"; 3]);
    let got = *l.get(key::AFFINE).unwrap();
    for (p, w) in ws.iter().enumerate() {
        let e = layouts::affine::from_groups(&m.int_groups(w).unwrap().unwrap());
        let (mut codes, mut sb) = (vec![0u8; e.parts[0].1.len()], vec![0u8; e.parts[1].1.len()]);
        b.download(got[p].codes().view(0, codes.len() as u64), &mut codes)
            .unwrap();
        b.download(got[p].scales().view(0, sb.len() as u64), &mut sb)
            .unwrap();
        assert!(
            codes == e.parts[0].1 && sb == e.parts[1].1,
            "projection {p}"
        );
    }
    // A group the layout does not store, and an infinite scale, are refused by projection.
    let odd = AwqTensors {
        group: 48,
        ..tensors[0]
    };
    let e = l
        .finalize_affine_awq_load(&mut c, [odd, tensors[1], tensors[2]], 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("finalize_affine_awq_load: gate") && e.contains("groups of 48"),
        "{e}"
    );
    let FfnWeight::Awq { scales, .. } = l0.down else {
        unreachable!()
    };
    let mut bad = m.data(scales).to_vec();
    bad[0..2].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
    let broken = AwqTensors {
        scales: up(&bad),
        ..tensors[2]
    };
    let e = l
        .finalize_affine_awq_load(&mut c, [tensors[0], tensors[1], broken], 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("down") && e.contains("not finite"), "{e}");
}
