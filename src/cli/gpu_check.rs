//! `gpu-check`: every kernel and layer arm on the device against its CPU twin and a float64
//! reference, printed part by part.

use super::cuda_or_skip;
use anyhow::Result;
use std::path::PathBuf;

/// Run the selected sections' checks (`kernels`, `layers`, `load`; all by default; the layer
/// arms whose name contains one of `arms`), printing each part's rows as it ends; an error if any
/// row failed.
pub(crate) fn gpu_check(
    quick: bool,
    load_source: &[PathBuf],
    sections: Option<Vec<String>>,
    arms: Option<Vec<String>>,
) -> Result<()> {
    use metrale_pack::check::{self, M_SET, SHAPES};
    const SECTIONS: [&str; 3] = ["kernels", "layers", "load"];
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
    let t0 = std::time::Instant::now();
    let (shapes, ms): (&[(usize, usize)], &[usize]) = if quick {
        (&SHAPES[..1], &M_SET[..8])
    } else {
        (&SHAPES, &M_SET)
    };
    let mut rows = Vec::new();
    // Each part's rows print as it ends, so a run cut short by a time limit keeps them.
    let mut printed = 0;
    let mut flush = |rows: &Vec<check::Row>, part: &str| {
        if printed == 0 {
            check::print_header();
        }
        check::print_rows(&rows[printed..]);
        eprintln!(
            "gpu-check: {part} done, {} rows, {:.1} s",
            rows.len() - printed,
            t0.elapsed().as_secs_f64()
        );
        printed = rows.len();
    };
    if want("kernels") {
        rows.extend(check::kernel_checks(b.clone(), shapes, ms, &mut rng)?);
        flush(&rows, "kernels");
    }
    if want("layers") {
        rows.extend(check::layer_checks_of(
            b.clone(),
            &SHAPES[..1],
            ms,
            &mut rng,
            keep,
        )?);
        flush(&rows, "layers");
        if !quick {
            rows.extend(check::layer_checks_of(
                b.clone(),
                &SHAPES[1..],
                &[1, 2, 3, 5, 17, 33],
                &mut rng,
                keep,
            )?);
            flush(&rows, "layers, other shapes");
        }
    }
    use metrale_pack::loader::IoMode;
    if want("load") {
        rows.extend(check::load_checks(
            b.clone(),
            SHAPES[0].0,
            SHAPES[0].1,
            &[IoMode::Register, IoMode::Staged],
            &mut rng,
        )?);
        flush(&rows, "load");
        // Each checkpoint converted whole and loaded by every I/O mode.
        for src in load_source {
            rows.extend(check::load_checks_from(
                b.clone(),
                src,
                &[
                    IoMode::Register,
                    IoMode::Staged,
                    IoMode::Hybrid,
                    IoMode::Pageable,
                    IoMode::Auto,
                ],
                &mut rng,
            )?);
            flush(&rows, "load from a checkpoint");
        }
    }
    anyhow::ensure!(!rows.is_empty(), "gpu-check: the filters select no check");
    eprintln!("checks took {:.1} s", t0.elapsed().as_secs_f64());
    anyhow::ensure!(check::print_summary(&rows), "GPU check failed");
    Ok(())
}
