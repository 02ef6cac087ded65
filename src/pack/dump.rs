//! One tensor of a checkpoint or a pack as values: what `metrale-pack dump` writes and the
//! Python package's `tensor()` returns. A pack's FFN blob decodes through its layout (padding
//! removed); a quantized source weight with its scales applied; any other tensor through its
//! type; with `raw`, the stored bytes.

use crate::error::Result;
use crate::model::{self, Format, Model};
use std::path::Path;

/// A tensor's values.
#[derive(Clone, Debug, PartialEq)]
pub enum Dumped {
    /// Decoded to f32, row-major in `shape`. `layout`: decoded through a pack layout.
    F32 {
        /// The values.
        values: Vec<f32>,
        /// Their shape (outermost first).
        shape: Vec<usize>,
        /// Whether a pack layout decoded them.
        layout: bool,
    },
    /// The stored bytes.
    Raw(Vec<u8>),
}

/// Tensor `name` of the checkpoint or pack at `path`, decoded (or, with `raw`, as stored).
pub fn dump_tensor(path: &Path, name: &str, raw: bool) -> Result<Dumped> {
    let m = Model::open(path)?;
    if let model::SourceFile::Gguf(g) = &m.files[0]
        && super::is_pack(g)
        && !raw
        && m.tensor(name)
            .map(|i| m.tensors[i].name.starts_with("blk.") && pack_blob(&m, i))
            .unwrap_or(true)
    {
        let p = super::Pack::from_gguf(crate::gguf::GgufFile::open(path)?)?;
        let (values, shape) = p.decode_ffn(name)?;
        return Ok(Dumped::F32 {
            values,
            shape: shape.iter().map(|&d| d as usize).collect(),
            layout: true,
        });
    }
    let i = m.tensor(name)?;
    if raw {
        let data = m.data(i).to_vec();
        m.check_intact()?;
        return Ok(Dumped::Raw(data));
    }
    // A quantized weight, or a plain FFN weight (checked like one: an integer weight without
    // its scale is refused rather than dumped as raw codes).
    let as_weight = m
        .quantized_weight_named(name)
        .or_else(|| m.ffn_weight_named(name).cloned());
    let (values, shape): (Vec<f32>, Vec<usize>) = match as_weight {
        Some(w) if m.format == Format::Safetensors => {
            let (v, s) = m.decode_weight(&w)?;
            (v, s.iter().map(|&d| d as usize).collect())
        }
        _ => (
            m.decode_tensor(i)?,
            m.tensors[i].shape.iter().map(|&d| d as usize).collect(),
        ),
    };
    m.check_intact()?;
    Ok(Dumped::F32 {
        values,
        shape,
        layout: false,
    })
}

/// Whether pack tensor `i` is an FFN blob (an I8 tensor named `blk.N.ffn_*.<layout>...`).
fn pack_blob(m: &Model, i: usize) -> bool {
    let t = &m.tensors[i];
    t.dtype == model::DType::Ggml(crate::GgmlType::I8) && t.name.contains(".ffn_")
}
