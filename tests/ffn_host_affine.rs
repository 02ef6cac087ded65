//! The affine arms on the host backend: decode, small batches and prefill against the float64
//! FFN of the carried weights, and the GPU carries (`finalize_affine_load`, `_awq_load`) against
//! the converter's bytes (the AutoAWQ fixture's tensors).

mod common;

use common::ffn::*;
use metrale_pack::converters::layouts;
use metrale_pack::ffn::{DenseFfnLayer, key};
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::model::Activation;
use metrale_pack::testing::*;

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
