//! `metrale-pack convert`: its flags, the layout choice, the conversion with its progress bar,
//! and what it prints after (summary, fidelity, warnings, or one JSON object).

use super::{choose, report, write_fidelity};
use anyhow::{Context, Result};
use metrale_pack::atomic;
use metrale_pack::converters::layouts::{Layout, q4k_mmq::DownFormat};
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions};
use std::path::{Path, PathBuf};

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

/// `--layouts` tags as layouts (`None`: the defaults).
pub(crate) fn parse_layouts(tags: Option<Vec<String>>) -> Result<Option<Vec<Layout>>> {
    tags.map(|v| {
        v.iter()
            .map(|t| {
                Layout::from_tag(t.trim()).with_context(|| {
                    let known: Vec<&str> = Layout::ALL.iter().map(|l| l.tag()).collect();
                    format!("unknown layout {t:?} (the layouts: {})", known.join(", "))
                })
            })
            .collect()
    })
    .transpose()
}

/// `convert`'s flags past the layouts (what `ConvertOptions` records, and how to choose).
#[derive(clap::Args)]
pub(crate) struct Flags {
    /// Worker threads (default: all cores). The output bytes do not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Comma-separated name patterns (`*`, `?`) of tensors the engine keeps on the host
    /// (e.g. token_embd.weight): stored before the device segment, not copied by the loader.
    #[arg(long, value_delimiter = ',')]
    host_tensors: Vec<String>,
    /// Tensor-parallel ranks: one segment per rank holding its slice of every FFN layer
    /// (gate/up by rows, down by columns) and of attention (by heads); 1 = one GPU.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Carry NaN and infinite FFN weights instead of refusing them (only the bf16 layout
    /// holds them).
    #[arg(long)]
    allow_nonfinite: bool,
    /// With --tp, copy mixture-of-experts layers whole onto every rank instead of refusing.
    #[arg(long)]
    replicate_moe: bool,
    /// Quantize already-quantized weights (Q4_1, Q8_0, FP8, int4, ...) into another
    /// quantized layout; without it such a set is refused before anything is written.
    #[arg(long)]
    allow_requantize: bool,
    /// Show each chosen layout's size and error (measured on the first FFN layer), what the
    /// set serves and the disk it needs; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the summary, fidelity and warnings as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(crate) fn convert(
    src: &Path,
    output: Option<PathBuf>,
    layouts: Option<Vec<String>>,
    q4k_down: Option<&str>,
    lora: Option<PathBuf>,
    Flags {
        threads,
        host_tensors,
        tp,
        allow_nonfinite,
        replicate_moe,
        allow_requantize,
        dry_run,
        json,
    }: Flags,
    quiet: bool,
) -> Result<()> {
    let layouts = parse_layouts(layouts)?;
    let q4k_down = match q4k_down {
        None => None,
        Some("int8") => Some(DownFormat::Int8),
        Some("q4k") => Some(DownFormat::Q4k),
        Some(other) => anyhow::bail!("--q4k-down must be int8 or q4k, not {other:?}"),
    };
    let out = output.unwrap_or_else(|| default_output(src));
    let model = Model::open(src)?;
    let mut opts = ConvertOptions {
        layouts,
        q4k_down: q4k_down.unwrap_or_else(|| pack::choice::default_down(&model)),
        lora,
        host_tensors,
        tp,
        allow_nonfinite,
        replicate_moe,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(capped_threads(threads))
        .build()?;
    let settled = pack::choice::settle(&model, &opts);
    let refusal = settled.refusal.filter(|_| !allow_requantize);
    opts.layouts = Some(settled.layouts);
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
    let manifest = pool.install(|| pack::convert(model, &opts, &out, &progress))?;
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
fn capped_threads(threads: Option<usize>) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match threads {
        Some(t) if t > cores => {
            eprintln!("--threads {t}: this machine runs {cores} at once; using {cores}");
            cores
        }
        Some(t) => t,
        None => 0,
    }
}

/// Peak resident set size of this process (Linux `VmHWM`).
fn peak_rss() -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(format!("{:.0} MB", kb / 1024.0))
}
