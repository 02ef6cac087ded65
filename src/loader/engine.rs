//! One call from a pack file to layers ready to forward, for an engine: [`LoadedModel`] owns
//! the device segment, the forward context and every installed layer, and gives them back to
//! the backend when dropped.

use super::{DeviceTensor, LoadOptions, LoadedPack, load_beside};
use crate::error::{Error, Result};
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::{DevicePtr, GpuBackend, GpuError, GpuResult, ModelLevers};
use crate::model::Activation;
use std::path::Path;
use std::sync::Arc;

/// The forward context for the layers of the opened pack `p` (this rank's FFN intermediate
/// size `inter`), with every kernel resolved (the modules loaded): what `load_beside`'s side job
/// builds while the segment copies.
pub fn forward_context(
    backend: &Arc<dyn GpuBackend>,
    p: &crate::pack::Pack,
    inter: usize,
    max_tokens: usize,
    levers: ModelLevers,
) -> GpuResult<ForwardContext> {
    let cfg = FfnConfig {
        hidden: p.manifest.model.hidden_size as usize,
        inter,
    };
    let ctx = ForwardContext::new(backend.clone(), cfg, max_tokens, levers)?;
    // The first layer resolves every kernel.
    drop(DenseFfnLayer::new(&ctx));
    Ok(ctx)
}

/// How [`LoadedModel::load`] loads.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// How the pack is copied to the device (and, for a tensor-parallel pack, which rank).
    pub load: LoadOptions,
    /// The most rows one forward call takes: the scratch arena is sized for it.
    pub max_tokens: usize,
    /// Routing levers (default: this machine's, under the process's `METRALE_*` variables,
    /// `ModelLevers::from_env`, as docs/runtime.md documents them).
    pub levers: ModelLevers,
    /// After the copy, read every device tensor back from the device and every host tensor from
    /// the file, and compare each with the manifest's xxh3 (a reload in place of the copy).
    pub verify_checksums: bool,
    /// Record the kernels each forward launches in `ctx.trace` (off: nothing accumulates).
    pub trace: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            load: LoadOptions::default(),
            max_tokens: 1,
            levers: ModelLevers::from_env(),
            verify_checksums: false,
            trace: false,
        }
    }
}

/// A pack on the device with every dense FFN layer installed and ready to forward. Dropping it
/// frees the device segment, the context's scratch and what the layers allocated.
pub struct LoadedModel {
    /// The pack on the device: its manifest, every device tensor, the load's figures.
    pub pack: LoadedPack,
    /// The forward context (scratch arena, levers, stream, trace).
    pub ctx: ForwardContext,
    /// (layer index, layer), in pack order.
    layers: Vec<(usize, DenseFfnLayer)>,
    backend: Arc<dyn GpuBackend>,
}

impl LoadedModel {
    /// Open, validate and copy the pack at `path`, install every layer's overlays, and run one
    /// row through each layer: a pack whose layers no forward can serve (a layout's copies of
    /// a base the pack lacks) is refused here, naming the layer and
    /// what the runtime said, not at the first forward.
    pub fn load(
        path: impl AsRef<Path>,
        backend: Arc<dyn GpuBackend>,
        opts: &EngineOptions,
    ) -> Result<LoadedModel> {
        let path = path.as_ref();
        let file = path.display().to_string();
        if opts.max_tokens > crate::ffn::MAX_FORWARD_ROWS {
            return Err(Error::Argument {
                name: "max_rows".into(),
                reason: format!(
                    "{} rows; a forward takes at most {} (crate::ffn::MAX_FORWARD_ROWS)",
                    opts.max_tokens,
                    crate::ffn::MAX_FORWARD_ROWS
                ),
            });
        }
        let gpu = |what: &str, e: GpuError| Error::Unsupported {
            file: file.clone(),
            reason: format!("{what}: {e}"),
        };
        // The forward context (its scratch arena) is allocated while the segment copies.
        let (pack, ctx) = load_beside(backend.as_ref(), path, &opts.load, |p, inter| {
            forward_context(&backend, p, inter, opts.max_tokens, opts.levers.clone())
        })?;
        // From here the segment is owned: a failure below frees it with the half-built model.
        let m = &pack.pack.manifest.model;
        let act = Activation::from_act_name(&m.activation).ok_or_else(|| {
            backend.free(pack.arena);
            Error::Unsupported {
                file: file.clone(),
                reason: format!(
                    "activation {:?} (the layer runs silu and gelu)",
                    m.activation
                ),
            }
        })?;
        let ctx = match ctx {
            Ok(c) => c,
            Err(e) => {
                backend.free(pack.arena);
                return Err(gpu("allocating the forward context", e));
            }
        };
        let mut model = LoadedModel {
            pack,
            ctx,
            layers: Vec::new(),
            backend,
        };
        model.ctx.tracing = opts.trace;
        for ov in &model.pack.layers {
            let mut l = DenseFfnLayer::new_with_activation(&model.ctx, act);
            ov.install(&mut l)
                .map_err(|e| gpu(&format!("installing layer {}", ov.index), e))?;
            model.layers.push((ov.index, l));
        }
        model.probe().map_err(|(i, e)| {
            gpu(
                &format!(
                    "layer {i} cannot forward with layouts {} (convert with the defaults, or add nvfp4 or bf16)",
                    model.pack.pack.manifest.layouts.join(",")
                ),
                e,
            )
        })?;
        if opts.verify_checksums {
            model.verify()?;
        }
        Ok(model)
    }

    /// One zero row through every layer (decode, the path every engine takes).
    fn probe(&mut self) -> std::result::Result<(), (usize, GpuError)> {
        let b = self.backend.clone();
        let x = b
            .alloc(self.ctx.config.hidden as u64 * 4)
            .map_err(|e| (0, e))?;
        let r = b.fill(x, 0).map_err(|e| (0, e)).and_then(|()| {
            for (i, l) in &self.layers {
                l.forward(&mut self.ctx, x).map_err(|e| (*i, e))?;
            }
            b.synchronize(self.ctx.stream).map_err(|e| (0, e))
        });
        b.free(x);
        self.ctx.trace.clear();
        r
    }

    /// Every tensor's bytes, read back from where the engine will use them, against the
    /// manifest's checksum.
    fn verify(&self) -> Result<()> {
        let p = &self.pack;
        let mut bad = Vec::new();
        for (i, e) in p.pack.manifest.tensors.iter().enumerate() {
            let h = match p.ptr_at(i) {
                Some(ptr) => {
                    let mut buf = vec![0u8; ptr.bytes as usize];
                    self.backend
                        .download(ptr, &mut buf)
                        .map_err(|err| Error::Unsupported {
                            file: p.pack.file.path.display().to_string(),
                            reason: format!("reading {} back from the device: {err}", e.name),
                        })?;
                    xxhash_rust::xxh3::xxh3_64(&buf)
                }
                None => xxhash_rust::xxh3::xxh3_64(p.pack.data(i)),
            };
            if h != e.xxh3 {
                bad.push(e.name.clone());
            }
        }
        if bad.is_empty() {
            return Ok(());
        }
        Err(Error::Tensor {
            file: p.pack.file.path.display().to_string(),
            tensor: bad[0].to_string(),
            field: "xxh3",
            reason: format!(
                "verify_checksums: the bytes loaded differ from the manifest's checksum ({} tensors differ; the pack is corrupt, or the copy failed)",
                bad.len()
            ),
        })
    }

    /// The indices of the dense FFN layers, in pack order.
    pub fn layer_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.layers.iter().map(|(i, _)| *i)
    }

    /// Dense FFN layer `index`, installed.
    pub fn layer(&self, index: usize) -> Option<&DenseFfnLayer> {
        self.layers
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, l)| l)
    }

    /// Run `m` rows of `input` (f32 `[m, hidden]` on the device) through layer `index`; the
    /// output (f32 `[m, hidden]`) lies in the context's arena until the next call. Errors keep
    /// their kind: [`GpuError::Shape`] for rows the context does not hold,
    /// [`GpuError::NotServed`] for rows no installed arm serves.
    pub fn forward(&mut self, index: usize, input: DevicePtr, m: usize) -> GpuResult<DevicePtr> {
        let Some((_, l)) = self.layers.iter().find(|(i, _)| *i == index) else {
            return Err(GpuError::Invalid(format!(
                "no dense FFN layer {index} in the pack"
            )));
        };
        match m {
            1 => l.forward(&mut self.ctx, input),
            2 => l.forward_k2(&mut self.ctx, input),
            3 => l.forward_k3(&mut self.ctx, input),
            _ => l.forward_prefill(&mut self.ctx, input, m),
        }
    }

    /// [`forward`](Self::forward) on f32 rows in host memory (little-endian bytes, `[rows,
    /// hidden]`): copied in, run, the output copied into `y` (as long as `x`).
    pub fn forward_host(
        &mut self,
        layer: usize,
        x: &[u8],
        y: &mut [u8],
        rows: usize,
    ) -> GpuResult<()> {
        let hidden = self.pack.pack.manifest.model.hidden_size as usize;
        let want = rows.checked_mul(hidden).and_then(|v| v.checked_mul(4));
        if rows == 0 || want != Some(x.len()) || y.len() != x.len() {
            return Err(GpuError::Invalid(format!(
                "forward: {} input and {} output bytes are not {rows} rows of {hidden} f32",
                x.len(),
                y.len()
            )));
        }
        let b = self.backend.clone();
        let xd = b.alloc(x.len() as u64)?;
        let r = b.upload(xd, x).and_then(|()| {
            let out = self.forward(layer, xd, rows)?;
            b.download(out.view(0, x.len() as u64), y)
        });
        b.free(xd);
        r
    }

    /// [`forward`](Self::forward) from device rows `x` into device rows `y` (f32 `[rows,
    /// hidden]` each, `y` at least as long as `x`), queued on the stream another library made
    /// (`raw_stream`, a `CUstream` handle; 0 the legacy default stream) with no copy of `x`;
    /// the model's own stream is restored after.
    pub fn forward_device(
        &mut self,
        layer: usize,
        x: DevicePtr,
        y: DevicePtr,
        rows: usize,
        raw_stream: u64,
    ) -> GpuResult<()> {
        let s = self.backend.adopt_stream(raw_stream)?;
        let old = std::mem::replace(&mut self.ctx.stream, s);
        let out = self.forward(layer, x, rows);
        self.ctx.stream = old;
        let out = out?;
        // SAFETY: `y` is device memory at least as long as `x` (the caller's contract); `out`
        // is the context's output of `x.bytes`, both ordered on `s`.
        unsafe { self.backend.copy_device_async(y, out.view(0, x.bytes), s) }
    }

    /// The names of the arms layer `layer` can run (`bf16`, `nvfp4 fixed (W4A4)`, ...: the
    /// overlays the pack holds for it), or None for a layer the pack lacks.
    pub fn arm_names(&self, layer: usize) -> Option<Vec<&'static str>> {
        let ov = super::arms::layer_overlays(&self.pack, layer).ok()?;
        Some(super::arms::arm_names(ov))
    }

    /// Layer `layer` through the named arm (one of [`arm_names`](Self::arm_names)) on host rows
    /// `x` (f32 `[rows, hidden]`): the output rows. The arm's layer and context are built for
    /// the call and freed after it (a quality run comparing arms; an engine runs `forward`).
    pub fn forward_arm(&self, layer: usize, arm: &str, x: &[f32]) -> Result<Vec<f32>> {
        let _ = self.backend.synchronize(self.ctx.stream);
        super::arms::run_arm(&self.backend, &self.pack, layer, arm, x)
    }

    /// The device tensor `name` (see [`LoadedPack::device_tensor`]).
    pub fn device_tensor(&self, name: &str) -> Option<DeviceTensor<'_>> {
        self.pack.device_tensor(name)
    }

    /// The backend the model lives on.
    pub fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }
}

impl Drop for LoadedModel {
    /// Waits for the stream, then frees the device segment; the layers and the context free
    /// their own buffers as they drop.
    fn drop(&mut self) {
        let _ = self.backend.synchronize(self.ctx.stream);
        self.layers.clear();
        self.backend.free(self.pack.arena);
    }
}
