//! `affine`: integer codes (4 or 8 bits) with a half scale and offset or zero point per group: GGUF
//! Q4_0/Q4_1/Q8_0, AutoAWQ, GPTQ and compressed-tensors integer weights carried as they are. One
//! folder holds the whole layout; each file stands in the layer of what it implements
//! (`tests/layering.rs`) and is mounted by that layer's registry:
//! - `arms.rs`: the launches its arms make (inherent methods of `DenseFfnLayer`);
//! - `bench.rs`: its `bench-gpu` arms (harness only);
//! - `check_kernels.rs`: its `gpu-check` kernel rows (harness only);
//! - `check_layers.rs`: its `gpu-check` layer arms (harness only);
//! - `check_load.rs`: its `gpu-check` load rows and start-up arms (harness only);
//! - `codec.rs`: its bytes: encode and decode, pure CPU (`converters::layouts::affine`);
//! - `groups.rs`: its integer groups (taking `converters::int_source` from the readers);
//! - `host.rs`: the host backend's calls of its twins;
//! - `kernels.rs`: its CUDA modules by name (`gpu::kernels`);
//! - `runtime.rs`: its weight type, key, validators, install, arm rows and named arms (`ffn`
//!   runtime registry);
//! - `sizes.rs`: its block and tile sizes, shared with its kernels (`gpu::sizes`);
//! - `spec.rs`: its `LayoutSpec` (`layout` registry);
//! - `testing.rs`: random weights in its overlay (`testing`, harness only);
//! - `twin.rs`: the CPU twins of its kernels (`gpu::reference`);
//! - `kernels.cu`: its CUDA module.

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
pub mod groups;
pub(crate) mod host;
pub mod kernels;
pub mod runtime;
pub mod sizes;
pub mod spec;
#[cfg(feature = "harness")]
pub mod testing;
pub mod twin;
