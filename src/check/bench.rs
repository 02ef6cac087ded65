//! `bench-gpu`: decode bandwidth and prefill TFLOP/s per arm against the copy ceiling and cuBLAS measured in the same run.

use super::bench_decode::{self, BACK_TO_BACK, DECODE_MS, per_call, probe_time};
use super::*;
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use crate::gpu::{GemmBf16, GpuBackend, GpuResult, ModelLevers, upload_f32};
use crate::testing::*;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

/// Benchmarks; returns printable lines.
pub fn benchmarks(
    b: Arc<dyn GpuBackend>,
    copy_ceiling: impl Fn(u64) -> GpuResult<f64>,
    rng: &mut Rand,
) -> GpuResult<Vec<String>> {
    let mut out = Lines(Vec::new());
    let ceiling = copy_ceiling(4 << 30)?; // bytes read + written per second
    out.push(format!(
        "copy ceiling (device-to-device, 4 GiB, read+write): {:.0} GB/s",
        ceiling / 1e9
    ));
    let (h, i) = (4096usize, 14336usize);
    let w = DenseWeights::random(rng, h, i);
    // METRALE_BENCH_ARMS (comma-separated name parts) limits the per-arm sections, for a
    // profiler run over a few kernels.
    let only: Option<Vec<String>> = std::env::var("METRALE_BENCH_ARMS")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let wanted = |name: &str| {
        only.as_ref()
            .is_none_or(|o| o.iter().any(|p| name.contains(p)))
    };
    // The peer of the decode figures, first: the cuBLAS BF16 layer at m = 1..16.
    let peer = bench_decode::cublas_layer(&b, &w, rng, &mut out)?;
    if wanted("decode kernel") {
        bench_decode::decode_kernels(b.as_ref(), ceiling, rng, &mut out)?;
    }
    for &(name, lines) in KERNEL_LINES.iter() {
        if wanted(name) {
            lines(b.as_ref(), ceiling, rng, &mut |l| out.push(l))?;
        }
    }
    // (arm, m, seconds) of every whole-layer prefill, for the ratios to the BF16 layer.
    let mut prefill_times: Vec<(&str, usize, f64)> = Vec::new();
    for &arm in BENCH_ARMS.iter().filter(|a| wanted(a.name)) {
        let times = Times {
            prefill: &mut prefill_times,
            peer: &peer,
            ceiling,
        };
        bench_arm(&b, arm, &w, rng, &mut out, times)?;
    }
    prefill_ratios(&prefill_times, &mut out);
    finalize_costs(&b, &w, &mut out)?;
    small_shape_decode(&b, rng, &mut out, &wanted)?;
    cublas_peer(b.as_ref(), h, i, &mut out)?;
    Ok(out.0)
}

/// How a bench arm installs its weights.
pub(crate) type Install = fn(&dyn GpuBackend, &mut DenseFfnLayer, &DenseWeights) -> GpuResult<()>;

/// The m = 1 decode chain's weight reads of the arm named by its first argument at hidden `h`,
/// intermediate `i`: one part `(bytes, blocks)` per kernel launch, with its grid's blocks (the
/// streaming probe's parts, `bench_decode::probe_time`).
pub(crate) type Probe = fn(&str, usize, usize) -> Vec<(u64, usize)>;

/// One benchmarked arm: how its weights are installed, its levers, and what is timed: decode
/// (with the weight bytes per element its bandwidth figure counts, and the streaming probe of
/// its kernels' reads where it has one: none for the arms whose decode quantizes the
/// activations first) and the prefill GEMMs.
pub(crate) struct BenchArm {
    pub(crate) name: &'static str,
    pub(crate) install: Install,
    pub(crate) levers: &'static [(&'static str, &'static str)],
    /// Weight bytes per element, when the decode chain is timed.
    pub(crate) decode: Option<f64>,
    pub(crate) prefill: bool,
    pub(crate) probe: Option<Probe>,
}

/// A bench arm without a probe.
pub(crate) const fn bench(
    name: &'static str,
    install: Install,
    levers: &'static [(&'static str, &'static str)],
    decode: Option<f64>,
    prefill: bool,
) -> BenchArm {
    BenchArm {
        name,
        install,
        levers,
        decode,
        prefill,
        probe: None,
    }
}

impl BenchArm {
    /// The arm with its decode chain's streaming probe.
    pub(crate) const fn probe(mut self, probe: Probe) -> BenchArm {
        self.probe = Some(probe);
        self
    }
}

/// A layout's kernel lines (`(name, lines)`: `METRALE_BENCH_ARMS` selects them by `name`):
/// its kernels alone against the copy `ceiling`, each line pushed as it is measured.
pub(crate) type KernelLines = (
    &'static str,
    fn(&dyn GpuBackend, f64, &mut Rand, &mut dyn FnMut(String)) -> GpuResult<()>,
);

/// One arm of the SmolLM2-shape decode section: its name, installation and levers.
pub(crate) struct SmallArm {
    pub(crate) name: &'static str,
    pub(crate) install: Install,
    pub(crate) levers: &'static [(&'static str, &'static str)],
}

/// Generates [`BENCH_ARMS`], [`KERNEL_LINES`] and [`SMALL_ARMS`] from the list of built-in layouts
/// (`layouts::builtin_layouts!`).
macro_rules! bench_arms {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        /// Every arm `bench-gpu` times, in the order it prints them: each built-in layout's
        /// (`src/layouts/TAG/bench.rs`), in `Layout` order.
        static BENCH_ARMS: LazyLock<Vec<&'static BenchArm>> = LazyLock::new(|| {
            let mut v = Vec::new();
            $(v.extend(crate::layouts::$t::bench::ARMS.iter());)*
            v
        });
        /// Every layout's kernel lines, in `Layout` order.
        static KERNEL_LINES: LazyLock<Vec<KernelLines>> = LazyLock::new(|| {
            let mut v = Vec::new();
            $(v.extend_from_slice(crate::layouts::$t::bench::KERNELS);)*
            v
        });
        /// Every arm of the SmolLM2-shape decode section, in `Layout` order.
        static SMALL_ARMS: LazyLock<Vec<&'static SmallArm>> = LazyLock::new(|| {
            let mut v = Vec::new();
            $(v.extend(crate::layouts::$t::bench::SMALL.iter());)*
            v
        });
    };
}
crate::layouts::builtin_layouts!(bench_arms);

/// What an arm's figures are set against, and where its prefill times go.
struct Times<'a> {
    /// (arm, m, seconds) of every whole-layer prefill.
    prefill: &'a mut Vec<(&'static str, usize, f64)>,
    /// The cuBLAS BF16 layer's (m, seconds per call back to back).
    peer: &'a [(usize, f64)],
    /// The device copy ceiling (bytes read + written per second).
    ceiling: f64,
}

/// One arm on the llama-8B FFN shape: the m = 1 decode chain (time, weight bandwidth against
/// the copy ceiling and its streaming probe) and the decode sweep, then the whole-layer prefill
/// at every `PREFILL_MS`.
fn bench_arm(
    b: &Arc<dyn GpuBackend>,
    arm: &'static BenchArm,
    w: &DenseWeights,
    rng: &mut Rand,
    out: &mut Lines,
    times: Times,
) -> GpuResult<()> {
    let (h, i, name) = (w.hidden, w.inter, arm.name);
    let cfg = FfnConfig {
        hidden: h,
        inter: i,
    };
    let mut ctx = ForwardContext::new(b.clone(), cfg, 4096, levers_with(arm.levers))?;
    let mut layer = DenseFfnLayer::new(&ctx);
    (arm.install)(b.as_ref(), &mut layer, w)?;
    let x = b.alloc((4096 * h * 4) as u64)?;
    upload_f32(b.as_ref(), x, &rng.vec(4096 * h, 1.0))?;
    if let Some(bpe) = arm.decode {
        let bytes = bpe * (3 * h * i) as f64;
        let what = (name, bytes, arm.probe);
        decode_figures(b.as_ref(), &layer, &mut ctx, x, what, &times, out)?;
    }
    if arm.prefill {
        for m in PREFILL_MS {
            let t = time_median(b.as_ref(), 10, || {
                layer.forward_prefill(&mut ctx, x, m).map(|_| ())
            })?;
            times.prefill.push((name, m, t));
            let flops = 2.0 * m as f64 * (3 * h * i) as f64;
            out.push(format!(
                "prefill m={m:<5} {name:<30} {:>8.2} ms  {:>6.1} TFLOP/s",
                t * 1e3,
                flops / t / 1e12
            ));
        }
    }
    b.free(x);
    Ok(())
}

/// An arm's decode figures on the llama-8B shape: m = 1 as one synchronized call and back to
/// back (weight `bytes` per call against the copy ceiling and the arm's streaming probe), then
/// the sweep over m against the cuBLAS layer.
fn decode_figures(
    b: &dyn GpuBackend,
    layer: &DenseFfnLayer,
    ctx: &mut ForwardContext,
    x: crate::gpu::DevicePtr,
    (name, bytes, probe): (&'static str, f64, Option<Probe>),
    times: &Times,
    out: &mut Lines,
) -> GpuResult<()> {
    let ceiling = times.ceiling;
    let t = time_median(b, 50, || layer.forward(ctx, x).map(|_| ()))?;
    out.push(format!(
        "decode m=1 {name:<30} {:>8.1} us  {:>6.0} GB/s  {:>5.1}% of copy ceiling",
        t * 1e6,
        bytes / t / 1e9,
        100.0 * bytes / t / ceiling
    ));
    let t1 = per_call(b, || layer.forward(ctx, x).map(|_| ()))?;
    let (h, i) = (layer.hidden, layer.inter);
    let probe = match probe.map(|p| p(name, h, i)) {
        Some(parts) => {
            let tp = probe_time(b, &parts)?;
            format!(
                "; its streaming probe {:.1} us ({:.1}% of copy ceiling): the arm at {:.1}% of its probe",
                tp * 1e6,
                100.0 * bytes / tp / ceiling,
                100.0 * tp / t1
            )
        }
        None => String::new(),
    };
    out.push(format!(
        "decode m=1 {name:<30} {:>8.1} us {BACK_TO_BACK} calls back to back {:>5.1}% of copy ceiling{probe}",
        t1 * 1e6,
        100.0 * bytes / t1 / ceiling
    ));
    decode_sweep(b, layer, ctx, x, name, t1, times.peer, out)
}

/// Each prefill arm against the BF16 layer (cuBLAS) at the same m, measured in this run.
fn prefill_ratios(prefill_times: &[(&str, usize, f64)], out: &mut Lines) {
    for &(name, m, t) in prefill_times {
        let bf16 = prefill_times
            .iter()
            .find(|(n, bm, _)| n.starts_with("bf16") && *bm == m);
        if let Some(&(_, _, tb)) = bf16.filter(|_| !name.starts_with("bf16")) {
            out.push(format!(
                "prefill m={m:<5} {name:<30} {:>5.2}x the BF16 layer (cuBLAS) at this m",
                tb / t
            ));
        }
    }
}

/// The start-up cost a pack saves: each finalize's GPU work for one layer (median of 5).
fn finalize_costs(b: &Arc<dyn GpuBackend>, w: &DenseWeights, out: &mut Lines) -> GpuResult<()> {
    type Finalize = fn(&mut DenseFfnLayer, &mut ForwardContext, usize, usize) -> GpuResult<bool>;
    let (h, i) = (w.hidden, w.inter);
    let cfg = FfnConfig {
        hidden: h,
        inter: i,
    };
    let finalizes: [(&str, Install, ModelLevers, Finalize); 2] = [
        (
            "finalize_nvfp4_mmq_load (GPU repack of gate, up, down)",
            install_nvfp4_t,
            ModelLevers::default(),
            |l, c, h, i| l.finalize_nvfp4_mmq_load(c, h, i, 0),
        ),
        (
            "finalize_q4k_load (GPU Q4_K gate+up, int8 down)",
            install_nvfp4,
            ModelLevers {
                q4k_mmq: true,
                ..ModelLevers::default()
            },
            |l, c, h, i| l.finalize_q4k_load(c, h, i, 0),
        ),
    ];
    for (label, install, levers, finalize) in finalizes {
        let mut ctx = ForwardContext::new(b.clone(), cfg, 1, levers)?;
        let mut times = Vec::new();
        for _ in 0..5 {
            let mut layer = DenseFfnLayer::new(&ctx);
            install(b.as_ref(), &mut layer, w)?;
            b.synchronize(0)?;
            let t0 = Instant::now();
            finalize(&mut layer, &mut ctx, h, i)?;
            times.push(t0.elapsed().as_secs_f64());
            free_nvfp4_family(b.as_ref(), &layer);
        }
        times.sort_by(f64::total_cmp);
        out.push(format!(
            "{label} {:>8.3} ms per layer ({}x{}; median of 5)",
            times[2] * 1e3,
            h,
            i
        ));
    }
    Ok(())
}

/// cuBLAS BF16 on the same shapes, the peer of the prefill figures.
fn cublas_peer(b: &dyn GpuBackend, h: usize, i: usize, out: &mut Lines) -> GpuResult<()> {
    let wb = b.alloc((i * h * 2) as u64)?;
    b.fill(wb, 0x3C)?;
    let xb = b.alloc((4096 * h * 2) as u64)?;
    b.fill(xb, 0x3C)?;
    let yb = b.alloc((4096 * i * 4) as u64)?;
    for m in [512usize, 1024, 2048, 4096] {
        let t = time_median(b, 10, || {
            b.gemm_bf16(
                &GemmBf16 {
                    x: xb,
                    w: wb,
                    y: yb,
                    m,
                    n: i,
                    k: h,
                    kw: h,
                },
                0,
            )
        })?;
        out.push(format!(
            "prefill m={m:<5} {:<30} {:>8.2} ms  {:>6.1} TFLOP/s (one [{i}, {h}] projection)",
            "cuBLAS BF16 GEMM",
            t * 1e3,
            2.0 * (m * i * h) as f64 / t / 1e12
        ));
    }
    for p in [wb, xb, yb] {
        b.free(p);
    }
    Ok(())
}

/// Free the NVFP4 base of a benchmark layer (what its finalize calls built from it, the layer
/// frees when it is dropped).
fn free_nvfp4_family(b: &dyn GpuBackend, layer: &DenseFfnLayer) {
    for p in layer.get(crate::ffn::key::NVFP4).into_iter().flatten() {
        b.free(p.codes);
        b.free(p.scales);
    }
}

/// The m = 1 decode chain captured once as a CUDA graph on a new stream, then replayed: the
/// median seconds per replay ([`BACK_TO_BACK`] replays queued, then synchronized) and the
/// replay's output.
fn graph_decode(
    b: &dyn GpuBackend,
    layer: &DenseFfnLayer,
    ctx: &mut ForwardContext,
    x: crate::gpu::DevicePtr,
) -> GpuResult<(f64, Vec<f32>)> {
    let s = b.new_stream()?;
    ctx.stream = s;
    let mut y = crate::gpu::DevicePtr::NULL;
    let g = b.capture(s, &mut || {
        y = layer.forward(ctx, x)?;
        Ok(())
    });
    ctx.stream = 0;
    let g = g?;
    // Replays queued back to back, as an engine's graph of many layers runs them.
    let t = per_call(b, || b.replay(g, s))?;
    Ok((t, download_f32(b, y)?))
}

/// The prefill row counts every arm is timed at (short prompts are most of the traffic).
const PREFILL_MS: [usize; 5] = [64, 512, 1024, 2048, 4096];

/// The sm_90 default levers with the given environment switches set.
fn levers_with(env: &[(&str, &str)]) -> ModelLevers {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    ModelLevers::from_map(&map, crate::gpu::levers::HARDWARE_SM90)
}

/// The call a decoding engine makes for `m` rows: `forward` (1), `forward_k2|k3` (2, 3), then
/// the batch-m tiers where the layer has them, else `forward_prefill` (which routes FP8, BF16
/// and W8A8 rows to their narrow arms).
fn decode_call(
    layer: &DenseFfnLayer,
    ctx: &mut ForwardContext,
    x: crate::gpu::DevicePtr,
    m: usize,
) -> GpuResult<()> {
    match m {
        1 => layer.forward(ctx, x),
        2 => layer.forward_k2(ctx, x),
        3 => layer.forward_k3(ctx, x),
        _ if layer.can_forward_km(m) => layer.forward_km(ctx, x, m),
        _ => layer.forward_prefill(ctx, x, m),
    }
    .map(|_| ())
}

/// Decode at m = 1..16 rows, back to back: time per call, its ratio to the m = 1 time `t1`
/// (the weights are read once per call, so time should grow far slower than m) and to the
/// cuBLAS BF16 layer's at the same m (`peer`).
#[allow(clippy::too_many_arguments)]
fn decode_sweep(
    b: &dyn GpuBackend,
    layer: &DenseFfnLayer,
    ctx: &mut ForwardContext,
    x: crate::gpu::DevicePtr,
    name: &str,
    t1: f64,
    peer: &[(usize, f64)],
    out: &mut Lines,
) -> GpuResult<()> {
    for m in DECODE_MS {
        let t = per_call(b, || decode_call(layer, ctx, x, m))?;
        let vs = match peer.iter().find(|(pm, _)| *pm == m) {
            Some((_, tp)) => format!("  {:>5.2}x faster than the cuBLAS BF16 layer", tp / t),
            None => String::new(),
        };
        out.push(format!(
            "decode m={m:<2} {name:<30} {:>8.1} us  {:>5.2}x the m=1 time{vs}",
            t * 1e6,
            t / t1
        ));
    }
    Ok(())
}

/// The SmolLM2-135M FFN shape (576 x 1536; one layer's weights fit in L2): latency of one
/// decode row per arm (those `wanted` names, as `METRALE_BENCH_ARMS` selects) and the kernel
/// launches it takes.
fn small_shape_decode(
    b: &Arc<dyn GpuBackend>,
    rng: &mut Rand,
    out: &mut Lines,
    wanted: &dyn Fn(&str) -> bool,
) -> GpuResult<()> {
    let (h, i) = (576usize, 1536usize);
    let cfg = FfnConfig {
        hidden: h,
        inter: i,
    };
    let w = DenseWeights::random(rng, h, i);
    for arm in SMALL_ARMS.iter().filter(|a| wanted(a.name)) {
        let (name, install) = (arm.name, arm.install);
        let levers = levers_with(arm.levers);
        let mut ctx = ForwardContext::new(b.clone(), cfg, 16, levers)?;
        let mut layer = DenseFfnLayer::new(&ctx);
        install(b.as_ref(), &mut layer, &w)?;
        let x = b.alloc((16 * h * 4) as u64)?;
        upload_f32(b.as_ref(), x, &rng.vec(16 * h, 1.0))?;
        let before = b.launch_count();
        decode_call(&layer, &mut ctx, x, 1)?;
        let launches = b.launch_count() - before;
        let t = time_median(b.as_ref(), 200, || decode_call(&layer, &mut ctx, x, 1))?;
        out.push(format!(
            "decode m=1 smollm2 576x1536 {name:<24} {:>7.1} us  {launches} launches per layer (host wall clock, synchronized)",
            t * 1e6
        ));
        let plain = download_f32(b.as_ref(), layer.forward(&mut ctx, x)?)?;
        match graph_decode(b.as_ref(), &layer, &mut ctx, x) {
            Ok((t, replayed)) => out.push(format!(
                "decode m=1 smollm2 576x1536 {name:<24} {:>7.1} us  the same {launches} launches as one CUDA graph, {BACK_TO_BACK} replays back to back; output bits {} the launched chain's",
                t * 1e6,
                if same_bits(&replayed, &plain) { "equal" } else { "DIFFER from" }
            )),
            Err(e) => out.push(format!(
                "decode m=1 smollm2 576x1536 {name:<24} CUDA graph not captured: {e}"
            )),
        }
        b.free(x);
    }
    Ok(())
}
