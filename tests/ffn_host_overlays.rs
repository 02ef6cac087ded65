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
