//! FP8 E4M3 checkpoints with one scale per output row or one per tensor (compressed-tensors'
//! `FP8_DYNAMIC` and `FP8` presets, ModelOpt's `FP8_DEFAULT_CFG`), on files those libraries
//! wrote (`tests/fixtures`, made by `tests/py/make_fixtures.py`): `convert` with no flag carries
//! them into `w8a8` byte for byte (codes as stored, scales widened to f32, nothing
//! re-quantized), the pack decodes to the library's own dequantization bit for bit, each
//! tensor-parallel rank holds its exact slice, and a GELU model converts the same way and
//! forwards with the tanh GELU.

mod common;

use common::pack::*;
use metrale_pack::converters::fp8;
use metrale_pack::converters::layouts::{Layout, f32_from};
use metrale_pack::ffn::Proj;
use metrale_pack::model::{FfnWeight, Model};
use metrale_pack::pack::{self, ConvertOptions, blob_name_tp, choice};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.starts_with("ct-fp8-channel") || n.starts_with("ct-fp8-tensor") || n == "modelopt-fp8"
        })
        .collect();
    v.sort();
    assert_eq!(v.len(), 9, "fixtures missing: {v:?}");
    v
}

use common::HF_PROJS as PROJS;

/// Source weight `pi` of layer `l`: its E4M3 codes `[n, k]` and its scale per row, widened to
/// f32 (one per tensor repeated for each row).
fn source_rows(m: &Model, l: usize, pi: usize) -> (Vec<u8>, Vec<f32>, [usize; 2]) {
    let layer = &m.ffn_layers[l];
    let w = [&layer.gate, &layer.up, &layer.down][pi];
    let (FfnWeight::Fp8Channel { weight, scale } | FfnWeight::Fp8Tensor { weight, scale }) = *w
    else {
        panic!("layer {l} weight {pi}: {w:?}")
    };
    let [n, k] = m.weight_shape(w).unwrap().map(|d| d as usize);
    let mut s = m.floats(scale, "weight_scale").unwrap();
    if s.len() == 1 {
        s = vec![s[0]; n];
    }
    (m.data(weight).to_vec(), s, [n, k])
}

/// With no flag every such checkpoint converts to `w8a8` alone; each projection's `codes` are
/// the source's codes row by row (zero-padded to 128 columns), its `scales` the source's scales
/// as f32, bit for bit; the pack's decode is the library's dequantization (the fixture's
/// `sha256_f32`, written by compressed-tensors or ModelOpt) bit for bit; the fidelity is 0;
/// `verify --source` passes.
#[test]
fn fp8_row_checkpoints_convert_by_default_into_w8a8_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    for dir in fixtures() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let expected: Value = common::fixture_expected(&dir);
        let out = tmp.path().join(format!("{name}.mpk.gguf"));
        let p = convert_and_verify(&dir, &out, &[]);
        assert_eq!(p.manifest.layouts, ["w8a8"], "{name}");
        assert!(
            p.manifest.fidelity.iter().all(|f| f.mean_rel_err == 0.0),
            "{name}: {:?}",
            p.manifest.fidelity
        );
        let m = Model::open(&dir).unwrap();
        for l in 0..m.ffn_layers.len() {
            for (pi, (proj, hf)) in PROJS.into_iter().enumerate() {
                let ctx = format!("{name} layer {l} {hf}");
                let (codes, scales, [n, k]) = source_rows(&m, l, pi);
                let blob = |part| {
                    let b = blob_name_tp(l, proj, Layout::W8a8, part, None);
                    p.read(p.index(&b).unwrap_or_else(|| panic!("{ctx}: no {b}")))
                        .unwrap()
                };
                let (got_codes, got_scales) = (blob("codes"), f32_from(&blob("scales")));
                let kp = k.div_ceil(128) * 128;
                assert_eq!(got_codes.len(), n * kp, "{ctx}");
                for r in 0..n {
                    let row = &got_codes[r * kp..(r + 1) * kp];
                    assert_eq!(&row[..k], &codes[r * k..(r + 1) * k], "{ctx}: row {r}");
                    assert!(row[k..].iter().all(|&b| b == 0), "{ctx}: row {r} padding");
                }
                assert_eq!(
                    got_scales.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
                    scales.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
                    "{ctx}: scales"
                );
                let (dec, shape) = p
                    .decode_ffn(&blob_name_tp(l, proj, Layout::W8a8, "", None))
                    .unwrap();
                assert_eq!(shape, [n as u64, k as u64], "{ctx}");
                let key = format!("model.layers.{l}.mlp.{hf}.weight");
                if let Some(w) = expected["weights"].get(&key) {
                    assert_eq!(
                        common::sha256_f32(&dec),
                        w["sha256_f32"].as_str().unwrap(),
                        "{ctx}: the library's dequantization"
                    );
                }
                // And against this test's own product, element by element.
                for (i, &v) in dec.iter().enumerate() {
                    let want = fp8::e4m3_to_f32(codes[i]) * scales[i / k];
                    assert_eq!(v.to_bits(), want.to_bits(), "{ctx}: element {i}");
                }
            }
        }
    }
}

/// `--tp 2`: each rank's gate and up rows with their scale rows, and its down columns with
/// every scale, carried exactly; the rows or columns padded to the rank width are zero codes
/// (and zero scales for padded rows).
#[test]
fn each_rank_of_a_tensor_parallel_pack_carries_its_exact_slice() {
    let tmp = tempfile::tempdir().unwrap();
    for dir in fixtures().into_iter().filter(|d| {
        d.ends_with("ct-fp8-channel-bf16-i320") || d.ends_with("ct-fp8-tensor-f32-i384")
    }) {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let (m, p) = convert_tp_verified(&dir, tmp.path(), 2, &["w8a8"]);
        let inter = m.intermediate_size.unwrap();
        for r in 0..2u32 {
            let [lo, hi] = pack::tp::rank_range(inter, 2, r).map(|v| v as usize);
            for (pi, (proj, hf)) in PROJS.into_iter().enumerate() {
                let ctx = format!("{name} rank {r} {hf}");
                let (codes, scales, [n, k]) = source_rows(&m, 0, pi);
                let blob = |part| {
                    let b = blob_name_tp(0, proj, Layout::W8a8, part, Some(r));
                    p.read(p.index(&b).unwrap_or_else(|| panic!("{ctx}: no {b}")))
                        .unwrap()
                };
                let (got, got_s) = (blob("codes"), f32_from(&blob("scales")));
                if proj == Proj::Down {
                    // Columns lo..hi of every row, the scales whole.
                    let kp = got.len() / n;
                    assert!(kp >= hi - lo && kp % 128 == 0, "{ctx}: {kp}");
                    for row in 0..n {
                        let g = &got[row * kp..(row + 1) * kp];
                        assert_eq!(&g[..hi - lo], &codes[row * k + lo..row * k + hi], "{ctx}");
                        assert!(g[hi - lo..].iter().all(|&b| b == 0), "{ctx}: padding");
                    }
                    assert_eq!(got_s, scales, "{ctx}: scales");
                } else {
                    // Rows lo..hi with their scales, then zero rows with zero scales.
                    let kp = k.div_ceil(128) * 128;
                    let rows = got.len() / kp;
                    assert_eq!(got_s.len(), rows, "{ctx}");
                    assert!(rows >= hi - lo, "{ctx}");
                    for (i, row) in (lo..hi).enumerate() {
                        assert_eq!(
                            &got[i * kp..i * kp + k],
                            &codes[row * k..(row + 1) * k],
                            "{ctx}: row {row}"
                        );
                    }
                    assert_eq!(&got_s[..hi - lo], &scales[lo..hi], "{ctx}: scales");
                    assert!(got[(hi - lo) * kp..].iter().all(|&b| b == 0), "{ctx}");
                    assert!(got_s[hi - lo..].iter().all(|&s| s == 0.0), "{ctx}");
                }
            }
        }
    }
}

/// A GELU model of FP8 rows (the fixture with `hidden_act` gelu_pytorch_tanh): no flag carries
/// it into `w8a8` as a SiLU one, and the layer forwards with the GELU against the float64 FFN.
#[test]
fn a_gelu_fp8_row_checkpoint_converts_into_w8a8_and_forwards() {
    let tmp = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ct-fp8-channel-bf16-i384");
    let dir = tmp.path().join("gelu");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    cfg["hidden_act"] = "gelu_pytorch_tanh".into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let m = Model::open(&dir).unwrap();
    assert_eq!(m.activation, Some(metrale_pack::model::Activation::Gelu));
    assert_eq!(
        choice::default_for(&m, &ConvertOptions::default()),
        Some(vec![Layout::W8a8])
    );
    forwards_against_float64(&dir, metrale_pack::model::Activation::Gelu);
}

/// The default pack of a compressed-tensors `FP8_DYNAMIC` checkpoint loads on the host backend
/// and its layer computes the FFN of the library's decoded weights: the W8A8 arm on 1, 3 and
/// 20 rows against the float64 FFN (activations quantized to E4M3 per row, twice).
#[test]
fn the_carried_pack_forwards_the_sources_ffn() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ct-fp8-channel-bf16-i384");
    forwards_against_float64(&dir, metrale_pack::model::Activation::Silu);
}

/// Convert `dir` by default into `w8a8`, load it on the host backend and forward layer 0 on 1,
/// 3 and 20 rows against the float64 FFN of the library's weights with activation `act`.
fn forwards_against_float64(dir: &Path, act: metrale_pack::model::Activation) {
    use metrale_pack::HostBackend;
    use metrale_pack::gpu::{GpuBackend, download_f32, upload_f32};
    use metrale_pack::loader::{EngineOptions, LoadedModel};
    use std::sync::Arc;
    let dir = dir.to_path_buf();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p.mpk.gguf");
    let p = convert_and_verify(&dir, &out, &[]);
    assert_eq!(p.manifest.layouts, ["w8a8"]);
    let m = Model::open(&dir).unwrap();
    let (hidden, inter) = (
        m.hidden_size.unwrap() as usize,
        m.intermediate_size.unwrap() as usize,
    );
    let w: Vec<Vec<f32>> = (0..3)
        .map(|pi| {
            let layer = &m.ffn_layers[0];
            m.decode_weight([&layer.gate, &layer.up, &layer.down][pi])
                .unwrap()
                .0
        })
        .collect();
    let [gate, up, down]: [Vec<f32>; 3] = w.try_into().unwrap();
    let dw = metrale_pack::testing::DenseWeights {
        gate,
        up,
        down,
        hidden,
        inter,
    };
    let host = Arc::new(HostBackend::new());
    let backend: Arc<dyn GpuBackend> = host.clone();
    let opts = EngineOptions {
        max_tokens: 20,
        verify_checksums: true,
        ..Default::default()
    };
    let mut lm = LoadedModel::load(&out, backend.clone(), &opts).unwrap();
    let x = metrale_pack::testing::Rand(67).vec(20 * hidden, 1.0);
    let input = backend.alloc((20 * hidden * 4) as u64).unwrap();
    upload_f32(backend.as_ref(), input, &x).unwrap();
    for rows in [1, 3, 20] {
        let y = lm.forward(0, input, rows).unwrap();
        let y = download_f32(backend.as_ref(), y.view(0, (rows * hidden * 4) as u64)).unwrap();
        let want = metrale_pack::testing::ffn_f64(&x[..rows * hidden], rows, &dw, act);
        let err = metrale_pack::testing::rel_err(&y, &want);
        println!("{act:?}, {rows} rows: {err:.2e} against the float64 FFN");
        // E4M3 keeps 3 mantissa bits: each activation rounded by up to 2^-4 of itself, the
        // input and the act-mul's output both (no weight error: the codes are the source's);
        // measured 3.3e-2 .. 4.0e-2; 6e-2.
        assert!(err < 6e-2, "{rows} rows: {err:.2e}");
    }
    backend.free(input);
    drop(lm);
    assert_eq!(host.live_allocations(), 0);
}
