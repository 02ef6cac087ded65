//! One tensor of a checkpoint or a pack as values: what `metrale-pack dump` writes and the
//! Python package's `tensor()` returns. A pack's FFN blob decodes through its layout (padding
//! removed); a quantized source weight with its scales applied; any other tensor through its
//! type; with `raw`, the stored bytes.

use crate::error::{Error, Result};
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
pub fn dump_tensor(path: impl AsRef<Path>, name: &str, raw: bool) -> Result<Dumped> {
    let path = path.as_ref();
    Opened::open(path)?.dump(name, raw)
}

/// A checkpoint or pack opened once: every tensor [`Opened::dump`] gives comes from the files
/// opened here, however the path changes afterwards (a pack replaced by a new convert is not
/// read half from each file). The Python package's `Pack` holds one.
pub struct Opened {
    /// The file as a checkpoint (its tensors by name, decoded through their types).
    pub model: Model,
    /// The file as a pack, when it is one: validated, or why not (a `raw` dump of a pack
    /// whose manifest fails its checks still reads its bytes).
    pub pack: Option<std::result::Result<super::Pack, Error>>,
}

impl Opened {
    /// Open `path` as a checkpoint and, when it is a pack, as a pack, both through the same
    /// file (checked by device and inode).
    pub fn open(path: impl AsRef<Path>) -> Result<Opened> {
        let path = path.as_ref();
        let model = Model::open(path)?;
        let pack = match &model.files[0] {
            model::SourceFile::Gguf(g) if super::is_pack(g) => {
                let file = crate::gguf::GgufFile::open(&g.path)?;
                if !same_file(&file.file, &g.file) {
                    return Err(Error::Changed {
                        file: g.path.display().to_string(),
                        reason: "replaced while it was opened; open it again".into(),
                    });
                }
                Some(super::Pack::from_gguf(file))
            }
            _ => None,
        };
        Ok(Opened { model, pack })
    }

    /// The file as a validated pack, or why it is not one.
    pub fn pack(&self) -> Result<&super::Pack> {
        let file = self.model.path.display().to_string();
        match &self.pack {
            Some(Ok(p)) => Ok(p),
            Some(Err(e)) => {
                // The same error again (it names the file already).
                let msg = e.to_string();
                let reason = msg.strip_prefix(&format!("{file}: ")).unwrap_or(&msg);
                Err(Error::Unsupported {
                    reason: reason.to_string(),
                    file,
                })
            }
            None => Err(Error::Unsupported {
                file,
                reason: "not a metrale pack (no metrale.pack.format_version)".into(),
            }),
        }
    }

    /// Tensor `name`, decoded (or, with `raw`, as stored).
    pub fn dump(&self, name: &str, raw: bool) -> Result<Dumped> {
        let m = &self.model;
        if self.pack.is_some()
            && !raw
            && m.tensor(name)
                .map(|i| m.tensors[i].name.starts_with("blk.") && pack_blob(m, i))
                .unwrap_or(true)
        {
            let (values, shape) = self.pack()?.decode_ffn(name)?;
            return Ok(Dumped::F32 {
                values,
                shape: shape.iter().map(|&d| d as usize).collect(),
                layout: true,
            });
        }
        dump_model_tensor(m, name, raw)
    }
}

/// Whether two open files are one (same device and inode).
fn same_file(a: &std::fs::File, b: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Tensor `name` of `m` through its type (not a pack layout).
fn dump_model_tensor(m: &Model, name: &str, raw: bool) -> Result<Dumped> {
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
