//! compressed-tensors' MXFP4 (llm-compressor's `MXFP4A16` preset: E2M1 codes, an E8M0 scale
//! per 32 values) on files compressed-tensors 0.20.0 wrote (`tests/fixtures/ct-mxfp4a16-*`,
//! made by `tests/py/make_fixtures.py` with `ONLY=mxfp4`): the model decodes each weight as the
//! library dequantizes it, bit for bit; `convert` with no flag carries it into `ggml` as GGUF
//! MXFP4 blocks (the same values, nothing re-quantized) whose bytes are the source's codes and
//! scales re-laid; each tensor-parallel rank holds its slice; the layer forwards on the host
//! backend against the float64 FFN of the library's weights.

mod common;

use common::ffn::loaded_layer_err;
use common::pack::*;
use metrale_pack::HostBackend;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::converters::mxfp4_ct;
use metrale_pack::ffn::{Method, Proj};
use metrale_pack::gpu::{GpuBackend, upload_f32};
use metrale_pack::loader::{EngineOptions, LoadedModel};
use metrale_pack::model::{Activation, FfnWeight, Model};
use metrale_pack::pack::{self, blob_name_tp};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let v: Vec<PathBuf> = ["ct-mxfp4a16-bf16-i384", "ct-mxfp4a16-bf16-i320"]
        .iter()
        .map(|n| root.join(n))
        .collect();
    assert!(v.iter().all(|d| d.is_dir()), "fixtures missing: {v:?}");
    v
}

use common::HF_PROJS as PROJS;

/// Source weight `pi` of layer `l`: its packed codes, its E8M0 scales and `[n, k]`.
fn source(m: &Model, l: usize, pi: usize) -> (Vec<u8>, Vec<u8>, [usize; 2]) {
    let layer = &m.ffn_layers[l];
    let w = [&layer.gate, &layer.up, &layer.down][pi];
    let FfnWeight::CtMxfp4 { packed, scale } = *w else {
        panic!("layer {l} weight {pi}: {w:?}")
    };
    let [n, k] = m.weight_shape(w).unwrap().map(|d| d as usize);
    (m.data(packed).to_vec(), m.data(scale).to_vec(), [n, k])
}

/// The value of element `(r, c)` of a weight, as this test computes it: `E2M1[q] * 2^(e - 127)`
/// in float64 (exact), `q` nibble `c % 2` of byte `c / 2` of row `r`.
fn value(packed: &[u8], scales: &[u8], k: usize, r: usize, c: usize) -> f64 {
    const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let q = (packed[r * k / 2 + c / 2] >> (4 * (c % 2))) & 15;
    let v = E2M1[(q & 7) as usize] * if q & 8 != 0 { -1.0 } else { 1.0 };
    v * 2f64.powi(scales[r * k / 32 + c / 32] as i32 - 127)
}

/// The model's decode of every weight is the library's (`sha256_f32` of compressed-tensors'
/// own dequantization, recorded when it wrote the fixture) and this test's product element by
/// element; no flag converts into `ggml` alone with fidelity 0; each blob is type MXFP4 (39)
/// and its bytes are GGUF MXFP4 blocks: block `b` of row `r` is the scale byte of group `b`
/// and the codes of values `32 b + j` (low nibble) and `32 b + j + 16` (high); the pack decodes
/// to the same values bit for bit, but the sign of code 8's zero (compressed-tensors decodes
/// it as -0.0, ggml's MXFP4 table as +0).
#[test]
fn mxfp4_checkpoints_convert_by_default_into_ggml_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let expected: Value = common::fixture_expected(&dir);
        let m = Model::open(&dir).unwrap();
        let out = tmp.path().join(format!("{name}.mpk.gguf"));
        let p = convert_and_verify(&dir, &out, &[]);
        assert_eq!(p.manifest.layouts, ["ggml"], "{name}");
        assert!(
            p.manifest.fidelity.iter().all(|f| f.mean_rel_err == 0.0),
            "{name}: {:?}",
            p.manifest.fidelity
        );
        for l in 0..m.ffn_layers.len() {
            for (pi, (proj, hf)) in PROJS.into_iter().enumerate() {
                let ctx = format!("{name} layer {l} {hf}");
                let (packed, scales, [n, k]) = source(&m, l, pi);
                let w = [
                    &m.ffn_layers[l].gate,
                    &m.ffn_layers[l].up,
                    &m.ffn_layers[l].down,
                ][pi];
                let (dec, _) = m.decode_weight(w).unwrap();
                let key = format!("model.layers.{l}.mlp.{hf}.weight");
                let want = expected["weights"][&key]["sha256_f32"].as_str().unwrap();
                assert_eq!(
                    common::sha256_f32(&dec),
                    want,
                    "{ctx}: the library's dequantization"
                );
                for (i, &v) in dec.iter().enumerate() {
                    let w = value(&packed, &scales, k, i / k, i % k);
                    assert_eq!(v as f64, w, "{ctx}: element {i}");
                }
                let b = blob_name_tp(l, proj, Layout::Ggml, "", None);
                let i = p.index(&b).unwrap_or_else(|| panic!("{ctx}: no {b}"));
                let fe = p.manifest.tensors[i].ffn.as_ref().unwrap();
                assert_eq!(fe.scalars.get("type"), Some(&39.0), "{ctx}");
                let bytes = p.read(i).unwrap();
                assert_eq!(bytes.len(), n * k / 32 * 17, "{ctx}");
                for (at, blk) in bytes.chunks_exact(17).enumerate() {
                    let (r, b) = (at / (k / 32), at % (k / 32));
                    assert_eq!(blk[0], scales[r * k / 32 + b], "{ctx}: block {at} scale");
                    let code = |c: usize| (packed[r * k / 2 + c / 2] >> (4 * (c % 2))) & 15;
                    for j in 0..16 {
                        let want = code(32 * b + j) | code(32 * b + j + 16) << 4;
                        assert_eq!(blk[1 + j], want, "{ctx}: block {at} byte {j}");
                    }
                }
                let (got, shape) = p.decode_ffn(&b).unwrap();
                assert_eq!(shape, [n as u64, k as u64], "{ctx}");
                let plus_zero: Vec<f32> = dec.iter().map(|&v| v + 0.0).collect();
                common::assert_bits_eq(&ctx, &got, &plus_zero);
            }
        }
    }
}

/// `--tp 2`: each rank's gate and up rows and its down columns (whole groups of 32: the
/// intermediate 384 and 320 split at 192 and 160) carried as MXFP4 blocks that decode to that
/// slice of the library's values.
#[test]
fn each_rank_carries_its_slice_as_mxfp4_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let (m, p) = convert_tp_verified(&dir, tmp.path(), 2, &["ggml"]);
        let inter = m.intermediate_size.unwrap();
        for r in 0..2u32 {
            let [lo, hi] = pack::tp::rank_range(inter, 2, r).map(|v| v as usize);
            for (pi, (proj, hf)) in PROJS.into_iter().enumerate() {
                let ctx = format!("{name} rank {r} {hf}");
                let (packed, scales, [n, k]) = source(&m, 0, pi);
                let b = blob_name_tp(0, proj, Layout::Ggml, "", Some(r));
                let i = p.index(&b).unwrap_or_else(|| panic!("{ctx}: no {b}"));
                let fe = p.manifest.tensors[i].ffn.as_ref().unwrap();
                assert_eq!(fe.scalars.get("type"), Some(&39.0), "{ctx}: carried");
                let (got, shape) = p.decode_ffn(&b).unwrap();
                let [gn, gk] = shape.map(|d| d as usize);
                for row in 0..gn {
                    for col in 0..gk {
                        let (sr, sc) = if proj == Proj::Down {
                            (row, lo + col)
                        } else {
                            (lo + row, col)
                        };
                        let inside = sr < n && sc < k && (proj != Proj::Down || sc < hi);
                        let inside = inside && (proj == Proj::Down || sr < hi);
                        let want = if inside {
                            value(&packed, &scales, k, sr, sc)
                        } else {
                            0.0
                        };
                        assert_eq!(got[row * gk + col] as f64, want, "{ctx} ({row}, {col})");
                    }
                }
            }
        }
    }
}

/// The default pack loads on the host backend and the engine's arm (`ggml gemv`, q8_1
/// activations twice) forwards each layer within 4e-2 of the float64 FFN of the library's
/// weights on 1, 3 and 9 rows, and within 1e-2 on 20 (BF16 weights and activations).
#[test]
fn the_layer_forwards_against_the_float64_ffn() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixtures().pop().unwrap();
    let m = Model::open(&dir).unwrap();
    let out = tmp.path().join("p.mpk.gguf");
    convert_and_verify(&dir, &out, &[]);
    let (hidden, inter) = (
        m.hidden_size.unwrap() as usize,
        m.intermediate_size.unwrap() as usize,
    );
    let host = Arc::new(HostBackend::new());
    let backend: Arc<dyn GpuBackend> = host.clone();
    let opts = EngineOptions {
        max_tokens: 20,
        ..Default::default()
    };
    let mut lm = LoadedModel::load(&out, backend.clone(), &opts).unwrap();
    let x = metrale_pack::testing::Rand(67).vec(20 * hidden, 1.0);
    let input = backend.alloc((20 * hidden * 4) as u64).unwrap();
    upload_f32(backend.as_ref(), input, &x).unwrap();
    for l in 0..m.ffn_layers.len() {
        let arm = lm.layer(l).unwrap().serving_arm(&lm.ctx, Method::Decode, 1);
        assert_eq!(arm.map(|a| a.name), Some("ggml gemv"));
        let fl = &m.ffn_layers[l];
        let [gate, up, down] = [&fl.gate, &fl.up, &fl.down].map(|w| m.decode_weight(w).unwrap().0);
        let dw = metrale_pack::testing::DenseWeights {
            gate,
            up,
            down,
            hidden,
            inter,
        };
        for rows in [1, 3, 9, 20] {
            let err = loaded_layer_err(&mut lm, l, (input, &x), rows, &dw, Activation::Silu);
            println!("layer {l}, {rows} rows: {err:.2e} against the float64 FFN");
            assert!(
                err < if rows > 16 { 1e-2 } else { 4e-2 },
                "layer {l}, {rows}: {err:.2e}"
            );
        }
    }
    backend.free(input);
    drop(lm);
    assert_eq!(host.live_allocations(), 0);
}

/// A scale byte 255 (NaN in the OCP MX spec; compressed-tensors decodes it as infinity, ggml
/// as 2^127): the weight is not laid out as GGUF blocks.
#[test]
fn a_nan_scale_is_not_laid_out() {
    let dir = fixtures().remove(0);
    let m = Model::open(&dir).unwrap();
    let (packed, mut scales, [n, k]) = source(&m, 0, 0);
    assert!(mxfp4_ct::to_gguf_blocks(&packed, &scales, n, k).is_some());
    scales[5] = mxfp4_ct::NAN_SCALE;
    assert!(mxfp4_ct::to_gguf_blocks(&packed, &scales, n, k).is_none());
}
