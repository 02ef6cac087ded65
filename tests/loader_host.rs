//! The fast-start loader on the host backend (the device run repeats the same checks on CUDA
//! through `metrale-pack gpu-check`): both copy paths, overlay bytes, no kernel launches,
//! bit-identical outputs of pack-loaded and start-up-built layers; and `Auto` falls back to the
//! staging ring, saying why, when registration is refused.

use metrale_pack::check;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::gpu::GpuBackend;
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::loader::{self, IoMode, LoadOptions};
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions};
use metrale_pack::testing::Rand;
use std::sync::Arc;

#[test]
fn loaded_overlays_equal_the_pack_and_compute_what_start_up_builds() {
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let rows = check::load_checks(
        b,
        192,
        320,
        &[IoMode::Register, IoMode::Staged],
        &mut Rand(3),
    )
    .unwrap();
    // Per copy path: launches, bytes, nvfp4_mmq repack launches, q4k_mmq build launches, the
    // q4k_mmq+lora layer against the host at 3 row counts, 8 arms (q2, fp8, w8a8, bf16, nvfp4,
    // nvfp4_t, nvfp4_mmq, lora) x 5 row counts.
    assert_eq!(rows.len(), 2 * (4 + 3 + 8 * 5));
    for r in &rows {
        assert!(r.pass, "{r:?}");
    }
}

#[test]
fn auto_falls_back_to_staging_when_registration_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &src,
        64,
        128,
        1,
        metrale_pack::GgmlType::F16,
        "llama",
    )
    .unwrap();
    let p = dir.path().join("m.mpk.gguf");
    let opts = ConvertOptions {
        layouts: Some(vec![Layout::Fp8]),
        ..Default::default()
    };
    pack::convert(&Model::open(&src).unwrap(), &opts, &p, &|_, _| {}).unwrap();
    let b = HostBackend::without(&["register_host"]);
    // With few reader threads Auto registers first; refused, it falls back and says why.
    let few = LoadOptions {
        readers: 2,
        ..Default::default()
    };
    let lp = loader::load(&b, &p, &few).unwrap();
    assert_eq!(lp.stats.mode, IoMode::Staged);
    assert!(
        lp.stats
            .fell_back
            .as_deref()
            .is_some_and(|r| r.contains("cuMemHostRegister")),
        "{:?}",
        lp.stats
    );
    let e = loader::load(
        &b,
        &p,
        &LoadOptions {
            io: IoMode::Register,
            ..Default::default()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("m.mpk.gguf") && e.contains("cuMemHostRegister"),
        "{e}"
    );
    assert!(lp.host_view("token_embd.weight").is_some());
    // With enough readers Auto takes the staging ring directly (nothing to fall back from).
    let many = LoadOptions {
        readers: loader::STAGED_MIN_READERS,
        ..Default::default()
    };
    let lp = loader::load(&HostBackend::new(), &p, &many).unwrap();
    assert_eq!(lp.stats.mode, IoMode::Staged);
    assert!(lp.stats.fell_back.is_none());
}

#[test]
fn the_real_smollm2_pack_loads_and_computes_what_start_up_builds() {
    // Converted from the real SmolLM2 GGUF (Q4_1) with nvfp4, nvfp4_t, nvfp4_mmq, fp8, w8a8, bf16 and q2g128; layer 1.
    let src = {
        #[path = "common/mod.rs"]
        mod common;
        common::smollm2_gguf()
    };
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let rows = check::load_checks_from(b, &src, &[IoMode::Register, IoMode::Staged], &mut Rand(9))
        .unwrap();
    assert_eq!(rows.len(), 2 * (4 + 3 + 8 * 5));
    for r in &rows {
        assert!(r.pass, "{r:?}");
        assert_eq!(r.shape, "576x1536");
    }
}

#[test]
fn pieced_registration_and_a_lazily_pinned_ring_copy_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &src,
        128,
        256,
        2,
        metrale_pack::GgmlType::F16,
        "llama",
    )
    .unwrap();
    let p = dir.path().join("m.mpk.gguf");
    let opts = ConvertOptions {
        layouts: Some(vec![Layout::Nvfp4, Layout::Fp8, Layout::Bf16]),
        ..Default::default()
    };
    pack::convert(&Model::open(&src).unwrap(), &opts, &p, &|_, _| {}).unwrap();
    let b = HostBackend::new();
    for o in [
        // Pieces of 16 KiB registered on the helper thread, copies of 12 KiB within them.
        LoadOptions {
            io: IoMode::Register,
            register_chunk: 16 << 10,
            chunk: 12 << 10,
            ..Default::default()
        },
        // A ring larger than the chunk count, buffers pinned on first use by 5 readers.
        LoadOptions {
            io: IoMode::Staged,
            chunk: 20 << 10,
            ring: 1000,
            readers: 5,
            ..Default::default()
        },
    ] {
        let lp = loader::load(&b, &p, &o).unwrap();
        assert_eq!(lp.stats.mode, o.io);
        let mut checked = 0;
        for (i, e) in lp.pack.manifest.tensors.iter().enumerate() {
            if let Some(v) = e.ffn.as_ref().and_then(|_| lp.device_view(&e.name)) {
                let mut got = vec![0u8; v.bytes as usize];
                b.download(v, &mut got).unwrap();
                assert!(got == lp.pack.data(i), "{:?}: {} differs", o.io, e.name);
                checked += 1;
            }
        }
        assert!(checked >= 2 * 3 * 2, "{checked}");
        b.free(lp.arena);
    }
}

#[test]
fn finalize_on_a_pack_with_nvfp4_t_repacks_but_never_frees_the_arena_views() {
    use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
    use metrale_pack::gpu::ModelLevers;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &src,
        128,
        256,
        1,
        metrale_pack::GgmlType::F16,
        "llama",
    )
    .unwrap();
    let p = dir.path().join("m.mpk.gguf");
    let opts = ConvertOptions {
        layouts: Some(vec![Layout::Nvfp4, Layout::Nvfp4T]),
        ..Default::default()
    };
    pack::convert(&Model::open(&src).unwrap(), &opts, &p, &|_, _| {}).unwrap();
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let lp = loader::load(b.as_ref(), &p, &LoadOptions::default()).unwrap();
    let cfg = FfnConfig {
        hidden: 128,
        inter: 256,
    };
    let mut ctx = ForwardContext::new(b.clone(), cfg, 4, ModelLevers::default()).unwrap();
    let mut l = DenseFfnLayer::new(&ctx);
    lp.layers[0].install(&mut l).unwrap();
    assert!(
        l.weights()
            .nvfp4_t
            .iter()
            .all(|t| t.is_some_and(|t| !t.owned()))
    );
    assert!(l.finalize_nvfp4_mmq_load(&mut ctx, 128, 256, 0).unwrap());
    assert!(l.weights().nvfp4_t.iter().all(Option::is_none));
    // Every blob of the arena is still there (the _t views were dropped, not freed).
    for (i, e) in lp.pack.manifest.tensors.iter().enumerate() {
        if let Some(v) = e.ffn.as_ref().and_then(|_| lp.device_view(&e.name)) {
            let mut got = vec![0u8; v.bytes as usize];
            b.download(v, &mut got).unwrap();
            assert!(got == lp.pack.data(i), "{}", e.name);
        }
    }
}

#[test]
fn the_ring_reads_with_o_direct_when_asked_and_says_when_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &src,
        128,
        320,
        2,
        metrale_pack::GgmlType::F16,
        "llama",
    )
    .unwrap();
    let p = dir.path().join("m.mpk.gguf");
    let opts = ConvertOptions {
        layouts: Some(vec![Layout::Nvfp4, Layout::Bf16]),
        ..Default::default()
    };
    pack::convert(&Model::open(&src).unwrap(), &opts, &p, &|_, _| {}).unwrap();
    let b = HostBackend::new();
    // Chunks of 5 O_DIRECT blocks; the segment's last chunk is shorter.
    let o = LoadOptions {
        io: IoMode::Staged,
        direct: Some(true),
        chunk: 20 << 10,
        readers: 3,
        ..Default::default()
    };
    let lp = loader::load(&b, &p, &o).unwrap();
    assert_eq!(lp.stats.mode, IoMode::Staged);
    eprintln!("O_DIRECT load: {:?}", lp.stats);
    // Where the file system refuses O_DIRECT (tmpfs), the ring reads through the cache and says so.
    assert!(
        lp.stats.direct
            || lp
                .stats
                .fell_back
                .as_deref()
                .is_some_and(|r| r.contains("O_DIRECT")),
        "{:?}",
        lp.stats
    );
    let mut checked = 0;
    for (i, e) in lp.pack.manifest.tensors.iter().enumerate() {
        if let Some(v) = e.ffn.as_ref().and_then(|_| lp.device_view(&e.name)) {
            let mut got = vec![0u8; v.bytes as usize];
            b.download(v, &mut got).unwrap();
            assert!(got == lp.pack.data(i), "{} differs", e.name);
            checked += 1;
        }
    }
    assert!(checked > 0);
    // A file just written and read is in the page cache: Auto with few readers registers.
    let _ = std::fs::read(&p).unwrap();
    let few = LoadOptions {
        readers: 2,
        ..Default::default()
    };
    let lp = loader::load(&b, &p, &few).unwrap();
    assert!(
        lp.stats.resident >= loader::COLD_RESIDENCY,
        "{:?}",
        lp.stats
    );
    assert_eq!(lp.stats.mode, IoMode::Register);
    assert!(!lp.stats.direct);
}

#[test]
fn hybrid_registers_the_head_and_stages_the_tail_and_every_byte_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &src,
        128,
        320,
        3,
        metrale_pack::GgmlType::F16,
        "llama",
    )
    .unwrap();
    let p = dir.path().join("m.mpk.gguf");
    let opts = ConvertOptions {
        layouts: Some(vec![Layout::Nvfp4, Layout::Bf16, Layout::Fp8]),
        ..Default::default()
    };
    pack::convert(&Model::open(&src).unwrap(), &opts, &p, &|_, _| {}).unwrap();
    let b = HostBackend::new();
    for fraction in [0.0, 0.3, 1.0] {
        let o = LoadOptions {
            io: IoMode::Hybrid,
            hybrid_fraction: fraction,
            chunk: 16 << 10,
            register_chunk: 32 << 10,
            readers: 3,
            ..Default::default()
        };
        let lp = loader::load(&b, &p, &o).unwrap();
        assert_eq!(lp.stats.mode, IoMode::Hybrid);
        for (i, e) in lp.pack.manifest.tensors.iter().enumerate() {
            if let Some(v) = e.ffn.as_ref().and_then(|_| lp.device_view(&e.name)) {
                let mut got = vec![0u8; v.bytes as usize];
                b.download(v, &mut got).unwrap();
                assert!(
                    got == lp.pack.data(i),
                    "fraction {fraction}: {} differs",
                    e.name
                );
            }
        }
        b.free(lp.arena);
    }
    // Registration refused: the hybrid load fails and names it (no silent half-load).
    let e = loader::load(
        &HostBackend::without(&["register_host"]),
        &p,
        &LoadOptions {
            io: IoMode::Hybrid,
            chunk: 16 << 10,
            ..Default::default()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("cuMemHostRegister"), "{e}");
}
