//! Quantized safetensors checkpoints as users have them (ModelOpt NVFP4, compressed-tensors
//! NVFP4, block FP8, per-channel FP8), plus a sharded BF16 one: recognised per FFN weight and
//! decoded against float64 references that follow each published convention.

mod common;

use common::*;
use metrale_pack::converters::{bf16, fp8, fp8_block, fp8_row, nvfp4_modelopt};
use metrale_pack::model::{FfnWeight, Model};
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

type Owned = (String, Dtype, Vec<usize>, Vec<u8>);

fn save(path: &Path, ts: &[Owned]) {
    let views: Vec<(String, TensorView)> = ts
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn proj(l: usize, p: &str, s: &str) -> String {
    format!("model.layers.{l}.mlp.{p}_proj.{s}")
}

/// max |a - b| / max |b| over the tensor.
fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let m = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.iter()
        .zip(b)
        .fold(0f64, |e, (x, y)| e.max((*x as f64 - y).abs()))
        / m
}

#[test]
fn modelopt_nvfp4_matches_the_published_convention() {
    let mut rng = Rng::fresh("modelopt");
    let dir = tempfile::tempdir().unwrap();
    let (inter, hidden) = (96, 64);
    let mut ts: Vec<Owned> = Vec::new();
    let mut encoded = Vec::new();
    for (p, n, k) in [
        ("gate", inter, hidden),
        ("up", inter, hidden),
        ("down", hidden, inter),
    ] {
        let x = rng.weights(n * k);
        let w = nvfp4_modelopt::encode(&x, n, k);
        ts.push((
            proj(0, p, "weight"),
            Dtype::U8,
            vec![n, k / 2],
            w.codes.clone(),
        ));
        ts.push((
            proj(0, p, "weight_scale"),
            Dtype::F8_E4M3,
            vec![n, k / 16],
            w.scales.clone(),
        ));
        ts.push((
            proj(0, p, "weight_scale_2"),
            Dtype::F32,
            vec![],
            w.global_scale.to_le_bytes().to_vec(),
        ));
        ts.push((
            proj(0, p, "input_scale"),
            Dtype::F32,
            vec![],
            0.5f32.to_le_bytes().to_vec(),
        ));
        encoded.push((p, n, k, w));
    }
    save(&dir.path().join("model.safetensors"), &ts);
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type":"llama","hidden_size":64,"intermediate_size":96,"hidden_act":"silu","quantization_config":{"quant_method":"modelopt","quant_algo":"NVFP4"}}"#,
    )
    .unwrap();
    let m = Model::open(dir.path()).unwrap();
    assert_eq!(m.ffn_layers.len(), 1);
    assert_eq!(m.quantization.as_deref(), Some("modelopt"));
    assert_eq!((m.hidden_size, m.intermediate_size), (Some(64), Some(96)));
    let layer = &m.ffn_layers[0];
    for (w, (p, n, k, enc)) in [&layer.gate, &layer.up, &layer.down]
        .into_iter()
        .zip(&encoded)
    {
        assert!(
            matches!(
                w,
                FfnWeight::ModelOptNvfp4 {
                    input_scale: Some(_),
                    ..
                }
            ),
            "{p}"
        );
        let (ours, shape) = m.decode_weight(w).unwrap();
        assert_eq!(shape, [*n as u64, *k as u64]);
        let c = dir.path().join("c.npy");
        let s = dir.path().join("s.npy");
        let o = dir.path().join("o.npy");
        write_npy_u8(&c, &enc.codes);
        write_npy_u8(&s, &enc.scales);
        python_ref(&[
            "nvfp4_modelopt",
            c.to_str().unwrap(),
            s.to_str().unwrap(),
            &format!("{:e}", enc.global_scale as f64),
            &n.to_string(),
            o.to_str().unwrap(),
        ]);
        // The reference writes float64; compare after rounding ours' inputs the same way: every
        // product E2M1 * E4M3 is exact in f32 and the final * s2 rounds once, so 1 ulp of f32.
        let theirs = std::fs::read(&o).unwrap();
        let hdr = u16::from_le_bytes([theirs[8], theirs[9]]) as usize + 10;
        let r: Vec<f64> = theirs[hdr..]
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        for (i, (&a, &b)) in ours.iter().zip(&r).enumerate() {
            assert!(
                (a as f64 - b).abs() <= b.abs() * f64::powi(2.0, -23),
                "{p} element {i}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn compressed_tensors_nvfp4_uses_the_reciprocal_global_scale() {
    let mut rng = Rng::fresh("ct-nvfp4");
    let dir = tempfile::tempdir().unwrap();
    let (n, k) = (32, 64);
    let x = rng.weights(n * k);
    let w = nvfp4_modelopt::encode(&x, n, k);
    let mut ts: Vec<Owned> = Vec::new();
    for p in ["gate", "up", "down"] {
        ts.push((
            proj(0, p, "weight_packed"),
            Dtype::U8,
            vec![n, k / 2],
            w.codes.clone(),
        ));
        ts.push((
            proj(0, p, "weight_scale"),
            Dtype::F8_E4M3,
            vec![n, k / 16],
            w.scales.clone(),
        ));
        ts.push((
            proj(0, p, "weight_global_scale"),
            Dtype::F32,
            vec![1],
            (1.0 / w.global_scale).to_le_bytes().to_vec(),
        ));
    }
    save(&dir.path().join("model.safetensors"), &ts);
    let m = Model::open(dir.path().join("model.safetensors")).unwrap();
    let l = &m.ffn_layers[0];
    assert_eq!(l.gate.scheme(), "compressed-tensors-nvfp4");
    let (ours, _) = m.decode_weight(&l.up).unwrap();
    let reference: Vec<f64> = (0..n * k)
        .map(|i| {
            let c = (w.codes[i / 2] >> (4 * (i % 2))) & 15;
            nvfp4_modelopt::e2m1_to_f32(c) as f64 * fp8::e4m3_to_f32(w.scales[i / 16]) as f64
                / (1.0 / w.global_scale) as f64
        })
        .collect();
    // 1/(1/s2) differs from s2 by up to 2 f32 roundings.
    assert!(
        rel_err(&ours, &reference) < 1e-6,
        "{}",
        rel_err(&ours, &reference)
    );
    // And it is close to the original weights (NVFP4 quantization error, bounded by the E2M1 step).
    let xr: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    assert!(rel_err(&ours, &xr) < 0.2);
}

#[test]
fn block_fp8_with_partial_blocks_and_per_channel_fp8() {
    let mut rng = Rng::fresh("fp8");
    let dir = tempfile::tempdir().unwrap();
    let (inter, hidden) = (200, 136); // partial 128-blocks both ways
    let mut ts: Vec<Owned> = Vec::new();
    let mut refs = Vec::new();
    for (p, n, k) in [("gate", inter, hidden), ("up", inter, hidden)] {
        let x = rng.weights(n * k);
        let (codes, scales) = fp8_block::encode(&x, n, k);
        let (gn, gk) = fp8_block::scale_grid(n, k);
        assert_eq!((gn, gk), (2, 2));
        ts.push((
            proj(0, p, "weight"),
            Dtype::F8_E4M3,
            vec![n, k],
            codes.clone(),
        ));
        ts.push((
            proj(0, p, "weight_scale_inv"),
            Dtype::F32,
            vec![gn, gk],
            f32_bytes(&scales),
        ));
        let r: Vec<f64> = (0..n * k)
            .map(|i| {
                fp8::e4m3_to_f32(codes[i]) as f64
                    * scales[(i / k / 128) * gk + (i % k) / 128] as f64
            })
            .collect();
        refs.push((r, x));
    }
    let x = rng.weights(hidden * inter);
    let (codes, scales) = fp8_row::encode(&x, hidden, inter);
    ts.push((
        proj(0, "down", "weight"),
        Dtype::F8_E4M3,
        vec![hidden, inter],
        codes.clone(),
    ));
    ts.push((
        proj(0, "down", "weight_scale"),
        Dtype::F32,
        vec![hidden, 1],
        f32_bytes(&scales),
    ));
    save(&dir.path().join("model.safetensors"), &ts);
    let m = Model::open(dir.path().join("model.safetensors")).unwrap();
    let l = &m.ffn_layers[0];
    assert_eq!(
        (l.gate.scheme(), l.down.scheme()),
        ("fp8-block128", "fp8-channel")
    );
    for (w, (r, x)) in [&l.gate, &l.up].into_iter().zip(&refs) {
        let (ours, _) = m.decode_weight(w).unwrap();
        // One f32 multiply of two exact values: within 1 ulp.
        assert!(rel_err(&ours, r) < 1.2e-7);
        let xr: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        assert!(rel_err(&ours, &xr) < 1.0 / 16.0);
    }
    let (ours, shape) = m.decode_weight(&l.down).unwrap();
    assert_eq!(shape, [hidden as u64, inter as u64]);
    let r: Vec<f64> = (0..hidden * inter)
        .map(|i| fp8::e4m3_to_f32(codes[i]) as f64 * scales[i / inter] as f64)
        .collect();
    assert!(rel_err(&ours, &r) < 1.2e-7);
}

#[test]
fn sharded_bf16_checkpoint_reads_as_one_model() {
    let mut rng = Rng::fresh("sharded");
    let dir = tempfile::tempdir().unwrap();
    let (inter, hidden) = (48, 32);
    let mut all = Vec::new();
    for l in 0..2 {
        let mut ts: Vec<Owned> = Vec::new();
        for (p, n, k) in [
            ("gate", inter, hidden),
            ("up", inter, hidden),
            ("down", hidden, inter),
        ] {
            let x = rng.weights(n * k);
            ts.push((
                proj(l, p, "weight"),
                Dtype::BF16,
                vec![n, k],
                bf16::encode(&x),
            ));
        }
        ts.push((
            format!("model.layers.{l}.input_layernorm.weight"),
            Dtype::F32,
            vec![hidden],
            f32_bytes(&vec![1.0; hidden]),
        ));
        save(
            &dir.path()
                .join(format!("model-0000{}-of-00002.safetensors", l + 1)),
            &ts,
        );
        all.push(ts);
    }
    let mut map = serde_json::Map::new();
    for (l, ts) in all.iter().enumerate() {
        for t in ts {
            map.insert(
                t.0.clone(),
                serde_json::Value::String(format!("model-0000{}-of-00002.safetensors", l + 1)),
            );
        }
    }
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type":"gemma","hidden_activation":"gelu_pytorch_tanh"}"#,
    )
    .unwrap();
    let m = Model::open(dir.path()).unwrap();
    assert_eq!(m.files.len(), 2);
    assert_eq!(m.tensors.len(), 8);
    assert_eq!(m.ffn_layers.len(), 2);
    assert_eq!(m.activation.map(|a| a.name()), Some("gelu"));
    assert_eq!((m.hidden_size, m.intermediate_size), (Some(32), Some(48)));
    let (down1, _) = m.decode_weight(&m.ffn_layers[1].down).unwrap();
    let expect: Vec<f32> = all[1][2]
        .3
        .chunks(2)
        .map(|b| bf16::to_f32(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    assert_bits_eq("down1", &down1, &expect);
    // An index naming a shard outside its folder is refused.
    std::fs::write(
        dir.path().join("bad.index.json"),
        r#"{"weight_map":{"a":"../x.safetensors"}}"#,
    )
    .unwrap();
    let msg = Model::open(dir.path().join("bad.index.json"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("bad.index.json") && msg.contains("weight_map.a"),
        "{msg}"
    );
}

/// A block-FP8 `[256, 16384]` weight has a `[2, 128]` scale grid: 256 values, as many as its
/// rows. It must be read as block FP8 (by full shape), never as per-channel (by count); and a
/// config that declares another scheme than the scale's shape fits is refused, naming both.
#[test]
fn block_fp8_scale_with_as_many_values_as_rows_is_never_read_per_channel() {
    let mut rng = Rng::fresh("collision");
    let (n, k) = (256, 16384);
    let x = rng.weights(n * k);
    let (codes, scales) = fp8_block::encode(&x, n, k);
    assert_eq!(scales.len(), n, "the collision: as many scales as rows");
    let name = "model.layers.0.mlp.down_proj.weight";
    let files = |dir: &Path, scale_dtype: Dtype, sb: Vec<u8>| {
        save(
            &dir.join("model.safetensors"),
            &[
                (name.into(), Dtype::F8_E4M3, vec![n, k], codes.clone()),
                (
                    "model.layers.0.mlp.down_proj.weight_scale".into(),
                    scale_dtype,
                    vec![2, 128],
                    sb,
                ),
            ],
        )
    };
    // float64 reference: w[i][j] = e4m3(q) * scale[i/128][j/128].
    let want: Vec<f64> = (0..n * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            fp8::e4m3_to_f32(codes[i]) as f64 * scales[(r / 128) * 128 + c / 128] as f64
        })
        .collect();
    let ct_config = |strategy: &str| {
        format!(
            r#"{{"model_type": "llama", "quantization_config": {{"quant_method": "compressed-tensors",
            "config_groups": {{"g": {{"targets": ["Linear"], "weights": {{"type": "float", "num_bits": 8,
            "strategy": "{strategy}", "block_structure": [128, 128]}}}}}}}}}}"#
        )
    };
    for (config, scale_dtype) in [
        (None, Dtype::F32),
        (Some(ct_config("block")), Dtype::F32),
        (Some(ct_config("block")), Dtype::BF16),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let sb = if scale_dtype == Dtype::BF16 {
            // BF16 scales (as compressed-tensors writes for a bf16 model): round them first so
            // the reference uses the stored values.
            bf16::encode(&scales)
        } else {
            f32_bytes(&scales)
        };
        files(dir.path(), scale_dtype, sb);
        if let Some(c) = &config {
            std::fs::write(dir.path().join("config.json"), c).unwrap();
        }
        let m = Model::open(dir.path()).unwrap();
        let w = m.quantized_weight_named(name).unwrap();
        assert!(matches!(w, FfnWeight::Fp8Block { .. }), "{config:?}: {w:?}");
        let (got, shape) = m.decode_weight(&w).unwrap();
        assert_eq!(shape, [n as u64, k as u64]);
        if scale_dtype == Dtype::F32 {
            // Each product of a 4-bit and an f32 value is exact in f64 and rounds once to f32.
            assert!(got.iter().zip(&want).all(|(a, b)| *a == *b as f32));
        } else {
            assert!(rel_err(&got, &want) < 1.0 / 128.0);
        }
    }
    // Declared per-channel: the [2, 128] scale does not fit [256, 1]: refused with both shapes.
    let dir = tempfile::tempdir().unwrap();
    files(dir.path(), Dtype::F32, f32_bytes(&scales));
    std::fs::write(dir.path().join("config.json"), ct_config("channel")).unwrap();
    let m = Model::open(dir.path()).unwrap();
    let w = m.quantized_weight_named(name).unwrap();
    let err = m.decode_weight(&w).unwrap_err().to_string();
    for needle in ["weight_scale", "[2, 128]", "[256, 16384]", "per-channel"] {
        assert!(err.contains(needle), "{needle} not in: {err}");
    }
}
