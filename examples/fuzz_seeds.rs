//! Write the fuzz seeds into `fuzz/seeds/<target>/` (small inputs of every shape the readers
//! accept, so the fuzzer starts inside the formats): `cargo run --release --example fuzz_seeds`.
//! The outputs are deterministic; the pack template doubles as the `manifest` target's pack.

use metrale_pack::GgmlType;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::converters::layouts::q4k_mmq::DownFormat;
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions};
use metrale_pack::testing::{LoraAdapter, Rand};
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let tmp = tempfile::tempdir()?;
    for t in [
        "gguf",
        "safetensors",
        "pack",
        "manifest",
        "loader",
        "npy",
        "convert",
    ] {
        std::fs::create_dir_all(root.join(t))?;
    }
    // GGUF: tiny llama and gemma models in each type gen-model writes.
    for (ty, arch, h, i) in [
        (GgmlType::F16, "llama", 32, 64),
        (GgmlType::Q8_0, "llama", 32, 64),
        (GgmlType::BF16, "gemma", 32, 64),
        (GgmlType::Q4_K, "llama", 256, 256),
    ] {
        let p = root.join(format!("gguf/{arch}-{ty}.gguf"));
        metrale_pack::testing::gen_model::gen_model(&p, h, i, 1, ty, arch)?;
    }
    // Convert: the small GGUF models as sources.
    for name in ["llama-F16", "llama-Q8_0", "gemma-BF16"] {
        std::fs::copy(
            root.join(format!("gguf/{name}.gguf")),
            root.join(format!("convert/{name}.gguf")),
        )?;
    }
    // npy: an f32 matrix and a u8 vector, as ffn-apply reads and dump writes them.
    let mut f = std::fs::File::create(root.join("npy/f32-2x8.npy"))?;
    metrale_pack::npy::write_f32(&mut f, &[2, 8], &[0.5; 16])?;
    let mut f = std::fs::File::create(root.join("npy/u8-5.npy"))?;
    metrale_pack::npy::write_u8(&mut f, &[5], &[1, 2, 3, 4, 5])?;
    // Packs: every layout of one SiLU layer (with a LoRA adapter), and the GELU defaults.
    let src = tmp.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(&src, 64, 128, 1, GgmlType::F16, "llama")?;
    let adapter = tmp.path().join("adapter");
    LoraAdapter::write_peft(&mut Rand(7), &adapter, 1, 64, 128, 4)?;
    let all = ConvertOptions {
        layouts: Some(Layout::ALL.to_vec()),
        q4k_down: DownFormat::Int8,
        lora: Some(adapter),
        ..Default::default()
    };
    let template = root.join("pack/template.gguf");
    pack::convert(&Model::open(&src)?, &all, &template, &|_, _| {})?;
    std::fs::copy(&template, root.join("loader/all-layouts.gguf"))?;
    let q4k = ConvertOptions {
        layouts: Some(vec![Layout::Q4kMmq, Layout::Q2g128]),
        q4k_down: DownFormat::Q4k,
        lora: None,
        ..Default::default()
    };
    pack::convert(
        &Model::open(&src)?,
        &q4k,
        root.join("pack/q4k-down.gguf"),
        &|_, _| {},
    )?;
    let gelu = tmp.path().join("g.gguf");
    metrale_pack::testing::gen_model::gen_model(&gelu, 64, 128, 1, GgmlType::Q8_0, "gemma")?;
    pack::convert(
        &Model::open(&gelu)?,
        &ConvertOptions::default(),
        root.join("loader/gelu-defaults.gguf"),
        &|_, _| {},
    )?;
    // Manifest: the template's own JSON.
    let g = metrale_pack::gguf::GgufFile::open(&template)?;
    let Some(metrale_pack::gguf::Value::String(json)) = g.get(pack::keys::MANIFEST) else {
        anyhow::bail!("template has no manifest");
    };
    std::fs::write(root.join("manifest/template.json"), json.trim_end())?;
    // Safetensors: a BF16 model, compressed-tensors-style FP8 (per-tensor scale) and NVFP4.
    let (h, i) = (32usize, 64usize);
    let mut r = Rand(11);
    let bf16: Vec<u8> = r
        .vec(i * h, 0.5)
        .into_iter()
        .flat_map(|x| half::bf16::from_f32(x).to_le_bytes())
        .collect();
    let fp8: Vec<u8> = (0..i * h).map(|k| (k * 37 % 120) as u8).collect();
    let scale = 0.01f32.to_le_bytes().to_vec();
    let packed: Vec<u8> = (0..i * h / 2).map(|k| (k * 53 % 256) as u8).collect();
    let block_scale: Vec<u8> = (0..i * h / 16).map(|k| 0x30 + (k % 8) as u8).collect();
    let write = |name: &str, views: Vec<(String, TensorView)>| -> anyhow::Result<()> {
        std::fs::write(
            root.join(format!("safetensors/{name}.safetensors")),
            safetensors::serialize(views, None)?,
        )?;
        Ok(())
    };
    let dims = |p: &str| if p == "down" { vec![h, i] } else { vec![i, h] };
    let mut views = Vec::new();
    for p in ["gate", "up", "down"] {
        let v = TensorView::new(Dtype::BF16, dims(p), &bf16)?;
        views.push((format!("model.layers.0.mlp.{p}_proj.weight"), v));
    }
    write("bf16", views)?;
    let mut views = Vec::new();
    for p in ["gate", "up", "down"] {
        let pre = format!("model.layers.0.mlp.{p}_proj");
        views.push((
            format!("{pre}.weight"),
            TensorView::new(Dtype::F8_E4M3, dims(p), &fp8)?,
        ));
        views.push((
            format!("{pre}.weight_scale"),
            TensorView::new(Dtype::F32, vec![1], &scale)?,
        ));
    }
    write("fp8-tensor", views)?;
    let mut views = Vec::new();
    for p in ["gate", "up", "down"] {
        let pre = format!("model.layers.0.mlp.{p}_proj");
        let d = dims(p);
        views.push((
            format!("{pre}.weight_packed"),
            TensorView::new(Dtype::U8, vec![d[0], d[1] / 2], &packed)?,
        ));
        views.push((
            format!("{pre}.weight_scale"),
            TensorView::new(Dtype::F8_E4M3, vec![d[0], d[1] / 16], &block_scale)?,
        ));
        views.push((
            format!("{pre}.weight_global_scale"),
            TensorView::new(Dtype::F32, vec![1], &scale)?,
        ));
    }
    write("nvfp4", views)?;
    println!("wrote seeds under {}", root.display());
    Ok(())
}
