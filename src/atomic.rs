//! Crash-safe output files: write to a temporary file beside the target, fsync, rename. An
//! interrupted or failed write leaves no file at the target path (and removes its temporary).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

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
