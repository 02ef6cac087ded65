//! Checkpoints written by the real quantization toolchains (compressed-tensors 0.20.0, NVIDIA
//! ModelOpt 0.47.0, PEFT 0.21.2, bitsandbytes 0.50.2; `tests/py/make_fixtures.py` wrote them,
//! `tests/fixtures/*/expected.json` holds each library's own decompression as SHA-256 digests and its versions).
//!
//! For every fixture: the scheme and shapes are recognised; every quantized weight decodes to the
//! library's own f32 dequantization bit for bit (through `dump` for the MLP weights), and, rounded
//! to the model dtype, to the library's native decompression bit for bit; `convert` with the
//! default layouts and with `bf16` succeeds and `verify --source` re-derives the pack. PEFT
//! adapters: the `lora` layout's A, B (BF16, nearest even, of PEFT's f32), rank and scaling
//! equal PEFT's per module; what the engine cannot serve is refused by name.

mod common;

use common::fixture_expected as expected;
use common::read_npy;
use metrale_pack::converters::{bf16, fp8, layouts::Layout};
use metrale_pack::model::{FfnWeight, Model};
use metrale_pack::pack::{self, ConvertOptions, Pack};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn sha_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    hex(&Sha256::digest(&bytes))
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes the library's native decompression holds: f32 as is, bf16 rounded to nearest even.
fn sha_lib(v: &[f32], dtype: &str) -> String {
    match dtype {
        "float32" => sha_f32(v),
        "bfloat16" => hex(&Sha256::digest(bf16::encode(v))),
        "float16" => hex(&Sha256::digest(metrale_pack::converters::f16::encode(v))),
        other => panic!("library dtype {other}"),
    }
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(args)
        .output()
        .unwrap()
}

fn quantized_fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            ["ct-", "modelopt-", "awq-", "gptq-", "bnb-"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .collect();
    v.sort();
    assert!(v.len() >= 30, "fixtures missing: {v:?}");
    v
}

#[test]
fn every_fixture_is_recognised_with_its_scheme_and_shapes() {
    for dir in quantized_fixtures() {
        let e = expected(&dir);
        let m = Model::open(&dir).unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        assert_eq!(
            m.ffn_layers.len() as u64,
            e["layers"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(m.hidden_size, e["hidden_size"].as_u64(), "{name}");
        assert_eq!(
            m.intermediate_size,
            e["intermediate_size"].as_u64(),
            "{name}"
        );
        let want = match e["scheme"].as_str().unwrap() {
            "fp8-tensor" | "FP8_DEFAULT_CFG" => "fp8-tensor",
            "fp8-channel" => "fp8-channel",
            "fp8-block" => "fp8-block128",
            "nvfp4a16" | "nvfp4" => "compressed-tensors-nvfp4",
            "mxfp4a16" => "compressed-tensors-mxfp4",
            "NVFP4_DEFAULT_CFG" => "modelopt-nvfp4",
            "int8-w8a8" | "int8-tensor-asym" | "w8a16" => "compressed-tensors-int8",
            "w4a16" | "w4a16-asym" | "int4-g32-asym" | "int4-channel-asym" => {
                "compressed-tensors-int4"
            }
            "w3a16" => "compressed-tensors-int",
            "awq-gemm-g128" | "awq-gemm-g64" => "awq-gemm-int4",
            s if s.starts_with("gptq-2bit") => "gptq-int2",
            s if s.starts_with("gptq-4bit") => "gptq-int4",
            s if s.starts_with("gptq-8bit") => "gptq-int8",
            s if s.starts_with("bnb-nf4") => "bitsandbytes-nf4",
            s if s.starts_with("bnb-fp4") => "bitsandbytes-fp4",
            s if s.starts_with("bnb-int8") => "bitsandbytes-int8",
            s => panic!("{s}"),
        };
        for l in &m.ffn_layers {
            for w in [&l.gate, &l.up, &l.down] {
                assert_eq!(w.scheme(), want, "{name} layer {}", l.index);
            }
        }
    }
}

#[test]
fn every_quantized_weight_decodes_to_the_librarys_own_dequantization_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for dir in quantized_fixtures() {
        let e = expected(&dir);
        let m = Model::open(&dir).unwrap();
        for (name, w) in e["weights"].as_object().unwrap() {
            let ctx = format!("{}: {name}", dir.display());
            let main = if m.index_of(name).is_some() {
                name.clone()
            } else if m.index_of(&format!("{name}_packed")).is_some() {
                format!("{name}_packed") // compressed-tensors NVFP4 stores `weight_packed`
            } else {
                name.replace(".weight", ".qweight") // AutoAWQ and GPTQ store `qweight`
            };
            let q = m
                .quantized_weight_named(&main)
                .unwrap_or_else(|| panic!("{ctx}: not recognised as quantized"));
            let (vals, shape) = m.decode_weight(&q).unwrap();
            let want_shape: Vec<u64> = w["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(shape.to_vec(), want_shape, "{ctx}");
            assert_eq!(
                sha_f32(&vals),
                w["sha256_f32"].as_str().unwrap(),
                "{ctx}: f32"
            );
            let native = if e["scheme"] == "FP8_DEFAULT_CFG" {
                // ModelOpt's FP8QTensor.dequantize(dtype) casts the scale to the output dtype
                // before the product: bf16(q) * bf16(s), one bf16 rounding of an exact product.
                let FfnWeight::Fp8Tensor { weight, scale } = q else {
                    panic!("{ctx}: {q:?}")
                };
                let s = bf16::to_f32(bf16::from_f32(m.scalar_f32(scale, "s").unwrap()));
                let v: Vec<f32> = m
                    .data(weight)
                    .iter()
                    .map(|&c| fp8::e4m3_to_f32(c) * s)
                    .collect();
                sha_lib(&v, "bfloat16")
            } else {
                sha_lib(&vals, w["lib_dtype"].as_str().unwrap())
            };
            assert_eq!(
                native,
                w["sha256_lib"].as_str().unwrap(),
                "{ctx}: the library's native decompression"
            );
            // The MLP weights also through the CLI's dump.
            if name.contains(".mlp.") {
                let out = tmp.path().join("w.npy");
                let o = cli(&[
                    "dump",
                    dir.to_str().unwrap(),
                    &main,
                    "-o",
                    out.to_str().unwrap(),
                ]);
                assert!(
                    o.status.success(),
                    "{ctx}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                let npy = read_npy(&out);
                assert_eq!(
                    sha_f32(&npy.to_f32()),
                    w["sha256_f32"].as_str().unwrap(),
                    "{ctx}: dump"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 100, "only {checked} weights checked");
}

#[test]
fn every_fixture_converts_with_the_default_layouts_and_bf16_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    // bitsandbytes FP4: no layout keeps it (tests/interop_bnb.rs).
    for dir in quantized_fixtures().into_iter().filter(|d| !is_bnb_fp4(d)) {
        let m = Model::open(&dir).unwrap();
        for layouts in [None, Some(vec![Layout::Bf16])] {
            let default = layouts.is_none();
            let out = tmp.path().join("p.mpk.gguf");
            let opts = ConvertOptions {
                layouts,
                ..Default::default()
            };
            pack::convert(&m, &opts, &out, &|_, _| {})
                .unwrap_or_else(|err| panic!("{}: {err:#}", dir.display()));
            let p = Pack::open(&out).unwrap();
            assert!(p.verify_checksums().unwrap().is_empty());
            let c = pack::verify_against_source(&p, &m).unwrap();
            assert!(
                c.mismatched.is_empty(),
                "{}: {:?}",
                dir.display(),
                c.mismatched
            );
            // The default set keeps every quantized source as it is: its decode is the
            // source's (fidelity 0), but for the NVFP4 layouts' scale product, which rounds
            // the global scale into each block scale's product in another order (formats.md,
            // "Sources, and what is lost"; measured 2e-8 .. 8e-8).
            for f in p.manifest.fidelity.iter().filter(|_| default) {
                let bound = if f.layout.starts_with("nvfp4") {
                    1e-7
                } else {
                    0.0
                };
                assert!(
                    f.worst_rel_err <= bound,
                    "{}: {} {} kept with error {:.3e}",
                    dir.display(),
                    f.layout,
                    f.proj,
                    f.worst_rel_err
                );
            }
        }
    }
}

fn is_bnb_fp4(dir: &Path) -> bool {
    dir.file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("bnb-fp4")
}

#[test]
fn modelopt_zero_dim_scales_convert_and_input_scale_is_carried() {
    let dir = fixtures().join("modelopt-nvfp4");
    let e = expected(&dir);
    let m = Model::open(&dir).unwrap();
    // The export stores weight_scale_2 and input_scale as 0-dimensional tensors.
    let s2 = m
        .tensor("model.layers.0.mlp.down_proj.weight_scale_2")
        .unwrap();
    assert!(m.tensors[s2].shape.is_empty());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("mo.mpk.gguf");
    pack::convert(&m, &ConvertOptions::default(), &out, &|_, _| {}).unwrap();
    let p = Pack::open(&out).unwrap();
    // Every FFN input_scale is in the pack under its own name with the export's value, and the
    // NVFP4 codes are the export's bytes.
    let mut n = 0;
    for (name, v) in e["scalars"].as_object().unwrap() {
        if !(name.contains(".mlp.") && name.ends_with("input_scale")) {
            continue;
        }
        let i = p
            .index(name)
            .unwrap_or_else(|| panic!("{name} not carried"));
        let want = v[1][0].as_f64().unwrap() as f32;
        assert_eq!(p.data(i), want.to_le_bytes(), "{name}");
        n += 1;
    }
    assert_eq!(n, 6);
    let codes = p.index("blk.0.ffn_down.nvfp4.codes").unwrap();
    let src = m.data(m.tensor("model.layers.0.mlp.down_proj.weight").unwrap());
    assert_eq!(
        p.data(codes),
        src,
        "K = 384 needs no padding: the export's bytes"
    );
}

fn lora_pack(adapter: &str) -> Result<(Pack, tempfile::TempDir), String> {
    let base = Model::open(fixtures().join("peft-base")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("l.mpk.gguf");
    let opts = ConvertOptions {
        lora: Some(fixtures().join(adapter)),
        ..Default::default()
    };
    pack::convert(&base, &opts, &out, &|_, _| {}).map_err(|e| format!("{e:#}"))?;
    let p = Pack::open(&out).unwrap();
    let c = pack::verify_against_source(&p, &base).unwrap();
    assert!(c.mismatched.is_empty(), "{adapter}: {:?}", c.mismatched);
    Ok((p, tmp))
}

#[test]
fn peft_adapters_give_peft_s_a_b_rank_and_scaling_per_module() {
    for adapter in [
        "peft-lora-default",
        "peft-lora-rslora",
        "peft-lora-alpha-pattern",
        "peft-lora-rank-pattern",
        "peft-lora-gate-up-only",
        "peft-lora-layer0-only",
    ] {
        let e = expected(&fixtures().join(adapter));
        let a = Model::open(fixtures().join(adapter).join("adapter_model.safetensors")).unwrap();
        let (p, _tmp) = lora_pack(adapter).unwrap();
        let modules = e["modules"].as_object().unwrap();
        let mut served = 0;
        for layer in 0..2 {
            for proj in ["gate", "up", "down"] {
                let module = format!("base_model.model.model.layers.{layer}.mlp.{proj}_proj");
                let blob_a = p.index(&format!("blk.{layer}.ffn_{proj}.lora.a"));
                let Some(m) = modules.get(&module) else {
                    assert!(
                        blob_a.is_none(),
                        "{adapter}: {module} is not targeted: identity, no blob"
                    );
                    continue;
                };
                let ia = blob_a.unwrap_or_else(|| panic!("{adapter}: {module} has no lora blob"));
                let ib = p.index(&format!("blk.{layer}.ffn_{proj}.lora.b")).unwrap();
                let fe = p.manifest.tensors[ia].ffn.as_ref().unwrap();
                assert_eq!(
                    fe.scalars["rank"] as u64,
                    m["r"].as_u64().unwrap(),
                    "{adapter} {module}"
                );
                assert_eq!(
                    fe.scalars["scaling"],
                    m["scaling"].as_f64().unwrap() as f32,
                    "{adapter} {module}: PEFT's scaling"
                );
                for (ab, blob) in [("A", ia), ("B", ib)] {
                    let t = a.tensor(&format!("{module}.lora_{ab}.weight")).unwrap();
                    let v = a.decode_tensor(t).unwrap();
                    // The file holds what PEFT had in memory ...
                    let key = format!("sha256_{}", ab.to_lowercase());
                    assert_eq!(
                        sha_f32(&v),
                        m[&key].as_str().unwrap(),
                        "{adapter} {module} {ab}"
                    );
                    // ... and the pack holds it in BF16, nearest even.
                    assert_eq!(p.data(blob), bf16::encode(&v), "{adapter} {module} {ab}");
                }
                served += 1;
            }
        }
        assert_eq!(served, modules.len(), "{adapter}");
    }
}

#[test]
fn peft_features_the_engine_cannot_serve_are_refused_by_name() {
    for (adapter, says) in [
        ("peft-dora", "DoRA"),
        ("peft-lora-bias", "lora_bias"),
        (
            "peft-lora-attention",
            "q_proj.lora_A.weight: LoRA on a module the engine does not serve",
        ),
    ] {
        let err = lora_pack(adapter)
            .err()
            .unwrap_or_else(|| panic!("{adapter} accepted"));
        assert!(err.contains(says), "{adapter}: {err}");
    }
}

/// A copy of fixture `name` in `dir` with its one safetensors file edited by `edit` (tensors by
/// name: dtype, shape, bytes) and its config.json by `cfg`.
fn edited_fixture(
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut common::StTensors),
    cfg: impl FnOnce(&mut Value),
) -> PathBuf {
    let src = fixtures().join(name);
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    let (from, to) = (src.join("model.safetensors"), out.join("model.safetensors"));
    common::rewrite_safetensors(&from, &to, edit);
    let mut c: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg(&mut c);
    std::fs::write(out.join("config.json"), c.to_string()).unwrap();
    out
}

#[test]
fn a_weight_read_without_its_scale_or_with_an_unread_companion_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let tmpo = tmp.path().join("o.mpk.gguf");
    let convert_err = |dir: &Path| {
        let o = cli(&[
            "convert",
            dir.to_str().unwrap(),
            "-o",
            tmpo.to_str().unwrap(),
        ]);
        assert!(!o.status.success(), "{} converted", dir.display());
        assert!(!tmpo.exists());
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    // The int8 W8A8 checkpoint with one weight_scale removed: its int8 codes are never read as
    // weights (neither by convert nor by dump).
    let up = "model.layers.0.mlp.up_proj.weight";
    let d = edited_fixture(
        tmp.path(),
        "ct-int8-w8a8-bf16",
        |ts| ts.retain(|t| t.0 != format!("{up}_scale")),
        |_| {},
    );
    let e = convert_err(&d);
    assert!(e.contains(up) && e.contains("no weight_scale"), "{e}");
    let o = cli(&[
        "dump",
        d.to_str().unwrap(),
        up,
        "-o",
        tmp.path().join("w.npy").to_str().unwrap(),
    ]);
    assert!(!o.status.success() && !tmp.path().join("w.npy").exists());
    // A stray scale beside a BF16 weight: no scheme reads it with the weight.
    let d = edited_fixture(
        &tmp.path().join("b"),
        "peft-base",
        |ts| {
            ts.push((
                "model.layers.0.mlp.up_proj.weight_scale".into(),
                safetensors::Dtype::F32,
                vec![1],
                1f32.to_le_bytes().to_vec(),
            ))
        },
        |_| {},
    );
    let o = cli(&["inspect", d.to_str().unwrap()]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        e.contains("model.layers.0.mlp.up_proj.weight_scale") && e.contains("refused"),
        "{e}"
    );
    // Act-order group indices, as a tensor and as the config's actorder.
    let d = edited_fixture(
        &tmp.path().join("c"),
        "ct-w4a16-bf16",
        |ts| {
            ts.push((
                "model.layers.0.mlp.down_proj.weight_g_idx".into(),
                safetensors::Dtype::I32,
                vec![384],
                vec![0u8; 384 * 4],
            ))
        },
        |_| {},
    );
    let e = convert_err(&d);
    assert!(e.contains("weight_g_idx") && e.contains("act-order"), "{e}");
    let d = edited_fixture(
        &tmp.path().join("d"),
        "ct-w4a16-bf16",
        |_| {},
        |c| {
            c["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] =
                "group".into()
        },
    );
    let e = convert_err(&d);
    assert!(e.contains("actorder") && e.contains("config.json"), "{e}");
    // Legacy qweight/qzeros packing declared as GPTQ, and AWQ packings other than GEMM.
    let d = edited_fixture(
        &tmp.path().join("e"),
        "awq-gemm-g128-f16",
        |_| {},
        |c| c["quantization_config"]["quant_method"] = "gptq".into(),
    );
    // AWQ's [k, n/8] words read as GPTQ's [k/8, n]: the shapes disagree, named.
    let e = convert_err(&d);
    assert!(
        e.contains("gate_proj.scales") && e.contains("do not fit qweight"),
        "{e}"
    );
    let d = edited_fixture(
        &tmp.path().join("f"),
        "awq-gemm-g128-f16",
        |_| {},
        |c| c["quantization_config"]["version"] = "gemv".into(),
    );
    let e = convert_err(&d);
    assert!(
        e.contains("quantization_config.version") && e.contains("gemv"),
        "{e}"
    );
}

/// Rank `r`'s slice of `name` in a TP pack (`a.b.tpR.weight`), its bytes.
fn rank_slice(p: &Pack, name: &str, r: u32) -> Vec<u8> {
    let sliced = metrale_pack::pack::tp::slice_name(name, r);
    let i = p
        .index(&sliced)
        .unwrap_or_else(|| panic!("{sliced} not in the pack"));
    p.read(i).unwrap()
}

#[test]
fn quantized_attention_splits_with_its_scales_and_each_rank_decodes_its_rows_or_columns() {
    use metrale_pack::converters::{fp8_block, fp8_row, nvfp4_modelopt};
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "ct-fp8-channel-bf16-i384",
        "ct-fp8-tensor-f32-i320",
        "ct-fp8-block-bf16-i320",
        "ct-int8-w8a8-bf16",
        "ct-int8-tensor-asym-bf16",
        "ct-nvfp4a16-bf16",
        "ct-nvfp4-w4a4-bf16",
        "modelopt-nvfp4",
        "modelopt-fp8",
    ] {
        let dir = fixtures().join(name);
        let m = Model::open(&dir).unwrap();
        let out = tmp.path().join(format!("{name}.mpk.gguf"));
        let opts = ConvertOptions {
            layouts: Some(vec![Layout::Bf16]),
            tp: 2,
            ..Default::default()
        };
        pack::convert(&m, &opts, &out, &|_, _| {}).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let p = Pack::open(&out).unwrap();
        let c = pack::verify_against_source(&p, &m).unwrap();
        assert!(c.mismatched.is_empty(), "{name}: {:?}", c.mismatched);
        // Each rank's q rows (scale rows cut with them) and o columns (scale columns cut with
        // them, or the scale whole) decode to the full weight's rows and columns.
        for (module, rows) in [("q_proj", true), ("o_proj", false)] {
            let base = format!("model.layers.0.self_attn.{module}");
            let w = m
                .quantized_weight_named(&format!("{base}.weight"))
                .or_else(|| m.quantized_weight_named(&format!("{base}.weight_packed")))
                .unwrap_or_else(|| panic!("{name}: {base} not quantized"));
            let (full, [n, k]) = m.decode_weight(&w).unwrap();
            let (n, k) = (n as usize, k as usize);
            for r in 0..2u32 {
                let [lo, hi] = if rows {
                    [r as usize * n / 2, (r as usize + 1) * n / 2]
                } else {
                    [r as usize * k / 2, (r as usize + 1) * k / 2]
                };
                let (sn, sk) = if rows { (hi - lo, k) } else { (n, hi - lo) };
                let want: Vec<f32> = (0..sn)
                    .flat_map(|i| (0..sk).map(move |j| (i, j)))
                    .map(|(i, j)| {
                        if rows {
                            full[(lo + i) * k + j]
                        } else {
                            full[i * k + lo + j]
                        }
                    })
                    .collect();
                let mut got = vec![0f32; sn * sk];
                let floats = |b: &[u8], t: usize| -> Vec<f32> {
                    match m.tensors[t].dtype.name().as_ref() {
                        "F32" => b
                            .chunks_exact(4)
                            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                            .collect(),
                        "BF16" => b
                            .chunks_exact(2)
                            .map(|c| bf16::to_f32(u16::from_le_bytes([c[0], c[1]])))
                            .collect(),
                        d => panic!("{d}"),
                    }
                };
                // The scale: this rank's slice where it was cut, else the replicated whole.
                let scale_of = |t: usize| -> Vec<f32> {
                    let sn = &m.tensors[t].name;
                    match p.index(&metrale_pack::pack::tp::slice_name(sn, r)) {
                        Some(i) => floats(&p.read(i).unwrap(), t),
                        None => floats(&p.read(p.index(sn).unwrap()).unwrap(), t),
                    }
                };
                let codes = rank_slice(&p, &m.tensors[w.main()].name, r);
                match w {
                    FfnWeight::Fp8Channel { scale, .. } | FfnWeight::Fp8Tensor { scale, .. } => {
                        let mut s = scale_of(scale);
                        if s.len() == 1 {
                            s = vec![s[0]; sn];
                        }
                        fp8_row::decode(&codes, &s, sk, &mut got);
                    }
                    FfnWeight::Fp8Block { scale_inv, .. } => {
                        fp8_block::decode(&codes, &scale_of(scale_inv), sn, sk, &mut got)
                    }
                    FfnWeight::CtInt {
                        scale, zero_point, ..
                    } => {
                        let q: Vec<i8> = codes.iter().map(|&b| b as i8).collect();
                        let z: Option<Vec<i8>> = zero_point.map(|z| {
                            let zs = &m.tensors[z].name;
                            let i = p
                                .index(&metrale_pack::pack::tp::slice_name(zs, r))
                                .or_else(|| p.index(zs))
                                .unwrap();
                            p.read(i).unwrap().iter().map(|&b| b as i8).collect()
                        });
                        metrale_pack::converters::ct_int::decode(
                            &q,
                            &scale_of(scale),
                            z.as_deref(),
                            sn,
                            sk,
                            &mut got,
                        );
                    }
                    FfnWeight::ModelOptNvfp4 { scale, scale_2, .. } => {
                        let s = rank_slice(&p, &m.tensors[scale].name, r);
                        let g = m.scalar_f32(scale_2, "s2").unwrap();
                        nvfp4_modelopt::decode_source(
                            &codes,
                            &s,
                            nvfp4_modelopt::BlockScale::TimesGlobal(g),
                            &mut got,
                        );
                    }
                    FfnWeight::CtNvfp4 {
                        scale,
                        global_scale,
                        ..
                    } => {
                        let s = rank_slice(&p, &m.tensors[scale].name, r);
                        let g = m.scalar_f32(global_scale, "g").unwrap();
                        nvfp4_modelopt::decode_source(
                            &codes,
                            &s,
                            nvfp4_modelopt::BlockScale::OverGlobal(g),
                            &mut got,
                        );
                    }
                    ref other => panic!("{name}: {other:?}"),
                }
                assert_eq!(sha_f32(&got), sha_f32(&want), "{name} {module} rank {r}");
            }
        }
    }
    // A cut through a scale group is refused, naming the weight and the group.
    let m = Model::open(fixtures().join("ct-fp8-block-bf16-i384")).unwrap();
    let opts = ConvertOptions {
        tp: 4,
        ..Default::default()
    };
    let e = pack::convert(&m, &opts, tmp.path().join("x.gguf"), &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("splits its groups of 128") && e.contains("self_attn"),
        "{e}"
    );
    // Packed integer attention is refused by name.
    let m = Model::open(fixtures().join("ct-w4a16-bf16")).unwrap();
    let opts = ConvertOptions {
        tp: 2,
        ..Default::default()
    };
    let e = pack::convert(&m, &opts, tmp.path().join("x.gguf"), &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("packed integer attention"), "{e}");
}

/// The fixtures whose FFN weights are integer codes (AutoAWQ, GPTQ with and without
/// act-order, compressed-tensors int).
fn integer_fixtures() -> Vec<PathBuf> {
    quantized_fixtures()
        .into_iter()
        .filter(|d| {
            let m = Model::open(d).unwrap();
            m.ffn_layers.iter().all(|l| {
                matches!(
                    l.gate,
                    FfnWeight::Awq { .. } | FfnWeight::CtInt { .. } | FfnWeight::Gptq { .. }
                )
            })
        })
        .collect()
}

#[test]
fn integer_checkpoints_convert_to_affine_by_default_and_decode_as_their_library() {
    use metrale_pack::converters::affine::Form;
    let tmp = tempfile::tempdir().unwrap();
    let dirs = integer_fixtures();
    let names: Vec<String> = dirs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    assert!(dirs.len() >= 15, "integer fixtures: {names:?}");
    let mut forms = std::collections::BTreeSet::new();
    for (dir, name) in dirs.iter().zip(&names) {
        let e = expected(dir);
        let m = Model::open(dir).unwrap();
        let settled = pack::choice::settle(&m, &ConvertOptions::default());
        assert_eq!(settled.layouts, [Layout::Affine], "{name}");
        assert!(settled.refusal.is_none(), "{name}");
        // The library's default options choose the same set as the command line.
        let out = tmp.path().join("a.mpk.gguf");
        pack::convert(&m, &ConvertOptions::default(), &out, &|_, _| {})
            .unwrap_or_else(|err| panic!("{name}: {err:#}"));
        let p = Pack::open(&out).unwrap();
        assert_eq!(p.manifest.layouts, ["affine"], "{name}");
        let mut checked = 0;
        for (proj, hf) in [
            ("gate", "gate_proj"),
            ("up", "up_proj"),
            ("down", "down_proj"),
        ] {
            let blob = format!("blk.0.ffn_{proj}.affine");
            let (v, shape) = p.decode_ffn(&blob).unwrap();
            let w = &e["weights"][format!("model.layers.0.mlp.{hf}.weight")];
            let want: Vec<u64> = w["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(shape.to_vec(), want, "{name} {proj}");
            // The library's own f32 dequantization, bit for bit, and its native dtype's.
            assert_eq!(
                sha_f32(&v),
                w["sha256_f32"].as_str().unwrap(),
                "{name} {proj}: f32"
            );
            assert_eq!(
                sha_lib(&v, w["lib_dtype"].as_str().unwrap()),
                w["sha256_lib"].as_str().unwrap(),
                "{name} {proj}: the library's dtype"
            );
            let i = p.index(&format!("{blob}.codes")).unwrap();
            let fe = p.manifest.tensors[i].ffn.as_ref().unwrap();
            forms.insert(fe.scalars["form"] as u32);
            assert_ne!(fe.scalars["form"], Form::Offset as u32 as f32, "{name}");
            checked += 1;
        }
        assert_eq!(checked, 3, "{name}");
        let c = pack::verify_against_source(&p, &m).unwrap();
        assert!(c.mismatched.is_empty(), "{name}: {:?}", c.mismatched);
    }
    // Both zero forms occur: F16 (AWQ) scales as halves, F32 ones as f32.
    assert_eq!(forms.into_iter().collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn integer_groups_split_across_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    // Per-channel int8 (one group a row): intermediate 384 splits into 192 a rank at any cut.
    let m = Model::open(fixtures().join("ct-int8-w8a8-bf16")).unwrap();
    let opts = ConvertOptions {
        layouts: Some(vec![Layout::Affine]),
        tp: 2,
        ..Default::default()
    };
    let out = tmp.path().join("tp.mpk.gguf");
    pack::convert(&m, &opts, &out, &|_, _| {}).unwrap();
    let p = Pack::open(&out).unwrap();
    let c = pack::verify_against_source(&p, &m).unwrap();
    assert!(c.mismatched.is_empty(), "{:?}", c.mismatched);
    let full = m.decode_weight(&m.ffn_layers[0].down).unwrap().0;
    for r in 0..2usize {
        let (v, [n, k]) = p
            .decode_ffn(&format!("blk.0.ffn_down.tp{r}.affine"))
            .unwrap();
        assert_eq!([n, k], [256, 192]);
        for row in 0..256 {
            let want = &full[row * 384 + 192 * r..row * 384 + 192 * (r + 1)];
            assert!(
                v[row * 192..(row + 1) * 192]
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "rank {r} row {row}"
            );
        }
    }
}
