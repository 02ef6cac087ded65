//! GGUF v3 writer: the header (KVs and tensor infos) for a planned list of tensors, with each
//! tensor's offset the running sum of the padded sizes before it (stock ggml's reader rule), and
//! a streaming body writer that pads every tensor to the alignment.

use crate::GgmlType;
use crate::gguf::{Value, ValueType};
use std::io::{self, Write};

/// One tensor to be written.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    /// The tensor's name.
    pub name: String,
    /// ggml order, innermost first.
    pub ne: Vec<u64>,
    /// Its ggml type.
    pub ty: GgmlType,
    /// Offset relative to the data section.
    pub offset: u64,
    /// Its data bytes.
    pub bytes: u64,
}

/// A GGUF file being planned: metadata first, then tensors in file order.
#[derive(Clone, Debug)]
pub struct GgufBuilder {
    /// Data alignment.
    pub alignment: u64,
    /// Encoded KV pairs (key, type, value), in order.
    kv_bytes: Vec<u8>,
    kv_count: u64,
    /// Tensors, in file order.
    pub tensors: Vec<PlannedTensor>,
    next_offset: u64,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The bytes of one tensor info: name, dimension count, dimensions, type, offset.
pub fn tensor_info_len(name: &str, ne: &[u64]) -> usize {
    8 + name.len() + 4 + 8 * ne.len() + 4 + 8
}

/// Data bytes of a tensor of `ne` (ggml order) and type `ty`; a 0-dimensional tensor holds one
/// element. Panics unless `ne[0]` is whole blocks of `ty` (the caller planned the tensor).
pub fn tensor_bytes(ne: &[u64], ty: GgmlType) -> u64 {
    let ne0 = ne.first().copied().unwrap_or(1);
    let row = ty.row_bytes(ne0).expect("ne[0] must be whole blocks");
    row * ne.iter().skip(1).product::<u64>()
}

/// The 24 bytes a GGUF v3 header opens with: magic, version, tensor count, KV count.
pub fn header_prefix(n_tensors: u64, n_kvs: u64) -> [u8; 24] {
    let mut p = [0u8; 24];
    p[..4].copy_from_slice(crate::gguf::MAGIC);
    p[4..8].copy_from_slice(&3u32.to_le_bytes());
    p[8..16].copy_from_slice(&n_tensors.to_le_bytes());
    p[16..24].copy_from_slice(&n_kvs.to_le_bytes());
    p
}

/// Encode one tensor info (name, dimensions, type, data-relative offset) into `out`.
pub fn encode_tensor_info(out: &mut Vec<u8>, name: &str, ne: &[u64], ty: GgmlType, offset: u64) {
    put_tensor_info(out, name, ne, ty, offset);
}

/// KVs written straight to a sink, one at a time, counted: a header too large to hold (a pack's
/// manifest of megabytes) is streamed, and a pass into [`std::io::sink`] measures it first.
pub struct KvWriter<W: Write> {
    w: W,
    count: u64,
    len: u64,
    scratch: Vec<u8>,
}

impl<W: Write> KvWriter<W> {
    /// A writer of KVs into `w`.
    pub fn new(w: W) -> Self {
        KvWriter {
            w,
            count: 0,
            len: 0,
            scratch: Vec::new(),
        }
    }

    /// KVs written so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.w.write_all(bytes)?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Append a key/value pair.
    pub fn add_kv(&mut self, key: &str, v: &Value) -> io::Result<()> {
        let mut b = std::mem::take(&mut self.scratch);
        b.clear();
        put_str(&mut b, key);
        b.extend_from_slice(&(value_type(v) as u32).to_le_bytes());
        encode_value(v, &mut b);
        let r = self.put(&b);
        self.scratch = b;
        self.count += 1;
        r
    }

    /// Append a KV copied byte for byte from another GGUF file (its `Kv::span`).
    pub fn add_raw_kv(&mut self, raw: &[u8]) -> io::Result<()> {
        self.count += 1;
        self.put(raw)
    }

    /// Append a string KV of exactly `len` bytes that `write` streams into the sink; fails if
    /// `write` wrote any other number of bytes.
    pub fn add_kv_string_sized(
        &mut self,
        key: &str,
        len: u64,
        write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut head = Vec::with_capacity(key.len() + 20);
        put_str(&mut head, key);
        head.extend_from_slice(&(ValueType::String as u32).to_le_bytes());
        head.extend_from_slice(&len.to_le_bytes());
        self.put(&head)?;
        let mut counted = Counted {
            w: &mut self.w,
            n: 0,
        };
        write(&mut counted)?;
        let n = counted.n;
        self.len += n;
        self.count += 1;
        if n != len {
            return Err(io::Error::other(format!(
                "string KV {key}: {n} bytes written, {len} declared"
            )));
        }
        Ok(())
    }
}

/// A writer that counts what passes through it.
struct Counted<W: Write> {
    w: W,
    n: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let k = self.w.write(b)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

fn put_tensor_info(out: &mut Vec<u8>, name: &str, ne: &[u64], ty: GgmlType, offset: u64) {
    put_str(out, name);
    out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
    for d in ne {
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.extend_from_slice(&(ty as u32).to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
}

fn value_type(v: &Value) -> ValueType {
    match v {
        Value::U8(_) => ValueType::U8,
        Value::I8(_) => ValueType::I8,
        Value::U16(_) => ValueType::U16,
        Value::I16(_) => ValueType::I16,
        Value::U32(_) => ValueType::U32,
        Value::I32(_) => ValueType::I32,
        Value::F32(_) => ValueType::F32,
        Value::Bool(_) => ValueType::Bool,
        Value::String(_) | Value::LongString(_) => ValueType::String,
        Value::Array(..) | Value::LongArray(..) => ValueType::Array,
        Value::U64(_) => ValueType::U64,
        Value::I64(_) => ValueType::I64,
        Value::F64(_) => ValueType::F64,
    }
}

/// Encode a value's payload (without its type id).
pub fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(t, xs) => {
            out.extend_from_slice(&(*t as u32).to_le_bytes());
            out.extend_from_slice(&(xs.len() as u64).to_le_bytes());
            for x in xs {
                encode_value(x, out);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        // Only a parsed file holds one; its KV is copied with `add_raw_kv`, never re-encoded.
        Value::LongArray(..) | Value::LongString(_) => {
            unreachable!("a parsed long array or string is copied as raw bytes")
        }
    }
}

impl GgufBuilder {
    /// An empty plan; `general.alignment` is written first when it differs from 32.
    pub fn new(alignment: u64) -> Self {
        assert!(alignment.is_power_of_two());
        let mut b = GgufBuilder {
            alignment,
            kv_bytes: Vec::new(),
            kv_count: 0,
            tensors: Vec::new(),
            next_offset: 0,
        };
        if alignment != crate::gguf::DEFAULT_ALIGNMENT {
            b.add_kv("general.alignment", &Value::U32(alignment as u32));
        }
        b
    }

    /// Append a key/value pair.
    pub fn add_kv(&mut self, key: &str, v: &Value) {
        put_str(&mut self.kv_bytes, key);
        self.kv_bytes
            .extend_from_slice(&(value_type(v) as u32).to_le_bytes());
        encode_value(v, &mut self.kv_bytes);
        self.kv_count += 1;
    }

    /// Append a KV copied byte for byte from another GGUF file (its `Kv::span`).
    pub fn add_raw_kv(&mut self, raw: &[u8]) {
        self.kv_bytes.extend_from_slice(raw);
        self.kv_count += 1;
    }

    /// Append a tensor; returns its data-relative offset.
    /// A 0-dimensional tensor (`ne` empty, as gguf-py writes a scalar) holds one element.
    pub fn add_tensor(&mut self, name: &str, ne: &[u64], ty: GgmlType) -> u64 {
        let bytes = tensor_bytes(ne, ty);
        let offset = self.next_offset;
        self.tensors.push(PlannedTensor {
            name: name.into(),
            ne: ne.to_vec(),
            ty,
            offset,
            bytes,
        });
        self.next_offset = (offset + bytes).div_ceil(self.alignment) * self.alignment;
        offset
    }

    /// The header: magic, version 3, counts, KVs, tensor infos, zero padding to the alignment.
    pub fn header(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(self.header_len());
        h.extend_from_slice(&header_prefix(self.tensors.len() as u64, self.kv_count));
        h.extend_from_slice(&self.kv_bytes);
        for t in &self.tensors {
            put_tensor_info(&mut h, &t.name, &t.ne, t.ty, t.offset);
        }
        let padded = (h.len() as u64).div_ceil(self.alignment) * self.alignment;
        h.resize(padded as usize, 0);
        debug_assert_eq!(h.len(), self.header_len());
        h
    }

    /// The length [`GgufBuilder::header`] will have, without building it.
    pub fn header_len(&self) -> usize {
        let infos: usize = self
            .tensors
            .iter()
            .map(|t| tensor_info_len(&t.name, &t.ne))
            .sum();
        let raw = (24 + self.kv_bytes.len() + infos) as u64;
        (raw.div_ceil(self.alignment) * self.alignment) as usize
    }

    /// Total data-section size (the last tensor padded too).
    pub fn data_len(&self) -> u64 {
        self.next_offset
    }
}

/// Writes tensor data in plan order, padding each to the alignment.
pub struct BodyWriter<'a> {
    plan: &'a GgufBuilder,
    next: usize,
}

impl<'a> BodyWriter<'a> {
    /// A writer of the file `plan` describes.
    pub fn new(plan: &'a GgufBuilder) -> Self {
        BodyWriter { plan, next: 0 }
    }
    /// Write the data of the next planned tensor (exactly its byte size) and its padding.
    pub fn write_next(&mut self, w: &mut impl Write, data: &[u8]) -> io::Result<()> {
        let t = &self.plan.tensors[self.next];
        if data.len() as u64 != t.bytes {
            return Err(io::Error::other(format!(
                "tensor {}: {} bytes given, {} planned",
                t.name,
                data.len(),
                t.bytes
            )));
        }
        w.write_all(data)?;
        let pad = (t.bytes.div_ceil(self.plan.alignment) * self.plan.alignment - t.bytes) as usize;
        w.write_all(&vec![0u8; pad])?;
        self.next += 1;
        Ok(())
    }
}

/// Build a whole GGUF image in memory (tests and small files).
pub fn build(
    alignment: u64,
    kvs: &[(&str, Value)],
    tensors: &[(&str, Vec<u64>, GgmlType, Vec<u8>)],
) -> Vec<u8> {
    let mut b = GgufBuilder::new(alignment);
    for (k, v) in kvs {
        b.add_kv(k, v);
    }
    for (name, ne, ty, _) in tensors {
        b.add_tensor(name, ne, *ty);
    }
    let mut out = b.header();
    let mut body = BodyWriter::new(&b);
    for (_, _, _, data) in tensors {
        body.write_next(&mut out, data).unwrap();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::parse;

    #[test]
    fn built_file_parses_back_with_running_padded_offsets() {
        let img = build(
            64,
            &[
                ("general.architecture", Value::String("llama".into())),
                (
                    "x.arr",
                    Value::Array(ValueType::I32, vec![Value::I32(-1), Value::I32(7)]),
                ),
            ],
            &[
                ("a", vec![3], GgmlType::F32, vec![1; 12]),
                ("b", vec![32, 2], GgmlType::Q8_0, vec![2; 68]),
            ],
        );
        let p = parse(&img, "mem").unwrap();
        assert_eq!(p.alignment, 64);
        assert_eq!(p.tensors[0].offset, 0);
        assert_eq!(p.tensors[1].offset, 64);
        assert_eq!(p.tensors[1].bytes, 68);
        assert_eq!(p.data_offset % 64, 0);
        assert_eq!(img.len() as u64, p.data_offset + 192);
        assert_eq!(
            p.kvs[2].value,
            Value::Array(ValueType::I32, vec![Value::I32(-1), Value::I32(7)])
        );
        // Raw KV spans re-encode to the same bytes.
        let mut b2 = GgufBuilder::new(64);
        b2.kv_bytes.clear();
        b2.kv_count = 0;
        for kv in &p.kvs {
            b2.add_raw_kv(&img[kv.span.clone()]);
        }
        b2.add_tensor("a", &[3], GgmlType::F32);
        b2.add_tensor("b", &[32, 2], GgmlType::Q8_0);
        assert_eq!(b2.header(), img[..p.data_offset as usize]);
    }
}
