//! What `convert --json` and `verify --json` print on stdout: one JSON object each, with the
//! field names below (pinned by `tests/cli_json.rs`; documented in the README).

use metrale_pack::pack::Fidelity;
use serde::Serialize;

/// `convert --json`.
#[derive(Serialize)]
pub struct Converted<'a> {
    /// The pack written.
    pub output: String,
    /// Its size.
    pub bytes: u64,
    /// Its tensors (device and host, FFN blobs included).
    pub tensors: usize,
    /// Dense FFN layers repacked.
    pub ffn_layers: usize,
    /// Mixture-of-experts layers passed through.
    pub moe_layers: &'a [usize],
    /// The layouts, by tag.
    pub layouts: &'a [String],
    /// Wall time of the conversion.
    pub seconds: f64,
    /// The source bytes read.
    pub source_bytes: u64,
    /// Per layout and projection: mean and worst relative error against the source's weights.
    pub fidelity: &'a [Fidelity],
    /// The warning lines also printed on stderr (far layouts, sets that cannot decode).
    pub warnings: Vec<String>,
}

/// `verify --json`: every check run, failed or not (the exit status is 1 when any failed).
#[derive(Serialize)]
pub struct Verified {
    /// The pack checked.
    pub pack: String,
    /// Its tensors.
    pub tensors: usize,
    /// Tensors whose bytes do not hash to the manifest's xxh3-64.
    pub checksum_mismatches: Vec<String>,
    /// Tensors followed by non-zero padding.
    pub nonzero_padding: Vec<String>,
    /// With `--source`: every tensor re-derived from the source.
    pub source: Option<SourceReport>,
    /// Whether every check passed.
    pub ok: bool,
}

/// `verify --source` in `verify --json`.
#[derive(Serialize)]
pub struct SourceReport {
    /// The source given.
    pub file: String,
    /// Tensors re-derived and compared.
    pub checked: usize,
    /// Those that differ.
    pub mismatched: Vec<String>,
    /// When some differ and the source is not the file the pack records: how.
    pub other_source: Option<String>,
}
