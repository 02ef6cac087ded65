//! Crash-safe output files. The data is written to an unnamed temporary file in the target's
//! folder (`O_TMPFILE`), fsynced, given a name only once it is complete, and renamed over the
//! target, so a process killed at any point (SIGKILL included) leaves no file behind, except in
//! the instant between naming and renaming. Where the filesystem has no `O_TMPFILE`, a named
//! temporary `.NAME.mpk-tmp-PID-SEQ` is used instead (SEQ counts this process's writes, so two
//! threads writing one output never share a temporary name); SIGINT, SIGTERM and SIGHUP remove
//! it, and every later write into the same folder removes those left by processes that no longer
//! exist.
//!
//! [`refuse_inputs`] is the other half of "never destroy an input": an output that is an input
//! (same device and inode, through any spelling, symlink or hard link) or a folder is refused
//! before any work is done.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::BufWriter;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// The marker in every named temporary file this module makes: `.NAME` + it + `PID-SEQ`.
const TEMP_MARK: &str = ".mpk-tmp-";

/// How many writes in progress at once the signal handler can clean up after (one slot each;
/// a write that finds none free goes on, its temporary file then left to
/// [`remove_stale_temps`]).
const PENDING_SLOTS: usize = 16;

/// The named temporary files being written, each a leaked C string, for the signal handler.
static PENDING: [AtomicPtr<libc::c_char>; PENDING_SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; PENDING_SLOTS];
static HANDLERS: AtomicBool = AtomicBool::new(false);
/// Numbers this process's temporary names (the `SEQ` of `.NAME.mpk-tmp-PID-SEQ`).
static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

extern "C" fn remove_pending_and_reraise(sig: libc::c_int) {
    for slot in &PENDING {
        let p = slot.swap(std::ptr::null_mut(), Ordering::SeqCst);
        // SAFETY: unlink is async-signal-safe; `p` is null or a NUL-terminated path leaked by
        // `register_pending` and never freed while registered.
        unsafe {
            if !p.is_null() {
                libc::unlink(p);
            }
        }
    }
    // SAFETY: signal and raise are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Make SIGINT, SIGTERM and SIGHUP remove the named temporary file of the write in progress
/// before the process dies (the CLI calls this; a library user keeps its own signal policy).
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

/// Refuse to write `out` when it is a folder or the same file as any of `inputs` (compared by
/// device and inode, so `./x`, `../dir/x`, an absolute path, a symlink and a hard link are all
/// caught), or when its folder does not exist. Inputs that do not exist are ignored.
pub fn refuse_inputs(out: &Path, inputs: &[PathBuf]) -> Result<()> {
    let file = out.display().to_string();
    let bad = |reason: String| Error::Output {
        file: file.clone(),
        reason,
    };
    if let Ok(m) = std::fs::metadata(out) {
        if m.is_dir() {
            return Err(bad("is a folder; name the output file".into()));
        }
        for inp in inputs {
            if let Ok(i) = std::fs::metadata(inp)
                && (i.dev(), i.ino()) == (m.dev(), m.ino())
            {
                return Err(bad(format!(
                    "is the input {} (same file); writing it would destroy the input",
                    inp.display()
                )));
            }
        }
    }
    let dir = parent_dir(out);
    if !dir.is_dir() {
        return Err(bad(format!("folder {} does not exist", dir.display())));
    }
    Ok(())
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Write `path` through `fill`; the file appears at `path` only if `fill` succeeds and the data
/// reached the disk.
///
/// `fill`'s error type is the caller's (the library's [`Error`](crate::Error), or the binary's
/// `anyhow::Error`); this function's own failures are [`Error::Output`](crate::Error::Output) and
/// [`Error::Write`](crate::Error::Write) converted into it.
pub fn write_atomic<E>(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<(), E>,
) -> Result<(), E>
where
    E: From<crate::Error>,
{
    write_atomic_checked(path, fill, |_| Ok(()))
}

/// [`write_atomic`], with `check` run on the finished, fsynced file (given its temporary path)
/// before it is renamed over `path`: a file that fails the check never replaces what `path`
/// held. A replaced file's permission bits are kept.
pub fn write_atomic_checked<E>(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> Result<(), E>,
    check: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E>
where
    E: From<crate::Error>,
{
    let dir = parent_dir(path);
    // Every error names the output the user gave, never the temporary file.
    let failed = |_: &Path, step: &'static str, err: std::io::Error| {
        E::from(crate::Error::Write {
            file: path.display().to_string(),
            step,
            err,
        })
    };
    let old_mode = std::fs::metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.permissions());
    if path.is_dir() {
        return Err(E::from(crate::Error::Output {
            file: path.display().to_string(),
            reason: "is a folder; name the output file".into(),
        }));
    }
    remove_stale_temps(&dir);
    let tmp = temp_path(path);
    // An unnamed file first: nothing to leave behind if the process is killed.
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o666)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(&dir);
    let mut slot = None;
    let (f, named) = match unnamed {
        Ok(f) => (f, false),
        Err(_) => {
            slot = register_pending(&tmp);
            // create_new: a name this call made, never another writer's file.
            match File::options().write(true).create_new(true).open(&tmp) {
                Ok(f) => (f, true),
                Err(e) => {
                    unregister_pending(slot);
                    return Err(failed(&tmp, "creating a temporary file in its folder", e));
                }
            }
        }
    };
    let result = (|| -> Result<(), E> {
        let mut w = BufWriter::with_capacity(1 << 20, f);
        fill(&mut w)?;
        let f = w.into_inner().map_err(|e| {
            let err = std::io::Error::new(e.error().kind(), e.error().to_string());
            failed(&tmp, "write", err)
        })?;
        if let Some(mode) = &old_mode {
            f.set_permissions(mode.clone())
                .map_err(|e| failed(path, "keeping the replaced file's mode", e))?;
        }
        f.sync_all().map_err(|e| failed(path, "fsync", e))?;
        if !named {
            slot = register_pending(&tmp);
            link_unnamed(&f, &tmp).map_err(|e| failed(&tmp, "naming the finished file", e))?;
        }
        drop(f);
        check(&tmp)?;
        std::fs::rename(&tmp, path).map_err(|e| failed(path, "rename", e))?;
        // Persist the rename itself; not all filesystems allow fsync on a directory.
        let _ = File::open(&dir).and_then(|d| d.sync_all());
        Ok(())
    })();
    unregister_pending(slot);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Give the finished unnamed file `f` the name `tmp` (through `/proc/self/fd`, which needs no
/// privilege; `AT_EMPTY_PATH` where /proc is not mounted).
fn link_unnamed(f: &File, tmp: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let to = std::ffi::CString::new(tmp.as_os_str().as_bytes())?;
    let proc_path = std::ffi::CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))?;
    // SAFETY: FFI with two valid NUL-terminated paths; linkat reads them and touches no memory
    // of ours.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            proc_path.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let empty = c"";
    // SAFETY: FFI; `f` is an open descriptor, `empty` and `to` are valid NUL-terminated strings.
    let r = unsafe {
        libc::linkat(
            f.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Register `tmp` for the signal handler; the slot it took, if any was free.
fn register_pending(tmp: &Path) -> Option<usize> {
    if !HANDLERS.load(Ordering::SeqCst) {
        return None;
    }
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(tmp.as_os_str().as_bytes()).ok()?;
    let raw = c.into_raw();
    for (i, slot) in PENDING.iter().enumerate() {
        if slot
            .compare_exchange(
                std::ptr::null_mut(),
                raw,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            return Some(i);
        }
    }
    // SAFETY: `raw` came from CString::into_raw above and was never registered.
    drop(unsafe { std::ffi::CString::from_raw(raw) });
    None
}

fn unregister_pending(slot: Option<usize>) {
    let Some(i) = slot else { return };
    let p = PENDING[i].swap(std::ptr::null_mut(), Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: `p` came from CString::into_raw in register_pending; the swap took it from the
        // handler, which can no longer reach it.
        drop(unsafe { std::ffi::CString::from_raw(p) });
    }
}

/// Remove, in `dir`, the named temporary files (`.NAME.mpk-tmp-PID-SEQ`, or `-PID` as earlier
/// versions named them) of processes that no longer exist: what a killed write left behind.
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let Some(pid) = name
            .starts_with('.')
            .then(|| name.rsplit_once(TEMP_MARK))
            .flatten()
            .and_then(|(_, tail)| tail.split('-').next()?.parse::<i32>().ok())
        else {
            continue;
        };
        if pid > 0 && !process_alive(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks whether the process exists; it sends nothing.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The longest file name the folders we write into take (Linux `NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// `DIR/.NAME.mpk-tmp-PID-SEQ` beside `path`, SEQ new at each call (two writers of one output
/// in one process, on two threads, never share a name); where that name would pass
/// [`NAME_MAX`] bytes, `DIR/.HASH.mpk-tmp-PID-SEQ` (HASH: 16 hex digits of the name's xxh3).
pub fn temp_path(path: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "out".into());
    let pid = std::process::id();
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let long = format!(".{name}{TEMP_MARK}{pid}-{seq}");
    if long.len() <= NAME_MAX {
        return path.with_file_name(long);
    }
    let raw = path.file_name().map(|n| n.as_bytes()).unwrap_or(b"out");
    let h = xxhash_rust::xxh3::xxh3_64(raw);
    path.with_file_name(format!(".{h:016x}{TEMP_MARK}{pid}-{seq}"))
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
        write_atomic(&out, |w| -> anyhow::Result<()> {
            Ok(w.write_all(b"done")?)
        })
        .unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"done");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn long_names_fit_a_failed_check_keeps_the_old_file_and_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join(format!("{}.gguf", "n".repeat(250)));
        assert!(temp_path(&out).file_name().unwrap().len() <= NAME_MAX);
        write_atomic(&out, |w| -> anyhow::Result<()> { Ok(w.write_all(b"v1")?) }).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
        let r = write_atomic_checked(
            &out,
            |w| -> anyhow::Result<()> { Ok(w.write_all(b"bad")?) },
            |tmp| {
                assert_eq!(std::fs::read(tmp)?, b"bad");
                anyhow::bail!("the finished file is unreadable")
            },
        );
        assert!(r.is_err());
        assert_eq!(std::fs::read(&out).unwrap(), b"v1");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        write_atomic(&out, |w| -> anyhow::Result<()> { Ok(w.write_all(b"v2")?) }).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"v2");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
    }

    #[test]
    fn stale_temps_of_dead_processes_are_removed_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        // A pid far above any pid_max in use is dead; our own pid is alive.
        let dead = dir.path().join(format!(".a.gguf{TEMP_MARK}2147483646"));
        let live = dir
            .path()
            .join(format!(".b.gguf{TEMP_MARK}{}", std::process::id()));
        let other = dir.path().join(".c.tmp-1");
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        write_atomic(&dir.path().join("z.bin"), |w| -> anyhow::Result<()> {
            Ok(w.write_all(b"z")?)
        })
        .unwrap();
        assert!(!dead.exists());
        assert!(live.exists());
        assert!(other.exists(), "files not ours are never touched");
    }

    #[test]
    fn outputs_that_are_inputs_or_folders_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.gguf");
        std::fs::write(&input, b"model").unwrap();
        let link = dir.path().join("link.gguf");
        std::os::unix::fs::symlink(&input, &link).unwrap();
        let hard = dir.path().join("hard.gguf");
        std::fs::hard_link(&input, &hard).unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let ins = [input.clone()];
        for out in [input.clone(), sub.join("..").join("in.gguf"), link, hard] {
            let e = refuse_inputs(&out, &ins).unwrap_err().to_string();
            assert!(e.contains("same file"), "{e}");
        }
        let e = refuse_inputs(&sub, &ins).unwrap_err().to_string();
        assert!(e.contains("folder"), "{e}");
        let e = refuse_inputs(&dir.path().join("no/such/x"), &ins)
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        refuse_inputs(&dir.path().join("new.gguf"), &ins).unwrap();
        assert_eq!(std::fs::read(&input).unwrap(), b"model");
    }
}
