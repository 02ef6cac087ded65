//! Binding: each layer's overlays described from the manifest as views into the arena (every
//! layout of the registry binds its own), and installed through the layer's `set_*` methods.

use crate::converters::layouts::{Layout, Proj};
pub use crate::ffn::LayerOverlays;
use crate::gpu::{DevicePtr, GpuError, GpuResult};
use crate::pack::{FfnEntry, Pack};
use std::collections::HashMap;

/// Describe every layer's overlays from the manifest, as views into `arena`.
/// `pieces` says where each loaded range of the pack lies in the arena (blobs of ranks not
/// loaded are skipped); `inter` is the intermediate size of the loaded rank's layer.
pub fn overlays(
    pack: &Pack,
    arena: DevicePtr,
    pieces: &[(u64, u64, u64)],
    inter: usize,
) -> GpuResult<Vec<LayerOverlays>> {
    let m = &pack.manifest;
    let mut by: HashMap<(usize, Layout, Proj, String), (DevicePtr, &FfnEntry)> = HashMap::new();
    for (i, e) in m.tensors.iter().enumerate() {
        let Some(fe) = &e.ffn else { continue };
        let t = &pack.file.tensors[i];
        let Some(off) = super::arena_offset(pieces, t.offset, t.bytes) else {
            continue;
        };
        let view = arena.view(off, t.bytes);
        let layout = Layout::from_tag(&fe.layout).ok_or_else(|| {
            GpuError::Invalid(format!("{}: unknown layout {}", e.name, fe.layout))
        })?;
        let proj = Proj::from_name(&fe.proj).ok_or_else(|| {
            GpuError::Invalid(format!("{}: unknown projection {}", e.name, fe.proj))
        })?;
        by.insert((fe.layer, layout, proj, fe.part.clone()), (view, fe));
    }
    let mut layers: Vec<usize> = by.keys().map(|k| k.0).collect();
    layers.sort();
    layers.dedup();
    let mut out = Vec::new();
    let specs = crate::layout::specs();
    for l in layers {
        let mut o = LayerOverlays {
            index: l,
            ..Default::default()
        };
        // Each layout of the registry binds its own overlays from this layer's views.
        for &spec in specs.iter() {
            let lay = spec.layout();
            let get = |p: Proj, part: &str| by.get(&(l, lay, p, part.to_string())).copied();
            spec.bind(&crate::layout::LayerViews { inter, get: &get }, &mut o);
        }
        out.push(o);
    }
    Ok(out)
}
