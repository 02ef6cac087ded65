//! The host backend's kernels: every entry point of `kernels/*.cu`, by name, with the
//! [`reference`](super::super::reference) numerics. Arguments are read by parameter name
//! through the kernel table ([`Args`]), after the launch was checked against the table's
//! description (count, kinds and row cap); each kernel's activation rounding is the table's.

use super::super::reference;
use super::super::table::{Args, KernelSpec};
use super::super::{GpuError, GpuResult};
use super::HostBackend;
use crate::gpu::sizes::*;

/// A host twin: the kernel's work on the host backend's memory.
type Twin = fn(&HostBackend, &KernelSpec, &Args) -> GpuResult<()>;

/// Every kernel's host twin, by the kernel names it serves.
const TWINS: &[(&[&str], Twin)] = &[
    (
        &[
            "act_mul_silu",
            "act_mul_gelu",
            "act_mul_silu_il8",
            "act_mul_gelu_il8",
        ],
        HostBackend::act_mul_silu,
    ),
    (&["q4k_wgmma"], HostBackend::q4k_wgmma),
    (&["f32_to_bf16_il8"], HostBackend::f32_to_bf16_il8),
    (&["f32_to_bf16"], HostBackend::f32_to_bf16),
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
    (
        &["w8a8_gemm", "w8a8_gemv", "w8a8_wgmma", "w8a8_wgmma_m64"],
        HostBackend::w8a8_gemm,
    ),
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
    (&["lora_a"], HostBackend::lora_a),
    (&["lora_b_add"], HostBackend::lora_b_add),
    (
        &["q2g128_gemv", "q2g128_gemv_batchm"],
        HostBackend::q2g128_gemv,
    ),
    (&["q2g128_dequant_bf16"], HostBackend::q2g128_dequant_bf16),
    (
        &[
            "affine4_gemv",
            "affine4_gemv_batch4",
            "affine4_gemv_batch16",
            "affine8_gemv",
            "affine8_gemv_batch4",
            "affine8_gemv_batch16",
            "affine4_gemv_ks",
            "affine8_gemv_ks",
        ],
        HostBackend::affine_gemv,
    ),
    (
        &["affine4_gemv_act", "affine8_gemv_act"],
        HostBackend::affine_gemv_act,
    ),
    (&["affine_quantize_act"], HostBackend::affine_quantize_act),
    (&["affine_from_ggml"], HostBackend::affine_from_ggml),
    (&["affine_from_awq"], HostBackend::affine_from_awq),
    (&["affine_from_gptq"], HostBackend::affine_from_gptq),
    (&["affine_gather_bf16"], HostBackend::affine_gather_bf16),
    (&["affine_dequant_bf16"], HostBackend::affine_dequant_bf16),
    (&["quantize_act_q8_1"], HostBackend::quantize_act_q8_1),
    (
        &["quantize_act_mul_q8_1"],
        HostBackend::quantize_act_mul_q8_1,
    ),
    (
        &["q2g128_mmq_gemm", "q4k_mmq_gemm"],
        HostBackend::q2g128_mmq_gemm,
    ),
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
    (&["ggml_gemv"], HostBackend::ggml_gemv),
    (&["ggml_dequant_bf16"], HostBackend::ggml_dequant_bf16),
    (
        &["int8_rows_gemv", "int8_rows_gemv_batch4"],
        HostBackend::int8_rows_gemv,
    ),
    (&["nvfp4_mmq_repack"], HostBackend::nvfp4_mmq_repack),
    (&["bf16_gemv_batch4"], HostBackend::bf16_gemv_batch4),
    (&["stream_probe"], HostBackend::stream_probe),
    (&["blob_rules"], HostBackend::blob_rules),
];

impl HostBackend {
    /// Run kernel `spec` on the arguments `a` through its host twin.
    pub(super) fn run_kernel(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (_, twin) = TWINS
            .iter()
            .find(|(names, _)| names.contains(&spec.name))
            .ok_or_else(|| {
                GpuError::Invalid(format!(
                    "host backend has no implementation of {}",
                    spec.name
                ))
            })?;
        twin(self, spec, a)
    }

    /// `act_mul_silu`, `act_mul_gelu`, `act_mul_silu_il8`, `act_mul_gelu_il8`.
    fn act_mul_silu(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let name = spec.name;
        let (rows, cols) = (a.dim("rows")?, a.dim("cols")?);
        let (gs, us, os) = (a.dim("gs")?, a.dim("us")?, a.dim("os")?);
        let (g, u) = (self.read_f32(a.ptr("g")?)?, self.read_f32(a.ptr("u")?)?);
        let out = a.ptr("out")?;
        let silu = name.starts_with("act_mul_silu");
        for r in 0..rows {
            let row: Vec<f32> = (0..cols)
                .map(|c| {
                    let (gv, uv) = (g[r * gs + c], u[r * us + c]);
                    if silu {
                        reference::silu_mul(gv, uv)
                    } else {
                        reference::gelu_mul(gv, uv)
                    }
                })
                .collect();
            // f32, or bf16 in the il8 order.
            if name.ends_with("_il8") {
                self.write(out, r * os * 2, &bf16_il8_bytes(&row))?;
            } else {
                self.write_f32(out, r * os, &row)?;
            }
        }
        Ok(())
    }

    /// `q4k_wgmma`.
    fn q4k_wgmma(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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

    /// `f32_to_bf16_il8`.
    fn f32_to_bf16_il8(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let x = self.read_f32(a.ptr("x")?)?;
        let count = a.dim("count")?;
        self.write(a.ptr("y")?, 0, &bf16_il8_bytes(&x[..count]))?;
        Ok(())
    }

    /// `f32_to_bf16`.
    fn f32_to_bf16(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let x = self.read_f32(a.ptr("x")?)?;
        let count = a.dim("count")?;
        let b: Vec<u8> = x[..count]
            .iter()
            .flat_map(|&v| crate::converters::bf16::from_f32(v).to_le_bytes())
            .collect();
        self.write(a.ptr("y")?, 0, &b)?;
        Ok(())
    }

    /// `w8a16_gemv_batch4`, `w8a16_gemv_mma`, `w8a16_gemv_batch16`, `w8a16_gemm_m16`, `w8a16_gemm_pipelined`, `w8a16_gemm`.
    fn w8a16_gemv_batch4(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn quantize_act_fp8_row(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn fp8_wgmma(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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

    /// `w8a8_gemm`, `w8a8_gemv`, `w8a8_wgmma`, `w8a8_wgmma_m64`.
    fn w8a8_gemm(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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

    /// `w4a16_gemv`, `w4a16_gemv_ksplit`, `w4a16_gemv_batch2`, `w4a16_gemv_batch3`, `nvfp4_proj_small_m4`, `nvfp4_proj_small_m8`, `nvfp4_proj_small_m16`, `w4a16_gemm`.
    fn w4a16_gemv(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let round = spec.round;
        let (x, m) = (self.read_f32(a.ptr("x")?)?, a.dim("m")?);
        let (n, kk, kp, ldy) = (a.dim("n")?, a.dim("k")?, a.dim("kp")?, a.dim("ldy")?);
        let (codes, scales) = (self.read(a.ptr("codes")?)?, self.read(a.ptr("scales")?)?);
        let (g, y) = (a.float("g")?, a.ptr("y")?);
        self.nvfp4_rows(&x, m, kk, &codes, &scales, g, n, kp, round, y, ldy)?;
        Ok(())
    }

    /// `w4a16_gemv_dual`, `w4a16_gemv_dual_batch2`, `w4a16_gemv_dual_batch3`.
    fn w4a16_gemv_dual(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn w4a16_gemv_silu_down(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn w4a16_gemm_t(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn quantize_act_nvfp4(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn nvfp4_proj_mx(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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

    /// `lora_a`.
    fn lora_a(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn lora_b_add(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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

    /// `q2g128_gemv`, `q2g128_gemv_batchm`.
    fn q2g128_gemv(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        self.blocks_gemv(a, reference::q2_row)
    }

    /// `q4k_gemv`, `q4k_gemv_batch4`.
    fn q4k_gemv(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        self.blocks_gemv(a, reference::q4k_row)
    }

    /// A GEMV over rows of quantized blocks `w` (`x:p m:i w:p y:p n:i k:i kp:i ldy:i`): each of
    /// the `m` activation rows through the f64 twin `row`.
    fn blocks_gemv(&self, a: &Args, row: BlocksRow) -> GpuResult<()> {
        let (x, m, w) = (
            self.read_f32(a.ptr("x")?)?,
            a.dim("m")?,
            self.read(a.ptr("w")?)?,
        );
        let (y, n, kk, kp, ldy) = projection_out(a)?;
        self.write_rows(y, ldy, m, n, |r, out| {
            row(&x[r * kk..(r + 1) * kk], &w, n, kk, kp, out);
        })?;
        Ok(())
    }

    /// `int8_rows_gemv`, `int8_rows_gemv_batch4`.
    fn int8_rows_gemv(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (x, m) = (self.read_f32(a.ptr("x")?)?, a.dim("m")?);
        let (wq, sw) = (self.read(a.ptr("wq")?)?, self.read_f32(a.ptr("sw")?)?);
        let (y, n, kk, kp, ldy) = projection_out(a)?;
        self.write_rows(y, ldy, m, n, |r, row| {
            reference::int8_rows_row(&x[r * kk..(r + 1) * kk], &wq, &sw, n, kk, kp, row);
        })?;
        Ok(())
    }

    /// `q2g128_dequant_bf16`.
    fn q2g128_dequant_bf16(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (w, n, kp) = (self.read(a.ptr("w")?)?, a.dim("n")?, a.dim("kp")?);
        self.write(a.ptr("out")?, 0, &reference::q2_dequant_bf16(&w, n, kp))?;
        Ok(())
    }

    /// `quantize_act_q8_1`.
    fn quantize_act_q8_1(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let x = self.read_f32(a.ptr("x")?)?;
        let (m, kk, kp) = (a.dim("m")?, a.dim("k")?, a.dim("kp")?);
        let out = a.ptr("out")?;
        for r in 0..m {
            let q = reference::quantize_row_q8_1_act(&x[r * kk..(r + 1) * kk], kp);
            self.write(out, r * kp / Q8_1_ELEMS * Q8_1_BYTES, &q)?;
        }
        Ok(())
    }

    /// `quantize_act_mul_q8_1`: the twin's gated product, then its q8_1 blocks.
    fn quantize_act_mul_q8_1(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (g, u) = (self.read_f32(a.ptr("g")?)?, self.read_f32(a.ptr("u")?)?);
        let (m, kk, ld, kp) = (a.dim("m")?, a.dim("k")?, a.dim("ld")?, a.dim("kp")?);
        let act = match a.dim("act")? {
            0 => reference::silu_mul,
            1 => reference::gelu_mul,
            v => {
                return Err(GpuError::Invalid(format!(
                    "quantize_act_mul_q8_1: act {v}, not 0 or 1"
                )));
            }
        };
        let out = a.ptr("out")?;
        for r in 0..m {
            let row: Vec<f32> = (0..kk).map(|e| act(g[r * ld + e], u[r * ld + e])).collect();
            let q = reference::quantize_row_q8_1_act(&row, kp);
            self.write(out, r * kp / Q8_1_ELEMS * Q8_1_BYTES, &q)?;
        }
        Ok(())
    }

    /// `q2g128_mmq_gemm`, `q4k_mmq_gemm`.
    fn q2g128_mmq_gemm(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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

    /// `nvfp4_to_q4k`, `nvfp4_to_int8_rows`.
    fn nvfp4_to_q4k(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn requant_a_bf16_int8(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
    fn q4k_mmq_int8_down_gemm(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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

    /// `nvfp4_mmq_repack`.
    fn nvfp4_mmq_repack(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let name = spec.name;
        let (codes, scales) = (self.read(a.ptr("codes")?)?, self.read(a.ptr("scales")?)?);
        let (n, np, kp) = (a.dim("n")?, a.dim("np")?, a.dim("kp")?);
        let e = crate::converters::layouts::nvfp4_mmq::from_nvfp4(
            &codes[..n * kp / 2],
            &scales[..n * kp / 16],
            0.0,
            n,
            kp,
        );
        if e.padded[0] != np {
            return Err(GpuError::Invalid(format!(
                "{name}: np {np} is not n {n} rounded up to 128"
            )));
        }
        self.write(a.ptr("out")?, 0, &e.parts[0].1)?;
        Ok(())
    }

    /// `stream_probe`.
    fn stream_probe(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (count, per) = (a.dim("count")?, a.dim("per")?);
        let p = self.read(a.ptr("p")?)?;
        let words = p.get(..count * 16).ok_or_else(|| {
            GpuError::Invalid(format!("stream_probe: {count} words past the buffer"))
        })?;
        let sink = reference::stream_probe(words, per);
        let bytes: Vec<u8> = sink.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(a.ptr("sink")?, 0, &bytes)
    }

    /// `blob_rules`: the twin's first bad index, kept where lower than `bad[slot]`.
    fn blob_rules(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (n, kind, top, slot) = (a.dim("n")?, a.dim("kind")?, a.dim("top")?, a.dim("slot")?);
        let rule = reference::ElementRule::from_kind(kind, top)
            .ok_or_else(|| GpuError::Invalid(format!("blob_rules: kind {kind}")))?;
        let p = self.read(a.ptr("p")?)?;
        if n.checked_mul(rule.elem_bytes()).is_none_or(|b| b > p.len()) {
            return Err(GpuError::Invalid(format!(
                "blob_rules: {n} elements past the buffer of {} bytes",
                p.len()
            )));
        }
        let first = reference::blob_rules(&p, n, rule);
        let bad = a.ptr("bad")?;
        let mut cur = self.read(bad)?;
        let at = slot
            .checked_mul(4)
            .filter(|&o| o + 4 <= cur.len())
            .ok_or_else(|| GpuError::Invalid(format!("blob_rules: slot {slot} past `bad`")))?;
        let old = u32::from_le_bytes([cur[at], cur[at + 1], cur[at + 2], cur[at + 3]]);
        cur[at..at + 4].copy_from_slice(&old.min(first).to_le_bytes());
        self.write(bad, 0, &cur)
    }

    /// `bf16_gemv_batch4`.
    fn bf16_gemv_batch4(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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

/// A projection kernel's output and shape arguments: `(y, n, k, kp, ldy)`.
/// An f64 twin of one activation row through rows of quantized blocks: `(x, w, n, k, kp, y)`
/// (`reference::q2_row`, `reference::q4k_row`).
type BlocksRow = fn(&[f32], &[u8], usize, usize, usize, &mut [f32]);

fn projection_out(a: &Args) -> GpuResult<(crate::gpu::DevicePtr, usize, usize, usize, usize)> {
    Ok((
        a.ptr("y")?,
        a.dim("n")?,
        a.dim("k")?,
        a.dim("kp")?,
        a.dim("ldy")?,
    ))
}

impl HostBackend {
    /// The `m` input rows (`k` values each) of an FP8 activation quantizer: `x`'s rows, or for the
    /// fused ones (`quantize_act_mul_*`) `act(g, u)` of gate and up with their row strides, the
    /// product the host twin's `silu_mul` / `gelu_mul`.
    fn quantizer_rows(&self, name: &str, a: &Args) -> GpuResult<Vec<Vec<f32>>> {
        let (m, kk) = (a.dim("m")?, a.dim("k")?);
        let rows = if name.starts_with("quantize_act_mul_") {
            let (g, u) = (self.read_f32(a.ptr("g")?)?, self.read_f32(a.ptr("u")?)?);
            let (gs, us) = (a.dim("gs")?, a.dim("us")?);
            let f = if a.dim("act")? == 0 {
                reference::silu_mul
            } else {
                reference::gelu_mul
            };
            (0..m)
                .map(|r| {
                    let gr = g.get(r * gs..r * gs + kk)?;
                    let ur = u.get(r * us..r * us + kk)?;
                    Some(gr.iter().zip(ur).map(|(&a, &b)| f(a, b)).collect())
                })
                .collect::<Option<Vec<_>>>()
        } else {
            let x = self.read_f32(a.ptr("x")?)?;
            (0..m)
                .map(|r| x.get(r * kk..(r + 1) * kk).map(<[f32]>::to_vec))
                .collect::<Option<Vec<_>>>()
        };
        rows.ok_or_else(|| GpuError::Invalid(format!("{name}: a row past its input")))
    }
}

/// `x` (a length divisible by 8) as bf16 bytes in the il8 order.
fn bf16_il8_bytes(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() * 2];
    for (c, &v) in x.iter().enumerate() {
        let p = reference::il8_pos(c);
        out[2 * p..2 * p + 2].copy_from_slice(&crate::converters::bf16::from_f32(v).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    /// Every name a twin serves is a kernel of the sources, and every kernel of the sources has a
    /// twin: the host backend runs every path the GPU does.
    #[test]
    fn every_kernel_has_one_host_twin() {
        let kernels: Vec<&str> = super::super::all_kernels()
            .iter()
            .map(|(_, n)| n.as_str())
            .collect();
        let served: Vec<&str> = super::TWINS
            .iter()
            .flat_map(|(n, _)| n.iter().copied())
            .collect();
        let unknown: Vec<_> = served.iter().filter(|n| !kernels.contains(n)).collect();
        assert!(unknown.is_empty(), "twins of no kernel: {unknown:?}");
        let missing: Vec<_> = kernels.iter().filter(|n| !served.contains(n)).collect();
        assert!(
            missing.is_empty(),
            "kernels without a host twin: {missing:?}"
        );
        let mut dup = served.clone();
        dup.sort();
        dup.dedup();
        assert_eq!(dup.len(), served.len(), "a kernel served by two twins");
    }
}
