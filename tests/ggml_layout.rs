//! The block-format engine end to end on the host backend: GGUF files shaped as llama-quantize
//! writes its K-quant mixes (each weight quantized by libgguf, ggml's own quantizers, and
//! written by gguf-py, with llama.cpp's fallbacks where a row is not whole super-blocks:
//! Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0) convert with no flag into `ggml`, every FFN weight
//! carried byte for byte and decoded as gguf-py decodes it, then load and forward through the
//! engine's arms against the float64 FFN of those weights.

mod common;
use common::ffn::loaded_layer_err;
use common::pack::convert_and_verify;
use common::{python_ref, read_npy};
use metrale_pack::HostBackend;
use metrale_pack::ffn::Method;
use metrale_pack::gpu::sizes::{GGML_GEMV_MAX_M, GGML_GEMV_SPLIT4_M};
use metrale_pack::gpu::{GpuBackend, upload_f32};
use metrale_pack::layout::Layout;
use metrale_pack::layout::Proj;
use metrale_pack::loader::{EngineOptions, LoadedModel};
use metrale_pack::model::{Activation, Model};
use metrale_pack::pack::blob_name;
use std::sync::Arc;

/// Convert the mix `mix` (per layer `gate/up/down`) of a `[hidden, inter]` model of `act` by
/// default and check every weight, then forward each layer on 1, 3, 9 and 20 rows.
fn mix_converts_and_forwards(
    hidden: usize,
    inter: usize,
    act: &str,
    mix: &str,
    want: &[[&str; 3]],
) {
    mix_with_scales(hidden, inter, act, mix, "", want);
}

/// As [`mix_converts_and_forwards`], every layer's projections named in `scales`
/// (`"up=0.5,down=0.25"`) beside llama.cpp's per-tensor output scale (`blk.N.ffn_X.scale`):
/// the blob records it and decodes to gguf-py's decode times it, and the layer's output is the
/// FFN of those products.
fn mix_with_scales(
    hidden: usize,
    inter: usize,
    act: &str,
    mix: &str,
    scales: &str,
    want: &[[&str; 3]],
) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    python_ref(&[
        "kmix_gguf",
        d.to_str().unwrap(),
        &hidden.to_string(),
        &inter.to_string(),
        act,
        mix,
        scales,
    ]);
    let scale_of = |proj: Proj| -> Option<f32> {
        scales.split(',').find_map(|item| {
            let (p, v) = item.split_once('=')?;
            (p == proj.name()).then(|| v.parse().unwrap())
        })
    };
    let src = d.join("model.gguf");
    let out = d.join("p.mpk.gguf");
    let p = convert_and_verify(&src, &out, &[]);
    assert_eq!(p.manifest.layouts, ["ggml"], "{mix}: the default");
    let model = Model::open(&src).unwrap();
    let mut weights = Vec::new();
    for (layer, types) in want.iter().enumerate() {
        let mut w3 = Vec::new();
        for (proj, ty) in [Proj::Gate, Proj::Up, Proj::Down].into_iter().zip(types) {
            let name = format!("blk.{layer}.ffn_{}.weight", proj.name());
            let t = model.tensors.iter().position(|t| t.name == name).unwrap();
            assert_eq!(model.tensors[t].dtype.name(), *ty, "{name}");
            let blob = blob_name(layer, proj, Layout::Ggml, "");
            let i = p.index(&blob).unwrap();
            assert!(p.data(i) == model.data(t), "{blob}: the source's bytes");
            let (got, _) = p.decode_ffn(&blob).unwrap();
            let mut gguf_py = read_npy(&d.join(format!("{name}.npy"))).to_f32();
            let fe = p.manifest.tensors[i].ffn.as_ref().unwrap();
            assert_eq!(
                fe.scalars.get("output_scale").copied(),
                scale_of(proj),
                "{blob}"
            );
            if let Some(s) = scale_of(proj) {
                gguf_py.iter_mut().for_each(|v| *v *= s);
            }
            common::assert_bits_eq(&blob, &got, &gguf_py);
            w3.push(got);
        }
        weights.push(w3);
    }
    let act = if act == "gelu" {
        Activation::Gelu
    } else {
        Activation::Silu
    };
    let host = Arc::new(HostBackend::new());
    let backend: Arc<dyn GpuBackend> = host.clone();
    let opts = EngineOptions {
        max_tokens: 20,
        verify_checksums: true,
        trace: true,
        ..Default::default()
    };
    let mut lm = LoadedModel::load(&out, backend.clone(), &opts).unwrap();
    let x = metrale_pack::testing::Rand(66).vec(20 * hidden, 1.0);
    let input = backend.alloc((20 * hidden * 4) as u64).unwrap();
    upload_f32(backend.as_ref(), input, &x).unwrap();
    for (l, w) in weights.into_iter().enumerate() {
        let arm = lm.layer(l).unwrap().serving_arm(&lm.ctx, Method::Decode, 1);
        assert_eq!(arm.map(|a| a.name), Some("ggml gemv"));
        let [gate, up, down]: [Vec<f32>; 3] = w.try_into().unwrap();
        let dw = metrale_pack::testing::DenseWeights {
            gate,
            up,
            down,
            hidden,
            inter,
        };
        for m in [1, 3, 9, 20] {
            lm.ctx.trace.clear();
            let err = loaded_layer_err(&mut lm, l, (input, &x), m, &dw, act);
            println!("{mix} layer {l}, {m} rows: {err:.2e} against the float64 FFN");
            // The activations to q8_1 twice (the input and the act-mul's output), with ggml's
            // CUDA numerics: the offset and min terms take the f16 sum of the unquantized
            // values, the codes the quantized ones, so a 4-bit row's error is about twice the
            // codes' alone (one GEMV on these weights, uniform activations: 3.9e-3 for Q6_K,
            // which has no offset, 8e-3 .. 1.2e-2 for the others). Measured 1.0e-2 .. 2.8e-2
            // for the layer; 4e-2. The weights' path alone is exact to 1e-7
            // (tests/cuda_emu_ggml.rs).
            assert!(err < 4e-2, "layer {l}, {m} rows: {err:.2e}");
            // From 17 rows: BF16 weights (gguf-py's decode, rounded) and activations, f32
            // sums: 3.1e-3 .. 4.1e-3 measured; 1e-2.
            assert!(m <= 16 || err < 1e-2, "layer {l}, {m} rows: {err:.2e}");
            // Up to 16 rows the engine's GEMV, GGML_GEMV_MAX_M rows a launch (gate and up in
            // one): on split activations to the levers' rows (gate and up two, down four:
            // `ggml_gemv1` for one row, `ggml_gemv_split` for two, `ggml_gemv_split4` for
            // three and four), `ggml_gemv_sa` past them; from 17 each projection dequantized
            // to BF16 for the BF16 GEMM.
            let count = |name: &str| lm.ctx.trace.iter().filter(|k| **k == name).count();
            if m <= 16 {
                let lv = &lm.ctx.levers;
                let split = [
                    m <= lv.ggml_split_max_rows,
                    m <= lv.ggml_down_split_max_rows,
                ];
                let (on, off) = (
                    split.iter().filter(|s| **s).count(),
                    split.iter().filter(|s| !**s).count(),
                );
                let want = (
                    if m == 1 { on } else { 0 },
                    if m == 2 { on } else { 0 },
                    if (3..=GGML_GEMV_SPLIT4_M).contains(&m) {
                        on
                    } else {
                        0
                    },
                    off * m.div_ceil(GGML_GEMV_MAX_M),
                );
                assert_eq!(
                    (
                        count("ggml_gemv1"),
                        count("ggml_gemv_split"),
                        count("ggml_gemv_split4"),
                        count("ggml_gemv_sa")
                    ),
                    want,
                    "{:?}",
                    lm.ctx.trace
                );
                let split_q = count("quantize_act_q8_1s") + count("quantize_act_mul_q8_1s");
                assert_eq!(split_q, on, "{:?}", lm.ctx.trace);
            } else {
                assert_eq!(
                    (count("ggml_gemv_sa"), count("ggml_dequant_bf16")),
                    (0, 3),
                    "{:?}",
                    lm.ctx.trace
                );
            }
            if (2..=GGML_GEMV_SPLIT4_M).contains(&m) {
                // Gate and up on the split forms to four rows too (lever
                // `ggml_split_max_rows`): the same sums (`ggml_gemv_split4`, split
                // activations), so the same output.
                let gu =
                    std::mem::replace(&mut lm.ctx.levers.ggml_split_max_rows, GGML_GEMV_SPLIT4_M);
                lm.ctx.trace.clear();
                let split = loaded_layer_err(&mut lm, l, (input, &x), m, &dw, act);
                let count = |name: &str| lm.ctx.trace.iter().filter(|k| **k == name).count();
                assert!(
                    count("ggml_gemv_split4") >= 2 && count("ggml_gemv_sa") == 0,
                    "{:?}",
                    lm.ctx.trace
                );
                assert_eq!(split.to_bits(), err.to_bits(), "layer {l}, {m} rows");
                lm.ctx.levers.ggml_split_max_rows = gu;
            }
        }
    }
    backend.free(input);
    drop(lm);
    assert_eq!(host.live_allocations(), 0);
}

/// Gemma 3 270M's shape as its Q4_K_M has it: hidden 640 (not whole super-blocks), so gate
/// and up fall back to Q5_0 (Q5_1 from Q5_K), the downs (rows of 1024) Q6_K or Q4_K; GELU.
#[test]
fn a_q4_k_m_of_hidden_640_converts_by_default_and_forwards() {
    mix_converts_and_forwards(
        640,
        1024,
        "gelu",
        "Q4_K/Q4_K/Q6_K;Q4_K/Q4_K/Q4_K;Q5_K/Q5_K/Q6_K",
        &[
            ["Q5_0", "Q5_0", "Q6_K"],
            ["Q5_0", "Q5_0", "Q4_K"],
            ["Q5_1", "Q5_1", "Q6_K"],
        ],
    );
}

/// A llama's Q4_K_M and Q5_K_M layers (SiLU), hidden 512: Q4_K or Q5_K gate and up, Q6_K
/// downs; an intermediate of 1056 (not whole super-blocks) sends a Q6_K down to Q8_0, and a
/// Q4_0/Q4_1 layer as older files hold.
#[test]
fn llama_k_mixes_convert_by_default_and_forward() {
    mix_converts_and_forwards(
        512,
        1056,
        "silu",
        "Q4_K/Q4_K/Q6_K;Q5_K/Q5_K/Q5_K;Q4_0/Q4_1/Q8_0",
        &[
            ["Q4_K", "Q4_K", "Q8_0"],
            ["Q5_K", "Q5_K", "Q5_1"],
            ["Q4_0", "Q4_1", "Q8_0"],
        ],
    );
}

/// The engine's other types as llama-quantize's Q2_K, Q3_K_M and IQ4 files and gpt-oss-style
/// MXFP4 hold them: Q2_K, IQ4_XS and IQ4_NL; MXFP4 beside a Q6_K down; Q3_K with a Q5_K down.
#[test]
fn q2_k_q3_k_iq4_and_mxfp4_convert_by_default_and_forward() {
    mix_converts_and_forwards(
        512,
        1024,
        "silu",
        "Q2_K/IQ4_XS/IQ4_NL;MXFP4/MXFP4/Q6_K;Q3_K/Q3_K/Q5_K",
        &[
            ["Q2_K", "IQ4_XS", "IQ4_NL"],
            ["MXFP4", "MXFP4", "Q6_K"],
            ["Q3_K", "Q3_K", "Q5_K"],
        ],
    );
}

/// The IQ1, IQ2 and IQ3 types (ggml's own quantizers, with an importance matrix where ggml asks
/// for one), mixed per projection as the low-bit files mix them, SiLU and GELU.
#[test]
fn iq1_iq2_and_iq3_types_convert_by_default_and_forward() {
    mix_converts_and_forwards(
        512,
        1024,
        "silu",
        "IQ2_XXS/IQ2_XS/IQ3_XXS;IQ2_S/IQ3_S/IQ2_XXS",
        &[
            ["IQ2_XXS", "IQ2_XS", "IQ3_XXS"],
            ["IQ2_S", "IQ3_S", "IQ2_XXS"],
        ],
    );
    mix_converts_and_forwards(
        512,
        1024,
        "gelu",
        "IQ3_XXS/IQ3_S/IQ2_S;IQ1_S/IQ1_M/IQ2_XS",
        &[["IQ3_XXS", "IQ3_S", "IQ2_S"], ["IQ1_S", "IQ1_M", "IQ2_XS"]],
    );
}

/// GGUF's NVFP4 (type 40), as llama.cpp's converter writes a ModelOpt NVFP4 checkpoint: the
/// blocks (written by libgguf) beside each projection's per-tensor output scale
/// (`blk.N.ffn_X.scale`, ModelOpt's `weight_scale_2`), which llama.cpp multiplies the output
/// by; a Q6_K down in the second layer. Converts by default into `ggml`, the blocks carried
/// and the scales recorded; and a Q4_K_M layer with a scale on its up projection only.
#[test]
fn nvfp4_and_per_tensor_output_scales_are_carried() {
    mix_with_scales(
        512,
        1024,
        "silu",
        "NVFP4/NVFP4/NVFP4;NVFP4/NVFP4/Q6_K",
        "gate=0.0021,up=0.0019,down=0.0023",
        &[["NVFP4", "NVFP4", "NVFP4"], ["NVFP4", "NVFP4", "Q6_K"]],
    );
    mix_with_scales(
        256,
        512,
        "gelu",
        "Q4_K/Q4_K/Q6_K",
        "up=-0.5",
        &[["Q4_K", "Q4_K", "Q6_K"]],
    );
}

/// An output scale that is not one finite F32 value is refused when the model is opened,
/// naming the scale tensor and the file.
#[test]
fn a_malformed_output_scale_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    python_ref(&[
        "kmix_gguf",
        d.to_str().unwrap(),
        "256",
        "512",
        "silu",
        "Q4_K/Q4_K/Q6_K",
        "up=inf",
    ]);
    let e = Model::open(d.join("model.gguf"))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("blk.0.ffn_up.scale") && e.contains("model.gguf") && e.contains("not finite"),
        "{e}"
    );
}

/// A tensor-parallel pack carries each rank's slice of the blocks (gate and up by rows, down by
/// whole blocks of columns), each decoding to its slice of gguf-py's decode; where a TP size's
/// slices split the down projections' 256-value blocks, those slices are stored as Q8_0 of
/// the decoded slice (the fidelity table shows the cost) and the rows stay carried.
#[test]
fn tensor_parallel_slices_carry_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    python_ref(&[
        "kmix_gguf",
        d.to_str().unwrap(),
        "512",
        "1024",
        "silu",
        "Q4_K/Q4_K/Q6_K;Q5_0/Q8_0/Q4_K",
    ]);
    let src = d.join("model.gguf");
    let src_s = src.to_str().unwrap();
    for tp in [2usize, 8] {
        let out = d.join(format!("tp{tp}.mpk.gguf"));
        let o = common::pack::cli(&[
            "convert",
            src_s,
            "-o",
            out.to_str().unwrap(),
            "--tp",
            &tp.to_string(),
        ]);
        assert!(o.status.success(), "{}", common::pack::err(&o));
        let p = metrale_pack::pack::Pack::open(&out).unwrap();
        assert_eq!(p.manifest.layouts, ["ggml"]);
        let (rows, cols) = (1024 / tp, 1024 / tp);
        for layer in 0..2 {
            for proj in [Proj::Gate, Proj::Up, Proj::Down] {
                let name = format!("blk.{layer}.ffn_{}.weight", proj.name());
                let full = read_npy(&d.join(format!("{name}.npy"))).to_f32();
                for r in 0..tp {
                    let blob = format!("blk.{layer}.ffn_{}.tp{r}.ggml", proj.name());
                    let (got, shape) = p.decode_ffn(&blob).unwrap();
                    let (want, split) = if proj == Proj::Down {
                        let w = (0..512).flat_map(|row| {
                            full[row * 1024 + r * cols..row * 1024 + (r + 1) * cols].to_vec()
                        });
                        (w.collect::<Vec<f32>>(), cols % 256 != 0)
                    } else {
                        (full[r * rows * 512..(r + 1) * rows * 512].to_vec(), false)
                    };
                    let e = p
                        .manifest
                        .tensors
                        .iter()
                        .find(|t| t.name.as_str() == blob)
                        .unwrap();
                    let ty = e.ffn.as_ref().unwrap().scalars["type"];
                    if split {
                        assert_eq!(ty, 8.0, "{blob}: Q8_0");
                        let err = metrale_pack::testing::rel_err(
                            &got,
                            &want.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                        );
                        assert!(err < 1e-2, "{blob}: {err:.2e}");
                    } else {
                        assert_eq!(
                            shape[1] as usize,
                            if proj == Proj::Down { cols } else { 512 },
                            "{blob}"
                        );
                        common::assert_bits_eq(&blob, &got, &want);
                    }
                }
            }
        }
    }
}

/// A GGUF Phi-3's fused `ffn_up` (gate and up in one tensor of 2 I rows, no `ffn_gate`) of an
/// engine type: each half carried byte for byte as its rows of the fused tensor, not
/// re-encoded as Q8_0 (which a convert with no flag did before: `keeps` looked through the half,
/// the encoder did not).
#[test]
fn a_fused_gate_up_of_an_engine_type_is_carried_byte_for_byte() {
    use metrale_pack::GgmlType;
    use metrale_pack::gguf::Value;
    let (h, i) = (256usize, 512usize);
    let mut rng = common::Rng::fresh("ggml_fused_gate_up");
    // Q5_0 blocks: a small finite d, random codes.
    let mut q5 = |rows: usize, k: usize| -> Vec<u8> {
        (0..rows * k / 32)
            .flat_map(|_| {
                let mut b = metrale_pack::converters::f16::encode(&[0.01]);
                b.extend(rng.bytes(20));
                b
            })
            .collect()
    };
    let (up, down) = (q5(2 * i, h), q5(h, i));
    let embd = common::pack::f32b(&vec![0.5; 10 * h]);
    let kvs = vec![
        ("general.architecture", Value::String("phi3".into())),
        ("phi3.embedding_length", Value::U32(h as u32)),
    ];
    let ts: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = vec![
        ("token_embd.weight", vec![h as u64, 10], GgmlType::F32, embd),
        (
            "blk.0.ffn_up.weight",
            vec![h as u64, 2 * i as u64],
            GgmlType::Q5_0,
            up.clone(),
        ),
        (
            "blk.0.ffn_down.weight",
            vec![i as u64, h as u64],
            GgmlType::Q5_0,
            down,
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("phi3.gguf");
    std::fs::write(&src, metrale_pack::gguf_write::build(32, &kvs, &ts)).unwrap();
    let p = convert_and_verify(&src, &dir.path().join("p.mpk.gguf"), &[]);
    assert_eq!(p.manifest.layouts, ["ggml"]);
    let half = up.len() / 2;
    for (proj, bytes) in [(Proj::Gate, &up[..half]), (Proj::Up, &up[half..])] {
        let i = p.index(&blob_name(0, proj, Layout::Ggml, "")).unwrap();
        let f = p.manifest.tensors[i].ffn.as_ref().unwrap();
        assert_eq!(
            f.scalars.get("type"),
            Some(&(GgmlType::Q5_0 as u32 as f32)),
            "{proj:?}"
        );
        assert_eq!(p.data(i), bytes, "{proj:?}");
    }
}
