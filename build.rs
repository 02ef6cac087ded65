//! Records the git commit the binary is built from (for `metrale-pack --version`): the short
//! hash, `-dirty` when tracked files differ from it, or `unknown` outside a git checkout (a
//! crate package, a machine without git).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let o = Command::new("git").args(args).output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).map_or("unknown".to_string(), |c| {
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        if dirty { format!("{c}-dirty") } else { c }
    });
    println!("cargo:rustc-env=METRALE_GIT_COMMIT={commit}");
    // A new commit or a changed index re-runs this; a source edit alone is caught by the index
    // only once staged (the `-dirty` mark may lag edits that were never staged).
    for p in [".git/HEAD", ".git/index"] {
        if std::path::Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    if let Ok(head) = std::fs::read_to_string(".git/HEAD")
        && let Some(r) = head.strip_prefix("ref: ")
    {
        let r = format!(".git/{}", r.trim());
        if std::path::Path::new(&r).exists() {
            println!("cargo:rerun-if-changed={r}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
