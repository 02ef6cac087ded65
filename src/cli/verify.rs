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
    anyhow::ensure!(
        r.blob_rules.is_empty(),
        "{} FFN blobs break their layout's rules (the loader refuses the pack): {}",
        r.blob_rules.len(),
        r.blob_rules.join("; ")
    );
    if !quiet {
        eprintln!(
            "{}: {} tensors, checksums ok, every FFN blob within its layout's rules",
            path.display(),
            r.tensors
        );
    }
    if let (Some(src), Some(s)) = (source, &r.source) {
        let c = pack::SourceCheck {
            checked: s.checked,
            mismatched: s.mismatched.clone(),
            count_differs: s.count_differs.clone(),
            other_source: s.other_source.clone(),
        };
        anyhow::ensure!(
            c.passed(),
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
