//! The engine's one call, `LoadedModel::load`, on the host backend: it frees every device
//! allocation when dropped, refuses at load a pack no forward can serve, keeps no trace unless
//! asked, and with `verify_checksums` finds a tensor that changed in the file.

mod common;

use common::pack::*;
use common::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext, Proj};
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::gpu::{GpuBackend, ModelLevers, download_f32, upload_f32};
use metrale_pack::loader::{EngineOptions, LoadedModel};
use metrale_pack::testing::{DenseWeights, Rand, install_nvfp4};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const H: usize = 256;
const I: usize = 512;

/// A two-layer F16 llama converted with `layouts`.
fn pack_with(dir: &Path, layouts: &[Layout]) -> PathBuf {
    let mut rng = Rng::fresh("engine");
    let src = gguf_model(dir, "m.gguf", "llama", H, I, 2, GgmlType::F16, &mut rng);
    let out = dir.join(format!("m-{}.mpk.gguf", layouts.len()));
    convert(&src, &out, &opts(layouts));
    out
}

/// A forward context of the test layer's shape for up to `rows` rows.
fn layer_ctx(b: &Arc<dyn GpuBackend>, rows: usize) -> ForwardContext {
    let cfg = FfnConfig {
        hidden: H,
        inter: I,
    };
    ForwardContext::new(b.clone(), cfg, rows, ModelLevers::default()).unwrap()
}

fn host() -> (Arc<HostBackend>, Arc<dyn GpuBackend>) {
    let h = Arc::new(HostBackend::new());
    (h.clone(), h)
}

#[test]
fn dropping_a_loaded_model_frees_every_allocation() {
    let dir = tempfile::tempdir().unwrap();
    for layouts in [
        vec![Layout::Nvfp4, Layout::Nvfp4Mmq],
        vec![Layout::Nvfp4, Layout::Q4kMmq, Layout::Fp8, Layout::Bf16],
    ] {
        let path = pack_with(dir.path(), &layouts);
        let (h, b) = host();
        let opts = EngineOptions {
            max_tokens: 8,
            ..Default::default()
        };
        let mut m = LoadedModel::load(&path, b.clone(), &opts).unwrap();
        assert!(h.live_allocations() > 0);
        // A device tensor says what it is: layout, projection and padded shape.
        let name = metrale_pack::pack::blob_name(1, Proj::Down, Layout::Nvfp4, "codes");
        let t = m.device_tensor(&name).unwrap();
        let fe = t.entry.ffn.as_ref().unwrap();
        assert_eq!(
            (fe.layout.as_str(), fe.proj.as_str(), fe.shape),
            ("nvfp4", "down", [H as u64, I as u64])
        );
        assert_eq!(t.ptr.bytes, t.entry.bytes);
        let x = b.alloc((8 * H * 4) as u64).unwrap();
        b.fill(x, 0).unwrap();
        for l in m.layer_indices().collect::<Vec<_>>() {
            for rows in [1, 2, 3, 8] {
                m.forward(l, x, rows).unwrap();
            }
        }
        b.free(x);
        drop(m);
        assert_eq!(h.live_allocations(), 0, "{layouts:?}: left allocated");
    }
}

#[test]
fn a_layer_frees_what_its_finalize_built() {
    let (h, b) = host();
    let ctx = layer_ctx(&b, 16);
    let w = DenseWeights::random(&mut Rand(3), H, I);
    let mut l = DenseFfnLayer::new(&ctx);
    install_nvfp4(b.as_ref(), &mut l, &w).unwrap();
    let base: Vec<_> = l
        .get(metrale_pack::ffn::key::NVFP4)
        .into_iter()
        .flatten()
        .flat_map(|p| [p.codes(), p.scales()])
        .collect();
    let before = h.live_allocations();
    let mut ctx = ctx;
    assert!(l.finalize_nvfp4_mmq_load(&mut ctx, H, I, 0).unwrap());
    assert!(
        h.live_allocations() > before,
        "finalize allocated its tiles"
    );
    drop(l);
    assert_eq!(h.live_allocations(), before);
    for p in base {
        b.free(p);
    }
    drop(ctx);
    assert_eq!(h.live_allocations(), 0);
}

#[test]
fn a_pack_no_forward_can_serve_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    // The transposed copies alone: they build on an nvfp4 base the pack lacks.
    let path = pack_with(dir.path(), &[Layout::Nvfp4T]);
    let (h, b) = host();
    let e = LoadedModel::load(&path, b, &EngineOptions::default())
        .err()
        .expect("an nvfp4_t-only pack is refused")
        .to_string();
    assert!(
        e.contains("layer 0 cannot forward with layouts nvfp4_t"),
        "{e}"
    );
    assert_eq!(h.live_allocations(), 0, "a refused load frees what it took");
}

/// A `q4k_mmq` pack on its own serves every forward an engine makes: one row through the
/// Q4_K decode GEMVs over the pack's bytes, two and three rows through their batch-4 forms,
/// more through the Q4_K MMQ prefill; each against the float64 FFN of the weights the pack
/// holds (decoded from it): 1e-5 where activations stay f32 (the GEMVs; measured 5e-8 to 7e-8),
/// 5e-2 where the prefill rounds them (bf16 or q8_1 into gate and up, int8 rows into down;
/// measured 2.9e-2). Both down formats.
#[test]
fn a_q4k_mmq_pack_alone_decodes_and_prefills() {
    use metrale_pack::converters::layouts::q4k_mmq::DownFormat;
    use metrale_pack::model::Activation;
    use metrale_pack::testing::{ffn_f64, rel_err};
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::fresh("engine-q4k");
    let src = gguf_model(
        dir.path(),
        "m.gguf",
        "llama",
        H,
        I,
        2,
        GgmlType::F16,
        &mut rng,
    );
    for (down, gemv_down) in [
        (DownFormat::Int8, "int8_rows_gemv"),
        (DownFormat::Q4k, "q4k_gemv"),
    ] {
        let out = dir.path().join(format!("q4k-{down:?}.mpk.gguf"));
        let mut o = opts(&[Layout::Q4kMmq]);
        o.q4k_down = down;
        convert(&src, &out, &o);
        let pack = metrale_pack::pack::Pack::open(&out).unwrap();
        let (_, b) = host();
        let eo = EngineOptions {
            max_tokens: 8,
            trace: true,
            ..Default::default()
        };
        let mut m = LoadedModel::load(&out, b.clone(), &eo).unwrap();
        let x = b.alloc((8 * H * 4) as u64).unwrap();
        let mut r = Rand(41);
        for layer in [0usize, 1] {
            let dec = |p| {
                let name = metrale_pack::pack::blob_name(layer, p, Layout::Q4kMmq, "");
                pack.decode_ffn(&name).unwrap().0
            };
            let w = DenseWeights {
                gate: dec(Proj::Gate),
                up: dec(Proj::Up),
                down: dec(Proj::Down),
                hidden: H,
                inter: I,
            };
            for rows in [1usize, 2, 3, 8] {
                let xs = r.vec(rows * H, 1.0);
                upload_f32(b.as_ref(), x, &xs).unwrap();
                m.ctx.trace.clear();
                let y = m.forward(layer, x, rows).unwrap();
                let got = download_f32(b.as_ref(), y).unwrap();
                let e = rel_err(&got, &ffn_f64(&xs, rows, &w, Activation::Silu));
                let (kernels, bound): (&[&str], f64) = match rows {
                    1 => (&["q4k_gemv"], 1e-5),
                    2 | 3 => (&["q4k_gemv_batch4"], 1e-5),
                    _ => (&["q4k_wgmma", "q4k_mmq_gemm"], 5e-2),
                };
                assert!(e < bound, "{down:?}, layer {layer}, {rows} rows: {e}");
                assert!(
                    kernels.iter().any(|k| m.ctx.trace.contains(k)),
                    "{down:?} {rows} rows: {:?}",
                    m.ctx.trace
                );
                if rows == 1 {
                    assert!(m.ctx.trace.contains(&gemv_down), "{:?}", m.ctx.trace);
                }
            }
        }
        b.free(x);
    }
}

#[test]
fn the_trace_is_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    let path = pack_with(dir.path(), &[Layout::Nvfp4]);
    for trace in [false, true] {
        let (_, b) = host();
        let opts = EngineOptions {
            trace,
            ..Default::default()
        };
        let mut m = LoadedModel::load(&path, b.clone(), &opts).unwrap();
        let x = b.alloc((H * 4) as u64).unwrap();
        b.fill(x, 0).unwrap();
        for _ in 0..1000 {
            m.forward(0, x, 1).unwrap();
        }
        let n = m.ctx.trace.len();
        if trace {
            assert!(n >= 1000, "{n} launches recorded");
        } else {
            assert_eq!(n, 0, "an engine's context keeps no trace");
        }
        b.free(x);
        let e = m.forward(7, x, 1).unwrap_err().to_string();
        assert!(e.contains("no dense FFN layer 7"), "{e}");
    }
}

#[test]
fn verify_checksums_finds_a_changed_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = pack_with(dir.path(), &[Layout::Nvfp4]);
    let opts = EngineOptions {
        verify_checksums: true,
        ..Default::default()
    };
    LoadedModel::load(&path, host().1, &opts).unwrap();
    // One byte of a device tensor changed in the file (the header, and so `open`, unchanged).
    let p = metrale_pack::pack::Pack::open(&path).unwrap();
    let i = p.index("blk.1.ffn_norm.weight").unwrap();
    let at = p.file.data_offset + p.file.tensors[i].offset;
    drop(p);
    let mut img = std::fs::read(&path).unwrap();
    img[at as usize] ^= 0x40;
    std::fs::write(&path, &img).unwrap();
    let (h, b) = host();
    LoadedModel::load(&path, b.clone(), &EngineOptions::default()).unwrap();
    let e = LoadedModel::load(&path, b, &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("1 tensors differ")
            && e.contains("checksum")
            && e.contains("blk.1.ffn_norm.weight")
            && !e.contains("refusing to write"),
        "{e}"
    );
    assert_eq!(h.live_allocations(), 0);
}

/// The runtime's refusals are kinds an engine can match: rows the context does not hold
/// (`Shape`), a layer whose weights serve no forward (`NotServed`), an install out of order
/// (`Order`).
#[test]
fn errors_are_kinds_an_engine_can_match() {
    use metrale_pack::gpu::GpuError;
    let dir = tempfile::tempdir().unwrap();
    let path = pack_with(dir.path(), &[Layout::Nvfp4]);
    let (_, b) = host();
    let mut m = LoadedModel::load(&path, b.clone(), &EngineOptions::default()).unwrap();
    let x = b.alloc((4 * H * 4) as u64).unwrap();
    assert!(matches!(m.forward(0, x, 4), Err(GpuError::Shape(_))));
    assert!(matches!(m.forward(9, x, 1), Err(GpuError::Invalid(_))));
    let ctx = layer_ctx(&b, 4);
    let mut bare = DenseFfnLayer::new(&ctx);
    let mut ctx = ctx;
    assert!(matches!(
        bare.forward(&mut ctx, x),
        Err(GpuError::NotServed(_))
    ));
    let lora = [None, None, None];
    assert!(matches!(
        bare.set_lora_weights(lora),
        Err(GpuError::Order(_))
    ));
    b.free(x);
}
