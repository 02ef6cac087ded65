//! Its part of `gpu-check`'s load section (`check::load`): the adapter loaded against the same
//! adapter installed at start-up.

use crate::check::load::{LoadRows, StartupArm};
use crate::testing::install_nvfp4;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[StartupArm {
    name: "lora",
    layout: crate::layout::Layout::Lora,
    gelu_rows: None,
    install: |b, l, w, _, fx| {
        // Start-up: the same adapter encoded and installed through set_lora_weights.
        install_nvfp4(b, l, w)?;
        fx.adapter.install(b, l)
    },
}];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[];
