//! The GGUF byte parser: a buffer (a mapped file) to its header, key-values and tensor infos,
//! every count, size and offset checked before it is used (formats.md, "GGUF input").

use super::*;

/// What [`parse`] finds in a GGUF byte buffer.
pub struct Parsed {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata, in file order.
    pub kvs: Vec<Kv>,
    /// Tensor infos, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment.
    pub alignment: u64,
    /// Where the data section starts.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
    /// Hold every value whole, long arrays and strings too ([`GgufFile::whole_value`]).
    hold: bool,
    /// Drops `buf[start..end]` from the resident set (a mapped file's pages; a no-op for
    /// memory). Called on what lies behind the cursor, a MiB at a time.
    release: &'a dyn Fn(u64, u64),
    /// Where the last release ended.
    released: usize,
}

/// Bytes read between releases of the pages behind the cursor.
const RELEASE_STEP: usize = 1 << 20;

fn keep_pages(_: u64, _: u64) {}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }
    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(Error::Truncated {
                file: self.file.into(),
                field: field(),
                offset: self.pos as u64,
                need: n,
                left: self.left(),
            });
        }
        if self.pos - self.released >= RELEASE_STEP {
            (self.release)(self.released as u64, self.pos as u64);
            self.released = self.pos;
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    /// Whether `b` (a slice of `buf`) is UTF-8: checked a MiB at a time, each released once
    /// checked (a 10 MB manifest or vocabulary string is never resident whole).
    fn utf8(&mut self, b: &[u8]) -> bool {
        let base = b.as_ptr() as usize - self.buf.as_ptr() as usize;
        let mut i = 0;
        while i < b.len() {
            let end = (i + RELEASE_STEP).min(b.len());
            match std::str::from_utf8(&b[i..end]) {
                Ok(_) => i = end,
                // A character cut by the chunk's end: the next chunk starts at it.
                Err(e) if e.error_len().is_none() && end < b.len() => i += e.valid_up_to(),
                Err(_) => return false,
            }
            if base + i - self.released >= RELEASE_STEP {
                (self.release)(self.released as u64, (base + i) as u64);
                self.released = base + i;
            }
        }
        true
    }
    fn arr<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N]> {
        Ok(self.take(N as u64, field)?.try_into().unwrap())
    }
    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(field)?))
    }
    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(field)?))
    }
    /// A count of items each at least `min` bytes, checked against what remains.
    fn count(&mut self, min: u64, field: &dyn Fn() -> String) -> Result<u64> {
        let n = self.u64(field)?;
        let need = n as u128 * min as u128;
        if need > self.left() as u128 {
            return Err(Error::Count {
                file: self.file.into(),
                field: field(),
                count: n,
                need,
                left: self.left(),
            });
        }
        Ok(n)
    }
    fn string(&mut self, field: &dyn Fn() -> String) -> Result<String> {
        let n = self.count(1, field)?;
        let b = self.take(n, field)?;
        String::from_utf8(b.to_vec()).map_err(|_| Error::Utf8 {
            file: self.file.into(),
            field: field(),
        })
    }
    /// A string value: held, or validated and left in the file when long.
    fn string_value(&mut self, field: &dyn Fn() -> String) -> Result<Value> {
        let n = self.count(1, field)?;
        let b = self.take(n, field)?;
        let utf8 = |c: &mut Self| {
            c.utf8(b).then_some(()).ok_or_else(|| Error::Utf8 {
                file: c.file.into(),
                field: field(),
            })
        };
        Ok(if n > MAX_HELD_STRING && !self.hold {
            utf8(self)?;
            Value::LongString(n)
        } else {
            let s = std::str::from_utf8(b).map_err(|_| Error::Utf8 {
                file: self.file.into(),
                field: field(),
            })?;
            Value::String(s.to_owned())
        })
    }
    /// Validate one value as [`Cursor::value`] does, holding nothing.
    fn skip(&mut self, ty: ValueType, depth: usize, field: &dyn Fn() -> String) -> Result<()> {
        match ty {
            ValueType::String => {
                let n = self.count(1, field)?;
                let b = self.take(n, field)?;
                if !self.utf8(b) {
                    return Err(Error::Utf8 {
                        file: self.file.into(),
                        field: field(),
                    });
                }
                Ok(())
            }
            ValueType::Bool | ValueType::Array => self.value(ty, depth, field).map(drop),
            other => self.take(other.min_size(), field).map(drop),
        }
    }

    fn value(&mut self, ty: ValueType, depth: usize, field: &dyn Fn() -> String) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.arr::<1>(field)?[0]),
            ValueType::I8 => Value::I8(self.arr::<1>(field)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.arr(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.arr(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.arr(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.arr(field)?)),
            ValueType::Bool => {
                let b = self.arr::<1>(field)?[0];
                if b > 1 {
                    return Err(Error::Metadata {
                        file: self.file.into(),
                        key: field(),
                        reason: format!("bool byte {b}"),
                    });
                }
                Value::Bool(b == 1)
            }
            ValueType::String => self.string_value(field)?,
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.arr(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.arr(field)?)),
            ValueType::Array => {
                if depth >= MAX_ARRAY_NESTING {
                    return Err(Error::Nesting {
                        file: self.file.into(),
                        field: field(),
                        max: MAX_ARRAY_NESTING,
                    });
                }
                let et = self.u32(field)?;
                let et = ValueType::from_id(et).ok_or_else(|| Error::ValueType {
                    file: self.file.into(),
                    field: field(),
                    ty: et,
                })?;
                let n = self.count(et.min_size(), field)?;
                if n > MAX_HELD_ARRAY && !self.hold {
                    for _ in 0..n {
                        self.skip(et, depth + 1, field)?;
                    }
                    return Ok(Value::LongArray(et, n));
                }
                // Capacity is bounded by the bytes that remain (count() checked n * min_size).
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(et, depth + 1, field)?);
                }
                Value::Array(et, v)
            }
        })
    }
}

/// Parse and validate a GGUF image held in `buf`; `file` names it in errors.
pub fn parse(buf: &[u8], file: &str) -> Result<Parsed> {
    parse_releasing(buf, file, &keep_pages)
}

/// [`parse`], calling `release(start, end)` on the bytes read so far a MiB at a time, so a
/// mapped header of many megabytes is never resident whole.
pub(super) fn parse_releasing(
    buf: &[u8],
    file: &str,
    release: &dyn Fn(u64, u64),
) -> Result<Parsed> {
    let mut c = Cursor {
        buf,
        pos: 0,
        file,
        hold: false,
        release,
        released: 0,
    };
    let magic = c.take(4, &|| "magic".into()).map_err(|_| Error::BadMagic {
        file: file.into(),
        found: buf[..buf.len().min(4)].to_vec(),
    })?;
    if magic != MAGIC {
        return Err(Error::BadMagic {
            file: file.into(),
            found: magic.to_vec(),
        });
    }
    let version = c.u32(&|| "version".into())?;
    if version & 0xFFFF == 0 && version != 0 {
        return Err(Error::BigEndian { file: file.into() });
    }
    if version != 2 && version != 3 {
        return Err(Error::Version {
            file: file.into(),
            version,
        });
    }
    // Each tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes,
    // each KV at least 8 (key length) + 4 (type) + 1 byte.
    let n_tensors = c.count(24, &|| "tensor_count".into())?;
    let n_kv = c.count(13, &|| "kv_count".into())?;
    let kvs = c.kvs(n_kv)?;
    let alignment = alignment_of(&kvs, file)?;
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        tensors.push(c.tensor_info(i, alignment)?);
    }
    check_unique_names(&tensors, file)?;
    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    place_tensors(&mut tensors, data_offset, buf.len() as u64, file)?;
    check_no_overlap(&tensors, file)?;
    Ok(Parsed {
        version,
        kvs,
        tensors,
        alignment,
        data_offset,
    })
}

impl Cursor<'_> {
    /// `n_kv` key/value pairs, keys unique.
    fn kvs(&mut self, n_kv: u64) -> Result<Vec<Kv>> {
        let file = self.file;
        let c = self;
        let mut kvs: Vec<Kv> = Vec::with_capacity(n_kv as usize);
        let mut keys = HashSet::new();
        for i in 0..n_kv {
            let start = c.pos;
            let key = c.string(&|| format!("kv[{i}].key"))?;
            let fld = |k: &str| -> Box<dyn Fn() -> String> {
                let k = k.to_string();
                Box::new(move || k.clone())
            };
            let f = fld(&key);
            let ty = c.u32(&*f)?;
            let ty = ValueType::from_id(ty).ok_or_else(|| Error::ValueType {
                file: file.into(),
                field: key.clone(),
                ty,
            })?;
            let value = c.value(ty, 0, &*f)?;
            if !keys.insert(key.clone()) {
                return Err(Error::DuplicateKey {
                    file: file.into(),
                    key,
                });
            }
            kvs.push(Kv {
                key,
                value,
                span: start..c.pos,
            });
        }
        Ok(kvs)
    }

    /// Tensor info `i`: name, dimensions, type, offset (a multiple of `alignment`), its byte
    /// size checked.
    fn tensor_info(&mut self, i: u64, alignment: u64) -> Result<TensorInfo> {
        let file = self.file;
        let c = self;
        let name = c.string(&|| format!("tensor[{i}].name"))?;
        let terr = |field: &'static str, reason: String| Error::Tensor {
            file: file.into(),
            tensor: name.clone(),
            field,
            reason,
        };
        let n_dims = c.u32(&|| format!("tensor {name}: n_dims"))?;
        if n_dims > MAX_DIMS {
            return Err(terr("n_dims", format!("{n_dims} > {MAX_DIMS}")));
        }
        let mut ne = [0u64; MAX_DIMS as usize];
        for d in 0..n_dims {
            let v = c.u64(&|| format!("tensor {name}: ne[{d}]"))?;
            if v > i64::MAX as u64 {
                return Err(terr("ne", format!("ne[{d}] = {v} is negative as int64")));
            }
            ne[d as usize] = v;
        }
        let ne = Dims::new(&ne[..n_dims as usize]).expect("n_dims is at most MAX_DIMS");
        let ty_id = c.u32(&|| format!("tensor {name}: type"))?;
        let offset = c.u64(&|| format!("tensor {name}: offset"))?;
        let ty = GgmlType::from_id(ty_id)
            .filter(|t| t.in_gguf())
            .ok_or_else(|| terr("type", format!("unknown ggml type id {ty_id}")))?;
        let elems = element_count(&ne)
            .ok_or_else(|| terr("ne", format!("element count of {ne:?} overflows int64")))?;
        let ne0 = ne.first().copied().unwrap_or(1);
        let row = ty.row_bytes(ne0).ok_or_else(|| {
            terr(
                "ne",
                format!(
                    "ne[0] = {ne0} is not a multiple of {}'s block of {}",
                    ty,
                    ty.block_elems()
                ),
            )
        })?;
        let bytes = row
            .checked_mul(elems.checked_div(ne0).unwrap_or(0))
            .ok_or_else(|| terr("ne", format!("byte size of {ne:?} overflows")))?;
        if offset % alignment != 0 {
            return Err(terr(
                "offset",
                format!("{offset} is not a multiple of general.alignment {alignment}"),
            ));
        }
        Ok(TensorInfo {
            name: name.into(),
            ne,
            ty,
            offset,
            file_offset: 0,
            bytes,
        })
    }
}

/// `general.alignment`: a u32 power of two, or the default.
fn alignment_of(kvs: &[Kv], file: &str) -> Result<u64> {
    Ok(match kvs.iter().find(|kv| kv.key == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(kv) => match kv.value {
            Value::U32(a) if a != 0 && a.is_power_of_two() => a as u64,
            ref v => {
                return Err(Error::Metadata {
                    file: file.into(),
                    key: "general.alignment".into(),
                    reason: format!("must be a u32 power of two, found {v:?}"),
                });
            }
        },
    })
}

/// Duplicate names, found by sorting indices rather than by a set of copied names (a file of a
/// million tensors is mostly names).
fn check_unique_names(tensors: &[TensorInfo], file: &str) -> Result<()> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_unstable_by(|&a, &b| tensors[a].name.cmp(&tensors[b].name));
    if let Some(w) = order
        .windows(2)
        .find(|w| tensors[w[0]].name == tensors[w[1]].name)
    {
        return Err(Error::DuplicateTensor {
            file: file.into(),
            tensor: tensors[w[0].max(w[1])].name.to_string(),
        });
    }
    Ok(())
}

/// Each tensor's absolute offset, its data inside the file of `len` bytes.
fn place_tensors(tensors: &mut [TensorInfo], data_offset: u64, len: u64, file: &str) -> Result<()> {
    for t in tensors.iter_mut() {
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.bytes));
        match end {
            Some(e) if e <= len => t.file_offset = data_offset + t.offset,
            _ => {
                return Err(Error::Tensor {
                    file: file.into(),
                    tensor: t.name.to_string(),
                    field: "offset",
                    reason: format!(
                        "data [{} + {}, +{} bytes) runs past the end of the file ({len} bytes)",
                        data_offset, t.offset, t.bytes
                    ),
                });
            }
        }
    }
    Ok(())
}

/// No two tensors' data overlap.
fn check_no_overlap(tensors: &[TensorInfo], file: &str) -> Result<()> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (tensors[i].offset, tensors[i].bytes));
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.bytes > 0 && b.bytes > 0 && a.offset + a.bytes > b.offset {
            return Err(Error::Overlap {
                file: file.into(),
                a: a.name.to_string(),
                b: b.name.to_string(),
            });
        }
    }
    Ok(())
}

/// The key-value record in `buf` (key, type, value) decoded with its value held whole, long
/// arrays and strings included (`GgufFile::whole_value`); `key` names it in errors.
pub(super) fn whole_kv_value(buf: &[u8], file: &str, key: &str) -> Result<Value> {
    let mut c = Cursor {
        buf,
        pos: 0,
        file,
        hold: true,
        release: &keep_pages,
        released: 0,
    };
    let f = || key.to_string();
    c.string(&f)?;
    let ty = c.u32(&f)?;
    let ty = ValueType::from_id(ty).ok_or_else(|| Error::ValueType {
        file: file.into(),
        field: key.into(),
        ty,
    })?;
    c.value(ty, 0, &f)
}
