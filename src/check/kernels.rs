//! Kernel rows: every kernel against the host reference (`reference.rs`) on fresh random data.
//! Row caps and activation rounding come from the kernel table ([`crate::gpu::table`]), and
//! every launch is built by parameter name through it, as the layer's own launches are.

use super::*;
use crate::ffn::{DenseFfnLayer, FfnConfig, FfnKernels, ForwardContext};
use crate::gpu::reference::{self, ActRound};
use crate::gpu::table::{Call, Kernel};
use crate::gpu::{
    DevicePtr, GpuBackend, GpuResult, ModelLevers, alloc_upload, download_f32, upload_f32,
};
use crate::testing::*;
use std::sync::Arc;

pub(crate) mod dq_wgmma;
mod rules;

/// The largest m the FP8 check sends to a kernel with a row cap: the routing's range for the
/// batch tiers (5..=32), which `fp8_launch` splits into launches of the kernel's cap.
pub(crate) const FP8_CHUNKED_MAX_M: usize = 32;

/// One shape's inputs, shared by every family's rows: the gate/up-shaped weight `wf` (`[n, k]`
/// = `[inter, hidden]`), `mmax` rows of activations `x` on the device as `xd`, and an output
/// buffer `yd` of `[mmax, n]`.
pub(crate) struct Case<'a> {
    pub(crate) b: Arc<dyn GpuBackend>,
    pub(crate) ctx: ForwardContext,
    pub(crate) layer: DenseFfnLayer,
    pub(crate) kk: FfnKernels,
    pub(crate) shape: (usize, usize),
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) ms: &'a [usize],
    pub(crate) mmax: usize,
    pub(crate) wf: Vec<f32>,
    pub(crate) x: Vec<f32>,
    pub(crate) xd: DevicePtr,
    pub(crate) yd: DevicePtr,
}

impl Case<'_> {
    pub(crate) fn xr(&self, r: usize) -> &[f32] {
        &self.x[r * self.k..(r + 1) * self.k]
    }

    pub(crate) fn row(&self, rows: &mut Vec<Row>, check: &str, m: usize, err: f64, tol: f64) {
        push(rows, check, self.shape, m, err, tol);
    }

    pub(crate) fn bits(&self, rows: &mut Vec<Row>, check: &str, m: usize, exact: bool) {
        push(
            rows,
            check,
            self.shape,
            m,
            if exact { 0.0 } else { 1.0 },
            0.0,
        );
    }

    /// Finish `call` by the kernel table and launch it on the default stream.
    pub(crate) fn launch(&self, call: Call) -> GpuResult<()> {
        call.finish()?.run(self.b.as_ref(), 0)
    }

    /// The sampled error of the `[m, n]` output in `yd`.
    pub(crate) fn err(&self, m: usize, f: impl Fn(usize) -> Vec<f32> + Sync) -> GpuResult<f64> {
        sampled_err(self.b.as_ref(), self.yd, m, self.n, f)
    }

    pub(crate) fn poison_y(&self) -> GpuResult<()> {
        poison(self.b.as_ref(), self.yd)
    }
}

/// The m of `ms` within a kernel's row cap (`limit` when it has none).
pub(crate) fn within(ms: &[usize], k: &Kernel, limit: usize) -> Vec<usize> {
    let cap = k.spec.row_cap.unwrap_or(limit);
    ms.iter().copied().filter(|&m| m <= cap).collect()
}

/// A group of kernel rows: its kernels checked on one case.
pub(crate) type Group = fn(&mut Case, &mut Vec<Row>, &mut Rand) -> GpuResult<()>;

/// Generates [`GROUPS`] from the list of built-in layouts (`layouts::builtin_layouts!`).
macro_rules! kernel_groups {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        /// The kernel groups, by name: the kernel table's rules, then each built-in layout's
        /// (`src/layouts/TAG/check_kernels.rs`), in `Layout` order.
        static GROUPS: std::sync::LazyLock<Vec<(&'static str, Group)>> =
            std::sync::LazyLock::new(|| {
                let mut v: Vec<(&'static str, Group)> =
                    vec![("rules", |c, r, g| rules::rules_rows(c, r, g))];
                $(v.extend_from_slice(crate::layouts::$t::check_kernels::GROUPS);)*
                v
            });
    };
}
crate::layouts::builtin_layouts!(kernel_groups);

/// Kernel-level checks: each projection kernel on its row counts, sampled rows against the
/// reference (f64 sums), every output element checked written; only the groups of [`GROUPS`]
/// that `keep` keeps.
pub fn kernel_checks(
    b: Arc<dyn GpuBackend>,
    shapes: &[(usize, usize)],
    ms: &[usize],
    rng: &mut Rand,
    keep: &dyn Fn(&str) -> bool,
) -> GpuResult<Vec<Row>> {
    let mut rows = Vec::new();
    let mmax = *ms.iter().max().unwrap();
    for &(h, i) in shapes {
        let config = FfnConfig {
            hidden: h,
            inter: i,
        };
        let ctx = ForwardContext::new(b.clone(), config, mmax, ModelLevers::default())?;
        let layer = DenseFfnLayer::new(&ctx);
        let (n, k) = (i, h); // gate/up shape
        let x = rng.vec(mmax * k, 1.0);
        let xd = b.alloc((mmax * k * 4) as u64)?;
        upload_f32(b.as_ref(), xd, &x)?;
        let mut c = Case {
            kk: *layer.kernels(),
            b: b.clone(),
            ctx,
            layer,
            shape: (h, i),
            n,
            k,
            ms,
            mmax,
            wf: rng.vec(n * k, 1.0 / (k as f32).sqrt()),
            x,
            xd,
            yd: b.alloc((mmax * n * 4) as u64)?,
        };
        for (_, group) in GROUPS.iter().filter(|(name, _)| keep(name)) {
            group(&mut c, &mut rows, rng)?;
        }
        for p in [c.xd, c.yd] {
            b.free(p);
        }
    }
    Ok(rows)
}
