//! The pack: one GGUF v3 file holding a model's passthrough tensors byte for byte and, for every
//! dense FFN layer, the weight layouts the engine's `DenseFfnLayer` overlays take. Every tensor
//! the engine puts on the GPU lies in one contiguous device segment in layer order (the
//! passthrough tensors named by `--host-tensors` lie before it), described by a manifest in
//! `metrale.pack.*` metadata (formats.md, "The pack container").
//!
//! Writing is streaming and crash-safe: the header is planned with placeholder sizes (all its
//! numeric fields are fixed-width, the manifest string is padded to a reserved length), tensor
//! data is written layer by layer to a temporary file, then the real header overwrites the
//! placeholder in place, the file is fsynced and renamed into place.

pub mod check;
pub mod choice;
mod dump;
mod plan;
mod read;
mod refusals;
pub mod tp;
mod verify;
mod write;

pub use crate::layout::default_layouts;
pub use crate::manifest::*;
pub use crate::model::lora::Lora;
pub use check::{check_header, check_manifest, header_digest, nonzero_padding};
pub use dump::{Dumped, Opened, dump_tensor};
pub use plan::Plan;
pub use read::{Pack, PartRule};
pub use verify::{SourceCheck, SourceReport, Verified, verify_against_source, verify_report};
pub use write::{Progress, SOURCE_FILES, convert, convert_until};

use crate::converters::layouts::{Layout, Proj};
use crate::gguf::GgufFile;
use crate::model::Format;

/// Version of the container and manifest; bumped on any incompatible change.
/// 2: the header checksum `metrale.pack.header_xxh3`; LoRA blobs only for targeted projections.
/// 3: the device segment holds every device tensor (the FFN blobs and the passthrough tensors
/// `--host-tensors` does not keep on the host), in layer order; each entry's `device` flag.
/// 4: tensors aligned by need: `general.alignment` 32, page placement by pad tensors.
pub const PACK_FORMAT_VERSION: u32 = 4;
/// Version of the layouts' contract with the GPU kernels that read them.
pub const KERNEL_ABI_VERSION: u32 = 1;
/// The GPU architecture the default layouts are built for.
pub const TARGET_ARCH: &str = "sm_90";
/// `general.alignment` of a pack: every tensor starts on a multiple of it (GGUF's default), so a
/// small tensor costs at most this much padding.
pub const PACK_ALIGNMENT: u64 = 32;
/// The data section, the device segment, each tensor-parallel range, every FFN blob and every
/// tensor of at least this many bytes start on a page (`PACK_PAGE`), so the loader can register
/// or read (O_DIRECT) any range of them, and the file ends on one.
pub const PACK_PAGE: u64 = 4096;
/// The name prefix of the zero-filled I8 tensors that place the next tensor on a page
/// (`metrale.pad.0`, `metrale.pad.1`, ...): in the tensor table, never in the manifest.
pub const PAD_PREFIX: &str = "metrale.pad.";
/// The converter's version.
pub const CONVERTER_VERSION: &str = env!("CARGO_PKG_VERSION");
/// ggml's name limit (`GGML_MAX_NAME` 64 with the NUL).
pub const MAX_NAME_LEN: usize = 63;
/// The name prefix of a tensor-table name that stands for a longer manifest name
/// ([`table_name`]).
pub const LONG_PREFIX: &str = "metrale.long.";

/// The name the pack's GGUF tensor table gives the tensor the manifest names `name`: the name
/// itself, or, where it is longer than GGUF readers accept ([`MAX_NAME_LEN`]: a bitsandbytes
/// quant state, a vision tower's weight), [`LONG_PREFIX`] then the xxh3-64 of the name in 16
/// hex digits (formats.md, "The pack container"). The manifest keeps the whole name.
pub fn table_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name.len() <= MAX_NAME_LEN {
        std::borrow::Cow::Borrowed(name)
    } else {
        let h = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        std::borrow::Cow::Owned(format!("{LONG_PREFIX}{h:016x}"))
    }
}

/// Metadata keys of the manifest.
pub mod keys {
    /// GGUF key: the pack format version.
    pub const FORMAT_VERSION: &str = "metrale.pack.format_version";
    /// GGUF key: the converter version.
    pub const CONVERTER_VERSION: &str = "metrale.pack.converter_version";
    /// GGUF key: the target architecture.
    pub const TARGET_ARCH: &str = "metrale.pack.target.arch";
    /// GGUF key: the kernel ABI.
    pub const KERNEL_ABI: &str = "metrale.pack.target.kernel_abi";
    /// GGUF key: the device segment's offset.
    pub const SEGMENT_OFFSET: &str = "metrale.pack.segment.offset";
    /// GGUF key: the device segment's length.
    pub const SEGMENT_BYTES: &str = "metrale.pack.segment.bytes";
    /// GGUF key: the manifest (JSON).
    pub const MANIFEST: &str = "metrale.pack.manifest";
    /// xxh3-64 of the header with these 8 value bytes as zeros; always the last KV.
    pub const HEADER_XXH3: &str = "metrale.pack.header_xxh3";
}

/// Pack tensor name of an FFN blob.
pub fn blob_name(layer: usize, proj: Proj, layout: Layout, part: &str) -> String {
    blob_name_tp(layer, proj, layout, part, None)
}

/// Pack tensor name of an FFN blob, of rank `rank`'s slice in a tensor-parallel pack
/// (`blk.3.ffn_gate.tp1.nvfp4.codes`).
pub fn blob_name_tp(
    layer: usize,
    proj: Proj,
    layout: Layout,
    part: &str,
    rank: Option<u32>,
) -> String {
    let tp = rank.map(|r| format!(".tp{r}")).unwrap_or_default();
    let base = format!("blk.{layer}.ffn_{}{tp}.{}", proj.name(), layout.tag());
    if part.is_empty() {
        base
    } else {
        format!("{base}.{part}")
    }
}

fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// Whether an opened GGUF is a pack.
pub fn is_pack(g: &GgufFile) -> bool {
    g.get(keys::FORMAT_VERSION).is_some()
}

/// The source format a pack came from.
pub fn source_format(m: &Manifest) -> Format {
    if m.source_format == "gguf" {
        Format::Gguf
    } else {
        Format::Safetensors
    }
}
