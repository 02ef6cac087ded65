//! `inspect --json`: its field names pinned, every metadata value whole and equal to what gguf-py
//! reads (the real SmolLM2 GGUF: 49,152 tokens, the chat template, numbers as numbers), and for a
//! pack its FFN blobs by layer and each tensor's manifest entry.

mod common;

use common::*;
use std::process::Command;

fn inspect(path: &std::path::Path) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(["inspect", path.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The top-level fields, in order.
const FIELDS: [&str; 14] = [
    "format",
    "files",
    "architecture",
    "quantization",
    "hidden_size",
    "intermediate_size",
    "activation",
    "ffn_layers",
    "fidelity",
    "ffn",
    "moe_layers",
    "pack",
    "metadata",
    "tensors",
];

fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn a_gguf_s_metadata_is_whole_and_as_gguf_py_reads_it() {
    let g = smollm2_gguf();
    let ours = inspect(&g);
    // serde_json's map keeps keys sorted; the document's order is checked on the raw text below.
    let mut want: Vec<String> = FIELDS.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(keys(&ours), want);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kv.json");
    python_ref(&["kv_json", g.to_str().unwrap(), out.to_str().unwrap()]);
    let theirs: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(keys(&ours["metadata"]), keys(&theirs));
    for (k, v) in theirs.as_object().unwrap() {
        let o = &ours["metadata"][k];
        match (o.as_f64(), v.as_f64()) {
            // gguf-py reads f32 values widened to f64; ours print the f32 exactly too.
            (Some(a), Some(b)) => assert_eq!(a as f32, b as f32, "{k}"),
            _ => assert_eq!(o, v, "{k}"),
        }
    }
    assert_eq!(
        ours["metadata"]["tokenizer.ggml.tokens"]
            .as_array()
            .unwrap()
            .len(),
        49152
    );
    assert!(ours["ffn"][0]["gate"]["tensor"] == "blk.0.ffn_gate.weight");
    for t in ours["tensors"].as_array().unwrap() {
        assert_eq!(
            keys(t),
            ["bytes", "file", "name", "offset", "shape", "type"]
        );
    }
}

#[test]
fn a_pack_lists_its_blobs_by_layer_and_each_tensor_s_entry() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &src,
        64,
        128,
        2,
        metrale_pack::GgmlType::F32,
        "llama",
    )
    .unwrap();
    let pack = dir.path().join("m.mpk.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args([
            "convert",
            src.to_str().unwrap(),
            "-o",
            pack.to_str().unwrap(),
            "--layouts",
            "nvfp4,bf16",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let raw = Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(["inspect", pack.to_str().unwrap(), "--json"])
        .output()
        .unwrap()
        .stdout;
    let text = String::from_utf8(raw).unwrap();
    // The document's field order.
    let at: Vec<usize> = FIELDS
        .iter()
        .map(|f| {
            text.find(&format!("\n  \"{f}\": "))
                .unwrap_or_else(|| panic!("{f}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let layers = v["ffn"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    for (l, layer) in layers.iter().enumerate() {
        assert_eq!(layer["index"], l);
        let blobs = layer["blobs"].as_array().unwrap();
        // nvfp4: codes and scales per projection; bf16: one blob per projection.
        assert_eq!(blobs.len(), 9, "{blobs:?}");
        for b in blobs {
            assert_eq!(
                keys(b),
                [
                    "bytes", "layout", "padded", "part", "proj", "shape", "tensor"
                ]
            );
        }
    }
    let p = metrale_pack::Pack::open(&pack).unwrap();
    let mut with_entry = 0;
    for t in v["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        match p.index(name) {
            Some(j) => {
                let want = serde_json::to_value(&p.manifest.tensors[j]).unwrap();
                assert_eq!(t["entry"], want, "{name}");
                with_entry += 1;
            }
            None => assert!(name.starts_with("metrale.pad.") && t.get("entry").is_none()),
        }
    }
    assert_eq!(with_entry, p.manifest.tensors.len());
    assert_eq!(v["pack"]["layouts"], serde_json::json!(["nvfp4", "bf16"]));
}
