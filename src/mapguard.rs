//! Memory-mapped inputs that another process truncates while we read them.
//!
//! Reading a mapped page past a file's new end raises SIGBUS, which would kill the process with
//! no message. Every map this crate makes of an input is registered here. A SIGBUS inside a
//! registered map is answered by mapping one zero page over the faulting page (the read then
//! sees zeros) and recording where it happened; [`Guard::fault`] then reports it, and the
//! callers that read a source (`convert`, `verify --source`, `dump`) ask before they finish, so
//! the result is an error naming the file and the byte range that was lost, never a half-read
//! output. A SIGBUS anywhere else goes to the action the process had before (the default, or an
//! engine's own handler), restored for the re-run of the faulting access.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Maps registered at once; past this, a map is read unguarded (as before this module).
pub const MAX_GUARDED_MAPS: usize = 1024;
const PAGE: usize = 4096;

/// Per slot: start address (0: free), length, and first faulting offset + 1 (0: none).
static START: [AtomicUsize; MAX_GUARDED_MAPS] = [const { AtomicUsize::new(0) }; MAX_GUARDED_MAPS];
static LEN: [AtomicUsize; MAX_GUARDED_MAPS] = [const { AtomicUsize::new(0) }; MAX_GUARDED_MAPS];
static FAULT: [AtomicUsize; MAX_GUARDED_MAPS] = [const { AtomicUsize::new(0) }; MAX_GUARDED_MAPS];
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The SIGBUS action this process had before ours: a fault outside our maps is handed back to it.
static PREVIOUS: std::sync::OnceLock<libc::sigaction> = std::sync::OnceLock::new();

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is the
    // faulting address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    for i in 0..MAX_GUARDED_MAPS {
        let start = START[i].load(Ordering::Acquire);
        let len = LEN[i].load(Ordering::Acquire);
        if start == 0 || start == usize::MAX || addr.wrapping_sub(start) >= len {
            continue;
        }
        let page = addr & !(PAGE - 1);
        // SAFETY: mmap is a plain system call (safe in a handler); MAP_FIXED replaces exactly
        // one page of a read-only file mapping this process owns (it lies in a registered map),
        // so no Rust reference sees memory vanish: the page reads as zeros from now on.
        let r = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                PAGE,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            let _ = FAULT[i].compare_exchange(
                0,
                page.max(start) - start + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return;
        }
        break;
    }
    // Not ours (or the page could not be replaced): the action the process had before ours
    // (the default: death) takes the fault when the access re-runs on return.
    // SAFETY: sigaction and signal are async-signal-safe; PREVIOUS was set before the handler
    // was installed and is never written again, so reading it here races with nothing.
    unsafe {
        match PREVIOUS.get() {
            Some(old) => {
                libc::sigaction(sig, old, std::ptr::null_mut());
            }
            None => {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

fn install() {
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    // SAFETY: installing a handler whose body only reads atomics and calls mmap/sigaction;
    // sigaction is given zeroed, then filled, structs; the previous action is kept first.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) == 0 {
            let _ = PREVIOUS.set(old);
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

/// A registered map; the registration ends when it is dropped.
#[derive(Debug)]
pub struct Guard {
    slot: Option<usize>,
}

impl Guard {
    /// Register `map` (start and length of a mapping of an input file).
    pub fn register(map: &[u8]) -> Guard {
        if map.is_empty() {
            return Guard { slot: None };
        }
        install();
        let start = map.as_ptr() as usize;
        for i in 0..MAX_GUARDED_MAPS {
            if START[i]
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                FAULT[i].store(0, Ordering::Release);
                LEN[i].store(map.len(), Ordering::Release);
                START[i].store(start, Ordering::Release);
                return Guard { slot: Some(i) };
            }
        }
        Guard { slot: None }
    }

    /// The offset of the first page that could not be read because the file shrank, if any.
    pub fn fault(&self) -> Option<u64> {
        let f = FAULT[self.slot?].load(Ordering::Acquire);
        (f > 0).then(|| (f - 1) as u64)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            START[i].store(0, Ordering::Release);
        }
    }
}

/// An error if the file `path` (open as `file`, mapped with `mapped` bytes under `guard`)
/// changed size or faulted since it was mapped: the file and the byte range that was lost. The
/// size is the open file's own (fstat), not the path's: a path renamed over by a new file
/// leaves the mapped one whole, and what was read from it is what it held.
pub fn check(
    path: &std::path::Path,
    file: &std::fs::File,
    mapped: u64,
    guard: &Guard,
) -> crate::Result<()> {
    let now = file.metadata().map(|m| m.len()).ok();
    let fault = guard.fault();
    if fault.is_none() && now == Some(mapped) {
        return Ok(());
    }
    let lost_from = match (fault, now) {
        (Some(f), Some(n)) => f.min(n),
        (Some(f), None) => f,
        (None, Some(n)) => n.min(mapped),
        (None, None) => 0,
    };
    Err(crate::Error::Changed {
        file: path.display().to_string(),
        reason: match now {
            Some(n) => format!(
                "the file changed while it was read: it was {mapped} bytes, it is now {n}; bytes {lost_from}..{mapped} {}",
                if fault.is_some() {
                    "could not be read"
                } else {
                    "may differ from what was read"
                }
            ),
            None => format!(
                "the file was removed or replaced while it was read ({mapped} bytes mapped; bytes from {lost_from} could not be read)"
            ),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x.bin` in `dir` of `pages` pages of 7s, opened, mapped and registered.
    fn mapped(
        dir: &std::path::Path,
        pages: usize,
    ) -> (std::path::PathBuf, std::fs::File, memmap2::Mmap, Guard) {
        let p = dir.join("x.bin");
        std::fs::write(&p, vec![7u8; pages * PAGE]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: a read-only map of a file the test owns; a test truncates it on purpose.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let g = Guard::register(&map);
        (p, f, map, g)
    }

    #[test]
    fn a_truncated_map_reads_zeros_and_reports_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let (p, f, map, g) = mapped(dir.path(), 5);
        check(&p, &f, map.len() as u64, &g).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(2 * PAGE as u64)
            .unwrap();
        let sum: u64 = map.iter().map(|&b| b as u64).sum();
        assert_eq!(sum, 7 * 2 * PAGE as u64, "pages past the end read as zeros");
        assert_eq!(g.fault(), Some(2 * PAGE as u64));
        let e = check(&p, &f, map.len() as u64, &g).unwrap_err().to_string();
        assert!(e.contains("x.bin") && e.contains("8192..20480"), "{e}");
    }

    #[test]
    fn a_path_renamed_over_leaves_the_mapped_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (p, f, map, g) = mapped(dir.path(), 3);
        let q = dir.path().join("y.bin");
        std::fs::write(&q, vec![1u8; PAGE]).unwrap();
        std::fs::rename(&q, &p).unwrap();
        // The map still holds the old file's bytes, every one: nothing was lost.
        assert!(map.iter().all(|&b| b == 7));
        check(&p, &f, map.len() as u64, &g).unwrap();
    }
}
