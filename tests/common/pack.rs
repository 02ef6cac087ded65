//! Helpers of the pack tests (tests/pack_roundtrip.rs, tests/pack_lifecycle.rs): converting,
//! the layouts' CPU references and tolerances, generated GGUF and safetensors models, a PEFT
//! adapter, and the CLI.
#![allow(dead_code)]

use super::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::bf16;
use metrale_pack::converters::layouts::{self, Layout, Proj, q4k_mmq::DownFormat};
use metrale_pack::gguf::Value;
use metrale_pack::gguf_write::build;
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions, Pack};
use safetensors::tensor::{Dtype, TensorView};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every layout but lora (which needs an adapter).
pub fn all_but_lora() -> Vec<Layout> {
    Layout::ALL
        .into_iter()
        .filter(|&l| l != Layout::Lora)
        .collect()
}

pub fn no_progress(_: u64, _: u64) {}

pub fn convert(src: &Path, out: &Path, opts: &ConvertOptions) -> pack::Manifest {
    let m = Model::open(src).unwrap();
    pack::convert(&m, opts, out, &no_progress).unwrap()
}

/// A generated llama-shaped F16 model of `layers` FFN layers of `[hidden, inter]` in `dir`,
/// converted with `layouts` (the defaults when `None`): (the source, the pack).
pub fn generated_pack(
    dir: &Path,
    hidden: usize,
    inter: usize,
    layers: usize,
    layouts: Option<Vec<Layout>>,
) -> (PathBuf, PathBuf) {
    let src = dir.join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &src,
        hidden,
        inter,
        layers,
        GgmlType::F16,
        "llama",
    )
    .unwrap();
    let p = dir.join("m.mpk.gguf");
    let opts = ConvertOptions {
        layouts,
        ..Default::default()
    };
    convert(&src, &p, &opts);
    (src, p)
}

pub fn opts(layouts: &[Layout]) -> ConvertOptions {
    ConvertOptions {
        layouts: Some(layouts.to_vec()),
        ..Default::default()
    }
}

/// ‖y − x‖ / ‖x‖ in float64.
pub fn rel(y: &[f32], x: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in y.iter().zip(x) {
        num += (*a as f64 - *b as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

/// Normwise error bound of each layout against the source weights (float64 reference).
pub fn tolerance(l: Layout) -> f64 {
    match l {
        Layout::Nvfp4 | Layout::Nvfp4T | Layout::Nvfp4Mmq => 0.16, // E2M1 x E4M3, 16-element blocks
        Layout::Fp8 | Layout::W8a8 => 0.05,                        // 3 mantissa bits
        Layout::Bf16 => 0.004,                                     // 8 bits
        Layout::Q4kMmq => 0.12, // 4-bit with 6-bit scales (int8 down is finer)
        Layout::Q2g128 => 0.75, // 2-bit symmetric, 128 groups
        Layout::Affine => 0.01, // from floats: ggml's Q8_0, groups of 32
        Layout::Ggml => 0.01,   // from floats: ggml's Q8_0
        Layout::Lora | Layout::Custom(_) => 0.0,
    }
}

/// The CPU reference of a layout: decode(encode(source f32)) through the layout functions,
/// independent of the pack container.
pub fn reference(
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
        Layout::Affine => layouts::affine::encode(x, n, k).unwrap(),
        Layout::Ggml => layouts::ggml::encode(x, n, k),
        Layout::Lora | Layout::Custom(_) => unreachable!(),
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
        Layout::Affine => {
            layouts::affine::decode(p(0), p(1), layouts::affine::Scheme::ggml(8), [n, k], kp)
        }
        Layout::Ggml => {
            layouts::ggml::decode(metrale_pack::GgmlType::Q8_0, p(0), [n, k, kp], 1.0).unwrap()
        }
        Layout::Lora | Layout::Custom(_) => unreachable!(),
    }
}

/// Every layout of the listed layers against the reference (bit for bit) and the source
/// (within tolerance).
pub fn check_layouts(src: &Path, pack_path: &Path, layers: &[usize], q4k_down: DownFormat) {
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
                let w = [&l.gate, &l.up, &l.down][match pj {
                    Proj::Gate => 0,
                    Proj::Up => 1,
                    _ => 2,
                }];
                // `ggml` carries the engine's GGUF types byte for byte: the source's decode.
                let ggml_carried = layout == Layout::Ggml
                    && matches!(m.tensors[w.main()].dtype,
                        metrale_pack::model::DType::Ggml(t) if layouts::ggml::TYPES.contains(&t));
                let carried = ggml_carried
                    || matches!(
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
                // GGUF Q4_0/Q4_1/Q8_0 carried by `affine`: the source values, but for a zero's
                // sign (formats.md).
                let unsigned = |v: &[f32]| -> Vec<f32> {
                    v.iter().map(|&a| if a == 0.0 { 0.0 } else { a }).collect()
                };
                let carried_int = layout == Layout::Affine
                    && matches!(
                        m.tensors[w.main()].dtype,
                        metrale_pack::model::DType::Ggml(
                            metrale_pack::GgmlType::Q4_0
                                | metrale_pack::GgmlType::Q4_1
                                | metrale_pack::GgmlType::Q8_0
                        )
                    );
                let (y, r) = if carried_int {
                    (unsigned(&y), unsigned(x))
                } else {
                    (y, Vec::new())
                };
                let r = if carried_int {
                    r
                } else if carried {
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

pub fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

/// `convert SRC -o OUT EXTRA...` as CLI arguments.
pub fn convert_args<'a>(src: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "convert",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    a.extend(extra);
    a
}

/// The CLI's stderr, as text.
pub fn err(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// `convert SRC -o OUT EXTRA...` then `verify OUT --source SRC`, both succeeding; the pack.
pub fn convert_and_verify(src: &Path, out: &Path, extra: &[&str]) -> pack::Pack {
    let mut args = vec![
        "convert",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    let o = cli(&args);
    assert!(o.status.success(), "{extra:?}: {}", err(&o));
    let o = cli(&[
        "verify",
        out.to_str().unwrap(),
        "--source",
        src.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{extra:?}: {}", err(&o));
    pack::Pack::open(out).unwrap()
}

/// The file names in `dir`, sorted.
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

// ---- generated models ----

#[allow(clippy::too_many_arguments)]
pub fn gguf_model(
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
                GgmlType::Q2_K => metrale_pack::converters::encode_to_vec::<
                    metrale_pack::converters::q2_k::Q2K,
                >(&x),
                // Random blocks with a small finite scale (no Q5_0 encoder here; llama-quantize's
                // fallback type for rows not a multiple of 256).
                GgmlType::Q5_0 => (0..n * k / 32)
                    .flat_map(|_| {
                        let mut b = metrale_pack::converters::f16::encode(&[0.01]);
                        b.extend(rng.bytes(20));
                        b
                    })
                    .collect(),
                // Random super-blocks (hmask, qs, scales) with a small finite d: no Q3_K
                // encoder here.
                GgmlType::Q3_K => (0..n * k / 256)
                    .flat_map(|_| {
                        let mut b = rng.bytes(108);
                        b.extend(metrale_pack::converters::f16::encode(&[0.01]));
                        b
                    })
                    .collect(),
                // Random grid indices and signs after a small finite d: no IQ2_XXS encoder here.
                GgmlType::IQ2_XXS => (0..n * k / 256)
                    .flat_map(|_| {
                        let mut b = metrale_pack::converters::f16::encode(&[0.01]);
                        b.extend(rng.bytes(ty.block_bytes() as usize - 2));
                        b
                    })
                    .collect(),
                // Random UE4M3 scales and E2M1 codes (every byte decodes finite).
                GgmlType::NVFP4 => rng.bytes(n * k / 64 * 36),
                // A small finite d and s, random codes: a type no layout keeps.
                GgmlType::Q8_1 => (0..n * k / 32)
                    .flat_map(|_| {
                        let mut b = metrale_pack::converters::f16::encode(&[0.01, 0.5]);
                        b.extend(rng.bytes(32));
                        b
                    })
                    .collect(),
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

pub fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn save_st(path: &Path, ts: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = ts
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

pub fn lora_adapter(
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

/// A 2-layer F32 llama GGUF of `[h, i]` FFNs with a rank-4 PEFT adapter, converted with
/// `layouts` (which include `lora`): (the temp dir, the source, the pack).
pub fn with_lora_pack(
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

/// `img` with the first `from` replaced by `to` (the same length) and the header checksum
/// recomputed: a hostile manifest that passes the checksum.
pub fn edited_manifest(img: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(
        from.len(),
        to.len(),
        "same-length edits keep the header's layout"
    );
    let at = img
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(from)));
    let mut out = img.to_vec();
    out[at..at + from.len()].copy_from_slice(to);
    assert!(metrale_pack::fuzzing::rehash(&mut out));
    out
}

/// Open the checkpoint `dir`, convert it with the default layouts into a `--tp TP` pack in
/// `tmp`, check the pack holds exactly `layouts` and verify it against the source; returns the
/// model and the pack.
pub fn convert_tp_verified(dir: &Path, tmp: &Path, tp: u32, layouts: &[&str]) -> (Model, Pack) {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let m = Model::open(dir).unwrap();
    let out = tmp.join(format!("{name}.tp{tp}.mpk.gguf"));
    let opts = ConvertOptions {
        tp,
        ..Default::default()
    };
    pack::convert(&m, &opts, &out, &|_, _| {}).unwrap();
    let p = Pack::open(&out).unwrap();
    assert_eq!(p.manifest.layouts, layouts, "{name}");
    let c = pack::verify_against_source(&p, &m).unwrap();
    assert!(c.mismatched.is_empty(), "{name}: {:?}", c.mismatched);
    (m, p)
}
