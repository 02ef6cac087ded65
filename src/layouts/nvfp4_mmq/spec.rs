//! `nvfp4_mmq`: the NVFP4 weights as the MMQ prefill's interleaved tiles.

use crate::converters::layouts::{nvfp4, nvfp4_mmq};
use crate::error::Result;
use crate::ffn::{LayerOverlays, key};
use crate::layout::*;
use crate::layouts::nvfp4::spec::{KEEPS_NVFP4, decode_base, from_base, keeps_nvfp4};
use crate::manifest::ConvertOptions;
use crate::model::Activation;
use crate::model::{FfnWeight, Model};

pub struct Nvfp4Mmq;

impl LayoutSpec for Nvfp4Mmq {
    fn gelu_refusal(&self) -> Option<&'static str> {
        Some("layout nvfp4_mmq is not built for GELU layers (finalize_nvfp4_mmq_load skips them)")
    }
    fn keeps(&self, _: &Model, w: &FfnWeight, _: bool, _: &ConvertOptions) -> bool {
        keeps_nvfp4(w)
    }
    // SiLU layers hold the MMQ tiles after start-up (`finalize_nvfp4_mmq_load` builds them and frees the `_t` copies).
    fn float_default(&self, act: Activation) -> bool {
        act == Activation::Silu
    }
    fn keeps_what(&self) -> &'static str {
        KEEPS_NVFP4
    }
    fn layout(&self) -> Layout {
        Layout::Nvfp4Mmq
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &[""]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([ru(n, nvfp4_mmq::TILE_N)?, ru(k, nvfp4::K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], _: u64) -> Option<u64> {
        match part {
            "" => (np / nvfp4_mmq::TILE_N as u64)
                .checked_mul(kp / nvfp4_mmq::TILE_K as u64)?
                .checked_mul(nvfp4_mmq::TILE_BYTES as u64),
            _ => None,
        }
    }
    fn scalar_names(&self) -> &'static [&'static str] {
        &["global_scale"]
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        from_base(cx, proj, nvfp4_mmq::from_nvfp4)
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, _], [np, kp]) = (b.shape, b.padded);
        let (c, s) = nvfp4_mmq::to_nvfp4(b.part("")?, n, np, kp);
        Ok(decode_base(b, &c, &s))
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        let tiles = [Proj::Gate, Proj::Up, Proj::Down].map(|p| v.get(p, "").map(|(t, _)| t));
        o.overlays.set_slots(key::NVFP4_MMQ, tiles);
    }
}
