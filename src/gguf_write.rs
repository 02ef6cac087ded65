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
        Value::String(_) => ValueType::String,
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
        Value::LongArray(..) => unreachable!("a parsed long array is copied as raw bytes"),
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

    /// Append a string KV whose bytes `write` appends to the header buffer in place, so a large
    /// value (a pack's manifest) is never held twice.
    pub fn add_kv_string_with<E>(
        &mut self,
        key: &str,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        put_str(&mut self.kv_bytes, key);
        self.kv_bytes
            .extend_from_slice(&(ValueType::String as u32).to_le_bytes());
        let at = self.kv_bytes.len();
        self.kv_bytes.extend_from_slice(&0u64.to_le_bytes());
        write(&mut self.kv_bytes)?;
        let len = (self.kv_bytes.len() - at - 8) as u64;
        self.kv_bytes[at..at + 8].copy_from_slice(&len.to_le_bytes());
        self.kv_count += 1;
        Ok(())
    }

    /// Offset in [`GgufBuilder::header`] just past the last KV written so far.
    pub fn kv_end(&self) -> usize {
        24 + self.kv_bytes.len()
    }

    /// Make room for `bytes` more bytes of KVs (a header copying a large vocabulary grows its
    /// buffer once instead of doubling it).
    pub fn reserve_kv(&mut self, bytes: usize) {
        self.kv_bytes.reserve(bytes);
    }

    /// Append a KV copied byte for byte from another GGUF file (its `Kv::span`).
    pub fn add_raw_kv(&mut self, raw: &[u8]) {
        self.kv_bytes.extend_from_slice(raw);
        self.kv_count += 1;
    }

    /// Append a tensor; returns its data-relative offset.
    /// A 0-dimensional tensor (`ne` empty, as gguf-py writes a scalar) holds one element.
    pub fn add_tensor(&mut self, name: &str, ne: &[u64], ty: GgmlType) -> u64 {
        let ne0 = ne.first().copied().unwrap_or(1);
        let row = ty.row_bytes(ne0).expect("ne[0] must be whole blocks");
        let bytes = row * ne.iter().skip(1).product::<u64>();
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
        h.extend_from_slice(crate::gguf::MAGIC);
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&self.kv_count.to_le_bytes());
        h.extend_from_slice(&self.kv_bytes);
        for t in &self.tensors {
            put_tensor_info(&mut h, &t.name, &t.ne, t.ty, t.offset);
        }
        let padded = (h.len() as u64).div_ceil(self.alignment) * self.alignment;
        h.resize(padded as usize, 0);
        debug_assert_eq!(h.len(), self.header_len());
        h
    }

    /// The header of this builder's KVs and tensors followed by `more` tensors (name, `ne`,
    /// type), their offsets assigned as [`GgufBuilder::add_tensor`] would, built in the KV
    /// buffer itself: a writer whose table is large and derived on the fly (a pack of 100k
    /// tensors) never holds it, nor the header twice.
    pub fn into_header_with<N: AsRef<str>, D: AsRef<[u64]>>(
        mut self,
        more: impl IntoIterator<Item = (N, D, GgmlType)>,
    ) -> Vec<u8> {
        let mut h = std::mem::take(&mut self.kv_bytes);
        for t in &self.tensors {
            put_tensor_info(&mut h, &t.name, &t.ne, t.ty, t.offset);
        }
        let mut n = self.tensors.len() as u64;
        for (name, ne, ty) in more {
            let (name, ne) = (name.as_ref(), ne.as_ref());
            let offset = self.add_tensor(name, ne, ty);
            self.tensors.pop();
            put_tensor_info(&mut h, name, ne, ty, offset);
            n += 1;
        }
        let mut prefix = Vec::with_capacity(24);
        prefix.extend_from_slice(crate::gguf::MAGIC);
        prefix.extend_from_slice(&3u32.to_le_bytes());
        prefix.extend_from_slice(&n.to_le_bytes());
        prefix.extend_from_slice(&self.kv_count.to_le_bytes());
        h.splice(0..0, prefix);
        let padded = (h.len() as u64).div_ceil(self.alignment) * self.alignment;
        h.resize(padded as usize, 0);
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
