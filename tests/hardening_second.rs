//! The second hardening round (issue #30), each finding as a test: a failed convert never
//! replaces a good pack; non-finite weights are refused by name; a source truncated while it is
//! read is an error, not SIGBUS; names from a file reach the terminal escaped; long output names
//! work; `ffn-apply` follows the input and output rules and runs on the host backend.

mod common;

use common::pack::{cli, err, files_in};

use metrale_pack::GgmlType;
use metrale_pack::gguf::{GgufFile, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
}

fn run(args: &[&str]) -> Output {
    cli(args)
}

fn model(dir: &Path, name: &str, ty: GgmlType) -> PathBuf {
    let p = dir.join(name);
    metrale_pack::testing::gen_model::gen_model(&p, 64, 128, 2, ty, "llama").unwrap();
    p
}

/// Overwrite `bytes` at byte `at` of tensor `name`'s data in the GGUF at `path`.
fn patch(path: &Path, name: &str, at: u64, bytes: &[u8]) {
    let g = GgufFile::open(path).unwrap();
    let t = g.tensors.iter().find(|t| t.name == name).unwrap();
    let off = (t.file_offset + at) as usize;
    drop(g);
    let mut img = std::fs::read(path).unwrap();
    img[off..off + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, img).unwrap();
}

#[test]
fn a_nonfinite_source_is_refused_by_position_and_never_replaces_a_good_pack() {
    let dir = tempfile::tempdir().unwrap();
    let good = model(dir.path(), "good.gguf", GgmlType::F16);
    let out = dir.path().join("p.mpk.gguf");
    let o = run(&[
        "convert",
        good.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let before = std::fs::read(&out).unwrap();
    // blk.1.ffn_up.weight is [128, 64]: row 3, column 5 is element 197, an F16 at byte 394.
    let nan = dir.path().join("nan.gguf");
    std::fs::copy(&good, &nan).unwrap();
    patch(&nan, "blk.1.ffn_up.weight", 394, &0x7e00u16.to_le_bytes());
    let inf = dir.path().join("inf.gguf");
    std::fs::copy(&good, &inf).unwrap();
    patch(&inf, "blk.0.ffn_down.weight", 0, &0x7c00u16.to_le_bytes());
    // A NaN f16 scale of the first Q8_0 block of a weight.
    let q8 = model(dir.path(), "q8.gguf", GgmlType::Q8_0);
    patch(&q8, "blk.0.ffn_gate.weight", 0, &0x7e00u16.to_le_bytes());
    let listing = files_in(dir.path());
    for (src, tensor, at) in [
        (&nan, "blk.1.ffn_up.weight", "row 3, column 5"),
        (&inf, "blk.0.ffn_down.weight", "row 0, column 0"),
        (&q8, "blk.0.ffn_gate.weight", "row 0, column 0"),
    ] {
        for layouts in ["nvfp4,nvfp4_mmq", "bf16", "q4k_mmq,fp8,w8a8,q2g128"] {
            let o = run(&[
                "convert",
                src.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--layouts",
                layouts,
            ]);
            let e = err(&o);
            assert_eq!(o.status.code(), Some(1), "{layouts}: {e}");
            assert!(e.contains(tensor) && e.contains(at), "{layouts}: {e}");
            assert!(e.contains("--allow-nonfinite"), "{e}");
            assert_eq!(
                std::fs::read(&out).unwrap(),
                before,
                "the good pack survives"
            );
            assert_eq!(files_in(dir.path()), listing, "nothing left behind");
        }
    }
    // Carried on request, in the one layout that holds them; the pack verifies.
    let o = run(&[
        "convert",
        nan.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--allow-nonfinite",
    ]);
    assert!(err(&o).contains("cannot carry NaN"), "{}", err(&o));
    let o = run(&[
        "convert",
        nan.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--allow-nonfinite",
        "--layouts",
        "bf16",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&[
        "verify",
        out.to_str().unwrap(),
        "--source",
        nan.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&["inspect", out.to_str().unwrap(), "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = &v["fidelity"];
    assert!(
        f.as_array()
            .unwrap()
            .iter()
            .all(|e| e["mean_rel_err"].is_f64()),
        "no null in the fidelity table: {f}"
    );
}

/// A source big enough that converting or verifying it takes seconds on one thread.
fn big_model(dir: &Path) -> PathBuf {
    let p = dir.join("big.gguf");
    metrale_pack::testing::gen_model::gen_model(&p, 1024, 4096, 4, GgmlType::F16, "llama").unwrap();
    p
}

/// Run `args`, truncate `src` to half its length after `delay_ms`, and return the output.
fn truncate_during(args: &[&str], src: &Path, delay_ms: u64) -> Output {
    let child = bin()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(delay_ms));
    let len = std::fs::metadata(src).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(src)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_source_truncated_while_convert_or_verify_reads_it_is_an_error_naming_the_range() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let src = big_model(dir.path());
    let keep = std::fs::read(&src).unwrap();
    let pack = dir.path().join("p.mpk.gguf");
    let o = run(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        pack.to_str().unwrap(),
        "--layouts",
        "nvfp4,q4k_mmq",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let out2 = dir.path().join("q.mpk.gguf");
    let s = src.to_str().unwrap();
    let cases: [Vec<&str>; 2] = [
        vec![
            "convert",
            s,
            "-o",
            out2.to_str().unwrap(),
            "--layouts",
            "nvfp4,q4k_mmq,q2g128",
            "--threads",
            "1",
        ],
        vec!["verify", pack.to_str().unwrap(), "--source", s],
    ];
    for args in &cases {
        std::fs::write(&src, &keep).unwrap();
        let o = truncate_during(args, &src, 400);
        assert_eq!(
            o.status.signal(),
            None,
            "{args:?} died by a signal: {}",
            err(&o)
        );
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", err(&o));
        let e = err(&o);
        assert!(
            e.contains("big.gguf") && e.contains("changed while it was read"),
            "{args:?}: {e}"
        );
        assert!(!out2.exists(), "no pack is named from a truncated source");
    }
}

/// A GGUF holding one F32 tensor per name given (4 values each) and a metadata key.
fn gguf_with_names(path: &Path, names: &[&str], key: &str) {
    let tensors: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = names
        .iter()
        .map(|n| (*n, vec![4], GgmlType::F32, vec![0u8; 16]))
        .collect();
    let img = metrale_pack::gguf_write::build(
        32,
        &[
            ("general.architecture", Value::String("llama".into())),
            (key, Value::String("v\u{1b}[31mred".into())),
        ],
        &tensors,
    );
    std::fs::write(path, img).unwrap();
}

#[test]
fn names_from_a_file_reach_the_terminal_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let evil = "x\u{1b}]0;owned\u{7}\n\u{202e}name";
    let p = dir.path().join("evil.gguf");
    gguf_with_names(&p, &[evil, "ok"], "k\u{1b}[2J");
    let o = run(&["inspect", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\u{202e}'));
    assert!(
        out.contains("x\\x1b]0;owned\\x07\\x0a\\u{202e}name"),
        "{out}"
    );
    // JSON stays exact: the name parses back.
    let o = run(&["inspect", p.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tensors"][0]["name"], evil);
    // An error quoting a crafted name: one line, no control byte, a long name cut.
    let long = format!("{}\u{1b}[1m", "n".repeat(4000));
    for names in [[evil, evil], [long.as_str(), long.as_str()]] {
        gguf_with_names(&p, &names, "k");
        let o = run(&["inspect", p.to_str().unwrap()]);
        let e = err(&o);
        assert!(!o.status.success());
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
        assert!(!e.contains('\u{1b}') && !e.contains('\u{7}'), "{e:?}");
        assert!(e.len() < 600, "{} bytes: {e}", e.len());
    }
}

#[test]
fn an_output_name_of_250_bytes_converts_and_errors_name_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path(), "m.gguf", GgmlType::F16);
    let out = dir.path().join(format!("{}.gguf", "p".repeat(245)));
    let o = run(&["convert", m.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out.exists());
    // A folder we cannot write into: the error names -o, not a temporary file.
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let target = ro.join("x.mpk.gguf");
    let probe = std::fs::write(ro.join("probe"), b"x");
    if probe.is_err() {
        // (root ignores the mode; then there is nothing to refuse)
        let o = run(&[
            "convert",
            m.to_str().unwrap(),
            "-o",
            target.to_str().unwrap(),
        ]);
        let e = err(&o);
        assert!(!o.status.success());
        assert!(
            e.contains(target.to_str().unwrap()) && !e.contains("mpk-tmp"),
            "{e}"
        );
    }
    // --threads beyond the machine is capped, not a failure to spawn.
    let o = run(&[
        "convert",
        m.to_str().unwrap(),
        "-o",
        dir.path().join("t.mpk.gguf").to_str().unwrap(),
        "--threads",
        "100000",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("--threads 100000"), "{}", err(&o));
}

/// An npy v1.0 image with the given header dict and data.
fn npy_with(dict: &str, data: &[u8]) -> Vec<u8> {
    metrale_pack::npy::image(dict, data)
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn ffn_apply_runs_on_the_host_backend_with_the_rules_of_convert() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path(), "m.gguf", GgmlType::F32);
    let pack = dir.path().join("p.mpk.gguf");
    let o = run(&[
        "convert",
        m.to_str().unwrap(),
        "-o",
        pack.to_str().unwrap(),
        "--layouts",
        "bf16",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let (h, i, rows) = (64usize, 128usize, 3usize);
    let x: Vec<f32> = (0..rows * h)
        .map(|j| ((j * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let input = dir.path().join("x.npy");
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(
        &input,
        npy_with(
            &format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {h}), }}"),
            &xb,
        ),
    )
    .unwrap();
    let y_path = dir.path().join("y.npy");
    let apply = |inp: &Path, out: &Path| {
        run(&[
            "ffn-apply",
            pack.to_str().unwrap(),
            "--layer",
            "1",
            "--arm",
            "bf16",
            inp.to_str().unwrap(),
            out.to_str().unwrap(),
        ])
    };
    let o = apply(&input, &y_path);
    assert!(o.status.success(), "{}", err(&o));
    let y = metrale_pack::npy::parse(&std::fs::read(&y_path).unwrap()).unwrap();
    assert_eq!(y.shape, vec![rows, h]);
    let y = y.to_f32();
    // The float64 FFN of the source's weights; the bf16 arm is within 2e-2 of it.
    let src = metrale_pack::model::Model::open(&m).unwrap();
    let w = |n: &str| src.decode_tensor(src.tensor(n).unwrap()).unwrap();
    let (g, u, d) = (
        w("blk.1.ffn_gate.weight"),
        w("blk.1.ffn_up.weight"),
        w("blk.1.ffn_down.weight"),
    );
    let (mut num, mut den) = (0f64, 0f64);
    for r in 0..rows {
        let xr = &x[r * h..(r + 1) * h];
        let dot =
            |wr: &[f32], v: &[f64]| wr.iter().zip(v).map(|(&a, &b)| a as f64 * b).sum::<f64>();
        let xf: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
        let a: Vec<f64> = (0..i)
            .map(|j| silu(dot(&g[j * h..(j + 1) * h], &xf)) * dot(&u[j * h..(j + 1) * h], &xf))
            .collect();
        for c in 0..h {
            let want = dot(&d[c * i..(c + 1) * i], &a);
            num += (y[r * h + c] as f64 - want).powi(2);
            den += want * want;
        }
    }
    assert!((num / den).sqrt() < 2e-2, "rel err {}", (num / den).sqrt());
    // The output is never an input.
    let before = std::fs::read(&pack).unwrap();
    for out in [&pack, &input] {
        let o = apply(&input, out);
        assert!(err(&o).contains("same file"), "{}", err(&o));
    }
    assert_eq!(std::fs::read(&pack).unwrap(), before);
    // Inputs that are not regular files are refused at once.
    let fifo = dir.path().join("fifo.npy");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: FFI with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for inp in [fifo.as_path(), Path::new("/dev/zero")] {
        let o = apply(inp, &dir.path().join("z.npy"));
        assert!(err(&o).contains("not a regular file"), "{}", err(&o));
    }
    // Malformed headers and shapes, each refused by what is wrong.
    // 1024 f32 values: (256, 4) and (8, 128) hold exactly that many.
    let data = vec![0u8; 4096];
    let cases = [
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (72057594037927940, 64), }",
            "overflows",
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (256, 4), }",
            "expected f32 [rows, 64]",
        ),
        (
            "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 128), }",
            "expected f32 [rows, 64]",
        ),
        (
            "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 64), 'descr': '<f4'}",
            "repeated",
        ),
    ];
    for (dict, want) in cases {
        let bad = dir.path().join("bad.npy");
        std::fs::write(&bad, npy_with(dict, &data)).unwrap();
        let o = apply(&bad, &dir.path().join("z.npy"));
        assert!(!o.status.success());
        assert!(err(&o).contains(want), "{dict}: {}", err(&o));
    }
    assert!(!dir.path().join("z.npy").exists());
}

/// Run `convert ARGS`; its status and the peak RSS it reports (its own `VmHWM`: the rusage of a
/// child counts this process's memory too, shared with it until its exec).
fn convert_peak(args: &[&str]) -> (std::process::ExitStatus, u64) {
    let o = run(args);
    let e = err(&o);
    let mb: u64 = e
        .split("peak RSS ")
        .nth(1)
        .and_then(|t| t.split(" MB").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS in: {e}"));
    (o.status, mb << 20)
}

/// A GGUF image of one 64 x 128 llama FFN layer in F32, with `kvs` after the model's and
/// `more` tensors after the layer's.
fn ffn_gguf(kvs: &[(&str, Value)], more: &[(&str, Vec<u64>, GgmlType, Vec<u8>)]) -> Vec<u8> {
    let w = |rows: usize, cols: usize| -> Vec<u8> {
        (0..rows * cols)
            .flat_map(|i| (((i * 7919) % 201) as f32 / 2000.0 - 0.05).to_le_bytes())
            .collect()
    };
    let mut tensors: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = vec![
        (
            "blk.0.ffn_gate.weight",
            vec![64, 128],
            GgmlType::F32,
            w(128, 64),
        ),
        (
            "blk.0.ffn_up.weight",
            vec![64, 128],
            GgmlType::F32,
            w(128, 64),
        ),
        (
            "blk.0.ffn_down.weight",
            vec![128, 64],
            GgmlType::F32,
            w(64, 128),
        ),
    ];
    tensors.extend(more.iter().cloned());
    let mut all = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.embedding_length", Value::U32(64)),
        ("llama.feed_forward_length", Value::U32(128)),
    ];
    all.extend(kvs.iter().cloned());
    metrale_pack::gguf_write::build(32, &all, &tensors)
}

/// A GGUF of one small FFN layer and `n` one-element F32 tensors.
fn tiny_tensors(path: &Path, n: usize) {
    let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
    let more: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = names
        .iter()
        .map(|s| {
            (
                s.as_str(),
                vec![1],
                GgmlType::F32,
                1f32.to_le_bytes().to_vec(),
            )
        })
        .collect();
    std::fs::write(path, ffn_gguf(&[], &more)).unwrap();
}

#[test]
fn small_tensors_and_long_arrays_cost_what_they_hold() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tiny.gguf");
    tiny_tensors(&src, 100_000);
    let out = dir.path().join("tiny.mpk.gguf");
    let src_len = std::fs::metadata(&src).unwrap().len();
    let (st, rss) = convert_peak(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--layouts",
        "bf16",
    ]);
    assert!(st.success());
    let pack_len = std::fs::metadata(&out).unwrap().len();
    // Was 491 MB (every tensor on a page) for a 7.4 MB source.
    assert!(
        pack_len < 3 * src_len,
        "pack {pack_len} for a source of {src_len}"
    );
    // Was 476 MB, then 171 MB (every table held three times), 63 MB, 45 MB, then 28 MB
    // (2026-12-02, BENCHMARKS.md): the pack's table and its parsed manifest while the finished
    // pack is validated, about 210 bytes per tensor against the source's 70, beside the
    // process's own 7 MB.
    println!("peak RSS {rss} for a source of {src_len} and a pack of {pack_len}");
    assert!(rss < 4 * src_len + (8 << 20), "peak RSS {rss}");
    let o = run(&[
        "verify",
        out.to_str().unwrap(),
        "--source",
        src.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
    // A vocabulary of 2 million strings: validated, carried byte for byte, never held. (Built
    // as raw KV bytes in one large buffer, which goes back to the system when dropped: the
    // child's peak RSS would otherwise count this process's heap, shared until its exec.)
    let voc = dir.path().join("voc.gguf");
    let mut raw = Vec::new();
    let key = "tokenizer.ggml.tokens";
    raw.extend_from_slice(&(key.len() as u64).to_le_bytes());
    raw.extend_from_slice(key.as_bytes());
    raw.extend_from_slice(&9u32.to_le_bytes()); // array
    raw.extend_from_slice(&8u32.to_le_bytes()); // of strings
    raw.extend_from_slice(&2_000_000u64.to_le_bytes());
    for i in 0..2_000_000 {
        let t = format!("tok{i}");
        raw.extend_from_slice(&(t.len() as u64).to_le_bytes());
        raw.extend_from_slice(t.as_bytes());
    }
    let mut b = metrale_pack::gguf_write::GgufBuilder::new(32);
    b.add_kv("general.architecture", &Value::String("llama".into()));
    b.add_raw_kv(&raw);
    drop(raw);
    for (name, ne) in [
        ("blk.0.ffn_gate.weight", [64u64, 128]),
        ("blk.0.ffn_up.weight", [64, 128]),
        ("blk.0.ffn_down.weight", [128, 64]),
    ] {
        b.add_tensor(name, &ne, GgmlType::F32);
    }
    let mut img = b.header();
    drop(b);
    img.resize(img.len() + 3 * 128 * 64 * 4, 0);
    std::fs::write(&voc, &img).unwrap();
    let voc_len = img.len() as u64;
    drop(img);
    let vout = dir.path().join("voc.mpk.gguf");
    let (st, rss) = convert_peak(&[
        "convert",
        voc.to_str().unwrap(),
        "-o",
        vout.to_str().unwrap(),
        "--layouts",
        "bf16",
    ]);
    assert!(st.success());
    // Was 11x: the strings were held one by one.
    assert!(
        rss < 4 * voc_len + (32 << 20),
        "peak RSS {rss} for a {voc_len}-byte source"
    );
    let g = GgufFile::open(&vout).unwrap();
    let src = GgufFile::open(&voc).unwrap();
    let key = |g: &GgufFile| {
        let kv = g
            .kvs
            .iter()
            .find(|k| k.key == "tokenizer.ggml.tokens")
            .unwrap();
        g.map[kv.span.clone()].to_vec()
    };
    assert!(
        key(&g) == key(&src),
        "the vocabulary is carried byte for byte"
    );
    assert_eq!(
        g.get("tokenizer.ggml.tokens").map(|v| v.summary()),
        Some("[String; 2000000]".to_string())
    );
}

/// A string value over `MAX_HELD_STRING` (a pack's manifest, a huge chat template) is checked
/// as UTF-8 but left in the file: read back from its span, copied byte for byte by convert,
/// summarised by its length; a bad byte in one is still an error naming its key.
#[test]
fn long_strings_are_validated_not_held() {
    use metrale_pack::gguf::MAX_HELD_STRING;
    let dir = tempfile::tempdir().unwrap();
    let n = MAX_HELD_STRING as usize + 4097;
    let text: String = (0..n).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let src = dir.path().join("long.gguf");
    let img = |text: &str| {
        ffn_gguf(
            &[("tokenizer.chat_template", Value::String(text.into()))],
            &[],
        )
    };
    std::fs::write(&src, img(&text)).unwrap();
    let g = GgufFile::open(&src).unwrap();
    let kv = g
        .kvs
        .iter()
        .find(|k| k.key == "tokenizer.chat_template")
        .unwrap();
    assert_eq!(kv.value, Value::LongString(n as u64));
    assert_eq!(kv.value.as_str(), None);
    assert_eq!(kv.value.summary(), format!("<a string of {n} bytes>"));
    let r = g.string_range(kv).unwrap();
    assert!(&g.map[r] == text.as_bytes());
    // A short one is held, and its range is the same bytes.
    let arch = g
        .kvs
        .iter()
        .find(|k| k.key == "general.architecture")
        .unwrap();
    assert_eq!(&g.map[g.string_range(arch).unwrap()], b"llama");
    let span = g.map[kv.span.clone()].to_vec();
    drop(g);

    let out = dir.path().join("long.mpk.gguf");
    let o = run(&[
        "convert",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--layouts",
        "bf16",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let p = GgufFile::open(&out).unwrap();
    let kv = p
        .kvs
        .iter()
        .find(|k| k.key == "tokenizer.chat_template")
        .unwrap();
    assert!(p.map[kv.span.clone()] == span[..], "carried byte for byte");
    assert!(run(&["verify", out.to_str().unwrap()]).status.success());

    // One byte that is not UTF-8, deep inside: refused, naming the key.
    let mut image = img(&text);
    let at = image
        .windows(64)
        .position(|w| w == &text.as_bytes()[..64])
        .unwrap();
    image[at + n - 10] = 0xff;
    let badp = dir.path().join("bad.gguf");
    std::fs::write(&badp, &image).unwrap();
    let e = GgufFile::open(&badp)
        .err()
        .expect("invalid UTF-8 is refused")
        .to_string();
    assert!(e.contains("tokenizer.chat_template"), "{e}");
}

/// A long string is checked as UTF-8 a MiB at a time (each MiB dropped from the resident set
/// once checked): characters cut by those boundaries read as one, and a character cut by the
/// string's own end is refused.
#[test]
fn long_strings_are_checked_across_their_chunks() {
    use metrale_pack::gguf::MAX_HELD_STRING;
    let dir = tempfile::tempdir().unwrap();
    // 3-byte characters over 2.5 MiB: 1 MiB and 2 MiB both fall inside one.
    let chars = (MAX_HELD_STRING as usize * 5 / 2) / 3;
    let text = "\u{20ac}".repeat(chars);
    assert_ne!((1usize << 20) % 3, 0);
    let img = |text: &[u8]| {
        let mut raw = Vec::new();
        let key = "tokenizer.chat_template";
        raw.extend_from_slice(&(key.len() as u64).to_le_bytes());
        raw.extend_from_slice(key.as_bytes());
        raw.extend_from_slice(&8u32.to_le_bytes()); // string
        raw.extend_from_slice(&(text.len() as u64).to_le_bytes());
        raw.extend_from_slice(text);
        let mut b = metrale_pack::gguf_write::GgufBuilder::new(32);
        b.add_kv("general.architecture", &Value::String("llama".into()));
        b.add_raw_kv(&raw);
        b.header()
    };
    let good = dir.path().join("euro.gguf");
    std::fs::write(&good, img(text.as_bytes())).unwrap();
    let g = GgufFile::open(&good).unwrap();
    let kv = g
        .kvs
        .iter()
        .find(|k| k.key == "tokenizer.chat_template")
        .unwrap();
    assert_eq!(kv.value, Value::LongString(text.len() as u64));
    assert!(&g.map[g.string_range(kv).unwrap()] == text.as_bytes());
    // The last character cut short: refused, naming the key.
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, img(&text.as_bytes()[..text.len() - 1])).unwrap();
    let e = GgufFile::open(&cut)
        .err()
        .expect("a cut character is refused");
    assert!(e.to_string().contains("tokenizer.chat_template"), "{e}");
}

/// `verify --source` against another file: one bounded line naming the first tensors that
/// differ, how many more, and that the source is not the file the pack was converted from
/// (the manifest records each source's name, size and xxh3-64).
#[test]
fn verify_against_another_source_says_so_in_one_short_line() {
    let dir = tempfile::tempdir().unwrap();
    let a = model(dir.path(), "a.gguf", GgmlType::F32);
    let b = dir.path().join("b.gguf");
    std::fs::copy(&a, &b).unwrap();
    for l in 0..2 {
        for p in ["gate", "up", "down"] {
            patch(
                &b,
                &format!("blk.{l}.ffn_{p}.weight"),
                0,
                &0.5f32.to_le_bytes(),
            );
        }
    }
    let pack = dir.path().join("a.mpk.gguf");
    let o = run(&["convert", a.to_str().unwrap(), "-o", pack.to_str().unwrap()]);
    assert!(o.status.success(), "{}", err(&o));
    let o = run(&[
        "verify",
        pack.to_str().unwrap(),
        "--source",
        b.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = err(&o);
    let line = e
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{e}"));
    println!("{line}");
    assert!(line.len() < 1000, "{} bytes: {line}", line.len());
    assert!(line.contains("tensors differ from what"), "{line}");
    assert!(line.contains(" more;"), "{line}");
    assert!(
        line.contains("the pack was converted from a.gguf")
            && line.contains("this source is b.gguf"),
        "{line}"
    );
    // Against its own source it passes, and says nothing of identity.
    let o = run(&[
        "verify",
        pack.to_str().unwrap(),
        "--source",
        a.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", err(&o));
}
