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
        check.mismatched.push(format!(
            "(the source yields {} tensors, the pack holds {})",
            check.checked,
            pack.manifest.tensors.len()
        ));
    }
    Ok(check)
}
