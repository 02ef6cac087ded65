//! `bench-load`: seconds to ready, warm and cold, against the pinned host-to-device ceiling
//! measured in the same run (moved here from the CLI).

use super::probe_io::warm_page_cache;
use crate::error::{Error, Result};
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::cuda::CudaBackend;
use crate::gpu::{GpuBackend, ModelLevers};
use crate::loader::{self, IoMode, LoadOptions};
use crate::model::Model;
use crate::pack::Pack;
use std::path::Path;
use std::sync::Arc;

/// Drop a file's pages from the page cache (advisory); false when the call fails.
pub fn drop_page_cache(path: &Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: advisory call on a file descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) == 0 }
}

/// `bench-load`: seconds to ready for the pack at `path` loaded with `io` (warm three times,
/// then each path alone with `Auto`, then cold), against the pinned host-to-device ceiling
/// measured in the same run; `sweep` adds the ring, hybrid and registration parameter sweeps;
/// with `source`, the start-up an engine without packs pays (read, build the overlays, upload).
pub fn bench_load(
    b: &Arc<CudaBackend>,
    path: &Path,
    source: Option<&Path>,
    io: IoMode,
    sweep: bool,
    probe: bool,
) -> Result<()> {
    let ceiling = b.pinned_h2d_ceiling(1 << 30)?;
    println!(
        "pinned host-to-device ceiling (1 GiB, 2 streams): {:.1} GB/s",
        ceiling / 1e9
    );
    if probe {
        super::probe_io::probe(b.as_ref(), path)?;
    }
    let bench = LoadBench { b, path, ceiling };
    let with = |io: IoMode| LoadOptions {
        io,
        ..LoadOptions::default()
    };
    // The chosen mode, warm (three runs) and cold; then, with auto, each path alone, warm.
    warm_page_cache(path);
    let mut warm: Vec<f64> = (0..3)
        .map(|_| bench.ready("warm", with(io)))
        .collect::<Result<_>>()?;
    warm.sort_by(f64::total_cmp);
    if io == IoMode::Auto {
        for mode in [IoMode::Register, IoMode::Staged, IoMode::Pageable] {
            for _ in 0..2 {
                bench.ready("warm", with(mode))?;
            }
        }
    }
    if sweep {
        bench.sweep()?;
    }
    bench.cold()?;
    if let Some(src) = source {
        bench.source_baseline(src, warm[1])?;
    }
    Ok(())
}

/// One pack's load benchmark: the backend, the pack, the pinned ceiling measured first.
struct LoadBench<'a> {
    b: &'a Arc<CudaBackend>,
    path: &'a Path,
    ceiling: f64,
}

impl LoadBench<'_> {
    /// Load the pack with `opts`, install every layer (no kernel may run), print one line
    /// labelled `label`: seconds to ready and where they went. Returns the seconds.
    fn ready(&self, label: &str, opts: LoadOptions) -> Result<f64> {
        let r = ready_once(self.b, self.path, &opts)?;
        let (secs, st, ceiling) = (r.secs, &r.stats, self.ceiling);
        let gbs = st.bytes as f64 / st.copy_seconds;
        println!(
            "{label} {:>8.3} s to ready = {:.1}% of the ceiling ({} layers, {} device tensors; open {:.3} alloc {:.3} residency {:.3} copy {:.3} bind {:.3} install {:.3} s), segment {:.2} GB copied at {:.1} GB/s = {:.1}% of the pinned ceiling, mode {:?}{}, {:.0}% resident{}",
            secs,
            100.0 * st.bytes as f64 / secs / ceiling,
            r.layers,
            r.tensors,
            st.open_seconds,
            st.alloc_seconds,
            st.resident_seconds,
            st.copy_seconds,
            st.bind_seconds,
            secs - st.open_seconds
                - st.alloc_seconds
                - st.resident_seconds
                - st.copy_seconds
                - st.bind_seconds,
            st.bytes as f64 / 1e9,
            gbs / 1e9,
            100.0 * gbs / ceiling,
            st.mode,
            if st.direct { " O_DIRECT" } else { "" },
            100.0 * st.resident,
            st.fell_back
                .as_deref()
                .map(|r| format!(" (fell back: {r})"))
                .unwrap_or_default()
        );
        Ok(secs)
    }

    /// The ring, hybrid and registration parameter sweeps, warm.
    fn sweep(&self) -> Result<()> {
        let path = self.path;
        let ready_with = |label: &str, o: LoadOptions| self.ready(label, o);
        warm_page_cache(path);
        let mib = 1usize << 20;
        // The arena backed piece by piece while the copies run, for each path.
        for (io, piece) in [
            (IoMode::Staged, 1024usize),
            (IoMode::Staged, 256),
            (IoMode::Staged, 64),
            (IoMode::Register, 1024),
        ] {
            let o = LoadOptions {
                io,
                map_piece: piece * mib,
                ..LoadOptions::default()
            };
            for _ in 0..3 {
                ready_with(&format!("sweep {io:?} map_piece={piece}MiB"), o.clone())?;
            }
        }
        for (readers, chunk, ring) in [
            (16, 2, 16),
            (16, 2, 8),
            (16, 4, 16),
            (16, 4, 32),
            (16, 8, 16),
            (16, 8, 32),
            (16, 16, 16),
        ] {
            let o = LoadOptions {
                io: IoMode::Staged,
                readers,
                chunk: chunk * mib,
                ring,
                ..LoadOptions::default()
            };
            for _ in 0..2 {
                ready_with(
                    &format!("sweep staged readers={readers} chunk={chunk}MiB ring={ring}"),
                    o.clone(),
                )?;
            }
        }
        for fraction in [0.25, 0.4, 0.55] {
            let o = LoadOptions {
                io: IoMode::Hybrid,
                hybrid_fraction: fraction,
                ..LoadOptions::default()
            };
            for _ in 0..2 {
                ready_with(&format!("sweep hybrid registered={fraction}"), o.clone())?;
            }
        }
        for (piece, threads) in [(1024usize, 1usize), (256, 1), (256, 4), (256, 8), (64, 8)] {
            let o = LoadOptions {
                io: IoMode::Register,
                register_chunk: piece * mib,
                register_threads: threads,
                ..LoadOptions::default()
            };
            for _ in 0..2 {
                ready_with(
                    &format!("sweep register piece={piece}MiB threads={threads}"),
                    o.clone(),
                )?;
            }
        }
        Ok(())
    }

    /// Cold: the page cache dropped before each run.
    fn cold(&self) -> Result<()> {
        let (b, path) = (self.b, self.path);
        let ready_with = |label: &str, o: LoadOptions| self.ready(label, o);
        // Cold: the page cache dropped before each run; the ring with O_DIRECT and through the
        // cache, and registration (which faults the mapping in through the cache); each against the
        // disk's own rate, an O_DIRECT sequential read of the same segment in the same run.
        match super::probe_io::odirect_rate(b.as_ref(), path)? {
            Some(r) => println!(
                "disk: O_DIRECT sequential read of the segment (16 threads, 8 MiB) {:.2} GB/s",
                r
            ),
            None => println!("disk: O_DIRECT refused on this file system"),
        }
        for (mode, direct) in [
            (IoMode::Staged, Some(true)),
            (IoMode::Staged, Some(false)),
            (IoMode::Register, None),
        ] {
            if drop_page_cache(path) {
                ready_with(
                    "cold",
                    LoadOptions {
                        io: mode,
                        direct,
                        ..LoadOptions::default()
                    },
                )?;
            } else {
                println!("cold: could not drop the page cache for {}", path.display());
            }
        }
        Ok(())
    }

    /// The start-up an engine without packs pays: read the source, build the same overlays on
    /// the CPU, upload each tensor (pageable copies); against the median warm load `warm`.
    fn source_baseline(&self, src: &Path, warm: f64) -> Result<()> {
        let (b, path) = (self.b, self.path);
        // The start-up an engine without packs pays: read the source, build the same overlays on
        // the CPU, upload each tensor (pageable copies).
        warm_page_cache(src);
        let t0 = std::time::Instant::now();
        let p = Pack::open(path)?;
        let model = Model::open(src)?;
        let plan = crate::pack::Plan::new(&model, &p.manifest.options)?;
        let mut bytes = 0u64;
        plan.produce(|_, data, entry| {
            if entry.device {
                let d = b.alloc(data.len() as u64)?;
                b.upload(d, data)?;
                bytes += data.len() as u64;
            }
            Ok(())
        })?;
        b.synchronize(0)?;
        let base = t0.elapsed().as_secs_f64();
        println!(
            "source baseline {:>8.3} s to ready ({:.2} GB of overlays built on the CPU and uploaded) = {:.1}x the warm pack load",
            base,
            bytes as f64 / 1e9,
            base / warm
        );
        Ok(())
    }
}

/// One load to ready: seconds, the loader's stats, the layers installed, the device tensors.
struct Ready {
    secs: f64,
    stats: loader::LoadStats,
    layers: usize,
    tensors: usize,
}

/// Load `path` with `opts` and install every layer's overlays (installing may launch no
/// kernel: a pack holds what start-up would build).
fn ready_once(b: &Arc<CudaBackend>, path: &Path, opts: &LoadOptions) -> Result<Ready> {
    let t0 = std::time::Instant::now();
    let lp = loader::load(b.as_ref(), path, opts)?;
    let m = &lp.pack.manifest.model;
    let cfg = FfnConfig {
        hidden: m.hidden_size as usize,
        inter: lp.ffn_inter,
    };
    let act = crate::model::Activation::from_act_name(&m.activation)
        .unwrap_or(crate::model::Activation::Silu);
    let ctx = ForwardContext::new(b.clone(), cfg, 1, ModelLevers::default())?;
    let launches = b.launch_count();
    let mut layers = Vec::new();
    for o in &lp.layers {
        let mut l = DenseFfnLayer::new_with_activation(&ctx, act);
        o.install(&mut l)?;
        layers.push(l);
    }
    if b.launch_count() != launches {
        return Err(Error::Unsupported {
            file: path.display().to_string(),
            reason: "installing overlays launched kernels".into(),
        });
    }
    let secs = t0.elapsed().as_secs_f64();
    let r = Ready {
        secs,
        stats: lp.stats.clone(),
        layers: layers.len(),
        tensors: lp.device_tensors().count(),
    };
    drop(layers);
    b.free(lp.arena);
    drop(ctx);
    Ok(r)
}

/// `bench-load-tp`: seconds to ready of each rank of the tensor-parallel pack `tp`, every rank
/// loading at once on its own GPU, warm (three runs) and cold, against the one-GPU pack `one`
/// on GPU 0 and the pinned host-to-device ceiling measured on each GPU alone and on every GPU
/// at once.
/// Each of `modes` (a label and the load options) is timed in turn for the ranks.
pub fn bench_load_tp(
    backends: &[Arc<CudaBackend>],
    tp: &Path,
    one: &Path,
    modes: &[(String, LoadOptions)],
) -> Result<()> {
    let n = backends.len();
    let alone = backends[0].pinned_h2d_ceiling(1 << 30)?;
    let together: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = backends
            .iter()
            .map(|b| s.spawn(move || b.pinned_h2d_ceiling(1 << 30)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("ceiling thread"))
            .collect::<crate::gpu::GpuResult<_>>()
    })?;
    println!(
        "pinned host-to-device ceiling: GPU 0 alone {:.1} GB/s; all {n} at once {} GB/s",
        alone / 1e9,
        together
            .iter()
            .map(|c| format!("{:.1}", c / 1e9))
            .collect::<Vec<_>>()
            .join(" / ")
    );
    let line = |label: &str, r: usize, secs: f64, st: &loader::LoadStats, ceil: f64| {
        println!(
            "{label} rank {r}: {secs:.3} s to ready, {:.2} GB read, copy {:.3} s = {:.1} GB/s = {:.1}% of its ceiling, ready = {:.1}% ({:?}{})",
            st.bytes as f64 / 1e9,
            st.copy_seconds,
            st.bytes as f64 / st.copy_seconds / 1e9,
            100.0 * st.bytes as f64 / st.copy_seconds / ceil,
            100.0 * st.bytes as f64 / secs / ceil,
            st.mode,
            if st.direct { " O_DIRECT" } else { "" }
        );
    };
    let all_ranks = |label: &str, base: &LoadOptions| -> Result<f64> {
        let res: Vec<Result<(f64, loader::LoadStats)>> = std::thread::scope(|s| {
            let hs: Vec<_> = backends
                .iter()
                .enumerate()
                .map(|(r, b)| {
                    s.spawn(move || {
                        let o = LoadOptions {
                            rank: Some((r as u32, n as u32)),
                            ..base.clone()
                        };
                        ready_once(b, tp, &o).map(|r| (r.secs, r.stats))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect()
        });
        let mut worst = 0f64;
        for (r, x) in res.into_iter().enumerate() {
            let (secs, st) = x?;
            line(label, r, secs, &st, together[r]);
            worst = worst.max(secs);
        }
        Ok(worst)
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    warm_page_cache(one);
    warm_page_cache(tp);
    let mut t1 = Vec::new();
    for _ in 0..3 {
        let Ready {
            secs, stats: st, ..
        } = ready_once(&backends[0], one, &LoadOptions::default())?;
        line("TP=1 warm", 0, secs, &st, alone);
        t1.push(secs);
    }
    let t1 = median(t1);
    for (label, o) in modes {
        let mut tn = Vec::new();
        for _ in 0..3 {
            tn.push(all_ranks(&format!("TP={n} warm {label}"), o)?);
        }
        let tn = median(tn);
        println!(
            "warm: TP=1 {t1:.3} s, TP={n} {label} {tn:.3} s (slowest rank, median of 3) = {:.2}x the TP=1 time",
            tn / t1
        );
    }
    let cold1 = if drop_page_cache(one) {
        let Ready {
            secs, stats: st, ..
        } = ready_once(&backends[0], one, &LoadOptions::default())?;
        line("TP=1 cold", 0, secs, &st, alone);
        Some(secs)
    } else {
        None
    };
    if drop_page_cache(tp) {
        let cold = all_ranks(&format!("TP={n} cold"), &LoadOptions::default())?;
        if let Some(c1) = cold1 {
            println!(
                "cold: TP=1 {c1:.3} s, TP={n} {cold:.3} s (slowest rank) = {:.2}x",
                cold / c1
            );
        }
    }
    Ok(())
}
