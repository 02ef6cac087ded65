//! The host twins of the BF16 GEMV (`kernels.cu`), through `gpu::reference`.

use crate::gpu::GpuResult;
use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::*;
use crate::gpu::reference;
use crate::gpu::table::{Args, KernelSpec};

impl HostBackend {
    /// `bf16_gemv_batch4`.
    pub(crate) fn bf16_gemv_batch4(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let round = spec.round;
        let (x, m) = (self.read_f32(a.ptr("x")?)?, a.dim("m")?);
        let w = self.read(a.ptr("w")?)?;
        let (y, n, kk, kp, ldy) = projection_out(a)?;
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::bf16_row(&x[r * kk..(r + 1) * kk], &w, n, kk, kp, round, row);
        })?;
        Ok(())
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] =
    &[(&["bf16_gemv_batch4"], HostBackend::bf16_gemv_batch4)];
