//! Its part of `gpu-check`'s load section (`check::load`): the NVFP4 base loaded against start-
//! up's.

use crate::check::load::{LoadRows, StartupArm};
use crate::testing::install_nvfp4;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[StartupArm {
    name: "nvfp4",
    layout: crate::layout::Layout::Nvfp4,
    gelu_rows: None,
    install: |b, l, w, _, _| install_nvfp4(b, l, w),
}];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[];
