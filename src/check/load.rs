//! Load rows: packs loaded into overlays compute what start-up builds.

use super::*;
use crate::converters::layouts::Layout;
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::{GpuBackend, GpuResult, ModelLevers, download_f32, upload_f32};
use crate::loader::{self, LayerOverlays, LoadOptions};
use crate::model::Model;
use crate::pack::{self, ConvertOptions};
use crate::testing::*;
use std::sync::{Arc, LazyLock};

/// Loader checks: a generated model (F32, 2 layers) converted with every layout (and a generated
/// PEFT adapter), loaded by each copy path; overlay bytes on the device must equal the pack's,
/// loading must launch no kernel but the blob rules', and each layout's own load rows and
/// start-up arms (`src/layouts/TAG/check_load.rs`: finalize with nothing to build, a
/// pack-loaded layer bit-identical to one built at start-up from the source, or equal to the
/// host backend's given the same pack) must pass.
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
        for (_, rows_of) in LOAD_ROWS.iter().filter(|(l, _)| fx.layouts.contains(l)) {
            rows_of(&b, &fx, ov, &tag, rng, &mut rows)?;
        }
        pack_vs_startup(&b, &fx, ov, &tag, rng, &mut rows)?;
        b.free(lp.arena);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rows)
}

/// A source converted with every layout its activation takes (and a generated PEFT adapter on
/// SiLU models), and what the checks compare against.
pub(crate) struct Fixture {
    pub(crate) model: Model,
    pub(crate) pack: std::path::PathBuf,
    /// The layouts the pack holds.
    pub(crate) layouts: Vec<Layout>,
    pub(crate) adapter: crate::testing::LoraAdapter,
    pub(crate) act: crate::model::Activation,
    pub(crate) silu: bool,
    /// The layer compared: 1, or 0 on a one-layer model.
    pub(crate) li: usize,
    pub(crate) hidden: usize,
    pub(crate) inter: usize,
}

/// One layout's load arm: a layer given the pack's overlays of `layout` (and of the layout it
/// builds on, `ffn::builds_on`) computes, bit for bit, what a layer built at start-up from the
/// source by `install` computes (on 1, 2, 3, 5 and 33 rows; `gelu_rows` on a GELU layer where
/// that differs). Run where the pack holds them.
pub(crate) struct StartupArm {
    pub(crate) name: &'static str,
    pub(crate) layout: Layout,
    pub(crate) gelu_rows: Option<&'static [usize]>,
    pub(crate) install: Install,
}

/// How an engine without packs builds a layout's overlays at start-up.
pub(crate) type Install = fn(
    &dyn GpuBackend,
    &mut DenseFfnLayer,
    &DenseWeights,
    &mut ForwardContext,
    &Fixture,
) -> GpuResult<()>;

/// A layout's own rows on the loaded pack (layer `fx.li`'s overlays `ov`, copy path `io`), run
/// where the pack holds the layout.
pub(crate) type LoadRows = fn(
    &Arc<dyn GpuBackend>,
    &Fixture,
    &LayerOverlays,
    &str,
    &mut Rand,
    &mut Vec<Row>,
) -> crate::Result<()>;

/// Generates [`STARTUP_ARMS`] and [`LOAD_ROWS`] from the list of built-in layouts
/// (`layouts::builtin_layouts!`).
macro_rules! load_arms {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        /// Every layout's start-up arms (`src/layouts/TAG/check_load.rs`), in `Layout` order.
        static STARTUP_ARMS: LazyLock<Vec<&'static StartupArm>> = LazyLock::new(|| {
            let mut v = Vec::new();
            $(v.extend(crate::layouts::$t::check_load::STARTUP.iter());)*
            v
        });
        /// Every layout's own load rows with their layout, in `Layout` order.
        static LOAD_ROWS: LazyLock<Vec<(Layout, LoadRows)>> = LazyLock::new(|| {
            let mut v = Vec::new();
            $(v.extend(crate::layouts::$t::check_load::ROWS.iter().map(|&r| (Layout::$v, r)));)*
            v
        });
    };
}
crate::layouts::builtin_layouts!(load_arms);

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
        // A GELU model gets the layouts its layer takes (`Layout::serves`) and no adapter (the
        // split-SiLU decode path only); each start-up arm says the rows a GELU layer serves.
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
        let layouts: Vec<Layout> = Layout::ALL
            .into_iter()
            .filter(|&l| l.serves(act) && (silu || l != Layout::Lora))
            .collect();
        let opts = ConvertOptions {
            layouts: Some(layouts.clone()),
            lora: silu.then_some(adapter_dir),
            ..Default::default()
        };
        let pack = dir.join("m.mpk.gguf");
        pack::convert(&model, &opts, &pack, &|_, _| {})?;
        let li = usize::from(model.ffn_layers.len() > 1);
        Ok(Fixture {
            model,
            pack,
            layouts,
            adapter,
            act,
            silu,
            li,
            hidden,
            inter,
        })
    }

    pub(crate) fn shape(&self) -> (usize, usize) {
        (self.hidden, self.inter)
    }

    pub(crate) fn config(&self) -> FfnConfig {
        FfnConfig {
            hidden: self.hidden,
            inter: self.inter,
        }
    }

    pub(crate) fn new_layer(&self, c: &ForwardContext) -> DenseFfnLayer {
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

/// The row of a finalize call on a layer whose pack holds what it builds: the kernels it
/// launched plus one if it says it built anything (both must be 0).
pub(crate) fn nothing_built(
    rows: &mut Vec<Row>,
    what: &str,
    fx: &Fixture,
    launches: u64,
    did: bool,
) {
    let n = launches as f64 + f64::from(u8::from(did));
    push(rows, what, fx.shape(), 0, n, 0.0);
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
    for sa in STARTUP_ARMS.iter() {
        let with: Vec<Layout> = crate::ffn::builds_on(sa.layout)
            .into_iter()
            .chain([sa.layout])
            .collect();
        if !with.iter().all(|l| fx.layouts.contains(l)) {
            continue;
        }
        let arm = sa.name;
        let mut from_pack = fx.new_layer(&ctx);
        ov.only(&with).install(&mut from_pack)?;
        let mut built = fx.new_layer(&ctx);
        (sa.install)(b.as_ref(), &mut built, &w, &mut ctx, fx)?;
        let ms: &[usize] = match sa.gelu_rows {
            Some(rows) if !fx.silu => rows,
            _ => &[1, 2, 3, 5, 33],
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
