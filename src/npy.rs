//! Minimal NumPy `.npy` (format version 1.0) reading and writing for f32 and u8 arrays, the
//! interchange format of `metrale-pack dump` and of the interop tests.
//! Spec: numpy `lib/format.py` docstring (magic `\x93NUMPY`, version, u16 header length, a
//! Python-literal dict padded with spaces to a multiple of 64 bytes and ended by `\n`).

use std::io::{self, Write};

/// Element types this module handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NpyDtype {
    /// `<f4`
    F32,
    /// `|u1`
    U8,
}

impl NpyDtype {
    fn descr(self) -> &'static str {
        match self {
            NpyDtype::F32 => "<f4",
            NpyDtype::U8 => "|u1",
        }
    }
    fn size(self) -> usize {
        match self {
            NpyDtype::F32 => 4,
            NpyDtype::U8 => 1,
        }
    }
}

/// The header bytes (magic through padding) for an array of `shape`.
pub fn header(dtype: NpyDtype, shape: &[usize]) -> Vec<u8> {
    let dims = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        dims
    );
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat(unpadded.div_ceil(64) * 64 - unpadded));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Write an f32 array.
pub fn write_f32(w: &mut impl Write, shape: &[usize], data: &[f32]) -> io::Result<()> {
    w.write_all(&header(NpyDtype::F32, shape))?;
    for chunk in data.chunks(16384) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write_all(&bytes)?;
    }
    Ok(())
}

/// Write a u8 array.
pub fn write_u8(w: &mut impl Write, shape: &[usize], data: &[u8]) -> io::Result<()> {
    w.write_all(&header(NpyDtype::U8, shape))?;
    w.write_all(data)
}

/// A parsed `.npy` file: dtype, shape and the raw little-endian data.
#[derive(Debug)]
pub struct Npy {
    /// Element type.
    pub dtype: NpyDtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Raw little-endian data.
    pub data: Vec<u8>,
}

impl Npy {
    /// The data as f32 values (dtype must be F32).
    pub fn to_f32(&self) -> Vec<f32> {
        assert_eq!(self.dtype, NpyDtype::F32);
        self.data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// Parse a version 1.0 `.npy` holding `<f4` or `|u1` in C order.
pub fn parse(bytes: &[u8]) -> Result<Npy, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let dict = bytes
        .get(10..10 + hlen)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or("truncated or non-UTF-8 .npy header")?;
    let dtype = if dict.contains("'<f4'") {
        NpyDtype::F32
    } else if dict.contains("'|u1'") {
        NpyDtype::U8
    } else {
        return Err(format!("unsupported .npy dtype in {dict}"));
    };
    if dict.contains("'fortran_order': True") {
        return Err("Fortran-order .npy is not supported".into());
    }
    let s = dict.find("'shape': (").ok_or("no shape in .npy header")? + 10;
    let e = s + dict[s..].find(')').ok_or("bad shape in .npy header")?;
    let shape: Vec<usize> = dict[s..e]
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<usize>().map_err(|e| format!("bad dim {t}: {e}")))
        .collect::<Result<_, _>>()?;
    let n: usize = shape.iter().product();
    let data = bytes[10 + hlen..].to_vec();
    if data.len() != n * dtype.size() {
        return Err(format!(
            "data is {} bytes, shape {:?} needs {}",
            data.len(),
            shape,
            n * dtype.size()
        ));
    }
    Ok(Npy { dtype, shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_64_byte_aligned_and_round_trips() {
        let mut buf = Vec::new();
        write_f32(&mut buf, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, -6.5]).unwrap();
        assert_eq!((buf.len() - 24) % 64, 0);
        let n = parse(&buf).unwrap();
        assert_eq!(n.shape, vec![2, 3]);
        assert_eq!(n.to_f32()[5], -6.5);
        let mut b2 = Vec::new();
        write_u8(&mut b2, &[5], &[1, 2, 3, 4, 5]).unwrap();
        let n2 = parse(&b2).unwrap();
        assert_eq!(
            (n2.dtype, n2.shape, n2.data),
            (NpyDtype::U8, vec![5], vec![1, 2, 3, 4, 5])
        );
        assert!(parse(b"garbage").is_err());
    }
}
