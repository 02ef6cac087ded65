//! `convert`'s layout choice: the source's own format kept where a layout carries it (block
//! FP8 -> fp8, NVFP4 -> the NVFP4 set, floats -> the target's default), a re-quantization of an
//! already-quantized weight refused before anything is written unless `--allow-requantize`
//! (with every choice's size and measured error), the dry run's figures against a real
//! convert of the same source, and warnings for far or unserving layouts.

mod common;

use common::pack::*;
use common::*;
use metrale_pack::GgmlType;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::model::Model;
use metrale_pack::pack::{ConvertOptions, Pack, choice};
use std::path::Path;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// The real SmolLM2 Q4_1 GGUF: `affine` keeps Q4_1, so the default carries it with no flag; a
/// Q2_K source goes to `ggml`; a GGUF Q8_1 source (no layout keeps it) stops before writing with the
/// table of choices; a named set that re-quantizes is refused; bf16 (values kept) needs no
/// flag; the flag takes the default.
#[test]
fn a_quantized_source_is_kept_or_not_requantized_without_the_flag() {
    let src = smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s.mpk.gguf");
    let o = cli(&convert_args(&src, &out, &[]));
    assert!(o.status.success(), "{}", err(&o));
    assert!(!err(&o).contains("warning"), "{}", err(&o));
    assert_eq!(Pack::open(&out).unwrap().manifest.layouts, ["affine"]);
    std::fs::remove_file(&out).unwrap();

    let mut rng = Rng::fresh("layout_choice_q2k");
    let q2k = gguf_model(
        dir.path(),
        "q2k.gguf",
        "llama",
        256,
        512,
        2,
        GgmlType::Q2_K,
        &mut rng,
    );
    let q2out = dir.path().join("q2k.mpk.gguf");
    let o = cli(&convert_args(&q2k, &q2out, &[]));
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(Pack::open(&q2out).unwrap().manifest.layouts, ["ggml"]);
    std::fs::remove_file(&q2out).unwrap();
    std::fs::remove_file(&q2k).unwrap();

    let q2k = gguf_model(
        dir.path(),
        "iq2.gguf",
        "llama",
        256,
        512,
        2,
        GgmlType::Q8_1,
        &mut rng,
    );
    let q2out = dir.path().join("iq2.mpk.gguf");
    let o = cli(&convert_args(&q2k, &q2out, &[]));
    assert_eq!(o.status.code(), Some(1));
    let e = err(&o);
    assert!(!q2out.exists(), "nothing written");
    assert_eq!(
        files_in(dir.path()),
        ["iq2.gguf"],
        "no litter: {:?}",
        files_in(dir.path())
    );
    let line = e.lines().find(|l| l.starts_with("error:")).unwrap();
    assert!(
        line.contains("Q8_1") && line.contains("--allow-requantize"),
        "{line}"
    );
    assert!(line.contains("nvfp4 would re-quantize"), "{line}");
    // A row per layout: its size, its error per projection, whether it re-quantizes.
    for tag in [
        "nvfp4",
        "nvfp4_t",
        "nvfp4_mmq",
        "q4k_mmq",
        "fp8",
        "w8a8",
        "bf16",
        "q2g128",
        "affine",
        "ggml",
    ] {
        let row = e
            .lines()
            .find(|l| l.split_whitespace().next() == Some(tag))
            .unwrap_or_else(|| panic!("no row for {tag} in:\n{e}"));
        let want = if tag == "bf16" {
            "values kept"
        } else {
            "re-quantized"
        };
        assert!(row.ends_with(want), "{row}");
        assert_eq!(row.matches('%').count(), 3, "{row}");
    }
    // The flag: the target's default.
    let o = cli(&convert_args(&q2k, &q2out, &["--allow-requantize"]));
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(
        Pack::open(&q2out).unwrap().manifest.layouts,
        ["nvfp4", "nvfp4_mmq"]
    );

    // A named set that re-quantizes: refused, naming the layout.
    let o = cli(&convert_args(&src, &out, &["--layouts", "bf16,q2g128"]));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("q2g128 would re-quantize its Q4_1 weights"),
        "{}",
        err(&o)
    );
    assert!(!out.exists());

    // bf16 keeps the values: no flag, no warning.
    let o = cli(&convert_args(&src, &out, &["--layouts", "bf16"]));
    assert!(o.status.success(), "{}", err(&o));
    assert!(!err(&o).contains("warning"), "{}", err(&o));
    assert_eq!(Pack::open(&out).unwrap().manifest.layouts, ["bf16"]);
}

/// Sources a layout carries convert by default without the flag: block FP8 into fp8, ModelOpt
/// NVFP4 into the NVFP4 set, floats into the target's default.
#[test]
fn the_default_keeps_what_the_source_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::fresh("layout_choice");
    let f32src = gguf_model(
        dir.path(),
        "f.gguf",
        "llama",
        256,
        512,
        2,
        GgmlType::F32,
        &mut rng,
    );
    for (src, want) in [
        (
            Path::new("tests/fixtures/ct-fp8-block-bf16-i384").to_path_buf(),
            vec!["fp8"],
        ),
        (
            Path::new("tests/fixtures/modelopt-nvfp4").to_path_buf(),
            vec!["nvfp4", "nvfp4_mmq"],
        ),
        (f32src, vec!["nvfp4", "nvfp4_mmq"]),
    ] {
        let out = dir.path().join("d.mpk.gguf");
        let o = cli(&convert_args(&src, &out, &[]));
        assert!(o.status.success(), "{}: {}", src.display(), err(&o));
        assert_eq!(
            Pack::open(&out).unwrap().manifest.layouts,
            want,
            "{}",
            src.display()
        );
        assert!(!err(&o).contains("warning"), "{}", err(&o));
    }
}

/// Q4_K: by default a Q4_K source converts to `q4k_mmq` alone with Q4_K down projections,
/// which keeps every FFN weight's bytes as the source has them (fidelity 0) and serves every
/// forward an engine makes (its decode GEMVs read those bytes); asking for int8 down rows
/// re-quantizes and is refused without the flag.
#[test]
fn a_q4_k_source_keeps_its_codes_only_where_asked() {
    use metrale_pack::gguf::GgufFile;
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::fresh("layout_choice_q4k");
    let src = gguf_model(
        dir.path(),
        "k.gguf",
        "llama",
        256,
        512,
        2,
        GgmlType::Q4_K,
        &mut rng,
    );
    let out = dir.path().join("k.mpk.gguf");
    let o = cli(&convert_args(&src, &out, &[]));
    assert!(o.status.success(), "{}", err(&o));
    assert!(!err(&o).contains("warning"), "{}", err(&o));
    let p = Pack::open(&out).unwrap();
    assert_eq!(p.manifest.layouts, ["q4k_mmq"]);
    let g = GgufFile::open(&src).unwrap();
    for layer in 0..2 {
        for (proj, tag) in [
            (metrale_pack::ffn::Proj::Gate, "gate"),
            (metrale_pack::ffn::Proj::Up, "up"),
            (metrale_pack::ffn::Proj::Down, "down"),
        ] {
            let name = metrale_pack::pack::blob_name(layer, proj, Layout::Q4kMmq, "");
            let i = p.index(&name).unwrap_or_else(|| panic!("{name}"));
            let si = g
                .tensors
                .iter()
                .position(|t| t.name.as_str() == format!("blk.{layer}.ffn_{tag}.weight"))
                .unwrap();
            assert!(
                p.data(i) == g.tensor_data(si),
                "{name}: not the source's bytes"
            );
        }
    }
    assert_eq!(p.manifest.fidelity.len(), 3, "{:?}", p.manifest.fidelity);
    assert!(
        p.manifest.fidelity.iter().all(|f| f.mean_rel_err == 0.0),
        "{:?}",
        p.manifest.fidelity
    );
    let o = cli(&convert_args(
        &src,
        &out,
        &["--layouts", "q4k_mmq", "--q4k-down", "int8"],
    ));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("q4k_mmq would re-quantize its Q4_K"),
        "{}",
        err(&o)
    );
}

/// The dry run writes nothing, and its figures are the real convert's: each layout's bytes
/// are the pack's blobs, its error the manifest's fidelity (one FFN layer: the mean is that
/// layer's), to the last bit JSON keeps.
#[test]
fn the_dry_run_says_what_convert_then_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::fresh("layout_choice_dry");
    let src = gguf_model(
        dir.path(),
        "m.gguf",
        "llama",
        256,
        512,
        1,
        GgmlType::F16,
        &mut rng,
    );
    let layouts = [Layout::Nvfp4, Layout::Fp8, Layout::Bf16, Layout::Q2g128];
    let opts = ConvertOptions {
        layouts: Some(layouts.to_vec()),
        ..Default::default()
    };
    let model = Model::open(&src).unwrap();
    let (costs, carried) = choice::dry_run(&model, &opts).unwrap();
    let out = dir.path().join("m.mpk.gguf");
    let man = convert(&src, &out, &opts);
    assert_eq!(costs.len(), layouts.len());
    for c in &costs {
        let blobs: u64 = man
            .tensors
            .iter()
            .filter(|t| t.ffn.as_ref().is_some_and(|f| f.layout == c.layout.tag()))
            .map(|t| t.bytes)
            .sum();
        assert_eq!(c.bytes, blobs, "{}", c.layout.tag());
        for (proj, e) in &c.rel_err {
            let f = man
                .fidelity
                .iter()
                .find(|f| f.layout == c.layout.tag() && &f.proj == proj)
                .unwrap();
            // The same computation; the manifest's figure went through JSON, whose parser may
            // move the last bit.
            let d = (e - f.mean_rel_err).abs() / f.mean_rel_err;
            assert!(
                d <= 4.0 * f64::EPSILON,
                "{} {proj}: {e} vs {}",
                c.layout.tag(),
                f.mean_rel_err
            );
        }
        assert!(!c.requantizes, "an F16 source is not quantized");
    }
    let passthrough: u64 = man
        .tensors
        .iter()
        .filter(|t| t.ffn.is_none())
        .map(|t| t.bytes)
        .sum();
    assert_eq!(carried, passthrough);

    // The CLI prints the same figures, and that q2g128 alone would warn; writes nothing.
    let dry = dir.path().join("dry.mpk.gguf");
    let o = cli(&convert_args(
        &src,
        &dry,
        &["--layouts", "nvfp4,fp8,bf16,q2g128", "--dry-run"],
    ));
    assert!(o.status.success(), "{}", err(&o));
    assert!(!dry.exists());
    let s = stdout(&o);
    for c in &costs {
        let row = s
            .lines()
            .find(|l| l.split_whitespace().next() == Some(c.layout.tag()))
            .unwrap_or_else(|| panic!("{s}"));
        assert!(
            row.contains(&format!("{:.1}", c.bytes as f64 / 1e6)),
            "{row}"
        );
    }
    assert!(s.contains("serves: decode"), "{s}");
    assert!(s.contains("nothing written"), "{s}");

    // A real convert with q2g128 warns with its figure.
    let o = cli(&convert_args(&src, &out, &["--layouts", "q2g128,bf16"]));
    assert!(o.status.success(), "{}", err(&o));
    let e = err(&o);
    let w = e
        .lines()
        .find(|l| l.starts_with("warning: q2g128"))
        .unwrap_or_else(|| panic!("{e}"));
    assert!(w.contains('%'), "{w}");
    assert!(!e.contains("warning: bf16"), "{e}");
}

/// `metrale-pack layouts`: a row per layout; bits per weight from the layouts' own sizes (BF16
/// 16, NVFP4 4.5: a 4-bit code and an 8-bit scale per 16); errors measured now, ordered as the
/// formats' precision.
#[test]
fn the_layouts_table_measures_what_it_says() {
    let o = cli(&["layouts"]);
    assert!(o.status.success(), "{}", err(&o));
    let s = stdout(&o);
    let row = |tag: &str| -> Vec<String> {
        s.lines()
            .find(|l| l.split_whitespace().next() == Some(tag))
            .unwrap_or_else(|| panic!("no {tag} row in:\n{s}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    assert_eq!(row("bf16")[1], "16.00");
    assert_eq!(row("nvfp4")[1], "4.50");
    let err = |tag: &str| -> f64 {
        let r = row(tag);
        let e = r.iter().find(|w| w.ends_with('%')).unwrap();
        e.trim_end_matches('%').parse().unwrap()
    };
    assert!(err("bf16") < err("fp8") && err("fp8") < err("nvfp4") && err("nvfp4") < err("q2g128"));
    for tag in ["nvfp4_t", "nvfp4_mmq", "q4k_mmq", "w8a8"] {
        assert!(err(tag) > 0.0, "{tag}");
    }
    // The layouts installed beside the NVFP4 base say so; q4k_mmq stands alone and decodes.
    assert!(row("nvfp4_mmq").contains(&"nvfp4".to_string()), "{s}");
    assert!(row("q4k_mmq")[2].starts_with("decode,"), "{s}");
    assert!(!row("q4k_mmq").contains(&"nvfp4".to_string()), "{s}");
}
