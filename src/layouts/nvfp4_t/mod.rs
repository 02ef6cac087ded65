//! `nvfp4_t`: the transposed NVFP4 copy of the `_t` prefill GEMMs. One folder holds the whole
//! layout; each file stands in the layer of what it implements (`tests/layering.rs`) and is mounted
//! by that layer's registry:
//! - `bench.rs`: its `bench-gpu` arms (harness only);
//! - `check_kernels.rs`: its `gpu-check` kernel rows (harness only; none of its own);
//! - `check_layers.rs`: its `gpu-check` layer arms (harness only);
//! - `check_load.rs`: its `gpu-check` load rows and start-up arms (harness only);
//! - `codec.rs`: its bytes: encode and decode, pure CPU (`converters::layouts::nvfp4_t`);
//! - `host.rs`: the host backend's twins of its kernels (`gpu::host`);
//! - `runtime.rs`: its weight type, key, validators, install, arm rows and named arms (`ffn`
//!   runtime registry);
//! - `spec.rs`: its `LayoutSpec` (`layout` registry);
//! - `testing.rs`: random weights in its overlay (`testing`, harness only);
//! - `kernels` (empty): its kernels are `nvfp4`'s;
//! - `sizes` (empty): no sizes of its own;
//! - `twin` (empty): its kernels are `nvfp4`'s.

#[cfg(feature = "harness")]
pub(crate) mod bench;
#[cfg(feature = "harness")]
pub(crate) mod check_kernels;
#[cfg(feature = "harness")]
pub(crate) mod check_layers;
#[cfg(feature = "harness")]
pub(crate) mod check_load;
pub mod codec;
pub(crate) mod host;
pub mod runtime;
pub mod spec;
#[cfg(feature = "harness")]
pub mod testing;
/// No CUDA module of its own (its kernels are `nvfp4`'s).
pub mod kernels {
    /// `(module, source)`: none.
    pub const MODULES: &[(&str, &str)] = &[];
}
/// No sizes of its own.
pub mod sizes {
    /// None.
    pub const DEFINES: &[(&str, usize)] = &[];
    /// None.
    pub mod consts {}
}
/// Its kernels are `nvfp4`'s (`src/layouts/nvfp4/kernels.cu`), and so are their twins.
pub mod twin {}
