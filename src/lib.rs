//! metrale-pack: readers for GGUF and safetensors checkpoints, CPU block codecs, and (in later
//! issues) the pack container, its loader and the GPU runtime.

#[path = "../converters/mod.rs"]
pub mod converters;
pub mod ggml_type;
pub mod npy;

pub use ggml_type::GgmlType;
