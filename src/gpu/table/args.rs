//! A launch's arguments read by parameter name, checked against the kernel's description.

use super::super::kernels::ParamKind;
use super::{Axis, KernelSpec, TmapRule};
use crate::gpu::{DevicePtr, GpuError, GpuResult, KArg, LaunchCfg, Tmap};

/// A launch's arguments read by parameter name (the host backend's decoding).
pub struct Args<'a> {
    pub(super) spec: &'a KernelSpec,
    pub(super) a: &'a [KArg],
}

impl<'a> Args<'a> {
    /// `a` checked against `spec`: count and kinds.
    pub fn new(spec: &'a KernelSpec, a: &'a [KArg]) -> GpuResult<Self> {
        let ok = spec.params().count() == a.len()
            && spec.params().zip(a).all(|((_, k), g)| kind_ok(k, g));
        if !ok {
            return Err(GpuError::Invalid(format!(
                "{}: launched with {a:?}, but it takes ({})",
                spec.name, spec.params
            )));
        }
        Ok(Args { spec, a })
    }

    fn get(&self, name: &str) -> GpuResult<&KArg> {
        self.spec
            .position(name)
            .map(|(i, _)| &self.a[i])
            .ok_or_else(|| {
                GpuError::Invalid(format!("{} has no parameter `{name}`", self.spec.name))
            })
    }

    /// Pointer argument `name` (a tensor map's matrix for a `t` parameter).
    pub fn ptr(&self, name: &str) -> GpuResult<DevicePtr> {
        match self.get(name)? {
            KArg::Ptr(p) => Ok(*p),
            KArg::Tmap(t) => Ok(t.base),
            o => Err(self.wrong(name, "a pointer", o)),
        }
    }

    /// `int` argument `name`, which must be non-negative and fit an `i32`.
    pub fn dim(&self, name: &str) -> GpuResult<usize> {
        match self.get(name)? {
            KArg::I32(v) if *v >= 0 => Ok(*v as usize),
            KArg::Dim(v) if i32::try_from(*v).is_ok() => Ok(*v),
            o => Err(self.wrong(name, "a non-negative i32", o)),
        }
    }

    /// `float` argument `name`.
    pub fn float(&self, name: &str) -> GpuResult<f32> {
        match self.get(name)? {
            KArg::F32(v) => Ok(*v),
            o => Err(self.wrong(name, "an f32", o)),
        }
    }

    /// The tensor map of rule `r` over the pointer given for its parameter, its sizes read from
    /// the named `int` arguments.
    pub(super) fn tmap(&self, r: &TmapRule) -> GpuResult<Tmap> {
        let KArg::Ptr(base) = *self.get(r.param)? else {
            return Err(GpuError::Invalid(format!(
                "{}: tensor map `{}` needs a pointer",
                self.spec.name, r.param
            )));
        };
        Ok(Tmap {
            base,
            row_bytes: self.dim(r.row_bytes)?.checked_mul(r.elem).ok_or_else(|| {
                GpuError::Invalid(format!(
                    "{}: tensor map `{}` overflows",
                    self.spec.name, r.param
                ))
            })?,
            rows: self.dim(r.rows)?,
            box_rows: r.box_rows,
            box_bytes: r.box_bytes,
        })
    }

    fn wrong(&self, name: &str, want: &str, got: &KArg) -> GpuError {
        GpuError::Invalid(format!(
            "{}: argument `{name}` must be {want}, got {got:?}",
            self.spec.name
        ))
    }

    /// The spec's row cap against its `m` argument.
    pub fn check_rows(&self) -> GpuResult<()> {
        if let Some(cap) = self.spec.row_cap {
            let m = self.dim("m")?;
            if m > cap {
                return Err(GpuError::Invalid(format!(
                    "{}: m = {m} > its row cap {cap}",
                    self.spec.name
                )));
            }
        }
        Ok(())
    }

    /// The launch configuration by the spec's grid rule.
    pub fn launch_cfg(&self) -> GpuResult<LaunchCfg> {
        let axis = |a: Axis| -> GpuResult<usize> {
            Ok(match a {
                Axis::One => 1,
                Axis::Fixed(v) => v,
                Axis::Per(name, per) => self.dim(name)?.div_ceil(per),
                Axis::Rule(f) => f(self)?,
            })
        };
        let g = self.spec.grid;
        let (x, y) = (axis(g.x)?, axis(g.y)?);
        // CUDA's grid limits: 2^31 - 1 blocks along x, 65535 along y.
        const MAX_X: usize = i32::MAX as usize;
        const MAX_Y: usize = 65535;
        if x > MAX_X || y > MAX_Y {
            return Err(GpuError::Invalid(format!(
                "{}: grid {x} x {y} does not fit the launch limits ({MAX_X} x {MAX_Y})",
                self.spec.name
            )));
        }
        let mut cfg = LaunchCfg::grid(x, y, g.threads);
        cfg.dependent = self.spec.dependent;
        cfg.smem = u32::try_from(g.smem).map_err(|_| {
            GpuError::Invalid(format!(
                "{}: {} bytes of shared memory",
                self.spec.name, g.smem
            ))
        })?;
        Ok(cfg)
    }
}

pub(super) fn kind_ok(k: ParamKind, a: &KArg) -> bool {
    matches!(
        (k, a),
        (ParamKind::Ptr, KArg::Ptr(_))
            | (ParamKind::Int, KArg::I32(_) | KArg::Dim(_))
            | (ParamKind::Float, KArg::F32(_))
            | (ParamKind::Tmap, KArg::Tmap(_))
    )
}
