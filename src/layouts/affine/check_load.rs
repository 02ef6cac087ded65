//! Its part of `gpu-check`'s load section (`check::load`): none yet (its packs load as every
//! layout's do: the copy rows).

use crate::check::load::{LoadRows, StartupArm};

/// Its start-up arms: the pack's overlays against the layer start-up builds.
pub(crate) static STARTUP: &[StartupArm] = &[];

/// Its own rows on a loaded pack.
pub(crate) static ROWS: &[LoadRows] = &[];
