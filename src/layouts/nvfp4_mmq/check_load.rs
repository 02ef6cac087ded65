//! Its part of `gpu-check`'s load section (`check::load`): the MMQ tiles loaded against start-up's
//! repack, and finalize with nothing to repack.

use crate::check::Row;
use crate::check::load::{Fixture, LoadRows, StartupArm, nothing_built};
use crate::ffn::ForwardContext;
use crate::gpu::{GpuBackend, ModelLevers};
use crate::layout::Layout;
use crate::loader::LayerOverlays;
use crate::testing::{Rand, install_nvfp4_t};
use std::sync::Arc;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[StartupArm {
    name: "nvfp4_mmq",
    layout: Layout::Nvfp4Mmq,
    gelu_rows: None,
    install: |b, l, w, c, _| {
        // Start-up: the _t copies, then the GPU repack of finalize_nvfp4_mmq_load.
        install_nvfp4_t(b, l, w)?;
        l.finalize_nvfp4_mmq_load(c, w.hidden, w.inter, 0)
            .map(|_| ())
    },
}];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[repack_row];

/// A pack holding nvfp4_mmq: finalize_nvfp4_mmq_load has nothing to repack.
fn repack_row(
    b: &Arc<dyn GpuBackend>,
    fx: &Fixture,
    ov: &LayerOverlays,
    io: &str,
    _: &mut Rand,
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
