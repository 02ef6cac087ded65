//! `DenseFfnLayer` on the host reference backend: every method's routing (which kernels serve
//! which row counts under which levers and missing kernels), the refusals, and outputs against
//! a float64 reference of the whole FFN on the weights the arm really holds. This file: the FP8,
//! W8A8 and BF16 arms, the kernel table and the check harness; tests/ffn_host_nvfp4.rs: the
//! NVFP4 arms; tests/ffn_host_overlays.rs: LoRA, q2g128 and Q4_K MMQ; tests/ffn_host_affine.rs:
//! the affine arms.

mod common;

use common::ffn::*;
use metrale_pack::converters::layouts;
use metrale_pack::ffn::DenseFfnLayer;
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::gpu::{GpuBackend, upload_f32};
use metrale_pack::model::Activation;
use metrale_pack::testing::*;
use std::sync::Arc;

#[test]
fn fp8_routing_and_outputs() {
    let mut r = Rand(11);
    let w = DenseWeights::random(&mut r, H, I);
    let reference_w = fp8_decoded(&w);
    for (lev, fused) in [
        (levers(&[]), true),
        (levers(&[]), false),
        // The tensor-core GEMV from one row to 8, W8A8 from 9.
        (
            levers(&[
                ("METRALE_FP8_GEMV_MMA_MIN_ROWS", "1"),
                ("METRALE_FP8_W8A8_MIN_ROWS", "9"),
            ]),
            true,
        ),
        // The f32 FFMA GEMVs for 1..4 rows and W8A8 from 5 (the defaults before session 17).
        (
            levers(&[
                ("METRALE_FP8_GEMV_MMA", "0"),
                ("METRALE_FP8_W8A8_MIN_ROWS", "5"),
            ]),
            true,
        ),
        // W8A8 from 33 rows (the default before 2026-12-02): 5..32 rows on the w8a16 kernels.
        (
            levers(&[
                ("METRALE_FP8_GEMV_MMA", "0"),
                ("METRALE_FP8_W8A8_MIN_ROWS", "33"),
            ]),
            false,
        ),
        (
            levers(&[
                ("METRALE_FP8_GEMV_MMA", "0"),
                ("METRALE_FFN_M16_TC", "1"),
                ("METRALE_FP8_W8A8_MIN_ROWS", "33"),
            ]),
            false,
        ),
        (
            levers(&[
                ("METRALE_FP8_GEMV_MMA", "0"),
                ("METRALE_FFN_BATCH16", "1"),
                ("METRALE_FP8_W8A8_MIN_ROWS", "33"),
            ]),
            false,
        ),
        (levers(&[("METRALE_FP8_W8A8", "0")]), false),
    ] {
        let mut c = ctx(HostBackend::new(), lev.clone());
        let mut layer = DenseFfnLayer::new(&c);
        install_fp8(c.backend.as_ref(), &mut layer, &w, fused).unwrap();
        for (method, m) in [
            ("forward", 1),
            ("k2", 2),
            ("k3", 3),
            ("prefill", 4),
            ("prefill", 5),
            ("prefill", 16),
            ("prefill", 17),
            ("batched", 33),
            ("km", 7),
        ] {
            let (x, xs) = input(&c, &mut r, m);
            let y = run(&mut c, &layer, method, x, m).unwrap();
            let e = rel_err(&y, &ffn_f64(&xs, m, &reference_w, Activation::Silu));
            let t = &c.trace;
            if lev.fp8_w8a8 && m >= lev.fp8_w8a8_min_rows {
                // The W8A8 prefill: x per 128-column group for gate and up, the SiLU product
                // quantized from gate and up (no act-mul), three block-scaled FP8 GEMMs. FP8
                // activations (3 mantissa bits) bound the error near 2^-4 per value, averaged.
                assert_eq!(
                    t,
                    &[
                        "quantize_act_fp8_g128",
                        "fp8_wgmma",
                        "fp8_wgmma",
                        "quantize_act_mul_fp8_g128",
                        "fp8_wgmma"
                    ],
                    "m={m}"
                );
                assert!(e < 0.08, "{method} m={m}: rel err {e}");
                continue;
            }
            // bf16-rounded activations in the tensor-core arms bound the error at ~2^-8 per product.
            assert!(e < 1e-2, "{method} m={m}: rel err {e}");
            let proj = t.len() - 1; // one act-mul
            assert_eq!(count(t, "act_mul_silu"), 1, "{t:?}");
            // The tensor-core GEMV from fp8_gemv_mma_min_rows rows up to its 8.
            let mma = lev.fp8_gemv_mma && (lev.fp8_gemv_mma_min_rows..=8).contains(&m);
            match m {
                _ if mma => assert_eq!(count(t, "w8a16_gemv_mma"), proj, "{t:?}"),
                1 if fused => assert_eq!(
                    t,
                    &["w8a16_gemv_batch4", "act_mul_silu", "w8a16_gemv_batch4"]
                ),
                1..=4 => assert_eq!(count(t, "w8a16_gemv_batch4"), 3, "{t:?}"),
                5..=32 if lev.ffn_m16_tc => assert_eq!(
                    count(t, "w8a16_gemm_m16"),
                    if m > 16 { 6 } else { 3 },
                    "{t:?}"
                ),
                5..=32 if lev.ffn_batch16 => assert_eq!(
                    count(t, "w8a16_gemv_batch16"),
                    if m > 16 { 6 } else { 3 },
                    "{t:?}"
                ),
                _ => assert_eq!(count(t, "w8a16_gemm_pipelined"), proj, "{t:?}"),
            }
        }
        assert_eq!(layer.narrow_rows(&c), if lev.ffn_batch16 { 16 } else { 4 });
        // The NVFP4 batch-m tiers resolve, so an FP8 layer offers forward_km (to its prefill).
        assert!(layer.can_forward_km(2) && !layer.can_forward_km(17));
        assert_eq!(layer.gateup_fused_plan(&c), fused);
    }
}

#[test]
fn fp8_falls_through_missing_kernels_and_names_the_last() {
    let mut r = Rand(12);
    let w = DenseWeights::random(&mut r, H, I);
    let mut c = ctx(
        HostBackend::without(&[
            "w8a16_gemv_mma",
            "w8a16_gemv_batch4",
            "w8a16_gemm_pipelined",
        ]),
        levers(&[]),
    );
    let mut layer = DenseFfnLayer::new(&c);
    install_fp8(c.backend.as_ref(), &mut layer, &w, true).unwrap();
    assert!(!layer.gateup_fused_plan(&c));
    let (x, _) = input(&c, &mut r, 2);
    run(&mut c, &layer, "k2", x, 2).unwrap();
    assert_eq!(count(&c.trace, "w8a16_gemm"), 3, "{:?}", c.trace);
    let mut c = ctx(
        HostBackend::without(&[
            "w8a16_gemv_mma",
            "w8a16_gemv_batch4",
            "w8a16_gemm_pipelined",
            "w8a16_gemm",
        ]),
        levers(&[]),
    );
    let mut layer = DenseFfnLayer::new(&c);
    install_fp8(c.backend.as_ref(), &mut layer, &w, false).unwrap();
    let (x, _) = input(&c, &mut r, 1);
    let e = run(&mut c, &layer, "forward", x, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ffn_fp8::w8a16_gemm"), "{e}");
}

#[test]
fn w8a8_declared_arm_fixed_path_and_refusals() {
    let mut r = Rand(13);
    let w = DenseWeights::random(&mut r, H, I);
    let mut c = ctx(HostBackend::new(), levers(&[]));
    let mut layer = DenseFfnLayer::new(&c);
    install_w8a8(c.backend.as_ref(), &mut layer, &w).unwrap();
    install_fp8(c.backend.as_ref(), &mut layer, &w, false).unwrap();
    let wd = decoded(&w, |x, n, k| {
        let e = layouts::w8a8::encode(x, n, k);
        layouts::w8a8::decode(&e.parts[0].1, &e.parts[1].1, n, k, e.padded[1])
    });
    for (method, m) in [("forward", 1), ("k3", 3), ("prefill", 64), ("fixed", 100)] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &layer, method, x, m).unwrap();
        // x quantized once for gate and up; the SiLU product, fused with its quantizer, once
        // for down (no act-mul launch).
        for (kernel, n) in [
            ("quantize_act_fp8_row", 1),
            ("quantize_act_mul_fp8_row", 1),
            ("act_mul_silu", 0),
        ] {
            assert_eq!(
                count(&c.trace, kernel),
                n,
                "{method}: {kernel} {:?}",
                c.trace
            );
        }
        // Every m through the sm_90a wgmma GEMMs where they resolved (the host has every
        // kernel): the decode tiling up to its 64-row cap, the prefill tiling above.
        let tiling = if m <= 64 {
            "w8a8_wgmma_m64"
        } else {
            "w8a8_wgmma"
        };
        assert_eq!(count(&c.trace, tiling), 3, "{method}: {:?}", c.trace);
        // FP8 activations (3 mantissa bits) on top of FP8 weights.
        let e = rel_err(&y, &ffn_f64(&xs, m, &wd, Activation::Silu));
        assert!(e < 0.08, "{method} m={m}: {e}");
    }
    // Without the wgmma GEMM (another device, or METRALE_W8A8_WGMMA=0), the portable GEMM
    // serves every m; with METRALE_W8A8_DECODE_GEMV, m <= 16 projections go through w8a8_gemv.
    // The host computes all three with the same twin, so the outputs are the same bits.
    for (backend, lev) in [
        (
            HostBackend::without(&["w8a8_wgmma", "w8a8_wgmma_m64"]),
            vec![],
        ),
        (HostBackend::new(), vec![("METRALE_W8A8_WGMMA", "0")]),
    ] {
        let mut cf = ctx(backend, levers(&lev));
        let mut lf = DenseFfnLayer::new(&cf);
        install_w8a8(cf.backend.as_ref(), &mut lf, &w).unwrap();
        for (method, m) in [("forward", 1), ("fixed", 100)] {
            let (x, _) = input(&cf, &mut r, m);
            run(&mut cf, &lf, method, x, m).unwrap();
            assert_eq!(count(&cf.trace, "w8a8_gemm"), 3, "{lev:?} {method}");
            assert!(
                !cf.trace.iter().any(|k| k.starts_with("w8a8_wgmma")),
                "{lev:?} {method}"
            );
        }
    }
    let mut cg = ctx(
        HostBackend::without(&["w8a8_wgmma", "w8a8_wgmma_m64"]),
        levers(&[("METRALE_W8A8_DECODE_GEMV", "1")]),
    );
    let mut lg = DenseFfnLayer::new(&cg);
    install_w8a8(cg.backend.as_ref(), &mut lg, &w).unwrap();
    for (method, m, gemv) in [
        ("forward", 1, 3),
        ("k3", 3, 3),
        ("fixed", 16, 3),
        ("fixed", 17, 0),
    ] {
        let (x, xs) = input(&cg, &mut r, m);
        let y = run(&mut cg, &lg, method, x, m).unwrap();
        assert_eq!(count(&cg.trace, "w8a8_gemv"), gemv, "{method} m={m}");
        assert_eq!(count(&cg.trace, "w8a8_gemm"), 3 - gemv, "{method} m={m}");
        let (x2, _) = (c.backend.alloc((m * H * 4) as u64).unwrap(), ());
        upload_f32(c.backend.as_ref(), x2, &xs).unwrap();
        let y2 = run(&mut c, &layer, method, x2, m).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y), bits(&y2), "{method} m={m}");
    }
    // Past w8a8_max_rows, prefill falls through to the next installed arm (FP8).
    let (x, _) = input(&c, &mut r, 65);
    run(&mut c, &layer, "prefill", x, 65).unwrap();
    assert!(
        !c.trace.iter().any(|k| k.starts_with("w8a8_")),
        "{:?}",
        c.trace
    );
    // (Its prefill at 65 rows: the W8A8 GEMM over the block-scaled FP8 weights.)
    assert_eq!(count(&c.trace, "fp8_wgmma"), 3, "{:?}", c.trace);
    // Fixed path: a row's bits do not depend on the batch.
    let (x, xs) = input(&c, &mut r, 9);
    let all = run(&mut c, &layer, "fixed", x, 9).unwrap();
    for row in [0, 4, 8] {
        let (x1, _) = (c.backend.alloc((H * 4) as u64).unwrap(), ());
        upload_f32(c.backend.as_ref(), x1, &xs[row * H..(row + 1) * H]).unwrap();
        let one = run(&mut c, &layer, "fixed", x1, 1).unwrap();
        assert!(
            one.iter()
                .zip(&all[row * H..(row + 1) * H])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {row}"
        );
    }
    // A GELU layer takes the weights and forwards with the GELU (the act-mul and the fused
    // quantizer take the activation): within the SiLU bound of the float64 FFN; wrong shapes
    // are refused.
    let mut gl = DenseFfnLayer::new_with_activation(&c, Activation::Gelu);
    install_w8a8(c.backend.as_ref(), &mut gl, &w).unwrap();
    for (method, m) in [("k3", 3), ("fixed", 9)] {
        let (xg, xgs) = input(&c, &mut r, m);
        c.trace.clear();
        let got = run(&mut c, &gl, method, xg, m).unwrap();
        assert_eq!(
            count(&c.trace, "quantize_act_mul_fp8_row"),
            1,
            "{:?}",
            c.trace
        );
        let e = rel_err(&got, &ffn_f64(&xgs, m, &wd, Activation::Gelu));
        assert!(e < 0.08, "GELU W8A8 {method}: {e:.2e}");
    }
    let mut sl = DenseFfnLayer::new(&c);
    let swapped = DenseWeights {
        gate: w.down.clone(),
        up: w.up.clone(),
        down: w.down.clone(),
        hidden: H,
        inter: I,
    };
    let e = install_w8a8(
        c.backend.as_ref(),
        &mut sl,
        &DenseWeights {
            hidden: I,
            inter: H,
            ..swapped
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("hidden/inter"), "{e}");
}

#[test]
fn bf16_arms_with_and_without_blas() {
    let mut r = Rand(14);
    let w = DenseWeights::random(&mut r, H, I);
    let wd = decoded(&w, |x, n, k| {
        layouts::bf16::decode(&layouts::bf16::encode(x, n, k).parts[0].1, n, k, k)
    });
    for act in [Activation::Silu, Activation::Gelu] {
        let mut c = ctx(HostBackend::new(), levers(&[]));
        let mut layer = DenseFfnLayer::new_with_activation(&c, act);
        install_bf16(c.backend.as_ref(), &mut layer, &w).unwrap();
        for (method, m) in [("forward", 1), ("k2", 2), ("prefill", 40)] {
            let (x, xs) = input(&c, &mut r, m);
            let y = run(&mut c, &layer, method, x, m).unwrap();
            let e = rel_err(&y, &ffn_f64(&xs, m, &wd, act));
            assert!(e < 1e-2, "{method} {act:?}: {e}");
            if m == 1 {
                assert_eq!(count(&c.trace, "bf16_gemv_batch4"), 3);
            } else {
                assert_eq!(count(&c.trace, "cublas_gemm_bf16"), 3, "{:?}", c.trace);
            }
        }
    }
    let mut c = ctx(HostBackend::without(&["gemm_bf16"]), levers(&[]));
    let mut layer = DenseFfnLayer::new(&c);
    install_bf16(c.backend.as_ref(), &mut layer, &w).unwrap();
    let (x, _) = input(&c, &mut r, 3);
    run(&mut c, &layer, "k3", x, 3).unwrap();
    assert_eq!(count(&c.trace, "bf16_gemv_batch4"), 3);
    let (x, _) = input(&c, &mut r, 5);
    let e = run(&mut c, &layer, "prefill", x, 5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gemm_bf16"), "{e}");
}

#[test]
fn every_kernel_name_exists_in_the_cuda_sources() {
    // The host backend implements exactly the entry points of kernels/*.cu.
    let b = HostBackend::new();
    for s in &metrale_pack::gpu::table::KERNELS {
        assert!(
            b.kernel(s.module, s.name).ok(),
            "{}: {}::{} does not resolve",
            s.field,
            s.module,
            s.name
        );
    }
}

#[test]
fn gpu_check_harness_runs_on_the_host_backend() {
    // The device check compares CUDA against the host; run against itself it must report zero
    // error everywhere and pass (guards the harness, not the kernels), but for the rows that
    // measure a kernel contract's own error against full precision (the affine GEMVs' int8
    // activations), which must pass.
    use metrale_pack::check;
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let mut r = Rand(5);
    let mut rows =
        check::kernel_checks(b.clone(), &[(256, 384)], &[1, 4, 5, 17], &mut r, &|_| true).unwrap();
    rows.extend(check::layer_checks(b, &[(256, 384)], &[1, 2, 3, 17], &mut r).unwrap());
    assert!(rows.len() > 40);
    for row in &rows {
        let own = row.check.ends_with("vs unquantized activations");
        assert!(row.pass && (own || row.err < 1e-6), "{row:?}");
    }
}

#[test]
fn profile_logs_the_prefill_time_and_events_time_host_work() {
    use std::io::Write;
    use std::sync::Mutex;
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let w = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .finish();
    let mut r = Rand(21);
    let w8 = DenseWeights::random(&mut r, H, I);
    let mut c = ctx(HostBackend::new(), levers(&[]));
    let mut layer = DenseFfnLayer::new(&c);
    install_fp8(c.backend.as_ref(), &mut layer, &w8, false).unwrap();
    let (x, _) = input(&c, &mut r, 5);
    c.profile = true;
    let (e0, e1) = (
        c.backend.new_event().unwrap(),
        c.backend.new_event().unwrap(),
    );
    tracing::subscriber::with_default(sub, || {
        c.backend.record_event(e0, 0).unwrap();
        layer.forward_prefill(&mut c, x, 5).unwrap();
        c.backend.record_event(e1, 0).unwrap();
    });
    let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("FFN prefill [dense_total] N=5: ") && log.contains("µs"),
        "{log}"
    );
    let ms = c.backend.elapsed_ms(e0, e1).unwrap();
    assert!((0.0..60_000.0).contains(&ms), "{ms}");
    assert!(
        c.backend
            .elapsed_ms(e0, c.backend.new_event().unwrap())
            .is_err(),
        "an unrecorded event has no time"
    );
    // Without the flag there is no log line.
    c.profile = false;
    let before = buf.0.lock().unwrap().len();
    layer.forward_prefill(&mut c, x, 5).unwrap();
    assert_eq!(buf.0.lock().unwrap().len(), before);
}

#[test]
fn a_kernel_size_argument_above_int_is_refused_not_truncated() {
    use metrale_pack::gpu::{KArg, LaunchCfg};
    let b = HostBackend::new();
    let k = b.kernel("ffn_act", "act_mul_silu");
    let p = b.alloc(64).unwrap();
    let args = |rows: usize| {
        [
            KArg::Ptr(p),
            KArg::Ptr(p),
            KArg::Ptr(p),
            KArg::Dim(rows),
            KArg::Dim(4),
            KArg::Dim(4),
            KArg::Dim(4),
            KArg::Dim(4),
        ]
    };
    let cfg = LaunchCfg::grid(1, 1, 256);
    assert!(b.launch(k, cfg, 0, &args(1)).is_ok());
    let e = b.launch(k, cfg, 0, &args(1 << 40)).unwrap_err().to_string();
    assert!(e.contains("`rows`"), "{e}");
}

/// Launch graphs are the CUDA backend's: the host backend refuses a capture by name and runs
/// nothing, and a replay of a graph it never made.
#[test]
fn the_host_backend_has_no_launch_graphs() {
    let b = HostBackend::new();
    let s = b.new_stream().unwrap();
    let mut ran = false;
    let e = b
        .capture(s, &mut || {
            ran = true;
            Ok(())
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("no launch graphs"), "{e}");
    assert!(!ran);
    assert!(b.replay(1, s).is_err());
}
