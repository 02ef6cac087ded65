//! The layer's kernels: the resolved kernel table ([`crate::gpu::table`]), whose descriptions
//! give every launch its argument order, grid, row cap and activation rounding.

use crate::gpu::GpuError;

/// Every kernel the layer may launch, resolved once at construction.
pub type FfnKernels = crate::gpu::table::Kernels;

/// A declared activation format that means NVFP4 activations.
pub(crate) fn declared_a4(f: &str) -> bool {
    matches!(f, "w4a4" | "a4" | "nvfp4")
}

pub(crate) fn missing(module: &str, name: &str) -> GpuError {
    GpuError::MissingKernel {
        module: module.into(),
        name: name.into(),
    }
}
