//! Issue 55's measure as a ratchet: for each built-in layout, the source files outside its
//! folder (`src/layouts/TAG/`) that name it (its tag or its `Layout` variant as a whole word) in
//! the library, the converters and the kernels, as `scripts/layout-footprint.sh` counts them.
//! A count may fall, never rise past its ceiling (lower a ceiling when a change lowers the
//! count); the goal is 5 for every layout (the registry line, the CLI help, and a few).

use std::path::{Path, PathBuf};

/// `(tag, variant, ceiling)`: the counts of 2026-12-05 (session 35).
const CEILINGS: [(&str, &str, usize); 10] = [
    ("affine", "Affine", 5),
    ("bf16", "Bf16", 57),
    ("fp8", "Fp8", 21),
    ("lora", "Lora", 24),
    ("nvfp4", "Nvfp4", 50),
    ("nvfp4_mmq", "Nvfp4Mmq", 14),
    ("nvfp4_t", "Nvfp4T", 10),
    ("q2g128", "Q2g128", 7),
    ("q4k_mmq", "Q4kMmq", 12),
    ("w8a8", "W8a8", 5),
];

/// Every `.rs`, `.cu` and `.cuh` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p
            .extension()
            .is_some_and(|x| x == "rs" || x == "cu" || x == "cuh")
        {
            out.push(p);
        }
    }
}

/// Whether `word` occurs in `text` with no letter, digit or `_` on either side.
fn names(text: &str, word: &str) -> bool {
    let part = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    text.match_indices(word).any(|(i, _)| {
        !part(text[..i].chars().next_back()) && !part(text[i + word.len()..].chars().next())
    })
}

#[test]
fn no_layout_is_named_in_more_files_outside_its_folder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("build.rs")];
    for d in ["src", "converters", "kernels"] {
        sources(&root.join(d), &mut files);
    }
    let texts: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|p| {
            let t = std::fs::read_to_string(&p).unwrap();
            (p, t)
        })
        .collect();
    let mut over = Vec::new();
    for (tag, variant, ceiling) in CEILINGS {
        let own = root.join("src/layouts").join(tag);
        let naming: Vec<&PathBuf> = texts
            .iter()
            .filter(|(p, t)| !p.starts_with(&own) && (names(t, tag) || names(t, variant)))
            .map(|(p, _)| p)
            .collect();
        if naming.len() > ceiling {
            over.push(format!(
                "{tag}: {} files (ceiling {ceiling}): {naming:?}",
                naming.len()
            ));
        }
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
    assert!(names("use x::affine;", "affine") && !names("affine_gemv", "affine"));
}
