//! The command line's dispatch: each subcommand to the function that runs it, and the small
//! subcommands that are one function.

use super::*;

pub(crate) fn run(cli: Cli) -> Result<()> {
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
            options,
            dry_run,
            json,
        } => convert::convert(&src, output, options, (dry_run, json), quiet),
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

pub(crate) fn cuda_or_skip() -> Result<std::sync::Arc<metrale_pack::gpu::cuda::CudaBackend>> {
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
pub(crate) fn parse_io(io: &str) -> Result<metrale_pack::loader::IoMode> {
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
