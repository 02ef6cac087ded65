//! [`Name`]: a tensor's name, held inline when it is short.
//!
//! A table of 100k one-element tensors held each name in its own heap block: 24 bytes of
//! `String` plus a 32-byte allocation for a 6-byte name, per copy (the source index, the
//! pack's table and its manifest each hold one). Names of up to [`INLINE`] bytes (every
//! `blk.N.ffn_*.weight` of a ggml model below layer 100) live in the 24 bytes themselves.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// The longest name held inline.
pub const INLINE: usize = 22;

/// A tensor's name (UTF-8): inline up to [`INLINE`] bytes, on the heap beyond. It reads as a
/// `&str` (`Deref`), and compares, hashes and orders as one.
#[derive(Clone)]
pub struct Name(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

const _: () = assert!(std::mem::size_of::<Name>() == std::mem::size_of::<String>());
const _: () = assert!(INLINE <= u8::MAX as usize);

impl Name {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline { len, bytes } => std::str::from_utf8(&bytes[..*len as usize])
                .expect("an inline name is copied from a str"),
            Repr::Heap(s) => s,
        }
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        if s.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            Name(Repr::Inline {
                len: s.len() as u8,
                bytes,
            })
        } else {
            Name(Repr::Heap(s.into()))
        }
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        if s.len() <= INLINE {
            Name::from(s.as_str())
        } else {
            Name(Repr::Heap(s.into_boxed_str()))
        }
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Name {
        Name::from(s.as_str())
    }
}

impl From<Name> for String {
    fn from(n: Name) -> String {
        match n.0 {
            Repr::Heap(s) => s.into_string(),
            Repr::Inline { .. } => n.as_str().to_string(),
        }
    }
}

impl Default for Name {
    fn default() -> Name {
        Name::from("")
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<std::path::Path> for Name {
    fn as_ref(&self) -> &std::path::Path {
        self.as_str().as_ref()
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == other.as_str()
    }
}
impl Eq for Name {}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}
impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}
impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        self == other.as_str()
    }
}
impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == other.as_str()
    }
}
impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Hash for Name {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Name) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Name {
    fn cmp(&self, other: &Name) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        // Borrowed when the input allows (a manifest read from memory), so a short name is
        // never allocated at all.
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(match s {
            std::borrow::Cow::Borrowed(b) => Name::from(b),
            std::borrow::Cow::Owned(o) => Name::from(o),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_at_every_length_either_side_of_inline() {
        for n in [0, 1, INLINE - 1, INLINE, INLINE + 1, 300] {
            // Multi-byte characters too: a 2-byte char straddling the inline limit.
            for s in ["x".repeat(n), "é".repeat(n / 2)] {
                let a = Name::from(s.as_str());
                let b = Name::from(s.clone());
                assert_eq!(a.as_str(), s);
                assert_eq!(b, a);
                assert_eq!(String::from(a.clone()), s);
                let json = serde_json::to_string(&a).unwrap();
                assert_eq!(json, serde_json::to_string(&s).unwrap());
                let back: Name = serde_json::from_str(&json).unwrap();
                assert_eq!(back, s);
            }
        }
        // Ordered as their strings, inline and heap alike.
        let mut v = [Name::from("x".repeat(30)), Name::from("b"), Name::from("a")];
        v.sort();
        assert_eq!(v.map(String::from), ["a", "b", &"x".repeat(30)]);
    }

    #[test]
    fn a_name_hashes_as_its_str() {
        let mut set = std::collections::HashSet::new();
        set.insert(Name::from("blk.0.ffn_up.weight"));
        set.insert(Name::from("y".repeat(40)));
        assert!(set.contains("blk.0.ffn_up.weight"));
        assert!(set.contains("y".repeat(40).as_str()));
        assert!(!set.contains("blk.0.ffn_up"));
    }
}
