//! `DenseFfnLayer` on the host reference backend: every method's routing (which kernels serve
//! which row counts under which levers and missing kernels), the refusals, and outputs against
//! a float64 reference of the whole FFN on the weights the arm really holds.

use metrale_pack::converters::layouts;
use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::gpu::{DevicePtr, GpuBackend, GpuError, ModelLevers, download_f32, upload_f32};
use metrale_pack::model::Activation;
use metrale_pack::testing::*;
use std::collections::HashMap;
use std::sync::Arc;

const H: usize = 192; // not a multiple of 128: FP8 pads K
const I: usize = 320; // nor this: FP8 pads N

fn levers(pairs: &[(&str, &str)]) -> ModelLevers {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    ModelLevers::from_map(&env, metrale_pack::gpu::levers::HARDWARE_SM90)
}

fn ctx(b: HostBackend, lev: ModelLevers) -> ForwardContext {
    ForwardContext::new(
        Arc::new(b),
        FfnConfig {
            hidden: H,
            inter: I,
        },
        128,
        lev,
    )
    .unwrap()
}

fn input(c: &ForwardContext, r: &mut Rand, m: usize) -> (DevicePtr, Vec<f32>) {
    let x = r.vec(m * H, 1.0);
    let p = c.backend.alloc((m * H * 4) as u64).unwrap();
    upload_f32(c.backend.as_ref(), p, &x).unwrap();
    (p, x)
}

fn fp8_decoded(w: &DenseWeights) -> DenseWeights {
    decoded(w, |x, n, k| {
        let e = layouts::fp8::encode(x, n, k);
        layouts::crop(
            &layouts::fp8::decode_padded(&e.parts[0].1, &e.parts[1].1, e.padded[0], e.padded[1]),
            e.padded[1],
            n,
            k,
        )
    })
}

fn run(
    c: &mut ForwardContext,
    layer: &DenseFfnLayer,
    method: &str,
    x: DevicePtr,
    m: usize,
) -> Result<Vec<f32>, GpuError> {
    c.trace.clear();
    poison(c.backend.as_ref(), c.arena.output).unwrap();
    let out = match method {
        "forward" => layer.forward(c, x),
        "k2" => layer.forward_k2(c, x),
        "k3" => layer.forward_k3(c, x),
        "km" => layer.forward_km(c, x, m),
        "prefill" => layer.forward_prefill(c, x, m),
        "batched" => layer.forward_batched(c, x, m),
        "fixed" => layer.forward_fixed(c, x, m),
        _ => unreachable!(),
    }?;
    assert_eq!(out.bytes, (m * H * 4) as u64);
    let y = download_f32(c.backend.as_ref(), out).unwrap();
    assert!(
        y.iter().all(|v| v.is_finite()),
        "{method} m={m}: unwritten (NaN) outputs"
    );
    Ok(y)
}

fn count(trace: &[&str], name: &str) -> usize {
    trace.iter().filter(|t| **t == name).count()
}

#[test]
fn fp8_routing_and_outputs() {
    let mut r = Rand(11);
    let w = DenseWeights::random(&mut r, H, I);
    let reference_w = fp8_decoded(&w);
    for (lev, fused) in [
        (levers(&[]), true),
        (levers(&[]), false),
        (levers(&[("METRALE_FFN_M16_TC", "1")]), false),
        (levers(&[("METRALE_FFN_BATCH16", "1")]), false),
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
            // bf16-rounded activations in the tensor-core arms bound the error at ~2^-8 per product.
            assert!(e < 1e-2, "{method} m={m}: rel err {e}");
            let t = &c.trace;
            let proj = t.len() - 1; // one act-mul
            assert_eq!(count(t, "act_mul_silu"), 1, "{t:?}");
            match m {
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
        HostBackend::without(&["w8a16_gemv_batch4", "w8a16_gemm_pipelined"]),
        levers(&[]),
    );
    let mut layer = DenseFfnLayer::new(&c);
    install_fp8(c.backend.as_ref(), &mut layer, &w, true).unwrap();
    assert!(!layer.gateup_fused_plan(&c));
    let (x, _) = input(&c, &mut r, 2);
    run(&mut c, &layer, "k2", x, 2).unwrap();
    assert_eq!(count(&c.trace, "w8a16_gemm"), 3, "{:?}", c.trace);
    let mut c = ctx(
        HostBackend::without(&["w8a16_gemv_batch4", "w8a16_gemm_pipelined", "w8a16_gemm"]),
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
        assert_eq!(
            count(&c.trace, "quantize_act_fp8_row"),
            3,
            "{method}: {:?}",
            c.trace
        );
        assert_eq!(count(&c.trace, "w8a8_gemm"), 3);
        // FP8 activations (3 mantissa bits) on top of FP8 weights.
        let e = rel_err(&y, &ffn_f64(&xs, m, &wd, Activation::Silu));
        assert!(e < 0.08, "{method} m={m}: {e}");
    }
    // Past w8a8_max_rows, prefill falls through to the next installed arm (FP8).
    let (x, _) = input(&c, &mut r, 65);
    run(&mut c, &layer, "prefill", x, 65).unwrap();
    assert_eq!(count(&c.trace, "w8a8_gemm"), 0);
    assert_eq!(count(&c.trace, "w8a16_gemm_pipelined"), 3);
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
    // GELU layers and wrong shapes are refused.
    let mut gl = DenseFfnLayer::new_with_activation(&c, Activation::Gelu);
    let e = install_w8a8(c.backend.as_ref(), &mut gl, &w)
        .unwrap_err()
        .to_string();
    assert!(e.contains("refuses a GELU FFN"), "{e}");
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
        // The host computes the same products in f64: only the f32 act-mul and output rounding differ.
        let e = rel_err(&y, &ffn_f64(&xs, m, &wd, Activation::Silu));
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
        .weights()
        .nvfp4_t
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
        let got_p = layer.weights().nvfp4_mmq[p].unwrap();
        let mut got = vec![0u8; got_p.bytes as usize];
        c.backend.download(got_p, &mut got).unwrap();
        assert!(
            got == want,
            "projection {p}: repack differs from the converter"
        );
        assert!(layer.weights().nvfp4_t[p].is_none());
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
        let built: Vec<bool> = l.weights().nvfp4_mmq.iter().map(Option::is_some).collect();
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
fn every_kernel_name_exists_in_the_cuda_sources() {
    // The host backend implements exactly the entry points of kernels/*.cu.
    let b = HostBackend::new();
    for s in metrale_pack::gpu::table::KERNELS {
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
    // error everywhere and pass (guards the harness, not the kernels).
    use metrale_pack::check;
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let mut r = Rand(5);
    let mut rows = check::kernel_checks(b.clone(), &[(256, 384)], &[1, 4, 5, 17], &mut r).unwrap();
    rows.extend(check::layer_checks(b, &[(256, 384)], &[1, 2, 3, 17], &mut r).unwrap());
    assert!(rows.len() > 40);
    for row in &rows {
        assert!(row.pass && row.err < 1e-6, "{row:?}");
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

    // After finalize_nvfp4_mmq_load the MMQ GEMM serves prefill from the tiles (any m).
    let mut c = ctx(HostBackend::new(), levers(&[]));
    let mut l = DenseFfnLayer::new(&c);
    install_nvfp4_t(c.backend.as_ref(), &mut l, &w).unwrap();
    assert!(l.finalize_nvfp4_mmq_load(&mut c, H, I, 0).unwrap());
    for m in [1usize, 33, 100] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &l, "prefill", x, m).unwrap();
        assert_eq!(
            c.trace,
            [
                "nvfp4_mmq_gemm",
                "nvfp4_mmq_gemm",
                "act_mul_silu",
                "nvfp4_mmq_gemm"
            ]
        );
        let e = rel_err(&y, &f64_ref(&xs, m));
        assert!(e < 1e-2, "mmq m={m}: {e}");
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
        let e = rel_err(&y, &ffn_f64(&xs, 1, &wd, act));
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
        let e = rel_err(&y, &f64_ref(&xs, m));
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
fn lora_on_every_nvfp4_arm_and_its_refusals() {
    let mut r = Rand(53);
    let w = DenseWeights::random(&mut r, H, I);
    let wd = nvfp4_decoded(&w);
    let ad = LoraAdapter::random(&mut r, H, I, 8);
    let want_w = ad.applied_to(&wd);
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
        let e = rel_err(&y, &ffn_f64(&xs, m, &want_w, Activation::Silu));
        assert!(e < tol, "{method} m={m}: {e}");
        // The adapter changes the result (a test that could fail).
        assert!(rel_err(&y, &ffn_f64(&xs, m, &wd, Activation::Silu)) > 1e-3);
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
    let t0 = l.weights().nvfp4_t[0].unwrap().codes();
    c.trace.clear();
    assert!(l.finalize_q4k_load(&mut c, H, I, 0).unwrap());
    assert_eq!(
        c.trace,
        ["nvfp4_to_q4k", "nvfp4_to_q4k", "nvfp4_to_int8_rows"]
    );
    assert!(l.weights().nvfp4_t.iter().all(Option::is_none));
    assert!(
        c.backend.download(t0, &mut [0u8; 4]).is_err(),
        "_t copy not freed"
    );
    // The built bytes are the converter's (and so ggml's reference quantizer's) for the NVFP4
    // values the layer holds.
    let q = l.weights().q4k.unwrap();
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
    // Prefill with METRALE_Q4K_MMQ: q8_1 activations shared by gate and up, int8 down.
    for m in [1usize, 5, 40] {
        let (x, xs) = input(&c, &mut r, m);
        let y = run(&mut c, &l, "prefill", x, m).unwrap();
        assert_eq!(
            c.trace,
            [
                "quantize_act_q8_1",
                "q4k_mmq_gemm",
                "q4k_mmq_gemm",
                "act_mul_silu",
                "requant_a_bf16_int8",
                "q4k_mmq_int8_down_gemm"
            ]
        );
        // 8-bit activations: 2e-2 of the f64 FFN on the weights the arm holds.
        let e = rel_err(
            &y,
            &ffn_f64(&xs, m, &q4k_mmq_decoded(&w, false), Activation::Silu),
        );
        assert!(e < 2e-2, "m={m}: {e}");
    }
    // Run again, or given the copies (a pack): nothing to do, no launch.
    let n0 = c.backend.launch_count();
    assert!(!l.finalize_q4k_load(&mut c, H, I, 0).unwrap());
    assert_eq!(c.backend.launch_count(), n0);
    // METRALE_Q4K_MMQ_DOWN_Q4K, or the int8 kernels missing: down is Q4_K.
    for (b, lev) in [
        (
            HostBackend::new(),
            levers(&[("METRALE_Q4K_MMQ", "1"), ("METRALE_Q4K_MMQ_DOWN_Q4K", "1")]),
        ),
        (
            HostBackend::without(&["q4k_mmq_int8_down_gemm"]),
            mmq.clone(),
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
        assert!(l.weights().q4k.is_none());
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
    assert_eq!(count(&c.trace, "q4k_mmq_gemm"), 2);
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
        let e = rel_err(&y, &ffn_f64(&xs, 1, &wd, Activation::Silu));
        assert!(e < 1e-5, "{want}: {e}");
    }
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
    assert!(l.weights().q4k.is_none());
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
