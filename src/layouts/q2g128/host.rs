//! The host twins of the q2g128 kernels (`kernels.cu`): the GEMVs, the BF16 dequantization and the MMQ GEMM (which the Q4_K MMQ GEMM shares), through `gpu::reference`.

use crate::gpu::GpuResult;
use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::*;
use crate::gpu::reference;
use crate::gpu::sizes::*;
use crate::gpu::table::{Args, KernelSpec};

impl HostBackend {
    /// `q2g128_gemv`, `q2g128_gemv_batchm`.
    pub(crate) fn q2g128_gemv(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        self.blocks_gemv(a, reference::q2_row)
    }

    /// `q2g128_dequant_bf16`.
    pub(crate) fn q2g128_dequant_bf16(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (w, n, kp) = (self.read(a.ptr("w")?)?, a.dim("n")?, a.dim("kp")?);
        self.write(a.ptr("out")?, 0, &reference::q2_dequant_bf16(&w, n, kp))?;
        Ok(())
    }

    /// `q2g128_mmq_gemm`, `q4k_mmq_gemm`.
    pub(crate) fn q2g128_mmq_gemm(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let name = spec.name;
        let (xq, m, w) = (
            self.read(a.ptr("xq")?)?,
            a.dim("m")?,
            self.read(a.ptr("w")?)?,
        );
        let (y, n, kp, ldy) = (a.ptr("y")?, a.dim("n")?, a.dim("kp")?, a.dim("ldy")?);
        let bs = kp / Q8_1_ELEMS * Q8_1_BYTES;
        let row_fn = if name == "q2g128_mmq_gemm" {
            reference::q2_mmq_row
        } else {
            reference::q4k_mmq_row
        };
        self.write_rows(y, ldy, m, n, |r, row| {
            row_fn(&xq[r * bs..(r + 1) * bs], &w, n, kp, row);
        })?;
        Ok(())
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] = &[
    (
        &["q2g128_gemv", "q2g128_gemv_batchm"],
        HostBackend::q2g128_gemv,
    ),
    (&["q2g128_dequant_bf16"], HostBackend::q2g128_dequant_bf16),
    (
        &["q2g128_mmq_gemm", "q4k_mmq_gemm"],
        HostBackend::q2g128_mmq_gemm,
    ),
];
