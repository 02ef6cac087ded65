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
    "options",
    "loader",
    "testing",
    "check",
    "fuzzing",
];

/// A built-in layout's folder (`src/layouts/TAG/`, module `layouts::TAG`) holds files of several
/// layers: each part stands in the layer of what it implements, by its name. The folder's
/// `mod.rs` and `layouts/mod.rs` only declare modules.
const LAYOUT_PARTS: &[(&str, &str)] = &[
    ("codec", "converters"),
    ("blocks", "converters"),
    ("groups", "converters"),
    ("twin", "gpu"),
    ("kernels", "gpu"),
    ("sizes", "gpu"),
    ("host", "gpu"),
    ("grids", "gpu"),
    ("runtime", "ffn"),
    ("arms", "ffn"),
    ("spec", "layout"),
    ("testing", "testing"),
    ("check_kernels", "check"),
    ("check_w8a8", "check"),
    ("check_layers", "check"),
    ("check_load", "check"),
    ("bench", "check"),
];

/// The layer a module stands in: its top-level module's, or for a layout folder's part the
/// layer of that part (`None` for the declaration-only `layouts` and `layouts::TAG`).
fn layer_of(m: &[String]) -> Option<&'static str> {
    match m {
        [top, _, part, ..] if top == "layouts" => Some(
            LAYOUT_PARTS
                .iter()
                .find(|(p, _)| p == part)
                .unwrap_or_else(|| panic!("layout part {part} has no layer (LAYOUT_PARTS)"))
                .1,
        ),
        [top, ..] if top == "layouts" => None,
        [top, ..] => LAYERS.iter().copied().find(|l| l == top),
        [] => None,
    }
}

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

/// Every module file of the library and its module path, walked from `src/lib.rs` through
/// each `mod NAME;` declaration as rustc resolves it: `#[path = "P"]` relative to the declaring
/// file's folder (a layout's files live in `src/layouts/TAG/` and are mounted into the layers
/// they belong to), else `NAME.rs` or `NAME/mod.rs` beside a `lib.rs`, `mod.rs` or
/// `#[path]`-loaded file, or in the folder named after any other file.
fn module_files(root: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut todo = vec![(root.join("src/lib.rs"), Vec::<String>::new(), true)];
    while let Some((file, me, mod_rs)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap();
        let dir = file.parent().unwrap().to_path_buf();
        let own = if mod_rs {
            dir.clone()
        } else {
            dir.join(file.file_stem().unwrap())
        };
        let mut path_attr: Option<String> = None;
        for line in code(&text).lines() {
            let t = line.trim();
            if let Some(rest) = t.strip_prefix("#[path = \"") {
                path_attr = Some(rest.trim_end_matches("\"]").to_string());
                continue;
            }
            if t.starts_with("#[") {
                continue;
            }
            let decl = t
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                let (child, child_mod_rs) = match path_attr.take() {
                    Some(p) => (dir.join(p), true),
                    None if own.join(format!("{name}.rs")).exists() => {
                        (own.join(format!("{name}.rs")), false)
                    }
                    None => (own.join(name).join("mod.rs"), true),
                };
                let child = child.canonicalize().unwrap_or_else(|_| {
                    panic!(
                        "{}: mod {name} has no file {}",
                        file.display(),
                        child.display()
                    )
                });
                let mut m = me.clone();
                m.push(name.to_string());
                todo.push((child, m, child_mod_rs));
            }
            path_attr = None;
        }
        if !me.is_empty() {
            out.insert(me, file);
        }
    }
    out
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
    /// File -> the layout parts it mounts (re-exports from `crate::layouts`).
    mounts: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
}

fn read_crate() -> Crate {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = module_files(root);
    let module_of: BTreeMap<&PathBuf, &Vec<String>> = files.iter().map(|(m, f)| (f, m)).collect();
    let mut uses = BTreeMap::new();
    let mut mounts = BTreeMap::new();
    for (me, f) in &files {
        let text = code(&std::fs::read_to_string(f).unwrap());
        // A layer's registry mounts a layout's part by re-exporting it (`use
        // crate::layouts::TAG::PART as TAG;`, `pub use crate::layouts::TAG::PART::*;`): a
        // declaration, as a parent's `mod` line is, checked apart (`mounts_stay_in_their_layer`).
        // A layout's own files use other layouts' parts (`nvfp4_t` builds on `nvfp4`): uses.
        let (mount_lines, code_lines): (Vec<&str>, Vec<&str>) = text.lines().partition(|l| {
            let t = l
                .trim()
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            me[0] != "layouts" && t.starts_with("use crate::layouts::")
        });
        mounts.insert(
            f.clone(),
            mounted(&files, me, &mount_lines.join("\n"), &text),
        );
        let mut to = BTreeSet::new();
        for t in named(&files, me, &code_lines.join("\n")) {
            // A module's own descendants (which only it can declare) are its declarations and
            // re-exports, not a use.
            if t != f && !module_of[t].starts_with(me) {
                to.insert(t.clone());
            }
        }
        uses.insert(f.clone(), to);
    }
    Crate {
        files,
        uses,
        mounts,
    }
}

/// The files the paths in `code` name (the deepest module of each).
fn named<'a>(
    files: &'a BTreeMap<Vec<String>, PathBuf>,
    me: &[String],
    code: &str,
) -> Vec<&'a PathBuf> {
    paths(code, me)
        .iter()
        .filter_map(|p| (1..=p.len()).rev().find_map(|k| files.get(&p[..k])))
        .collect()
}

/// The layout parts a file mounts: those its mount lines name, and, where a registry is
/// generated from `layouts::builtin_layouts!` and names a part through a macro variable
/// (`crate::layouts::$t::spec::$v`), that part of every folder.
fn mounted(
    files: &BTreeMap<Vec<String>, PathBuf>,
    me: &[String],
    mount_lines: &str,
    text: &str,
) -> BTreeSet<PathBuf> {
    let mut out: BTreeSet<PathBuf> = named(files, me, mount_lines).into_iter().cloned().collect();
    for (i, _) in text.match_indices("crate::layouts::$") {
        let part: String = text[i + "crate::layouts::$".len()..]
            .split("::")
            .nth(1)
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        for (m, t) in files {
            if m.len() == 3 && m[0] == "layouts" && m[2] == part {
                out.insert(t.clone());
            }
        }
    }
    out
}

#[test]
fn top_level_modules_only_point_down() {
    let c = read_crate();
    let module_of: BTreeMap<&PathBuf, &Vec<String>> = c.files.iter().map(|(m, f)| (f, m)).collect();
    let layer = |f: &Path| {
        let l = layer_of(module_of[&f.to_path_buf()])?;
        LAYERS.iter().position(|&x| x == l)
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
    // Every source file of the library was reached by the walk (none mounted where the walk
    // does not look).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    for d in ["src", "converters"] {
        rust_files(&root.join(d), &mut all);
    }
    let reached: BTreeSet<&PathBuf> = c.files.values().collect();
    // A file mounted in a `#[cfg(test)]` module (`gpu/table_tests.rs`) is a test, not library.
    let test_mounts: Vec<PathBuf> = reached
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let tests = text
                .split_once("#[cfg(test)]")
                .map_or("", |(_, t)| t)
                .to_string();
            tests
                .lines()
                .filter_map(|l| l.trim().strip_prefix("#[path = \""))
                .map(|p| f.parent().unwrap().join(p.trim_end_matches("\"]")))
                .collect::<Vec<_>>()
        })
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    let missed: Vec<String> = all
        .iter()
        .map(|f| f.canonicalize().unwrap())
        .filter(|f| {
            !reached.contains(f)
                && !test_mounts.contains(f)
                && !f.ends_with("src/lib.rs")
                && !f.ends_with("src/main.rs")
                && !f.starts_with(root.join("src/cli").canonicalize().unwrap())
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        missed.is_empty(),
        "files the module walk did not reach: {missed:?}"
    );
    // Every top-level module is placed (a new one must be given its layer).
    for m in c.files.keys().filter(|m| m.len() == 1 && m[0] != "layouts") {
        assert!(
            LAYERS.contains(&m[0].as_str()),
            "module {} has no layer",
            m[0]
        );
    }
    // A layout folder's declaration files hold no code that could import.
    for (m, f) in c
        .files
        .iter()
        .filter(|(m, _)| m[0] == "layouts" && m.len() <= 2)
    {
        assert!(
            c.uses[f].is_empty(),
            "{} ({}) only declares modules, yet imports {:?}",
            m.join("::"),
            f.display(),
            c.uses[f]
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

/// A registry mounts only the layout parts of its own layer (the `ffn` runtime registry a
/// `runtime.rs`, never a `spec.rs`).
#[test]
fn mounts_stay_in_their_layer() {
    let c = read_crate();
    let module_of: BTreeMap<&PathBuf, &Vec<String>> = c.files.iter().map(|(m, f)| (f, m)).collect();
    let mut wrong = Vec::new();
    let mut any = 0;
    for (f, ts) in &c.mounts {
        for t in ts {
            any += 1;
            let (a, b) = (layer_of(module_of[f]), layer_of(module_of[t]));
            if a != b {
                wrong.push(format!(
                    "{} ({a:?}) mounts {} ({b:?})",
                    f.display(),
                    t.display()
                ));
            }
        }
    }
    assert!(any > 0, "no registry mounts a layout part");
    assert!(
        wrong.is_empty(),
        "mounts across layers:\n{}",
        wrong.join("\n")
    );
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
