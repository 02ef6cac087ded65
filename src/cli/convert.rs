//! `metrale-pack convert`: its flags, the layout choice, the conversion with its progress bar,
//! and what it prints after (summary, fidelity, warnings, or one JSON object).

use super::{choose, report, write_fidelity};
use anyhow::{Context, Result};
use metrale_pack::atomic;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::model::Model;
use metrale_pack::options::{CONVERT, ConvertRequest, Kind};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

/// The default output of `convert SRC`: SRC with extension `.mpk.gguf` (a folder: `model.mpk.gguf`
/// inside it), or `NAME.repack.mpk.gguf` where that would be SRC itself.
fn default_output(src: &Path) -> PathBuf {
    let base = if src.is_dir() {
        src.join("model")
    } else {
        src.with_extension("")
    };
    let out = base.with_extension("mpk.gguf");
    if out == src {
        base.with_extension("repack.mpk.gguf")
    } else {
        out
    }
}

/// `--layouts` tags as layouts (`None`: the defaults), read as `convert`'s `layouts` option
/// reads them (`options::CONVERT`).
pub(crate) fn parse_layouts(tags: Option<Vec<String>>) -> Result<Option<Vec<Layout>>> {
    let Some(tags) = tags else {
        return Ok(None);
    };
    let mut r = ConvertRequest::default();
    for t in &tags {
        r.set("layouts", t).context("--layouts")?;
    }
    Ok(Some(r.layouts.unwrap_or_default()))
}

/// `convert`'s options as given: a flag for every row of `options::CONVERT` (built from the
/// table, so an option added there is a flag here), with the values in words, in order. Set on
/// a [`ConvertRequest`] when the command runs, so a value the option refuses is the library's
/// error.
pub(crate) struct Options(Vec<(&'static str, String)>);

impl clap::FromArgMatches for Options {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for o in CONVERT {
            if o.kind == Kind::Switch {
                if m.get_flag(o.name) {
                    given.push((o.name, "true".to_string()));
                }
            } else if let Some(vs) = m.get_many::<String>(o.name) {
                given.extend(vs.map(|v| (o.name, v.clone())));
            }
        }
        Ok(Options(given))
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for Options {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, ArgAction};
        CONVERT.iter().fold(cmd, |cmd, o| {
            let long = o.name.replace('_', "-");
            let arg = Arg::new(o.name).long(long).help(o.help);
            cmd.arg(match o.kind {
                Kind::Switch => arg.action(ArgAction::SetTrue),
                Kind::Count => arg.value_name("N"),
                Kind::Path => arg.value_name("PATH"),
                Kind::Words => arg.value_name("A,B,..").action(ArgAction::Append),
                Kind::Choice(words) => arg.value_parser(words.to_vec()),
            })
        })
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

pub(crate) fn convert(
    src: &Path,
    output: Option<PathBuf>,
    Options(given): Options,
    (dry_run, json): (bool, bool),
    quiet: bool,
) -> Result<()> {
    let mut req = ConvertRequest::default();
    for (name, value) in &given {
        req.set(name, value)
            .with_context(|| format!("--{}", name.replace('_', "-")))?;
    }
    let out = output.unwrap_or_else(|| default_output(src));
    let model = Model::open(src)?;
    req.threads = capped_threads(req.threads);
    let (opts, refusal) = req.settle(&model);
    if dry_run {
        return choose::dry_run(&model, &opts, &out, refusal.as_deref());
    }
    if let Some(why) = refusal {
        choose::refuse(&model, &opts, &why)?;
    }
    let mut warnings: Vec<String> = choose::unserved_warning(&opts).into_iter().collect();
    for w in &warnings {
        eprintln!("{w}");
    }
    // Checked here too (the library's convert checks it first thing), so the refusal comes
    // before the progress bar.
    atomic::refuse_inputs(&out, &model.convert_inputs(opts.lora.as_deref()))?;
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(1)
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}")
            .unwrap(),
    );
    let t0 = std::time::Instant::now();
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let src_bytes: u64 = model.files.iter().map(|f| f.bytes().len() as u64).sum();
    // Given by value: its index is freed before the finished pack is validated.
    let manifest = req.convert_settled(model, &opts, &out, &progress, &AtomicBool::new(false))?;
    bar.finish_and_clear();
    let bytes = std::fs::metadata(&out)?.len();
    let secs = t0.elapsed().as_secs_f64();
    let far = choose::far_warnings(&manifest.fidelity);
    warnings.extend(far.iter().cloned());
    if json {
        let r = report::Converted {
            output: out.display().to_string(),
            bytes,
            tensors: manifest.tensors.len(),
            ffn_layers: manifest.model.ffn_layers,
            moe_layers: &manifest.model.moe_layers,
            layouts: &manifest.layouts,
            seconds: secs,
            source_bytes: src_bytes,
            fidelity: &manifest.fidelity,
            warnings,
        };
        println!("{}", serde_json::to_string(&r)?);
    }
    if quiet || json {
        for w in &far {
            eprintln!("{w}");
        }
        return Ok(());
    }
    eprintln!(
        "wrote {} ({:.1} MB, {} tensors, {} FFN layers, layouts {}) in {:.2} s: {:.1} MB/s of source, peak RSS {}",
        out.display(),
        bytes as f64 / 1e6,
        manifest.tensors.len(),
        manifest.model.ffn_layers,
        manifest.layouts.join(","),
        secs,
        src_bytes as f64 / 1e6 / secs,
        peak_rss().unwrap_or_else(|| "unknown".into())
    );
    if !manifest.model.moe_layers.is_empty() {
        eprintln!(
            "layers {:?}: mixture-of-experts, passed through as they are",
            manifest.model.moe_layers
        );
    }
    write_fidelity(&mut std::io::stderr().lock(), &manifest.fidelity)?;
    for w in &far {
        eprintln!("{w}");
    }
    Ok(())
}

/// `--threads`, at most the cores this process may run on (0: rayon's default, all of them);
/// asking for more says so once instead of failing to spawn them.
fn capped_threads(threads: Option<usize>) -> Option<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match threads {
        Some(t) if t > cores => {
            eprintln!("--threads {t}: this machine runs {cores} at once; using {cores}");
            Some(cores)
        }
        t => t,
    }
}

/// Peak resident set size of this process (Linux `VmHWM`).
fn peak_rss() -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(format!("{:.0} MB", kb / 1024.0))
}
