//! The `metrale-pack` command line.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions, Pack};
use metrale_pack::{atomic, gguf, model, npy};
use std::io::Write;
use std::path::{Path, PathBuf};

#[path = "cli/inspect.rs"]
mod inspect;
use inspect::{inspect, write_fidelity};
#[path = "cli/apply.rs"]
mod apply;
#[path = "cli/choose.rs"]
mod choose;
#[path = "cli/convert.rs"]
mod convert;
use convert::{Flags, parse_layouts};
#[path = "cli/layouts.rs"]
mod layouts;
#[path = "cli/report.rs"]
mod report;
#[path = "cli/verify.rs"]
mod verify;
use apply::ffn_apply;
#[path = "cli/gpu_check.rs"]
mod gpu_check;
#[path = "cli/term.rs"]
mod term;
#[path = "cli/tp.rs"]
mod tp;
use gpu_check::gpu_check;

#[derive(Parser)]
#[command(
    name = "metrale-pack",
    version,
    about = "Repack LLM checkpoints offline into the layouts GPU kernels read, so engines start with one DMA."
)]
struct Cli {
    /// Print no progress, summary or table: errors and warnings only (and what --json asks).
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show a checkpoint's format, metadata, tensors and dense FFN layers.
    Inspect {
        /// A .gguf file (any shard of a split model), a .safetensors file, an index.json, or a directory.
        file: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Convert a checkpoint (GGUF, safetensors file or directory) into a pack: one GGUF v3 file
    /// with every tensor that is not an FFN weight copied byte for byte, and for each dense FFN
    /// layer the chosen layouts. Every tensor the engine uploads lies in one contiguous device
    /// segment in layer order (all but those --host-tensors names).
    ///
    /// Default layouts: what keeps the source's format (block FP8: fp8; NVFP4: the NVFP4 set);
    /// for float sources nvfp4,nvfp4_mmq (SiLU) or nvfp4,nvfp4_t (GELU). A set that would
    /// quantize already-quantized weights again stops before writing unless --allow-requantize.
    Convert {
        /// The checkpoint: a GGUF file, a safetensors file, or a folder of safetensors shards.
        src: PathBuf,
        /// Output pack (default: SRC with extension .mpk.gguf).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Comma-separated layouts: nvfp4, nvfp4_t, nvfp4_mmq, q4k_mmq, fp8, w8a8, bf16, q2g128, lora.
        #[arg(long, value_delimiter = ',')]
        layouts: Option<Vec<String>>,
        /// How q4k_mmq stores the down projection: int8 (per-row scales) or q4k. Default: q4k
        /// when every down projection of the source is Q4_K (its bytes kept), else int8.
        #[arg(long)]
        q4k_down: Option<String>,
        /// A PEFT LoRA adapter directory for gate/up/down (adds the lora layout; needs nvfp4).
        #[arg(long)]
        lora: Option<PathBuf>,
        #[command(flatten)]
        flags: Flags,
    },
    /// Check a pack: every tensor's checksum; with --source, re-derive every tensor from the
    /// source checkpoint and compare bit for bit.
    Verify {
        /// The pack.
        pack: PathBuf,
        /// The checkpoint it was converted from: every tensor re-derived and compared.
        #[arg(long)]
        source: Option<PathBuf>,
        /// Print every check's result as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Check every GPU kernel and layer arm against the host reference on the first CUDA device
    /// (prints a table; exits 1 on any failure; without a GPU says SKIPPED and exits 77).
    GpuCheck {
        /// Only the SmolLM2 shape and small row counts.
        #[arg(long)]
        quick: bool,
        /// Also convert this checkpoint (e.g. the real SmolLM2 GGUF; repeatable) whole, load the
        /// pack by every I/O mode and check it.
        #[arg(long)]
        load_source: Vec<PathBuf>,
        /// Only these sections (comma-separated: kernels, layers, load); default all. With
        /// compute-sanitizer, one section or arm group per run keeps each run short.
        #[arg(long, value_delimiter = ',')]
        sections: Option<Vec<String>>,
        /// Only the layer arms whose name contains one of these (comma-separated, e.g.
        /// `bf16,fp8 fused`).
        #[arg(long, value_delimiter = ',')]
        arms: Option<Vec<String>>,
    },
    /// GPU benchmarks: decode bandwidth and prefill TFLOP/s per arm, against the copy ceiling.
    BenchGpu,
    /// Generate a llama-shaped GGUF of random weights (benchmarks, GPU runs): FFN layers, or with
    /// --whole also attention, an output head and a real-sized vocabulary.
    #[command(hide = true)]
    GenModel {
        /// The GGUF to write.
        out: PathBuf,
        /// Hidden size.
        hidden: usize,
        /// Intermediate (FFN) size.
        inter: usize,
        /// FFN layers.
        layers: usize,
        /// F32, F16, BF16, Q8_0, Q4_0, Q4_1 or Q4_K.
        #[arg(value_name = "TYPE")]
        ty: String,
        /// llama (SiLU) or gemma (GELU).
        #[arg(default_value = "llama")]
        arch: String,
        /// Add attention (q, k, v, output and its norm per layer) and the output head.
        #[arg(long)]
        whole: bool,
        /// Vocabulary size of a whole model.
        #[arg(long, default_value_t = 128256)]
        vocab: usize,
        /// Rows of attn_k and attn_v of a whole model (KV heads x head size).
        #[arg(long, default_value_t = 1024)]
        kv_dim: usize,
        /// Head size of a whole model (heads = hidden / head size, KV heads = kv-dim / head size).
        #[arg(long, default_value_t = 128)]
        head_dim: usize,
    },
    /// Seconds to ready: load a pack's device segment and install its overlays on the GPU, warm
    /// and cold, against the pinned host-to-device ceiling measured in the same run; with
    /// --source, the start-up an engine without packs pays (read, build the overlays, upload).
    BenchLoad {
        /// The pack to load.
        pack: PathBuf,
        /// Its checkpoint, for the start-up without packs.
        #[arg(long)]
        source: Option<PathBuf>,
        /// auto, register, staged, hybrid or pageable.
        #[arg(long, default_value = "auto")]
        io: String,
        /// Also time other loader settings (staging ring sizes and reader counts, pieced
        /// registration on several threads), warm, and print each.
        #[arg(long)]
        sweep: bool,
        /// First measure where the time goes: each rate a copy path is built from, alone.
        #[arg(long)]
        probe: bool,
        /// Print the runs as one JSON object on stdout (each run's line goes to stderr); without
        /// a GPU, `{"skipped": reason}` and exit 77.
        #[arg(long)]
        json: bool,
        /// Sleep this many milliseconds before each timed load (a load after idle, against
        /// loads back to back).
        #[arg(long, default_value_t = 0)]
        pause_ms: u64,
        /// Read the staging ring's first chunks whole, as later ones (default: growing from
        /// chunk / readers, so the first copy starts sooner).
        #[arg(long)]
        no_ramp: bool,
        /// Build the forward context (and load the kernel modules) after the copy instead of
        /// beside it.
        #[arg(long)]
        side_after: bool,
    },
    /// Every arm of the recorded layers, loaded from PACK, on real activations (INPUTS/layerN.npy:
    /// f32 [tokens, hidden] FFN inputs, e.g. from `scripts/quality_kl.py --record`) against the
    /// float64 FFN of SOURCE's weights, beside the same arm on random activations of the same
    /// row norms (needs a GPU; without one says SKIPPED and exits 77).
    CheckActivations {
        /// The pack.
        pack: PathBuf,
        /// The checkpoint it was converted from (the float64 reference's weights).
        #[arg(long)]
        source: PathBuf,
        /// The recorded FFN inputs (a folder of per-layer .npy files).
        #[arg(long)]
        inputs: PathBuf,
        /// Comma-separated layers (default: every recorded one).
        #[arg(long, value_delimiter = ',')]
        layers: Vec<usize>,
        /// At most this many rows per layer.
        #[arg(long, default_value_t = 512)]
        max_rows: usize,
    },
    /// The tensor-parallel layer: convert SOURCE with --tp 1 and --tp N, then run every arm of
    /// one layer at each m on N GPUs (rank r on GPU r, partial outputs summed by NCCL), against
    /// the float64 FFN and the one-GPU pack's arm; per-call times with the all-reduce on its own.
    TpCheck {
        /// The checkpoint to convert at --tp N and at --tp 1.
        source: PathBuf,
        /// Ranks (one GPU each).
        #[arg(long)]
        tp: u32,
        /// Comma-separated layouts (default: the model's defaults).
        #[arg(long, value_delimiter = ',')]
        layouts: Option<Vec<String>>,
        /// The FFN layer checked.
        #[arg(long, default_value_t = 0)]
        layer: usize,
        /// Rows per call.
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,8,16,64,512")]
        ms: Vec<usize>,
        /// Timed calls per row (median); 0: no timing.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// Where the two packs are written (default: a folder under the temp dir).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// N host backends summed on the host instead of GPUs and NCCL.
        #[arg(long)]
        host: bool,
        /// A PEFT adapter (adds the lora layout and the arm "nvfp4 + lora").
        #[arg(long)]
        lora: Option<PathBuf>,
    },
    /// Seconds to ready of each rank of TP_PACK, every rank loading at once on its own GPU,
    /// against ONE_PACK (the same model at --tp 1) on GPU 0 and the pinned ceiling measured on
    /// every GPU at once.
    BenchLoadTp {
        /// The tensor-parallel pack.
        tp_pack: PathBuf,
        /// The same model converted at --tp 1.
        one_pack: PathBuf,
        /// Comma-separated copy modes the ranks load with, each timed in turn: auto, register,
        /// staged, pageable, or hybrid:F (the registered share F of each rank's bytes).
        #[arg(long, value_delimiter = ',', default_value = "auto")]
        modes: Vec<String>,
    },
    /// Layer LAYER's FFN from PACK by one arm (as check-activations names it) on the rows of INPUT
    /// (f32 [rows, hidden] .npy), written to OUTPUT (.npy): for a model run that takes the arm's
    /// outputs in place of its FFN (`scripts/quality_kl.py --arms`). Runs on the first GPU, or on
    /// the host backend without one.
    #[command(hide = true)]
    FfnApply {
        /// The pack.
        pack: PathBuf,
        /// The FFN layer.
        #[arg(long)]
        layer: usize,
        /// The arm, as check-activations names it.
        #[arg(long)]
        arm: String,
        /// The input rows: f32 [rows, hidden] .npy.
        input: PathBuf,
        /// The output .npy to write.
        output: PathBuf,
    },
    /// Write a pack's device tensors as U8 tensors of one safetensors file: the same bytes, for the
    /// peers of bench-load (`scripts/peer_loaders.py`).
    #[command(hide = true)]
    ExportSegment {
        /// The pack.
        pack: PathBuf,
        /// The safetensors file to write.
        out: PathBuf,
    },
    /// Every layout a pack can hold: bits per weight, the forward kinds it serves, what it
    /// needs beside it, its error on a generated layer (measured now) and which source formats
    /// it keeps as they are.
    Layouts,
    /// Print a completion script for SHELL on stdout (e.g. `metrale-pack completions bash >
    /// ~/.local/share/bash-completion/completions/metrale-pack`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Write one tensor to a .npy file: decoded to f32 in its logical shape, or its stored bytes.
    Dump {
        /// A checkpoint (GGUF or safetensors) or a pack.
        file: PathBuf,
        /// Tensor name. For a quantized FFN weight (ModelOpt/compressed-tensors NVFP4, FP8) name
        /// its main tensor (`...weight` / `...weight_packed`): the scales are applied.
        tensor: String,
        /// Output .npy path.
        #[arg(short, long)]
        output: PathBuf,
        /// Write the stored bytes as a 1-D u8 array instead of decoding.
        #[arg(long)]
        raw: bool,
    },
}

/// The library's log level: `RUST_LOG`'s global level (`error`, `warn`, `info`, `debug`,
/// `trace`; per-module filters are not read), warnings by default.
fn log_level() -> tracing::Level {
    std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| {
            v.split(',')
                .filter(|d| !d.contains('='))
                .filter_map(|d| d.trim().parse().ok())
                .next_back()
        })
        .unwrap_or(tracing::Level::WARN)
}

fn main() -> std::process::ExitCode {
    atomic::remove_temp_on_signal();
    // The library's warnings (a kernel compiled with NVRTC at run time, a copy path that fell
    // back) as one plain line each on stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(log_level())
        .with_target(false)
        .without_time()
        .init();
    let cli = {
        use clap::{CommandFactory, FromArgMatches};
        let long = format!(
            "{} (commit {}; features: {}; writes pack format {}, kernel ABI {}, target {})",
            env!("CARGO_PKG_VERSION"),
            env!("METRALE_GIT_COMMIT"),
            if cfg!(feature = "harness") {
                "harness"
            } else {
                "none"
            },
            pack::PACK_FORMAT_VERSION,
            pack::KERNEL_ABI_VERSION,
            pack::TARGET_ARCH,
        );
        // Built once per process; clap keeps a &'static str.
        let long: &'static str = Box::leak(long.into_boxed_str());
        let m = Cli::command().long_version(long).get_matches();
        Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
    };
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A closed stdout (`inspect ... | head`) is not an error.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) if e.downcast_ref::<Skipped>().is_some() => {
            println!("{e}");
            std::process::ExitCode::from(EXIT_SKIPPED)
        }
        Err(e) => {
            // One line: the error and its causes. A backtrace only on request (the release
            // binary is stripped, so RUST_BACKTRACE alone would print frames without names).
            // Escaped: the message may quote names and keys read from a file.
            eprintln!("error: {}", term::escape(&format!("{e:#}")));
            if std::env::var_os("METRALE_BACKTRACE").is_some() {
                eprintln!("{}", e.backtrace());
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let quiet = cli.quiet;
    match cli.cmd {
        Cmd::Inspect { file, json } => inspect(&file, json),
        Cmd::Dump {
            file,
            tensor,
            output,
            raw,
        } => dump(&file, &tensor, &output, raw),
        Cmd::Convert {
            src,
            output,
            layouts,
            q4k_down,
            lora,
            flags,
        } => convert::convert(
            &src,
            output,
            layouts,
            q4k_down.as_deref(),
            lora,
            flags,
            quiet,
        ),
        Cmd::Verify { pack, source, json } => verify::verify(&pack, source.as_deref(), json, quiet),
        Cmd::GpuCheck {
            quick,
            load_source,
            sections,
            arms,
        } => gpu_check(quick, &load_source, sections, arms),
        Cmd::BenchGpu => bench_gpu(),
        Cmd::GenModel {
            out,
            hidden,
            inter,
            layers,
            ty,
            arch,
            whole,
            vocab,
            kv_dim,
            head_dim,
        } => {
            use metrale_pack::testing::gen_model::{Whole, gen_model_with};
            let t = metrale_pack::GgmlType::from_name(&ty)
                .with_context(|| format!("unknown type {ty}"))?;
            let whole = whole.then_some(Whole {
                vocab,
                kv_dim,
                head_dim,
            });
            Ok(gen_model_with(
                &out, hidden, inter, layers, t, &arch, whole,
            )?)
        }
        Cmd::BenchLoad {
            pack,
            source,
            io,
            sweep,
            probe,
            json,
            pause_ms,
            no_ramp,
            side_after,
        } => bench_load(
            &pack,
            source.as_deref(),
            &io,
            metrale_pack::check::bench_load::BenchFlags {
                sweep,
                probe,
                json,
                pause: std::time::Duration::from_millis(pause_ms),
                ramp: !no_ramp,
                side_after,
            },
        ),
        Cmd::ExportSegment { pack, out } => export_segment(&pack, &out),
        Cmd::Layouts => layouts::layouts(&mut std::io::stdout().lock()),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            let mut c = Cli::command();
            clap_complete::generate(shell, &mut c, "metrale-pack", &mut std::io::stdout());
            Ok(())
        }
        Cmd::FfnApply {
            pack,
            layer,
            arm,
            input,
            output,
        } => ffn_apply(&pack, layer, &arm, &input, &output),
        Cmd::TpCheck {
            source,
            tp,
            layouts,
            layer,
            ms,
            iters,
            dir,
            host,
            lora,
        } => tp::tp_check(&source, tp, layouts, layer, &ms, iters, dir, (host, lora)),
        Cmd::BenchLoadTp {
            tp_pack,
            one_pack,
            modes,
        } => tp::bench_load_tp(&tp_pack, &one_pack, &modes),
        Cmd::CheckActivations {
            pack,
            source,
            inputs,
            layers,
            max_rows,
        } => {
            let b = cuda_or_skip()?;
            let rows = metrale_pack::check::activations::activation_checks(
                b,
                &pack,
                &source,
                &inputs,
                &layers,
                max_rows,
                &mut metrale_pack::testing::Rand(7),
            )?;
            metrale_pack::check::activations::print_activation_table(&rows);
            Ok(())
        }
    }
}

fn dump(path: &Path, name: &str, out: &Path, raw: bool) -> Result<()> {
    atomic::refuse_inputs(out, &Model::open(path)?.input_paths())?;
    match pack::dump_tensor(path, name, raw)? {
        pack::Dumped::Raw(data) => {
            atomic::write_atomic(out, |w| -> Result<()> {
                Ok(npy::write_u8(w, &[data.len()], &data)?)
            })?;
            eprintln!(
                "wrote {} stored bytes of {name} to {}",
                data.len(),
                out.display()
            );
        }
        pack::Dumped::F32 {
            values,
            shape,
            layout,
        } => {
            atomic::write_atomic(out, |w| -> Result<()> {
                Ok(npy::write_f32(w, &shape, &values)?)
            })
            .with_context(|| format!("writing {}", out.display()))?;
            let how = if layout { " (decoded layout)" } else { "" };
            eprintln!("wrote {name} {shape:?} f32{how} to {}", out.display());
        }
    }
    Ok(())
}

/// The exit status of a command that needs a GPU on a machine without one (automake's and
/// CTest's "skipped"): scripts tell a skip from a pass (0) and a failure (1).
pub const EXIT_SKIPPED: u8 = 77;

/// A command skipped for want of a device: `SKIPPED: reason` on stdout (with `json`, the object
/// `{"skipped": reason}`), exit [`EXIT_SKIPPED`].
#[derive(Debug)]
pub struct Skipped {
    /// Why.
    pub reason: String,
    /// Say it as JSON (a command run with `--json`).
    pub json: bool,
}

impl Skipped {
    /// Skipped for `reason`, said in words.
    pub fn new(reason: impl Into<String>) -> Skipped {
        Skipped {
            reason: reason.into(),
            json: false,
        }
    }
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.json {
            write!(f, "{}", serde_json::json!({ "skipped": self.reason }))
        } else {
            write!(f, "SKIPPED: {}", self.reason)
        }
    }
}

impl std::error::Error for Skipped {}

fn cuda_or_skip() -> Result<std::sync::Arc<metrale_pack::gpu::cuda::CudaBackend>> {
    let t = std::time::Instant::now();
    match metrale_pack::gpu::cuda::CudaBackend::new(0) {
        Ok(b) => {
            use metrale_pack::gpu::{GpuBackend, staging};
            let prepinned = b
                .staging_pool()
                .is_some_and(|p| p.holds(staging::PREPIN_BUFFER_BYTES));
            let o = b.open_times();
            eprintln!(
                "device: {} ({}), opened in {:.3} s (driver {:.3}, staging populated {:.3} beside it, waited {:.3}, registered {:.3}), staging ring {}",
                b.name(),
                b.arch(),
                t.elapsed().as_secs_f64(),
                o.driver,
                o.populate,
                o.waited,
                o.register,
                if prepinned {
                    "pinned while the driver started"
                } else {
                    "not pinned (METRALE_PREPIN=0 or refused)"
                }
            );
            Ok(std::sync::Arc::new(b))
        }
        Err(e) => Err(Skipped::new(e.to_string()).into()),
    }
}

fn bench_gpu() -> Result<()> {
    let b = cuda_or_skip()?;
    let mut rng = metrale_pack::testing::Rand(7);
    let bb = b.clone();
    metrale_pack::check::benchmarks(b, move |n| bb.copy_ceiling(n), &mut rng)?;
    Ok(())
}

/// Drop a file's pages from the page cache (where the kernel allows it).
fn parse_io(io: &str) -> Result<metrale_pack::loader::IoMode> {
    use metrale_pack::loader::IoMode;
    Ok(match io {
        "auto" => IoMode::Auto,
        "register" => IoMode::Register,
        "staged" => IoMode::Staged,
        "hybrid" => IoMode::Hybrid,
        "pageable" => IoMode::Pageable,
        other => {
            anyhow::bail!("--io must be auto, register, staged, hybrid or pageable, not {other:?}")
        }
    })
}

fn bench_load(
    path: &Path,
    source: Option<&Path>,
    io: &str,
    flags: metrale_pack::check::bench_load::BenchFlags,
) -> Result<()> {
    let io = parse_io(io)?;
    let json = flags.json;
    if json && flags.probe {
        anyhow::bail!("--probe prints its rates as lines: run it without --json");
    }
    let b = cuda_or_skip().map_err(|e| match e.downcast::<Skipped>() {
        Ok(s) => Skipped { json, ..s }.into(),
        Err(e) => e,
    })?;
    let report = metrale_pack::check::bench_load::bench_load(&b, path, source, io, flags)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

fn export_segment(path: &Path, out: &Path) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let p = Pack::open(path)?;
    atomic::refuse_inputs(out, &[path.to_path_buf()])?;
    let views: Vec<(String, TensorView)> = p
        .manifest
        .tensors
        .iter()
        .enumerate()
        .filter(|(_, e)| e.device)
        .map(|(i, e)| {
            Ok((
                e.name.to_string(),
                TensorView::new(Dtype::U8, vec![p.data(i).len()], p.data(i))?,
            ))
        })
        .collect::<Result<_>>()?;
    let n = views.len();
    atomic::write_atomic(out, |w| -> Result<()> {
        let bytes = safetensors::serialize(views, None)?;
        w.write_all(&bytes)?;
        Ok(())
    })?;
    eprintln!(
        "wrote {n} device tensors of {} to {}",
        path.display(),
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every command, hidden ones included, says what it does, and every argument what it is.
    #[test]
    fn every_command_and_argument_is_described() {
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", c.get_name());
            if c.get_about().is_none() && path.contains(' ') && c.get_name() != "help" {
                missing.push(format!("{path}: no about"));
            }
            for a in c.get_arguments() {
                let id = a.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for s in c.get_subcommands() {
                walk(s, &path, missing);
            }
        }
        let mut missing = Vec::new();
        let c = Cli::command();
        for s in c.get_subcommands() {
            walk(s, "metrale-pack", &mut missing);
        }
        assert!(missing.is_empty(), "undescribed: {missing:#?}");
    }
}
