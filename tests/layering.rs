//! The library's modules stand in layers that only point down, and no two files import each
//! other (docs/contributing.md, "Layout of the code"). Read from the sources: every `crate::` and `super::`
//! path outside comments and test modules, resolved to the file that defines it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules from the bottom up: each may use the ones before it, never one after.
const LAYERS: &[&str] = &[
    "name",
    "ggml_type",
    "error",
    "mapguard",
    "atomic",
    "gguf",
    "gguf_write",
    "safetensors_file",
    "npy",
    "converters",
    "model",
    "manifest",
    "gpu",
    "ffn",
    "layout",
    "pack",
    "loader",
    "testing",
    "check",
    "fuzzing",
];

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file (`src/pack/plan.rs` -> `pack::plan`; `converters/` hangs
/// off the crate root as `converters`).
fn module_of(root: &Path, f: &Path) -> Vec<String> {
    let rel = f.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts[0] == "src" {
        parts.remove(0);
    }
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its `#[cfg(test)]` module.
fn code(text: &str) -> String {
    let body = text.split("#[cfg(test)]").next().unwrap_or("");
    body.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path named after `crate::` or `super::` in `code`, relative to the crate root (a
/// `{a, b::c}` group gives one path per member).
fn paths(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        for (i, _) in code.match_indices(start) {
            if code[..i].ends_with(ident) {
                continue;
            }
            let mut base: Vec<String> = if start == "crate::" {
                Vec::new()
            } else {
                me[..me.len().saturating_sub(1)].to_vec()
            };
            let rest = &code[i + start.len()..];
            let mut seg = String::new();
            let mut chars = rest.chars().peekable();
            while let Some(c) = chars.next() {
                if ident(c) {
                    seg.push(c);
                } else if c == ':' && chars.peek() == Some(&':') {
                    chars.next();
                    base.push(std::mem::take(&mut seg));
                } else if c == '{' && seg.is_empty() {
                    let group: String = chars.by_ref().take_while(|&c| c != '}').collect();
                    for m in group.split(',') {
                        let m: Vec<String> = m
                            .split("::")
                            .map(|s| s.trim().split(' ').next().unwrap_or("").to_string())
                            .filter(|s| !s.is_empty())
                            .collect();
                        out.push([base.clone(), m].concat());
                    }
                    break;
                } else {
                    break;
                }
            }
            if !seg.is_empty() {
                base.push(seg);
                out.push(base);
            }
        }
    }
    out
}

struct Crate {
    /// Module path -> file.
    files: BTreeMap<Vec<String>, PathBuf>,
    /// File -> the files it names.
    uses: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
}

fn read_crate() -> Crate {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut list = Vec::new();
    rust_files(&root.join("src"), &mut list);
    rust_files(&root.join("converters"), &mut list);
    let files: BTreeMap<Vec<String>, PathBuf> = list
        .iter()
        .filter(|f| !f.ends_with("src/main.rs") && !f.starts_with(root.join("src/cli")))
        .map(|f| (module_of(root, f), f.clone()))
        .collect();
    let mut uses = BTreeMap::new();
    for (me, f) in &files {
        let mut to = BTreeSet::new();
        for p in paths(&code(&std::fs::read_to_string(f).unwrap()), me) {
            // The deepest module the path names.
            let Some(t) = (1..=p.len()).rev().find_map(|k| files.get(&p[..k])) else {
                continue;
            };
            // A module's own descendants are its declarations and re-exports, not a use.
            let tm = module_of(root, t);
            if t != f && !(tm.starts_with(me) && f.ends_with("mod.rs")) {
                to.insert(t.clone());
            }
        }
        uses.insert(f.clone(), to);
    }
    Crate { files, uses }
}

#[test]
fn top_level_modules_only_point_down() {
    let c = read_crate();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let layer = |f: &Path| {
        let m = module_of(root, f);
        let top = m.first().cloned().unwrap_or_default();
        LAYERS.iter().position(|&l| l == top)
    };
    let mut up = Vec::new();
    for (f, to) in &c.uses {
        let Some(a) = layer(f) else { continue };
        for t in to {
            if let Some(b) = layer(t)
                && b > a
            {
                up.push(format!("{} -> {}", f.display(), t.display()));
            }
        }
    }
    // Every top-level module is placed (a new one must be given its layer).
    for m in c.files.keys().filter(|m| m.len() == 1) {
        assert!(
            LAYERS.contains(&m[0].as_str()),
            "module {} has no layer",
            m[0]
        );
    }
    assert!(up.is_empty(), "imports that point up:\n{}", up.join("\n"));
}

#[test]
fn no_two_files_import_each_other() {
    let c = read_crate();
    // Tarjan's strongly connected components over the file graph.
    struct S<'a> {
        g: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        cycles: Vec<Vec<&'a PathBuf>>,
    }
    fn visit<'a>(s: &mut S<'a>, v: &'a PathBuf) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for w in &s.g[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.stack.contains(&w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.cycles.push(comp);
            }
        }
    }
    let mut s = S {
        g: &c.uses,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        cycles: Vec::new(),
    };
    for v in c.uses.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    assert!(s.cycles.is_empty(), "import cycles: {:?}", s.cycles);
}

/// The scanner reads plain paths, `super::` paths and `{..}` groups as the tests above need.
#[test]
fn the_scanner_reads_paths_and_groups() {
    let me: Vec<String> = vec!["check".into(), "bench_load".into()];
    let p = paths(
        "use super::probe_io::warm;\nuse crate::gpu::{sizes::X, GpuBackend as B};\nlet a = crate::pack::tp::f();",
        &me,
    );
    let want: Vec<Vec<&str>> = vec![
        vec!["gpu", "sizes", "X"],
        vec!["gpu", "GpuBackend"],
        vec!["pack", "tp", "f"],
        vec!["check", "probe_io", "warm"],
    ];
    let got: Vec<Vec<&str>> = p
        .iter()
        .map(|v| v.iter().map(String::as_str).collect())
        .collect();
    for w in want {
        assert!(got.contains(&w), "{w:?} not in {got:?}");
    }
}
