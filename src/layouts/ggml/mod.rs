//! `ggml`: the block-format engine (issue 56): a projection's GGUF blocks as the source stores
//! them, any type of the engine, any mix per projection, served by one GEMV whose types are a
//! function and a case line each. One folder holds the whole layout; each file stands in the
//! layer of what it implements (`tests/layering.rs`) and is mounted by that layer's registry:
//! - `arms.rs`: the launches its arms make (inherent methods of `DenseFfnLayer`);
//! - `bench.rs`: its `bench-gpu` kernel lines (harness only);
//! - `check_kernels.rs`: its `gpu-check` kernel rows (harness only);
//! - `check_layers.rs`: its `gpu-check` layer arms (harness only);
//! - `check_load.rs`: its `gpu-check` load rows and start-up arms (harness only);
//! - `grids.rs`: the IQ grids as CUDA arrays, generated from the converters' (`gpu`);
//! - `host.rs`: the host backend's calls of its twins;
//! - `codec.rs`: its bytes and the engine's types, pure CPU (`converters::layouts::ggml`);
//! - `kernels.rs`: its CUDA modules by name (`gpu::kernels`);
//! - `runtime.rs`: its weight type, key, validators, install, arm rows and named arms (`ffn`
//!   runtime registry);
//! - `sizes.rs`: its sizes, shared with its kernels (`gpu::sizes`);
//! - `spec.rs`: its `LayoutSpec` (`layout` registry);
//! - `testing.rs`: random weights in its overlay (`testing`, harness only);
//! - `twin.rs`: the CPU twin of its GEMV (`gpu::reference`);
//! - `kernels.cu`, `kernels_iq.cuh`, `kernels_stage.cuh`, `kernels_dequant.cuh`: its CUDA
//!   module (the IQ entries and the stages spliced in and the dequantization appended by
//!   `kernels.rs`).

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
pub mod grids;
pub(crate) mod host;
pub mod kernels;
pub mod runtime;
pub mod sizes;
pub mod spec;
#[cfg(feature = "harness")]
pub mod testing;
pub mod twin;
