//! The host twins of none (its GEMMs are `nvfp4`'s), through `gpu::reference`.

use crate::gpu::host::impls::Twin;

/// Its kernels' host twins: none of its own.
pub(crate) static TWINS: &[(&[&str], Twin)] = &[];
