//! The library's error type. Every variant names one way an input can be wrong, and carries the
//! file (and where it applies the tensor and field) so the message stands on its own.

use crate::converters::CodecError;

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading a checkpoint or decoding a tensor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS refused an open, map or read.
    #[error("{file}: {err}")]
    Io { file: String, err: std::io::Error },
    /// A field runs past the end of the file.
    #[error("{file}: truncated: {field} at byte {offset} needs {need} bytes, {left} left")]
    Truncated {
        file: String,
        field: String,
        offset: u64,
        need: u64,
        left: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("{file}: not a GGUF file: magic {found:02x?}, expected \"GGUF\"")]
    BadMagic { file: String, found: Vec<u8> },
    /// A byte-swapped (big-endian) GGUF.
    #[error("{file}: big-endian GGUF files are not supported")]
    BigEndian { file: String },
    /// A GGUF version other than 2 or 3.
    #[error("{file}: GGUF version {version} is not supported (2 and 3 are)")]
    Version { file: String, version: u32 },
    /// A count or length that the rest of the file cannot hold.
    #[error("{file}: {field}: count {count} needs at least {need} bytes, only {left} remain")]
    Count {
        file: String,
        field: String,
        count: u64,
        need: u128,
        left: u64,
    },
    /// A string that is not UTF-8.
    #[error("{file}: {field}: not valid UTF-8")]
    Utf8 { file: String, field: String },
    /// A metadata value type id GGUF does not define.
    #[error("{file}: {field}: unknown metadata value type {ty}")]
    ValueType {
        file: String,
        field: String,
        ty: u32,
    },
    /// Arrays of arrays nested past the limit.
    #[error("{file}: {field}: arrays nested deeper than {max} levels")]
    Nesting {
        file: String,
        field: String,
        max: usize,
    },
    /// The same metadata key twice.
    #[error("{file}: metadata key {key} appears twice")]
    DuplicateKey { file: String, key: String },
    /// A metadata key with the wrong type or value.
    #[error("{file}: metadata {key}: {reason}")]
    Metadata {
        file: String,
        key: String,
        reason: String,
    },
    /// A tensor info field that is invalid on its own or against the file.
    #[error("{file}: tensor {tensor}: {field}: {reason}")]
    Tensor {
        file: String,
        tensor: String,
        field: &'static str,
        reason: String,
    },
    /// The same tensor name twice (within a file or across split shards).
    #[error("{file}: tensor name {tensor} appears twice")]
    DuplicateTensor { file: String, tensor: String },
    /// Two tensors' data ranges overlap.
    #[error("{file}: tensors {a} and {b} overlap in the data section")]
    Overlap { file: String, a: String, b: String },
    /// A split (sharded) GGUF whose shards do not agree.
    #[error("{file}: split model: {reason}")]
    Split { file: String, reason: String },
    /// A safetensors header the safetensors crate (or our checks) rejected.
    #[error("{file}: safetensors: {reason}")]
    Safetensors { file: String, reason: String },
    /// A JSON side file (`config.json`, `*.index.json`) that is missing a field or malformed.
    #[error("{file}: {field}: {reason}")]
    Json {
        file: String,
        field: String,
        reason: String,
    },
    /// A quantized weight's companion tensors disagree with it.
    #[error("{file}: tensor {tensor}: {reason}")]
    Quantized {
        file: String,
        tensor: String,
        reason: String,
    },
    /// No tensor or FFN weight of that name.
    #[error("{file}: no tensor named {tensor}")]
    NotFound { file: String, tensor: String },
    /// The tensor's type cannot be decoded.
    #[error("{file}: tensor {tensor}: {err}")]
    Codec {
        file: String,
        tensor: String,
        err: CodecError,
    },
    /// An output path that would destroy an input, or cannot be written.
    #[error("{file}: refusing to write: {reason}")]
    Output { file: String, reason: String },
    /// Writing an output failed partway (the OS refused a write, fsync or rename); nothing is
    /// left at the output path.
    #[error("{file}: {step}: {err}")]
    Write {
        file: String,
        step: &'static str,
        err: std::io::Error,
    },
    /// The GPU runtime refused (a check or load run on a device).
    #[error("GPU: {0}")]
    Gpu(#[from] crate::gpu::GpuError),
    /// The input is not something this tool reads.
    #[error("{file}: {reason}")]
    Unsupported { file: String, reason: String },
}
