//! The host twins of the FP8 kernels (`kernels.cu`): the W8A16 GEMVs and GEMMs, the FP8 activation quantizers and the W8A8 wgmma GEMM, through `gpu::reference`.

use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::*;
use crate::gpu::reference;
use crate::gpu::table::{Args, KernelSpec};
use crate::gpu::{GpuError, GpuResult};

impl HostBackend {
    /// `w8a16_gemv_batch4`, `w8a16_gemv_mma`, `w8a16_gemv_batch16`, `w8a16_gemm_m16`, `w8a16_gemm_pipelined`, `w8a16_gemm`.
    pub(crate) fn w8a16_gemv_batch4(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let round = spec.round;
        let (x, m) = (self.read_f32(a.ptr("x")?)?, a.dim("m")?);
        let (w, s) = (self.read(a.ptr("w")?)?, self.read_f32(a.ptr("s")?)?);
        let (y, n, kk, kp, ldy) = projection_out(a)?;
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::fp8_block_row(&x[r * kk..(r + 1) * kk], &w, &s, n, kk, kp, round, row);
        })?;
        Ok(())
    }

    /// `quantize_act_fp8_row`, `quantize_act_mul_fp8_row`, `quantize_act_fp8_g128`, `quantize_act_mul_fp8_g128`.
    pub(crate) fn quantize_act_fp8_row(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let name = spec.name;
        let (kp, q, sx) = (a.dim("kp")?, a.ptr("q")?, a.ptr("sx")?);
        let rows = self.quantizer_rows(name, a)?;
        for (r, row) in rows.iter().enumerate() {
            // Per row, or per 128-column group (`_g128`).
            let (codes, scales) = if name.ends_with("_g128") {
                reference::quantize_row_fp8_g128(row, kp)
            } else {
                let (codes, scale) = reference::quantize_row_fp8(row, kp);
                (codes, vec![scale])
            };
            self.write(q, r * kp, &codes)?;
            self.write_f32(sx, r * scales.len(), &scales)?;
        }
        Ok(())
    }

    /// `fp8_wgmma`.
    pub(crate) fn fp8_wgmma(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (m, n, kp, ldy) = (a.dim("m")?, a.dim("n")?, a.dim("kp")?, a.dim("ldy")?);
        let q = self.read(a.ptr("q")?)?;
        let sx = self.read_f32(a.ptr("sx")?)?;
        let w = self.read(a.ptr("w")?)?;
        let s = self.read_f32(a.ptr("s")?)?;
        let y = a.ptr("y")?;
        let gk = kp / 128;
        let bad = || GpuError::Invalid("fp8_wgmma: operands smaller than m, n, kp".into());
        if q.len() < m * kp
            || sx.len() < m * gk
            || w.len() < n * kp
            || s.len() < n.div_ceil(128) * gk
        {
            return Err(bad());
        }
        self.write_rows(y, ldy, m, n, |r, row| {
            let (qr, sr) = (&q[r * kp..(r + 1) * kp], &sx[r * gk..(r + 1) * gk]);
            reference::fp8_w8a8_block_row(qr, sr, &w, &s, n, kp, row);
        })?;
        Ok(())
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] = &[
    (
        &[
            "w8a16_gemv_batch4",
            "w8a16_gemv_batch4_cvt",
            "w8a16_gemv_mma",
            "w8a16_gemv_mma_ilp",
            "w8a16_gemv_batch16",
            "w8a16_gemm_m16",
            "w8a16_gemm_pipelined",
            "w8a16_gemm",
        ],
        HostBackend::w8a16_gemv_batch4,
    ),
    (
        &[
            "quantize_act_fp8_row",
            "quantize_act_mul_fp8_row",
            "quantize_act_fp8_g128",
            "quantize_act_mul_fp8_g128",
        ],
        HostBackend::quantize_act_fp8_row,
    ),
    (&["fp8_wgmma"], HostBackend::fp8_wgmma),
];
