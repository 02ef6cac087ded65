//! The smallest engine: one call loads a pack and installs every dense FFN layer; a forward
//! per layer; dropping the model frees what it holds.
//!
//!     cargo run --release --example engine                  # a generated model, host backend
//!     cargo run --release --example engine -- [model.mpk.gguf] [--cuda]
//!
//! Without a path it writes a two-layer llama FFN (hidden 256, intermediate 512, F32 weights),
//! converts it with the default layouts, and checks each layer's output for 1 and 4 rows
//! against a float64 FFN of the weights the pack holds (decoded from its NVFP4 blobs): the
//! normwise error must stay under 1% (2.6e-3 measured on the host backend). CI runs it that way.

// The engine's API, from the crate root; the model generator and the float64 reference below
// also read the GGUF writer and the pack's blob names.
use metrale_pack::gguf::Value;
use metrale_pack::gpu::{download_f32, upload_f32};
use metrale_pack::layout::{Layout, Proj};
use metrale_pack::pack::blob_name;
use metrale_pack::{
    ConvertOptions, CudaBackend, EngineOptions, GgmlType, GpuBackend, HostBackend, LoadedModel,
    Model, Pack,
};
use std::path::Path;
use std::sync::Arc;

const HIDDEN: usize = 256;
const INTER: usize = 512;
const LAYERS: usize = 2;
/// Rows of the prefill call.
const ROWS: usize = 4;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let given = args.iter().find(|a| !a.starts_with("--"));
    let dir = tempfile::tempdir()?;
    let path = match given {
        Some(p) => Path::new(p).to_path_buf(),
        None => generated_pack(dir.path())?,
    };
    let backend: Arc<dyn GpuBackend> = if args.iter().any(|a| a == "--cuda") {
        Arc::new(CudaBackend::new(0)?)
    } else {
        Arc::new(HostBackend::new())
    };
    let opts = EngineOptions {
        max_tokens: ROWS,
        verify_checksums: true,
        ..Default::default()
    };
    // The one call: open, validate, copy, install, probe, check.
    let mut model = LoadedModel::load(&path, backend.clone(), &opts)?;
    let hidden = model.ctx.config.hidden;
    println!(
        "loaded {} ({} layers, hidden {hidden}) in {:.3} s",
        path.display(),
        model.layer_indices().count(),
        model.pack.stats.total_seconds
    );
    let x: Vec<f32> = (0..ROWS * hidden)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
        .collect();
    let input = backend.alloc((ROWS * hidden * 4) as u64)?;
    upload_f32(backend.as_ref(), input, &x)?;
    let layers: Vec<usize> = model.layer_indices().collect();
    let mut worst = 0f64;
    for &l in &layers {
        for m in [1, ROWS] {
            let out = model.forward(l, input, m)?;
            backend.synchronize(model.ctx.stream)?;
            let y = download_f32(backend.as_ref(), out.view(0, (m * hidden * 4) as u64))?;
            if given.is_none() {
                let want = reference(&model.pack.pack, l, &x[..m * hidden], m)?;
                let err = rel_err(&y, &want);
                println!("layer {l}, {m} rows: error {err:.2e} against the float64 FFN");
                worst = worst.max(err);
            } else {
                println!("layer {l}, {m} rows: output[0..4] = {:?}", &y[..4]);
            }
        }
    }
    backend.free(input);
    drop(model);
    if given.is_none() && worst >= 0.01 {
        anyhow::bail!("worst error {worst:.2e} is not under 1e-2");
    }
    Ok(())
}

/// A two-layer llama FFN in F32, converted with the default layouts.
fn generated_pack(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut weights = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 * 0.1 - 0.05).to_le_bytes()
            })
            .collect()
    };
    let names: Vec<[String; 3]> = (0..LAYERS)
        .map(|l| ["gate", "up", "down"].map(|p| format!("blk.{l}.ffn_{p}.weight")))
        .collect();
    let mut tensors = Vec::new();
    for n in &names {
        let (h, i) = (HIDDEN as u64, INTER as u64);
        tensors.push((
            n[0].as_str(),
            vec![h, i],
            GgmlType::F32,
            weights(HIDDEN * INTER),
        ));
        tensors.push((
            n[1].as_str(),
            vec![h, i],
            GgmlType::F32,
            weights(HIDDEN * INTER),
        ));
        tensors.push((
            n[2].as_str(),
            vec![i, h],
            GgmlType::F32,
            weights(HIDDEN * INTER),
        ));
    }
    let img = metrale_pack::gguf_write::build(
        32,
        &[
            ("general.architecture", Value::String("llama".into())),
            ("llama.embedding_length", Value::U32(HIDDEN as u32)),
            ("llama.feed_forward_length", Value::U32(INTER as u32)),
        ],
        &tensors,
    );
    let src = dir.join("ffn.gguf");
    std::fs::write(&src, img)?;
    let out = dir.join("ffn.mpk.gguf");
    metrale_pack::convert(
        &Model::open(&src)?,
        &ConvertOptions::default(),
        &out,
        &|_, _| {},
    )?;
    Ok(out)
}

/// `down(silu(gate x) * up x)` in float64 over the layer's NVFP4 weights as the pack holds them.
fn reference(p: &Pack, layer: usize, x: &[f32], m: usize) -> anyhow::Result<Vec<f64>> {
    let w = |proj| p.decode_ffn(&blob_name(layer, proj, Layout::Nvfp4, "codes"));
    let ((g, gs), (u, _), (d, ds)) = (w(Proj::Gate)?, w(Proj::Up)?, w(Proj::Down)?);
    let (inter, hidden) = (gs[0] as usize, gs[1] as usize);
    assert_eq!(ds, [hidden as u64, inter as u64]);
    let dot =
        |w: &[f32], x: &[f32]| -> f64 { w.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum() };
    let mut y = vec![0f64; m * hidden];
    for r in 0..m {
        let xr = &x[r * hidden..(r + 1) * hidden];
        let a: Vec<f64> = (0..inter)
            .map(|j| {
                let gv = dot(&g[j * hidden..(j + 1) * hidden], xr);
                let uv = dot(&u[j * hidden..(j + 1) * hidden], xr);
                gv / (1.0 + (-gv).exp()) * uv
            })
            .collect();
        for o in 0..hidden {
            let row = &d[o * inter..(o + 1) * inter];
            y[r * hidden + o] = row.iter().zip(&a).map(|(w, v)| *w as f64 * v).sum();
        }
    }
    Ok(y)
}

/// ‖y − want‖ / ‖want‖ in float64.
fn rel_err(y: &[f32], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, b) in y.iter().zip(want) {
        num += (*a as f64 - b).powi(2);
        den += b * b;
    }
    (num / den.max(1e-300)).sqrt()
}
