//! Its part of `gpu-check`'s load section (`check::load`): the BF16 overlay loaded against start-
//! up's.

use crate::check::load::{LoadRows, StartupArm};
use crate::testing::install_bf16;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[StartupArm {
    name: "bf16",
    layout: crate::layout::Layout::Bf16,
    gelu_rows: None,
    install: |b, l, w, _, _| install_bf16(b, l, w),
}];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[];
