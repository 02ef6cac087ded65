//! `Pack`: an opened, validated pack, and the decoders `dump` and `verify` use.

use crate::converters::layouts::Proj;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, Value};

use super::*;
use std::path::Path;

/// Check and remove the pad tensors (`metrale.pad.N`, N = 0, 1, ... in order, I8, 1-D, each
/// ending on a page of the data section).
fn strip_pads(file: &mut GgufFile) -> Result<()> {
    let f = file.path.display().to_string();
    if !file.data_offset.is_multiple_of(PACK_PAGE) {
        return Err(Error::Metadata {
            file: f,
            key: "(data section)".into(),
            reason: format!("starts at {}, not on a page", file.data_offset),
        });
    }
    let mut next = 0usize;
    for t in &file.tensors {
        if let Some(n) = t.name.strip_prefix(PAD_PREFIX) {
            let ends = t.offset.checked_add(t.bytes);
            if n != next.to_string()
                || t.ty != crate::GgmlType::I8
                || t.ne.len() != 1
                || ends.is_none_or(|e| !e.is_multiple_of(PACK_PAGE))
            {
                return Err(Error::Tensor {
                    file: f,
                    tensor: t.name.to_string(),
                    field: "pad",
                    reason: format!(
                        "a pad tensor must be {PAD_PREFIX}{next}, I8, 1-D, ending on a page (ends at {ends:?})"
                    ),
                });
            }
            next += 1;
        }
    }
    file.tensors.retain(|t| !t.name.starts_with(PAD_PREFIX));
    Ok(())
}

/// One element rule of one blob part of a pack ([`Pack::element_rules`]).
#[derive(Clone, Debug)]
pub struct PartRule {
    /// The blob's name (no part suffix).
    pub blob: String,
    /// The part's suffix.
    pub part: &'static str,
    /// The part's tensor index.
    pub tensor: usize,
    /// The rule.
    pub rule: crate::layout::ElementRule,
    /// The elements it covers, from the part's start.
    pub elements: usize,
}

/// An opened, validated pack.
pub struct Pack {
    /// The pack as a GGUF file (its manifest KV emptied: [`Pack::manifest`] holds it parsed).
    pub file: GgufFile,
    /// Its manifest, validated.
    pub manifest: Manifest,
    /// Tensor indices sorted by name (`index` is called once per tensor by `verify --source`;
    /// a map of name copies cost a pack of 100k tensors 10 MB).
    by_name: Vec<usize>,
}

impl Pack {
    /// Open `path` and check that it is a pack this build reads: format version, kernel ABI and
    /// target, and the manifest against the tensor table.
    pub fn open(path: impl AsRef<Path>) -> Result<Pack> {
        let path = path.as_ref();
        let file = GgufFile::open(path)?;
        Self::from_gguf(file)
    }

    /// Validate an opened GGUF as a pack.
    pub fn from_gguf(mut file: GgufFile) -> Result<Pack> {
        let f = file.path.display().to_string();
        let reconvert = |what: String| Error::Metadata {
            file: f.clone(),
            key: "metrale.pack".into(),
            reason: format!(
                "{what}; re-convert the model with this metrale-pack ({CONVERTER_VERSION})"
            ),
        };
        let version = file.get(keys::FORMAT_VERSION).and_then(Value::as_u64);
        match version {
            None => {
                return Err(reconvert(
                    "not a metrale pack (no metrale.pack.format_version)".into(),
                ));
            }
            Some(v) if v != PACK_FORMAT_VERSION as u64 => {
                return Err(reconvert(format!(
                    "pack format version {v}, this build reads {PACK_FORMAT_VERSION}"
                )));
            }
            _ => {}
        }
        let abi = file.get(keys::KERNEL_ABI).and_then(Value::as_u64);
        if abi != Some(KERNEL_ABI_VERSION as u64) {
            return Err(reconvert(format!(
                "kernel ABI {abi:?}, this build's kernels need {KERNEL_ABI_VERSION}"
            )));
        }
        let arch = file
            .get(keys::TARGET_ARCH)
            .and_then(Value::as_str)
            .unwrap_or("?");
        if arch != TARGET_ARCH {
            return Err(reconvert(format!(
                "target {arch}, this build targets {TARGET_ARCH}"
            )));
        }
        if file.alignment != PACK_ALIGNMENT {
            return Err(reconvert(format!(
                "general.alignment {} (packs use {PACK_ALIGNMENT})",
                file.alignment
            )));
        }
        // Every header byte is as written before any of its numbers is used (the comparisons
        // above only decide whether this build reads the pack at all: "re-convert").
        crate::pack_check::check_header(&file)?;
        // The checksum read the header's pages back in; they are not read again.
        file.release(0, file.data_offset);
        // The pad tensors only place the next tensor on a page: checked, then left out of the
        // tensor list every reader of the pack iterates (their bytes are checked as padding).
        strip_pads(&mut file)?;
        let range = file
            .kvs
            .iter()
            .find(|kv| kv.key == keys::MANIFEST)
            .and_then(|kv| file.string_range(kv))
            .ok_or_else(|| reconvert("no metrale.pack.manifest".into()))?;
        // Read from the map, its pages released behind the parser: a manifest of 100k tensors
        // is 9 MB of text, never resident whole nor copied.
        let reader = std::io::BufReader::with_capacity(1 << 16, file.releasing_reader(range));
        let manifest: Manifest = serde_json::from_reader(reader).map_err(|e| Error::Json {
            file: f.clone(),
            field: keys::MANIFEST.into(),
            reason: e.to_string(),
        })?;
        if manifest.tensors.len() != file.tensors.len() {
            return Err(reconvert(format!(
                "manifest lists {} tensors, the file holds {}",
                manifest.tensors.len(),
                file.tensors.len()
            )));
        }
        for (e, t) in manifest.tensors.iter().zip(&file.tensors) {
            if table_name(&e.name) != t.name.as_str() || e.bytes != t.bytes {
                return Err(Error::Tensor {
                    file: f.clone(),
                    tensor: t.name.to_string(),
                    field: "manifest",
                    reason: format!(
                        "manifest says {} ({} bytes), tensor table says {} ({} bytes)",
                        e.name, e.bytes, t.name, t.bytes
                    ),
                });
            }
        }
        let seg = manifest.segment_offset..manifest.segment_offset + manifest.segment_bytes;
        for (e, t) in manifest.tensors.iter().zip(&file.tensors) {
            let inside = seg.contains(&t.offset) || (t.bytes == 0 && t.offset == seg.end);
            if e.ffn.is_some() && !e.device {
                return Err(Error::Tensor {
                    file: f.clone(),
                    tensor: t.name.to_string(),
                    field: "device",
                    reason: "an FFN blob flagged as a host tensor".into(),
                });
            }
            if e.device != inside {
                return Err(Error::Tensor {
                    file: f.clone(),
                    tensor: t.name.to_string(),
                    field: "device",
                    reason: format!(
                        "flagged as a {} tensor but lies {} the device segment {seg:?}",
                        if e.device { "device" } else { "host" },
                        if inside { "inside" } else { "outside" }
                    ),
                });
            }
        }
        crate::pack_check::check_manifest(&file, &manifest)?;
        let mut by_name: Vec<usize> = (0..manifest.tensors.len()).collect();
        by_name.sort_unstable_by(|&a, &b| manifest.tensors[a].name.cmp(&manifest.tensors[b].name));
        // The manifest's text is held parsed from here on (a pack of 100k tensors has 9 MB).
        if let Some(kv) = file.kvs.iter_mut().find(|kv| kv.key == keys::MANIFEST) {
            kv.value = Value::String(String::new());
        }
        Ok(Pack {
            file,
            manifest,
            by_name,
        })
    }

    /// Index of a tensor by name.
    pub fn index(&self, name: &str) -> Option<usize> {
        let t = &self.manifest.tensors;
        self.by_name
            .binary_search_by(|&i| t[i].name.as_str().cmp(name))
            .ok()
            .map(|k| self.by_name[k])
    }

    /// Bytes of tensor `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        self.file.tensor_data(i)
    }

    /// The device segment's bytes (absolute file range).
    pub fn segment_range(&self) -> std::ops::Range<u64> {
        let s = self.file.data_offset + self.manifest.segment_offset;
        s..s + self.manifest.segment_bytes
    }

    /// Tensor `i`'s bytes, read with `pread` (see [`GgufFile::read_range`]): an error, not
    /// SIGBUS, if the file shrinks meanwhile.
    pub fn read(&self, i: usize) -> Result<Vec<u8>> {
        let t = &self.file.tensors[i];
        let mut out = Vec::with_capacity(t.bytes as usize);
        self.file
            .read_range(t.file_offset, t.file_offset + t.bytes, &t.name, |c| {
                out.extend_from_slice(c)
            })?;
        Ok(out)
    }

    /// Check every tensor's xxh3 against the manifest; returns the names that differ. Reads
    /// with `pread`, so a file truncated while it is checked gives an error, not SIGBUS.
    pub fn verify_checksums(&self) -> Result<Vec<String>> {
        use rayon::prelude::*;
        let differs = (0..self.manifest.tensors.len())
            .into_par_iter()
            .filter_map(|i| {
                let t = &self.file.tensors[i];
                let mut h = xxhash_rust::xxh3::Xxh3::new();
                let read =
                    self.file
                        .read_range(t.file_offset, t.file_offset + t.bytes, &t.name, |c| {
                            h.update(c)
                        });
                // Only the tensors that differ are listed (one word per tensor was 1.6 MB
                // for a pack of 100k).
                match read {
                    Err(e) => Some(Err(e)),
                    Ok(()) => (h.digest() != self.manifest.tensors[i].xxh3).then_some(Ok(i)),
                }
            })
            .collect::<Result<Vec<usize>>>()?;
        Ok(differs
            .into_iter()
            .map(|i| self.manifest.tensors[i].name.to_string())
            .collect())
    }

    /// Decode an FFN layout of one projection to f32 `[out, in]` (logical shape, padding
    /// removed). `name` is the blob name with or without its part suffix.
    pub fn decode_ffn(&self, name: &str) -> Result<(Vec<f32>, [u64; 2])> {
        self.with_blob(name, &|i| Some(self.data(i)), |spec, read| {
            spec.decode(read)
        })
    }

    /// Run `f` on the layout and the stored parts of the FFN blob `name` (with or without its
    /// part suffix), with its logical shape; `data` gives tensor `i`'s bytes (the map, or a
    /// copy read beforehand).
    fn with_blob<'a, T>(
        &'a self,
        name: &str,
        data: &(dyn Fn(usize) -> Option<&'a [u8]> + Sync),
        f: impl FnOnce(&dyn crate::layout::LayoutSpec, &crate::layout::BlobRead) -> Result<T>,
    ) -> Result<(T, [u64; 2])> {
        let f_name = self.file.path.display().to_string();
        let nf = || Error::NotFound {
            file: f_name.clone(),
            tensor: name.into(),
        };
        let entry = self
            .manifest
            .tensors
            .iter()
            .find(|e| {
                e.name == name || (e.ffn.is_some() && e.name.starts_with(&format!("{name}.")))
            })
            .ok_or_else(nf)?;
        let fe = entry.ffn.as_ref().ok_or_else(nf)?;
        let layout = Layout::from_tag(&fe.layout).ok_or_else(nf)?;
        let proj = Proj::from_name(&fe.proj).ok_or_else(nf)?;
        let prefix = blob_name_tp(
            fe.layer,
            proj,
            layout,
            "",
            entry.tp.as_ref().map(|t| t.rank),
        );
        let parts = |p: &str| {
            let n = if p.is_empty() {
                prefix.clone()
            } else {
                format!("{prefix}.{p}")
            };
            self.index(&n).and_then(data)
        };
        let read = crate::layout::BlobRead {
            proj,
            shape: fe.shape.map(|d| d as usize),
            padded: fe.padded.map(|d| d as usize),
            scalars: &fe.scalars,
            file: &f_name,
            name: &prefix,
            parts: &parts,
        };
        Ok((f(layout.spec(), &read)?, fe.shape))
    }

    /// The FFN blobs' names (one per stored projection, without part suffixes), in file order.
    pub fn blob_names(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.manifest
            .tensors
            .iter()
            .filter_map(|e| {
                let fe = e.ffn.as_ref()?;
                let layout = Layout::from_tag(&fe.layout)?;
                let proj = Proj::from_name(&fe.proj)?;
                let rank = e.tp.as_ref().map(|t| t.rank);
                Some(blob_name_tp(fe.layer, proj, layout, "", rank))
            })
            .filter(|n| seen.insert(n.clone()))
            .collect()
    }

    /// Every FFN blob against its layout's own rules on the CPU ([`LayoutSpec::check_blob`]:
    /// what its decoder refuses and what its kernels cannot take, such as a permutation that
    /// is none, a scale that is not finite or a zero point out of range), blobs in parallel:
    /// the first blob (in file order) that breaks one, named. `verify` runs it; the loader
    /// checks the element rules on the bytes it copied instead (`loader::rules`) and runs
    /// this only where no `blob_rules` kernel serves.
    ///
    /// [`LayoutSpec::check_blob`]: crate::layout::LayoutSpec::check_blob
    pub fn check_blob_rules(&self) -> Result<()> {
        match self.blob_rule_errors(false).into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The rules over whole blobs that are not element by element
    /// ([`LayoutSpec::check_structure`]: a stored permutation), on the CPU: what the loader
    /// checks beside the copy.
    ///
    /// [`LayoutSpec::check_structure`]: crate::layout::LayoutSpec::check_structure
    pub fn check_blob_structures(&self) -> Result<()> {
        match self.blob_rule_errors(true).into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Blob `name` against every rule of its layout on the CPU (`LayoutSpec::check_blob`).
    pub fn check_blob(&self, name: &str) -> Result<()> {
        self.with_blob(name, &|i| Some(self.data(i)), |spec, read| {
            spec.check_blob(read)
        })
        .map(|_| ())
    }

    /// Every FFN blob that breaks its layout's rules, each error as text (`verify`).
    pub fn blob_rule_violations(&self) -> Vec<String> {
        self.blob_rule_errors(false)
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    /// The blobs' rule errors (with `structure`, only the rules that are not element by
    /// element), in file order.
    fn blob_rule_errors(&self, structure: bool) -> Vec<Error> {
        use rayon::prelude::*;
        let names = self.blob_names();
        names
            .par_iter()
            .filter_map(|n| {
                let data = |i: usize| Some(self.data(i));
                self.with_blob(n, &data, |spec, read| {
                    if structure {
                        spec.check_structure(read)
                    } else {
                        spec.check_blob(read)
                    }
                })
                .err()
            })
            .collect()
    }

    /// The element rules of every FFN blob this pack holds, with the tensor each reads, the
    /// elements checked against the part's bytes (what `loader::rules` launches).
    pub fn element_rules(&self) -> Result<Vec<PartRule>> {
        let mut out = Vec::new();
        for name in self.blob_names() {
            let prefix = format!("{name}.");
            let Some(fe) = self
                .manifest
                .tensors
                .iter()
                .find(|e| e.name == name || e.name.starts_with(&prefix))
                .and_then(|e| e.ffn.as_ref())
            else {
                continue;
            };
            let Some(layout) = Layout::from_tag(&fe.layout) else {
                continue;
            };
            let padded = fe.padded.map(|d| d as usize);
            for (part, rule, count) in layout.spec().element_rules(&fe.scalars, padded) {
                let tname = if part.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}{part}")
                };
                let Some(i) = self.index(&tname) else {
                    continue;
                };
                let bytes = self.file.tensors[i].bytes as usize;
                let n = count.unwrap_or(bytes / rule.elem_bytes());
                if n.checked_mul(rule.elem_bytes()).is_none_or(|b| b > bytes) {
                    return Err(Error::Tensor {
                        file: self.file.path.display().to_string(),
                        tensor: tname,
                        field: "rules",
                        reason: format!("{n} elements of {rule:?} pass its {bytes} bytes"),
                    });
                }
                out.push(PartRule {
                    blob: name.clone(),
                    part,
                    tensor: i,
                    rule,
                    elements: n,
                });
            }
        }
        Ok(out)
    }
}
