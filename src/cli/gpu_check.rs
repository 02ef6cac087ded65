//! `gpu-check`: every kernel and layer arm on the device against its CPU twin and a float64
//! reference, printed part by part.

use super::cuda_or_skip;
use anyhow::Result;
use metrale_pack::check::{self, M_SET, SHAPES};
use std::path::PathBuf;

/// The sections `gpu-check --sections` knows.
const SECTIONS: [&str; 3] = ["kernels", "layers", "load"];

/// Prints each part's rows as it ends, so a run cut short by a time limit keeps them.
struct Parts {
    printed: usize,
    t0: std::time::Instant,
}

impl Parts {
    /// Print the rows added since the last part (the header before the first), and the part's
    /// row count and time to stderr.
    fn flush(&mut self, rows: &[check::Row], part: &str) {
        if self.printed == 0 {
            check::print_header();
        }
        check::print_rows(&rows[self.printed..]);
        eprintln!(
            "gpu-check: {part} done, {} rows, {:.1} s",
            rows.len() - self.printed,
            self.t0.elapsed().as_secs_f64()
        );
        self.printed = rows.len();
    }
}

/// Run the selected sections' checks (`kernels`, `layers`, `load`; all by default; the layer
/// arms and kernel groups whose name contains one of `arms`), printing each part's rows as it ends; an error if any
/// row failed.
pub(crate) fn gpu_check(
    quick: bool,
    load_source: &[PathBuf],
    sections: Option<Vec<String>>,
    arms: Option<Vec<String>>,
) -> Result<()> {
    if let Some(bad) = sections
        .iter()
        .flatten()
        .find(|s| !SECTIONS.contains(&s.as_str()))
    {
        anyhow::bail!(
            "gpu-check --sections: unknown section {bad:?} (known: kernels, layers, load)"
        );
    }
    let b = cuda_or_skip()?;
    let want = |s: &str| sections.as_ref().is_none_or(|v| v.iter().any(|x| x == s));
    let keep = |arm: &str| {
        arms.as_ref()
            .is_none_or(|v| v.iter().any(|x| arm.contains(x.as_str())))
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    eprintln!("seed {seed}");
    let mut rng = metrale_pack::testing::Rand(seed);
    let mut parts = Parts {
        printed: 0,
        t0: std::time::Instant::now(),
    };
    let (shapes, ms): (&[(usize, usize)], &[usize]) = if quick {
        (&SHAPES[..1], &M_SET[..8])
    } else {
        (&SHAPES, &M_SET)
    };
    let mut rows = Vec::new();
    if want("kernels") {
        rows.extend(check::kernel_checks(
            b.clone(),
            shapes,
            ms,
            &mut rng,
            &keep,
        )?);
        parts.flush(&rows, "kernels");
    }
    if want("layers") {
        let bl = b.clone();
        rows.extend(check::layer_checks_of(
            bl,
            &SHAPES[..1],
            ms,
            &mut rng,
            keep,
        )?);
        parts.flush(&rows, "layers");
        if !quick {
            let (bl, ms) = (b.clone(), &[1, 2, 3, 5, 17, 33]);
            rows.extend(check::layer_checks_of(
                bl,
                &SHAPES[1..],
                ms,
                &mut rng,
                keep,
            )?);
            parts.flush(&rows, "layers, other shapes");
        }
    }
    if want("load") {
        load_rows(&b, load_source, &mut rng, &mut rows, &mut parts)?;
    }
    anyhow::ensure!(!rows.is_empty(), "gpu-check: the filters select no check");
    eprintln!("checks took {:.1} s", parts.t0.elapsed().as_secs_f64());
    anyhow::ensure!(check::print_summary(&rows), "GPU check failed");
    Ok(())
}

/// The load section: a generated pack by the registered and staged reads, then each
/// checkpoint of `load_source` converted whole and loaded by every I/O mode.
fn load_rows(
    b: &std::sync::Arc<metrale_pack::gpu::cuda::CudaBackend>,
    load_source: &[PathBuf],
    rng: &mut metrale_pack::testing::Rand,
    rows: &mut Vec<check::Row>,
    parts: &mut Parts,
) -> Result<()> {
    use metrale_pack::loader::IoMode;
    let (h, i) = SHAPES[0];
    let modes = [IoMode::Register, IoMode::Staged];
    rows.extend(check::load_checks(b.clone(), h, i, &modes, rng)?);
    parts.flush(rows, "load");
    let all = [
        IoMode::Register,
        IoMode::Staged,
        IoMode::Hybrid,
        IoMode::Pageable,
        IoMode::Auto,
    ];
    for src in load_source {
        rows.extend(check::load_checks_from(b.clone(), src, &all, rng)?);
        parts.flush(rows, "load from a checkpoint");
    }
    Ok(())
}
