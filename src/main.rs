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
use convert::parse_layouts;
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
#[path = "cli/args.rs"]
mod args;
use args::{Cli, Cmd};
#[path = "cli/run.rs"]
mod run;
use run::{EXIT_SKIPPED, Skipped, cuda_or_skip, parse_io, run};

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
