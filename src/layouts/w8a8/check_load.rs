//! Its part of `gpu-check`'s load section (`check::load`): the W8A8 overlay loaded against start-
//! up's.

use crate::check::load::{LoadRows, StartupArm};
use crate::testing::install_w8a8;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[StartupArm {
    name: "w8a8",
    layout: crate::layout::Layout::W8a8,
    gelu_rows: None,
    install: |b, l, w, _, _| install_w8a8(b, l, w),
}];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[];
