//! The pack's life around conversion: the LoRA layout against the float64 delta, refusals and
//! crash safety of `convert`, `export-segment`, and packs with LoRA, q4k_mmq and q2g128 loaded
//! onto a layer (host backend) with zero repack launches.

mod common;

use common::pack::*;
use common::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions, Pack};
use std::process::Command;

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
    let a = Model::open(ad.join("adapter_model.safetensors")).unwrap();
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
fn export_segment_writes_every_device_tensor_byte_for_byte() {
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
        .filter(|&i| p.manifest.tensors[i].device)
        .collect();
    // The FFN blobs and the passthrough tensors (attention, norms, embedding, head) alike.
    assert!(blobs.iter().any(|&i| p.manifest.tensors[i].ffn.is_none()));
    assert_eq!(f.tensors.len(), blobs.len());
    for i in blobs {
        let name = &p.manifest.tensors[i].name;
        let j = f.tensors.iter().position(|t| &t.name == name).unwrap();
        assert!(f.tensor_data(j) == p.data(i), "{name}");
    }
}

#[test]
fn a_pack_with_lora_loads_and_the_layer_adds_the_adapter() {
    use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
    use metrale_pack::gpu::host::HostBackend;
    use metrale_pack::gpu::reference::ActRound;
    use metrale_pack::gpu::{GpuBackend, ModelLevers, download_f32, upload_f32};
    use metrale_pack::loader::{self, LoadOptions};
    use metrale_pack::testing::{
        DenseWeights, ffn_f64_parts, ffn_f64_with, nvfp4_decoded, rel_err,
    };
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
    ctx.tracing = true;
    let mut l = DenseFfnLayer::new(&ctx);
    assert!(lp.layers[1].overlays.holds(Layout::Lora));
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
    let delta = |name: &str| -> Vec<f32> { p.decode_ffn(name).unwrap().0 };
    let adapter = DenseWeights {
        gate: delta("blk.1.ffn_gate.lora"),
        up: delta("blk.1.ffn_up.lora"),
        down: delta("blk.1.ffn_down.lora"),
        hidden: h,
        inter: i,
    };
    let x: Vec<f32> = (0..h).map(|t| ((t * 37 % 17) as f32 - 8.0) / 8.0).collect();
    let xp = b.alloc((h * 4) as u64).unwrap();
    upload_f32(b.as_ref(), xp, &x).unwrap();
    let y = download_f32(b.as_ref(), l.forward(&mut ctx, xp).unwrap()).unwrap();
    // The decode GEMVs round their inputs to bf16; the adapter's products read them in f32.
    let (silu, bf16) = (metrale_pack::model::Activation::Silu, ActRound::Bf16);
    let e = rel_err(&y, &ffn_f64_parts(&x, 1, &wd, Some(&adapter), silu, bf16));
    assert!(e < 1e-5, "{e}");
    assert!(ctx.trace.contains(&"lora_b_add"));
    assert!(rel_err(&y, &ffn_f64_with(&x, 1, &wd, silu, bf16)) > 1e-4);
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
    assert!(
        [Layout::Q4kMmq, Layout::Q2g128, Layout::Lora]
            .iter()
            .all(|&l| ov.overlays.holds(l))
    );
    let env: HashMap<String, String> = [("METRALE_Q4K_MMQ".to_string(), "1".to_string())].into();
    let levers = ModelLevers::from_map(&env, metrale_pack::gpu::levers::HARDWARE_SM90);
    let cfg = FfnConfig {
        hidden: h,
        inter: i,
    };
    let mut ctx = ForwardContext::new(b.clone(), cfg, 8, levers).unwrap();
    ctx.tracing = true;
    // NVFP4 + q4k_mmq + lora in one layer: finalize_q4k_load and finalize_nvfp4_mmq_load have
    // nothing to build; the Q4_K MMQ prefill and the adapter serve it.
    let mut l = DenseFfnLayer::new(&ctx);
    ov.only(&[Layout::Nvfp4, Layout::Q4kMmq, Layout::Lora])
        .install(&mut l)
        .unwrap();
    assert!(!l.finalize_q4k_load(&mut ctx, h, i, 0).unwrap());
    // No repack: the only launches are the load's blob-rule checks, one a checked part.
    let rules = lp.pack.element_rules().unwrap().len() as u64;
    assert!(rules > 0);
    assert_eq!(
        b.launch_count(),
        before + rules,
        "loading or finalizing launched kernels beside the blob rules' {rules}"
    );
    let x: Vec<f32> = (0..4 * h)
        .map(|t| ((t * 37 % 19) as f32 - 9.0) / 9.0)
        .collect();
    let xp = b.alloc((4 * h * 4) as u64).unwrap();
    upload_f32(b.as_ref(), xp, &x).unwrap();
    let y = download_f32(b.as_ref(), l.forward_prefill(&mut ctx, xp, 4).unwrap()).unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
    assert!(ctx.trace.contains(&"q4k_wgmma") && ctx.trace.contains(&"lora_b_add"));
    // The q2g128 overlay of the same pack serves decode.
    let mut l2 = DenseFfnLayer::new(&ctx);
    ov.only(&[Layout::Q2g128]).install(&mut l2).unwrap();
    ctx.trace.clear();
    l2.forward(&mut ctx, xp).unwrap();
    assert_eq!(ctx.trace[0], "q2g128_gemv");
}
