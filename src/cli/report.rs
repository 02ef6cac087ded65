//! What `convert --json` prints on stdout: one JSON object, with the field names below (pinned
//! by `tests/cli_json.rs`; documented in docs/cli.md). `verify --json` prints `pack::Verified`.

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
