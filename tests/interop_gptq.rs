//! GPTQ's own packing, on checkpoints AutoGPTQ 0.7.1 wrote (`tests/py/make_fixtures.py`,
//! `ONLY=gptq`): act-order carried with its columns sorted by group, the declarations and
//! tensors this reader refuses, a tensor-parallel cut of carried groups, the packs' arms on the
//! host backend and the GPU carry's bytes.
//! The fixtures' bit-exact decode and their default `affine` convert are in
//! `interop_toolchains.rs`, beside the other toolchains'.

mod common;

use metrale_pack::converters::layouts::Layout;
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions, Pack};
use safetensors::Dtype;
use serde_json::Value;
use std::path::{Path, PathBuf};

type Tensors = common::StTensors;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A copy of fixture `name` in `dir` under AutoGPTQ's file name, its tensors, `config.json`
/// and `quantize_config.json` edited.
fn edited(
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut Tensors),
    cfg: impl FnOnce(&mut Value, &mut Value),
) -> PathBuf {
    let src = fixture(name);
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    let file = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    common::rewrite_safetensors(&file, &out.join(file.file_name().unwrap()), edit);
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(src.join(f)).unwrap()).unwrap()
    };
    let (mut c, mut q) = (read("config.json"), read("quantize_config.json"));
    cfg(&mut c, &mut q);
    std::fs::write(out.join("config.json"), c.to_string()).unwrap();
    std::fs::write(out.join("quantize_config.json"), q.to_string()).unwrap();
    out
}

/// Fixture `name` with its quantized attention replaced by F16 weights (a TP pack splits
/// packed integer attention only as compressed-tensors stores it).
fn f16_attention(dir: &Path, name: &str) -> PathBuf {
    edited(
        dir,
        name,
        |ts| {
            ts.retain(|t| !t.0.contains(".self_attn."));
            for (p, n) in [("q", 256), ("k", 128), ("v", 128), ("o", 256)] {
                let name = format!("model.layers.0.self_attn.{p}_proj.weight");
                ts.push((name, Dtype::F16, vec![n, 256], vec![0x20; n * 256 * 2]));
            }
        },
        |_, _| {},
    )
}

fn tensor<'a>(ts: &'a mut Tensors, name: &str) -> &'a mut Vec<u8> {
    &mut ts.iter_mut().find(|t| t.0 == name).unwrap().3
}

fn open_err(dir: &Path) -> String {
    match Model::open(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn act_order_is_carried_with_its_columns_sorted_by_group() {
    // AutoGPTQ's desc_act: each input channel's group follows the Hessian's order (g_idx), so
    // no group is contiguous. `affine` stores the columns sorted by group with the permutation
    // (the decode bit for bit against the library: interop_toolchains.rs); gate and up share
    // one order (one Hessian), which up's `perm` scalar 2 records.
    let dir = fixture("gptq-4bit-g128-desc-sym-f16");
    let m = Model::open(&dir).unwrap();
    let l = &m.ffn_layers[0];
    assert!(
        [&l.gate, &l.up, &l.down]
            .iter()
            .all(|w| m.gptq_act_order(w))
    );
    assert!(m.same_column_order(&l.gate, &l.up));
    assert!(!m.same_column_order(&l.gate, &l.down));
    let settled = pack::choice::settle(&m, &ConvertOptions::default());
    assert_eq!(settled.layouts, [Layout::Affine]);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p.mpk.gguf");
    pack::convert(&m, &ConvertOptions::default(), &out, &|_, _| {}).unwrap();
    let p = Pack::open(&out).unwrap();
    for (proj, want) in [("gate", 1.0), ("up", 2.0), ("down", 1.0)] {
        let i = p.index(&format!("blk.0.ffn_{proj}.affine.codes")).unwrap();
        let fe = p.manifest.tensors[i].ffn.as_ref().unwrap();
        assert_eq!(fe.scalars.get("perm"), Some(&want), "{proj}");
    }
    // Without act-order, no permutation.
    let plain = Model::open(fixture("gptq-4bit-g128-sym-f16")).unwrap();
    assert!(!plain.gptq_act_order(&plain.ffn_layers[0].gate));
    let out2 = tmp.path().join("q.mpk.gguf");
    pack::convert(&plain, &ConvertOptions::default(), &out2, &|_, _| {}).unwrap();
    let q = Pack::open(&out2).unwrap();
    let i = q.index("blk.0.ffn_gate.affine.codes").unwrap();
    assert!(
        !q.manifest.tensors[i]
            .ffn
            .as_ref()
            .unwrap()
            .scalars
            .contains_key("perm")
    );
    // A tensor-parallel slice of sorted columns is refused by name, before writing.
    let tp = ConvertOptions {
        layouts: Some(vec![Layout::Affine]),
        tp: 2,
        ..Default::default()
    };
    let m = Model::open(f16_attention(tmp.path(), "gptq-4bit-g128-desc-sym-f16")).unwrap();
    let out3 = tmp.path().join("tp.mpk.gguf");
    let e = pack::convert(&m, &tp, &out3, &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("act-order") && !out3.exists(), "{e}");
}

#[test]
fn a_permutation_that_is_not_one_is_refused_when_the_blob_decodes() {
    // The pack's permutation is data: a repeated column is named, never decoded silently.
    let m = Model::open(fixture("gptq-4bit-g128-desc-sym-f16")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p.mpk.gguf");
    pack::convert(&m, &ConvertOptions::default(), &out, &|_, _| {}).unwrap();
    let p = Pack::open(&out).unwrap();
    let i = p.index("blk.0.ffn_down.affine.scales").unwrap();
    let t = &p.file.tensors[i];
    let (off, len) = (p.file.data_offset + t.offset, t.bytes);
    drop(p);
    let mut bytes = std::fs::read(&out).unwrap();
    // The permutation's last two entries (of kp = 384) made equal.
    let last = (off + len) as usize;
    let prev: [u8; 4] = bytes[last - 8..last - 4].try_into().unwrap();
    bytes[last - 4..last].copy_from_slice(&prev);
    std::fs::write(&out, &bytes).unwrap();
    let p = Pack::open(&out).unwrap();
    let e = p
        .decode_ffn("blk.0.ffn_down.affine")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a permutation"), "{e}");
}

#[test]
fn the_declaration_is_read_from_quantize_config_json_when_config_json_has_none() {
    // Checkpoints quantized before transformers read GPTQ keep it there only.
    let tmp = tempfile::tempdir().unwrap();
    let d = edited(
        tmp.path(),
        "gptq-4bit-g64-asym-f16",
        |_| {},
        |c, q| {
            c.as_object_mut().unwrap().remove("quantization_config");
            q.as_object_mut().unwrap().remove("quant_method");
        },
    );
    let m = Model::open(&d).unwrap();
    assert_eq!(m.ffn_layers[0].down.scheme(), "gptq-int4");
    let settled = pack::choice::settle(&m, &ConvertOptions::default());
    assert_eq!(settled.layouts, [Layout::Affine]);
}

#[test]
fn gptq_declarations_and_tensors_that_do_not_fit_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let base = "gptq-4bit-g64-asym-f16";
    let mut n = 0;
    let mut case = |edit: &dyn Fn(&mut Tensors), cfg: &dyn Fn(&mut Value)| {
        n += 1;
        let d = edited(&tmp.path().join(n.to_string()), base, edit, |c, _| cfg(c));
        open_err(&d)
    };
    let qc =
        |f: &'static str, v: Value| move |c: &mut Value| c["quantization_config"][f] = v.clone();
    // 3-bit codes straddle words; v2 zero points and Marlin tiles are other packings.
    let e = case(&|_| {}, &qc("bits", 3.into()));
    assert!(
        e.contains("quantization_config.bits") && e.contains("3"),
        "{e}"
    );
    let e = case(&|_| {}, &qc("checkpoint_format", "gptq_v2".into()));
    assert!(
        e.contains("checkpoint_format") && e.contains("gptq_v2"),
        "{e}"
    );
    let e = case(&|_| {}, &qc("is_marlin_format", true.into()));
    assert!(e.contains("is_marlin_format"), "{e}");
    // A bias that is not zero: the FFN has none.
    let gate = "model.layers.0.mlp.gate_proj";
    let e = case(
        &|ts| tensor(ts, &format!("{gate}.bias"))[..2].copy_from_slice(&[0, 0x3C]),
        &|_| {},
    );
    assert!(
        e.contains(&format!("{gate}.bias")) && e.contains("not all zero"),
        "{e}"
    );
    // A g_idx naming a group past the scales'.
    let e = case(
        &|ts| tensor(ts, &format!("{gate}.g_idx"))[..4].copy_from_slice(&9i32.to_le_bytes()),
        &|_| {},
    );
    assert!(
        e.contains(&format!("{gate}.g_idx")) && e.contains("input channel 0"),
        "{e}"
    );
    // Scales of another shape than the codes'.
    let e = case(
        &|ts| {
            let t = ts
                .iter_mut()
                .find(|t| t.0 == format!("{gate}.scales"))
                .unwrap();
            t.2 = vec![2, t.2[1] * 2];
        },
        &|_| {},
    );
    assert!(
        e.contains(&format!("{gate}.scales")) && e.contains("do not fit"),
        "{e}"
    );
}

#[test]
fn a_zero_point_stored_as_all_ones_is_refused_naming_row_and_group() {
    // v1 stores z - 1; a zero point of 0 becomes -1 (all ones), which AutoGPTQ's packing ORs
    // into the word's other fields and its two decoders read differently.
    let tmp = tempfile::tempdir().unwrap();
    let down = "model.layers.0.mlp.down_proj";
    let d = edited(
        tmp.path(),
        "gptq-4bit-g64-asym-f16",
        |ts| tensor(ts, &format!("{down}.qzeros"))[4..8].copy_from_slice(&[0xF0, 0, 0, 0]),
        |_, _| {},
    );
    let m = Model::open(&d).unwrap();
    let e = m
        .decode_weight(&m.ffn_layers[0].down)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("{down}.qzeros")) && e.contains("row 9, group 0"),
        "{e}"
    );
    let out = tmp.path().join("p.mpk.gguf");
    let e = pack::convert(&m, &ConvertOptions::default(), &out, &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 9, group 0") && !out.exists(), "{e}");
}

#[test]
fn carried_gptq_groups_split_across_ranks_at_group_boundaries() {
    // Intermediate 384 in groups of 64: each rank's 192 down columns are three whole groups.
    // A TP pack splits packed integer attention weights only as compressed-tensors stores
    // them, so the fixture's attention is refused by name, and then replaced by F16 weights.
    let tmp = tempfile::tempdir().unwrap();
    let opts = ConvertOptions {
        layouts: Some(vec![Layout::Affine]),
        tp: 2,
        ..Default::default()
    };
    let m = Model::open(fixture("gptq-4bit-g64-asym-f16")).unwrap();
    let out = tmp.path().join("tp.mpk.gguf");
    let e = pack::convert(&m, &opts, &out, &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("self_attn") && e.contains("g_idx") && !out.exists(),
        "{e}"
    );
    let m = Model::open(f16_attention(tmp.path(), "gptq-4bit-g64-asym-f16")).unwrap();
    pack::convert(&m, &opts, &out, &|_, _| {}).unwrap();
    let p = Pack::open(&out).unwrap();
    let c = pack::verify_against_source(&p, &m).unwrap();
    assert!(c.mismatched.is_empty(), "{:?}", c.mismatched);
    let full = m.decode_weight(&m.ffn_layers[0].down).unwrap().0;
    for r in 0..2usize {
        let (v, [n, k]) = p
            .decode_ffn(&format!("blk.0.ffn_down.tp{r}.affine"))
            .unwrap();
        assert_eq!([n, k], [256, 192]);
        let same = (0..256).all(|row| {
            let want = &full[row * 384 + 192 * r..row * 384 + 192 * (r + 1)];
            v[row * 192..(row + 1) * 192]
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        });
        assert!(same, "rank {r}");
    }
}

#[test]
fn a_directory_of_several_safetensors_without_an_index_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = edited(tmp.path(), "gptq-4bit-g64-asym-f16", |_| {}, |_, _| {});
    std::fs::write(d.join("extra.safetensors"), b"").unwrap();
    let e = open_err(&d);
    assert!(
        e.contains("2 .safetensors files") && e.contains("index"),
        "{e}"
    );
}

#[test]
fn carried_gptq_packs_compute_the_source_ffn_on_the_host_backend() {
    // The packs' affine arms (decode row by row, prefill over all rows) against the float64
    // FFN of the weights as AutoGPTQ decodes them: 4-bit groups of 64 with zero points (F16
    // scales: the half zero form), 8-bit per channel, 4-bit act-order (the activations
    // gathered) and 2-bit codes (stored at 4, moved to the middle: 13.2% at one row before).
    // The error is the int8 activations'.
    use metrale_pack::check::activations::activation_checks;
    use metrale_pack::gpu::{GpuBackend, host::HostBackend};
    use metrale_pack::testing::Rand;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let acts = tmp.path().join("acts");
    std::fs::create_dir_all(&acts).unwrap();
    let rows = 24;
    let x = Rand(5).vec(rows * 256, 1.0);
    let mut f = std::fs::File::create(acts.join("layer0.npy")).unwrap();
    metrale_pack::npy::write_f32(&mut f, &[rows, 256], &x).unwrap();
    for name in [
        "gptq-4bit-g64-asym-f16",
        "gptq-8bit-channel-asym-f16",
        "gptq-4bit-g128-desc-sym-f16",
        "gptq-2bit-g64-sym-f16",
        // compressed-tensors' 3-bit codes, re-centred the same way (4.4% at one row before).
        "ct-w3a16-bf16",
    ] {
        let src = fixture(name);
        let out = tmp.path().join(format!("{name}.mpk.gguf"));
        pack::convert(
            Model::open(&src).unwrap(),
            &ConvertOptions::default(),
            &out,
            &|_, _| {},
        )
        .unwrap();
        let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
        let t = activation_checks(b, &out, &src, &acts, &[], rows, &mut Rand(3)).unwrap();
        assert_eq!(t.len(), 2, "{name}: {t:#?}");
        assert!(t.iter().any(|r| r.m == 1) && t.iter().any(|r| r.m == rows));
        for r in &t {
            assert_eq!(r.arm, "affine", "{name}");
            // int8 activations in groups of 32: about 0.4% of each row's value.
            assert!(r.real < 0.02 && r.random < 0.02, "{name}: {r:?}");
        }
    }
}

#[test]
fn finalize_affine_gptq_load_builds_the_converters_bytes_from_autogptq_tensors() {
    // The tensors AutoGPTQ wrote, uploaded as they are (g_idx included), at 4 bits in groups of
    // 64 and at 8 bits per channel: the overlay equals what convert writes, byte for byte.
    use metrale_pack::converters::layouts;
    use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext, GptqTensors, key};
    use metrale_pack::gpu::{GpuBackend, host::HostBackend};
    use metrale_pack::model::FfnWeight;
    for name in ["gptq-4bit-g64-asym-f16", "gptq-8bit-channel-asym-f16"] {
        let m = Model::open(fixture(name)).unwrap();
        let b = std::sync::Arc::new(HostBackend::new());
        let cfg = FfnConfig {
            hidden: 256,
            inter: 384,
        };
        let lev = metrale_pack::gpu::levers::ModelLevers::from_map(
            &Default::default(),
            metrale_pack::gpu::levers::HARDWARE_SM90,
        );
        let mut c = ForwardContext::new(b.clone(), cfg, 16, lev).unwrap();
        c.tracing = true;
        let up = |bytes: &[u8]| {
            let p = b.alloc(bytes.len() as u64).unwrap();
            b.upload(p, bytes).unwrap();
            p
        };
        let l0 = &m.ffn_layers[0];
        let ws = [&l0.gate, &l0.up, &l0.down];
        let t: Vec<GptqTensors> = ws
            .iter()
            .map(|w| {
                let FfnWeight::Gptq {
                    qweight,
                    qzeros,
                    scales,
                    g_idx,
                    bits,
                    ..
                } = **w
                else {
                    panic!("{w:?}")
                };
                let [n, k] = m.weight_shape(w).unwrap().map(|d| d as usize);
                GptqTensors {
                    qweight: up(m.data(qweight)),
                    qzeros: up(m.data(qzeros)),
                    scales: up(m.data(scales)),
                    g_idx: g_idx.map(|g| up(m.data(g))),
                    bits,
                    n,
                    k,
                    group: k / m.tensors[scales].shape[0] as usize,
                }
            })
            .collect();
        let t = [t[0], t[1], t[2]];
        let mut l = DenseFfnLayer::new(&c);
        l.finalize_affine_gptq_load(&mut c, t, 0).unwrap();
        assert_eq!(c.trace, ["affine_from_gptq"; 3], "{name}");
        let got = *l.get(key::AFFINE).unwrap();
        for (p, w) in ws.iter().enumerate() {
            let e = layouts::affine::from_groups(&m.int_groups(w).unwrap().unwrap());
            let mut codes = vec![0u8; e.parts[0].1.len()];
            let mut sb = vec![0u8; e.parts[1].1.len()];
            let len = |v: &Vec<u8>| v.len() as u64;
            b.download(got[p].codes().view(0, len(&codes)), &mut codes)
                .unwrap();
            b.download(got[p].scales().view(0, len(&sb)), &mut sb)
                .unwrap();
            assert!(codes == e.parts[0].1 && sb == e.parts[1].1, "{name} {p}");
        }
        // An act-order g_idx, a width GPTQ's packing here does not hold, and a zero point stored
        // as all ones are refused by projection.
        let mut order: Vec<u8> = m
            .data(match l0.down {
                FfnWeight::Gptq { g_idx, .. } => g_idx.unwrap(),
                _ => unreachable!(),
            })
            .to_vec();
        order[..4].copy_from_slice(&1i32.to_le_bytes());
        let shuffled = GptqTensors {
            g_idx: Some(up(&order)),
            ..t[2]
        };
        let e = l
            .finalize_affine_gptq_load(&mut c, [t[0], t[1], shuffled], 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("down") && e.contains("act-order"), "{name}: {e}");
        let three = GptqTensors { bits: 3, ..t[0] };
        let e = l
            .finalize_affine_gptq_load(&mut c, [three, t[1], t[2]], 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gate") && e.contains("3 bits"), "{name}: {e}");
        let FfnWeight::Gptq { qzeros, bits, .. } = l0.up else {
            unreachable!()
        };
        let mut z = m.data(qzeros).to_vec();
        z[0] |= ((1u16 << bits) - 1) as u8;
        let ones = GptqTensors {
            qzeros: up(&z),
            ..t[1]
        };
        let e = l
            .finalize_affine_gptq_load(&mut c, [t[0], ones, t[2]], 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("up") && e.contains("all ones"), "{name}: {e}");
    }
}

#[test]
fn the_test_encoder_packs_what_the_reader_carries_at_every_width() {
    // `testing::gptq_tensors` (the GPU carry's check rows) packs the source's own codes; the
    // reader's groups of them equal the encoder's, 2-bit codes moved to the middle of 4 bits.
    use metrale_pack::converters::affine::AffineGroups;
    use metrale_pack::converters::{f16, gptq};
    let (n, k, group) = (32usize, 256usize, 128usize);
    let x = metrale_pack::testing::Rand(47).vec(n * k, 1.0);
    let in_order: Vec<i32> = (0..k).map(|i| (i / group) as i32).collect();
    for bits in gptq::BITS {
        let ([qw, qz, sc], g) = metrale_pack::testing::gptq_tensors(&x, n, k, bits, group);
        let scales: Vec<f32> = sc
            .chunks_exact(2)
            .map(|h| f16::to_f32(u16::from_le_bytes([h[0], h[1]])))
            .collect();
        let (int, group_of) =
            gptq::to_int(&qw, &qz, &scales, &in_order, bits, [n, k], group).unwrap();
        let read = AffineGroups::from_int_grouped(&int.source(), &group_of).unwrap();
        assert!(read.codes == g.codes && read.terms == g.terms, "{bits}");
        assert_eq!(read.decode(), g.decode(), "{bits}");
    }
}
