//! The pack end to end: convert the real SmolLM2 GGUF and generated models (SiLU and GELU,
//! shapes with and without padding, GGUF and safetensors sources, quantized sources that are
//! carried), then check every layout against CPU references, untouched tensors byte for byte,
//! gguf-py's view of the pack, `verify --source`, determinism across thread counts, refusals,
//! and crash safety.

mod common;

use common::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::layouts::{self, Layout, Proj, q4k_mmq::DownFormat};
use metrale_pack::converters::{bf16, fp8_block, nvfp4_modelopt};
use metrale_pack::gguf::Value;
use metrale_pack::gguf_write::build;
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions, Pack};
use safetensors::tensor::{Dtype, TensorView};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every layout but lora (which needs an adapter).
fn all_but_lora() -> Vec<Layout> {
    Layout::ALL
        .into_iter()
        .filter(|&l| l != Layout::Lora)
        .collect()
}

fn no_progress(_: u64, _: u64) {}

fn convert(src: &Path, out: &Path, opts: &ConvertOptions) -> pack::Manifest {
    let m = Model::open(src).unwrap();
    pack::convert(&m, opts, out, &no_progress).unwrap()
}

fn opts(layouts: &[Layout]) -> ConvertOptions {
    ConvertOptions {
        layouts: Some(layouts.to_vec()),
        ..Default::default()
    }
}

/// ‖y − x‖ / ‖x‖ in float64.
fn rel(y: &[f32], x: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in y.iter().zip(x) {
        num += (*a as f64 - *b as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

/// Normwise error bound of each layout against the source weights (float64 reference).
fn tolerance(l: Layout) -> f64 {
    match l {
        Layout::Nvfp4 | Layout::Nvfp4T | Layout::Nvfp4Mmq => 0.16, // E2M1 x E4M3, 16-element blocks
        Layout::Fp8 | Layout::W8a8 => 0.05,                        // 3 mantissa bits
        Layout::Bf16 => 0.004,                                     // 8 bits
        Layout::Q4kMmq => 0.12, // 4-bit with 6-bit scales (int8 down is finer)
        Layout::Q2g128 => 0.75, // 2-bit symmetric, 128 groups
        Layout::Lora => 0.0,
    }
}

/// The CPU reference of a layout: decode(encode(source f32)) through the layout functions,
/// independent of the pack container.
fn reference(
    l: Layout,
    x: &[f32],
    n: usize,
    k: usize,
    down: bool,
    q4k_down: DownFormat,
) -> Vec<f32> {
    let e = match l {
        Layout::Nvfp4 | Layout::Nvfp4T | Layout::Nvfp4Mmq => layouts::nvfp4::encode(x, n, k),
        Layout::Q4kMmq if down && q4k_down == DownFormat::Int8 => {
            layouts::q4k_mmq::encode_int8(x, n, k)
        }
        Layout::Q4kMmq => layouts::q4k_mmq::encode_q4k(x, n, k),
        Layout::Fp8 => layouts::fp8::encode(x, n, k),
        Layout::W8a8 => layouts::w8a8::encode(x, n, k),
        Layout::Bf16 => layouts::bf16::encode(x, n, k),
        Layout::Q2g128 => layouts::q2g128::encode(x, n, k),
        Layout::Lora => unreachable!(),
    };
    let [np, kp] = e.padded;
    let p = |i: usize| e.parts[i].1.as_slice();
    match l {
        Layout::Nvfp4 | Layout::Nvfp4T | Layout::Nvfp4Mmq => layouts::crop(
            &layouts::nvfp4::decode_padded(p(0), p(1), e.scalars[0].1, n, kp),
            kp,
            n,
            k,
        ),
        Layout::Q4kMmq if e.parts.len() == 2 => layouts::q4k_mmq::decode_int8(p(0), p(1), n, k, kp),
        Layout::Q4kMmq => layouts::q4k_mmq::decode_q4k(p(0), n, k, kp),
        Layout::Fp8 => layouts::crop(&layouts::fp8::decode_padded(p(0), p(1), np, kp), kp, n, k),
        Layout::W8a8 => layouts::w8a8::decode(p(0), p(1), n, k, kp),
        Layout::Bf16 => layouts::bf16::decode(p(0), n, k, kp),
        Layout::Q2g128 => layouts::q2g128::decode(p(0), n, k, kp),
        Layout::Lora => unreachable!(),
    }
}

/// Every layout of the listed layers against the reference (bit for bit) and the source
/// (within tolerance).
fn check_layouts(src: &Path, pack_path: &Path, layers: &[usize], q4k_down: DownFormat) {
    let m = Model::open(src).unwrap();
    let p = Pack::open(pack_path).unwrap();
    let layouts_in: Vec<Layout> = p
        .manifest
        .layouts
        .iter()
        .map(|t| Layout::from_tag(t).unwrap())
        .collect();
    for &li in layers {
        let l = &m.ffn_layers[li];
        let src_w: Vec<(Proj, Vec<f32>, [u64; 2], &str)> = [
            (Proj::Gate, &l.gate),
            (Proj::Up, &l.up),
            (Proj::Down, &l.down),
        ]
        .into_iter()
        .map(|(pj, w)| {
            let (x, s) = m.decode_weight(w).unwrap();
            (pj, x, s, w.scheme())
        })
        .collect();
        // What carried NVFP4 source bytes decode to under the pack's contract,
        // `(E2M1 * scale) * global_scale` with the layout's global scale (the source library's
        // own order can differ from it by an ulp, and ModelOpt's in the sign of zero).
        let carried_nvfp4 = |w: &metrale_pack::model::FfnWeight| -> Option<Vec<f32>> {
            use metrale_pack::model::FfnWeight;
            let (codes, scales, g) = match *w {
                FfnWeight::ModelOptNvfp4 {
                    weight,
                    scale,
                    scale_2,
                    ..
                } => (weight, scale, m.scalar_f32(scale_2, "s2").unwrap()),
                FfnWeight::CtNvfp4 {
                    packed,
                    scale,
                    global_scale,
                } => (
                    packed,
                    scale,
                    1.0 / m.scalar_f32(global_scale, "g").unwrap(),
                ),
                _ => return None,
            };
            let mut out = vec![0f32; m.data(codes).len() * 2];
            metrale_pack::converters::nvfp4_modelopt::decode(
                m.data(codes),
                m.data(scales),
                g,
                &mut out,
            );
            Some(out)
        };
        let carried_x: Vec<Option<Vec<f32>>> = [&l.gate, &l.up, &l.down]
            .map(carried_nvfp4)
            .into_iter()
            .collect();
        for &layout in layouts_in.iter().filter(|&&l| l != Layout::Lora) {
            for (pj, x, [n, k], scheme) in &src_w {
                let (n, k) = (*n as usize, *k as usize);
                let name = if layout == Layout::Fp8 && *pj != Proj::Down {
                    format!("blk.{li}.ffn_gate_up.fp8")
                } else {
                    format!("blk.{li}.ffn_{}.{}", pj.name(), layout.tag())
                };
                let (y, shape) = p.decode_ffn(&name).unwrap();
                let y = if layout == Layout::Fp8 && *pj != Proj::Down {
                    assert_eq!(shape, [2 * n as u64, k as u64]);
                    let off = if *pj == Proj::Gate { 0 } else { n * k };
                    y[off..off + n * k].to_vec()
                } else {
                    assert_eq!(shape, [n as u64, k as u64], "{name}");
                    y
                };
                // A source already in the target format is carried: the layout decodes to the
                // source values exactly. Otherwise: decode(encode(source)).
                let carried = matches!(
                    (layout, *scheme),
                    (
                        Layout::Nvfp4 | Layout::Nvfp4T | Layout::Nvfp4Mmq,
                        "modelopt-nvfp4" | "compressed-tensors-nvfp4"
                    ) | (Layout::Fp8, "fp8-block128")
                );
                let pi = match pj {
                    Proj::Gate => 0,
                    Proj::Up => 1,
                    _ => 2,
                };
                let r = if carried {
                    match (&carried_x[pi], layout) {
                        (Some(c), Layout::Nvfp4 | Layout::Nvfp4T | Layout::Nvfp4Mmq) => c.clone(),
                        _ => x.clone(),
                    }
                } else {
                    reference(layout, x, n, k, *pj == Proj::Down, q4k_down)
                };
                assert_bits_eq(&name, &y, &r);
                let e = rel(&y, x);
                assert!(
                    e <= tolerance(layout),
                    "{name}: relative error {e} > {}",
                    tolerance(layout)
                );
            }
        }
    }
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

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
        assert_eq!(j, passthrough);
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
    // Device segment: contiguous, page-aligned, layer order, holds exactly the FFN blobs.
    let seg = p.segment_range();
    assert_eq!(seg.start % 4096, 0);
    let blobs: Vec<_> = p
        .file
        .tensors
        .iter()
        .filter(|t| t.ty == GgmlType::I8)
        .collect();
    assert_eq!(blobs.first().unwrap().file_offset, seg.start);
    let last = blobs.last().unwrap();
    assert_eq!(last.file_offset + last.bytes.div_ceil(4096) * 4096, seg.end);
    let layers: Vec<usize> = blobs
        .iter()
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
    assert_eq!(theirs["alignment"], 4096);
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
    }
    assert!(
        theirs["kv"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "metrale.pack.manifest")
    );
    assert_eq!(ours["pack"]["layouts"].as_array().unwrap().len(), 8);

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
    let r = cli(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let p = Pack::open(&out).unwrap();
    assert_eq!(p.manifest.layouts, vec!["nvfp4", "nvfp4_mmq"]);
    let out2 = dir.path().join("q.mpk.gguf");
    let man = convert(
        &src,
        &out2,
        &ConvertOptions {
            layouts: Some(vec![Layout::Q4kMmq]),
            q4k_down: DownFormat::Q4k,
            lora: None,
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

// ---- generated models ----

#[allow(clippy::too_many_arguments)]
fn gguf_model(
    dir: &Path,
    name: &str,
    arch: &str,
    hidden: usize,
    inter: usize,
    layers: usize,
    ty: GgmlType,
    rng: &mut Rng,
) -> PathBuf {
    let mut ts: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = vec![(
        "token_embd.weight".into(),
        vec![hidden as u64, 10],
        GgmlType::F32,
        f32b(&rng.weights(hidden * 10)),
    )];
    for l in 0..layers {
        ts.push((
            format!("blk.{l}.ffn_norm.weight"),
            vec![hidden as u64],
            GgmlType::F32,
            f32b(&vec![1.0; hidden]),
        ));
        for (p, n, k) in [
            ("gate", inter, hidden),
            ("up", inter, hidden),
            ("down", hidden, inter),
        ] {
            let x = rng.weights(n * k);
            let bytes = match ty {
                GgmlType::F32 => f32b(&x),
                GgmlType::F16 => metrale_pack::converters::f16::encode(&x),
                GgmlType::BF16 => bf16::encode(&x),
                GgmlType::Q4_K => metrale_pack::converters::encode_to_vec::<
                    metrale_pack::converters::q4_k::Q4K,
                >(&x),
                _ => unreachable!(),
            };
            ts.push((
                format!("blk.{l}.ffn_{p}.weight"),
                vec![k as u64, n as u64],
                ty,
                bytes,
            ));
        }
    }
    let kvs = vec![
        ("general.architecture", Value::String(arch.into())),
        (
            if arch == "gemma" {
                "gemma.embedding_length"
            } else {
                "llama.embedding_length"
            },
            Value::U32(hidden as u32),
        ),
    ];
    let tsr: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = ts
        .iter()
        .map(|(a, b, c, d)| (a.as_str(), b.clone(), *c, d.clone()))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, build(32, &kvs, &tsr)).unwrap();
    path
}

fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
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
                .filter(|l| !matches!(l, Layout::W8a8 | Layout::Nvfp4Mmq))
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
    // GELU: defaults are nvfp4 + nvfp4_t; w8a8 and nvfp4_mmq are refused with the reason.
    let src = dir.path().join("gelu_pad.gguf");
    let out = dir.path().join("g.mpk");
    let man = convert(&src, &out, &ConvertOptions::default());
    assert_eq!(man.layouts, vec!["nvfp4", "nvfp4_t"]);
    let m = Model::open(&src).unwrap();
    for (l, why) in [
        (Layout::W8a8, "set_w8a8_decode_weights refuses a GELU FFN"),
        (Layout::Nvfp4Mmq, "finalize_nvfp4_mmq_load skips them"),
    ] {
        let e = pack::convert(&m, &opts(&[l]), &out, &no_progress)
            .unwrap_err()
            .to_string();
        assert!(e.contains(why) && e.contains("gelu_pad.gguf"), "{e}");
    }
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
    let p = Pack::open(&dir.path().join("t1.mpk")).unwrap();
    for proj in ["gate", "up"] {
        let j = p.index(&format!("blk.1.ffn_{proj}.q4k_mmq")).unwrap();
        assert_eq!(
            p.data(j),
            m.data(m.tensor(&format!("blk.1.ffn_{proj}.weight")).unwrap()),
            "{proj} not carried"
        );
    }
}

fn save_st(path: &Path, ts: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = ts
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
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
    assert_eq!(p.file.tensors[0].ty, GgmlType::F32);
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

fn lora_adapter(
    dir: &Path,
    layers: usize,
    hidden: usize,
    inter: usize,
    r: usize,
    rng: &mut Rng,
    bad_layer: Option<usize>,
) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("adapter_config.json"), format!(r#"{{"r": {r}, "lora_alpha": 16, "target_modules": ["gate_proj","up_proj","down_proj"]}}"#)).unwrap();
    let mut ts = Vec::new();
    for l in 0..layers {
        for (p, n, k) in [
            ("gate", inter, hidden),
            ("up", inter, hidden),
            ("down", hidden, inter),
        ] {
            let pre = format!("base_model.model.model.layers.{l}.mlp.{p}_proj");
            let rr = if Some(l) == bad_layer { r + 1 } else { r };
            ts.push((
                format!("{pre}.lora_A.weight"),
                Dtype::F32,
                vec![rr, k],
                f32b(&rng.weights(rr * k)),
            ));
            ts.push((
                format!("{pre}.lora_B.weight"),
                Dtype::F32,
                vec![n, r],
                f32b(&rng.weights(n * r)),
            ));
        }
    }
    save_st(&dir.join("adapter_model.safetensors"), &ts);
}

#[test]
fn lora_layout_matches_the_f64_delta() {
    let mut rng = Rng::fresh("lora");
    let dir = tempfile::tempdir().unwrap();
    let src = gguf_model(
        dir.path(),
        "m.gguf",
        "llama",
        64,
        128,
        2,
        GgmlType::F32,
        &mut rng,
    );
    let ad = dir.path().join("adapter");
    lora_adapter(&ad, 2, 64, 128, 4, &mut rng, None);
    let out = dir.path().join("l.mpk");
    let man = convert(
        &src,
        &out,
        &ConvertOptions {
            layouts: Some(vec![Layout::Nvfp4]),
            lora: Some(ad.clone()),
            ..Default::default()
        },
    );
    assert_eq!(man.layouts, vec!["nvfp4", "lora"]);
    let p = Pack::open(&out).unwrap();
    let a = Model::open(&ad.join("adapter_model.safetensors")).unwrap();
    let (delta, shape) = p.decode_ffn("blk.1.ffn_down.lora").unwrap();
    assert_eq!(shape, [64, 128]);
    let am = a
        .decode_tensor(
            a.tensor("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight")
                .unwrap(),
        )
        .unwrap();
    let bm = a
        .decode_tensor(
            a.tensor("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight")
                .unwrap(),
        )
        .unwrap();
    // f64 reference of scaling * B @ A from the f32 adapter; the pack holds A and B in BF16, so the
    // bound is BF16's relative step (2^-8) on each factor.
    let mut reference = vec![0f32; 64 * 128];
    for i in 0..64 {
        for j in 0..128 {
            let s: f64 = (0..4)
                .map(|t| bm[i * 4 + t] as f64 * am[t * 128 + j] as f64)
                .sum();
            reference[i * 128 + j] = (s * 4.0) as f32;
        }
    }
    let e = rel(&delta, &reference);
    assert!(e < 2.0 * f64::powi(2.0, -8), "lora delta error {e}");
    // Without nvfp4 the adapter is refused, with the engine's reason.
    let m = Model::open(&src).unwrap();
    let err = pack::convert(
        &m,
        &ConvertOptions {
            layouts: Some(vec![Layout::Fp8]),
            lora: Some(ad),
            ..Default::default()
        },
        &out,
        &no_progress,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("set_lora_weights only takes an adapter on the NVFP4 base"),
        "{err}"
    );
}

#[test]
fn failed_conversion_leaves_no_file_and_mismatched_packs_are_refused() {
    let mut rng = Rng::fresh("crash");
    let dir = tempfile::tempdir().unwrap();
    let src = gguf_model(
        dir.path(),
        "m.gguf",
        "llama",
        64,
        128,
        3,
        GgmlType::F32,
        &mut rng,
    );
    // An adapter whose layer 2 has the wrong rank: conversion fails after writing layers 0-1.
    let ad = dir.path().join("adapter");
    lora_adapter(&ad, 3, 64, 128, 4, &mut rng, Some(2));
    let out = dir.path().join("x.mpk");
    let m = Model::open(&src).unwrap();
    let err = pack::convert(
        &m,
        &ConvertOptions {
            layouts: Some(vec![Layout::Nvfp4]),
            lora: Some(ad),
            ..Default::default()
        },
        &out,
        &no_progress,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("layers.2.mlp.gate_proj.lora_A.weight")
            && err.contains("expected shape [4, 64]"),
        "{err}"
    );
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "temporary left behind: {left:?}");

    // A pack from another format version or kernel ABI is refused with "re-convert".
    convert(&src, &out, &opts(&[Layout::Bf16]));
    let bytes = std::fs::read(&out).unwrap();
    for (key, newval) in [
        (pack::keys::FORMAT_VERSION, 99u32),
        (pack::keys::KERNEL_ABI, 7u32),
    ] {
        let mut b = bytes.clone();
        let at = b
            .windows(key.len())
            .position(|w| w == key.as_bytes())
            .unwrap()
            + key.len()
            + 4;
        b[at..at + 4].copy_from_slice(&newval.to_le_bytes());
        let bad = dir.path().join("v.mpk");
        std::fs::write(&bad, &b).unwrap();
        let e = Pack::open(&bad).err().unwrap().to_string();
        assert!(
            e.contains("re-convert") && e.contains(&newval.to_string()),
            "{e}"
        );
    }
    // A plain GGUF is not a pack.
    let e = Pack::open(&src).err().unwrap().to_string();
    assert!(e.contains("not a metrale pack"), "{e}");
}

#[test]
fn a_signalled_convert_leaves_neither_output_nor_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.gguf");
    // About 190 MB of F32: converting takes long enough to be interrupted mid-write.
    metrale_pack::testing::gen_model::gen_model(&src, 1024, 3072, 5, GgmlType::F32, "llama")
        .unwrap();
    let out = dir.path().join("out.mpk.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args([
            "convert",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--layouts",
            "q4k_mmq,q2g128",
            "--threads",
            "1",
        ])
        .spawn()
        .unwrap();
    // Wait until the output is being written (the unnamed O_TMPFILE in the output's folder shows
    // in /proc/PID/fd), then terminate.
    let t0 = std::time::Instant::now();
    let tmp_exists = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().contains("tmp-"))
    };
    let pid = child.id();
    let writing = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| {
                        l.starts_with(dir.path()) && l.to_string_lossy().contains("(deleted)")
                    })
                })
            })
            .unwrap_or(false)
    };
    while !(writing() || tmp_exists()) {
        assert!(t0.elapsed().as_secs() < 60, "convert never started writing");
        assert!(
            child.try_wait().unwrap().is_none(),
            "convert finished before it could be interrupted"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: sending SIGTERM to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(!out.exists(), "a partial pack was left at the output path");
    assert!(!tmp_exists(), "the temporary file was left behind");
}

#[test]
fn export_segment_writes_the_ffn_blobs_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(&src, 128, 256, 2, GgmlType::F16, "llama").unwrap();
    let packp = dir.path().join("m.mpk.gguf");
    convert(&src, &packp, &opts(&[Layout::Fp8, Layout::Bf16]));
    let st = dir.path().join("seg.safetensors");
    let r = cli(&[
        "export-segment",
        packp.to_str().unwrap(),
        st.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let p = Pack::open(&packp).unwrap();
    let f = metrale_pack::safetensors_file::StFile::open(&st).unwrap();
    let blobs: Vec<usize> = (0..p.manifest.tensors.len())
        .filter(|&i| p.manifest.tensors[i].ffn.is_some())
        .collect();
    assert_eq!(f.tensors.len(), blobs.len());
    for i in blobs {
        let name = &p.manifest.tensors[i].name;
        let j = f.tensors.iter().position(|t| &t.name == name).unwrap();
        assert!(f.tensor_data(j) == p.data(i), "{name}");
    }
}

/// A 2-layer F32 llama GGUF of `[h, i]` FFNs with a rank-4 PEFT adapter, converted with
/// `layouts` (which include `lora`): (the temp dir, the source, the pack).
fn with_lora_pack(
    tag: &str,
    h: usize,
    i: usize,
    layouts: &[Layout],
) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let mut rng = Rng::fresh(tag);
    let dir = tempfile::tempdir().unwrap();
    let src = gguf_model(
        dir.path(),
        "m.gguf",
        "llama",
        h,
        i,
        2,
        GgmlType::F32,
        &mut rng,
    );
    let ad = dir.path().join("adapter");
    lora_adapter(&ad, 2, h, i, 4, &mut rng, None);
    let out = dir.path().join("l.mpk");
    convert(
        &src,
        &out,
        &ConvertOptions {
            layouts: Some(layouts.to_vec()),
            lora: Some(ad),
            ..Default::default()
        },
    );
    (dir, src, out)
}

#[test]
fn a_pack_with_lora_loads_and_the_layer_adds_the_adapter() {
    use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
    use metrale_pack::gpu::host::HostBackend;
    use metrale_pack::gpu::{GpuBackend, ModelLevers, download_f32, upload_f32};
    use metrale_pack::loader::{self, LoadOptions};
    use metrale_pack::testing::{DenseWeights, ffn_f64, nvfp4_decoded, rel_err};
    use std::sync::Arc;
    let (h, i) = (64, 128);
    let (_dir, src, out) = with_lora_pack("lora-load", h, i, &[Layout::Nvfp4, Layout::Lora]);
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let lp = loader::load(b.as_ref(), &out, &LoadOptions::default()).unwrap();
    let mut ctx = ForwardContext::new(
        b.clone(),
        FfnConfig {
            hidden: h,
            inter: i,
        },
        2,
        ModelLevers::default(),
    )
    .unwrap();
    let mut l = DenseFfnLayer::new(&ctx);
    assert!(lp.layers[1].lora.is_some());
    lp.layers[1].install(&mut l).unwrap();
    // Reference: the source weights through nvfp4, plus the pack's decoded adapter deltas.
    let model = Model::open(&src).unwrap();
    let fl = &model.ffn_layers[1];
    let w = DenseWeights {
        gate: model.decode_weight(&fl.gate).unwrap().0,
        up: model.decode_weight(&fl.up).unwrap().0,
        down: model.decode_weight(&fl.down).unwrap().0,
        hidden: h,
        inter: i,
    };
    let wd = nvfp4_decoded(&w);
    let p = Pack::open(&out).unwrap();
    let add = |base: &[f32], name: &str| -> Vec<f32> {
        let (d, _) = p.decode_ffn(name).unwrap();
        base.iter().zip(&d).map(|(a, b)| a + b).collect()
    };
    let want = DenseWeights {
        gate: add(&wd.gate, "blk.1.ffn_gate.lora"),
        up: add(&wd.up, "blk.1.ffn_up.lora"),
        down: add(&wd.down, "blk.1.ffn_down.lora"),
        hidden: h,
        inter: i,
    };
    let x: Vec<f32> = (0..h).map(|t| ((t * 37 % 17) as f32 - 8.0) / 8.0).collect();
    let xp = b.alloc((h * 4) as u64).unwrap();
    upload_f32(b.as_ref(), xp, &x).unwrap();
    let y = download_f32(b.as_ref(), l.forward(&mut ctx, xp).unwrap()).unwrap();
    let e = rel_err(
        &y,
        &ffn_f64(&x, 1, &want, metrale_pack::model::Activation::Silu),
    );
    assert!(e < 1e-5, "{e}");
    assert!(ctx.trace.contains(&"lora_b_add"));
    assert!(
        rel_err(
            &y,
            &ffn_f64(&x, 1, &wd, metrale_pack::model::Activation::Silu)
        ) > 1e-4
    );
}

#[test]
fn a_pack_with_q4k_mmq_q2g128_and_lora_loads_with_zero_repack_launches() {
    use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
    use metrale_pack::gpu::host::HostBackend;
    use metrale_pack::gpu::{GpuBackend, ModelLevers, download_f32, upload_f32};
    use metrale_pack::loader::{self, LoadOptions};
    use std::collections::HashMap;
    use std::sync::Arc;
    let (h, i) = (256, 512);
    let (_dir, _src, out) = with_lora_pack(
        "q4k-q2-lora-load",
        h,
        i,
        &[Layout::Nvfp4, Layout::Q4kMmq, Layout::Q2g128, Layout::Lora],
    );
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let before = b.launch_count();
    let lp = loader::load(b.as_ref(), &out, &LoadOptions::default()).unwrap();
    let ov = &lp.layers[1];
    assert!(ov.q4k.is_some() && ov.q2.is_some() && ov.lora.is_some());
    let env: HashMap<String, String> = [("METRALE_Q4K_MMQ".to_string(), "1".to_string())].into();
    let levers = ModelLevers::from_map(&env, metrale_pack::gpu::levers::HARDWARE_SM90);
    let cfg = FfnConfig {
        hidden: h,
        inter: i,
    };
    let mut ctx = ForwardContext::new(b.clone(), cfg, 8, levers).unwrap();
    // NVFP4 + q4k_mmq + lora in one layer: finalize_q4k_load and finalize_nvfp4_mmq_load have
    // nothing to build; the Q4_K MMQ prefill and the adapter serve it.
    let mut l = DenseFfnLayer::new(&ctx);
    metrale_pack::loader::LayerOverlays {
        nvfp4: ov.nvfp4,
        q4k: ov.q4k,
        lora: ov.lora,
        ..Default::default()
    }
    .install(&mut l)
    .unwrap();
    assert!(!l.finalize_q4k_load(&mut ctx, h, i, 0).unwrap());
    assert_eq!(
        b.launch_count(),
        before,
        "loading or finalizing launched kernels"
    );
    let x: Vec<f32> = (0..4 * h)
        .map(|t| ((t * 37 % 19) as f32 - 9.0) / 9.0)
        .collect();
    let xp = b.alloc((4 * h * 4) as u64).unwrap();
    upload_f32(b.as_ref(), xp, &x).unwrap();
    let y = download_f32(b.as_ref(), l.forward_prefill(&mut ctx, xp, 4).unwrap()).unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
    assert!(ctx.trace.contains(&"q4k_mmq_gemm") && ctx.trace.contains(&"lora_b_add"));
    // The q2g128 overlay of the same pack serves decode.
    let mut l2 = DenseFfnLayer::new(&ctx);
    metrale_pack::loader::LayerOverlays {
        q2: ov.q2,
        ..Default::default()
    }
    .install(&mut l2)
    .unwrap();
    ctx.trace.clear();
    l2.forward(&mut ctx, xp).unwrap();
    assert_eq!(ctx.trace[0], "q2g128_gemv");
}
