//! Load rows: packs loaded into overlays compute what start-up builds.

use super::*;
use crate::converters::layouts::Layout;
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::host::HostBackend;
use crate::gpu::{GpuBackend, GpuResult, ModelLevers, download_f32, upload_f32};
use crate::loader::{self, LayerOverlays, LoadOptions};
use crate::model::Model;
use crate::pack::{self, ConvertOptions};
use crate::testing::*;
use std::sync::Arc;

/// Loader checks: a generated model (F32, 2 layers) converted with every layout (a generated
/// PEFT adapter for `lora`), loaded by each copy path; overlay bytes on the device must equal
/// the pack's, loading must launch no kernel, finalize must have nothing to build, every arm of
/// a pack-loaded layer must give bit-identical outputs to a layer built at start-up from the
/// source, and the q4k_mmq + lora layer must agree with the host backend given the same pack.
pub fn load_checks(
    b: Arc<dyn GpuBackend>,
    hidden: usize,
    inter: usize,
    modes: &[crate::loader::IoMode],
    rng: &mut Rand,
) -> crate::Result<Vec<Row>> {
    let dir = scratch_dir("load-check");
    std::fs::create_dir_all(&dir).map_err(|err| crate::Error::Io {
        file: dir.display().to_string(),
        err,
    })?;
    let src = dir.join("m.gguf");
    crate::testing::gen_model::gen_model(&src, hidden, inter, 2, crate::GgmlType::F32, "llama")?;
    let rows = load_checks_from(b, &src, modes, rng);
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

/// The loader checks on a given source checkpoint (e.g. the real SmolLM2 GGUF): convert it with
/// every layout, load, and compare layer 1 (layer 0 on a one-layer model) as [`load_checks`]
/// does.
pub fn load_checks_from(
    b: Arc<dyn GpuBackend>,
    src: &std::path::Path,
    modes: &[crate::loader::IoMode],
    rng: &mut Rand,
) -> crate::Result<Vec<Row>> {
    let dir = scratch_dir("load-from");
    std::fs::create_dir_all(&dir).map_err(|err| crate::Error::Io {
        file: dir.display().to_string(),
        err,
    })?;
    let fx = Fixture::convert(src, &dir, rng)?;
    let mut rows = Vec::new();
    for &io in modes {
        let lp = copy_rows(b.as_ref(), &fx, io, &mut rows)?;
        let ov = &lp.layers[fx.li];
        let tag = format!("{io:?}");
        if fx.silu {
            nvfp4_mmq_repack_row(&b, &fx, ov, &tag, &mut rows)?;
        }
        q4k_pack_vs_host(&b, &fx, ov, &tag, rng, &mut rows)?;
        pack_vs_startup(&b, &fx, ov, &tag, rng, &mut rows)?;
        b.free(lp.arena);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rows)
}

/// A source converted with every layout its activation takes (a generated PEFT adapter for
/// `lora` on SiLU models), and what the checks compare against.
struct Fixture {
    model: Model,
    pack: std::path::PathBuf,
    adapter: crate::testing::LoraAdapter,
    act: crate::model::Activation,
    silu: bool,
    /// The layer compared: 1, or 0 on a one-layer model.
    li: usize,
    hidden: usize,
    inter: usize,
}

impl Fixture {
    fn convert(
        src: &std::path::Path,
        dir: &std::path::Path,
        rng: &mut Rand,
    ) -> crate::Result<Self> {
        let model = Model::open(src)?;
        let (hidden, inter) = (
            model.hidden_size.ok_or_else(|| no_size(src, "hidden"))? as usize,
            model
                .intermediate_size
                .ok_or_else(|| no_size(src, "intermediate"))? as usize,
        );
        // A GELU model gets the layouts and arms its layer takes: no w8a8 (refused for GELU),
        // no nvfp4_mmq (finalize skips GELU layers), no LoRA (the split-SiLU decode path only),
        // and the q2g128 arm only where it serves GELU (decode and the 2-3 row GEMVs).
        let act = model.activation.unwrap_or(crate::model::Activation::Silu);
        let silu = act == crate::model::Activation::Silu;
        let adapter_dir = dir.join("adapter");
        let adapter = crate::testing::LoraAdapter::write_peft(
            rng,
            &adapter_dir,
            model.ffn_layers.len(),
            hidden,
            inter,
            8,
        )?;
        let layouts = Layout::ALL
            .into_iter()
            .filter(|&l| l.serves(act) && (silu || l != Layout::Lora))
            .collect();
        let opts = ConvertOptions {
            layouts: Some(layouts),
            lora: silu.then_some(adapter_dir),
            ..Default::default()
        };
        let pack = dir.join("m.mpk.gguf");
        pack::convert(&model, &opts, &pack, &|_, _| {})?;
        let li = usize::from(model.ffn_layers.len() > 1);
        Ok(Fixture {
            model,
            pack,
            adapter,
            act,
            silu,
            li,
            hidden,
            inter,
        })
    }

    fn shape(&self) -> (usize, usize) {
        (self.hidden, self.inter)
    }

    fn config(&self) -> FfnConfig {
        FfnConfig {
            hidden: self.hidden,
            inter: self.inter,
        }
    }

    fn new_layer(&self, c: &ForwardContext) -> DenseFfnLayer {
        DenseFfnLayer::new_with_activation(c, self.act)
    }
}

/// Load the pack by copy path `io`: no kernel launched but the blob rules' (`blob_rules`, one
/// a part with element rules: `Pack::element_rules`), every device tensor (FFN blobs and
/// passthrough alike) equal to the pack's bytes.
fn copy_rows(
    b: &dyn GpuBackend,
    fx: &Fixture,
    io: crate::loader::IoMode,
    rows: &mut Vec<Row>,
) -> crate::Result<crate::loader::LoadedPack> {
    let before = b.launch_count();
    let opts = LoadOptions {
        io,
        chunk: 1 << 20,
        ..Default::default()
    };
    let lp = loader::load(b, &fx.pack, &opts)?;
    let rules = lp.pack.element_rules()?.len() as f64;
    let launches = (b.launch_count() - before) as f64;
    push(
        rows,
        &format!("load {io:?}: kernel launches beside the blob rules' {rules}"),
        fx.shape(),
        0,
        (launches - rules).abs(),
        0.0,
    );
    let mut differ = 0usize;
    for t in lp.device_tensors() {
        let mut got = vec![0u8; t.ptr.bytes as usize];
        b.download(t.ptr, &mut got)?;
        let i = lp.pack.index(t.name).unwrap_or(usize::MAX);
        differ += usize::from(lp.pack.file.tensors.get(i).is_none() || got != lp.pack.data(i));
    }
    let what = format!("load {io:?}: device tensors != pack bytes");
    push(rows, &what, fx.shape(), 0, differ as f64, 0.0);
    Ok(lp)
}

/// A pack holding nvfp4_mmq: finalize_nvfp4_mmq_load has nothing to repack.
fn nvfp4_mmq_repack_row(
    b: &Arc<dyn GpuBackend>,
    fx: &Fixture,
    ov: &LayerOverlays,
    io: &str,
    rows: &mut Vec<Row>,
) -> crate::Result<()> {
    let mut ctx = ForwardContext::new(b.clone(), fx.config(), 64, ModelLevers::default())?;
    let mut l = fx.new_layer(&ctx);
    ov.only(&[Layout::Nvfp4, Layout::Nvfp4Mmq])
        .install(&mut l)?;
    let n0 = b.launch_count();
    let did = l.finalize_nvfp4_mmq_load(&mut ctx, fx.hidden, fx.inter, 0)?;
    let what = format!("load {io}: repack launches with nvfp4_mmq in the pack");
    nothing_built(rows, &what, fx, b.launch_count() - n0, did);
    Ok(())
}

/// The row of a finalize call on a layer whose pack holds what it builds: the kernels it
/// launched plus one if it says it built anything (both must be 0).
fn nothing_built(rows: &mut Vec<Row>, what: &str, fx: &Fixture, launches: u64, did: bool) {
    let n = launches as f64 + f64::from(u8::from(did));
    push(rows, what, fx.shape(), 0, n, 0.0);
}

/// A pack holding q4k_mmq (and lora): finalize_q4k_load has nothing to build, and the layer
/// from the pack (Q4_K MMQ prefill, int8 down, the adapter on both) agrees with the host backend
/// given the same pack.
fn q4k_pack_vs_host(
    b: &Arc<dyn GpuBackend>,
    fx: &Fixture,
    ov: &LayerOverlays,
    io: &str,
    rng: &mut Rand,
    rows: &mut Vec<Row>,
) -> crate::Result<()> {
    let levers = ModelLevers {
        q4k_mmq: true,
        ..ModelLevers::default()
    };
    let host: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let hlp = loader::load(host.as_ref(), &fx.pack, &LoadOptions::default())?;
    let overlays = |o: &LayerOverlays| o.only(&[Layout::Nvfp4, Layout::Q4kMmq, Layout::Lora]);
    let mut gctx = ForwardContext::new(b.clone(), fx.config(), 64, levers.clone())?;
    let mut hctx = ForwardContext::new(host.clone(), fx.config(), 64, levers)?;
    (gctx.tracing, hctx.tracing) = (true, true);
    let mut gl = fx.new_layer(&gctx);
    overlays(ov).install(&mut gl)?;
    let mut hl = fx.new_layer(&hctx);
    overlays(&hlp.layers[fx.li]).install(&mut hl)?;
    let n0 = b.launch_count();
    let did = gl.finalize_q4k_load(&mut gctx, fx.hidden, fx.inter, 0)?;
    let what = format!("load {io}: build launches with q4k_mmq in the pack");
    nothing_built(rows, &what, fx, b.launch_count() - n0, did);
    for m in [1usize, 5, 33] {
        let x = rng.vec(m * fx.hidden, 1.0);
        let run = |l: &DenseFfnLayer, c: &mut ForwardContext| -> GpuResult<Vec<f32>> {
            let be = c.backend.clone();
            let xp = be.alloc((m * fx.hidden * 4) as u64)?;
            upload_f32(be.as_ref(), xp, &x)?;
            c.trace.clear();
            let out = match m {
                1 => l.forward(c, xp),
                _ => l.forward_prefill(c, xp, m),
            }?;
            be.synchronize(0)?;
            let y = download_f32(be.as_ref(), out);
            be.free(xp);
            y
        };
        let yg = run(&gl, &mut gctx)?;
        let yh = run(&hl, &mut hctx)?;
        let err = cuda_vs_host_err(&yg, &yh, gctx.trace == hctx.trace);
        // As the layer checks: 1e-3 for the NVFP4 decode GEMVs (their bf16 activations can flip
        // on a last-bit difference), 5e-3 where q8_1 codes can move.
        let tol = if m == 1 { 1e-3 } else { 5e-3 };
        let lora = if fx.silu { "+lora" } else { "" };
        let what = format!("load {io}: q4k_mmq{lora} pack, CUDA vs host");
        push(rows, &what, fx.shape(), m, err, tol);
    }
    host.free(hlp.arena);
    Ok(())
}

/// How an engine without packs builds a layout's overlays at start-up.
type Install<'a> = dyn Fn(&dyn GpuBackend, &mut DenseFfnLayer, &DenseWeights, &mut ForwardContext) -> GpuResult<()>
    + 'a;

/// Each arm's overlays from the pack, and how start-up builds the same from the source.
fn startup_arms<'a>(
    ov: &LayerOverlays,
    fx: &'a Fixture,
) -> Vec<(&'static str, LayerOverlays, Box<Install<'a>>)> {
    use Layout::{Bf16, Fp8, Lora, Nvfp4, Nvfp4Mmq, Nvfp4T, Q2g128, W8a8};
    let only = |layouts: &[Layout]| ov.only(layouts);
    let arms: Vec<(&'static str, LayerOverlays, Box<Install<'a>>)> = vec![
        (
            "q2",
            only(&[Q2g128]),
            Box::new(|b, l, w, _| install_q2(b, l, w)),
        ),
        (
            "fp8",
            only(&[Fp8]),
            Box::new(|b, l, w, _| install_fp8(b, l, w, true)),
        ),
        (
            "w8a8",
            only(&[W8a8]),
            Box::new(|b, l, w, _| install_w8a8(b, l, w)),
        ),
        (
            "bf16",
            only(&[Bf16]),
            Box::new(|b, l, w, _| install_bf16(b, l, w)),
        ),
        (
            "nvfp4",
            only(&[Nvfp4]),
            Box::new(|b, l, w, _| install_nvfp4(b, l, w)),
        ),
        (
            "nvfp4_t",
            only(&[Nvfp4, Nvfp4T]),
            Box::new(|b, l, w, _| install_nvfp4_t(b, l, w)),
        ),
        (
            // Start-up: the _t copies, then the GPU repack of finalize_nvfp4_mmq_load.
            "nvfp4_mmq",
            only(&[Nvfp4, Nvfp4Mmq]),
            Box::new(|b, l, w, c| {
                install_nvfp4_t(b, l, w)?;
                l.finalize_nvfp4_mmq_load(c, w.hidden, w.inter, 0)
                    .map(|_| ())
            }),
        ),
        (
            // Start-up: the same adapter encoded and installed through set_lora_weights.
            "lora",
            only(&[Nvfp4, Lora]),
            Box::new(|b, l, w, _| {
                install_nvfp4(b, l, w)?;
                fx.adapter.install(b, l)
            }),
        ),
    ];
    arms.into_iter()
        .filter(|(a, _, _)| fx.silu || !matches!(*a, "w8a8" | "nvfp4_mmq" | "lora"))
        .collect()
}

/// Every arm of a pack-loaded layer gives bit-identical outputs to a layer built at start-up
/// from the source.
fn pack_vs_startup(
    b: &Arc<dyn GpuBackend>,
    fx: &Fixture,
    ov: &LayerOverlays,
    io: &str,
    rng: &mut Rand,
    rows: &mut Vec<Row>,
) -> crate::Result<()> {
    let mut ctx = ForwardContext::new(b.clone(), fx.config(), 64, ModelLevers::default())?;
    ctx.tracing = true;
    let l = &fx.model.ffn_layers[fx.li];
    let w = DenseWeights {
        gate: fx.model.decode_weight(&l.gate)?.0,
        up: fx.model.decode_weight(&l.up)?.0,
        down: fx.model.decode_weight(&l.down)?.0,
        hidden: fx.hidden,
        inter: fx.inter,
    };
    for (arm, overlays, install) in startup_arms(ov, fx) {
        let mut from_pack = fx.new_layer(&ctx);
        overlays.install(&mut from_pack)?;
        let mut built = fx.new_layer(&ctx);
        install(b.as_ref(), &mut built, &w, &mut ctx)?;
        let ms: &[usize] = if arm == "q2" && !fx.silu {
            &[1, 2, 3] // q2g128 prefill serves SiLU layers only
        } else {
            &[1, 2, 3, 5, 33]
        };
        for &m in ms {
            let x = rng.vec(m * fx.hidden, 1.0);
            let xp = b.alloc((m * fx.hidden * 4) as u64)?;
            upload_f32(b.as_ref(), xp, &x)?;
            let run = |layer: &DenseFfnLayer, ctx: &mut ForwardContext| -> GpuResult<Vec<f32>> {
                let out = match m {
                    1 => layer.forward(ctx, xp),
                    2 => layer.forward_k2(ctx, xp),
                    3 => layer.forward_k3(ctx, xp),
                    _ => layer.forward_prefill(ctx, xp, m),
                }?;
                b.synchronize(0)?;
                download_f32(b.as_ref(), out)
            };
            let a = run(&from_pack, &mut ctx)?;
            let c = run(&built, &mut ctx)?;
            let diff = a
                .iter()
                .zip(&c)
                .filter(|(p, q)| p.to_bits() != q.to_bits())
                .count();
            let what = format!("load {io}: {arm} pack vs start-up bits differ");
            push(rows, &what, fx.shape(), m, diff as f64, 0.0);
            b.free(xp);
        }
    }
    Ok(())
}

fn no_size(src: &std::path::Path, what: &str) -> crate::Error {
    crate::Error::Unsupported {
        file: src.display().to_string(),
        reason: format!("no {what} size"),
    }
}
