//! bitsandbytes checkpoints as transformers saves them (bitsandbytes 0.50.2 through
//! `BitsAndBytesConfig` and `save_pretrained`; `tests/py/make_fixtures.py`, `ONLY=bnb`): what
//! `convert` makes of them, and hostile edits of them refused by tensor and field. (Their
//! weights' decode against bitsandbytes' own is in `interop_toolchains.rs`, with every fixture.)

mod common;

use common::{fixture_expected, sha256_f32};
use metrale_pack::converters::layouts::{Layout, Proj};
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions, FfnEntry, Pack};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("bnb-"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 5, "{v:?}");
    v
}

type Tensors = common::StTensors;

/// Fixture `name` copied into `dir` with its tensors edited.
fn edited(dir: &Path, name: &str, edit: impl FnOnce(&mut Tensors)) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    let (from, to) = (src.join("model.safetensors"), out.join("model.safetensors"));
    common::rewrite_safetensors(&from, &to, edit);
    std::fs::copy(src.join("config.json"), out.join("config.json")).unwrap();
    out
}

/// Each FFN projection of `m` with its blob of `layout` in `p`: the source's main tensor's
/// name, the blob's name and index, and its manifest entry.
fn blobs<'p>(m: &Model, p: &'p Pack, layout: Layout) -> Vec<(String, String, usize, &'p FfnEntry)> {
    let mut v = Vec::new();
    for l in &m.ffn_layers {
        for (w, proj) in [
            (&l.gate, Proj::Gate),
            (&l.up, Proj::Up),
            (&l.down, Proj::Down),
        ] {
            let src = m.tensors[w.main()].name.to_string();
            let blob = pack::blob_name(l.index, proj, layout, "");
            let i = p.index(&blob).unwrap_or_else(|| panic!("{blob}"));
            v.push((src, blob, i, &**p.manifest.tensors[i].ffn.as_ref().unwrap()));
        }
    }
    v
}

/// Checkpoint `m` (fixture `dir`) converted by default into `out`: the set is `ggml` alone and
/// nothing is refused, `verify --source` re-derives the pack, and every FFN blob decodes to
/// bitsandbytes' own f32 values bit for bit, after `check` (source tensor, blob index, entry);
/// returns the weights checked.
fn ggml_by_default(
    m: &Model,
    dir: &Path,
    out: &Path,
    check: impl Fn(&Pack, usize, usize, &FfnEntry),
) -> usize {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let settled = pack::choice::settle(m, &ConvertOptions::default());
    assert_eq!(settled.layouts, [Layout::Ggml], "{name}");
    assert!(settled.refusal.is_none(), "{name}: {:?}", settled.refusal);
    pack::convert(m, &ConvertOptions::default(), out, &|_, _| {})
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let p = Pack::open(out).unwrap();
    let c = pack::verify_against_source(&p, m).unwrap();
    assert!(c.mismatched.is_empty(), "{name}: {:?}", c.mismatched);
    let e = fixture_expected(dir);
    let all = blobs(m, &p, Layout::Ggml);
    for (src, blob, i, f) in &all {
        check(&p, m.index_of(src).unwrap(), *i, f);
        let (vals, _) = p.decode_ffn(blob).unwrap();
        assert_eq!(
            sha256_f32(&vals),
            e["weights"][src]["sha256_f32"].as_str().unwrap(),
            "{name} {blob}: the pack decodes as bitsandbytes"
        );
    }
    all.len()
}

/// A 4-bit checkpoint with `--layouts bf16`: verified against its source; its attention quant
/// states (names over GGUF's 63 bytes) carried byte for byte under their whole names in the
/// manifest; for a bf16 model, the pack holds bitsandbytes' own bf16 dequantization bit for bit.
fn bnb4_as_bf16(m: &Model, dir: &Path, out: &Path) {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let opts = ConvertOptions {
        layouts: Some(vec![Layout::Bf16]),
        ..Default::default()
    };
    pack::convert(m, &opts, out, &|_, _| {}).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let p = Pack::open(out).unwrap();
    assert!(p.verify_checksums().unwrap().is_empty());
    let c = pack::verify_against_source(&p, m).unwrap();
    assert!(c.mismatched.is_empty(), "{name}: {:?}", c.mismatched);
    let mut long = 0;
    for (i, t) in m.tensors.iter().enumerate() {
        if t.name.len() > pack::MAX_NAME_LEN && !t.name.contains(".mlp.") {
            let j = p
                .index(&t.name)
                .unwrap_or_else(|| panic!("{name}: {}", t.name));
            assert_eq!(p.data(j), m.data(i), "{name}: {}", t.name);
            assert!(p.file.tensors[j].name.starts_with(pack::LONG_PREFIX));
            long += 1;
        }
    }
    assert!(long >= 4, "{name}: {long} long names");
    let e = fixture_expected(dir);
    if e["model_dtype"] != "bfloat16" {
        return;
    }
    for (src, blob, _, _) in blobs(m, &p, Layout::Bf16) {
        let (vals, _) = p.decode_ffn(&blob).unwrap();
        let bf: Vec<u8> = metrale_pack::converters::bf16::encode(&vals);
        let sha: String = Sha256::digest(&bf)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let want = e["weights"][&src]["sha256_lib"].as_str().unwrap();
        assert_eq!(sha, want, "{name} {src}");
    }
}

/// NF4 converts by default to `ggml`'s own NF4 blocks (the absmax, double quantization undone,
/// as f32 per 64 values; the codes re-laid), LLM.int8 to Q8_0 blocks (d = SCB, output scale
/// 1/127; the codes byte for byte), both decoding to bitsandbytes' own values bit for bit, and
/// NF4 with `bf16` too. FP4: no layout keeps it, so the default convert (the command line's
/// and the library's) refuses, naming the format; `bf16` converts it.
#[test]
fn bitsandbytes_fixtures_convert_or_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut int8, mut nf4) = (0, 0);
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let m = Model::open(&dir).unwrap();
        let out = tmp.path().join(format!("{name}.mpk.gguf"));
        let bf16_out = tmp.path().join(format!("{name}-bf16.mpk.gguf"));
        if name.starts_with("bnb-fp4") {
            let settled = pack::choice::settle(&m, &ConvertOptions::default());
            let e = settled
                .refusal
                .unwrap_or_else(|| panic!("{name}: not refused"));
            assert!(e.contains("FP4 (bitsandbytes)"), "{name}: {e}");
            // The library's convert with no layouts named refuses it too (it re-quantized it
            // to the NVFP4 set), writing nothing.
            let e = pack::convert(&m, &ConvertOptions::default(), &out, &|_, _| {})
                .expect_err(&name)
                .to_string();
            assert!(e.contains("FP4 (bitsandbytes)"), "{name}: {e}");
            assert!(!out.exists(), "{name}");
            bnb4_as_bf16(&m, &dir, &bf16_out);
        } else if name.starts_with("bnb-nf4") {
            nf4 += ggml_by_default(&m, &dir, &out, |p, _, i, f| {
                assert_eq!(f.scalars.get("type"), Some(&128.0), "{name}: NF4");
                assert_eq!(f.scalars.get("output_scale"), None, "{name}");
                // 36 bytes per 64 values: the source's codes plus an f32 per 64.
                let [n, k] = f.shape.map(|d| d as usize);
                assert_eq!(p.data(i).len(), n * k / 64 * 36, "{name}");
            });
            bnb4_as_bf16(&m, &dir, &bf16_out);
        } else {
            int8 += ggml_by_default(&m, &dir, &out, |p, src, i, f| {
                assert_eq!(f.scalars.get("type"), Some(&8.0), "{name}: Q8_0");
                let scale = Some(&metrale_pack::converters::bnb::INT8_SCALE);
                assert_eq!(f.scalars.get("output_scale"), scale, "{name}");
                // Each block: its row's SCB as a half, then the source's 32 codes.
                let (codes, blocks) = (m.data(src), p.data(i));
                assert_eq!(blocks.len(), codes.len() / 32 * 34, "{name}");
                for (b, chunk) in blocks.chunks_exact(34).enumerate() {
                    assert_eq!(&chunk[2..], &codes[b * 32..b * 32 + 32], "{name} block {b}");
                }
            });
        }
    }
    assert!(int8 >= 9, "{int8} LLM.int8 weights checked");
    assert!(nf4 >= 9, "{nf4} NF4 weights checked");
}

/// Hostile edits of the bitsandbytes fixtures: each refused when the model is opened, naming
/// the tensor and what is wrong with it.
#[test]
fn edited_bitsandbytes_weights_are_refused_by_tensor_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let up4 = "model.layers.0.mlp.up_proj.weight";
    let state = format!("{up4}.quant_state.bitsandbytes__nf4");
    let set_state = |ts: &mut Tensors, f: &dyn Fn(&mut serde_json::Value)| {
        let t = ts.iter_mut().find(|t| t.0 == state).unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&t.3).unwrap();
        f(&mut v);
        t.3 = v.to_string().into_bytes();
        t.2 = vec![t.3.len()];
    };
    type Edit<'a> = Box<dyn Fn(&mut Tensors) + 'a>;
    let cases: Vec<(&str, Edit, Vec<String>)> = vec![
        (
            "bnb-nf4-dq-bf16",
            Box::new(|ts: &mut Tensors| set_state(ts, &|v| v["blocksize"] = 48.into())),
            vec![state.clone(), "blocksize".into(), "48".into()],
        ),
        (
            "bnb-nf4-dq-bf16",
            Box::new(|ts: &mut Tensors| set_state(ts, &|v| v["quant_type"] = "fp4".into())),
            vec![state.clone(), "quant_type".into()],
        ),
        (
            "bnb-nf4-dq-bf16",
            Box::new(|ts: &mut Tensors| {
                set_state(ts, &|v| v["shape"] = serde_json::json!([384, 512]))
            }),
            vec!["packed 4-bit codes".into(), up4.into()],
        ),
        (
            "bnb-nf4-dq-bf16",
            Box::new(|ts: &mut Tensors| {
                set_state(ts, &|v| {
                    v.as_object_mut().unwrap().remove("nested_offset");
                })
            }),
            vec!["nested_offset".into()],
        ),
        (
            "bnb-nf4-dq-bf16",
            Box::new(|ts: &mut Tensors| {
                let t = ts.iter_mut().find(|t| t.0 == state).unwrap();
                t.3 = b"{not json".to_vec();
                t.2 = vec![t.3.len()];
            }),
            vec![state.clone(), "JSON".into()],
        ),
        (
            "bnb-nf4-dq-bf16",
            Box::new(|ts: &mut Tensors| {
                let t = ts.iter_mut().find(|t| t.0 == state).unwrap();
                t.3 = vec![b' '; 5000];
                t.2 = vec![5000];
            }),
            vec![state.clone(), "4096".into()],
        ),
        (
            "bnb-nf4-dq-bf16",
            Box::new(|ts: &mut Tensors| {
                let t = ts
                    .iter_mut()
                    .find(|t| t.0 == format!("{up4}.absmax"))
                    .unwrap();
                t.3.truncate(t.3.len() - 1);
                t.2 = vec![t.3.len()];
            }),
            vec![format!("{up4}.absmax"), "double-quantized absmax".into()],
        ),
        (
            "bnb-nf4-dq-bf16",
            Box::new(|ts: &mut Tensors| ts.retain(|t| t.0 != format!("{up4}.nested_quant_map"))),
            vec![format!("{up4}.nested_absmax")],
        ),
        // An FP4 attention weight with its quant state alone (no absmax, no table): the state
        // is read by nothing.
        (
            "bnb-fp4-dq-bf16",
            Box::new(|ts: &mut Tensors| {
                let q = "model.layers.0.self_attn.q_proj.weight.";
                ts.retain(|t| !t.0.starts_with(q) || t.0.contains("quant_state"))
            }),
            vec!["model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__fp4".into()],
        ),
        (
            "bnb-int8-f16",
            Box::new(|ts: &mut Tensors| {
                let t = ts
                    .iter_mut()
                    .find(|t| t.0 == "model.layers.0.mlp.up_proj.SCB")
                    .unwrap();
                t.3.truncate(t.3.len() - 4);
                t.2 = vec![t.3.len() / 4];
            }),
            vec!["model.layers.0.mlp.up_proj.SCB".into(), "SCB".into()],
        ),
        (
            "bnb-int8-f16",
            Box::new(|ts: &mut Tensors| {
                let t = ts
                    .iter_mut()
                    .find(|t| t.0 == "model.layers.0.mlp.up_proj.weight_format")
                    .unwrap();
                t.3 = vec![2];
            }),
            vec!["weight_format".into(), "row format".into()],
        ),
    ];
    for (i, (fixture, edit, words)) in cases.into_iter().enumerate() {
        let d = edited(&tmp.path().join(i.to_string()), fixture, edit);
        let e = match Model::open(&d) {
            Err(e) => e.to_string(),
            Ok(m) => m
                .ffn_layers
                .iter()
                .flat_map(|l| [&l.gate, &l.up, &l.down])
                .find_map(|w| m.decode_weight(w).err())
                .map(|e| e.to_string())
                .unwrap_or_else(|| panic!("case {i}: accepted")),
        };
        for w in &words {
            assert!(e.contains(w.as_str()), "case {i}: {w:?} not in {e}");
        }
    }
}

/// Any passthrough tensor whose name is over GGUF's 63 bytes (a vision tower's, a quant
/// state's) is carried under its table name with its whole name in the manifest; a source
/// tensor named with the reserved prefix is refused by name.
#[test]
fn names_over_63_bytes_are_carried_and_the_reserved_prefix_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let long = format!("model.vision_tower.{}.weight", "encoder.layers.0".repeat(5));
    let payload: Vec<u8> = (0u8..16).collect();
    let d = edited(&tmp.path().join("long"), "bnb-int8-f16", |ts| {
        ts.push((
            long.clone(),
            safetensors::Dtype::F16,
            vec![8],
            payload.clone(),
        ));
    });
    let m = Model::open(&d).unwrap();
    let out = tmp.path().join("long.mpk.gguf");
    pack::convert(&m, &ConvertOptions::default(), &out, &|_, _| {}).unwrap();
    let p = Pack::open(&out).unwrap();
    let j = p.index(&long).unwrap();
    assert_eq!(p.data(j), payload);
    assert_eq!(p.file.tensors[j].name.as_str(), pack::table_name(&long));
    assert!(
        pack::verify_against_source(&p, &m)
            .unwrap()
            .mismatched
            .is_empty()
    );
    let d = edited(&tmp.path().join("reserved"), "bnb-int8-f16", |ts| {
        ts.push((
            "metrale.long.00".into(),
            safetensors::Dtype::F16,
            vec![8],
            payload.clone(),
        ));
    });
    let m = Model::open(&d).unwrap();
    let out = tmp.path().join("reserved.mpk.gguf");
    let e = pack::convert(&m, &ConvertOptions::default(), &out, &|_, _| {}).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("metrale.long.00") && e.contains("reserved"),
        "{e}"
    );
    assert!(!out.exists());
}

/// `--tp` does not cut bitsandbytes-quantized attention weights (the 4-bit codes are the weight
/// flattened, LLM.int8's `SCB` a companion the cut does not follow): refused by tensor, nothing
/// written.
#[test]
fn tensor_parallel_packs_of_bitsandbytes_attention_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, words) in [
        ("bnb-nf4-dq-bf16", ["self_attn", "bitsandbytes"]),
        ("bnb-int8-f16", ["self_attn", "SCB"]),
    ] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let m = Model::open(&dir).unwrap();
        let out = tmp.path().join(format!("{name}.mpk.gguf"));
        let opts = ConvertOptions {
            tp: 2,
            ..Default::default()
        };
        let e = format!(
            "{:#}",
            pack::convert(&m, &opts, &out, &|_, _| {}).unwrap_err()
        );
        for w in words {
            assert!(e.contains(w), "{name}: {w:?} not in {e}");
        }
        assert!(!out.exists(), "{name}");
    }
}
