//! Tensor-parallel layer checks: every arm of a layer loaded from a `--tp N` pack, one rank per
//! backend (one GPU each, or one host backend each in CI), each rank's partial output summed
//! over the ranks by an [`AllReduce`] (NCCL on GPUs, [`HostSum`] on the host), against the
//! float64 FFN of the source weights and next to the same arm of the one-GPU pack.

use super::same_bits;
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
pub use crate::gpu::allreduce::{AllReduce, HostSum};
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, upload_f32};
use crate::loader::arms::{
    Arm, arms_of, forward_rows, layer_overlays, rows_per_call, run_rows_with,
};
use crate::loader::{self, LoadOptions, LoadedPack};
use crate::model::{Activation, Model};
use crate::testing::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The fewest rows each m is checked on.
pub const CHECK_ROWS: usize = 16;

/// The name of the NVFP4 arm with the pack's LoRA adapter in the table.
pub const LORA_ARM: &str = "nvfp4 + lora";

/// One arm's outputs on one backend, per m: the output rows and the median times (forward,
/// all-reduce); `None` where the arm refuses that m, or the layer the arm.
type ArmRun = Option<Vec<Option<(Vec<f32>, [f64; 2])>>>;

/// One row of the table.
#[derive(Clone, Debug)]
pub struct TpRow {
    /// The arm (as `check-activations` names it).
    pub arm: &'static str,
    /// The layer.
    pub layer: usize,
    /// Rows per call.
    pub m: usize,
    /// Relative error of the one-GPU pack's arm against the float64 FFN, over the rows of
    /// `ceil(CHECK_ROWS / m)` calls of m rows.
    pub single: f64,
    /// Relative error of the sum of the ranks' partial outputs against the float64 FFN.
    pub tp: f64,
    /// Median seconds of one call on one GPU, on rank 0 of N (the forward alone), and of the
    /// all-reduce alone; 0 when not timed.
    pub seconds: [f64; 3],
}

/// Every arm of `layer` at each m of `ms`: the one-GPU pack `single` on `backends[0]`, then the
/// tensor-parallel pack `tp` with rank r on `backends[r]` (one thread per rank), the ranks'
/// outputs summed by `reduce`. With `iters` > 0 each call is also timed (median of `iters`).
#[allow(clippy::too_many_arguments)]
pub fn tp_checks(
    backends: &[Arc<dyn GpuBackend>],
    reduce: &dyn AllReduce,
    tp: &Path,
    single: &Path,
    source: &Path,
    layer: usize,
    ms: &[usize],
    iters: usize,
    rng: &mut Rand,
) -> crate::Result<Vec<TpRow>> {
    let gpu = crate::Error::Gpu;
    let one = loader::load(backends[0].as_ref(), single, &LoadOptions::default())?;
    let cx = TpCx::new(&one, source, layer, ms, iters, rng)?;
    let single_arms = arms_with_lora(&one, layer)?;
    let mut singles = Vec::new();
    for a in &single_arms {
        singles.push(cx.run(&backends[0], a, cx.inter, None).map_err(gpu)?);
    }
    let want_lora = cx.lora_reference(&one);
    backends[0].free(one.arena);
    let rank0 = cx.run_ranks(backends, reduce, tp, &single_arms)?;
    let mut rows = Vec::new();
    for ((a, one), tpo) in single_arms.iter().zip(singles).zip(rank0) {
        let (Some(one), Some(tpo)) = (one, tpo) else {
            continue;
        };
        let want = match (&want_lora, a.name) {
            (Some(wl), LORA_ARM) => wl,
            _ => &cx.want,
        };
        for ((&mm, o1), ot) in ms.iter().zip(one).zip(tpo) {
            let (Some((y1, t1)), Some((yt, tt))) = (o1, ot) else {
                continue;
            };
            rows.push(TpRow {
                arm: a.name,
                layer,
                m: mm,
                single: rel_err(&y1, &want[..y1.len()]),
                tp: rel_err(&yt, &want[..yt.len()]),
                seconds: [t1[0], tt[0], tt[1]],
            });
        }
    }
    Ok(rows)
}

/// Every arm of `arms_of` for `layer` of a loaded pack, and the NVFP4 base with the pack's LoRA
/// adapter installed.
fn arms_with_lora(lp: &LoadedPack, layer: usize) -> crate::Result<Vec<Arm>> {
    let ov = layer_overlays(lp, layer)?;
    let mut v = arms_of(ov);
    use crate::converters::layouts::Layout::{Lora, Nvfp4};
    if ov.overlays.holds(Nvfp4) && ov.overlays.holds(Lora) {
        v.push(Arm {
            name: LORA_ARM,
            overlays: ov.only(&[Nvfp4, Lora]),
            levers: crate::gpu::ModelLevers::default(),
            fixed: false,
        });
    }
    Ok(v)
}

/// What every arm of one check shares: the layer's shape and activation, the rows of each m,
/// the input rows and the float64 FFN of the source weights over them.
struct TpCx<'a> {
    h: usize,
    inter: usize,
    act: Activation,
    layer: usize,
    ms: &'a [usize],
    iters: usize,
    max_m: usize,
    x: Vec<f32>,
    n_rows: usize,
    w: DenseWeights,
    want: Vec<f64>,
}

impl<'a> TpCx<'a> {
    fn new(
        one: &LoadedPack,
        source: &Path,
        layer: usize,
        ms: &'a [usize],
        iters: usize,
        rng: &mut Rand,
    ) -> crate::Result<Self> {
        let model = Model::open(source)?;
        let m = &one.pack.manifest.model;
        let (h, inter) = (m.hidden_size as usize, m.intermediate_size as usize);
        let act = Activation::from_act_name(&m.activation).unwrap_or(Activation::Silu);
        let fl = model
            .ffn_layers
            .iter()
            .find(|f| f.index == layer)
            .ok_or_else(|| crate::Error::NotFound {
                file: source.display().to_string(),
                tensor: format!("FFN layer {layer}"),
            })?;
        let w = DenseWeights {
            gate: model.decode_weight(&fl.gate)?.0,
            up: model.decode_weight(&fl.up)?.0,
            down: model.decode_weight(&fl.down)?.0,
            hidden: h,
            inter,
        };
        let n_rows = ms.iter().map(|&mm| rows_of(mm)).max().unwrap_or(1);
        let x = rng.vec(n_rows * h, 1.0);
        let want = ffn_f64(&x, n_rows, &w, act);
        Ok(TpCx {
            h,
            inter,
            act,
            layer,
            ms,
            iters,
            max_m: ms.iter().copied().max().unwrap_or(1),
            x,
            n_rows,
            w,
            want,
        })
    }

    /// The LoRA arm's reference: the source weights plus the adapter's delta as the one-GPU
    /// pack stores it (B A times its scaling, from the BF16 parts).
    fn lora_reference(&self, one: &LoadedPack) -> Option<Vec<f64>> {
        let mut wl = DenseWeights {
            gate: self.w.gate.clone(),
            up: self.w.up.clone(),
            down: self.w.down.clone(),
            hidden: self.h,
            inter: self.inter,
        };
        let mut any = false;
        for (proj, dst) in [
            ("gate", &mut wl.gate),
            ("up", &mut wl.up),
            ("down", &mut wl.down),
        ] {
            let name = format!("blk.{}.ffn_{proj}.lora", self.layer);
            if let Ok((d, _)) = one.pack.decode_ffn(&name) {
                dst.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
                any = true;
            }
        }
        any.then(|| ffn_f64(&self.x, self.n_rows, &wl, self.act))
    }

    /// Each rank loads its own pieces of `tp`, then runs every arm with the others (one thread
    /// each): rank 0's runs.
    fn run_ranks(
        &self,
        backends: &[Arc<dyn GpuBackend>],
        reduce: &dyn AllReduce,
        tp: &Path,
        single_arms: &[Arm],
    ) -> crate::Result<Vec<ArmRun>> {
        let n = backends.len() as u32;
        let loaded: Vec<LoadedPack> = backends
            .iter()
            .enumerate()
            .map(|(r, b)| {
                let o = LoadOptions {
                    rank: Some((r as u32, n)),
                    ..Default::default()
                };
                loader::load(b.as_ref(), tp, &o)
            })
            .collect::<crate::Result<_>>()?;
        let rank_arms: Vec<Vec<Arm>> = loaded
            .iter()
            .map(|lp| arms_with_lora(lp, self.layer))
            .collect::<crate::Result<_>>()?;
        let names = |v: &[Arm]| v.iter().map(|a| a.name).collect::<Vec<_>>();
        if rank_arms.iter().any(|a| names(a) != names(single_arms)) {
            return Err(crate::Error::Unsupported {
                file: tp.display().to_string(),
                reason: "its ranks do not serve the same arms as the one-GPU pack".into(),
            });
        }
        let results: Vec<GpuResult<Vec<ArmRun>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..backends.len())
                .map(|r| {
                    let (b, arms, lp) = (&backends[r], &rank_arms[r], &loaded[r]);
                    s.spawn(move || {
                        arms.iter()
                            .map(|a| self.run(b, a, lp.ffn_inter, Some((r, reduce))))
                            .collect()
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank's thread panicked"))
                .collect()
        });
        for (b, lp) in backends.iter().zip(&loaded) {
            b.free(lp.arena);
        }
        let mut ranks = results.into_iter();
        let rank0 = ranks
            .next()
            .expect("one rank at least")
            .map_err(crate::Error::Gpu)?;
        for r in ranks {
            r.map_err(crate::Error::Gpu)?;
        }
        Ok(rank0)
    }

    /// One arm on one backend (its layer of intermediate `inter`): the output of each m, and the
    /// median times (forward, reduce).
    fn run(
        &self,
        b: &Arc<dyn GpuBackend>,
        arm: &Arm,
        inter: usize,
        red: Option<(usize, &dyn AllReduce)>,
    ) -> GpuResult<ArmRun> {
        let h = self.h;
        let cfg = FfnConfig { hidden: h, inter };
        let mut ctx = ForwardContext::new(b.clone(), cfg, self.max_m, arm.levers.clone())?;
        let mut l = DenseFfnLayer::new_with_activation(&ctx, self.act);
        // An arm this layer refuses (the same on every rank); the fixed path is SiLU's only.
        if let Err(e) = arm.overlays.install(&mut l) {
            tracing::info!("{} (intermediate {inter}) not installed: {e}", arm.name);
            return Ok(None);
        }
        if arm.fixed && self.act != Activation::Silu {
            return Ok(None);
        }
        let mut out = Vec::new();
        for &mm in self.ms {
            let per = rows_per_call(arm.name, mm);
            let hook = |o: DevicePtr, rows: usize| -> GpuResult<()> {
                match red {
                    Some((rank, r)) => r.all_reduce(rank, b.as_ref(), o, rows * h),
                    None => Ok(()),
                }
            };
            // A path this layer refuses at this m (a layout's prefill on GELU): refused the same
            // way on every rank, before any all-reduce.
            let x = &self.x[..rows_of(mm) * h];
            let y = match run_rows_with(&mut ctx, &l, arm.fixed, x, h, per, hook) {
                Err(crate::gpu::GpuError::NotServed(why)) => {
                    tracing::info!("{} at m = {mm} (intermediate {inter}): {why}", arm.name);
                    out.push(None);
                    continue;
                }
                r => r?,
            };
            let times = if self.iters > 0 && per == mm {
                self.time(b, &l, &mut ctx, arm.fixed, mm, red)?
            } else {
                [0.0, 0.0]
            };
            out.push(Some((y, times)));
        }
        Ok(Some(out))
    }

    /// Median seconds of one call of `mm` rows on device-resident input, then of the
    /// all-reduce alone.
    fn time(
        &self,
        b: &Arc<dyn GpuBackend>,
        l: &DenseFfnLayer,
        ctx: &mut ForwardContext,
        fixed: bool,
        mm: usize,
        red: Option<(usize, &dyn AllReduce)>,
    ) -> GpuResult<[f64; 2]> {
        let h = self.h;
        let mut times = [Vec::new(), Vec::new()];
        let xp = b.alloc((mm * h * 4) as u64)?;
        upload_f32(b.as_ref(), xp, &self.x[..mm * h])?;
        for _ in 0..=self.iters {
            let t0 = Instant::now();
            let o = forward_rows(ctx, l, fixed, xp, mm)?;
            b.synchronize(0)?;
            let t1 = Instant::now();
            if let Some((rank, r)) = red {
                r.all_reduce(rank, b.as_ref(), o, mm * h)?;
                b.synchronize(0)?;
            }
            times[0].push((t1 - t0).as_secs_f64());
            times[1].push(t1.elapsed().as_secs_f64());
        }
        b.free(xp);
        let med = |v: &mut Vec<f64>| {
            v.remove(0);
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        Ok([med(&mut times[0]), med(&mut times[1])])
    }
}

/// Each m is checked on at least `CHECK_ROWS` rows (calls of m rows), so that a small layer's
/// error at m = 1 is not the error of one row of `hidden` values.
fn rows_of(mm: usize) -> usize {
    mm.max(CHECK_ROWS).div_ceil(mm) * mm
}

/// Print the table.
pub fn print_tp_table(rows: &[TpRow], n: usize) {
    println!(
        "{:<22} {:>5} {:>5} {:>12} {:>12} {:>10} {:>10} {:>10}",
        "arm",
        "layer",
        "m",
        "TP=1 err",
        format!("TP={n} err"),
        "TP=1 us",
        format!("TP={n} us"),
        "allred us"
    );
    for r in rows {
        println!(
            "{:<22} {:>5} {:>5} {:>12.3e} {:>12.3e} {:>10.1} {:>10.1} {:>10.1}",
            r.arm,
            r.layer,
            r.m,
            r.single,
            r.tp,
            r.seconds[0] * 1e6,
            r.seconds[1] * 1e6,
            r.seconds[2] * 1e6
        );
    }
}

/// The fixed (batch-invariant) arms of layer `layer` on rank `rank` of the tensor-parallel pack
/// `tp`: each of the first rows of `x` run alone must give the bits of the same row inside one
/// call of all `rows` rows. (arm, rows compared, rows whose partial output differs in any bit.)
pub fn fixed_invariance(
    b: Arc<dyn GpuBackend>,
    tp: &Path,
    (rank, n): (u32, u32),
    layer: usize,
    rows: usize,
    rng: &mut Rand,
) -> crate::Result<Vec<(&'static str, usize, usize)>> {
    let gpu = crate::Error::Gpu;
    let o = LoadOptions {
        rank: Some((rank, n)),
        ..Default::default()
    };
    let lp = loader::load(b.as_ref(), tp, &o)?;
    let m = &lp.pack.manifest.model;
    let h = m.hidden_size as usize;
    let act = Activation::from_act_name(&m.activation).unwrap_or(Activation::Silu);
    let x = rng.vec(rows * h, 1.0);
    let cfg = FfnConfig {
        hidden: h,
        inter: lp.ffn_inter,
    };
    let mut out = Vec::new();
    let ov = layer_overlays(&lp, layer)?;
    for arm in arms_of(ov).into_iter().filter(|a| a.fixed) {
        let mut ctx = ForwardContext::new(b.clone(), cfg, rows, arm.levers.clone()).map_err(gpu)?;
        let mut l = DenseFfnLayer::new_with_activation(&ctx, act);
        if arm.overlays.install(&mut l).is_err() || !l.fixed_ok(&ctx, rows) {
            continue;
        }
        let none = |_: DevicePtr, _: usize| Ok(());
        let batch = run_rows_with(&mut ctx, &l, true, &x, h, rows, none).map_err(gpu)?;
        let alone = rows.min(4);
        let mut differ = 0;
        for r in 0..alone {
            let y = run_rows_with(&mut ctx, &l, true, &x[r * h..(r + 1) * h], h, 1, none)
                .map_err(gpu)?;
            differ += usize::from(!same_bits(&y, &batch[r * h..(r + 1) * h]));
        }
        out.push((arm.name, alone, differ));
    }
    b.free(lp.arena);
    Ok(out)
}
