//! `nvfp4_mmq`: NVFP4 repacked into the MMQ prefill tiles, beside the `nvfp4` base: given by a
//! pack, or built at load by `finalize_nvfp4_mmq_load` (the NVFP4 arms read them when held).

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::*;

use crate::gpu::sizes::*;
use crate::gpu::{DevicePtr, GpuError, GpuResult, StreamId};
use crate::model::Activation;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `nvfp4_mmq`: the MMQ tiles, per projection (held while any is).
    pub const NVFP4_MMQ: Key<[Option<DevicePtr>; 3]> = Key::new(Layout::Nvfp4Mmq);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Nvfp4Mmq,
    builds_on: Some(Layout::Nvfp4),
    install,
    arms: &[],
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 1] = [NamedArm::new(
    "nvfp4_mmq",
    &[Layout::Nvfp4, Layout::Nvfp4Mmq],
    44,
)];

/// Tiles from the pack: `finalize_nvfp4_mmq_load` then has nothing to repack.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    l.set_nvfp4_mmq_tiles(o.get(key::NVFP4_MMQ).copied().unwrap_or_default())
}

impl DenseFfnLayer {
    /// Install `nvfp4_mmq` tiles given by a pack (what `finalize_nvfp4_mmq_load` would build),
    /// per projection. Needs the `nvfp4` base first; each buffer must hold the tiles of that
    /// projection's padded shape.
    pub fn set_nvfp4_mmq_tiles(&mut self, tiles: [Option<DevicePtr>; 3]) -> GpuResult<()> {
        let w = self.nvfp4_base("set_nvfp4_mmq_tiles")?;
        for (p, (t, base)) in tiles.iter().zip(w.iter()).enumerate() {
            let np = base.n.div_ceil(NVFP4_MMQ_TILE_N) * NVFP4_MMQ_TILE_N;
            if let Some(t) = t
                && (!base.kp.is_multiple_of(NVFP4_MMQ_TILE_K)
                    || !fits(
                        t.bytes,
                        &[
                            np / NVFP4_MMQ_TILE_N,
                            base.kp / NVFP4_MMQ_TILE_K,
                            NVFP4_MMQ_TILE_BYTES,
                        ],
                    ))
            {
                return Err(GpuError::Shape(format!(
                    "set_nvfp4_mmq_tiles projection {p}: {} bytes do not hold the nvfp4_mmq tiles of [{np}, {}]",
                    t.bytes, base.kp
                )));
            }
        }
        self.overlays.set_slots(key::NVFP4_MMQ, tiles);
        Ok(())
    }

    /// Load-time setup of the NVFP4 MMQ prefill arm: repack gate and up (and down unless
    /// `METRALE_NO_FFN_NVFP4_MMQ_DOWN`) into the `nvfp4_mmq` tiles on the GPU, synchronize, and
    /// free the `_t` copies of what it repacked. Returns at once (false) for FP8 (or packed-Q2)
    /// layers, GELU layers, a missing kernel, `METRALE_NO_FFN_NVFP4_MMQ`, a layer without NVFP4
    /// weights, and for each projection whose tiles were given (a pack). True when it repacked.
    pub fn finalize_nvfp4_mmq_load(
        &mut self,
        ctx: &mut ForwardContext,
        h: usize,
        inter: usize,
        stream: StreamId,
    ) -> GpuResult<bool> {
        if self.holds(Layout::Fp8)
            || self.holds(Layout::Q2g128)
            || self.activation == Activation::Gelu
            || !self.kernels.nvfp4_repack.ok()
            || ctx.levers.no_ffn_nvfp4_mmq
        {
            return Ok(false);
        }
        let Some(&w) = self.get(key::NVFP4) else {
            return Ok(false);
        };
        self.check_dims("finalize_nvfp4_mmq_load", h, inter)?;
        let count = if ctx.levers.no_ffn_nvfp4_mmq_down {
            2
        } else {
            3
        };
        let mut did = false;
        let mut tiles = self.get(key::NVFP4_MMQ).copied().unwrap_or_default();
        for (p, &x) in w.iter().enumerate().take(count) {
            if tiles[p].is_some() {
                continue;
            }
            let np = round_up(x.n, 128);
            let out = ctx.backend.alloc(
                (np / NVFP4_MMQ_TILE_N * x.kp / NVFP4_MMQ_TILE_K * NVFP4_MMQ_TILE_BYTES) as u64,
            )?;
            self.allocated.push(out);
            let call = self.kernels.nvfp4_repack.call();
            let call = call.ptr("codes", x.codes).ptr("scales", x.scales);
            let l = call
                .dim("n", x.n)
                .dim("np", np)
                .dim("kp", x.kp)
                .ptr("out", out);
            let l = l.finish()?;
            ctx.record(l.spec.name);
            l.run(ctx.backend.as_ref(), stream)?;
            tiles[p] = Some(out);
            did = true;
        }
        self.overlays.set_slots(key::NVFP4_MMQ, tiles);
        if did {
            ctx.backend.synchronize(stream)?;
            self.drop_t_copies(ctx.backend.as_ref(), count);
        }
        Ok(did)
    }
}
