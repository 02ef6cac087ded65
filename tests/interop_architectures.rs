//! Models whose FFN is not gate/up/down in every layer, written by the real tools: Phi-3's fused
//! gate+up (transformers 5.24 `Phi3ForCausalLM.save_pretrained`; gguf-py 0.19.0 `GGUFWriter`
//! with its Q8_0 quantizer), Qwen2-MoE with dense layers between expert layers (transformers;
//! gguf-py), an experts-only GGUF; and the refusals that say why a model cannot be packed.
//! References: each library's own split and dequantization (`expected.json` digests written by
//! `tests/py/make_fixtures.py`; `tests/py/reference.py arch_gguf` for the GGUFs).

mod common;

use common::pack::{cli, convert_and_verify, err};
use common::{python_ref, read_npy};
use metrale_pack::model::Model;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// gguf-py writes the model; returns (dir, model path).
fn arch_gguf(kind: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    python_ref(&["arch_gguf", kind, dir.path().to_str().unwrap()]);
    let p = dir.path().join("model.gguf");
    (dir, p)
}

/// Every dense layer's gate, up and down decode to gguf-py's own f32 (written as L.PROJ.npy).
fn assert_layers_match_gguf_py(m: &Model, dir: &Path, layers: &[usize]) {
    assert_eq!(
        m.ffn_layers.iter().map(|l| l.index).collect::<Vec<_>>(),
        layers
    );
    for l in &m.ffn_layers {
        for (proj, w) in [("gate", &l.gate), ("up", &l.up), ("down", &l.down)] {
            let want = read_npy(&dir.join(format!("{}.{proj}.npy", l.index)));
            let (got, shape) = m.decode_weight(w).unwrap();
            assert_eq!(
                shape.map(|d| d as usize).to_vec(),
                want.shape,
                "{} {proj}",
                l.index
            );
            common::assert_bits_eq(&format!("layer {} {proj}", l.index), &got, &want.to_f32());
        }
    }
}

#[test]
fn phi3_gguf_fused_gate_up_is_split_bit_for_bit_and_converts() {
    let (dir, src) = arch_gguf("phi3");
    let m = Model::open(&src).unwrap();
    assert_layers_match_gguf_py(&m, dir.path(), &[0, 1, 2, 3]);
    for layouts in ["nvfp4,nvfp4_mmq", "bf16", "q4k_mmq,fp8"] {
        let p = convert_and_verify(
            &src,
            &dir.path().join("p.mpk.gguf"),
            // The source is quantized (gguf-py's Q8_0): NVFP4, Q4_K and FP8 re-quantize it.
            &["--layouts", layouts, "--allow-requantize"],
        );
        assert_eq!(p.manifest.model.ffn_layers, 4);
        // The fused weight is consumed, not carried.
        assert!(p.index("blk.0.ffn_up.weight").is_none());
    }
}

#[test]
fn mixed_dense_and_moe_gguf_packs_every_dense_layer_and_carries_the_experts() {
    let (dir, src) = arch_gguf("qwen2moe-mixed");
    let m = Model::open(&src).unwrap();
    assert_layers_match_gguf_py(&m, dir.path(), &[0, 2]);
    assert_eq!(m.moe_layers, vec![1, 3]);
    let o = cli(&["inspect", src.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("layers [1, 3]: mixture-of-experts"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let out = dir.path().join("p.mpk.gguf");
    let p = convert_and_verify(&src, &out, &["--layouts", "nvfp4,bf16"]);
    assert_eq!(p.manifest.model.dense_layers, vec![0, 2]);
    assert_eq!(p.manifest.model.moe_layers, vec![1, 3]);
    // Both dense layers hold their layouts; the experts are carried byte for byte.
    for l in [0, 2] {
        assert!(
            p.index(&format!("blk.{l}.ffn_down.bf16")).is_some(),
            "layer {l}"
        );
    }
    for name in ["blk.1.ffn_gate_exps.weight", "blk.3.ffn_down_exps.weight"] {
        let (i, j) = (p.index(name).unwrap(), m.tensor(name).unwrap());
        assert!(p.read(i).unwrap() == m.data(j), "{name}");
    }
    // --tp would copy the experts whole onto every rank: refused by name, unless asked.
    let o = cli(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--tp",
        "2",
    ]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("blk.1.ffn_gate_exps.weight") && err(&o).contains("--replicate-moe"),
        "{}",
        err(&o)
    );
    let p = convert_and_verify(
        &src,
        &out,
        &["--tp", "2", "--replicate-moe", "--layouts", "bf16"],
    );
    assert!(p.manifest.options.replicate_moe);
    // Layer 2 (after an MoE layer) loads and forwards on the host backend: ffn-apply against the
    // float64 FFN of the source weights.
    let out = dir.path().join("q.mpk.gguf");
    convert_and_verify(&src, &out, &["--layouts", "bf16"]);
    let (h, rows) = (64usize, 2usize);
    let x: Vec<f32> = (0..rows * h)
        .map(|j| ((j * 29 % 97) as f32 - 48.0) / 48.0)
        .collect();
    let xin = dir.path().join("x.npy");
    common::write_npy_f32(&xin, &[rows, h], &x);
    let yout = dir.path().join("y.npy");
    let o = cli(&[
        "ffn-apply",
        out.to_str().unwrap(),
        "--layer",
        "2",
        "--arm",
        "bf16",
        xin.to_str().unwrap(),
        yout.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let y = read_npy(&yout).to_f32();
    let l = &m.ffn_layers[1];
    let [g, u, d] = [&l.gate, &l.up, &l.down].map(|w| m.decode_weight(w).unwrap().0);
    let i = g.len() / h;
    let (mut num, mut den) = (0f64, 0f64);
    for r in 0..rows {
        let xr: Vec<f64> = x[r * h..(r + 1) * h].iter().map(|&v| v as f64).collect();
        let dot = |w: &[f32], v: &[f64]| w.iter().zip(v).map(|(&a, b)| a as f64 * b).sum::<f64>();
        let a: Vec<f64> = (0..i)
            .map(|j| {
                let gv = dot(&g[j * h..(j + 1) * h], &xr);
                gv / (1.0 + (-gv).exp()) * dot(&u[j * h..(j + 1) * h], &xr)
            })
            .collect();
        for c in 0..h {
            let want = dot(&d[c * i..(c + 1) * i], &a);
            num += (y[r * h + c] as f64 - want).powi(2);
            den += want * want;
        }
    }
    assert!((num / den).sqrt() < 2e-2, "rel err {}", (num / den).sqrt());
}

#[test]
fn hf_phi3_and_qwen2moe_written_by_transformers_read_as_the_model_splits_them() {
    for (name, layers, moe) in [
        ("phi3-bf16", vec![0usize, 1], vec![]),
        ("qwen2moe-mixed-bf16", vec![0, 2], vec![1usize, 3]),
    ] {
        let dir = fixture(name);
        let e: Value = common::fixture_expected(&dir);
        let m = Model::open(&dir).unwrap();
        assert_eq!(
            m.ffn_layers.iter().map(|l| l.index).collect::<Vec<_>>(),
            layers
        );
        assert_eq!(m.moe_layers, moe, "{name}");
        let mut checked = 0;
        for l in &m.ffn_layers {
            for (proj, w) in [("gate", &l.gate), ("up", &l.up), ("down", &l.down)] {
                let want = &e["weights"][format!("{}.{proj}", l.index)];
                let (v, shape) = m.decode_weight(w).unwrap();
                assert_eq!(
                    shape.to_vec(),
                    serde_json::from_value::<Vec<u64>>(want["shape"].clone()).unwrap()
                );
                assert_eq!(
                    common::sha256_f32(&v),
                    want["sha256_f32"].as_str().unwrap(),
                    "{name} {} {proj}",
                    l.index
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 3 * layers.len());
        let tmp = tempfile::tempdir().unwrap();
        for layouts in ["nvfp4,nvfp4_mmq", "bf16"] {
            convert_and_verify(
                &dir,
                &tmp.path().join("p.mpk.gguf"),
                &["--layouts", layouts],
            );
        }
    }
}

#[test]
fn models_that_cannot_be_packed_are_refused_saying_why() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o.mpk.gguf");
    let refused = |src: &Path| {
        let o = cli(&[
            "convert",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        assert!(!out.exists());
        err(&o)
    };
    // Experts only: the experts are named.
    let (_d, moe) = arch_gguf("qwen2moe");
    let e = refused(&moe);
    assert!(
        e.contains("mixture-of-experts") && e.contains("blk.0.ffn_gate_exps.weight"),
        "{e}"
    );
    // A pack given to convert.
    let pack = tmp.path().join("p.mpk.gguf");
    convert_and_verify(&fixture("phi3-bf16"), &pack, &["--layouts", "bf16"]);
    let e = refused(&pack);
    assert!(
        e.contains("already a metrale pack") && e.contains("verify"),
        "{e}"
    );
    // safetensors without config.json.
    let bare = tmp.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    std::fs::copy(
        fixture("phi3-bf16").join("model.safetensors"),
        bare.join("model.safetensors"),
    )
    .unwrap();
    let e = refused(&bare);
    assert!(e.contains("no config.json"), "{e}");
    // An encoder with no gated FFN (the real all-MiniLM-L6-v2, BERT): the architecture named
    // and the layer naming this tool reads.
    let e = refused(&common::minilm_dir());
    assert!(
        e.contains("architecture bert") && e.contains("gate_up_proj"),
        "{e}"
    );
    // An unknown layout lists the layouts.
    let o = cli(&["convert", pack.to_str().unwrap(), "--layouts", "nvfp5"]);
    assert!(
        err(&o).contains("nvfp5") && err(&o).contains("q4k_mmq, fp8"),
        "{}",
        err(&o)
    );
}
