//! metrale-pack: readers for GGUF and safetensors checkpoints, CPU block codecs, and (in later
//! issues) the pack container, its loader and the GPU runtime.

pub mod atomic;
#[path = "../converters/mod.rs"]
pub mod converters;

pub mod check;
pub mod error;
pub mod ffn;
pub mod fuzzing;
pub mod gen_model;
pub mod ggml_type;
pub mod gguf;
pub mod gguf_write;
pub mod gpu;
pub mod layout;
pub mod loader;
pub mod model;
pub mod npy;
pub mod pack;
pub use pack::check as pack_check;
pub mod safetensors_file;

pub use error::{Error, Result};
pub use ggml_type::GgmlType;
