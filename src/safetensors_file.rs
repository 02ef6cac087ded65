//! safetensors reader: the `safetensors` crate validates the header (size limit, dtypes,
//! contiguous offsets, no trailing bytes) over a memory map; this module adds the file name to
//! every error and records absolute offsets, in file order, plus sharded checkpoints through
//! `model.safetensors.index.json`.

use crate::error::{Error, Result};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One tensor of a safetensors file.
#[derive(Clone, Debug)]
pub struct StTensor {
    /// The tensor's name.
    pub name: String,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Absolute offset in the file.
    pub file_offset: u64,
    /// Its data bytes.
    pub bytes: u64,
}

/// An opened, validated safetensors file.
pub struct StFile {
    /// The path opened.
    pub path: PathBuf,
    /// The read-only mapping.
    pub map: Mmap,
    /// Tensors in data order.
    pub tensors: Vec<StTensor>,
    /// The `__metadata__` map.
    pub metadata: HashMap<String, String>,
    /// The map's registration against SIGBUS (`crate::mapguard`).
    pub guard: crate::mapguard::Guard,
    /// The open file the map was made from (its size is checked against the map's).
    pub file: std::fs::File,
}

impl StFile {
    /// Map and validate one `.safetensors` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let (opened, map, file, guard) = crate::gguf::map_file(path)?;
        let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| Error::Safetensors {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        let base = 8 + n as u64;
        let infos = meta.tensors();
        let mut tensors: Vec<StTensor> = meta
            .offset_keys()
            .into_iter()
            .map(|name| {
                let info = infos[&name];
                StTensor {
                    name,
                    dtype: info.dtype,
                    shape: info.shape.iter().map(|&d| d as u64).collect(),
                    file_offset: base + info.data_offsets.0 as u64,
                    bytes: (info.data_offsets.1 - info.data_offsets.0) as u64,
                }
            })
            .collect();
        tensors.sort_by_key(|t| t.file_offset);
        let metadata = meta.metadata().clone().unwrap_or_default();
        Ok(StFile {
            path: path.to_path_buf(),
            map,
            tensors,
            metadata,
            guard,
            file: opened,
        })
    }

    /// The bytes of tensor `i`.
    pub fn tensor_data(&self, i: usize) -> &[u8] {
        let t = &self.tensors[i];
        &self.map[t.file_offset as usize..(t.file_offset + t.bytes) as usize]
    }
}

/// Read and parse a JSON side file (`config.json`, `*.index.json`, `adapter_config.json`, ...),
/// naming the file in every error.
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let file = path.display().to_string();
    crate::gguf::require_regular(path)?;
    let text = std::fs::read_to_string(path).map_err(|err| Error::Io {
        file: file.clone(),
        err,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Json {
        file,
        field: "(document)".into(),
        reason: e.to_string(),
    })
}

/// The shard files named by a `model.safetensors.index.json`, in first-seen order, and the
/// tensor -> shard map it declares.
pub fn read_index(index: &Path) -> Result<(Vec<PathBuf>, HashMap<String, String>)> {
    let file = index.display().to_string();
    let v = read_json(index)?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::Json {
            file: file.clone(),
            field: "weight_map".into(),
            reason: "missing or not an object".into(),
        })?;
    let dir = index.parent().unwrap_or(Path::new(""));
    let mut shards: Vec<PathBuf> = Vec::new();
    let mut out = HashMap::new();
    for (name, shard) in map {
        let shard = shard.as_str().ok_or_else(|| Error::Json {
            file: file.clone(),
            field: format!("weight_map.{name}"),
            reason: "not a string".into(),
        })?;
        if shard.contains('/') || shard.contains("..") {
            return Err(Error::Json {
                file: file.clone(),
                field: format!("weight_map.{name}"),
                reason: format!("shard {shard:?} is not a file name in the index's folder"),
            });
        }
        let p = dir.join(shard);
        if !shards.contains(&p) {
            shards.push(p);
        }
        out.insert(name.clone(), shard.to_string());
    }
    shards.sort();
    Ok((shards, out))
}
