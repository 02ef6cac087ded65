//! The pack end to end: convert the real SmolLM2 GGUF and generated models (SiLU and GELU,
//! shapes with and without padding, GGUF and safetensors sources, quantized sources that are
//! carried), then check every layout against CPU references, untouched tensors byte for byte,
//! gguf-py's view of the pack, `verify --source` and determinism across thread counts. Loading, refusals and crash safety are in tests/pack_lifecycle.rs.

mod common;

use common::pack::*;
use common::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::layouts::{self, Layout, q4k_mmq::DownFormat};
use metrale_pack::converters::{fp8_block, nvfp4_modelopt};
use metrale_pack::gguf::Value;
use metrale_pack::model::{Activation, Model};
use metrale_pack::pack::{self, ConvertOptions, Pack};
use safetensors::tensor::Dtype;

#[test]
fn smollm2_every_layout_round_trips() {
    let src = smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("all.mpk.gguf");
    let man = convert(&src, &out, &opts(&all_but_lora()));
    assert_eq!(man.model.ffn_layers, 30);
    assert_eq!(
        (man.model.hidden_size, man.model.intermediate_size),
        (576, 1536)
    );
    check_layouts(&src, &out, &[0, 17, 29], DownFormat::Int8);

    let m = Model::open(&src).unwrap();
    let p = Pack::open(&out).unwrap();
    // Untouched tensors byte-identical, in source order, before the device segment.
    let mut passthrough = 0;
    for (i, t) in m.tensors.iter().enumerate() {
        if t.name.contains(".ffn_gate.")
            || t.name.contains(".ffn_up.")
            || t.name.contains(".ffn_down.")
        {
            assert!(
                p.index(&t.name).is_none(),
                "{} should be repacked, not carried",
                t.name
            );
            continue;
        }
        let j = p
            .index(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert!(p.manifest.tensors[j].device, "{}", t.name);
        assert_eq!(p.data(j), m.data(i), "{}", t.name);
        assert_eq!(
            p.file.tensors[j].ty,
            match t.dtype {
                metrale_pack::model::DType::Ggml(g) => g,
                _ => unreachable!(),
            }
        );
        passthrough += 1;
    }
    assert_eq!(passthrough, 272 - 90);
    // Metadata carried: tokenizer and architecture keys identical.
    for key in [
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "llama.rope.freq_base",
        "tokenizer.chat_template",
    ] {
        assert_eq!(p.file.get(key), m.files_gguf0().get(key), "{key}");
    }
    // Device segment: contiguous, page-aligned, holds every tensor (none kept on the host),
    // FFN blobs in layer order.
    let seg = p.segment_range();
    assert_eq!(seg.start % 4096, 0);
    assert!(p.manifest.tensors.iter().all(|e| e.device));
    let first = &p.file.tensors[0];
    let last = p.file.tensors.last().unwrap();
    assert_eq!(first.file_offset, seg.start);
    // The segment ends on the page after its last tensor (the final pad).
    assert_eq!(seg.end % 4096, 0);
    assert_eq!(
        (last.file_offset + last.bytes).div_ceil(4096) * 4096,
        seg.end
    );
    let layers: Vec<usize> = p
        .file
        .tensors
        .iter()
        .filter(|t| t.ty == GgmlType::I8)
        .map(|t| t.name.split('.').nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(
        layers.windows(2).all(|w| w[0] <= w[1]),
        "segment is not in layer order"
    );

    // q4k_mmq gate bytes == ggml's reference quantizer (libgguf) on the source values padded to 768.
    let dir2 = tempfile::tempdir().unwrap();
    let (x, _) = m.decode_weight(&m.ffn_layers[5].gate).unwrap();
    let padded = layouts::pad(&x, 1536, 576, 1536, 768);
    let inp = dir2.path().join("x.npy");
    let outp = dir2.path().join("q.npy");
    write_npy_f32(&inp, &[1536, 768], &padded);
    python_ref(&[
        "quant",
        "Q4_K",
        inp.to_str().unwrap(),
        outp.to_str().unwrap(),
    ]);
    let j = p.index("blk.5.ffn_gate.q4k_mmq").unwrap();
    assert!(
        p.data(j) == read_npy(&outp).data.as_slice(),
        "q4k_mmq gate differs from libgguf"
    );

    // gguf-py opens the pack and sees our tensor table.
    let tj = dir2.path().join("t.json");
    python_ref(&["tensors", out.to_str().unwrap(), tj.to_str().unwrap()]);
    let theirs: serde_json::Value = serde_json::from_slice(&std::fs::read(&tj).unwrap()).unwrap();
    assert_eq!(theirs["alignment"], metrale_pack::pack::PACK_ALIGNMENT);
    let ours: serde_json::Value =
        serde_json::from_slice(&cli(&["inspect", out.to_str().unwrap(), "--json"]).stdout).unwrap();
    let (a, b) = (
        ours["tensors"].as_array().unwrap(),
        theirs["tensors"].as_array().unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        for k in ["name", "type", "shape", "offset", "bytes"] {
            assert_eq!(x[k], y[k], "{k} of {}", x["name"]);
        }
        // Every FFN blob starts on a page of the file, as gguf-py places it.
        let name = x["name"].as_str().unwrap();
        if name.contains(".ffn_") && !name.ends_with(".weight") {
            assert_eq!(y["offset"].as_u64().unwrap() % 4096, 0, "{}", x["name"]);
        }
    }
    assert!(
        theirs["kv"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "metrale.pack.manifest")
    );
    assert_eq!(ours["pack"]["layouts"].as_array().unwrap().len(), 10);

    // verify --source passes; any one changed byte (a passthrough tensor, an FFN blob) fails.
    let ok = cli(&[
        "verify",
        out.to_str().unwrap(),
        "--source",
        src.to_str().unwrap(),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for victim in [
        "blk.7.attn_q.weight",
        "blk.12.ffn_down.fp8.scales",
        "blk.0.ffn_up.q2g128",
    ] {
        let bad = dir.path().join("bad.gguf");
        let mut bytes = std::fs::read(&out).unwrap();
        let t = &p.file.tensors[p.index(victim).unwrap()];
        let at = (t.file_offset + t.bytes / 2) as usize;
        bytes[at] ^= 0x01;
        std::fs::write(&bad, &bytes).unwrap();
        let r = cli(&[
            "verify",
            bad.to_str().unwrap(),
            "--source",
            src.to_str().unwrap(),
        ]);
        assert!(!r.status.success());
        assert!(
            String::from_utf8_lossy(&r.stderr).contains(victim),
            "{}",
            String::from_utf8_lossy(&r.stderr)
        );
        // The source comparison alone (not only the checksum) catches it.
        let bp = Pack::open(&bad).unwrap();
        let c = pack::verify_against_source(&bp, &m).unwrap();
        assert_eq!(c.mismatched, vec![victim.to_string()]);
    }

    // dump decodes a layout through the CLI, in the logical shape.
    let npy = dir.path().join("d.npy");
    let r = cli(&[
        "dump",
        out.to_str().unwrap(),
        "blk.3.ffn_down.nvfp4_mmq",
        "-o",
        npy.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let d = read_npy(&npy);
    assert_eq!(d.shape, vec![576, 1536]);
    let (y, _) = p.decode_ffn("blk.3.ffn_down.nvfp4").unwrap();
    assert_bits_eq("dump nvfp4_mmq == nvfp4", &d.to_f32(), &y);
}

#[test]
fn smollm2_default_layouts_and_q4k_down() {
    let src = smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d.mpk.gguf");
    // Q4_1 weights: the default carries them in `affine`, no flag needed; with the flag too.
    for flags in [&[][..], &["--allow-requantize"][..]] {
        let mut args = vec![
            "convert",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let r = cli(&args);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let p = Pack::open(&out).unwrap();
        assert_eq!(p.manifest.layouts, vec!["affine"]);
    }
    check_layouts(&src, &out, &[0, 29], DownFormat::Int8);
    let out2 = dir.path().join("q.mpk.gguf");
    let man = convert(
        &src,
        &out2,
        &ConvertOptions {
            layouts: Some(vec![Layout::Q4kMmq]),
            q4k_down: DownFormat::Q4k,
            lora: None,
            ..Default::default()
        },
    );
    assert!(
        man.tensors
            .iter()
            .any(|t| t.name == "blk.0.ffn_down.q4k_mmq")
    );
    assert!(
        !man.tensors
            .iter()
            .any(|t| t.name == "blk.0.ffn_down.q4k_mmq.codes")
    );
    check_layouts(&src, &out2, &[1], DownFormat::Q4k);
}

#[test]
fn generated_silu_and_gelu_models_with_padding() {
    let mut rng = Rng::fresh("generated");
    let dir = tempfile::tempdir().unwrap();
    // hidden 200 and inter 328 are multiples of none of 64/128/256: every layout pads.
    for (name, arch, ty, h, i) in [
        ("silu_pad.gguf", "llama", GgmlType::F32, 200, 328),
        ("silu_even.gguf", "llama", GgmlType::F16, 256, 512),
        ("gelu_pad.gguf", "gemma", GgmlType::BF16, 136, 264),
    ] {
        let src = gguf_model(dir.path(), name, arch, h, i, 2, ty, &mut rng);
        let out = dir.path().join(format!("{name}.mpk"));
        let layouts: Vec<Layout> = if arch == "gemma" {
            all_but_lora()
                .into_iter()
                .filter(|l| l.serves(Activation::Gelu))
                .collect()
        } else {
            all_but_lora()
        };
        let man = convert(&src, &out, &opts(&layouts));
        assert_eq!(
            man.model.activation,
            if arch == "gemma" { "gelu" } else { "silu" }
        );
        check_layouts(&src, &out, &[0, 1], DownFormat::Int8);
        let c =
            pack::verify_against_source(&Pack::open(&out).unwrap(), &Model::open(&src).unwrap())
                .unwrap();
        assert!(c.mismatched.is_empty(), "{:?}", c.mismatched);
        if ty == GgmlType::BF16 {
            // A BF16 source is carried unchanged into the bf16 layout (rows padded 136 -> 136).
            let m = Model::open(&src).unwrap();
            let p = Pack::open(&out).unwrap();
            let j = p.index("blk.1.ffn_up.bf16").unwrap();
            assert_eq!(p.data(j), m.data(m.tensor("blk.1.ffn_up.weight").unwrap()));
        }
    }
    // GELU: defaults are nvfp4 + nvfp4_t; nvfp4_mmq is refused with the reason (w8a8 serves
    // GELU layers).
    let src = dir.path().join("gelu_pad.gguf");
    let out = dir.path().join("g.mpk");
    let man = convert(&src, &out, &ConvertOptions::default());
    assert_eq!(man.layouts, vec!["nvfp4", "nvfp4_t"]);
    let m = Model::open(&src).unwrap();
    let e = pack::convert(&m, &opts(&[Layout::Nvfp4Mmq]), &out, &no_progress)
        .unwrap_err()
        .to_string();
    let why = "finalize_nvfp4_mmq_load skips them";
    assert!(e.contains(why) && e.contains("gelu_pad.gguf"), "{e}");
    // And w8a8 converts.
    pack::convert(&m, &opts(&[Layout::W8a8]), &out, &no_progress).unwrap();
}

#[test]
fn q4k_source_is_carried_and_output_is_thread_count_independent() {
    let mut rng = Rng::fresh("q4k-carry");
    let dir = tempfile::tempdir().unwrap();
    let src = gguf_model(
        dir.path(),
        "q4k.gguf",
        "llama",
        256,
        768,
        2,
        GgmlType::Q4_K,
        &mut rng,
    );
    let m = Model::open(&src).unwrap();
    let mut outs = Vec::new();
    for threads in [1, 2] {
        let out = dir.path().join(format!("t{threads}.mpk"));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            pack::convert(
                &m,
                &opts(&[Layout::Q4kMmq, Layout::Nvfp4, Layout::Nvfp4Mmq, Layout::Fp8]),
                &out,
                &no_progress,
            )
        })
        .unwrap();
        outs.push(std::fs::read(&out).unwrap());
    }
    assert!(outs[0] == outs[1], "1-thread and 2-thread packs differ");
    let p = Pack::open(dir.path().join("t1.mpk")).unwrap();
    for proj in ["gate", "up"] {
        let j = p.index(&format!("blk.1.ffn_{proj}.q4k_mmq")).unwrap();
        assert_eq!(
            p.data(j),
            m.data(m.tensor(&format!("blk.1.ffn_{proj}.weight")).unwrap()),
            "{proj} not carried"
        );
    }
}

#[test]
fn modelopt_nvfp4_and_block_fp8_sources_are_carried() {
    let mut rng = Rng::fresh("carry");
    let dir = tempfile::tempdir().unwrap();
    let (hidden, inter) = (96, 160); // nvfp4 pads K 96 -> 128 and 160 -> 192
    let mut nv = Vec::new();
    let mut f8 = Vec::new();
    let mut encs = Vec::new();
    for (p, n, k) in [
        ("gate", inter, hidden),
        ("up", inter, hidden),
        ("down", hidden, inter),
    ] {
        let x = rng.weights(n * k);
        let w = nvfp4_modelopt::encode(&x, n, k);
        let pre = format!("model.layers.0.mlp.{p}_proj");
        nv.push((
            format!("{pre}.weight"),
            Dtype::U8,
            vec![n, k / 2],
            w.codes.clone(),
        ));
        nv.push((
            format!("{pre}.weight_scale"),
            Dtype::F8_E4M3,
            vec![n, k / 16],
            w.scales.clone(),
        ));
        nv.push((
            format!("{pre}.weight_scale_2"),
            Dtype::F32,
            vec![],
            w.global_scale.to_le_bytes().to_vec(),
        ));
        let (c, s) = fp8_block::encode(&x, n, k);
        let (gn, gk) = fp8_block::scale_grid(n, k);
        f8.push((
            format!("{pre}.weight"),
            Dtype::F8_E4M3,
            vec![n, k],
            c.clone(),
        ));
        f8.push((
            format!("{pre}.weight_scale_inv"),
            Dtype::F32,
            vec![gn, gk],
            f32b(&s),
        ));
        encs.push((w, c, s));
    }
    let extra = (
        "model.norm.weight".to_string(),
        Dtype::F32,
        vec![hidden],
        f32b(&vec![1.0; hidden]),
    );
    nv.push(extra.clone());
    f8.push(extra);
    let cfg =
        r#"{"model_type":"llama","hidden_size":96,"intermediate_size":160,"hidden_act":"silu"}"#;
    for (sub, ts) in [("nv", &nv), ("f8", &f8)] {
        let d = dir.path().join(sub);
        std::fs::create_dir(&d).unwrap();
        save_st(&d.join("model.safetensors"), ts);
        std::fs::write(d.join("config.json"), cfg).unwrap();
    }
    // ModelOpt NVFP4 -> nvfp4: codes and scales are the source bytes, rows padded.
    let out = dir.path().join("nv.mpk");
    convert(
        &dir.path().join("nv"),
        &out,
        &opts(&[Layout::Nvfp4, Layout::Nvfp4Mmq]),
    );
    let p = Pack::open(&out).unwrap();
    let codes = p.data(p.index("blk.0.ffn_gate.nvfp4.codes").unwrap());
    assert_eq!(codes.len(), inter * 128 / 2);
    for r in 0..inter {
        assert_eq!(
            &codes[r * 64..r * 64 + 48],
            &encs[0].0.codes[r * 48..r * 48 + 48]
        );
        assert!(codes[r * 64 + 48..r * 64 + 64].iter().all(|&b| b == 0));
    }
    let e = p
        .manifest
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.ffn_down.nvfp4.codes")
        .unwrap();
    assert_eq!(
        e.ffn.as_ref().unwrap().scalars["global_scale"],
        encs[2].0.global_scale
    );
    assert_eq!(e.ffn.as_ref().unwrap().source_scheme, "modelopt-nvfp4");
    check_layouts(&dir.path().join("nv"), &out, &[0], DownFormat::Int8);
    // The passthrough F32 tensor keeps its type; config.json travels as metadata.
    let first_passthrough = p.manifest.tensors.iter().position(|e| e.ffn.is_none());
    assert_eq!(p.file.tensors[first_passthrough.unwrap()].ty, GgmlType::F32);
    assert_eq!(
        p.file
            .get("metrale.source.config_json")
            .and_then(Value::as_str),
        Some(cfg)
    );
    // Block FP8 -> fp8: fused gate_up codes are gate's then up's source bytes (K 96 -> 128).
    let out = dir.path().join("f8.mpk");
    convert(&dir.path().join("f8"), &out, &opts(&[Layout::Fp8]));
    let p = Pack::open(&out).unwrap();
    let c = p.data(p.index("blk.0.ffn_gate_up.fp8.codes").unwrap());
    let interp = 256;
    assert_eq!(c.len(), 2 * interp * 128);
    assert_eq!(&c[0..96], &encs[0].1[0..96]);
    assert_eq!(&c[interp * 128..interp * 128 + 96], &encs[1].1[0..96]);
    let s = layouts::f32_from(p.data(p.index("blk.0.ffn_gate_up.fp8.scales").unwrap()));
    assert_eq!(s, [encs[0].2.clone(), encs[1].2.clone()].concat());
    check_layouts(&dir.path().join("f8"), &out, &[0], DownFormat::Int8);
}

/// `convert`'s fidelity table (per layout and projection: the relative error of the decoded
/// weights against the source's, worst layer and mean) equals an independent float64 computation
/// in tests/py/reference.py (every layout decoded there from its bytes as formats.md specifies,
/// the source by gguf-py) for generated SiLU and GELU models with padding; the manifest keeps it,
/// `inspect` shows it, and a pack whose manifest has none still opens.
#[test]
fn the_fidelity_table_equals_an_independent_float64_computation() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, layouts) in [
        ("llama", all_but_lora()),
        (
            "gemma",
            all_but_lora()
                .into_iter()
                .filter(|l| l.serves(Activation::Gelu))
                .collect(),
        ),
    ] {
        // k = 96 and n = 160: padding in every layout's K and in the N of fp8, nvfp4_t and
        // nvfp4_mmq.
        let src = dir.path().join(format!("{arch}.gguf"));
        metrale_pack::testing::gen_model::gen_model(&src, 96, 160, 3, GgmlType::F16, arch).unwrap();
        let out = dir.path().join(format!("{arch}.mpk.gguf"));
        let m = convert(&src, &out, &opts(&layouts));
        let json = dir.path().join(format!("{arch}.json"));
        python_ref(&[
            "fidelity",
            out.to_str().unwrap(),
            src.to_str().unwrap(),
            json.to_str().unwrap(),
        ]);
        let theirs: Vec<pack::Fidelity> =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        // Every layout but lora, each of its projections.
        let want: usize = layouts.iter().map(|l| l.spec().projections().len()).sum();
        assert_eq!(m.fidelity.len(), want, "{arch}: {:?}", m.fidelity);
        assert_eq!(theirs.len(), want, "{arch}: {theirs:?}");
        for ours in &m.fidelity {
            let t = theirs
                .iter()
                .find(|t| t.layout == ours.layout && t.proj == ours.proj)
                .unwrap_or_else(|| panic!("{arch}: reference.py has no {ours:?}"));
            // The layouts decode to f32 (what the kernels see), reference.py in float64: each
            // element differs by at most one f32 rounding (2^-24 relative), which moves an error
            // of ~1e-3..0.5 by less than 1e-5 of itself.
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1e-12);
            assert!(
                close(ours.worst_rel_err, t.worst_rel_err)
                    && close(ours.mean_rel_err, t.mean_rel_err)
                    && ours.worst_layer == t.worst_layer,
                "{arch}: ours {ours:?}, reference {t:?}"
            );
            assert!(
                ours.worst_rel_err > 0.0 && ours.worst_rel_err < 0.6,
                "{ours:?}"
            );
        }
        // The manifest keeps it; inspect shows it (text, and JSON under `fidelity`).
        let p = Pack::open(&out).unwrap();
        assert_eq!(p.manifest.fidelity, m.fidelity);
        let j = cli(&["inspect", out.to_str().unwrap(), "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
        assert_eq!(v["fidelity"].as_array().unwrap().len(), want);
        assert_eq!(v["ffn_layers"], 3);
        let t = String::from_utf8(cli(&["inspect", out.to_str().unwrap()]).stdout).unwrap();
        assert!(t.contains("ffn layers: 3 (packed as"), "{t}");
        assert!(t.contains("fidelity ("), "{t}");
    }
    // A pack without the table (written before it was measured) still opens.
    let img = std::fs::read(dir.path().join("llama.mpk.gguf")).unwrap();
    let json = {
        let g = metrale_pack::gguf::parse(&img, "m").unwrap();
        let kv = g
            .kvs
            .iter()
            .find(|kv| kv.key == pack::keys::MANIFEST)
            .unwrap();
        kv.value.as_str().unwrap().trim_end().to_string()
    };
    let mut man: serde_json::Value = serde_json::from_str(&json).unwrap();
    man.as_object_mut().unwrap().remove("fidelity").unwrap();
    let old = metrale_pack::fuzzing::with_manifest(&img, &man.to_string()).unwrap();
    let op = dir.path().join("old.mpk.gguf");
    std::fs::write(&op, &old).unwrap();
    let p = Pack::open(&op).unwrap();
    assert!(p.manifest.fidelity.is_empty());
}
