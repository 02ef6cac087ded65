//! GGUF v2/v3 reader: zero-copy over a memory map, every field validated against the file.
//!
//! The rules (formats.md, "GGUF input"): magic `GGUF`, version 2 or 3 (little-endian only),
//! every count and length bounded by the bytes that remain before anything is allocated, arrays
//! nested at most [`MAX_ARRAY_NESTING`] deep, unique keys, `general.alignment` a u32 power of
//! two (default 32), at most [`MAX_DIMS`] dimensions, no element-count overflow, a known type id,
//! `ne[0]` a whole number of blocks, every tensor inside the file and aligned, no overlaps,
//! unique names.

use crate::GgmlType;
use crate::error::{Error, Result};
use memmap2::Mmap;
use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The magic at byte 0.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Most tensor dimensions (ggml `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays inside arrays.
pub const MAX_ARRAY_NESTING: usize = 4;
/// Arrays longer than this are validated but not held element by element
/// ([`Value::LongArray`]): every vocabulary is, so opening a pack allocates nothing per token
/// (SmolLM2's 49,152 tokens and 48,900 merges held one by one took 5.6 of its 6.3 ms to open).
pub const MAX_HELD_ARRAY: u64 = 1 << 12;
/// String values longer than this are validated but not held ([`Value::LongString`]).
pub const MAX_HELD_STRING: u64 = 1 << 20;
/// Alignment when `general.alignment` is absent (ggml `GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;

mod parse;
pub use parse::{Parsed, parse};
use parse::{parse_releasing, whole_kv_value};
/// Longest tensor name ggml accepts (`GGML_MAX_NAME` is 64 including the NUL).
pub const MAX_NAME_LEN: usize = 63;

/// A metadata value type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    /// `U8` (type id 0).
    U8 = 0,
    /// `I8` (type id 1).
    I8 = 1,
    /// `U16` (type id 2).
    U16 = 2,
    /// `I16` (type id 3).
    I16 = 3,
    /// `U32` (type id 4).
    U32 = 4,
    /// `I32` (type id 5).
    I32 = 5,
    /// `F32` (type id 6).
    F32 = 6,
    /// `Bool` (type id 7).
    Bool = 7,
    /// `String` (type id 8).
    String = 8,
    /// An array (type id 9).
    Array = 9,
    /// `U64` (type id 10).
    U64 = 10,
    /// `I64` (type id 11).
    I64 = 11,
    /// `F64` (type id 12).
    F64 = 12,
}

impl ValueType {
    fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }
    /// The fewest bytes one value of this type takes in a file.
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A `u8`.
    U8(u8),
    /// A `i8`.
    I8(i8),
    /// A `u16`.
    U16(u16),
    /// A `i16`.
    I16(i16),
    /// A `u32`.
    U32(u32),
    /// A `i32`.
    I32(i32),
    /// A `f32`.
    F32(f32),
    /// A bool.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array: element type and elements.
    Array(ValueType, Vec<Value>),
    /// An array of more than [`MAX_HELD_ARRAY`] elements (a tokenizer's vocabulary): validated
    /// element by element like any other, but held as its element type and length only (its
    /// bytes are the KV's `span`), so a header of millions of strings costs no memory per string.
    LongArray(ValueType, u64),
    /// A string of more than [`MAX_HELD_STRING`] bytes (a pack's manifest of 100k tensors):
    /// validated as UTF-8 like any other, but held as its length only; its bytes are the last
    /// that many bytes of the KV's `span` ([`GgufFile::string_range`]).
    LongString(u64),
    /// A `u64`.
    U64(u64),
    /// A `i64`.
    I64(i64),
    /// A `f64`.
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    /// A short rendering for `inspect` (arrays summarised).
    pub fn summary(&self) -> String {
        match self {
            Value::String(s) if s.len() > 60 => format!("{:?}...", &s[..s.floor_char_boundary(60)]),
            Value::String(s) => format!("{s:?}"),
            Value::Array(t, v) => format!("[{t:?}; {}]", v.len()),
            Value::LongArray(t, n) => format!("[{t:?}; {n}]"),
            Value::LongString(n) => format!("<a string of {n} bytes>"),
            Value::Bool(b) => b.to_string(),
            Value::F32(f) => f.to_string(),
            Value::F64(f) => f.to_string(),
            other => other
                .as_u64()
                .map(|u| u.to_string())
                .unwrap_or_else(|| format!("{other:?}")),
        }
    }
}

/// One key/value pair, with the byte range it occupies in the file (for byte-exact copies).
#[derive(Clone, Debug)]
pub struct Kv {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Value,
    /// Byte range of the whole key/value in the file.
    pub span: Range<usize>,
}

/// One tensor info.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: crate::Name,
    /// ggml order: `ne[0]` is the innermost (contiguous) dimension.
    pub ne: Dims,
    /// Its ggml type.
    pub ty: GgmlType,
    /// Offset relative to the data section, as stored.
    pub offset: u64,
    /// Absolute offset in the file.
    pub file_offset: u64,
    /// Bytes of data.
    pub bytes: u64,
}

/// A tensor's dimensions in ggml order (`ne[0]` innermost), at most [`MAX_DIMS`], held inline
/// (a `Vec` cost each of 100k one-element tensors a 32-byte heap block). Reads as `&[u64]`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Dims {
    len: u8,
    ne: [u64; MAX_DIMS as usize],
}

impl Dims {
    /// `ne` held inline; `None` for more than [`MAX_DIMS`] dimensions.
    pub fn new(ne: &[u64]) -> Option<Dims> {
        let mut d = Dims::default();
        d.ne.get_mut(..ne.len())?.copy_from_slice(ne);
        d.len = ne.len() as u8;
        Some(d)
    }
}

impl std::ops::Deref for Dims {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        &self.ne[..self.len as usize]
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl TensorInfo {
    /// Row-major shape, outermost first (`[out, in]` for a weight).
    pub fn shape(&self) -> Vec<u64> {
        self.ne.iter().rev().copied().collect()
    }
    /// Number of elements.
    pub fn elems(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// Open and map a model file read-only; returns the file, the map and the path for messages.
pub(crate) fn map_file(
    path: &Path,
) -> Result<(std::fs::File, Mmap, String, crate::mapguard::Guard)> {
    let file = path.display().to_string();
    require_regular(path)?;
    let f = std::fs::File::open(path).map_err(|err| Error::Io {
        file: file.clone(),
        err,
    })?;
    // SAFETY: the map is read-only; a concurrent truncation by another process would fault,
    // which the guard turns into zero pages and a recorded error (`crate::mapguard`).
    let map = unsafe { Mmap::map(&f) }.map_err(|err| Error::Io {
        file: file.clone(),
        err,
    })?;
    let guard = crate::mapguard::Guard::register(&map);
    Ok((f, map, file, guard))
}

/// Refuse anything but a regular file (after symlinks) before opening it: opening a FIFO for
/// reading blocks, and a device or socket is no model.
pub fn require_regular(path: &Path) -> Result<()> {
    let file = path.display().to_string();
    let m = std::fs::metadata(path).map_err(|err| Error::Io {
        file: file.clone(),
        err,
    })?;
    if !m.is_file() {
        return Err(Error::Unsupported {
            file,
            reason: format!(
                "not a regular file ({}); give a model file or folder",
                if m.is_dir() {
                    "a folder"
                } else {
                    "a FIFO, socket or device"
                }
            ),
        });
    }
    Ok(())
}

/// An opened, validated GGUF file.
pub struct GgufFile {
    /// The path opened.
    pub path: PathBuf,
    /// The read-only mapping of the whole file.
    pub map: Mmap,
    /// The open file (for `pread` beside the map).
    pub file: std::fs::File,
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata, in file order.
    pub kvs: Vec<Kv>,
    /// Tensor infos, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    /// The map's registration against SIGBUS (`crate::mapguard`).
    pub guard: crate::mapguard::Guard,
}

/// See [`GgufFile::releasing_reader`].
pub struct ReleasingReader<'a> {
    map: &'a Mmap,
    pos: usize,
    end: usize,
    released: usize,
}

impl std::io::Read for ReleasingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.end - self.pos);
        buf[..n].copy_from_slice(&self.map[self.pos..self.pos + n]);
        self.pos += n;
        if self.pos - self.released >= 1 << 20 || self.pos == self.end {
            release_pages(self.map, self.released as u64, self.pos as u64);
            self.released = self.pos;
        }
        Ok(n)
    }
}

/// Drop this process's pages of `map` inside `[start, end)` (page-aligned inward); later reads
/// fault the file's contents back in.
pub fn release_pages(map: &Mmap, start: u64, end: u64) {
    const PAGE: u64 = 4096;
    let (start, end) = (
        start.div_ceil(PAGE) * PAGE,
        (end / PAGE * PAGE).min(map.len() as u64),
    );
    if end > start {
        // SAFETY: the map is a read-only, file-backed mapping; MADV_DONTNEED on it only
        // discards this process's page-table entries, and later reads fault the unchanged
        // file contents back in, so no slice into the range changes.
        let _ = unsafe {
            map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                start as usize,
                (end - start) as usize,
            )
        };
    }
}

impl GgufFile {
    /// A KV's value held whole, long arrays and strings included (read again from its span):
    /// what `inspect --json` prints. Costs what the value holds (a vocabulary of 2 million
    /// strings, 2 million `String`s).
    pub fn whole_value(&self, kv: &Kv) -> Result<Value> {
        let file = self.path.display().to_string();
        let buf = self
            .map
            .get(kv.span.clone())
            .ok_or_else(|| Error::Truncated {
                file: file.clone(),
                field: kv.key.clone(),
                offset: kv.span.start as u64,
                need: kv.span.len() as u64,
                left: self.map.len().saturating_sub(kv.span.start) as u64,
            })?;
        whole_kv_value(buf, &file, &kv.key)
    }

    /// Where a string KV's value lies in the map, held ([`Value::String`]) or not
    /// ([`Value::LongString`]): the last bytes of its span. `None` for any other value.
    pub fn string_range(&self, kv: &Kv) -> Option<Range<usize>> {
        let n = match &kv.value {
            Value::String(s) => s.len(),
            Value::LongString(n) => usize::try_from(*n).ok()?,
            _ => return None,
        };
        let r = kv.span.end.checked_sub(n)?..kv.span.end;
        self.map.get(r.clone()).map(|_| r)
    }

    /// A reader of `range` of the map, front to back, that releases the pages behind it every
    /// MiB ([`release_pages`]): a header value of megabytes (a pack's manifest) is parsed
    /// without ever being resident whole. Panics if `range` is outside the map.
    pub fn releasing_reader(&self, range: Range<usize>) -> ReleasingReader<'_> {
        assert!(range.end <= self.map.len() && range.start <= range.end);
        ReleasingReader {
            map: &self.map,
            pos: range.start,
            end: range.end,
            released: range.start,
        }
    }

    /// Drop this process's mapped pages inside `[start, end)` ([`release_pages`]).
    pub fn release(&self, start: u64, end: u64) {
        release_pages(&self.map, start, end);
    }

    /// Map and validate `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let (f, map, file, guard) = map_file(path)?;
        let parsed = parse_releasing(&map, &file, &|a, b| release_pages(&map, a, b))?;
        // The header is held parsed: its pages need not stay resident (a 2-million-string
        // vocabulary or a pack of 100k tensors makes it megabytes).
        release_pages(&map, 0, parsed.data_offset);
        Ok(GgufFile {
            path: path.to_path_buf(),
            map,
            file: f,
            version: parsed.version,
            kvs: parsed.kvs,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            guard,
        })
    }

    /// The value of metadata `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kvs.iter().find(|kv| kv.key == key).map(|kv| &kv.value)
    }

    /// Read bytes `start..end` of the file with `pread`, in chunks of at most 8 MiB, handing
    /// each to `f`. Unlike the map, a file that shrinks while it is read gives an error naming
    /// `what`, not SIGBUS (`verify` reads every byte, and a user may truncate the file meanwhile).
    pub fn read_range(
        &self,
        start: u64,
        end: u64,
        what: &str,
        mut f: impl FnMut(&[u8]),
    ) -> Result<()> {
        use std::os::unix::fs::FileExt;
        const CHUNK: u64 = 8 << 20;
        let mut buf = vec![0u8; end.saturating_sub(start).min(CHUNK) as usize];
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(CHUNK) as usize;
            self.file
                .read_exact_at(&mut buf[..n], pos)
                .map_err(|e| Error::Tensor {
                    file: self.path.display().to_string(),
                    tensor: what.into(),
                    field: "data",
                    reason: format!(
                        "reading bytes {pos}..{} failed ({e}); did the file change while it was read?",
                        pos + n as u64
                    ),
                })?;
            f(&buf[..n]);
            pos += n as u64;
        }
        Ok(())
    }

    /// The stored bytes of tensor `i`.
    pub fn tensor_data(&self, i: usize) -> &[u8] {
        let t = &self.tensors[i];
        &self.map[t.file_offset as usize..(t.file_offset + t.bytes) as usize]
    }
}

/// The element count of a shape, or `None` when the product of its nonzero dimensions exceeds
/// int64: checked over the nonzero dimensions so that no order of multiplying them overflows (a
/// zero dimension first would otherwise hide two huge ones after it). Every reader checks shapes
/// with it, so [`crate::model::Tensor::elems`] and the decoders can multiply in any order.
pub fn element_count(dims: &[u64]) -> Option<u64> {
    let nonzero = dims.iter().filter(|&&d| d != 0).try_fold(1u64, |a, &d| {
        a.checked_mul(d).filter(|&p| p <= i64::MAX as u64)
    })?;
    Some(if dims.contains(&0) { 0 } else { nonzero })
}

/// The shard paths of a split model (`NAME-00001-of-0000N.gguf`), in order, given any one of
/// them; a path that does not follow the pattern is returned alone.
pub fn split_paths(path: &Path) -> Option<(Vec<PathBuf>, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 {
        return None;
    }
    let n: u32 = count.parse().ok()?;
    let _: u32 = no.parse().ok()?;
    let dir = path.parent().unwrap_or(Path::new(""));
    Some((
        (1..=n)
            .map(|i| dir.join(format!("{prefix}-{i:05}-of-{n:05}.gguf")))
            .collect(),
        n,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_paths_follow_llama_cpp_pattern() {
        let (p, n) = split_paths(Path::new("/m/model-00002-of-00003.gguf")).unwrap();
        assert_eq!(n, 3);
        assert_eq!(p[0], Path::new("/m/model-00001-of-00003.gguf"));
        assert_eq!(p[2], Path::new("/m/model-00003-of-00003.gguf"));
        assert!(split_paths(Path::new("model.gguf")).is_none());
    }
}
