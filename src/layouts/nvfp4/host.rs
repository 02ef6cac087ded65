//! The host twins of the NVFP4 kernels (`kernels.cu`): the W4A16 GEMVs and GEMMs (the `_t` and MMQ forms read through their codecs), the W4A4 quantizer and projection, through `gpu::reference`.

use crate::gpu::DevicePtr;
use crate::gpu::GpuResult;
use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::*;
use crate::gpu::reference;
use crate::gpu::reference::ActRound;
use crate::gpu::table::{Args, KernelSpec};

impl HostBackend {
    /// `m` rows of an NVFP4 product into `y` at row stride `ldy`.
    #[allow(clippy::too_many_arguments)]
    fn nvfp4_rows(
        &self,
        x: &[f32],
        m: usize,
        k: usize,
        codes: &[u8],
        scales: &[u8],
        g: f32,
        n: usize,
        kp: usize,
        round: ActRound,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::nvfp4_row(
                &x[r * k..(r + 1) * k],
                codes,
                scales,
                g,
                n,
                k,
                kp,
                round,
                row,
            );
        })?;
        Ok(())
    }

    /// `w4a16_gemv`, `w4a16_gemv_ksplit`, `w4a16_gemv_batch2`, `w4a16_gemv_batch3`, `nvfp4_proj_small_m4`, `nvfp4_proj_small_m8`, `nvfp4_proj_small_m16`, `w4a16_gemm`.
    pub(crate) fn w4a16_gemv(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let round = spec.round;
        let (x, m) = (self.read_f32(a.ptr("x")?)?, a.dim("m")?);
        let (n, kk, kp, ldy) = (a.dim("n")?, a.dim("k")?, a.dim("kp")?, a.dim("ldy")?);
        let (codes, scales) = (self.read(a.ptr("codes")?)?, self.read(a.ptr("scales")?)?);
        let (g, y) = (a.float("g")?, a.ptr("y")?);
        self.nvfp4_rows(&x, m, kk, &codes, &scales, g, n, kp, round, y, ldy)?;
        Ok(())
    }

    /// `w4a16_gemv_dual`, `w4a16_gemv_dual_batch2`, `w4a16_gemv_dual_batch3`.
    pub(crate) fn w4a16_gemv_dual(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let round = spec.round;
        let (x, m) = (self.read_f32(a.ptr("x")?)?, a.dim("m")?);
        let (n, kk, kp, ldy) = (a.dim("n")?, a.dim("k")?, a.dim("kp")?, a.dim("ldy")?);
        for (c, s, g, y) in [("cg", "sg", "gg", "yg"), ("cu", "su", "gu", "yu")] {
            let (codes, scales) = (self.read(a.ptr(c)?)?, self.read(a.ptr(s)?)?);
            let (g, y) = (a.float(g)?, a.ptr(y)?);
            self.nvfp4_rows(&x, m, kk, &codes, &scales, g, n, kp, round, y, ldy)?;
        }
        Ok(())
    }

    /// `w4a16_gemv_silu_down`.
    pub(crate) fn w4a16_gemv_silu_down(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let round = spec.round;
        let (gate, up, m) = (
            self.read_f32(a.ptr("gate")?)?,
            self.read_f32(a.ptr("up")?)?,
            a.dim("m")?,
        );
        let (codes, scales) = (self.read(a.ptr("codes")?)?, self.read(a.ptr("scales")?)?);
        let (g, y) = (a.float("g")?, a.ptr("y")?);
        let (n, kk, kp) = (a.dim("n")?, a.dim("k")?, a.dim("kp")?);
        let (ldy, ldx) = (a.dim("ldy")?, a.dim("ldx")?);
        let x: Vec<f32> = (0..m)
            .flat_map(|r| (0..kk).map(move |c| r * ldx + c))
            .map(|i| reference::silu_mul(gate[i], up[i]))
            .collect();
        self.nvfp4_rows(&x, m, kk, &codes, &scales, g, n, kp, round, y, ldy)?;
        Ok(())
    }

    /// `w4a16_gemm_t`, `w4a16_gemm_t_k64`, `w4a16_gemm_t_m128`, `w4a16_gemm_t_m128_v2`, `nvfp4_mmq_gemm`, `nvfp4_wgmma`.
    pub(crate) fn w4a16_gemm_t(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let name = spec.name;
        let round = spec.round;
        let m = a.dim("m")?;
        // nvfp4_wgmma takes its activations already rounded to bf16.
        let x = if name == "nvfp4_wgmma" {
            self.read_bf16_il8(a.ptr("x")?)?
        } else {
            self.read_f32(a.ptr("x")?)?
        };
        let (g, y, n, np) = (a.float("g")?, a.ptr("y")?, a.dim("n")?, a.dim("np")?);
        let (kk, kp, ldy) = (a.dim("k")?, a.dim("kp")?, a.dim("ldy")?);
        let (codes, scales) = if name != "w4a16_gemm_t"
            && name != "w4a16_gemm_t_k64"
            && !name.starts_with("w4a16_gemm_t_m128")
        {
            crate::converters::layouts::nvfp4_mmq::to_nvfp4(&self.read(a.ptr("tiles")?)?, n, np, kp)
        } else {
            crate::converters::layouts::nvfp4_t::to_nvfp4(
                &self.read(a.ptr("ct")?)?,
                &self.read(a.ptr("st")?)?,
                n,
                np,
                kp,
            )
        };
        self.nvfp4_rows(&x, m, kk, &codes, &scales, g, n, kp, round, y, ldy)?;
        Ok(())
    }

    /// `quantize_act_nvfp4`.
    pub(crate) fn quantize_act_nvfp4(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let x = self.read_f32(a.ptr("x")?)?;
        let (m, kk, kp) = (a.dim("m")?, a.dim("k")?, a.dim("kp")?);
        let (qc, qs, qg) = (a.ptr("qc")?, a.ptr("qs")?, a.ptr("qg")?);
        for r in 0..m {
            let (c, s, g) = reference::quantize_row_nvfp4(&x[r * kk..(r + 1) * kk], kp);
            self.write(qc, r * kp / 2, &c)?;
            self.write(qs, r * kp / 16, &s)?;
            self.write_f32(qg, r, &[g])?;
        }
        Ok(())
    }

    /// `nvfp4_proj_mx`.
    pub(crate) fn nvfp4_proj_mx(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (qc, qs, qg, m) = (
            self.read(a.ptr("qc")?)?,
            self.read(a.ptr("qs")?)?,
            self.read_f32(a.ptr("qg")?)?,
            a.dim("m")?,
        );
        let (codes, scales) = (self.read(a.ptr("codes")?)?, self.read(a.ptr("scales")?)?);
        let (gw, y) = (a.float("gw")?, a.ptr("y")?);
        let (n, kp, ldy) = (a.dim("n")?, a.dim("kp")?, a.dim("ldy")?);
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::w4a4_row(
                &qc[r * kp / 2..(r + 1) * kp / 2],
                &qs[r * kp / 16..(r + 1) * kp / 16],
                qg[r],
                &codes,
                &scales,
                gw,
                n,
                kp,
                row,
            );
        })?;
        Ok(())
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] = &[
    (
        &[
            "w4a16_gemv",
            "w4a16_gemv_ksplit",
            "w4a16_gemv_batch2",
            "w4a16_gemv_batch3",
            "nvfp4_proj_small_m4",
            "nvfp4_proj_small_m8",
            "nvfp4_proj_small_m16",
            "w4a16_gemm",
        ],
        HostBackend::w4a16_gemv,
    ),
    (
        &[
            "w4a16_gemv_dual",
            "w4a16_gemv_dual_batch2",
            "w4a16_gemv_dual_batch3",
        ],
        HostBackend::w4a16_gemv_dual,
    ),
    (&["w4a16_gemv_silu_down"], HostBackend::w4a16_gemv_silu_down),
    (
        &[
            "w4a16_gemm_t",
            "w4a16_gemm_t_k64",
            "w4a16_gemm_t_m128",
            "w4a16_gemm_t_m128_v2",
            "nvfp4_mmq_gemm",
            "nvfp4_wgmma",
        ],
        HostBackend::w4a16_gemm_t,
    ),
    (&["quantize_act_nvfp4"], HostBackend::quantize_act_nvfp4),
    (&["nvfp4_proj_mx"], HostBackend::nvfp4_proj_mx),
];
