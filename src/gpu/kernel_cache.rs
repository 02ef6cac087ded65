//! The disk cache of kernels NVRTC compiled at run time (a GPU the prebuilt sm_90 cubins do
//! not cover, or `METRALE_NO_PREBUILT`). A cached cubin is code the driver runs, so the cache
//! is private and each file is checked before it is loaded:
//!
//! - **Where**: `METRALE_KERNEL_CACHE`, else `$XDG_CACHE_HOME/metrale-pack/kernels`, else
//!   `$HOME/.cache/metrale-pack/kernels`, else (no `HOME`: a service account)
//!   `TMPDIR/metrale-pack-kernels-UID`, made `0700`. Never a folder shared by every user.
//! - **Whose**: the folder must be a real folder (not a symlink) owned by this process's user
//!   and writable by no one else (`mode & 0o022 == 0`); otherwise nothing is cached or read,
//!   and the kernel is compiled each time.
//! - **What**: a file is the cubin followed by a [`TRAILER`]-byte trailer, `MPKC`, 4 zero
//!   bytes, and the xxh3-64 of the source key (the hash of the kernel source, options,
//!   target and NVRTC version the file name claims) and the cubin together. A file whose
//!   trailer does not match its name's key is not loaded (and is removed): a truncated write,
//!   a file of another source, or bytes copied in by hand.
//!
//! Writes are crash-safe (a temporary file renamed into place).

use std::path::{Path, PathBuf};

/// Bytes after the cubin: magic, 4 reserved zero bytes, the xxh3-64.
pub const TRAILER: usize = 16;
const MAGIC: &[u8; 4] = b"MPKC";

/// The cache folder for this process (see the module doc; [`private_dir`] checks it before
/// each use). `env` reads a variable (the process's environment in use; a table in tests).
pub fn cache_dir(env: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    let nonempty = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = nonempty("METRALE_KERNEL_CACHE") {
        d
    } else if let Some(x) = nonempty("XDG_CACHE_HOME") {
        x.join("metrale-pack/kernels")
    } else if let Some(h) = nonempty("HOME") {
        h.join(".cache/metrale-pack/kernels")
    } else {
        let tmp = nonempty("TMPDIR").unwrap_or_else(|| PathBuf::from("/tmp"));
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        tmp.join(format!("metrale-pack-kernels-{uid}"))
    }
}

/// Make `dir` (mode `0700` for what is created) and check it is private: a real folder owned
/// by this user, writable by no one else. The reason when it is not.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        return Err(format!("{}: {e}", dir.display()));
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !m.is_dir() {
        return Err(format!("{} is not a folder (a symlink?)", dir.display()));
    }
    if m.uid() != uid {
        return Err(format!(
            "{} belongs to user {}, not to this process's user {uid}",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by others (mode {:o})",
            dir.display(),
            m.mode() & 0o777
        ));
    }
    Ok(())
}

/// The trailer's hash: the key and the cubin.
fn seal(key: u64, cubin: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&key.to_le_bytes());
    h.update(cubin);
    h.digest()
}

/// The file's bytes for `cubin` under `key`.
pub fn sealed(key: u64, cubin: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(cubin.len() + TRAILER);
    v.extend_from_slice(cubin);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&seal(key, cubin).to_le_bytes());
    v
}

/// The cubin in `file`'s bytes if its trailer seals it under `key`.
pub fn unsealed(key: u64, file: &[u8]) -> Option<&[u8]> {
    let cut = file.len().checked_sub(TRAILER)?;
    let (cubin, t) = file.split_at(cut);
    let h = u64::from_le_bytes(t[8..16].try_into().ok()?);
    (&t[..4] == MAGIC && t[4..8] == [0; 4] && h == seal(key, cubin)).then_some(cubin)
}

/// The cubin cached at `path` under `key`, if the folder is private and the file sealed; a
/// file that fails its seal is removed.
pub fn read(dir: &Path, path: &Path, key: u64) -> Option<Vec<u8>> {
    private_dir(dir).ok()?;
    let bytes = std::fs::read(path).ok()?;
    match unsealed(key, &bytes) {
        Some(c) => Some(c.to_vec()),
        None => {
            tracing::warn!(
                "kernel cache: {} does not match its source key; removed, compiling again",
                path.display()
            );
            let _ = std::fs::remove_file(path);
            None
        }
    }
}

/// Cache `cubin` at `path` under `key` (crash-safe), when the folder is private; why not, else.
pub fn write(dir: &Path, path: &Path, key: u64, cubin: &[u8]) -> Result<(), String> {
    private_dir(dir)?;
    crate::atomic::write_atomic(path, |w| -> crate::Result<()> {
        use std::io::Write;
        w.write_all(&sealed(key, cubin))
            .map_err(|err| crate::Error::Io {
                file: path.display().to_string(),
                err,
            })
    })
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<std::ffi::OsString> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.into())
    }

    #[test]
    fn the_folder_is_the_users_and_never_a_shared_one() {
        let e = [("HOME", "/home/u"), ("XDG_CACHE_HOME", "")];
        assert_eq!(
            cache_dir(&env(&e)),
            PathBuf::from("/home/u/.cache/metrale-pack/kernels")
        );
        let e = [("HOME", "/home/u"), ("XDG_CACHE_HOME", "/c")];
        assert_eq!(
            cache_dir(&env(&e)),
            PathBuf::from("/c/metrale-pack/kernels")
        );
        let e = [("METRALE_KERNEL_CACHE", "/k"), ("HOME", "/home/u")];
        assert_eq!(cache_dir(&env(&e)), PathBuf::from("/k"));
        // No HOME: a folder of this user's own, not one every user shares.
        let e = [("TMPDIR", "/t")];
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        assert_eq!(
            cache_dir(&env(&e)),
            PathBuf::from(format!("/t/metrale-pack-kernels-{uid}"))
        );
    }

    #[test]
    fn a_folder_others_can_write_or_a_symlink_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("k");
        private_dir(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "made {mode:o}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&d).unwrap_err();
        assert!(e.contains("writable by others"), "{e}");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = private_dir(&link).unwrap_err();
        assert!(e.contains("not a folder"), "{e}");
        // Nothing is read from, or written to, a folder that is not private.
        assert!(write(&link, &link.join("a.cubin"), 1, b"x").is_err());
    }

    #[test]
    fn a_cubin_loads_only_under_the_key_it_was_sealed_with() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("k");
        let p = d.join("m-sm_90-00000000000000aa.cubin");
        let cubin = b"\x7fELF a cubin's bytes".to_vec();
        write(&d, &p, 0xaa, &cubin).unwrap();
        assert_eq!(read(&d, &p, 0xaa).unwrap(), cubin);
        // Another source's key: not loaded, and removed.
        assert!(read(&d, &p, 0xab).is_none());
        assert!(!p.exists());
        // A cubin planted without the seal, or with one byte changed, is refused.
        std::fs::write(&p, &cubin).unwrap();
        assert!(read(&d, &p, 0xaa).is_none());
        let mut forged = sealed(0xaa, &cubin);
        forged[3] ^= 1;
        std::fs::write(&p, &forged).unwrap();
        assert!(read(&d, &p, 0xaa).is_none());
        // Too short to hold a trailer.
        assert!(unsealed(0xaa, b"short").is_none());
    }
}
