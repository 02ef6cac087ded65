//! The fast-start loader on the host backend (the device run repeats the same checks on CUDA
//! through `metrale-pack gpu-check`): both copy paths, overlay bytes, no kernel launches,
//! bit-identical outputs of pack-loaded and start-up-built layers; and `Auto` falls back to the
//! staging ring, saying why, when registration is refused.

mod common;

use metrale_pack::check;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::ffn::key;
use metrale_pack::gpu::GpuBackend;
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::loader::{self, IoMode, LoadOptions};
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions};
use metrale_pack::testing::Rand;
use std::sync::Arc;

use common::pack::generated_pack;

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
    let (_, p) = generated_pack(dir.path(), 64, 128, 1, Some(vec![Layout::Fp8]));
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
    // With enough readers Auto registers a small warm segment, and takes the staging ring
    // directly (nothing to fall back from) for one at or above the threshold.
    let many = LoadOptions {
        readers: loader::STAGED_MIN_READERS,
        ..Default::default()
    };
    let lp = loader::load(&HostBackend::new(), &p, &many).unwrap();
    assert!(lp.stats.bytes < loader::AUTO_REGISTER_BELOW);
    assert_eq!(lp.stats.mode, IoMode::Register);
    let large = LoadOptions {
        auto_register_below: lp.stats.bytes,
        ..many
    };
    let lp = loader::load(&HostBackend::new(), &p, &large).unwrap();
    assert_eq!(lp.stats.mode, IoMode::Staged);
    assert!(lp.stats.fell_back.is_none());
}

#[test]
fn the_real_smollm2_pack_loads_and_computes_what_start_up_builds() {
    // Converted from the real SmolLM2 GGUF (Q4_1) with nvfp4, nvfp4_t, nvfp4_mmq, fp8, w8a8, bf16 and q2g128; layer 1.
    let src = common::smollm2_gguf();
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let rows = check::load_checks_from(b, &src, &[IoMode::Register, IoMode::Staged], &mut Rand(9))
        .unwrap();
    assert_eq!(rows.len(), 2 * (4 + 3 + 8 * 5));
    for r in &rows {
        assert!(r.pass, "{r:?}");
        assert_eq!(r.shape, "576x1536");
    }
}

/// A generated 2-layer pack (128 x 256) in the `nvfp4`, `fp8` and `bf16` layouts.
fn three_layout_pack(dir: &std::path::Path) -> std::path::PathBuf {
    let layouts = vec![Layout::Nvfp4, Layout::Fp8, Layout::Bf16];
    generated_pack(dir, 128, 256, 2, Some(layouts)).1
}

/// Every tensor of the pack is on the device, byte for byte (`what` names the case).
fn every_tensor_arrived(b: &HostBackend, lp: &loader::LoadedPack, what: &str) {
    let mut checked = 0;
    for t in lp.device_tensors() {
        let mut got = vec![0u8; t.ptr.bytes as usize];
        b.download(t.ptr, &mut got).unwrap();
        let i = lp.pack.index(t.name).unwrap();
        assert!(got == lp.pack.data(i), "{what}: {} differs", t.name);
        checked += 1;
    }
    assert_eq!(checked, lp.pack.manifest.tensors.len(), "{what}");
}

#[test]
fn pieced_registration_and_a_lazily_pinned_ring_copy_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let p = three_layout_pack(dir.path());
    let b = HostBackend::new();
    for o in [
        // Pieces of 16 KiB registered on the helper thread, copies of 12 KiB within them.
        LoadOptions {
            io: IoMode::Register,
            register_chunk: 16 << 10,
            chunk: 12 << 10,
            ..Default::default()
        },
        // The same pieces registered by 4 threads at once, copies issued as each completes.
        LoadOptions {
            io: IoMode::Register,
            register_chunk: 16 << 10,
            register_threads: 4,
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
        // Pageable copies straight from the mapping.
        LoadOptions {
            io: IoMode::Pageable,
            chunk: 20 << 10,
            ..Default::default()
        },
    ]
    .into_iter()
    .flat_map(|o| {
        // Each also with the arena backed in 128 KiB pieces on the mapping thread while it
        // copies (the host backend refuses any copy into a piece not yet mapped).
        let mapped = LoadOptions {
            map_piece: 128 << 10,
            ..o.clone()
        };
        [o, mapped]
    })
    .chain([LoadOptions {
        io: IoMode::Hybrid,
        hybrid_fraction: 0.5,
        chunk: 12 << 10,
        map_piece: 64 << 10,
        ..Default::default()
    }]) {
        let lp = loader::load(&b, &p, &o).unwrap();
        assert_eq!(lp.stats.mode, o.io);
        every_tensor_arrived(&b, &lp, &format!("{:?}", o.io));
        b.free(lp.arena);
    }
}

#[test]
fn the_ring_pins_in_pieces_keeps_its_buffers_and_the_next_load_reuses_them() {
    use metrale_pack::loader::Staging;
    let dir = tempfile::tempdir().unwrap();
    let p = three_layout_pack(dir.path());
    let b = HostBackend::new();
    let check = |lp: &loader::LoadedPack| every_tensor_arrived(&b, lp, "ring");
    // 12 KiB buffers pinned two at a time (24 KiB pieces), a ring of 7: four pieces.
    let o = LoadOptions {
        io: IoMode::Staged,
        chunk: 12 << 10,
        ring: 7,
        ring_piece: 24 << 10,
        readers: 3,
        ..Default::default()
    };
    let chunk = 12 << 10;
    // How many buffers a load pins depends on timing (the pinning thread stops once every
    // chunk is claimed and no reader waits), so the checks are bounds, never exact counts.
    let ring_of = |o: &LoadOptions| {
        let lp = loader::load(&b, &p, o).unwrap();
        check(&lp);
        let r = lp.stats.ring.unwrap();
        assert!(
            r.first_buffer <= r.ring_ready && r.drained <= r.released,
            "{r:?}"
        );
        assert!(r.kept + r.pinned <= o.ring.max(r.kept), "{r:?}");
        b.free(lp.arena);
        (lp.stats.bytes as usize, r.kept, r.pinned)
    };
    let (bytes, kept, pinned) = ring_of(&o);
    assert!(
        bytes.div_ceil(chunk) > 7,
        "the pack must need more chunks than buffers"
    );
    assert!(kept == 0 && (1..=7).contains(&pinned), "{kept} {pinned}");
    // The next loads take every kept buffer and pin at most the rest of the ring.
    let mut pool = pinned;
    for ring in [7, 9, 9] {
        let (_, kept, pinned) = ring_of(&LoadOptions { ring, ..o.clone() });
        assert_eq!(kept, pool, "ring {ring}");
        assert!(pinned <= ring.saturating_sub(kept), "ring {ring}: {pinned}");
        pool = kept + pinned;
    }
    // Fresh staging neither takes nor keeps: the pool is unchanged.
    let fresh = LoadOptions {
        staging: Staging::Fresh,
        ..o.clone()
    };
    let (_, kept, pinned) = ring_of(&fresh);
    assert!(kept == 0 && pinned >= 1);
    assert_eq!(ring_of(&o).1, pool);
    // Buffers of another size are not taken (the kept ones are released when replaced).
    let other = LoadOptions {
        chunk: 16 << 10,
        ..o.clone()
    };
    assert_eq!(ring_of(&other).1, 0);
    // Auto on a small warm segment: registered while no ring buffers are kept, the ring once a
    // load kept buffers of its size.
    let auto = |chunk: usize| LoadOptions {
        io: IoMode::Auto,
        chunk,
        readers: loader::STAGED_MIN_READERS,
        ..o.clone()
    };
    let fresh = HostBackend::new();
    for (backend, chunk, mode) in [
        (&fresh, 12 << 10, IoMode::Register),
        (&b, 12 << 10, IoMode::Register),
        (&b, 16 << 10, IoMode::Staged),
    ] {
        let lp = loader::load(backend, &p, &auto(chunk)).unwrap();
        assert_eq!(lp.stats.mode, mode, "chunk {chunk}");
        backend.free(lp.arena);
    }
}

#[test]
fn finalize_on_a_pack_with_nvfp4_t_repacks_but_never_frees_the_arena_views() {
    use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
    use metrale_pack::gpu::ModelLevers;
    let dir = tempfile::tempdir().unwrap();
    let (_, p) = generated_pack(
        dir.path(),
        128,
        256,
        1,
        Some(vec![Layout::Nvfp4, Layout::Nvfp4T]),
    );
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
        l.get(key::NVFP4_T)
            .unwrap()
            .iter()
            .all(|t| t.is_some_and(|t| !t.owned()))
    );
    assert!(l.finalize_nvfp4_mmq_load(&mut ctx, 128, 256, 0).unwrap());
    assert!(l.get(key::NVFP4_T).is_none(), "every _t view dropped");
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
    let (_, p) = generated_pack(
        dir.path(),
        128,
        320,
        2,
        Some(vec![Layout::Nvfp4, Layout::Bf16]),
    );
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
    let (_, p) = generated_pack(
        dir.path(),
        128,
        320,
        3,
        Some(vec![Layout::Nvfp4, Layout::Bf16, Layout::Fp8]),
    );
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

/// A whole model in one copy: every device tensor (FFN blobs, attention, norms, embedding, output
/// head) equals the pack's bytes on the device, every passthrough tensor also the source's, with
/// its stored type and shape; the segment is in layer order. Generated SiLU and GELU models and
/// the real SmolLM2.
#[test]
fn whole_model_device_tensors_equal_the_pack_and_the_source() {
    use metrale_pack::pack::layer_of;
    use metrale_pack::testing::gen_model::{Whole, gen_model_with};
    let dir = tempfile::tempdir().unwrap();
    let mut sources = Vec::new();
    for (arch, ty) in [
        ("llama", metrale_pack::GgmlType::F16),
        ("gemma", metrale_pack::GgmlType::BF16),
    ] {
        let src = dir.path().join(format!("{arch}.gguf"));
        let whole = Whole {
            vocab: 300,
            kv_dim: 32,
            head_dim: 16,
        };
        gen_model_with(&src, 64, 160, 3, ty, arch, Some(whole)).unwrap();
        sources.push(src);
    }
    sources.push(common::smollm2_gguf());
    for src in &sources {
        let model = Model::open(src).unwrap();
        let p = dir.path().join("whole.mpk.gguf");
        pack::convert(&model, &ConvertOptions::default(), &p, &|_, _| {}).unwrap();
        let b = HostBackend::new();
        let opts = LoadOptions {
            io: IoMode::Register,
            ..Default::default()
        };
        let lp = loader::load(&b, &p, &opts).unwrap();
        let pk = &lp.pack;
        let plan = pack::Plan::new(&model, &ConvertOptions::default()).unwrap();
        let (mut passthrough, mut blobs) = (0, 0);
        for t in lp.device_tensors() {
            let i = pk.index(t.name).unwrap();
            let mut got = vec![0u8; t.ptr.bytes as usize];
            b.download(t.ptr, &mut got).unwrap();
            assert!(got == pk.data(i), "{}: device != pack", t.name);
            if pk.manifest.tensors[i].ffn.is_some() {
                blobs += 1;
                continue;
            }
            passthrough += 1;
            let s = model.index_of(t.name).unwrap();
            assert!(got == model.data(s), "{}: device != source", t.name);
            assert_eq!(t.shape, model.tensors[s].shape, "{}", t.name);
            assert_eq!(t.source_type, model.tensors[s].dtype.name(), "{}", t.name);
        }
        // Every source tensor the FFN layouts do not consume is on the device, and every blob.
        assert_eq!(passthrough, model.tensors.len() - plan.ffn_sources().len());
        let n_blobs = pk
            .manifest
            .tensors
            .iter()
            .filter(|e| e.ffn.is_some())
            .count();
        assert_eq!(blobs, n_blobs);
        assert!(lp.device_view("token_embd.weight").is_some());
        // Layer order: the layers never go back; tensors of no layer only before the first
        // layer (the embedding) or after the last (output norm and head).
        let layer = |name: &str| {
            let i = pk.index(name).unwrap();
            pk.manifest.tensors[i]
                .ffn
                .as_ref()
                .map(|f| f.layer)
                .or_else(|| layer_of(name))
        };
        let seq: Vec<Option<usize>> = lp.device_tensors().map(|t| layer(t.name)).collect();
        let numbered: Vec<usize> = seq.iter().flatten().copied().collect();
        assert!(numbered.windows(2).all(|w| w[0] <= w[1]), "{seq:?}");
        let first = seq.iter().position(Option::is_some).unwrap();
        let last = seq.iter().rposition(Option::is_some).unwrap();
        assert!(seq[first..=last].iter().all(Option::is_some), "{seq:?}");
        assert_eq!(lp.stats.bytes, pk.manifest.segment_bytes);
    }
}

/// `--host-tensors` keeps exactly the named tensors out of the segment (before it in the file,
/// not on the device, still readable on the host), and a pattern that names no passthrough
/// tensor is refused.
#[test]
fn host_tensors_keep_exactly_the_named_tensors_off_the_device() {
    use metrale_pack::testing::gen_model::{Whole, gen_model_with};
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    let whole = Whole {
        vocab: 300,
        kv_dim: 32,
        head_dim: 16,
    };
    gen_model_with(
        &src,
        64,
        128,
        2,
        metrale_pack::GgmlType::F16,
        "llama",
        Some(whole),
    )
    .unwrap();
    let model = Model::open(&src).unwrap();
    let p = dir.path().join("m.mpk.gguf");
    let host = vec!["token_embd.weight".to_string(), "blk.?.attn_norm*".into()];
    let opts = ConvertOptions {
        host_tensors: host.clone(),
        ..Default::default()
    };
    pack::convert(&model, &opts, &p, &|_, _| {}).unwrap();
    let b = HostBackend::new();
    let lp = loader::load(&b, &p, &LoadOptions::default()).unwrap();
    let named = [
        "token_embd.weight",
        "blk.0.attn_norm.weight",
        "blk.1.attn_norm.weight",
    ];
    for (e, t) in lp.pack.manifest.tensors.iter().zip(&lp.pack.file.tensors) {
        let want_host = named.contains(&e.name.as_str());
        assert_eq!(e.device, !want_host, "{}", e.name);
        assert_eq!(
            lp.device_tensor(&e.name).is_some(),
            !want_host,
            "{}",
            e.name
        );
        if want_host {
            assert!(t.offset < lp.pack.manifest.segment_offset, "{}", e.name);
            let s = model.index_of(&e.name).unwrap();
            assert!(lp.host_view(&e.name).unwrap() == model.data(s));
        }
    }
    assert_eq!(lp.pack.manifest.options.host_tensors, host);
    // A pattern that names nothing (here an FFN weight, which is always repacked) is refused.
    let bad = ConvertOptions {
        host_tensors: vec!["blk.0.ffn_gate.weight".into()],
        ..Default::default()
    };
    let e = pack::convert(&model, &bad, dir.path().join("x.mpk.gguf"), &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("--host-tensors blk.0.ffn_gate.weight"), "{e}");
}

/// `gpu-check --load-source` on a GELU model converts with the layouts a GELU layer takes and
/// checks them (it converted with nvfp4_mmq before, which a GELU layer refuses).
#[test]
fn load_checks_from_a_gelu_model_pass() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("g.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &src,
        192,
        320,
        2,
        metrale_pack::GgmlType::F16,
        "gemma",
    )
    .unwrap();
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let rows = check::load_checks_from(b, &src, &[IoMode::Staged], &mut Rand(4)).unwrap();
    // launches, bytes, the q4k_mmq layer at 3 row counts, 6 arms (q2 at 3 row counts, fp8,
    // bf16, nvfp4, nvfp4_t, w8a8 at 5).
    assert_eq!(rows.len(), 2 + 1 + 3 + 3 + 5 * 5, "{rows:#?}");
    for r in &rows {
        assert!(r.pass, "{r:?}");
    }
}

/// `bench-load --probe`'s measurements run end to end (on the host backend: every rate finite
/// and positive, every registration undone).
#[test]
fn the_io_probes_run_and_report_every_rate() {
    let dir = tempfile::tempdir().unwrap();
    let (_, p) = generated_pack(dir.path(), 128, 256, 2, None);
    let b = HostBackend::new();
    let probes = check::probe_io::probe(&b, &p).unwrap();
    assert!(probes.len() >= 17, "{probes:#?}");
    for pr in &probes {
        assert!(pr.gbs.is_finite() && pr.gbs > 0.0, "{pr:?}");
    }
}

/// A reserved arena refuses copies into pieces not yet mapped (the host backend stands in for
/// the device's page tables), so the loader's ordering of mapping before copying is tested.
#[test]
fn a_reserved_arena_refuses_copies_before_its_pieces_are_mapped() {
    use metrale_pack::gpu::host::HOST_MAP_GRANULE;
    let b = HostBackend::new();
    let p = b.reserve(4 * HOST_MAP_GRANULE).unwrap();
    let data = vec![7u8; HOST_MAP_GRANULE as usize];
    assert!(b.upload(p.view(0, HOST_MAP_GRANULE), &data).is_err());
    b.map_range(p, 0, HOST_MAP_GRANULE).unwrap();
    b.upload(p.view(0, HOST_MAP_GRANULE), &data).unwrap();
    let second = p.view(HOST_MAP_GRANULE, HOST_MAP_GRANULE);
    assert!(b.upload(second, &data).is_err());
    assert!(b.map_range(p, 1, 1).is_err());
    b.free(p);
}

/// `check-activations` on the host backend: every arm the pack holds, on "recorded" activations
/// (here rows with an outlier channel, written as layerN.npy) and on random rows of the same
/// norms, each against the float64 FFN of the source weights, decode and prefill.
#[test]
fn activation_checks_run_every_arm_on_recorded_inputs() {
    use metrale_pack::check::activations::activation_checks;
    let dir = tempfile::tempdir().unwrap();
    let (src, p) = generated_pack(dir.path(), 128, 256, 2, Some(common::pack::all_but_lora()));
    let acts = dir.path().join("acts");
    std::fs::create_dir_all(&acts).unwrap();
    let mut r = Rand(11);
    // More rows than the decode part takes (32) and than the W8A8 arm serves per call (64).
    let rows = 80;
    let mut x = r.vec(rows * 128, 1.0);
    for row in 0..rows {
        x[row * 128 + 5] *= 40.0; // an outlier channel, as real activations have
    }
    let mut f = std::fs::File::create(acts.join("layer1.npy")).unwrap();
    metrale_pack::npy::write_f32(&mut f, &[rows, 128], &x).unwrap();
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let t = activation_checks(b, &p, &src, &acts, &[], 128, &mut Rand(3)).unwrap();
    // 14 arms (bf16, fp8, w8a8 and its fixed path, nvfp4 with its SiLU-fused down and its fixed
    // path, nvfp4_t, nvfp4_mmq, q4k_mmq beside nvfp4, q2g128, affine, q4k_mmq alone, ggml),
    // decode and prefill, on the one recorded layer.
    assert_eq!(t.len(), 28, "{t:#?}");
    assert!(t.iter().any(|r| r.arm == "ggml" && r.m == rows));
    assert!(t.iter().any(|r| r.arm == "affine" && r.m == rows));
    assert!(t.iter().any(|r| r.arm == "nvfp4 silu fused down"));
    assert!(t.iter().any(|r| r.arm == "q4k" && r.m == 1));
    for row in &t {
        assert_eq!(row.layer, 1);
        assert_eq!(row.refused, None, "{row:?}");
        assert!(row.real.is_finite() && row.random.is_finite(), "{row:?}");
        let bound = match row.arm.as_str() {
            "bf16" => 0.01,
            "affine" => 0.05, // 8-bit groups of 32 from the F16 source
            "q2g128" => 1.0,
            _ => 0.5,
        };
        assert!(row.real < bound && row.random < bound, "{row:?}");
    }
    assert!(t.iter().any(|r| r.m == rows) && t.iter().any(|r| r.m == 1));
    assert!(t.iter().any(|r| r.arm == "w8a8" && r.m == 64));
    // One arm's outputs for a model run (`ffn-apply`): the fixed W4A4 path over the recorded
    // rows, close to the float64 FFN; an unknown arm or layer is refused by name.
    use metrale_pack::check::activations::apply_arm;
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let y = apply_arm(b.clone(), &p, 1, "nvfp4 fixed (W4A4)", &x).unwrap();
    assert_eq!(y.len(), x.len());
    let m = Model::open(&src).unwrap();
    let l = &m.ffn_layers[1];
    let w = metrale_pack::testing::DenseWeights {
        gate: m.decode_weight(&l.gate).unwrap().0,
        up: m.decode_weight(&l.up).unwrap().0,
        down: m.decode_weight(&l.down).unwrap().0,
        hidden: 128,
        inter: 256,
    };
    let want = metrale_pack::testing::ffn_f64(&x, rows, &w, metrale_pack::model::Activation::Silu);
    let e = metrale_pack::testing::rel_err(&y, &want);
    assert!(e < 0.5, "{e}");
    let e = apply_arm(b.clone(), &p, 1, "no such arm", &x)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no such arm"), "{e}");
    assert!(apply_arm(b, &p, 7, "nvfp4", &x).is_err());
}

#[test]
fn buffers_pinned_before_the_first_load_are_its_whole_ring() {
    use metrale_pack::gpu::staging::Populated;
    // What a CUDA backend does when it opens: memory populated beforehand, registered and cut
    // into the default ring's buffers, kept in the pool; the first load pins nothing.
    let dir = tempfile::tempdir().unwrap();
    let p = three_layout_pack(dir.path());
    let b = HostBackend::new();
    let (chunk, ring) = (12usize << 10, 5usize);
    let mem = Populated::new(ring * chunk).unwrap();
    b.staging_pool()
        .unwrap()
        .keep_populated(&b, mem, chunk)
        .unwrap();
    let o = LoadOptions {
        io: IoMode::Staged,
        chunk,
        ring,
        readers: 3,
        ..Default::default()
    };
    let lp = loader::load(&b, &p, &o).unwrap();
    every_tensor_arrived(&b, &lp, "pre-pinned ring");
    let r = lp.stats.ring.unwrap();
    assert!(
        lp.stats.bytes as usize > ring * chunk,
        "the pack must need more chunks than buffers"
    );
    assert_eq!((r.kept, r.pinned), (ring, 0), "{r:?}");
    b.free(lp.arena);
    // Auto on this small warm segment takes the kept ring rather than registering.
    let lp = loader::load(
        &b,
        &p,
        &LoadOptions {
            io: IoMode::Auto,
            readers: loader::STAGED_MIN_READERS,
            ..o
        },
    )
    .unwrap();
    assert_eq!(lp.stats.mode, IoMode::Staged);
    assert_eq!(lp.stats.ring.unwrap().kept, ring);
    b.free(lp.arena);
}

#[test]
fn ramped_and_whole_first_chunks_copy_every_byte_and_the_side_job_sees_the_pack() {
    let dir = tempfile::tempdir().unwrap();
    let p = three_layout_pack(dir.path());
    let b = HostBackend::new();
    for ramp in [true, false] {
        let o = LoadOptions {
            io: IoMode::Staged,
            staging: loader::Staging::Fresh,
            chunk: 64 << 10,
            ring: 4,
            readers: 5,
            ramp,
            ..Default::default()
        };
        let (lp, seen) = loader::load_beside(&b, &p, &o, |pack, inter| {
            (pack.manifest.model.hidden_size, inter)
        })
        .unwrap();
        assert!(
            lp.stats.bytes > 5 * (64 << 10),
            "the ramp must be shorter than the pack"
        );
        every_tensor_arrived(&b, &lp, if ramp { "ramped ring" } else { "whole chunks" });
        assert_eq!(seen, (128, lp.ffn_inter), "ramp {ramp}");
        assert_eq!(lp.ffn_inter, 256);
        b.free(lp.arena);
    }
}

/// An engine's default options take the process's `METRALE_*` levers over the hardware
/// defaults (docs/runtime.md: `METRALE_DQ_WGMMA=0` and the like): this test's binary run again
/// with two levers set (the child checks them; a test may not set its own environment).
#[test]
fn default_engine_options_read_the_levers_of_the_environment() {
    let levers = loader::EngineOptions::default().levers;
    if std::env::var_os("METRALE_LEVER_CHILD").is_some() {
        assert_eq!(levers.ggml_down_split_max_rows, 1);
        assert!(!levers.dq_wgmma);
        return;
    }
    assert!(
        levers.dq_wgmma,
        "HARDWARE.toml's default without the variable"
    );
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "default_engine_options_read_the_levers_of_the_environment",
        ])
        .env("METRALE_LEVER_CHILD", "1")
        .env("METRALE_GGML_DOWN_SPLIT_MAX_ROWS", "1")
        .env("METRALE_DQ_WGMMA", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
