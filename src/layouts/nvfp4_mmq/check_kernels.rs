//! Its kernel rows of `gpu-check` (`check::kernels`): none of its own (its kernels, if any,
//! are checked with the layout they build on).

use crate::check::kernels::Group;

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[];
