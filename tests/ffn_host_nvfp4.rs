//! `DenseFfnLayer` on the host reference backend, the NVFP4 arms: decode, the prefill GEMMs,
//! the batch-m tiers, W4A4 and the fixed path, the k-split down GEMV, and the MMQ tiles.

mod common;

use common::ffn::*;
use metrale_pack::converters::layouts;
use metrale_pack::ffn::{DenseFfnLayer, key};
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::gpu::reference::ActRound;
use metrale_pack::gpu::{DevicePtr, ModelLevers, upload_f32};
use metrale_pack::model::Activation;
use metrale_pack::testing::*;

#[test]
fn nvfp4_decode_arm_and_finalize_nvfp4_mmq_load() {
    let mut r = Rand(31);
    let w = DenseWeights::random(&mut r, H, I);
    let wd = nvfp4_decoded(&w);
    let mut c = ctx(HostBackend::new(), levers(&[]));
    let mut layer = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut layer, &w).unwrap();
    for (method, m, sfx) in [
        ("forward", 1, ""),
        ("k2", 2, "_batch2"),
        ("k3", 3, "_batch3"),
    ] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &layer, method, x, m).unwrap();
        let (dual, down) = (format!("w4a16_gemv_dual{sfx}"), format!("w4a16_gemv{sfx}"));
        assert_eq!(c.trace, [dual.as_str(), "act_mul_silu", down.as_str()]);
        // The host computes the same products in f64 over bf16-rounded activations (the decode
        // GEMVs' contract): only the f32 act-mul and output rounding differ.
        let e = rel_err(
            &y,
            &ffn_f64_with(&xs, m, &wd, Activation::Silu, ActRound::Bf16),
        );
        assert!(e < 1e-5, "{method}: {e}");
    }
    // Prefill through the base tensor-core GEMM (activations rounded to bf16 in each projection).
    for m in [1usize, 5, 33] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &layer, "prefill", x, m).unwrap();
        assert_eq!(
            c.trace,
            ["w4a16_gemm", "w4a16_gemm", "act_mul_silu", "w4a16_gemm"]
        );
        let e = rel_err(&y, &ffn_f64(&xs, m, &wd, Activation::Silu));
        assert!(e < 1e-2, "prefill m={m}: {e}");
    }
    let mut c2 = ctx(HostBackend::without(&["w4a16_gemm"]), levers(&[]));
    let mut l2 = DenseFfnLayer::new(&c2);
    install_nvfp4(c2.backend.as_ref(), &mut l2, &w).unwrap();
    let (x, _) = input(&c2, &mut r, 8);
    let e = run(&mut c2, &l2, "prefill", x, 8).unwrap_err().to_string();
    assert!(e.contains("ffn_nvfp4::w4a16_gemm"), "{e}");
    // Without the W4A4 levers: the batch-m tiers serve forward_km, no W4A4 for 1-3 rows; the
    // fixed path's W4A4 arm serves an NVFP4 SiLU layer.
    assert!(
        layer.can_forward_km(2)
            && !layer.small_batch_w4a4(&c)
            && !layer.single_row_w4a4(&c)
            && layer.fixed_ok(&c, 1)
            && !layer.fixed_w8a8_ok(&c, 1)
    );

    // finalize_nvfp4_mmq_load: GPU repack bytes == the converter's nvfp4_mmq bytes; the _t
    // copies of what it repacked are freed.
    install_nvfp4_t(c.backend.as_ref(), &mut layer, &w).unwrap();
    let t_copies: Vec<DevicePtr> = layer
        .get(key::NVFP4_T)
        .unwrap()
        .iter()
        .map(|t| t.unwrap().codes())
        .collect();
    c.trace.clear();
    assert!(layer.finalize_nvfp4_mmq_load(&mut c, H, I, 0).unwrap());
    assert_eq!(count(&c.trace, "nvfp4_mmq_repack"), 3);
    for (p, (x, n, k)) in [(&w.gate, I, H), (&w.up, I, H), (&w.down, H, I)]
        .into_iter()
        .enumerate()
    {
        let e = layouts::nvfp4::encode(x, n, k);
        let want =
            layouts::nvfp4_mmq::from_nvfp4(&e.parts[0].1, &e.parts[1].1, 0.0, n, e.padded[1])
                .parts
                .remove(0)
                .1;
        let got_p = layer.get(key::NVFP4_MMQ).unwrap()[p].unwrap();
        let mut got = vec![0u8; got_p.bytes as usize];
        c.backend.download(got_p, &mut got).unwrap();
        assert!(
            got == want,
            "projection {p}: repack differs from the converter"
        );
        assert!(layer.get(key::NVFP4_T).is_none_or(|t| t[p].is_none()));
        assert!(
            c.backend.download(t_copies[p], &mut [0u8; 4]).is_err(),
            "_t copy {p} not freed"
        );
    }
    // Given tiles (a pack), or run again: nothing to do, no launch.
    let n0 = c.backend.launch_count();
    assert!(!layer.finalize_nvfp4_mmq_load(&mut c, H, I, 0).unwrap());
    assert_eq!(c.backend.launch_count(), n0);

    // Returns at once: GELU, FP8 layers, the lever, a missing kernel; the down lever skips down.
    let cases: [(&str, HostBackend, ModelLevers, Activation, bool); 5] = [
        (
            "gelu",
            HostBackend::new(),
            levers(&[]),
            Activation::Gelu,
            false,
        ),
        (
            "fp8",
            HostBackend::new(),
            levers(&[]),
            Activation::Silu,
            true,
        ),
        (
            "lever",
            HostBackend::new(),
            levers(&[("METRALE_NO_FFN_NVFP4_MMQ", "1")]),
            Activation::Silu,
            false,
        ),
        (
            "missing",
            HostBackend::without(&["nvfp4_mmq_repack"]),
            levers(&[]),
            Activation::Silu,
            false,
        ),
        (
            "down lever",
            HostBackend::new(),
            levers(&[("METRALE_NO_FFN_NVFP4_MMQ_DOWN", "1")]),
            Activation::Silu,
            false,
        ),
    ];
    for (what, b, lev, act, with_fp8) in cases {
        let mut c = ctx(b, lev);
        let mut l = DenseFfnLayer::new_with_activation(&c, act);
        install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
        if with_fp8 {
            install_fp8(c.backend.as_ref(), &mut l, &w, false).unwrap();
        }
        let did = l.finalize_nvfp4_mmq_load(&mut c, H, I, 0).unwrap();
        let built: Vec<bool> = l
            .get(key::NVFP4_MMQ)
            .copied()
            .unwrap_or_default()
            .iter()
            .map(Option::is_some)
            .collect();
        if what == "down lever" {
            assert!(did && built == [true, true, false], "{what}: {built:?}");
        } else {
            assert!(!did && built == [false, false, false], "{what}: {built:?}");
        }
    }

    // Shapes and alignment are checked.
    let mut l2 = DenseFfnLayer::new(&c);
    let bad = DenseWeights {
        gate: w.down.clone(),
        up: w.up.clone(),
        down: w.down.clone(),
        hidden: I,
        inter: H,
    };
    let e = install_bf16(c.backend.as_ref(), &mut l2, &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs [320, 192]"), "{e}");
    let mut l3 = DenseFfnLayer::new(&c);
    install_fp8(c.backend.as_ref(), &mut l3, &w, false).unwrap();
    let big = c.backend.alloc((200 * H * 4) as u64).unwrap();
    let e = l3
        .forward_prefill(&mut c, big, 200)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1..=128"), "{e}");
}

#[test]
fn nvfp4_prefill_gemms_batchm_tiers_w4a4_and_the_fixed_path() {
    let mut r = Rand(47);
    let w = DenseWeights::random(&mut r, H, I);
    let wd = nvfp4_decoded(&w);
    let f64_ref = |xs: &[f32], m: usize| ffn_f64(xs, m, &wd, Activation::Silu);

    // The _t GEMMs: small m (k64 when k >= the lever's minimum and k % 64 == 0), then m128.
    // H = 192 (k % 64 == 0 for gate/up), I = 320 (k % 64 == 0 for down).
    for (lev, m, want) in [
        (levers(&[]), 5, ["w4a16_gemm_t"; 2]),
        (
            levers(&[("METRALE_W4A16_K64_MIN_K", "64")]),
            64,
            ["w4a16_gemm_t_k64"; 2],
        ),
        (levers(&[]), 65, ["w4a16_gemm_t_m128_v2"; 2]),
        (
            levers(&[("METRALE_FFN_SMALLM", "0")]),
            3,
            ["w4a16_gemm_t_m128_v2"; 2],
        ),
    ] {
        let mut c = ctx(HostBackend::new(), lev);
        let mut l = DenseFfnLayer::new(&c);
        install_nvfp4_t(c.backend.as_ref(), &mut l, &w).unwrap();
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &l, "prefill", x, m).unwrap();
        assert_eq!(
            c.trace,
            [want[0], want[1], "act_mul_silu", want[0]],
            "m={m}"
        );
        let e = rel_err(&y, &f64_ref(&xs, m));
        assert!(e < 1e-2, "m={m}: {e}");
    }
    // Without v2, m128; without any _t kernel, the base GEMM.
    let mut c = ctx(HostBackend::without(&["w4a16_gemm_t_m128_v2"]), levers(&[]));
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4_t(c.backend.as_ref(), &mut l, &w).unwrap();
    let (x, _) = input(&c, &mut r, 70);
    run(&mut c, &l, "prefill", x, 70).unwrap();
    assert_eq!(count(&c.trace, "w4a16_gemm_t_m128"), 3);
    let mut c = ctx(
        HostBackend::without(&["w4a16_gemm_t", "w4a16_gemm_t_k64"]),
        levers(&[]),
    );
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4_t(c.backend.as_ref(), &mut l, &w).unwrap();
    let (x, _) = input(&c, &mut r, 4);
    run(&mut c, &l, "prefill", x, 4).unwrap();
    assert_eq!(count(&c.trace, "w4a16_gemm"), 3);

    // After finalize_nvfp4_mmq_load the tiles serve prefill (any m): through the dequantizing
    // wgmma GEMM (HARDWARE.toml's `dq_wgmma`; x and the activation product rounded to bf16
    // once), or with the lever off through the MMQ GEMM.
    let wgmma = [
        "f32_to_bf16_il8",
        "nvfp4_wgmma",
        "nvfp4_wgmma",
        "act_mul_silu_il8",
        "nvfp4_wgmma",
    ];
    let mma_sync = [
        "nvfp4_mmq_gemm",
        "nvfp4_mmq_gemm",
        "act_mul_silu",
        "nvfp4_mmq_gemm",
    ];
    for (env, want) in [
        (&[][..], &wgmma[..]),
        (&[("METRALE_DQ_WGMMA", "0")][..], &mma_sync[..]),
    ] {
        let mut c = ctx(HostBackend::new(), levers(env));
        let mut l = DenseFfnLayer::new(&c);
        install_nvfp4_t(c.backend.as_ref(), &mut l, &w).unwrap();
        assert!(l.finalize_nvfp4_mmq_load(&mut c, H, I, 0).unwrap());
        for m in [1usize, 33, 100] {
            let (x, xs) = input(&c, &mut r, m);
            let y = run(&mut c, &l, "prefill", x, m).unwrap();
            assert_eq!(c.trace, want, "m={m}");
            let e = rel_err(&y, &f64_ref(&xs, m));
            assert!(e < 1e-2, "mmq m={m}: {e}");
        }
    }
    // Decode through the prefill GEMM (METRALE_DECODE_FFN_VIA_GEMM).
    let mut c = ctx(
        HostBackend::new(),
        levers(&[("METRALE_DECODE_FFN_VIA_GEMM", "1")]),
    );
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    let (x, _) = input(&c, &mut r, 1);
    run(&mut c, &l, "forward", x, 1).unwrap();
    assert_eq!(
        c.trace,
        ["w4a16_gemm", "w4a16_gemm", "act_mul_silu", "w4a16_gemm"]
    );

    // The SiLU-fused down GEMV (lever), not for GELU.
    for (act, want) in [
        (
            Activation::Silu,
            vec!["w4a16_gemv_dual", "w4a16_gemv_silu_down"],
        ),
        (
            Activation::Gelu,
            vec!["w4a16_gemv_dual", "act_mul_gelu", "w4a16_gemv"],
        ),
    ] {
        let mut c = ctx(
            HostBackend::new(),
            levers(&[("METRALE_FFN_SILU_FUSED_DOWN", "1")]),
        );
        let mut l = DenseFfnLayer::new_with_activation(&c, act);
        install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
        let (x, xs) = input(&c, &mut r, 1);
        let y = run(&mut c, &l, "forward", x, 1).unwrap();
        assert_eq!(c.trace, want);
        let e = rel_err(&y, &ffn_f64_with(&xs, 1, &wd, act, ActRound::Bf16));
        assert!(e < 1e-5, "{act:?}: {e}");
    }

    // forward_km: the W4A16 batch-m tiers by row count; 17 rows is refused.
    let mut c = ctx(HostBackend::new(), levers(&[]));
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    for (m, tier) in [
        (1, "nvfp4_proj_small_m4"),
        (4, "nvfp4_proj_small_m4"),
        (5, "nvfp4_proj_small_m8"),
        (16, "nvfp4_proj_small_m16"),
    ] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &l, "km", x, m).unwrap();
        assert_eq!(c.trace, [tier, tier, "act_mul_silu", tier]);
        let e = rel_err(
            &y,
            &ffn_f64_with(&xs, m, &wd, Activation::Silu, ActRound::Bf16),
        );
        assert!(e < 1e-5, "km m={m}: {e}");
    }
    let (x, _) = input(&c, &mut r, 17);
    let e = run(&mut c, &l, "km", x, 17).unwrap_err().to_string();
    assert!(e.contains("1..=16"), "{e}");

    // W4A4: one row with METRALE_SINGLE_ROW_W4A4, 2-3 rows with METRALE_SMALL_BATCH_W4A4.
    let w4a4 = [
        "quantize_act_nvfp4",
        "nvfp4_proj_mx",
        "nvfp4_proj_mx",
        "act_mul_silu",
        "quantize_act_nvfp4",
        "nvfp4_proj_mx",
    ];
    let mut c = ctx(
        HostBackend::new(),
        levers(&[
            ("METRALE_SINGLE_ROW_W4A4", "1"),
            ("METRALE_SMALL_BATCH_W4A4", "1"),
        ]),
    );
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    for (method, m) in [("forward", 1), ("k2", 2), ("k3", 3)] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &l, method, x, m).unwrap();
        assert_eq!(c.trace, w4a4, "{method}");
        // Against a float64 FFN that quantizes its activations the same way (a last-bit
        // difference in the f32 intermediate can move one E2M1 code: 1e-2).
        let e = rel_err(&y, &w4a4_ffn_f64(&xs, m, &wd, Activation::Silu));
        assert!(e < 1e-2, "{method}: {e}");
        // and W4A4 costs accuracy against the unquantized-activation FFN, as expected.
        assert!(rel_err(&y, &f64_ref(&xs, m)) > 1e-3);
    }
    // Without the kernel W4A4 is not taken.
    let c2 = ctx(
        HostBackend::without(&["nvfp4_proj_mx"]),
        levers(&[("METRALE_SINGLE_ROW_W4A4", "1")]),
    );
    let l2 = DenseFfnLayer::new(&c2);
    assert!(!l2.single_row_w4a4(&c2));

    // The fixed W4A4 path: a row's bits alone equal its bits inside a batch.
    let mut c = ctx(HostBackend::new(), levers(&[]));
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    let m = 9;
    let (x, xs) = input(&c, &mut r, m);
    let all = run(&mut c, &l, "fixed", x, m).unwrap();
    assert_eq!(c.trace, w4a4);
    for row in [0, 4, 8] {
        let x1 = c.backend.alloc((H * 4) as u64).unwrap();
        upload_f32(c.backend.as_ref(), x1, &xs[row * H..(row + 1) * H]).unwrap();
        let one = run(&mut c, &l, "fixed", x1, 1).unwrap();
        assert!(
            one.iter()
                .zip(&all[row * H..(row + 1) * H])
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
    // Declared W8A8 on an NVFP4-only layer, or GELU: no fixed arm, an error that says why.
    for (lev, act) in [
        (
            levers(&[("METRALE_ACTIVATION_QUANTIZATION", "w8a8")]),
            Activation::Silu,
        ),
        (levers(&[]), Activation::Gelu),
    ] {
        let mut c = ctx(HostBackend::new(), lev);
        let mut l = DenseFfnLayer::new_with_activation(&c, act);
        install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
        let (x, _) = input(&c, &mut r, 2);
        let e = run(&mut c, &l, "fixed", x, 2).unwrap_err().to_string();
        assert!(e.contains("no fixed-quantization arm"), "{e}");
    }
    // Declared A4: forward_km runs W4A4 at any tier row count.
    let mut c = ctx(
        HostBackend::new(),
        levers(&[("METRALE_ACTIVATION_QUANTIZATION", "w4a4")]),
    );
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
    let (x, _) = input(&c, &mut r, 12);
    run(&mut c, &l, "km", x, 12).unwrap();
    assert_eq!(c.trace, w4a4);
}

#[test]
fn the_k_split_down_gemv_serves_long_rows_only_when_the_lever_says() {
    let mut r = Rand(83);
    let w = DenseWeights::random(&mut r, H, I);
    let wd = nvfp4_decoded(&w);
    // Off by default (HARDWARE.toml 0); from k = I up with the lever; not below it.
    for (lev, want) in [
        (levers(&[]), "w4a16_gemv"),
        (
            levers(&[("METRALE_W4A16_GEMV_KSPLIT_MIN_K", "320")]),
            "w4a16_gemv_ksplit",
        ),
        (
            levers(&[("METRALE_W4A16_GEMV_KSPLIT_MIN_K", "321")]),
            "w4a16_gemv",
        ),
    ] {
        let mut c = ctx(HostBackend::new(), lev);
        let mut l = DenseFfnLayer::new(&c);
        install_nvfp4(c.backend.as_ref(), &mut l, &w).unwrap();
        let (x, xs) = input(&c, &mut r, 1);
        let y = run(&mut c, &l, "forward", x, 1).unwrap();
        assert_eq!(c.trace, ["w4a16_gemv_dual", "act_mul_silu", want]);
        // The dual GEMV rounds x to bf16; the k-split down GEMV keeps its f32 input.
        let down = metrale_pack::gpu::table::spec("ffn_nvfp4", want)
            .unwrap()
            .round;
        let mut xr = xs.clone();
        xr.iter_mut().for_each(|v| *v = ActRound::Bf16.apply(*v));
        let e = rel_err(&y, &ffn_f64_with(&xr, 1, &wd, Activation::Silu, down));
        assert!(e < 1e-5, "{want}: {e}");
    }
}
