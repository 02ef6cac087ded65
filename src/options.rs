//! One options model for every surface. Each option `convert` takes is one row of [`CONVERT`]:
//! its name, the kind of value it takes, its help, and how a value written as text sets it on a
//! [`ConvertRequest`]. Every surface reads that table, so an option added there reaches all of
//! them: the command line makes a flag of each row (`--host-tensors`), Python a keyword of
//! `metrale_pack.convert` (`host_tensors=[...]`), C a name of `mp_convert` (`"host_tensors"`),
//! and Rust sets the request's field or calls [`ConvertRequest::set`]. `tests/options.rs`
//! checks every row on the four.

use crate::converters::layouts::{Layout, q4k_mmq::DownFormat};
use crate::error::{Error, Result};
use crate::manifest::{ConvertOptions, Manifest};
use crate::model::Model;
use crate::pack::{self, choice};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The kind of value an option takes, and how each surface writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// On or off: a bare flag on the command line, a `bool` in Python, `"true"` or `"false"`
    /// in C.
    Switch,
    /// A whole number.
    Count,
    /// A list of words: comma-separated on the command line and in C, a list in Python.
    Words,
    /// A path.
    Path,
    /// One of these words.
    Choice(&'static [&'static str]),
}

impl Kind {
    /// The kind in words, as Python's `CONVERT_OPTIONS` and C's `mp_convert_option` give it:
    /// `switch`, `count`, `words`, `path` or `choice:A|B`.
    pub fn describe(&self) -> String {
        match self {
            Kind::Switch => "switch".into(),
            Kind::Count => "count".into(),
            Kind::Words => "words".into(),
            Kind::Path => "path".into(),
            Kind::Choice(w) => format!("choice:{}", w.join("|")),
        }
    }
}

/// One option of a request `T`: its name (snake_case: the Python keyword, the C name and the
/// Rust field; the command line's flag is it in kebab-case), what it takes, its help, and how a
/// value in words sets it.
pub struct Opt<T: 'static> {
    /// Its name.
    pub name: &'static str,
    /// What it takes.
    pub kind: Kind,
    /// One paragraph of help (the command line's `--help`, the docs).
    pub help: &'static str,
    set: fn(&mut T, &str) -> std::result::Result<(), String>,
}

impl<T> Opt<T> {
    /// The command line's flag: `--` and the name in kebab-case.
    pub fn flag(&self) -> String {
        format!("--{}", self.name.replace('_', "-"))
    }
}

/// What a caller asks `convert` for, on any surface: what the pack records
/// ([`ConvertOptions`], once [`ConvertRequest::settle`]d against the source) and how to
/// convert. Each field is a row of [`CONVERT`].
#[derive(Clone, Debug, PartialEq)]
pub struct ConvertRequest {
    /// The layouts to build; `None`: those that keep the source's format, else the defaults
    /// for its activation (`pack::choice::settle`).
    pub layouts: Option<Vec<Layout>>,
    /// How `q4k_mmq` stores the down projection; `None`: `q4k` when every down projection of
    /// the source is Q4_K, else `int8`.
    pub q4k_down: Option<DownFormat>,
    /// A PEFT LoRA adapter directory (adds the `lora` layout).
    pub lora: Option<PathBuf>,
    /// Name patterns of tensors the engine keeps on the host.
    pub host_tensors: Vec<String>,
    /// Tensor-parallel ranks (1: one GPU).
    pub tp: u32,
    /// Carry NaN and infinite FFN weights (only `bf16` holds them).
    pub allow_nonfinite: bool,
    /// With `tp`, copy mixture-of-experts layers whole onto every rank.
    pub replicate_moe: bool,
    /// Quantize already-quantized weights into another quantized layout.
    pub allow_requantize: bool,
    /// Worker threads (`None`: all cores). The output bytes do not depend on it.
    pub threads: Option<usize>,
}

impl Default for ConvertRequest {
    fn default() -> Self {
        let o = ConvertOptions::default();
        ConvertRequest {
            layouts: None,
            q4k_down: None,
            lora: None,
            host_tensors: o.host_tensors,
            tp: o.tp,
            allow_nonfinite: o.allow_nonfinite,
            replicate_moe: o.replicate_moe,
            allow_requantize: false,
            threads: None,
        }
    }
}

/// Every option `convert` takes, on every surface.
pub static CONVERT: &[Opt<ConvertRequest>] = &[
    Opt {
        name: "layouts",
        kind: Kind::Words,
        help: "The layouts to build for every FFN layer (`metrale-pack layouts` lists them). Default: those that keep the source's format; for float sources nvfp4,nvfp4_mmq (SiLU) or nvfp4,nvfp4_t (GELU).",
        set: |r, v| {
            let more = words(v)?.into_iter().map(layout);
            let more = more.collect::<std::result::Result<Vec<_>, _>>()?;
            r.layouts.get_or_insert_with(Vec::new).extend(more);
            Ok(())
        },
    },
    Opt {
        name: "q4k_down",
        kind: Kind::Choice(&["int8", "q4k"]),
        help: "How q4k_mmq stores the down projection: int8 (per-row scales) or q4k. Default: q4k when every down projection of the source is Q4_K (its bytes kept), else int8.",
        set: |r, v| {
            r.q4k_down = Some(match v {
                "int8" => DownFormat::Int8,
                "q4k" => DownFormat::Q4k,
                _ => return Err(format!("int8 or q4k, not {v:?}")),
            });
            Ok(())
        },
    },
    Opt {
        name: "lora",
        kind: Kind::Path,
        help: "A PEFT LoRA adapter directory for gate/up/down (adds the lora layout; needs nvfp4).",
        set: |r, v| {
            r.lora = Some(path(v)?);
            Ok(())
        },
    },
    Opt {
        name: "host_tensors",
        kind: Kind::Words,
        help: "Name patterns (`*`, `?`) of tensors the engine keeps on the host (e.g. token_embd.weight): stored before the device segment, not copied by the loader.",
        set: |r, v| {
            r.host_tensors
                .extend(words(v)?.into_iter().map(str::to_string));
            Ok(())
        },
    },
    Opt {
        name: "tp",
        kind: Kind::Count,
        help: "Tensor-parallel ranks: one segment per rank holding its slice of every FFN layer (gate/up by rows, down by columns) and of attention (by heads); 1 = one GPU.",
        set: |r, v| {
            r.tp = count(v)?;
            Ok(())
        },
    },
    Opt {
        name: "allow_nonfinite",
        kind: Kind::Switch,
        help: "Carry NaN and infinite FFN weights instead of refusing them (only the bf16 layout holds them).",
        set: |r, v| {
            r.allow_nonfinite = switch(v)?;
            Ok(())
        },
    },
    Opt {
        name: "replicate_moe",
        kind: Kind::Switch,
        help: "With tp, copy mixture-of-experts layers whole onto every rank instead of refusing.",
        set: |r, v| {
            r.replicate_moe = switch(v)?;
            Ok(())
        },
    },
    Opt {
        name: "allow_requantize",
        kind: Kind::Switch,
        help: "Quantize already-quantized weights (Q4_1, Q8_0, FP8, int4, ...) into another quantized layout; without it such a set is refused before anything is written.",
        set: |r, v| {
            r.allow_requantize = switch(v)?;
            Ok(())
        },
    },
    Opt {
        name: "threads",
        kind: Kind::Count,
        help: "Worker threads (default: all cores). The output bytes do not depend on it.",
        set: |r, v| {
            r.threads = Some(count(v)?);
            Ok(())
        },
    },
];

/// The comma-separated words of `v`, trimmed; an empty one is refused.
fn words(v: &str) -> std::result::Result<Vec<&str>, String> {
    let w: Vec<&str> = v.split(',').map(str::trim).collect();
    if w.iter().any(|w| w.is_empty()) {
        return Err(format!("an empty item in {v:?}"));
    }
    Ok(w)
}

fn layout(tag: &str) -> std::result::Result<Layout, String> {
    Layout::from_tag(tag).ok_or_else(|| {
        let known: Vec<&str> = Layout::ALL.iter().map(|l| l.tag()).collect();
        format!("unknown layout {tag:?} (the layouts: {})", known.join(", "))
    })
}

fn path(v: &str) -> std::result::Result<PathBuf, String> {
    if v.is_empty() {
        return Err("an empty path".into());
    }
    Ok(PathBuf::from(v))
}

fn count<N: std::str::FromStr>(v: &str) -> std::result::Result<N, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("a whole number in range, not {v:?}"))
}

fn switch(v: &str) -> std::result::Result<bool, String> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("true or false, not {v:?}")),
    }
}

impl ConvertRequest {
    /// Set option `name` from its value in words (a switch: `true`/`false`, `1`/`0`; words:
    /// comma-separated, added to those set before). An unknown name or a value it does not take is an
    /// [`Error::Argument`] naming the option.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let Some(opt) = CONVERT.iter().find(|o| o.name == name) else {
            let known: Vec<&str> = CONVERT.iter().map(|o| o.name).collect();
            return Err(Error::Argument {
                name: name.into(),
                reason: format!("no such convert option (the options: {})", known.join(", ")),
            });
        };
        (opt.set)(self, value).map_err(|reason| Error::Argument {
            name: name.into(),
            reason,
        })
    }

    /// The options the pack records for `model` and the re-quantization a convert refuses, in
    /// words: the layouts as named, else what keeps the source's format, else the defaults
    /// (`pack::choice::settle`); `q4k_down` as set, else the source's. The refusal is `None`
    /// with `allow_requantize`.
    pub fn settle(&self, model: &Model) -> (ConvertOptions, Option<String>) {
        let mut opts = ConvertOptions {
            layouts: self.layouts.clone(),
            q4k_down: self.q4k_down.unwrap_or_else(|| choice::default_down(model)),
            lora: self.lora.clone(),
            host_tensors: self.host_tensors.clone(),
            tp: self.tp,
            allow_nonfinite: self.allow_nonfinite,
            replicate_moe: self.replicate_moe,
        };
        let settled = choice::settle(model, &opts);
        opts.layouts = Some(settled.layouts);
        (opts, settled.refusal.filter(|_| !self.allow_requantize))
    }

    /// Convert `model` into a pack at `out` as asked, on [`ConvertRequest::threads`] threads
    /// (`pack::convert_until`: `report(done, total)` as it moves, stopped when `stop` is set). A
    /// set that re-quantizes a quantized weight without `allow_requantize` is refused before
    /// anything is written.
    pub fn convert(
        &self,
        model: Model,
        out: impl AsRef<Path>,
        report: &(dyn Fn(u64, u64) + Sync),
        stop: &AtomicBool,
    ) -> Result<Manifest> {
        let (opts, refusal) = self.settle(&model);
        if let Some(why) = refusal {
            return Err(Error::Unsupported {
                file: model.path.display().to_string(),
                reason: format!("{why} (name layouts, or set allow_requantize)"),
            });
        }
        self.convert_settled(model, &opts, out, report, stop)
    }

    /// Convert `model` with the options [`ConvertRequest::settle`] gave for it (a caller that
    /// settled them itself to show or refuse the choice, as the command line does), on
    /// [`ConvertRequest::threads`] threads.
    pub fn convert_settled(
        &self,
        model: Model,
        opts: &ConvertOptions,
        out: impl AsRef<Path>,
        report: &(dyn Fn(u64, u64) + Sync),
        stop: &AtomicBool,
    ) -> Result<Manifest> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads.unwrap_or(0))
            .build()
            .map_err(|e| Error::Argument {
                name: "threads".into(),
                reason: e.to_string(),
            })?;
        let out = out.as_ref();
        pool.install(|| pack::convert_until(model, opts, out, report, stop))
    }
}
