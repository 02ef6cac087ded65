//! Crash-safe output files: write to a temporary file beside the target, fsync, rename. An
//! interrupted or failed write leaves no file at the target path (and removes its temporary).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// The temporary file being written, as a leaked C string, for the signal handler.
static PENDING: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
static HANDLERS: AtomicBool = AtomicBool::new(false);

extern "C" fn remove_pending_and_reraise(sig: libc::c_int) {
    let p = PENDING.swap(std::ptr::null_mut(), Ordering::SeqCst);
    // SAFETY: unlink, signal and raise are async-signal-safe; `p` is null or a NUL-terminated
    // path leaked by `write_atomic` and never freed while registered.
    unsafe {
        if !p.is_null() {
            libc::unlink(p);
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Make SIGINT, SIGTERM and SIGHUP remove the temporary file of the write in progress before the
/// process dies (the CLI calls this; a library user keeps its own signal policy).
pub fn remove_temp_on_signal() {
    if HANDLERS.swap(true, Ordering::SeqCst) {
        return;
    }
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installing a handler that only performs async-signal-safe calls.
        unsafe {
            libc::signal(
                sig,
                remove_pending_and_reraise as *const () as libc::sighandler_t,
            )
        };
    }
}

/// Write `path` through `fill`; the file appears at `path` only if `fill` succeeds and the data
/// reached the disk.
pub fn write_atomic<E>(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<(), E>,
) -> anyhow::Result<()>
where
    E: Into<anyhow::Error>,
{
    let tmp = temp_path(path);
    let registered = HANDLERS.load(Ordering::SeqCst).then(|| {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(tmp.as_os_str().as_bytes())
            .unwrap_or_default()
            .into_raw();
        PENDING.store(c, Ordering::SeqCst);
        c
    });
    let result = (|| -> anyhow::Result<()> {
        let f = File::create(&tmp).map_err(|e| anyhow::anyhow!("{}: {e}", tmp.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        fill(&mut w).map_err(Into::into)?;
        let f = w
            .into_inner()
            .map_err(|e| anyhow::anyhow!("{}: {}", tmp.display(), e.error()))?;
        f.sync_all()
            .map_err(|e| anyhow::anyhow!("{}: fsync: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| anyhow::anyhow!("{}: rename: {e}", path.display()))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Persist the rename itself; not all filesystems allow fsync on a directory.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    })();
    if let Some(c) = registered {
        // Unregister before freeing; if a handler took the path first, the process is dying and
        // the string is left to it.
        if PENDING
            .compare_exchange(c, std::ptr::null_mut(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            // SAFETY: `c` came from CString::into_raw above and no handler can reach it any more.
            drop(unsafe { std::ffi::CString::from_raw(c) });
        }
    }
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// `DIR/.NAME.tmp-PID` beside `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "out".into());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn failed_fill_leaves_no_file_and_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.bin");
        let r = write_atomic(&out, |w| -> anyhow::Result<()> {
            w.write_all(b"partial")?;
            anyhow::bail!("interrupted")
        });
        assert!(r.is_err());
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        write_atomic(&out, |w| w.write_all(b"done")).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"done");
    }
}
