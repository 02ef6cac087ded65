//! `metrale-pack tp-check` and `bench-load-tp`: the tensor-parallel layer and load on several
//! GPUs (NCCL), or, with `--host`, on host backends.

use super::*;
use metrale_pack::check::tp::{AllReduce, HostSum, print_tp_table, tp_checks};
use metrale_pack::gpu::GpuBackend;
use metrale_pack::gpu::cuda::CudaBackend;
use std::sync::Arc;

/// The tolerance of a TP row: the one-GPU arm's error, by 1.25, plus 1e-5 (tests/tp_host.rs).
pub(crate) fn tp_row_passes(single: f64, tp: f64) -> bool {
    tp <= 1.25 * single + 1e-5
}

/// CUDA backends on devices 0..n.
fn cuda_backends(n: u32) -> Result<Vec<Arc<CudaBackend>>> {
    (0..n as usize)
        .map(|d| {
            let b = CudaBackend::new(d)?;
            eprintln!("device {d}: {} ({})", b.name(), b.arch());
            Ok(Arc::new(b))
        })
        .collect()
}

/// `tp-check`: convert SOURCE with --tp 1 and --tp N (the layouts given) into DIR, then run
/// every arm of LAYER at each m on N GPUs with NCCL (or N host backends with `--host`); exits
/// non-zero when a row misses its tolerance.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tp_check(
    source: &Path,
    n: u32,
    layouts: Option<Vec<String>>,
    layer: usize,
    ms: &[usize],
    iters: usize,
    dir: Option<PathBuf>,
    (host, lora): (bool, Option<PathBuf>),
) -> Result<()> {
    let tmp = tempfile_dir(dir)?;
    let layouts = super::parse_layouts(layouts)?;
    let model = Model::open(source)?;
    let mut paths = Vec::new();
    for tp in [1, n] {
        let p = tmp.join(format!("tp{tp}.mpk.gguf"));
        let opts = ConvertOptions {
            layouts: layouts.clone(),
            tp,
            lora: lora.clone(),
            ..Default::default()
        };
        let t = std::time::Instant::now();
        pack::convert(&model, &opts, &p, &|_, _| {})?;
        eprintln!("converted --tp {tp} in {:.1} s", t.elapsed().as_secs_f64());
        paths.push(p);
    }
    let (backends, reduce): (Vec<Arc<dyn GpuBackend>>, Box<dyn AllReduce>) = if host {
        let b = (0..n)
            .map(|_| Arc::new(metrale_pack::gpu::host::HostBackend::new()) as Arc<dyn GpuBackend>)
            .collect();
        (b, Box::new(HostSum::new(n as usize)))
    } else {
        let cuda = match cuda_backends(n) {
            Ok(c) => c,
            Err(e) => return Err(crate::Skipped::new(e.to_string()).into()),
        };
        let nccl = metrale_pack::gpu::nccl::Nccl::new(&cuda)?;
        let b = cuda.into_iter().map(|c| c as Arc<dyn GpuBackend>).collect();
        (b, Box::new(nccl))
    };
    let rows = tp_checks(
        &backends,
        reduce.as_ref(),
        &paths[1],
        &paths[0],
        source,
        layer,
        ms,
        iters,
        &mut metrale_pack::testing::Rand(0x7e5701),
    )?;
    print_tp_table(&rows, n as usize);
    // The fixed path on every rank: a row alone gives its bits inside a batch of 8.
    let mut invariant = true;
    for (r, b) in backends.iter().enumerate() {
        let mut rng = metrale_pack::testing::Rand(0x1f + r as u64);
        let inv = metrale_pack::check::tp::fixed_invariance(
            b.clone(),
            &paths[1],
            (r as u32, n),
            layer,
            8,
            &mut rng,
        )?;
        for (arm, compared, differ) in inv {
            println!("rank {r} {arm}: {compared} rows alone against a batch of 8: {differ} differ");
            invariant &= differ == 0;
        }
    }
    anyhow::ensure!(
        invariant,
        "tp-check: the fixed path is not batch-invariant on a rank"
    );
    let pass = rows
        .iter()
        .filter(|r| tp_row_passes(r.single, r.tp))
        .count();
    println!(
        "tp-check: {pass} of {} rows within 1.25 x the TP=1 error + 1e-5 ({} arms, TP = {n}, {})",
        rows.len(),
        {
            let mut a: Vec<_> = rows.iter().map(|r| r.arm).collect();
            a.dedup();
            a.len()
        },
        if host { "host backends" } else { "NCCL" }
    );
    anyhow::ensure!(pass == rows.len() && !rows.is_empty(), "tp-check failed");
    Ok(())
}

fn tempfile_dir(dir: Option<PathBuf>) -> Result<PathBuf> {
    let d = dir.unwrap_or_else(|| std::env::temp_dir().join("metrale-tp-check"));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// `bench-load-tp`: every rank of TP_PACK loading at once on its own GPU against ONE_PACK.
pub(crate) fn bench_load_tp(tp: &Path, one: &Path, modes: &[String]) -> Result<()> {
    let modes = modes
        .iter()
        .map(|m| {
            let (io, f) = m.split_once(':').unwrap_or((m, ""));
            let mut o = metrale_pack::loader::LoadOptions {
                io: super::parse_io(io)?,
                ..Default::default()
            };
            if !f.is_empty() {
                o.hybrid_fraction = f.parse().with_context(|| format!("--modes {m}"))?;
            }
            Ok((m.clone(), o))
        })
        .collect::<Result<Vec<_>>>()?;
    let n = Pack::open(tp)?
        .manifest
        .tp
        .as_ref()
        .map(|t| t.ranks)
        .with_context(|| format!("{}: not a tensor-parallel pack", tp.display()))?;
    let cuda = match cuda_backends(n) {
        Ok(c) => c,
        Err(e) => return Err(crate::Skipped::new(e.to_string()).into()),
    };
    metrale_pack::check::bench_load::bench_load_tp(&cuda, tp, one, &modes)?;
    Ok(())
}
