//! The fuzz targets' harnesses (`metrale_pack::fuzzing`) on stable Rust, over the seeds in
//! `fuzz/seeds/` and every input that ever crashed a target, kept in `fuzz/regressions/<target>/`.
//! The fuzzing itself needs nightly and cargo-fuzz (docs/contributing.md, "Fuzzing").

use metrale_pack::fuzzing;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// Every file of `fuzz/<kind>/<target>/` (dot files excluded).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = root().join(kind).join(target);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    v.sort();
    v
}

fn replay(target: &str, run: impl Fn(&[u8])) -> usize {
    let mut n = 0;
    for kind in ["seeds", "regressions"] {
        for p in inputs(kind, target) {
            eprintln!("{target}: {}", p.display());
            run(&std::fs::read(&p).unwrap());
            n += 1;
        }
    }
    n
}

fn template() -> Vec<u8> {
    std::fs::read(root().join("seeds/pack/template.gguf")).unwrap()
}

#[test]
fn gguf_inputs_keep_their_promises() {
    assert!(replay("gguf", fuzzing::gguf_bytes) >= 4);
}

#[test]
fn safetensors_inputs_keep_their_promises() {
    assert!(replay("safetensors", fuzzing::safetensors_bytes) >= 3);
}

#[test]
fn npy_inputs_keep_their_promises() {
    assert!(replay("npy", fuzzing::npy_bytes) >= 2);
}

#[test]
fn convert_inputs_keep_their_promises() {
    assert!(replay("convert", fuzzing::convert_bytes) >= 2);
}

#[test]
fn pack_inputs_keep_their_promises() {
    assert!(replay("pack", fuzzing::pack_bytes) >= 2);
}

#[test]
fn manifest_inputs_keep_their_promises() {
    let t = template();
    assert!(replay("manifest", |j| fuzzing::manifest_json(&t, j)) >= 1);
}

#[test]
fn loader_inputs_keep_their_promises() {
    assert!(replay("loader", fuzzing::loader_bytes) >= 2);
}

/// The seeds start the fuzzer inside the formats: each pack seed opens, and the manifest seed
/// put back into the template gives a pack that opens (else the harnesses would test nothing
/// past the first check).
#[test]
fn the_seeds_are_valid_inputs() {
    let dir = tempfile::tempdir().unwrap();
    for target in ["pack", "loader"] {
        for p in inputs("seeds", target) {
            metrale_pack::pack::Pack::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    }
    let t = template();
    for p in inputs("seeds", "manifest") {
        let json = std::fs::read_to_string(&p).unwrap();
        let img = fuzzing::with_manifest(&t, &json).unwrap();
        let out = dir.path().join("m.gguf");
        std::fs::write(&out, &img).unwrap();
        metrale_pack::pack::Pack::open(&out).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
    for target in ["gguf", "safetensors"] {
        for p in inputs("seeds", target) {
            let m = metrale_pack::model::Model::open(&p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert_eq!(m.ffn_layers.len(), 1, "{}", p.display());
        }
    }
}
