//! Pack layouts: the byte layouts a dense FFN layer's GPU kernels read, each layout's codec in
//! its folder (`src/layouts/TAG/codec.rs`, re-exported here as `TAG`; the re-exports and the
//! [`Layout`] enum are generated from `layouts::builtin_layouts!`; spec in formats.md, "Pack
//! layouts"). Each layout turns an f32 `[n, k]` weight (or, where the source already is the
//! target, its stored bytes) into named parts, and decodes them back. Every function is pure
//! and deterministic at any thread count.

/// An FFN projection, as named in pack tensor names (`blk.N.ffn_<proj>.<layout>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    /// `gate_proj` / `ffn_gate`.
    Gate,
    /// `up_proj` / `ffn_up`.
    Up,
    /// `down_proj` / `ffn_down`.
    Down,
    /// The fused `[2*inter, hidden]` gate+up weight (FP8).
    GateUp,
}

impl Proj {
    /// The name in tensor names and the manifest (`gate`, `up`, `down`, `gate_up`).
    pub fn name(self) -> &'static str {
        match self {
            Proj::Gate => "gate",
            Proj::Up => "up",
            Proj::Down => "down",
            Proj::GateUp => "gate_up",
        }
    }
    /// The projection of a name, if it is one.
    pub fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "gate" => Proj::Gate,
            "up" => Proj::Up,
            "down" => Proj::Down,
            "gate_up" => Proj::GateUp,
            _ => return None,
        })
    }
}

/// Generates [`Layout`], its [`Layout::ALL`] and [`Layout::tag`], and the re-export of each
/// built-in layout's codec (`converters::layouts::TAG`), from the list of built-in layouts
/// (`layouts::builtin_layouts!`).
macro_rules! layout_enum {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        $(pub use crate::layouts::$t::codec as $t;)*

        /// A pack layout tag: the key of the layout registry (`src/layout/`, `Layout::spec`;
        /// each built-in layout's files are in `src/layouts/TAG/`), where each layout's parts,
        /// sizes, encoder, decoder and overlay binding live.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Layout {
            $(#[doc = concat!("`", stringify!($t), "`: ", $d)] $v,)*
            /// A layout defined outside this crate ([`Layout::custom`]), known to the pack
            /// reader, the loader and the layer once its spec is registered
            /// (`layout::register`).
            Custom(CustomTag),
        }

        impl Layout {
            /// Every built-in layout, in registry order.
            pub const ALL: [Layout; [$(stringify!($t)),*].len()] = [$(Layout::$v),*];
            /// The tag in tensor names, the manifest and `--layouts`.
            pub fn tag(self) -> &'static str {
                match self {
                    $(Layout::$v => stringify!($t),)*
                    Layout::Custom(CustomTag(t)) => t,
                }
            }
        }
    };
}
crate::layouts::builtin_layouts!(layout_enum);

/// The tag of a layout defined outside this crate ([`Layout::custom`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CustomTag(&'static str);

impl Layout {
    /// The layout of tag `tag` defined outside this crate: what its spec's `layout()` returns,
    /// and what `layout::register` checks (lowercase `[a-z0-9_]`, no built-in layout's tag).
    pub const fn custom(tag: &'static str) -> Layout {
        Layout::Custom(CustomTag(tag))
    }
    /// The layout of a tag: a built-in one, or one whose spec is registered
    /// (`layout::register`).
    pub fn from_tag(s: &str) -> Option<Self> {
        Layout::ALL.into_iter().find(|l| l.tag() == s).or_else(|| {
            let reg = REGISTERED_TAGS.read().unwrap_or_else(|e| e.into_inner());
            reg.iter().find(|t| **t == s).map(|t| Layout::custom(t))
        })
    }
}

/// The tags of the layouts registered at run time (`layout::register` adds each with its spec).
static REGISTERED_TAGS: std::sync::RwLock<Vec<&'static str>> = std::sync::RwLock::new(Vec::new());

/// Record a registered layout's tag, so [`Layout::from_tag`] (and a manifest's options) know it.
pub(crate) fn register_tag(tag: &'static str) {
    let mut reg = REGISTERED_TAGS.write().unwrap_or_else(|e| e.into_inner());
    if !reg.contains(&tag) {
        reg.push(tag);
    }
}

/// One projection in one layout: its parts (suffix, bytes; suffix "" for a single blob), the
/// padded shape and derived scalars (name, f32).
#[derive(Clone, Debug, PartialEq)]
pub struct Encoded {
    /// Named byte parts, in file order.
    pub parts: Vec<(&'static str, Vec<u8>)>,
    /// The padded shape `[np, kp]`.
    pub padded: [usize; 2],
    /// Named scalars (global scales, LoRA scaling).
    pub scalars: Vec<(&'static str, f32)>,
}

/// Round `x` up to a multiple of `m`.
pub fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// Copy a row-major `[n, k]` matrix into a zero-filled `[np, kp]` one.
pub fn pad(x: &[f32], n: usize, k: usize, np: usize, kp: usize) -> Vec<f32> {
    if (n, k) == (np, kp) {
        return x.to_vec();
    }
    let mut out = vec![0f32; np * kp];
    for r in 0..n {
        out[r * kp..r * kp + k].copy_from_slice(&x[r * k..r * k + k]);
    }
    out
}

/// Take the logical `[n, k]` top-left of a row-major `[np, kp]` matrix.
pub fn crop(x: &[f32], kp: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        out.extend_from_slice(&x[r * kp..r * kp + k]);
    }
    out
}

/// Pad each of `n` rows of `row_bytes` bytes to `padded_row_bytes` with zeros, and add zero rows
/// up to `np` rows.
pub fn pad_rows_bytes(
    b: &[u8],
    n: usize,
    row_bytes: usize,
    padded_row_bytes: usize,
    np: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; np * padded_row_bytes];
    for r in 0..n {
        out[r * padded_row_bytes..r * padded_row_bytes + row_bytes]
            .copy_from_slice(&b[r * row_bytes..(r + 1) * row_bytes]);
    }
    out
}

/// Little-endian f32 bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f32 values from little-endian bytes.
pub fn f32_from(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl serde::Serialize for Layout {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.tag())
    }
}

impl<'de> serde::Deserialize<'de> for Layout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Layout::from_tag(&s).ok_or_else(|| serde::de::Error::custom(format!("unknown layout {s}")))
    }
}
