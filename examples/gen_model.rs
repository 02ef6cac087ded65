//! Generate a llama-shaped GGUF of random FFN weights (plus embedding and norms), streamed to
//! disk, for benchmarks and GPU tests that need models larger than the real ones:
//! `cargo run --release --example gen_model -- OUT.gguf HIDDEN INTER LAYERS TYPE [ARCH]`
//! (TYPE: F32, F16, BF16, Q8_0, Q4_K; ARCH: llama (SiLU, default) or gemma (GELU)).

use metrale_pack::GgmlType;
use metrale_pack::converters::{bf16, encode_to_vec, f16, q4_k::Q4K, q8_0::Q8_0};
use metrale_pack::gguf::Value;
use metrale_pack::gguf_write::{BodyWriter, GgufBuilder};
use std::io::Write;

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    anyhow::ensure!(
        a.len() >= 5,
        "usage: gen_model OUT.gguf HIDDEN INTER LAYERS TYPE [ARCH]"
    );
    let (hidden, inter, layers): (usize, usize, usize) =
        (a[1].parse()?, a[2].parse()?, a[3].parse()?);
    let ty = GgmlType::from_name(&a[4]).ok_or_else(|| anyhow::anyhow!("unknown type {}", a[4]))?;
    let arch = a.get(5).map(String::as_str).unwrap_or("llama");
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
    let vocab = 256;
    b.add_tensor("token_embd.weight", &[hidden as u64, vocab], GgmlType::F16);
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
    let mut w = std::io::BufWriter::with_capacity(1 << 22, std::fs::File::create(&a[0])?);
    w.write_all(&b.header())?;
    let mut body = BodyWriter::new(&b);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rand = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let u = (seed >> 40) as f32 / (1u64 << 24) as f32;
                (u - 0.5) * scale
            })
            .collect()
    };
    let enc = |x: &[f32]| -> Vec<u8> {
        match ty {
            GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            GgmlType::F16 => f16::encode(x),
            GgmlType::BF16 => bf16::encode(x),
            GgmlType::Q8_0 => encode_to_vec::<Q8_0>(x),
            GgmlType::Q4_K => encode_to_vec::<Q4K>(x),
            other => panic!("gen_model does not write {other}"),
        }
    };
    body.write_next(&mut w, &f16::encode(&rand(hidden * vocab as usize, 0.1)))?;
    for l in 0..layers {
        body.write_next(
            &mut w,
            &vec![1.0f32; hidden]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        for _ in 0..3 {
            body.write_next(&mut w, &enc(&rand(hidden * inter, 0.08)))?;
        }
        eprint!("\rlayer {}/{layers}", l + 1);
    }
    w.flush()?;
    eprintln!("\nwrote {}", a[0]);
    Ok(())
}
