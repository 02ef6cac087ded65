//! Generate a llama-shaped GGUF of random FFN weights (plus an embedding and norms), streamed to
//! disk, for benchmarks and GPU runs that need models larger than the real ones
//! (`metrale-pack gen-model OUT.gguf HIDDEN INTER LAYERS TYPE [ARCH]`; TYPE: F32, F16, BF16,
//! Q8_0, Q4_K; ARCH: llama (SiLU) or gemma (GELU)). The same arguments give the same bytes.

use crate::GgmlType;
use crate::converters::{bf16, encode_to_vec, f16, q4_k::Q4K, q8_0::Q8_0};
use crate::gguf::Value;
use crate::gguf_write::{BodyWriter, GgufBuilder};
use std::path::Path;

/// Write the model to `out` (crash-safe).
pub fn gen_model(
    out: &Path,
    hidden: usize,
    inter: usize,
    layers: usize,
    ty: GgmlType,
    arch: &str,
) -> crate::Result<()> {
    let bad = |reason: String| crate::Error::Unsupported {
        file: out.display().to_string(),
        reason,
    };
    if !matches!(
        ty,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0 | GgmlType::Q4_K
    ) {
        return Err(bad(format!(
            "gen-model writes F32, F16, BF16, Q8_0 or Q4_K, not {ty}"
        )));
    }
    if ty.row_bytes(hidden as u64).is_none() || ty.row_bytes(inter as u64).is_none() {
        return Err(bad(format!(
            "gen-model: hidden {hidden} and intermediate {inter} must be multiples of {ty}'s block of {}",
            ty.block_elems()
        )));
    }
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
    let vocab = 256usize;
    b.add_tensor(
        "token_embd.weight",
        &[hidden as u64, vocab as u64],
        GgmlType::F16,
    );
    for l in 0..layers {
        b.add_tensor(
            &format!("blk.{l}.ffn_norm.weight"),
            &[hidden as u64],
            GgmlType::F32,
        );
        b.add_tensor(
            &format!("blk.{l}.ffn_gate.weight"),
            &[hidden as u64, inter as u64],
            ty,
        );
        b.add_tensor(
            &format!("blk.{l}.ffn_up.weight"),
            &[hidden as u64, inter as u64],
            ty,
        );
        b.add_tensor(
            &format!("blk.{l}.ffn_down.weight"),
            &[inter as u64, hidden as u64],
            ty,
        );
    }
    let mut rng = crate::testing::Rand(0x9E37_79B9_7F4A_7C15);
    let enc = |x: &[f32]| -> Vec<u8> {
        match ty {
            GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            GgmlType::F16 => f16::encode(x),
            GgmlType::BF16 => bf16::encode(x),
            GgmlType::Q8_0 => encode_to_vec::<Q8_0>(x),
            _ => encode_to_vec::<Q4K>(x),
        }
    };
    let io = |err: std::io::Error| crate::Error::Write {
        file: out.display().to_string(),
        step: "write",
        err,
    };
    crate::atomic::write_atomic(out, |w| -> crate::Result<()> {
        use std::io::Write;
        w.write_all(&b.header()).map_err(io)?;
        let mut body = BodyWriter::new(&b);
        body.write_next(w, &f16::encode(&rng.vec(hidden * vocab, 0.1)))
            .map_err(io)?;
        let norm: Vec<u8> = vec![1.0f32; hidden]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        for _ in 0..layers {
            body.write_next(w, &norm).map_err(io)?;
            for _ in 0..3 {
                body.write_next(w, &enc(&rng.vec(hidden * inter, 0.04)))
                    .map_err(io)?;
            }
        }
        Ok(())
    })
}
