//! The ggml tensor type table: id, block size in elements, block size in bytes.
//!
//! Owned here rather than taken from a GGUF crate (see formats.md, "Why our own GGUF parser").
//! Every (elements, bytes) pair is checked against `ggml-common.h` / `ggml.c` type traits and, in
//! `tests/interop_gguf_py.rs`, against gguf-py 0.19.0's `GGML_QUANT_SIZES` (which differs only for
//! Q8_1, where gguf-py says 40 bytes and ggml's `sizeof(block_q8_1)` is 36).

use std::fmt;

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $elems:literal, $bytes:literal; )*) => {
        /// A ggml tensor type, as stored in a GGUF tensor info's `type` field.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType { $( #[doc = concat!("ggml `", $name, "`.")] $variant = $id, )* }

        impl GgmlType {
            /// Every type this crate knows, in id order.
            pub const ALL: &'static [GgmlType] = &[ $( GgmlType::$variant, )* ];

            /// The type for a GGUF type id, or `None` for ids ggml does not define (or removed).
            pub fn from_id(id: u32) -> Option<Self> {
                match id { $( $id => Some(GgmlType::$variant), )* _ => None }
            }
            /// The type's GGUF name (`Q4_K`, `BF16`, ...).
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$variant => $name, )* }
            }
            /// Parse a GGUF type name.
            pub fn from_name(s: &str) -> Option<Self> {
                match s { $( $name => Some(GgmlType::$variant), )* _ => None }
            }
            /// Elements per block (1 for plain types).
            pub const fn block_elems(self) -> u64 {
                match self { $( GgmlType::$variant => $elems, )* }
            }
            /// Bytes per block.
            pub const fn block_bytes(self) -> u64 {
                match self { $( GgmlType::$variant => $bytes, )* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
    // Not a GGUF type: the block-format engine's bitsandbytes NF4 block (converters/bnb.rs),
    // an id far above GGUF's (`GgmlType::in_gguf`).
    NF4 = 128, "NF4", 64, 36;
}

/// The first id of the engine's own block types (not GGUF's; a GGUF file may not use them).
pub const ENGINE_PRIVATE_IDS: u32 = 128;

impl GgmlType {
    /// Bytes of `n` elements along the innermost dimension, or `None` when `n` is not a whole
    /// number of blocks or the product overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_elems()) {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Whether GGUF defines this type (a GGUF file's tensor may have it); the engine's own
    /// block types (ids from [`ENGINE_PRIVATE_IDS`]) are not.
    pub fn in_gguf(self) -> bool {
        (self as u32) < ENGINE_PRIVATE_IDS
    }

    /// True for block-quantized types (block of more than one element).
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t as u32), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        // 4 and 5 (old Q4_2/Q4_3) and 31-33, 36-38 (removed CPU repacks) are not types.
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, 1000] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
        assert!(GgmlType::Q1_0.in_gguf() && !GgmlType::NF4.in_gguf());
    }

    #[test]
    fn row_bytes_checks_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(576), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
        assert_eq!(GgmlType::NVFP4.row_bytes(128), Some(72));
    }
}
