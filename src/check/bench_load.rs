//! `bench-load`: seconds to ready, warm and cold, against the pinned host-to-device ceiling
//! measured in the same run (moved here from the CLI).

use super::probe_io::warm_page_cache;
use crate::error::{Error, Result};
use crate::ffn::DenseFfnLayer;
use crate::gpu::cuda::CudaBackend;
use crate::gpu::{GpuBackend, ModelLevers};
use crate::loader::{self, IoMode, LoadOptions, Staging};
use crate::model::Model;
use crate::pack::Pack;
use serde::Serialize;
use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

/// What `bench-load --json` prints: every run of the benchmark, in order, with the ceiling
/// they are measured against. Field names are pinned by a test.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadReport {
    /// The pack loaded.
    pub pack: String,
    /// The pinned host-to-device ceiling (1 GiB, 2 streams) measured first, GB/s.
    pub ceiling_gbs: f64,
    /// Every load to ready, in the order run.
    pub runs: Vec<LoadRun>,
    /// The disk's own rate, an `O_DIRECT` sequential read of the segment, GB/s (`None` when the
    /// file system refuses `O_DIRECT`).
    pub disk_odirect_gbs: Option<f64>,
    /// The start-up without packs (`--source`), if asked for.
    pub source_baseline: Option<SourceBaseline>,
}

/// One load of the pack to ready.
#[derive(Clone, Debug, Serialize)]
pub struct LoadRun {
    /// `warm`, `cold` or the sweep's label.
    pub label: String,
    /// The copy path (`Staged`, `Register`, `Hybrid`, `Pageable`).
    pub mode: String,
    /// Read with `O_DIRECT`.
    pub direct: bool,
    /// Seconds from open to every layer installed.
    pub ready_s: f64,
    /// The segment's bytes over `ready_s`, as a fraction of the ceiling.
    pub ready_of_ceiling: f64,
    /// The device segment's bytes.
    pub segment_bytes: u64,
    /// Where the seconds went.
    pub open_s: f64,
    /// Allocating the arena.
    pub alloc_s: f64,
    /// Making the file's pages resident.
    pub residency_s: f64,
    /// The copy.
    pub copy_s: f64,
    /// Binding the overlays.
    pub bind_s: f64,
    /// Seconds of the blob rules beside the copy (`LoadStats::validate_seconds`).
    pub validate_s: f64,
    /// Seconds of the blob rules after the copy, on the copied bytes
    /// (`LoadStats::validate_after_seconds`).
    pub validate_after_s: f64,
    /// `validate_after_s` over `ready_s`: the rules' share of the load's critical path.
    pub validate_of_ready: f64,
    /// Installing every layer (the rest of `ready_s`).
    pub install_s: f64,
    /// The copy's rate, GB/s.
    pub copy_gbs: f64,
    /// The copy's rate as a fraction of the ceiling.
    pub copy_of_ceiling: f64,
    /// The share of the file resident in the page cache before the load.
    pub resident: f64,
    /// The FFN layers installed.
    pub layers: usize,
    /// The device tensors.
    pub device_tensors: usize,
    /// Why the chosen path fell back to another, if it did.
    pub fell_back: Option<String>,
}

/// The start-up an engine without packs pays.
#[derive(Clone, Debug, Serialize)]
pub struct SourceBaseline {
    /// Seconds to build the overlays on the CPU from the source and upload them.
    pub ready_s: f64,
    /// The bytes uploaded.
    pub bytes: u64,
    /// `ready_s` over the median warm pack load.
    pub x_warm_pack: f64,
}

/// Drop a file's pages from the page cache (advisory); false when the call fails.
pub fn drop_page_cache(path: &Path) -> bool {
    use std::os::unix::io::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: advisory call on a file descriptor we own.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) == 0 }
}

/// What `bench-load` runs beside its warm and cold loads, and how it prints.
#[derive(Clone, Copy, Debug, Default)]
pub struct BenchFlags {
    /// The ring, hybrid and registration parameter sweeps.
    pub sweep: bool,
    /// The rate probes first.
    pub probe: bool,
    /// The report as JSON on stdout (the lines on stderr).
    pub json: bool,
    /// Slept before each timed load.
    pub pause: std::time::Duration,
    /// The ring's first chunks grow (`LoadOptions::ramp`, the default); off, every chunk is
    /// whole.
    pub ramp: bool,
    /// The side job (forward context, kernel modules) after the copy
    /// (`LoadOptions::side_after_copy`).
    pub side_after: bool,
}

/// `bench-load`: seconds to ready for the pack at `path` loaded with `io` (warm three times,
/// then each path alone with `Auto`, then cold), against the pinned host-to-device ceiling
/// measured in the same run; `sweep` adds the ring, hybrid and registration parameter sweeps;
/// with `source`, the start-up an engine without packs pays (read, build the overlays, upload).
/// Returns every run as a [`LoadReport`] (the lines printed as they run: on stdout, or with
/// `json` on stderr; `probe`'s on stdout).
pub fn bench_load(
    b: &Arc<CudaBackend>,
    path: &Path,
    source: Option<&Path>,
    io: IoMode,
    flags: BenchFlags,
) -> Result<LoadReport> {
    let BenchFlags {
        sweep,
        probe,
        json,
        pause,
        ramp,
        side_after,
    } = flags;
    let ceiling = b.pinned_h2d_ceiling(1 << 30)?;
    say(
        json,
        format_args!(
            "pinned host-to-device ceiling (1 GiB, 2 streams): {:.1} GB/s",
            ceiling / 1e9
        ),
    );
    if probe {
        super::probe_io::probe(b.as_ref(), path)?;
    }
    let bench = LoadBench {
        b,
        path,
        ceiling,
        json,
        pause,
        report: RefCell::new(LoadReport {
            pack: path.display().to_string(),
            ceiling_gbs: ceiling / 1e9,
            ..LoadReport::default()
        }),
    };
    let with = |io: IoMode| LoadOptions {
        io,
        ramp,
        side_after_copy: side_after,
        ..LoadOptions::default()
    };
    // The chosen mode, warm (three runs) and cold; then, with auto, each path alone, warm.
    warm_page_cache(path);
    let mut warm: Vec<f64> = (0..3)
        .map(|_| bench.ready("warm", with(io)))
        .collect::<Result<_>>()?;
    warm.sort_by(f64::total_cmp);
    blob_rules_ab(&bench, &with(io), false)?;
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
    Ok(bench.report.into_inner())
}

/// What checking every blob against its layout's rules costs a load: the mode of `opts` with
/// the check on and off, interleaved, three each, warm (or with `cold`, the page cache dropped
/// before each); the medians and their ratio on one line.
fn blob_rules_ab(bench: &LoadBench, opts: &LoadOptions, cold: bool) -> Result<()> {
    let mut t = [Vec::new(), Vec::new()];
    let when = if cold { "cold" } else { "warm" };
    for _ in 0..3 {
        for (i, on) in [true, false].into_iter().enumerate() {
            let label = format!("{when}, blob rules {}", if on { "on" } else { "off" });
            let o = LoadOptions {
                blob_rules: on,
                ..opts.clone()
            };
            if cold && !drop_page_cache(bench.path) {
                say(
                    bench.json,
                    format_args!("cold: could not drop the page cache"),
                );
                return Ok(());
            }
            t[i].push(bench.ready(&label, o)?);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (on, off) = (median(&mut t[0]), median(&mut t[1]));
    say(
        bench.json,
        format_args!(
            "blob rules, {when}: ready {on:.4} s with the check, {off:.4} s without (medians of 3): {:+.2}% of the load",
            100.0 * (on - off) / off
        ),
    );
    Ok(())
}

/// One pack's load benchmark: the backend, the pack, the pinned ceiling measured first, and
/// the report of what ran.
struct LoadBench<'a> {
    b: &'a Arc<CudaBackend>,
    path: &'a Path,
    ceiling: f64,
    json: bool,
    /// Slept before each load.
    pause: std::time::Duration,
    report: RefCell<LoadReport>,
}

/// Where a staged load's ring spent its time, as `bench-load` prints it under the load's line.
fn ring_line(opts: &LoadOptions, t: &loader::RingTimes) -> String {
    let ms = |x: f64| x * 1e3;
    format!(
        "  ring ({:?}, {} x {} MiB, {} readers{}): {} buffers kept, {} pinned (first ready at {:.1} ms, all at {:.1}, pinning {:.1} ms); first copy issued at {:.1} ms, last at {:.1}, drained at {:.1}, released at {:.1}; summed over the readers: wait {:.1}, read {:.1}, issue {:.1} ms",
        opts.staging,
        opts.ring,
        opts.chunk >> 20,
        opts.readers,
        if opts.ramp { ", ramp" } else { "" },
        t.kept,
        t.pinned,
        ms(t.first_buffer),
        ms(t.ring_ready),
        ms(t.pin),
        ms(t.first_issue),
        ms(t.last_issue),
        ms(t.drained),
        ms(t.released),
        ms(t.wait),
        ms(t.read),
        ms(t.issue),
    )
}

/// One line of the benchmark's account: on stdout, or on stderr when stdout carries the JSON
/// report.
fn say(json: bool, line: std::fmt::Arguments) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

impl LoadBench<'_> {
    /// Load the pack with `opts`, install every layer (no kernel may run), print one line
    /// labelled `label`: seconds to ready and where they went. Returns the seconds.
    fn ready(&self, label: &str, opts: LoadOptions) -> Result<f64> {
        std::thread::sleep(self.pause);
        let r = ready_once(self.b, self.path, &opts)?;
        let (secs, st, ceiling) = (r.secs, &r.stats, self.ceiling);
        let gbs = st.bytes as f64 / st.copy_seconds;
        self.report.borrow_mut().runs.push(LoadRun {
            label: label.into(),
            mode: format!("{:?}", st.mode),
            direct: st.direct,
            ready_s: secs,
            ready_of_ceiling: st.bytes as f64 / secs / ceiling,
            segment_bytes: st.bytes,
            open_s: st.open_seconds,
            alloc_s: st.alloc_seconds,
            residency_s: st.resident_seconds,
            copy_s: st.copy_seconds,
            bind_s: st.bind_seconds,
            validate_s: st.validate_seconds,
            validate_after_s: st.validate_after_seconds,
            validate_of_ready: st.validate_after_seconds / secs,
            install_s: secs
                - st.open_seconds
                - st.alloc_seconds
                - st.resident_seconds
                - st.copy_seconds
                - st.bind_seconds
                - st.validate_after_seconds,
            copy_gbs: gbs / 1e9,
            copy_of_ceiling: gbs / ceiling,
            resident: st.resident,
            layers: r.layers,
            device_tensors: r.tensors,
            fell_back: st.fell_back.clone(),
        });
        say(
            self.json,
            format_args!(
                "{label} {:>8.3} s to ready = {:.1}% of the ceiling ({} layers, {} device tensors; open {:.3} alloc {:.3} residency {:.3} copy {:.3} bind {:.3} install {:.3} s; blob rules {:.4} s beside the copy, {:.4} s after it = {:.2}% of ready), segment {:.2} GB copied at {:.1} GB/s = {:.1}% of the pinned ceiling, mode {:?}{}, {:.0}% resident{}",
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
                    - st.bind_seconds
                    - st.validate_after_seconds,
                st.validate_seconds,
                st.validate_after_seconds,
                100.0 * st.validate_after_seconds / secs,
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
            ),
        );
        if let Some(t) = st.ring {
            say(self.json, format_args!("{}", ring_line(&opts, &t)));
        }
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
        for staging in [Staging::Fresh, Staging::Kept] {
            for (chunk, ring) in [
                (8usize, 16usize),
                (4, 16),
                (4, 32),
                (8, 8),
                (16, 8),
                (2, 32),
                (8, 32),
            ] {
                let o = LoadOptions {
                    io: IoMode::Staged,
                    staging,
                    chunk: chunk * mib,
                    ring,
                    ..LoadOptions::default()
                };
                for _ in 0..2 {
                    ready_with(
                        &format!("sweep staged {staging:?} chunk={chunk}MiB ring={ring}"),
                        o.clone(),
                    )?;
                }
            }
        }
        let o = LoadOptions {
            io: IoMode::Staged,
            ramp: false,
            ..LoadOptions::default()
        };
        for _ in 0..2 {
            ready_with("sweep staged whole first chunks (no ramp)", o.clone())?;
        }
        for readers in [8usize, 10, 12, 14] {
            let o = LoadOptions {
                io: IoMode::Staged,
                readers,
                ..LoadOptions::default()
            };
            for _ in 0..2 {
                ready_with(&format!("sweep staged readers={readers}"), o.clone())?;
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
        let rate = super::probe_io::odirect_rate(b.as_ref(), path)?;
        self.report.borrow_mut().disk_odirect_gbs = rate;
        match rate {
            Some(r) => say(
                self.json,
                format_args!(
                    "disk: O_DIRECT sequential read of the segment (16 threads, 8 MiB) {:.2} GB/s",
                    r
                ),
            ),
            None => say(
                self.json,
                format_args!("disk: O_DIRECT refused on this file system"),
            ),
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
                say(
                    self.json,
                    format_args!("cold: could not drop the page cache for {}", path.display()),
                );
            }
        }
        blob_rules_ab(self, &LoadOptions::default(), true)
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
        self.report.borrow_mut().source_baseline = Some(SourceBaseline {
            ready_s: base,
            bytes,
            x_warm_pack: base / warm,
        });
        say(
            self.json,
            format_args!(
                "source baseline {:>8.3} s to ready ({:.2} GB of overlays built on the CPU and uploaded) = {:.1}x the warm pack load",
                base,
                bytes as f64 / 1e9,
                base / warm
            ),
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
    // As `LoadedModel::load` does: the forward context allocated while the segment copies.
    let dynb: Arc<dyn crate::gpu::GpuBackend> = b.clone();
    let (lp, ctx) = loader::load_beside(b.as_ref(), path, opts, |p, inter| {
        loader::forward_context(&dynb, p, inter, 1, ModelLevers::default())
    })?;
    let ctx = match ctx {
        Ok(c) => c,
        Err(e) => {
            b.free(lp.arena);
            return Err(e.into());
        }
    };
    let act = crate::model::Activation::from_act_name(&lp.pack.manifest.model.activation)
        .unwrap_or(crate::model::Activation::Silu);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `bench-load --json`'s field names, as scripts read them (a renamed field fails here).
    #[test]
    fn the_report_keeps_its_field_names() {
        let run = LoadRun {
            label: "warm".into(),
            mode: "Staged".into(),
            direct: false,
            ready_s: 0.25,
            ready_of_ceiling: 0.6,
            segment_bytes: 1 << 30,
            open_s: 0.001,
            alloc_s: 0.002,
            residency_s: 0.0,
            copy_s: 0.2,
            bind_s: 0.001,
            validate_s: 0.002,
            validate_after_s: 0.0004,
            validate_of_ready: 0.0016,
            install_s: 0.046,
            copy_gbs: 5.4,
            copy_of_ceiling: 0.1,
            resident: 1.0,
            layers: 2,
            device_tensors: 9,
            fell_back: None,
        };
        let r = LoadReport {
            pack: "p.mpk.gguf".into(),
            ceiling_gbs: 55.0,
            runs: vec![run],
            disk_odirect_gbs: Some(1.5),
            source_baseline: Some(SourceBaseline {
                ready_s: 3.0,
                bytes: 1 << 30,
                x_warm_pack: 12.0,
            }),
        };
        let v = serde_json::to_value(&r).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        let mut top = keys(&v);
        top.sort();
        assert_eq!(
            top,
            [
                "ceiling_gbs",
                "disk_odirect_gbs",
                "pack",
                "runs",
                "source_baseline"
            ]
        );
        let mut run = keys(&v["runs"][0]);
        run.sort();
        assert_eq!(
            run,
            [
                "alloc_s",
                "bind_s",
                "copy_gbs",
                "copy_of_ceiling",
                "copy_s",
                "device_tensors",
                "direct",
                "fell_back",
                "install_s",
                "label",
                "layers",
                "mode",
                "open_s",
                "ready_of_ceiling",
                "ready_s",
                "residency_s",
                "resident",
                "segment_bytes",
                "validate_after_s",
                "validate_of_ready",
                "validate_s"
            ]
        );
        let mut base = keys(&v["source_baseline"]);
        base.sort();
        assert_eq!(base, ["bytes", "ready_s", "x_warm_pack"]);
    }
}
