//! The library's error type. Every variant names one way an input can be wrong, and carries the
//! file (and where it applies the tensor and field) so the message stands on its own.
//! The codecs' and the GPU runtime's error enums live here too (re-exported from
//! `converters` and `gpu`), so this module imports nothing above it.

use crate::ggml_type::GgmlType;

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong reading a checkpoint or decoding a tensor.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The OS refused an open, map or read.
    #[error("{file}: {err}")]
    Io {
        /// The file (its path as given).
        file: String,
        /// The underlying error.
        err: std::io::Error,
    },
    /// A field runs past the end of the file.
    #[error("{file}: truncated: {field} at byte {offset} needs {need} bytes, {left} left")]
    Truncated {
        /// The file (its path as given).
        file: String,
        /// The field being read.
        field: String,
        /// Where the field starts (byte offset).
        offset: u64,
        /// Bytes the field needs.
        need: u64,
        /// Bytes left in the file.
        left: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("{file}: not a GGUF file: magic {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The file (its path as given).
        file: String,
        /// The bytes found.
        found: Vec<u8>,
    },
    /// A byte-swapped (big-endian) GGUF.
    #[error("{file}: big-endian GGUF files are not supported")]
    BigEndian {
        /// The file (its path as given).
        file: String,
    },
    /// A GGUF version other than 2 or 3.
    #[error("{file}: GGUF version {version} is not supported (2 and 3 are)")]
    Version {
        /// The file (its path as given).
        file: String,
        /// The version found.
        version: u32,
    },
    /// A count or length that the rest of the file cannot hold.
    #[error("{file}: {field}: count {count} needs at least {need} bytes, only {left} remain")]
    Count {
        /// The file (its path as given).
        file: String,
        /// The field being read.
        field: String,
        /// The count read.
        count: u64,
        /// Bytes the field needs.
        need: u128,
        /// Bytes left in the file.
        left: u64,
    },
    /// A string that is not UTF-8.
    #[error("{file}: {field}: not valid UTF-8")]
    Utf8 {
        /// The file (its path as given).
        file: String,
        /// The field being read.
        field: String,
    },
    /// A metadata value type id GGUF does not define.
    #[error("{file}: {field}: unknown metadata value type {ty}")]
    ValueType {
        /// The file (its path as given).
        file: String,
        /// The field being read.
        field: String,
        /// The type id read.
        ty: u32,
    },
    /// Arrays of arrays nested past the limit.
    #[error("{file}: {field}: arrays nested deeper than {max} levels")]
    Nesting {
        /// The file (its path as given).
        file: String,
        /// The field being read.
        field: String,
        /// The nesting limit.
        max: usize,
    },
    /// The same metadata key twice.
    #[error("{file}: metadata key {key} appears twice")]
    DuplicateKey {
        /// The file (its path as given).
        file: String,
        /// The metadata key.
        key: String,
    },
    /// A metadata key with the wrong type or value.
    #[error("{file}: metadata {key}: {reason}")]
    Metadata {
        /// The file (its path as given).
        file: String,
        /// The metadata key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor info field that is invalid on its own or against the file.
    #[error("{file}: tensor {tensor}: {field}: {reason}")]
    Tensor {
        /// The file (its path as given).
        file: String,
        /// The tensor's name.
        tensor: String,
        /// The field being read.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The same tensor name twice (within a file or across split shards).
    #[error("{file}: tensor name {tensor} appears twice")]
    DuplicateTensor {
        /// The file (its path as given).
        file: String,
        /// The tensor's name.
        tensor: String,
    },
    /// Two tensors' data ranges overlap.
    #[error("{file}: tensors {a} and {b} overlap in the data section")]
    Overlap {
        /// The file (its path as given).
        file: String,
        /// The first tensor.
        a: String,
        /// The second tensor.
        b: String,
    },
    /// A split (sharded) GGUF whose shards do not agree.
    #[error("{file}: split model: {reason}")]
    Split {
        /// The file (its path as given).
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A safetensors header the safetensors crate (or our checks) rejected.
    #[error("{file}: safetensors: {reason}")]
    Safetensors {
        /// The file (its path as given).
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A JSON side file (`config.json`, `*.index.json`) that is missing a field or malformed.
    #[error("{file}: {field}: {reason}")]
    Json {
        /// The file (its path as given).
        file: String,
        /// The field being read.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A quantized weight's companion tensors disagree with it.
    #[error("{file}: tensor {tensor}: {reason}")]
    Quantized {
        /// The file (its path as given).
        file: String,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// No tensor or FFN weight of that name.
    #[error("{file}: no tensor named {tensor}")]
    NotFound {
        /// The file (its path as given).
        file: String,
        /// The tensor's name.
        tensor: String,
    },
    /// The tensor's type cannot be decoded.
    #[error("{file}: tensor {tensor}: {err}")]
    Codec {
        /// The file (its path as given).
        file: String,
        /// The tensor's name.
        tensor: String,
        /// The underlying error.
        err: CodecError,
    },
    /// An output path that would destroy an input, or cannot be written.
    #[error("{file}: refusing to write: {reason}")]
    Output {
        /// The file (its path as given).
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// Writing an output failed partway (the OS refused a write, fsync or rename); nothing is
    /// left at the output path.
    #[error("{file}: {step}: {err}")]
    Write {
        /// The file (its path as given).
        file: String,
        /// The step that failed (write, fsync or rename).
        step: &'static str,
        /// The underlying error.
        err: std::io::Error,
    },
    /// The GPU runtime refused (a check or load run on a device).
    #[error("GPU: {0}")]
    Gpu(#[from] GpuError),
    /// An input changed (shrank, or was replaced) while it was being read.
    #[error("{file}: {reason}")]
    Changed {
        /// The file (its path as given).
        file: String,
        /// What changed and which bytes were lost.
        reason: String,
    },
    /// The input is not something this tool reads.
    #[error("{file}: {reason}")]
    Unsupported {
        /// The file (its path as given).
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A convert stopped before it finished (`pack::convert_until`'s flag: a signal, a
    /// progress callback that raised): its temporary file is removed, nothing is written.
    #[error("{file}: convert stopped before it finished; nothing was written")]
    Interrupted {
        /// The output (its path as given).
        file: String,
    },
    /// A caller's argument (not a file's number) out of the range the library takes:
    /// `max_rows` past [`crate::ffn::MAX_FORWARD_ROWS`], a layer the pack lacks.
    #[error("{name}: {reason}")]
    Argument {
        /// The argument, as the caller's API names it.
        name: String,
        /// Its value and the range taken.
        reason: String,
    },
    /// A layout's spec or runtime (`layout::register`, `ffn::register`) was refused.
    #[error("registering {what}: {reason}")]
    Register {
        /// The layout tag or arm name.
        what: String,
        /// Why.
        reason: String,
    },
}

/// Why a buffer could not be decoded (`crate::converters`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// The type has no decoder in this crate (TQ*, Q8_K, Q1_0).
    #[error(
        "decoding {0} is not supported (supported: F32, F16, BF16, I8..F64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4, NVFP4)"
    )]
    Unsupported(GgmlType),
    /// The byte length is not what `n` elements of the type take.
    #[error("{ty}: {bytes} bytes do not hold {elems} elements")]
    Length {
        /// The tensor type.
        ty: GgmlType,
        /// Bytes given.
        bytes: usize,
        /// Elements asked for.
        elems: usize,
    },
}

/// Runtime errors (`crate::gpu`).
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No device, no driver, or the driver refused to start.
    #[error("no CUDA device available: {0}")]
    NoDevice(String),
    /// A path needed a kernel that did not resolve.
    #[error("kernel {module}::{name} is not available (the path that needs it cannot run)")]
    MissingKernel {
        /// Its module.
        module: String,
        /// Its entry point.
        name: String,
    },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC failed compiling kernels/{module}.cu for {arch}:\n{log}")]
    Compile {
        /// The module.
        module: String,
        /// The target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A driver or cuBLAS call failed.
    #[error("CUDA error in {call}: {msg}")]
    Cuda {
        /// The call.
        call: String,
        /// What the driver said.
        msg: String,
    },
    /// A size does not fit: weights against the layer's hidden and intermediate sizes, rows
    /// against the context's, a buffer against what it must hold.
    #[error("{0}")]
    Shape(String),
    /// An install out of order or against an installed overlay (the NVFP4 base first; LoRA
    /// only beside the NVFP4 arms).
    #[error("{0}")]
    Order(String),
    /// No installed weights and resolved kernels serve this call (rows, activation, or no
    /// weights at all): install another layout, or call with other rows.
    #[error("{0}")]
    NotServed(String),
    /// Any other argument the runtime cannot take (a kernel launch against its table, a
    /// handle the backend does not know): a caller's bug, not a condition to handle.
    #[error("{0}")]
    Invalid(String),
}

/// Result of the runtime.
pub type GpuResult<T> = std::result::Result<T, GpuError>;
