//! `lora`: a PEFT adapter's A and B in BF16 with its scaling, beside the NVFP4 base. One folder
//! holds the whole layout; each file stands in the layer of what it implements
//! (`tests/layering.rs`) and is mounted by that layer's registry:
//! - `arms.rs`: the launches its arms make (inherent methods of `DenseFfnLayer`);
//! - `bench.rs`: its `bench-gpu` arms (harness only);
//! - `check_kernels.rs`: its `gpu-check` kernel rows (harness only; none of its own);
//! - `check_layers.rs`: its `gpu-check` layer arms (harness only);
//! - `check_load.rs`: its `gpu-check` load rows and start-up arms (harness only);
//! - `codec.rs`: its bytes: encode and decode, pure CPU (`converters::layouts::lora`);
//! - `host.rs`: the host backend's twins of its kernels (`gpu::host`);
//! - `kernels.rs`: its CUDA modules by name (`gpu::kernels`);
//! - `runtime.rs`: its weight type, key, validators, install, arm rows and named arms (`ffn`
//!   runtime registry);
//! - `spec.rs`: its `LayoutSpec` (`layout` registry);
//! - `testing.rs`: random weights in its overlay (`testing`, harness only);
//! - `twin.rs`: the CPU twins of its kernels (`gpu::reference`);
//! - `kernels.cu`: its CUDA module;
//! - `sizes` (empty): no sizes of its own.

pub(crate) mod arms;
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
pub mod kernels;
pub mod runtime;
pub mod spec;
#[cfg(feature = "harness")]
pub mod testing;
pub mod twin;
/// No sizes of its own.
pub mod sizes {
    /// None.
    pub const DEFINES: &[(&str, usize)] = &[];
    /// None.
    pub mod consts {}
}
