#![deny(missing_docs)]
//! metrale-pack: readers for GGUF and safetensors checkpoints, CPU block codecs, the pack
//! container and its layouts (`pack`, `layout`), the fast-start loader (`loader`), the GPU
//! runtime with its CUDA and host backends (`gpu`) and the dense FFN layer (`ffn`). The check
//! and bench harness, the test-data generators and the fuzz harnesses (`check`, `testing`,
//! `fuzzing`) are built only with the default `harness` feature.

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
pub mod loader;
pub mod manifest;
pub mod mapguard;
pub mod model;
pub mod npy;
pub mod pack;
pub use pack::check as pack_check;
pub mod safetensors_file;

pub use error::{Error, Result};
pub use ggml_type::GgmlType;
#[cfg(feature = "harness")]
#[doc(hidden)]
pub mod testing;
