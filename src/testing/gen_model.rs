//! Generate a llama-shaped GGUF of random weights, streamed to disk, for benchmarks and GPU runs
//! that need models larger than the real ones (`metrale-pack gen-model OUT.gguf HIDDEN INTER
//! LAYERS TYPE [ARCH] [--whole --vocab V --kv-dim D]`; TYPE: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K; ARCH:
//! llama (SiLU) or gemma (GELU)). By default: an F16 token embedding, and per layer an F32
//! `ffn_norm` and the FFN in TYPE. A whole model adds what an engine uploads besides the FFN:
//! per layer `attn_norm` and `attn_q`, `attn_k`, `attn_v`, `attn_output` (in TYPE, k and v of
//! `kv_dim` rows), then `output_norm` and the `output` head. The same arguments give the same
//! bytes.

use crate::GgmlType;
use crate::converters::{bf16, encode_to_vec, f16, q4_0::Q4_0, q4_1::Q4_1, q4_k::Q4K, q8_0::Q8_0};
use crate::gguf::Value;
use crate::gguf_write::{BodyWriter, GgufBuilder};
use rayon::prelude::*;
use std::path::Path;

/// The attention and output head of a whole model.
#[derive(Clone, Copy, Debug)]
pub struct Whole {
    /// Vocabulary size (rows of the embedding and of the output head).
    pub vocab: usize,
    /// Rows of `attn_k` and `attn_v` (KV heads x head size).
    pub kv_dim: usize,
    /// The head size: `hidden / head_dim` heads and `kv_dim / head_dim` KV heads, written as
    /// `{arch}.attention.head_count` and `head_count_kv`.
    pub head_dim: usize,
}

/// Write the FFN-only model to `out` (crash-safe).
pub fn gen_model(
    out: &Path,
    hidden: usize,
    inter: usize,
    layers: usize,
    ty: GgmlType,
    arch: &str,
) -> crate::Result<()> {
    gen_model_with(out, hidden, inter, layers, ty, arch, None)
}

/// Write the model to `out` (crash-safe), with attention and an output head when `whole`.
pub fn gen_model_with(
    out: &Path,
    hidden: usize,
    inter: usize,
    layers: usize,
    ty: GgmlType,
    arch: &str,
    whole: Option<Whole>,
) -> crate::Result<()> {
    let bad = |reason: String| crate::Error::Unsupported {
        file: out.display().to_string(),
        reason,
    };
    if encode_as(ty, &[]).is_none() {
        return Err(bad(format!(
            "gen-model writes F32, F16, BF16, Q8_0, Q4_0, Q4_1 or Q4_K, not {ty}"
        )));
    }
    if ty.row_bytes(hidden as u64).is_none() || ty.row_bytes(inter as u64).is_none() {
        return Err(bad(format!(
            "gen-model: hidden {hidden} and intermediate {inter} must be multiples of {ty}'s block of {}",
            ty.block_elems()
        )));
    }
    let vocab = whole.map_or(256, |w| w.vocab);
    let mut b = GgufBuilder::new(32);
    b.add_kv("general.architecture", &Value::String(arch.into()));
    b.add_kv(
        &format!("{arch}.embedding_length"),
        &Value::U32(hidden as u32),
    );
    b.add_kv(
        &format!("{arch}.feed_forward_length"),
        &Value::U32(inter as u32),
    );
    b.add_kv(&format!("{arch}.block_count"), &Value::U32(layers as u32));
    b.add_kv("general.quantization_version", &Value::U32(2));
    if let Some(w) = whole {
        if w.head_dim == 0 || !hidden.is_multiple_of(w.head_dim) || w.kv_dim % w.head_dim != 0 {
            return Err(bad(format!(
                "gen-model: head size {} must divide hidden {hidden} and kv-dim {}",
                w.head_dim, w.kv_dim
            )));
        }
        for (key, n) in [
            ("head_count", hidden / w.head_dim),
            ("head_count_kv", w.kv_dim / w.head_dim),
        ] {
            b.add_kv(&format!("{arch}.attention.{key}"), &Value::U32(n as u32));
        }
    }
    // (name, ne, type, scale of the random values; 0 = ones) in file order.
    let mut plan: Vec<(String, Vec<u64>, GgmlType, f32)> = Vec::new();
    let (h, i, v) = (hidden as u64, inter as u64, vocab as u64);
    plan.push(("token_embd.weight".into(), vec![h, v], GgmlType::F16, 0.1));
    for l in 0..layers {
        if let Some(w) = whole {
            let kv = w.kv_dim as u64;
            plan.push((
                format!("blk.{l}.attn_norm.weight"),
                vec![h],
                GgmlType::F32,
                0.0,
            ));
            for (name, rows) in [("attn_q", h), ("attn_k", kv), ("attn_v", kv)] {
                plan.push((format!("blk.{l}.{name}.weight"), vec![h, rows], ty, 0.04));
            }
            plan.push((format!("blk.{l}.attn_output.weight"), vec![h, h], ty, 0.04));
        }
        plan.push((
            format!("blk.{l}.ffn_norm.weight"),
            vec![h],
            GgmlType::F32,
            0.0,
        ));
        plan.push((format!("blk.{l}.ffn_gate.weight"), vec![h, i], ty, 0.04));
        plan.push((format!("blk.{l}.ffn_up.weight"), vec![h, i], ty, 0.04));
        plan.push((format!("blk.{l}.ffn_down.weight"), vec![i, h], ty, 0.04));
    }
    if whole.is_some() {
        plan.push(("output_norm.weight".into(), vec![h], GgmlType::F32, 0.0));
        plan.push(("output.weight".into(), vec![h, v], GgmlType::F16, 0.04));
    }
    for (name, ne, t, _) in &plan {
        b.add_tensor(name, ne, *t);
    }
    let enc = |t: GgmlType, x: &[f32]| encode_as(t, x).expect("a type gen-model writes");
    let io = |err: std::io::Error| crate::Error::Write {
        file: out.display().to_string(),
        step: "write",
        err,
    };
    // The values of tensor k come from their own seeded stream, in 1 Mi-value pieces made in
    // parallel: the bytes depend on the arguments only.
    const PIECE: usize = 1 << 20;
    let values = |k: usize, count: usize, scale: f32| -> Vec<f32> {
        if scale == 0.0 {
            return vec![1.0; count];
        }
        let pieces: Vec<Vec<f32>> = (0..count.div_ceil(PIECE))
            .into_par_iter()
            .map(|p| {
                let seed = 0x9E37_79B9_7F4A_7C15u64 ^ ((k as u64) << 32) ^ p as u64;
                let mut rng = crate::testing::Rand(seed);
                rng.vec(PIECE.min(count - p * PIECE), scale)
            })
            .collect();
        pieces.concat()
    };
    crate::atomic::write_atomic(out, |w| -> crate::Result<()> {
        use std::io::Write;
        w.write_all(&b.header()).map_err(io)?;
        let mut body = BodyWriter::new(&b);
        for (k, (_, ne, t, scale)) in plan.iter().enumerate() {
            let count = ne.iter().product::<u64>() as usize;
            body.write_next(w, &enc(*t, &values(k, count, *scale)))
                .map_err(io)?;
        }
        Ok(())
    })
}

/// `x` (a whole number of `t`'s blocks) as GGUF type `t`'s bytes, by this crate's encoders (the
/// quantized ones byte-identical to ggml's reference quantizers): the types gen-model writes
/// (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K); `None` for any other.
pub fn encode_as(t: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    Some(match t {
        GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => f16::encode(x),
        GgmlType::BF16 => bf16::encode(x),
        GgmlType::Q8_0 => encode_to_vec::<Q8_0>(x),
        GgmlType::Q4_0 => encode_to_vec::<Q4_0>(x),
        GgmlType::Q4_1 => encode_to_vec::<Q4_1>(x),
        GgmlType::Q4_K => encode_to_vec::<Q4K>(x),
        _ => return None,
    })
}
