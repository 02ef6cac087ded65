#![deny(missing_docs)]
//! metrale-pack: readers for GGUF and safetensors checkpoints, CPU block codecs, the pack
//! container and its layouts (`pack`, `layout`), the fast-start loader (`loader`), the GPU
//! runtime with its CUDA and host backends (`gpu`) and the dense FFN layer (`ffn`). The check
//! and bench harness, the test-data generators and the fuzz harnesses (`check`, `testing`,
//! `fuzzing`) are built only with the default `harness` feature.
//!
//! # What an engine uses
//!
//! The items re-exported at the crate root are the engine's API (`examples/engine.rs` loads and
//! runs a pack through them):
//!
//! - open and check a pack: [`Pack::open`], [`Pack::verify_checksums`];
//! - load it in one call: [`LoadedModel::load`] with [`EngineOptions`] (every device tensor with
//!   its layout, padded shape and manifest entry; every layer installed and probed; freed on
//!   drop), then [`LoadedModel::forward`] or the layers themselves ([`DenseFfnLayer`] with a
//!   [`ForwardContext`]);
//! - the runtime: [`GpuBackend`] ([`CudaBackend`], [`HostBackend`]);
//! - errors by kind: [`Error`] (files) and [`GpuError`] (`Shape`, `Order`, `NotServed`, ...);
//! - a layout of the engine's own: [`layout::register`] (its spec) and [`ffn::register`] (its
//!   runtime), the route every built-in layout takes;
//! - converting: [`Model::open`], [`convert`], [`ConvertOptions`].
//!
//! The other modules (readers, writers, codecs, crash-safe output) are public for the
//! `metrale-pack` command line, the tests and tools that read the formats themselves; those
//! not needed to read or write a format are hidden from these docs.

/// The README's Rust block, compiled as a doctest (`scripts/test.sh` runs `cargo test --doc`),
/// so the API it shows is the crate's.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctest;

#[doc(hidden)]
pub mod atomic;
#[path = "../converters/mod.rs"]
pub mod converters;

#[cfg(feature = "harness")]
pub mod check;
pub mod error;
pub mod ffn;
#[cfg(feature = "harness")]
pub mod fuzzing;
pub mod ggml_type;
pub mod gguf;
pub mod gguf_write;
pub mod gpu;
pub mod layout;
#[doc(hidden)]
pub mod layouts;
pub mod loader;
pub mod manifest;
#[doc(hidden)]
pub mod mapguard;
pub mod model;
pub mod name;
#[doc(hidden)]
pub mod npy;
pub mod options;
pub mod pack;
#[doc(hidden)]
pub use pack::check as pack_check;
pub mod safetensors_file;

pub use error::{Error, GpuError, Result};
pub use ffn::{DenseFfnLayer, ForwardContext};
pub use ggml_type::GgmlType;
pub use gpu::cuda::CudaBackend;
pub use gpu::host::HostBackend;
pub use gpu::{GpuBackend, GpuResult};
pub use loader::{EngineOptions, LoadedModel};
pub use manifest::ConvertOptions;
pub use model::Model;
pub use name::Name;
pub use options::ConvertRequest;
pub use pack::{Pack, convert};
#[cfg(feature = "harness")]
#[doc(hidden)]
pub mod testing;
