//! The host twins of the Q4_K kernels (`kernels.cu`): the wgmma and decode GEMVs, the int8-row GEMVs, the load-time builds and the int8 down GEMM, through `gpu::reference`.

use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::*;
use crate::gpu::reference;
use crate::gpu::sizes::*;
use crate::gpu::table::{Args, KernelSpec};
use crate::gpu::{GpuError, GpuResult};

impl HostBackend {
    /// `q4k_wgmma`.
    pub(crate) fn q4k_wgmma(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (x, m, w) = (
            self.read_bf16_il8(a.ptr("x")?)?,
            a.dim("m")?,
            self.read(a.ptr("w")?)?,
        );
        let (y, n, kk, kp, ldy) = (
            a.ptr("y")?,
            a.dim("n")?,
            a.dim("k")?,
            a.dim("kp")?,
            a.dim("ldy")?,
        );
        if x.len() < m * kk || w.len() < n * kp / 256 * Q4K_BYTES {
            return Err(GpuError::Invalid(
                "q4k_wgmma: operands smaller than m, n, k".into(),
            ));
        }
        let wd = reference::q4k_bf16_weights(&w, n, kp);
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::q4k_bf16_row(&x[r * kk..(r + 1) * kk], &wd, n, kk, kp, row);
        })?;
        Ok(())
    }

    /// `q4k_gemv`, `q4k_gemv_batch4`.
    pub(crate) fn q4k_gemv(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        self.blocks_gemv(a, reference::q4k_row)
    }

    /// `int8_rows_gemv`, `int8_rows_gemv_batch4`.
    pub(crate) fn int8_rows_gemv(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (x, m) = (self.read_f32(a.ptr("x")?)?, a.dim("m")?);
        let (wq, sw) = (self.read(a.ptr("wq")?)?, self.read_f32(a.ptr("sw")?)?);
        let (y, n, kk, kp, ldy) = projection_out(a)?;
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::int8_rows_row(&x[r * kk..(r + 1) * kk], &wq, &sw, n, kk, kp, row);
        })?;
        Ok(())
    }

    /// `nvfp4_to_q4k`, `nvfp4_to_int8_rows`.
    pub(crate) fn nvfp4_to_q4k(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let name = spec.name;
        use crate::converters::layouts;
        let (codes, scales) = (self.read(a.ptr("codes")?)?, self.read(a.ptr("scales")?)?);
        let g = a.float("g")?;
        let (n, kk) = (a.dim("n")?, a.dim("k")?);
        let (kp_nv, kp_q) = (a.dim("kp_nv")?, a.dim("kp_q")?);
        let full = layouts::nvfp4::decode_padded(
            &codes[..n * kp_nv / 2],
            &scales[..n * kp_nv / 16],
            g,
            n,
            kp_nv,
        );
        let x = layouts::crop(&full, kp_nv, n, kk);
        let e = if name == "nvfp4_to_q4k" {
            layouts::q4k_mmq::encode_q4k(&x, n, kk)
        } else {
            layouts::q4k_mmq::encode_int8(&x, n, kk)
        };
        if e.padded[1] != kp_q {
            return Err(GpuError::Invalid(format!(
                "{name}: kp {kp_q} is not k {kk} rounded up to 256"
            )));
        }
        if name == "nvfp4_to_q4k" {
            self.write(a.ptr("out")?, 0, &e.parts[0].1)?;
        } else {
            self.write(a.ptr("qc")?, 0, &e.parts[0].1)?;
            self.write(a.ptr("qs")?, 0, &e.parts[1].1)?;
        }
        Ok(())
    }

    /// `requant_a_bf16_int8`.
    pub(crate) fn requant_a_bf16_int8(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let x = self.read_f32(a.ptr("x")?)?;
        let (m, kk, kp) = (a.dim("m")?, a.dim("k")?, a.dim("kp")?);
        let (qc, qs) = (a.ptr("qc")?, a.ptr("qs")?);
        for r in 0..m {
            let (q, d) = reference::requant_row_bf16_int8(&x[r * kk..(r + 1) * kk], kp);
            self.write(qc, r * kp, &q)?;
            self.write_f32(qs, r, &[d])?;
        }
        Ok(())
    }

    /// `q4k_mmq_int8_down_gemm`, `int8_wgmma`.
    pub(crate) fn q4k_mmq_int8_down_gemm(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (aq, sa, m) = (
            self.read(a.ptr("aq")?)?,
            self.read_f32(a.ptr("sa")?)?,
            a.dim("m")?,
        );
        let (wq, sw) = (self.read(a.ptr("wq")?)?, self.read_f32(a.ptr("sw")?)?);
        let (y, n, kp, ldy) = (a.ptr("y")?, a.dim("n")?, a.dim("kp")?, a.dim("ldy")?);
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::int8_row(&aq[r * kp..(r + 1) * kp], sa[r], &wq, &sw, n, kp, row);
        })?;
        Ok(())
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] = &[
    (&["q4k_wgmma"], HostBackend::q4k_wgmma),
    (
        &["nvfp4_to_q4k", "nvfp4_to_int8_rows"],
        HostBackend::nvfp4_to_q4k,
    ),
    (&["requant_a_bf16_int8"], HostBackend::requant_a_bf16_int8),
    (
        &["q4k_mmq_int8_down_gemm", "int8_wgmma"],
        HostBackend::q4k_mmq_int8_down_gemm,
    ),
    (&["q4k_gemv", "q4k_gemv_batch4"], HostBackend::q4k_gemv),
    (
        &["int8_rows_gemv", "int8_rows_gemv_batch4"],
        HostBackend::int8_rows_gemv,
    ),
];
