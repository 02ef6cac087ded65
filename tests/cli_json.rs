//! The command line's machine-readable output: `convert --json` and `verify --json` field names
//! pinned (a renamed field fails here), a failed verify still reporting every check in its
//! JSON with exit status 1, `--quiet` printing nothing on success, and `--version` naming the
//! commit and the build's features.

mod common;

use common::pack::*;
use common::*;
use metrale_pack::GgmlType;
use serde_json::Value;

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

#[test]
fn convert_and_verify_json_keep_their_field_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::fresh("cli_json");
    let src = gguf_model(
        dir.path(),
        "m.gguf",
        "llama",
        256,
        512,
        2,
        GgmlType::F32,
        &mut rng,
    );
    let out = dir.path().join("m.mpk.gguf");
    let o = cli(&convert_args(
        &src,
        &out,
        &["--layouts", "bf16,q2g128", "--json"],
    ));
    assert!(o.status.success(), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON object on stdout");
    assert_eq!(
        keys(&v),
        [
            "bytes",
            "ffn_layers",
            "fidelity",
            "layouts",
            "moe_layers",
            "output",
            "seconds",
            "source_bytes",
            "tensors",
            "warnings"
        ]
    );
    assert_eq!(v["bytes"], std::fs::metadata(&out).unwrap().len());
    assert_eq!(v["ffn_layers"], 2);
    assert_eq!(v["layouts"], serde_json::json!(["bf16", "q2g128"]));
    let f = &v["fidelity"][0];
    assert_eq!(
        keys(f),
        [
            "layout",
            "mean_rel_err",
            "proj",
            "worst_layer",
            "worst_rel_err"
        ]
    );
    // q2g128's error passes the warning threshold: the same lines as on stderr.
    let warnings = v["warnings"].as_array().unwrap();
    assert!(!warnings.is_empty());
    for w in warnings {
        assert!(err(&o).contains(w.as_str().unwrap()));
    }
    assert!(!err(&o).contains("wrote"), "--json prints no text summary");

    let o = cli(&[
        "verify",
        out.to_str().unwrap(),
        "--source",
        src.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        keys(&v),
        [
            "blob_rules",
            "checksum_mismatches",
            "nonzero_padding",
            "ok",
            "pack",
            "source",
            "tensors"
        ]
    );
    assert_eq!(v["ok"], true);
    assert_eq!(v["blob_rules"], serde_json::json!([]));
    assert_eq!(
        keys(&v["source"]),
        [
            "checked",
            "count_differs",
            "file",
            "mismatched",
            "other_source"
        ]
    );
    assert_eq!(v["source"]["checked"], v["tensors"]);

    // One flipped byte of a tensor: the report says which, `ok` is false, exit status 1.
    let p = metrale_pack::pack::Pack::open(&out).unwrap();
    let i = p.index("blk.0.ffn_gate.bf16").unwrap();
    let at = p.file.tensors[i].file_offset;
    drop(p);
    let mut bytes = std::fs::read(&out).unwrap();
    bytes[at as usize] ^= 0x40;
    let bad = dir.path().join("bad.mpk.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let o = cli(&["verify", bad.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(
        v["checksum_mismatches"],
        serde_json::json!(["blk.0.ffn_gate.bf16"])
    );
    assert_eq!(v["source"], Value::Null);
}

#[test]
fn quiet_prints_nothing_on_success_and_version_names_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::fresh("cli_quiet");
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
    let out = dir.path().join("m.mpk.gguf");
    // --quiet is global: after the command as well as before it.
    let o = cli(&convert_args(&src, &out, &["--layouts", "bf16", "--quiet"]));
    assert!(o.status.success(), "{}", err(&o));
    assert!(o.stdout.is_empty() && o.stderr.is_empty(), "{}", err(&o));
    let o = cli(&["verify", out.to_str().unwrap(), "-q"]);
    assert!(o.status.success());
    assert!(o.stdout.is_empty() && o.stderr.is_empty(), "{}", err(&o));

    let o = cli(&["--version"]);
    let s = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        s.starts_with(&format!("metrale-pack {}", env!("CARGO_PKG_VERSION"))),
        "{s}"
    );
    let commit = s
        .split("commit ")
        .nth(1)
        .and_then(|t| t.split(';').next())
        .unwrap_or_else(|| panic!("{s}"));
    let hash = commit.trim_end_matches("-dirty");
    assert!(
        hash == "unknown" || (hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit())),
        "{s}"
    );
    assert!(s.contains("features: harness"), "{s}");
    assert!(s.contains(&format!(
        "pack format {}",
        metrale_pack::pack::PACK_FORMAT_VERSION
    )));
}

/// `completions SHELL` prints a script that names every command and flag; bash parses the bash
/// one.
#[test]
fn completions_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let o = cli(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", err(&o));
        let s = String::from_utf8_lossy(&o.stdout).to_string();
        // fish names a long flag by `-l NAME`, the others by `--NAME`.
        for word in [
            "convert",
            "verify",
            "layouts",
            "allow-requantize",
            "dry-run",
        ] {
            assert!(s.contains(word), "{shell}: no {word}");
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("metrale-pack.bash");
    std::fs::write(&script, cli(&["completions", "bash"]).stdout).unwrap();
    let st = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .unwrap();
    assert!(st.success(), "bash -n rejects the script");
    let o = cli(&["completions", "tcsh"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

/// `METRALE_BACKTRACE=1` adds a backtrace whose frames name their functions (the release build
/// keeps its symbols).
#[test]
fn backtraces_name_functions() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(["inspect", "/nonexistent/metrale-pack-probe.gguf"])
        .env("METRALE_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = err(&o);
    assert!(e.starts_with("error: "), "{e}");
    // A frame of this binary's own code by name (which one survives inlining depends on the
    // build: `run`, `main`, the subcommand's function).
    assert!(
        e.lines().any(|l| l
            .trim_start()
            .split_once(": ")
            .is_some_and(|(_, f)| f.starts_with("metrale_pack::"))),
        "no named frame:\n{e}"
    );
    assert!(!e.contains("<unknown>"), "{e}");
}
