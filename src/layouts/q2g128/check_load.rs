//! Its part of `gpu-check`'s load section (`check::load`): the q2g128 overlay loaded against start-
//! up's.

use crate::check::load::{LoadRows, StartupArm};
use crate::testing::install_q2;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[StartupArm {
    name: "q2",
    layout: crate::layout::Layout::Q2g128,
    gelu_rows: Some(&[1, 2, 3]),
    install: |b, l, w, _, _| install_q2(b, l, w),
}];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[];
