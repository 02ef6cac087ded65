//! `verify --source`: re-derive every tensor from the source and compare.

use super::*;
use crate::error::Result;
use crate::model::Model;

/// Outcome of `verify --source`.
#[derive(Debug, Default)]
pub struct SourceCheck {
    /// Blobs checked.
    pub checked: usize,
    /// Blobs that differ, by name.
    pub mismatched: Vec<String>,
    /// When the source yields another number of tensors than the pack holds: both counts.
    pub count_differs: Option<String>,
    /// When some differ and the source's files are not the ones the pack records (name, size,
    /// xxh3-64): how (hashed only after a mismatch: a passing check reads the source once).
    pub other_source: Option<String>,
}

impl SourceCheck {
    /// Whether every tensor matched and the counts agree.
    pub fn passed(&self) -> bool {
        self.mismatched.is_empty() && self.count_differs.is_none()
    }

    /// One line for a failed check: the count, the first few names and, when the source is not
    /// the file the pack was converted from, which file it was.
    pub fn summary(&self, source: &str) -> String {
        const NAMES: usize = 8;
        let mut names = self.mismatched[..self.mismatched.len().min(NAMES)].join(", ");
        if self.mismatched.len() > NAMES {
            names += &format!(" and {} more", self.mismatched.len() - NAMES);
        }
        let mut s = format!(
            "{} of {} tensors differ from what {source} gives: {names}",
            self.mismatched.len(),
            self.checked
        );
        if let Some(c) = &self.count_differs {
            s += &format!("; {c}");
        }
        if let Some(o) = &self.other_source {
            s += &format!("; {o}");
        }
        s
    }
}

/// Whether `source`'s files are those `pack` was converted from (name, size, xxh3-64 as the
/// manifest records them): `None` when they are, else how they differ.
pub fn other_source(pack: &Pack, source: &Model) -> Option<String> {
    let want = &pack.manifest.sources;
    let got = super::write::source_identity(source);
    if want.is_empty() || *want == got {
        return None;
    }
    let show = |v: &[SourceInfo]| {
        v.iter()
            .map(|s| format!("{} ({} bytes, xxh3 {})", s.name, s.bytes, s.xxh3))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(format!(
        "the pack was converted from {}, and this source is {}",
        show(want),
        show(&got)
    ))
}

/// Re-derive every tensor of `pack` from `source` with the pack's recorded options and compare
/// bit for bit.
pub fn verify_against_source(pack: &Pack, source: &Model) -> Result<SourceCheck> {
    let plan = Plan::new(source, &pack.manifest.options)?;
    let mut check = SourceCheck::default();
    let mut i = 0;
    plan.produce(|name, bytes, entry| {
        check.checked += 1;
        // The bytes and every manifest field that says how to read them (shape, padding,
        // scalars, source type) must be what the source gives.
        match pack.index(name) {
            Some(j)
                if j == i
                    && pack.read(j)? == bytes
                    && pack.manifest.tensors[j].ffn == entry.ffn
                    && pack.manifest.tensors[j].tp == entry.tp
                    && pack.manifest.tensors[j].source_shape == entry.source_shape
                    && pack.manifest.tensors[j].source_type == entry.source_type => {}
            _ => check.mismatched.push(name.to_string()),
        }
        i += 1;
        Ok(())
    })?;
    // A source that shrank while it was read compared zeros: an error, not a verdict.
    source.check_intact()?;
    if check.checked != pack.manifest.tensors.len() {
        check.count_differs = Some(format!(
            "the source yields {} tensors, the pack holds {}",
            check.checked,
            pack.manifest.tensors.len()
        ));
    }
    if !check.passed() {
        check.other_source = other_source(pack, source);
    }
    Ok(check)
}

/// Every check of a pack, failed or not: what `verify --json` prints and the Python package's
/// `Pack.verify` returns (field names pinned by `tests/cli_json.rs`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Verified {
    /// The pack checked.
    pub pack: String,
    /// Its tensors.
    pub tensors: usize,
    /// Tensors whose bytes do not hash to the manifest's xxh3-64.
    pub checksum_mismatches: Vec<String>,
    /// Tensors followed by non-zero padding.
    pub nonzero_padding: Vec<String>,
    /// FFN blobs that break their layout's own rules (`LayoutSpec::check_blob`: a
    /// permutation that is none, a scale not finite, a zero point out of range), each with
    /// why: what the loader refuses.
    pub blob_rules: Vec<String>,
    /// With a source: every tensor re-derived from it.
    pub source: Option<SourceReport>,
    /// Whether every check passed.
    pub ok: bool,
}

/// The source part of [`Verified`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct SourceReport {
    /// The source given.
    pub file: String,
    /// Tensors re-derived and compared.
    pub checked: usize,
    /// Those that differ.
    pub mismatched: Vec<String>,
    /// When the source yields another number of tensors than the pack holds: both counts.
    pub count_differs: Option<String>,
    /// When some differ and the source is not the file the pack records: how.
    pub other_source: Option<String>,
}

/// Check the pack `p` (read from `path`): every checksum and padding byte, every FFN blob
/// against its layout's rules, and with `source`
/// every tensor re-derived from that checkpoint (only when the pack's own bytes are intact).
pub fn verify_report(
    p: &Pack,
    path: &std::path::Path,
    source: Option<&std::path::Path>,
) -> Result<Verified> {
    let mut r = Verified {
        pack: path.display().to_string(),
        tensors: p.manifest.tensors.len(),
        checksum_mismatches: p.verify_checksums()?,
        nonzero_padding: nonzero_padding(&p.file)?,
        blob_rules: p.blob_rule_violations(),
        source: None,
        ok: false,
    };
    let intact =
        r.checksum_mismatches.is_empty() && r.nonzero_padding.is_empty() && r.blob_rules.is_empty();
    if let (Some(src), true) = (source, intact) {
        let c = verify_against_source(p, &Model::open(src)?)?;
        r.source = Some(SourceReport {
            file: src.display().to_string(),
            checked: c.checked,
            mismatched: c.mismatched,
            count_differs: c.count_differs,
            other_source: c.other_source,
        });
    }
    r.ok = intact
        && r.source
            .as_ref()
            .is_none_or(|s| s.mismatched.is_empty() && s.count_differs.is_none());
    Ok(r)
}
