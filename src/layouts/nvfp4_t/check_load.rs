//! Its part of `gpu-check`'s load section (`check::load`): the transposed copies loaded against
//! start-up's.

use crate::check::load::{LoadRows, StartupArm};
use crate::testing::install_nvfp4_t;

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[StartupArm {
    name: "nvfp4_t",
    layout: crate::layout::Layout::Nvfp4T,
    gelu_rows: None,
    install: |b, l, w, _, _| install_nvfp4_t(b, l, w),
}];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[];
