//! Its part of `gpu-check`'s load section (`check::load`): the FP8 overlay loaded against start-
//! up's.

use crate::check::load::{LoadRows, StartupArm};
use crate::testing::install_fp8;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[StartupArm {
    name: "fp8",
    layout: crate::layout::Layout::Fp8,
    gelu_rows: None,
    install: |b, l, w, _, _| install_fp8(b, l, w, true),
}];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[];
