//! The host twins of the adapter kernels (`kernels.cu`), through `gpu::reference`.

use crate::gpu::GpuResult;
use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::*;
use crate::gpu::reference;
use crate::gpu::table::{Args, KernelSpec};

impl HostBackend {
    /// `lora_a`.
    pub(crate) fn lora_a(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let x = self.read_f32(a.ptr("x")?)?;
        let (m, kk, ldx) = (a.dim("m")?, a.dim("k")?, a.dim("ldx")?);
        let (am, r, xa) = (self.read(a.ptr("a")?)?, a.dim("r")?, a.ptr("xa")?);
        for row in 0..m {
            let v = reference::lora_a_row(&x[row * ldx..row * ldx + kk], &am, kk, r);
            self.write_f32(xa, row * r, &v)?;
        }
        Ok(())
    }

    /// `lora_b_add`.
    pub(crate) fn lora_b_add(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (xa, m, r) = (self.read_f32(a.ptr("xa")?)?, a.dim("m")?, a.dim("r")?);
        let (bm, scaling) = (self.read(a.ptr("b")?)?, a.float("scaling")?);
        let (y, n, ldy) = (a.ptr("y")?, a.dim("n")?, a.dim("ldy")?);
        let yv = self.read_f32(y)?;
        for row in 0..m {
            let mut out = yv[row * ldy..row * ldy + n].to_vec();
            reference::lora_b_row(&xa[row * r..(row + 1) * r], &bm, n, r, scaling, &mut out);
            self.write_f32(y, row * ldy, &out)?;
        }
        Ok(())
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] = &[
    (&["lora_a"], HostBackend::lora_a),
    (&["lora_b_add"], HostBackend::lora_b_add),
];
