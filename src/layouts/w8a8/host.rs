//! The host twins of the W8A8 kernels (`kernels.cu`, `kernels_wgmma.cu`): the GEMM, its decode GEMV and the wgmma GEMMs, through `gpu::reference`.

use crate::gpu::GpuResult;
use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::*;
use crate::gpu::reference;
use crate::gpu::table::{Args, KernelSpec};

impl HostBackend {
    /// `w8a8_gemm`, `w8a8_gemv`, `w8a8_wgmma`, `w8a8_wgmma_m64`.
    pub(crate) fn w8a8_gemm(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (q, sx, m) = (
            self.read(a.ptr("q")?)?,
            self.read_f32(a.ptr("sx")?)?,
            a.dim("m")?,
        );
        let (w, sw) = (self.read(a.ptr("w")?)?, self.read_f32(a.ptr("sw")?)?);
        let (y, n, kp, ldy) = (a.ptr("y")?, a.dim("n")?, a.dim("kp")?, a.dim("ldy")?);
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::w8a8_row(&q[r * kp..(r + 1) * kp], sx[r], &w, &sw, n, kp, row);
        })?;
        Ok(())
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] = &[(
    &["w8a8_gemm", "w8a8_gemv", "w8a8_wgmma", "w8a8_wgmma_m64"],
    HostBackend::w8a8_gemm,
)];
