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
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
        dtype.descr(),
        dims
    );
    image(&dict, &[])
}

/// A version 1.0 `.npy` image of header dict `dict` (padded with spaces and a newline to a
/// multiple of 64 bytes, as numpy writes it) followed by `data`: [`header`]'s layout, and the
/// tests' way to write any dict, malformed ones included.
pub fn image(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut d = dict.to_string();
    let unpadded = 10 + d.len() + 1;
    d.push_str(&" ".repeat(unpadded.div_ceil(64) * 64 - unpadded));
    d.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(d.len() as u16).to_le_bytes());
    out.extend_from_slice(d.as_bytes());
    out.extend_from_slice(data);
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

/// The largest header this reader takes (numpy writes < 4 KiB for any ordinary array).
pub const MAX_HEADER: usize = 1 << 16;

/// Parse a `.npy` file (format version 1.0, 2.0 or 3.0) holding `<f4` or `|u1` in C order.
/// The header is read as the Python dict literal it is (exactly the keys `descr`,
/// `fortran_order` and `shape`, each once), the shape's element and byte counts with checked
/// arithmetic, and the data must be exactly that long.
pub fn parse(bytes: &[u8]) -> Result<Npy, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let (hlen, start): (usize, usize) = match (bytes[6], bytes[7]) {
        (1, 0) => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        (2, 0) | (3, 0) => {
            let b = bytes.get(8..12).ok_or("truncated .npy header length")?;
            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 12)
        }
        (maj, min) => {
            return Err(format!(
                ".npy format version {maj}.{min} is not supported (1.0, 2.0, 3.0 are)"
            ));
        }
    };
    if hlen > MAX_HEADER {
        return Err(format!(
            ".npy header of {hlen} bytes (at most {MAX_HEADER})"
        ));
    }
    let end = start.checked_add(hlen).ok_or("bad .npy header length")?;
    let dict = bytes.get(start..end).ok_or_else(|| {
        format!(
            "truncated .npy header: {hlen} bytes declared, {} present",
            bytes.len() - start
        )
    })?;
    let dict = std::str::from_utf8(dict).map_err(|_| "non-UTF-8 .npy header".to_string())?;
    let h = parse_header(dict)?;
    let dtype = match h.descr.as_str() {
        "<f4" => NpyDtype::F32,
        "|u1" | "<u1" => NpyDtype::U8,
        other => {
            return Err(format!(
                "unsupported .npy dtype {other:?} (<f4 and |u1 are supported)"
            ));
        }
    };
    if h.fortran {
        return Err("Fortran-order .npy is not supported".into());
    }
    let n = h
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| format!("shape {:?} overflows", h.shape))?;
    let data = &bytes[end..];
    if data.len() != n {
        return Err(format!(
            "data is {} bytes, shape {:?} needs {n}",
            data.len(),
            h.shape
        ));
    }
    Ok(Npy {
        dtype,
        shape: h.shape,
        data: data.to_vec(),
    })
}

struct Header {
    descr: String,
    fortran: bool,
    shape: Vec<usize>,
}

/// The header dict: `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` with any
/// spacing, keys in any order, each exactly once, nothing else; the trailing padding is spaces
/// and one newline.
fn parse_header(text: &str) -> Result<Header, String> {
    let bad = |why: &str| {
        format!(
            "bad .npy header ({why}): {:?}",
            text.chars().take(200).collect::<String>()
        )
    };
    let body = text.trim_end_matches([' ', '\n']).trim_start();
    let body = body
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .ok_or_else(|| bad("not a dict"))?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let mut rest = body.trim();
    while !rest.is_empty() {
        let (key, after) = quoted(rest).ok_or_else(|| bad("a key is not a quoted string"))?;
        let after = after
            .trim_start()
            .strip_prefix(':')
            .ok_or_else(|| bad("no ':' after a key"))?
            .trim_start();
        let after = match key {
            "descr" if descr.is_none() => {
                let (v, a) = quoted(after).ok_or_else(|| bad("descr is not a string"))?;
                descr = Some(v.to_string());
                a
            }
            "fortran_order" if fortran.is_none() => {
                if let Some(a) = after.strip_prefix("False") {
                    fortran = Some(false);
                    a
                } else if let Some(a) = after.strip_prefix("True") {
                    fortran = Some(true);
                    a
                } else {
                    return Err(bad("fortran_order is not True or False"));
                }
            }
            "shape" if shape.is_none() => {
                let inner = after
                    .strip_prefix('(')
                    .ok_or_else(|| bad("shape is not a tuple"))?;
                let close = inner
                    .find(')')
                    .ok_or_else(|| bad("shape tuple not closed"))?;
                let dims = inner[..close]
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(|t| {
                        t.parse::<usize>()
                            .map_err(|_| bad("a dimension is not a count"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                shape = Some(dims);
                &inner[close + 1..]
            }
            _ => return Err(bad("unknown or repeated key")),
        };
        rest = after.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
        if !rest.is_empty() && !rest.starts_with('\'') {
            return Err(bad("text after a value"));
        }
    }
    Ok(Header {
        descr: descr.ok_or_else(|| bad("no descr"))?,
        fortran: fortran.ok_or_else(|| bad("no fortran_order"))?,
        shape: shape.ok_or_else(|| bad("no shape"))?,
    })
}

/// A single-quoted string at the start of `s` (no escapes: numpy never writes them in these
/// keys and values) and the text after it.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let s = s.strip_prefix('\'')?;
    let e = s.find('\'')?;
    Some((&s[..e], &s[e + 1..]))
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

    fn with_dict(dict: &str, data: &[u8]) -> Vec<u8> {
        image(dict, data)
    }

    #[test]
    fn malformed_headers_are_refused_by_what_is_wrong() {
        let four = [0u8; 16];
        let cases: [(&str, &str); 6] = [
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (72057594037927940, 256), }",
                "overflows",
            ),
            (
                "{'descr': '|u1', 'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
                "repeated",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                "dtype",
            ),
            (
                "{'descr': '<f4', 'fortran_order': True, 'shape': (4,), }",
                "Fortran",
            ),
            ("{'descr': '<f4', 'shape': (4,), }", "no fortran_order"),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}",
                "unknown",
            ),
        ];
        for (dict, want) in cases {
            let e = parse(&with_dict(dict, &four)).unwrap_err();
            assert!(e.contains(want), "{dict}: {e}");
        }
        // Keys in another order and version 2.0 are numpy's too.
        let ok = with_dict(
            "{'shape': (4,), 'fortran_order': False, 'descr': '<f4'}",
            &four,
        );
        assert_eq!(parse(&ok).unwrap().shape, vec![4]);
        let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
        let d = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n";
        v2.extend_from_slice(&(d.len() as u32).to_le_bytes());
        v2.extend_from_slice(d.as_bytes());
        v2.extend_from_slice(&[0, 0, 128, 63]);
        assert_eq!(parse(&v2).unwrap().to_f32(), vec![1.0]);
        let mut v9 = ok.clone();
        v9[6] = 9;
        assert!(parse(&v9).unwrap_err().contains("version 9.0"));
    }
}
