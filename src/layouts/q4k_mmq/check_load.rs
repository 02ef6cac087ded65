//! Its part of `gpu-check`'s load section (`check::load`): finalize with nothing to build, and the
//! loaded layer on CUDA against the host backend.

use crate::check::load::{Fixture, LoadRows, StartupArm, nothing_built};
use crate::check::{Row, cuda_vs_host_err, push};
use crate::ffn::{DenseFfnLayer, ForwardContext};
use crate::gpu::host::HostBackend;
use crate::gpu::{GpuBackend, GpuResult, ModelLevers, download_f32, upload_f32};
use crate::layout::Layout;
use crate::loader::{self, LayerOverlays, LoadOptions};
use crate::testing::Rand;
use std::sync::Arc;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[pack_vs_host];

/// A pack holding q4k_mmq (and lora): finalize_q4k_load has nothing to build, and the layer
/// from the pack (Q4_K MMQ prefill, int8 down, the adapter on both) agrees with the host backend
/// given the same pack.
fn pack_vs_host(
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
