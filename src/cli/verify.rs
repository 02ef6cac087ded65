//! `metrale-pack verify`: every checksum and padding byte of a pack, and with `--source` every
//! tensor re-derived from the checkpoint; as text, or as one JSON object (`pack::Verified`).

use anyhow::Result;
use metrale_pack::pack::{self, Pack};
use std::path::Path;

pub(crate) fn verify(path: &Path, source: Option<&Path>, json: bool, quiet: bool) -> Result<()> {
    let p = Pack::open(path)?;
    let r = pack::verify_report(&p, path, source)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
        anyhow::ensure!(
            r.ok,
            "{}: verification failed (the JSON report lists what)",
            path.display()
        );
        return Ok(());
    }
    anyhow::ensure!(
        r.checksum_mismatches.is_empty(),
        "{}: checksum mismatch in {} tensors: {}",
        path.display(),
        r.checksum_mismatches.len(),
        r.checksum_mismatches.join(", ")
    );
    anyhow::ensure!(
        r.nonzero_padding.is_empty(),
        "{}: non-zero padding after {} tensors: {}",
        path.display(),
        r.nonzero_padding.len(),
        r.nonzero_padding.join(", ")
    );
    if !quiet {
        eprintln!("{}: {} tensors, checksums ok", path.display(), r.tensors);
    }
    if let (Some(src), Some(s)) = (source, &r.source) {
        let c = pack::SourceCheck {
            checked: s.checked,
            mismatched: s.mismatched.clone(),
            other_source: s.other_source.clone(),
        };
        anyhow::ensure!(
            c.mismatched.is_empty(),
            "{}: {}",
            path.display(),
            c.summary(&src.display().to_string())
        );
        if !quiet {
            eprintln!(
                "{}: all {} tensors re-derived from {} bit for bit",
                path.display(),
                c.checked,
                src.display()
            );
        }
    }
    Ok(())
}
