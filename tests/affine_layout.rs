//! The `affine` pack layout end to end: a real GGUF (SmolLM2-135M-Instruct Q4_1, written by
//! llama.cpp's tools) converted with `--layouts affine` carries every FFN weight, which the pack
//! decodes bit for bit as gguf-py 0.19.0 dequantizes the source tensor (but for a zero's sign);
//! Q4_0 and Q8_0 sources likewise; a float source is quantized to Q8_0 groups first; the
//! manifest's bits and group are checked; and the layer's affine arms compute the float64 FFN
//! of the pack's weights on the host backend.

mod common;

use common::pack::*;
use common::*;
use metrale_pack::GgmlType;
use metrale_pack::model::{DType, Model};
use metrale_pack::pack::Pack;
use std::path::Path;

/// Every FFN weight of `src` (GGUF) against its blob in the `affine` pack `p`: gguf-py's
/// dequantization of the source bytes, bit for bit but for the sign of a zero. Returns the
/// number of weights compared.
fn pack_equals_gguf_py(src: &Path, p: &Pack, dir: &Path) -> usize {
    let model = Model::open(src).unwrap();
    let mut compared = 0;
    for layer in 0.. {
        let Some(_) = model.index_of(&format!("blk.{layer}.ffn_gate.weight")) else {
            break;
        };
        for proj in ["gate", "up", "down"] {
            let t = model
                .tensor(&format!("blk.{layer}.ffn_{proj}.weight"))
                .unwrap();
            let DType::Ggml(ty) = model.tensors[t].dtype else {
                panic!("not a GGUF tensor")
            };
            let theirs = gguf_py_dequant(ty, model.data(t), dir);
            let (ours, _) = p
                .decode_ffn(&format!("blk.{layer}.ffn_{proj}.affine"))
                .unwrap();
            let zero_unsigned = |v: &[f32]| -> Vec<f32> {
                v.iter().map(|&x| if x == 0.0 { 0.0 } else { x }).collect()
            };
            assert_bits_eq(
                &format!("layer {layer} {proj} ({ty})"),
                &zero_unsigned(&ours),
                &zero_unsigned(&theirs),
            );
            compared += ours.len();
        }
    }
    compared
}

#[test]
fn smollm2_q4_1_converted_to_affine_decodes_as_gguf_py_bit_for_bit() {
    let src = smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.mpk.gguf");
    let p = convert_and_verify(&src, &out, &["--layouts", "affine"]);
    let n = pack_equals_gguf_py(&src, &p, dir.path());
    assert!(n >= 30 * 3 * 576 * 1536, "{n} weights compared");
    // The source's codes and scales are carried: 4-bit codes, groups of 32.
    let e = p
        .manifest
        .tensors
        .iter()
        .find_map(|t| t.ffn.as_ref().filter(|f| f.layout == "affine"))
        .unwrap();
    assert_eq!(e.scalars.get("bits"), Some(&4.0));
    assert_eq!(e.scalars.get("group"), Some(&32.0));
}

#[test]
fn q4_0_and_q8_0_sources_are_carried_and_floats_quantized_to_q8_0_groups() {
    let dir = tempfile::tempdir().unwrap();
    for (ty, bits) in [(GgmlType::Q4_0, 4.0), (GgmlType::Q8_0, 8.0)] {
        let src = dir.path().join(format!("{ty}.gguf"));
        metrale_pack::testing::gen_model::gen_model(&src, 256, 640, 2, ty, "llama").unwrap();
        let out = dir.path().join(format!("{ty}.mpk.gguf"));
        let p = convert_and_verify(&src, &out, &["--layouts", "affine"]);
        assert_eq!(pack_equals_gguf_py(&src, &p, dir.path()), 2 * 3 * 256 * 640);
        let bits_seen: Vec<f32> = p
            .manifest
            .tensors
            .iter()
            .filter_map(|t| t.ffn.as_ref())
            .map(|f| f.scalars["bits"])
            .collect();
        assert!(bits_seen.iter().all(|&b| b == bits), "{ty}: {bits_seen:?}");
    }
    // An F32 source (k = 200: a partial group) is quantized by ggml's Q8_0 rule per 32 values.
    let src = dir.path().join("f32.gguf");
    metrale_pack::testing::gen_model::gen_model(&src, 200, 320, 1, GgmlType::F32, "llama").unwrap();
    let out = dir.path().join("f32.mpk.gguf");
    let p = convert_and_verify(&src, &out, &["--layouts", "affine", "--allow-requantize"]);
    let model = Model::open(&src).unwrap();
    let t = model.tensor("blk.0.ffn_gate.weight").unwrap();
    let x = metrale_pack::converters::layouts::f32_from(model.data(t));
    let (n, k) = (320, 200);
    let mut padded = vec![0f32; n * 224];
    for r in 0..n {
        padded[r * 224..r * 224 + k].copy_from_slice(&x[r * k..(r + 1) * k]);
    }
    let raw =
        metrale_pack::converters::encode_to_vec::<metrale_pack::converters::q8_0::Q8_0>(&padded);
    let want = gguf_py_dequant(GgmlType::Q8_0, &raw, dir.path());
    let want: Vec<f32> = (0..n)
        .flat_map(|r| want[r * 224..r * 224 + k].to_vec())
        .map(|v| if v == 0.0 { 0.0 } else { v })
        .collect();
    let (ours, shape) = p.decode_ffn("blk.0.ffn_gate.affine").unwrap();
    assert_eq!(shape, [320, 200]);
    let ours: Vec<f32> = ours
        .iter()
        .map(|&v| if v == 0.0 { 0.0 } else { v })
        .collect();
    assert_bits_eq("f32 source as Q8_0 groups", &ours, &want);
}

#[test]
fn affine_bits_group_or_form_the_layout_does_not_store_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("q.gguf");
    metrale_pack::testing::gen_model::gen_model(&src, 128, 256, 1, GgmlType::Q4_0, "llama")
        .unwrap();
    let out = dir.path().join("q.mpk.gguf");
    convert_and_verify(&src, &out, &["--layouts", "affine"]);
    let img = std::fs::read(&out).unwrap();
    for (from, to, field) in [
        (&br#""bits":4.0"#[..], &br#""bits":5.0"#[..], "ffn.scalars"),
        (
            &br#""group":32.0"#[..],
            &br#""group":48.0"#[..],
            "ffn.scalars",
        ),
        (&br#""form":0.0"#[..], &br#""form":3.0"#[..], "ffn.scalars"),
        // A group the layout stores, but not the one the blob's scales part was written for.
        (
            &br#""group":32.0"#[..],
            &br#""group":64.0"#[..],
            "differ from",
        ),
    ] {
        let bad = edited_manifest(&img, from, to);
        let p = dir.path().join("bad.mpk.gguf");
        std::fs::write(&p, bad).unwrap();
        let e = Pack::open(&p).err().expect("refused").to_string();
        assert!(e.contains(field) && e.contains("affine"), "{e}");
    }
}

#[test]
fn an_affine_pack_written_before_the_form_scalar_opens_in_the_offset_form() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("q.gguf");
    metrale_pack::testing::gen_model::gen_model(&src, 128, 256, 1, GgmlType::Q4_1, "llama")
        .unwrap();
    let out = dir.path().join("q.mpk.gguf");
    convert_and_verify(&src, &out, &["--layouts", "affine"]);
    // The manifest as packs of sessions 18-19 wrote it: no `form` in any blob's scalars (the
    // key blanked to whitespace, so the header keeps its length).
    let mut img = std::fs::read(&out).unwrap();
    for _ in 0..6 {
        img = edited_manifest(&img, br#""form":0.0,"#, b"           ");
    }
    assert!(!img.windows(6).any(|w| w == br#""form""#));
    let old = dir.path().join("old.mpk.gguf");
    std::fs::write(&old, &img).unwrap();
    let (new, old) = (Pack::open(&out).unwrap(), Pack::open(&old).unwrap());
    for proj in ["gate", "up", "down"] {
        let name = format!("blk.0.ffn_{proj}.affine");
        let (a, b) = (
            new.decode_ffn(&name).unwrap(),
            old.decode_ffn(&name).unwrap(),
        );
        assert!(a == b, "{proj}");
    }
}
