//! Every codec against its independent reference, bit for bit: the decoders against gguf-py
//! 0.19.0 `gguf.quants.dequantize` on fresh random bytes and on edge values, the Q8_0/Q4_K/Q2_K
//! encoders against ggml's `quantize_row_*_ref` through libgguf 0.2.2, on fresh random data.

mod common;

use common::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::{
    self, BlockEncode, q2_k::Q2K, q4_0::Q4_0, q4_1::Q4_1, q4_k::Q4K, q8_0::Q8_0,
};

const DECODED: &[GgmlType] = &[
    GgmlType::F16,
    GgmlType::BF16,
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
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

#[test]
fn decoders_match_gguf_py_bit_for_bit_on_random_bytes() {
    let mut rng = Rng::fresh("decoders");
    let dir = tempfile::tempdir().unwrap();
    for &ty in DECODED {
        // 37 blocks of random bytes: every scale, code and bit pattern, NaN and Inf included.
        let blocks = 37u64;
        let elems = (blocks * ty.block_elems()).max(4096) as usize;
        let nbytes = ty.row_bytes(elems as u64).unwrap() as usize;
        let raw = rng.bytes(nbytes);
        let theirs = gguf_py_dequant(ty, &raw, dir.path());
        let mut ours = vec![0f32; elems];
        converters::decode_ggml(ty, &raw, &mut ours).unwrap();
        assert_bits_eq(ty.name(), &ours, &theirs);
    }
}

/// Byte patterns that put a format's edge values in every field they cover, whatever its block
/// layout: zero everything; all ones (the largest codes, NaN scales); f16 1.0, -1.0, +inf,
/// -0.0, 65504 and the smallest subnormal at even offsets; nibbles 7/8 and 0/15 in every code.
const EDGE_PATTERNS: &[&[u8]] = &[
    &[0x00],
    &[0xFF],
    &[0x00, 0x3C],
    &[0x00, 0xBC],
    &[0x00, 0x7C],
    &[0x00, 0x80],
    &[0xFF, 0x7B],
    &[0x01, 0x00],
    &[0x77],
    &[0x88],
    &[0x0F],
    &[0xF0],
    &[0x00, 0x3C, 0xFF, 0xFF],
];

/// Issue 56's bytes goal on its edge values: every block type decodes bit for bit as gguf-py
/// does on blocks made of each [`EDGE_PATTERNS`] pattern (zero and negative scales, infinite
/// and NaN ones, the largest codes), two blocks a pattern, 4096 values at the least.
#[test]
fn decoders_match_gguf_py_bit_for_bit_on_edge_values() {
    let dir = tempfile::tempdir().unwrap();
    for &ty in DECODED {
        let block = ty.block_bytes() as usize;
        // Two blocks a pattern, the patterns repeated to 4096 values at the least.
        let mut raw = Vec::new();
        while raw.is_empty() || (raw.len() / block) as u64 * ty.block_elems() < 4096 {
            for pat in EDGE_PATTERNS {
                raw.extend(pat.iter().copied().cycle().take(2 * block));
            }
        }
        let theirs = gguf_py_dequant(ty, &raw, dir.path());
        let mut ours = vec![0f32; (raw.len() / block) * ty.block_elems() as usize];
        converters::decode_ggml(ty, &raw, &mut ours).unwrap();
        assert_bits_eq(&format!("{} edge values", ty.name()), &ours, &theirs);
        // The patterns reach what they are for: zeros, and NaN or infinite scales where the
        // format can hold them (GGUF NVFP4's UE4M3 scales cannot: ggml ignores bit 7 and reads
        // 0x7F as zero, `converters/nvfp4.rs`).
        assert!(ours.contains(&0.0), "{}: no zero", ty.name());
        assert!(
            ty == GgmlType::NVFP4 || ours.iter().any(|v| !v.is_finite()),
            "{}: no NaN or infinity",
            ty.name()
        );
    }
}

fn check_encoder<F: BlockEncode>(ty: GgmlType, rng: &mut Rng, rows: usize, cols: usize) {
    let dir = tempfile::tempdir().unwrap();
    let x = rng.weights(rows * cols);
    let inp = dir.path().join("x.npy");
    let out = dir.path().join("q.npy");
    write_npy_f32(&inp, &[rows, cols], &x);
    python_ref(&[
        "quant",
        ty.name(),
        inp.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    let theirs = read_npy(&out).data;
    let ours = converters::encode_to_vec::<F>(&x);
    assert_eq!(ours.len(), theirs.len(), "{ty}: byte length");
    if let Some(i) = ours.iter().zip(&theirs).position(|(a, b)| a != b) {
        let bb = converters::block_bytes::<F>();
        panic!(
            "{ty}: first differing byte {i} (block {}, byte {} in block)",
            i / bb,
            i % bb
        );
    }
}

#[test]
fn q8_0_encoder_is_byte_identical_to_ggml_reference() {
    let mut rng = Rng::fresh("q8_0");
    check_encoder::<Q8_0>(GgmlType::Q8_0, &mut rng, 64, 4096);
}

#[test]
fn q4_0_and_q4_1_encoders_are_byte_identical_to_ggml_reference() {
    let mut rng = Rng::fresh("q4_0");
    check_encoder::<Q4_0>(GgmlType::Q4_0, &mut rng, 64, 4096);
    check_encoder::<Q4_1>(GgmlType::Q4_1, &mut rng, 64, 4096);
}

#[test]
fn q4_k_encoder_is_byte_identical_to_ggml_reference() {
    let mut rng = Rng::fresh("q4_k");
    check_encoder::<Q4K>(GgmlType::Q4_K, &mut rng, 64, 4096);
    check_encoder::<Q4K>(GgmlType::Q4_K, &mut rng, 3, 1536);
}

#[test]
fn q2_k_encoder_is_byte_identical_to_ggml_reference() {
    let mut rng = Rng::fresh("q2_k");
    check_encoder::<Q2K>(GgmlType::Q2_K, &mut rng, 64, 4096);
    check_encoder::<Q2K>(GgmlType::Q2_K, &mut rng, 3, 1536);
}

#[test]
fn type_table_matches_gguf_py_except_documented_q8_1() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sizes.json");
    python_ref(&["sizes", out.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let map = v.as_object().unwrap();
    for (name, pair) in map {
        let ty = GgmlType::from_name(name)
            .unwrap_or_else(|| panic!("gguf-py type {name} unknown to us"));
        let (e, b) = (pair[0].as_u64().unwrap(), pair[1].as_u64().unwrap());
        if ty == GgmlType::Q8_1 {
            assert_eq!((ty.block_elems(), ty.block_bytes(), b), (32, 36, 40));
            continue;
        }
        assert_eq!((ty.block_elems(), ty.block_bytes()), (e, b), "{name}");
    }
    // The engine's own block types (bitsandbytes NF4) are not GGUF's.
    let gguf = GgmlType::ALL.iter().filter(|t| t.in_gguf()).count();
    assert_eq!(map.len(), gguf);
}

#[test]
fn bf16_and_f16_encoders_match_gguf_py_and_numpy() {
    use metrale_pack::converters::{bf16, f16};
    let mut rng = Rng::fresh("bf16");
    let dir = tempfile::tempdir().unwrap();
    // Weights plus edge values: ties, overflow to infinity, subnormals, NaN payloads.
    let mut x = rng.weights(8192);
    let edges = [
        f32::from_bits(0x3F80_8000),
        f32::from_bits(0x3F81_8000),
        f32::MAX,
        -f32::MAX,
        65520.0,
        1e-8,
        -1e-45,
        f32::INFINITY,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFC1_2345),
    ];
    x[..edges.len()].copy_from_slice(&edges);
    let inp = dir.path().join("x.npy");
    write_npy_f32(&inp, &[8192], &x);
    for (name, ours) in [("BF16", bf16::encode(&x)), ("F16", f16::encode(&x))] {
        let out = dir.path().join(format!("{name}.npy"));
        python_ref(&[
            "quant_py",
            name,
            inp.to_str().unwrap(),
            out.to_str().unwrap(),
        ]);
        let theirs = read_npy(&out).data;
        for i in 0..x.len() {
            let (a, b) = (&ours[2 * i..2 * i + 2], &theirs[2 * i..2 * i + 2]);
            let nan = x[i].is_nan() && name == "F16";
            // numpy keeps NaN payload bits differently from `half`; both must still be NaN.
            if nan {
                assert!(f16::to_f32(u16::from_le_bytes([a[0], a[1]])).is_nan());
                assert!(f16::to_f32(u16::from_le_bytes([b[0], b[1]])).is_nan());
            } else {
                assert_eq!(a, b, "{name} element {i} ({})", x[i]);
            }
        }
    }
}

#[test]
fn iq_grids_equal_gguf_py_s() {
    use metrale_pack::converters::{iq_grid, iq_grids};
    let dir = tempfile::tempdir().unwrap();
    for (name, g) in [
        ("IQ2_XXS", &iq_grids::IQ2_XXS),
        ("IQ2_XS", &iq_grids::IQ2_XS),
        ("IQ2_S", &iq_grids::IQ2_S),
        ("IQ3_XXS", &iq_grids::IQ3_XXS),
        ("IQ3_S", &iq_grids::IQ3_S),
        ("IQ1_S", &iq_grids::IQ1_S),
    ] {
        let out = dir.path().join(format!("{name}.npy"));
        python_ref(&["iq_grid", name, out.to_str().unwrap()]);
        assert_bits_eq(name, iq_grid::grid(g).values(), &read_npy(&out).to_f32());
    }
}

#[test]
fn iq_gguf_written_with_libgguf_s_quantizers_decodes_as_gguf_py_and_converts() {
    let dir = tempfile::tempdir().unwrap();
    python_ref(&["iq_gguf", dir.path().to_str().unwrap()]);
    let src = dir.path().join("model.gguf");
    let m = metrale_pack::model::Model::open(&src).unwrap();
    assert_eq!(m.ffn_layers.len(), 3);
    let mut types = Vec::new();
    for l in &m.ffn_layers {
        for w in [&l.gate, &l.up, &l.down] {
            let t = &m.tensors[w.main()];
            types.push(t.dtype.name());
            let want = read_npy(&dir.path().join(format!("{}.npy", t.name)));
            let (got, _) = m.decode_weight(w).unwrap();
            assert_bits_eq(&t.name, &got, &want.to_f32());
        }
    }
    types.sort();
    assert_eq!(
        types,
        [
            "IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS", "IQ4_NL", "IQ4_XS"
        ]
    );
    for layouts in ["nvfp4,nvfp4_mmq", "bf16"] {
        let out = dir.path().join("p.mpk.gguf");
        // IQ weights into NVFP4 are re-quantized: the flag says so.
        common::pack::convert_and_verify(&src, &out, &["--layouts", layouts, "--allow-requantize"]);
    }
}
