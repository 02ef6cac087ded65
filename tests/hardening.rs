//! The CLI as a hostile or careless user meets it: an output that is an input is refused before
//! any work, through every spelling; a SIGKILL during `convert` leaves nothing behind; errors are
//! one line; non-regular files are refused instead of hanging.

mod common;

use common::pack::files_in;

use std::path::Path;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn small_model(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &p,
        64,
        128,
        2,
        metrale_pack::GgmlType::F16,
        "llama",
    )
    .unwrap();
    p
}

#[test]
fn an_output_that_is_an_input_is_refused_through_any_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let m = small_model(dir.path());
    let before = std::fs::read(&m).unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let link = dir.path().join("link.gguf");
    std::os::unix::fs::symlink(&m, &link).unwrap();
    let spellings = [
        m.to_str().unwrap().to_string(),
        format!("{}/../m.gguf", sub.display()),
        link.to_str().unwrap().to_string(),
    ];
    for out in &spellings {
        let o = run(&["convert", m.to_str().unwrap(), "-o", out]);
        assert!(!o.status.success(), "convert -o {out} succeeded");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("same file"), "{err}");
        let o = run(&[
            "dump",
            m.to_str().unwrap(),
            "blk.0.ffn_gate.weight",
            "-o",
            out,
        ]);
        assert!(!o.status.success(), "dump -o {out} succeeded");
        assert!(String::from_utf8_lossy(&o.stderr).contains("same file"));
    }
    // Relative to the working directory.
    let o = bin()
        .current_dir(&sub)
        .args(["convert", "../m.gguf", "-o", "./../m.gguf"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(std::fs::read(&m).unwrap(), before, "the input is untouched");
    // A folder as output is refused before any work.
    let o = run(&["convert", m.to_str().unwrap(), "-o", sub.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("folder"));
    // The default output never equals the input, even for a file named like a pack.
    let named = dir.path().join("x.mpk.gguf");
    std::fs::copy(&m, &named).unwrap();
    let o = run(&["convert", named.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read(&named).unwrap(), before);
    assert!(dir.path().join("x.repack.mpk.gguf").exists());
}

#[test]
fn sigkill_during_convert_leaves_nothing_and_the_next_run_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("big.gguf");
    metrale_pack::testing::gen_model::gen_model(
        &m,
        1024,
        4096,
        6,
        metrale_pack::GgmlType::F16,
        "llama",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("p.mpk.gguf");
    for delay_ms in [30u64, 120, 300] {
        let mut child = bin()
            .args(["convert", m.to_str().unwrap(), "-o", out.to_str().unwrap()])
            .args(["--layouts", "nvfp4,q4k_mmq,fp8", "--threads", "1"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let left = files_in(&out_dir);
        assert!(
            left.is_empty() || left == ["p.mpk.gguf"],
            "after SIGKILL at {delay_ms} ms: {left:?}"
        );
        let _ = std::fs::remove_file(&out);
    }
    // A named temporary of a dead process (what a filesystem without O_TMPFILE leaves) is removed
    // by the next convert into the same folder.
    std::fs::write(out_dir.join(".p.mpk.gguf.mpk-tmp-2147483646"), b"stale").unwrap();
    let o = run(&[
        "convert",
        m.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--layouts",
        "bf16",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(files_in(&out_dir), ["p.mpk.gguf"]);
}

#[test]
fn errors_are_one_line_even_with_rust_backtrace_set() {
    let o = bin()
        .args(["inspect", "/no/such/file.gguf"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("error: /no/such/file.gguf"), "{err}");
}

#[test]
fn a_fifo_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: FFI with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    for args in [
        vec!["inspect", fifo.to_str().unwrap()],
        vec!["verify", fifo.to_str().unwrap()],
    ] {
        let mut child = bin()
            .args(&args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if t0.elapsed().as_secs() > 20 {
                let _ = child.kill();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let status = status.unwrap_or_else(|| panic!("{args:?} hangs on a FIFO"));
        assert!(!status.success());
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(err.contains("not a regular file"), "{err}");
    }
}

/// Convert a small model; return (pack path, pack bytes, source path).
fn small_pack(dir: &Path) -> (std::path::PathBuf, Vec<u8>, std::path::PathBuf) {
    let m = small_model(dir);
    let p = dir.join("m.mpk.gguf");
    let o = run(&["convert", m.to_str().unwrap(), "-o", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&p).unwrap();
    (p, bytes, m)
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not found", String::from_utf8_lossy(needle)))
}

fn verify(p: &Path, src: Option<&Path>) -> (bool, String) {
    let mut args = vec!["verify", p.to_str().unwrap()];
    if let Some(s) = src {
        args.extend(["--source", s.to_str().unwrap()]);
    }
    let o = run(&args);
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn any_changed_header_byte_or_padding_byte_fails_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (p, good, src) = small_pack(dir.path());
    assert!(verify(&p, Some(&src)).0);
    let g = metrale_pack::gguf::parse(&good, "mem").unwrap();
    // A digit of a global_scale in the manifest, a byte of a copied metadata value (the
    // architecture string stands in for the tokenizer's), a tensor-table byte, and padding.
    let gs = last_digit_of_global_scale(&good);
    let arch = find(&good, b"llama");
    let table = g.kvs.last().unwrap().span.end + 10;
    let t0 = g
        .tensors
        .iter()
        .find(|t| t.bytes % 4096 != 0)
        .expect("a tensor followed by padding");
    let pad = (g.data_offset + t0.offset + t0.bytes) as usize;
    for (what, at) in [
        ("global_scale", gs),
        ("metadata", arch),
        ("tensor table", table),
        ("padding", pad),
    ] {
        let mut img = good.clone();
        img[at] ^= if what == "global_scale" { 0x01 } else { 0x20 };
        std::fs::write(&p, &img).unwrap();
        let (ok, err) = verify(&p, None);
        assert!(!ok, "{what}: verify passed");
        let want = if what == "padding" {
            "padding"
        } else {
            "header_xxh3"
        };
        assert!(err.contains(want), "{what}: {err}");
    }
}

#[test]
fn a_hostile_manifest_with_a_recomputed_checksum_is_refused_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let (p, good, src) = small_pack(dir.path());
    // A shape edit (what made dump write a 1 GB file), a padded shape, a scalar, a byte count
    // and an unknown layout: each refused on open, naming the tensor and field.
    let cases: [(&[u8], &[u8], &str); 4] = [
        (b"\"shape\":[128,64]", b"\"shape\":[999,64]", "ffn.shape"),
        (b"\"padded\":[128,64]", b"\"padded\":[128,96]", "ffn.padded"),
        (
            b"\"layout\":\"nvfp4_mmq\"",
            b"\"layout\":\"nvfp4_xyz\"",
            "ffn.layout",
        ),
        (b"\"global_scale\":", b"\"global_scalf\":", "ffn.scalars"),
    ];
    for (from, to, field) in cases {
        std::fs::write(&p, common::pack::edited_manifest(&good, from, to)).unwrap();
        for args in [
            vec!["verify", p.to_str().unwrap()],
            vec![
                "dump",
                p.to_str().unwrap(),
                "blk.0.ffn_gate.nvfp4",
                "-o",
                "/dev/null",
            ],
            vec!["inspect", p.to_str().unwrap()],
        ] {
            let o = run(&args);
            assert!(!o.status.success(), "{field}: {args:?} passed");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains(field) && err.contains("blk.0."),
                "{field}: {args:?}: {err}"
            );
        }
    }
    // A changed scalar value that stays consistent passes the open checks but not
    // `verify --source`, which re-derives every manifest field too.
    let mut img = good.clone();
    let at = last_digit_of_global_scale(&img);
    img[at] = if img[at] == b'1' { b'2' } else { b'1' };
    assert!(metrale_pack::fuzzing::rehash(&mut img));
    std::fs::write(&p, &img).unwrap();
    let (ok, err) = verify(&p, Some(&src));
    assert!(!ok && err.contains("differ"), "{err}");
}

/// The position of the last digit of the first `global_scale` value in the manifest.
fn last_digit_of_global_scale(img: &[u8]) -> usize {
    let start = find(img, b"\"global_scale\":") + 15;
    let end = start
        + img[start..]
            .iter()
            .position(|&c| c == b'}' || c == b',')
            .unwrap();
    assert!(img[end - 1].is_ascii_digit());
    end - 1
}

fn run_measured(args: &[&str]) -> (std::process::ExitStatus, u64) {
    common::run_measured(bin(), args)
}

#[test]
fn inspect_json_of_a_million_empty_tensors_stays_within_10x_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.gguf");
    let mut b = metrale_pack::gguf_write::GgufBuilder::new(32);
    b.add_kv(
        "general.architecture",
        &metrale_pack::gguf::Value::String("llama".into()),
    );
    for i in 0..1_000_000 {
        b.add_tensor(&format!("t.{i:08}"), &[0], metrale_pack::GgmlType::F32);
    }
    std::fs::write(&p, b.header()).unwrap();
    let file = std::fs::metadata(&p).unwrap().len();
    assert!(file > 30_000_000, "{file}");
    let (st, rss) = run_measured(&["inspect", "--json", p.to_str().unwrap()]);
    assert!(st.success(), "{st:?}");
    assert!(
        rss < 10 * file,
        "inspect --json peak RSS {rss} bytes for a {file}-byte file"
    );
}

#[test]
fn convert_time_is_linear_in_the_layer_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut secs = Vec::new();
    for layers in [10_000, 40_000] {
        let src = dir.path().join(format!("l{layers}.gguf"));
        metrale_pack::testing::gen_model::gen_model(
            &src,
            16,
            16,
            layers,
            metrale_pack::GgmlType::F16,
            "llama",
        )
        .unwrap();
        let out = dir.path().join("out.mpk.gguf");
        // The faster of two runs, so one slow moment of a shared machine does not decide.
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let t = std::time::Instant::now();
            let o = run(&[
                "convert",
                src.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--layouts",
                "bf16",
                "--threads",
                "1",
            ]);
            best = best.min(t.elapsed().as_secs_f64());
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            std::fs::remove_file(&out).unwrap();
        }
        std::fs::remove_file(&src).unwrap();
        secs.push(best);
    }
    // Linear: 4x the layers takes about 4x the time; quadratic would take 16x. Allow 2x of linear.
    let ratio = secs[1] / secs[0];
    assert!(
        ratio < 8.0,
        "10k layers {:.2} s, 40k layers {:.2} s: {ratio:.1}x for 4x the layers",
        secs[0],
        secs[1]
    );
}

#[test]
fn a_pack_truncated_while_verify_reads_it_is_an_error_not_sigbus() {
    let dir = tempfile::tempdir().unwrap();
    let (p, bytes, src) = small_pack(dir.path());
    let pack = metrale_pack::pack::Pack::open(&p).unwrap();
    assert!(pack.verify_checksums().unwrap().is_empty());
    // Cut the file after opening, as a user truncating it during `verify` would: every read
    // that follows must fail cleanly (through the map it would be SIGBUS and kill this test).
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(bytes.len() as u64 / 2).unwrap();
    let e = pack.verify_checksums().unwrap_err().to_string();
    assert!(e.contains("m.mpk.gguf") && e.contains("change"), "{e}");
    let e = metrale_pack::pack_check::nonzero_padding(&pack.file)
        .unwrap_err()
        .to_string();
    assert!(e.contains("m.mpk.gguf"), "{e}");
    let model = metrale_pack::model::Model::open(&src).unwrap();
    let e = metrale_pack::pack::verify_against_source(&pack, &model)
        .unwrap_err()
        .to_string();
    assert!(e.contains("m.mpk.gguf"), "{e}");
}
