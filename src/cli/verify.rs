//! `metrale-pack verify`: every checksum and padding byte of a pack, and with `--source` every
//! tensor re-derived from the checkpoint; as text, or as one JSON object (`report::Verified`).

use super::report;
use anyhow::Result;
use metrale_pack::model::Model;
use metrale_pack::pack::{self, Pack};
use std::path::Path;

pub(crate) fn verify(path: &Path, source: Option<&Path>, json: bool, quiet: bool) -> Result<()> {
    let p = Pack::open(path)?;
    let mut r = report::Verified {
        pack: path.display().to_string(),
        tensors: p.manifest.tensors.len(),
        checksum_mismatches: p.verify_checksums()?,
        nonzero_padding: metrale_pack::pack_check::nonzero_padding(&p.file)?,
        source: None,
        ok: false,
    };
    let checksums_ok = r.checksum_mismatches.is_empty() && r.nonzero_padding.is_empty();
    if !json {
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
    }
    // The source is re-derived only from a pack whose own bytes are intact.
    if let (Some(src), true) = (source, checksums_ok) {
        let m = Model::open(src)?;
        let c = pack::verify_against_source(&p, &m)?;
        if !json {
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
        r.source = Some(report::SourceReport {
            file: src.display().to_string(),
            checked: c.checked,
            mismatched: c.mismatched,
            other_source: c.other_source,
        });
    }
    r.ok = checksums_ok && r.source.as_ref().is_none_or(|s| s.mismatched.is_empty());
    if json {
        println!("{}", serde_json::to_string(&r)?);
        anyhow::ensure!(
            r.ok,
            "{}: verification failed (the JSON report lists what)",
            path.display()
        );
    }
    Ok(())
}
