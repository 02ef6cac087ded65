//! CPU block codecs and the pack layouts' converters (`layouts/`): pure, deterministic, one
//! format per file.
//!
//! Every ggml block format implements [`BlockFormat`] (block size and decode) and, where this
//! project quantizes to it, [`BlockEncode`]. Adding a format is one `#[repr(C)]` block struct,
//! one impl, and one line in [`decode_ggml`]. Tensor-level formats whose scales do not live in
//! the block (ModelOpt NVFP4, block-scaled FP8, per-row FP8) have their own modules with
//! free functions, since a block codec cannot express them.
//!
//! Numerics contract: decoders are bit-identical to gguf-py 0.19.0's `gguf.quants.dequantize`
//! (same float32 operation order, no fused multiply-add); the Q8_0, Q4_K and Q2_K encoders are
//! byte-identical to ggml's `quantize_row_*_ref` (tested against PyPI `libgguf` 0.2.2).

pub use crate::layouts::affine::groups as affine;
pub mod awq;
pub mod bf16;
pub mod bnb;
pub mod ct_int;
pub mod f16;
pub mod fp8;
pub mod fp8_block;
pub mod fp8_row;
pub mod gptq;
pub mod int_source;
pub mod iq1;
pub mod iq2;
pub mod iq3;
pub mod iq4;
pub mod iq_grid;
pub mod iq_grids;
pub mod kquant;
pub mod layouts;
pub mod mxfp4;
pub mod mxfp4_ct;
pub mod nvfp4;
pub mod nvfp4_modelopt;
pub mod q2_k;
pub use crate::layouts::q2g128::blocks as q2g128;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod slice;

use crate::GgmlType;
use bytemuck::Pod;
use rayon::prelude::*;

/// A block-quantized format: `BLOCK_ELEMS` values stored in one `Block` of `size_of::<Block>()`
/// bytes. Blocks are `#[repr(C)]`, alignment 1, so a byte slice casts to blocks with bytemuck.
pub trait BlockFormat {
    /// The `#[repr(C)]` block type (its size is asserted at compile time in its module).
    type Block: Pod + Send + Sync;
    /// Elements per block.
    const BLOCK_ELEMS: usize;
    /// Name used in messages and in formats.md.
    const NAME: &'static str;
    /// Decode one block into `BLOCK_ELEMS` f32 values.
    fn decode_block(block: &Self::Block, out: &mut [f32]);
}

/// A format this project can quantize to, block by block.
pub trait BlockEncode: BlockFormat {
    /// Encode `BLOCK_ELEMS` values into one block.
    fn encode_block(x: &[f32], out: &mut Self::Block);
}

/// Bytes of one block of `F`.
pub const fn block_bytes<F: BlockFormat>() -> usize {
    std::mem::size_of::<F::Block>()
}

/// Decode a whole number of blocks of `F` from `src` into `out`
/// (`out.len() == src.len() / block_bytes * BLOCK_ELEMS`).
pub fn decode_blocks<F: BlockFormat>(src: &[u8], out: &mut [f32]) {
    let blocks: &[F::Block] = bytemuck::cast_slice(src);
    assert_eq!(
        out.len(),
        blocks.len() * F::BLOCK_ELEMS,
        "{}: output length",
        F::NAME
    );
    out.par_chunks_mut(F::BLOCK_ELEMS * 64)
        .zip(blocks.par_chunks(64))
        .for_each(|(o, b)| {
            for (blk, dst) in b.iter().zip(o.chunks_mut(F::BLOCK_ELEMS)) {
                F::decode_block(blk, dst);
            }
        });
}

/// Encode `x` (a whole number of blocks; rows are independent because blocks are) into `out`.
/// Parallel over chunks of blocks; the bytes do not depend on the thread count.
pub fn encode_blocks<F: BlockEncode>(x: &[f32], out: &mut [u8]) {
    assert_eq!(
        x.len() % F::BLOCK_ELEMS,
        0,
        "{}: input is not whole blocks",
        F::NAME
    );
    let blocks: &mut [F::Block] = bytemuck::cast_slice_mut(out);
    assert_eq!(
        blocks.len() * F::BLOCK_ELEMS,
        x.len(),
        "{}: output length",
        F::NAME
    );
    blocks
        .par_chunks_mut(64)
        .zip(x.par_chunks(F::BLOCK_ELEMS * 64))
        .for_each(|(b, xs)| {
            for (blk, src) in b.iter_mut().zip(xs.chunks(F::BLOCK_ELEMS)) {
                F::encode_block(src, blk);
            }
        });
}

/// Encode into a fresh byte vector.
pub fn encode_to_vec<F: BlockEncode>(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / F::BLOCK_ELEMS * block_bytes::<F>()];
    encode_blocks::<F>(x, &mut out);
    out
}

pub use crate::error::CodecError;

/// Decode `bytes` of GGUF type `ty` holding `out.len()` elements to f32.
pub fn decode_ggml(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), CodecError> {
    let expect = ty.row_bytes(out.len() as u64);
    if expect != Some(bytes.len() as u64) {
        return Err(CodecError::Length {
            ty,
            bytes: bytes.len(),
            elems: out.len(),
        });
    }
    use GgmlType as T;
    match ty {
        T::F32 => plain(bytes, out, |b| f32::from_le_bytes(b.try_into().unwrap())),
        T::F16 => plain(bytes, out, |b| {
            f16::to_f32(u16::from_le_bytes([b[0], b[1]]))
        }),
        T::BF16 => plain(bytes, out, |b| {
            bf16::to_f32(u16::from_le_bytes([b[0], b[1]]))
        }),
        T::F64 => plain(bytes, out, |b| {
            f64::from_le_bytes(b.try_into().unwrap()) as f32
        }),
        T::I8 => plain(bytes, out, |b| b[0] as i8 as f32),
        T::I16 => plain(bytes, out, |b| i16::from_le_bytes([b[0], b[1]]) as f32),
        T::I32 => plain(bytes, out, |b| {
            i32::from_le_bytes(b.try_into().unwrap()) as f32
        }),
        T::I64 => plain(bytes, out, |b| {
            i64::from_le_bytes(b.try_into().unwrap()) as f32
        }),
        T::Q4_0 => decode_blocks::<q4_0::Q4_0>(bytes, out),
        T::Q4_1 => decode_blocks::<q4_1::Q4_1>(bytes, out),
        T::Q5_0 => decode_blocks::<q5_0::Q5_0>(bytes, out),
        T::Q5_1 => decode_blocks::<q5_1::Q5_1>(bytes, out),
        T::Q8_0 => decode_blocks::<q8_0::Q8_0>(bytes, out),
        T::Q8_1 => decode_blocks::<q8_1::Q8_1>(bytes, out),
        T::Q2_K => decode_blocks::<q2_k::Q2K>(bytes, out),
        T::Q3_K => decode_blocks::<q3_k::Q3K>(bytes, out),
        T::Q4_K => decode_blocks::<q4_k::Q4K>(bytes, out),
        T::Q5_K => decode_blocks::<q5_k::Q5K>(bytes, out),
        T::Q6_K => decode_blocks::<q6_k::Q6K>(bytes, out),
        T::MXFP4 => decode_blocks::<mxfp4::Mxfp4>(bytes, out),
        T::NVFP4 => decode_blocks::<nvfp4::Nvfp4Gguf>(bytes, out),
        T::IQ4_NL => decode_blocks::<iq4::Iq4Nl>(bytes, out),
        T::IQ4_XS => decode_blocks::<iq4::Iq4Xs>(bytes, out),
        T::IQ2_XXS => decode_blocks::<iq2::Iq2Xxs>(bytes, out),
        T::IQ2_XS => decode_blocks::<iq2::Iq2Xs>(bytes, out),
        T::IQ2_S => decode_blocks::<iq2::Iq2S>(bytes, out),
        T::IQ3_XXS => decode_blocks::<iq3::Iq3Xxs>(bytes, out),
        T::IQ3_S => decode_blocks::<iq3::Iq3S>(bytes, out),
        T::IQ1_S => decode_blocks::<iq1::Iq1S>(bytes, out),
        T::IQ1_M => decode_blocks::<iq1::Iq1M>(bytes, out),
        T::NF4 => decode_blocks::<bnb::Nf4>(bytes, out),
        other => return Err(CodecError::Unsupported(other)),
    }
    Ok(())
}

fn plain(bytes: &[u8], out: &mut [f32], f: impl Fn(&[u8]) -> f32 + Sync) {
    let w = (bytes.len() / out.len().max(1)).max(1);
    out.par_chunks_mut(1 << 14)
        .zip(bytes.par_chunks(w << 14))
        .for_each(|(o, b)| {
            for (v, e) in o.iter_mut().zip(b.chunks_exact(w)) {
                *v = f(e);
            }
        });
}

/// Read an IEEE half stored as two little-endian bytes.
#[inline]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    f16::to_f32(u16::from_le_bytes(b))
}

/// Store an f32 as an IEEE half (round to nearest even), little-endian.
#[inline]
pub(crate) fn to_f16_le(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}
