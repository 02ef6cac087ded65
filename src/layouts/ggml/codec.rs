//! `ggml`: a projection's GGUF blocks as the source stores them, byte for byte, one blob per
//! projection of any type of the block-format engine ([`TYPES`]), the type recorded in the
//! blob's `type` scalar (its GGUF id). A GGUF row is whole blocks, so a carried weight is not
//! padded; a float source becomes Q8_0 ([`encode`]), its rows zero-padded to whole blocks of
//! 32. A weight beside llama.cpp's per-tensor output scale (`blk.N.ffn_X.scale`) records it in
//! the blob's `output_scale` scalar. Decoding is the converters' (`converters::decode_ggml`,
//! bit-identical to gguf-py's `quants.py`), times that scale. Spec in formats.md, "ggml".

use crate::GgmlType;
use crate::converters::layouts::{Encoded, crop, pad, round_up};
use crate::converters::{decode_ggml, encode_to_vec, q8_0::Q8_0};
use crate::error::CodecError;

/// The block types the engine carries and serves (`kernels.cu`, `ggml_gemv`: a case line
/// each): GGUF's, and its own NF4 (bitsandbytes, `converters::bnb`).
pub const TYPES: [GgmlType; 22] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::NF4,
];

/// Values per q8_1 activation block, the unit the engine's dot products take: every type's
/// block is a whole number of them.
pub const SUB_BLOCK: usize = 32;

/// The engine type of GGUF id `id`, if it is one.
pub fn engine_type(id: u32) -> Option<GgmlType> {
    TYPES.into_iter().find(|t| *t as u32 == id)
}

/// The bytes of `n` rows of `kp` values of `ty`, if `kp` is whole blocks and nothing
/// overflows.
pub fn blob_bytes(ty: GgmlType, n: u64, kp: u64) -> Option<u64> {
    if !kp.is_multiple_of(ty.block_elems()) {
        return None;
    }
    ty.row_bytes(kp)?.checked_mul(n)
}

/// The scalar that records a projection's output scale, where its source has one.
pub const OUTPUT_SCALE: &str = "output_scale";

/// Carry `n` rows of `k` values of `ty` stored as the source stores them (`k` whole blocks),
/// with the source's output scale, if it has one.
pub fn carry(ty: GgmlType, bytes: &[u8], n: usize, k: usize, scale: Option<f32>) -> Encoded {
    debug_assert_eq!(blob_bytes(ty, n as u64, k as u64), Some(bytes.len() as u64));
    let mut scalars = vec![("type", ty as u32 as f32)];
    scalars.extend(scale.map(|s| (OUTPUT_SCALE, s)));
    Encoded {
        parts: vec![("", bytes.to_vec())],
        padded: [n, k],
        scalars,
    }
}

/// Encode f32 `[n, k]` as Q8_0 (ggml's `quantize_row_q8_0_ref`), each row zero-padded to whole
/// blocks of 32.
pub fn encode(x: &[f32], n: usize, k: usize) -> Encoded {
    let kp = round_up(k, SUB_BLOCK);
    Encoded {
        parts: vec![("", encode_to_vec::<Q8_0>(&pad(x, n, k, n, kp)))],
        padded: [n, kp],
        scalars: vec![("type", GgmlType::Q8_0 as u32 as f32)],
    }
}

/// Decode `n` rows of `kp` values of `ty` to f32 `[n, k]`, each value times `scale` (the
/// output scale; 1 where the blob records none).
pub fn decode(
    ty: GgmlType,
    bytes: &[u8],
    [n, k, kp]: [usize; 3],
    scale: f32,
) -> Result<Vec<f32>, CodecError> {
    let mut out = vec![0f32; n * kp];
    decode_ggml(ty, bytes, &mut out)?;
    if scale != 1.0 {
        out.iter_mut().for_each(|v| *v *= scale);
    }
    Ok(crop(&out, kp, n, k))
}
