//! The host backend's kernels: every entry point of `kernels/*.cu`, by name, with the
//! [`reference`](super::super::reference) numerics, its arguments decoded by position after the
//! launch was checked against the kernel's parsed signature.

use super::super::reference::{self, ActRound};
use super::super::{DevicePtr, GpuError, GpuResult, KArg};
use super::HostBackend;
use crate::gpu::sizes::*;

pub(super) fn ptr(a: &[KArg], i: usize) -> GpuResult<DevicePtr> {
    match a.get(i) {
        Some(KArg::Ptr(p)) => Ok(*p),
        other => Err(GpuError::Invalid(format!(
            "argument {i}: expected a pointer, got {other:?}"
        ))),
    }
}

pub(super) fn float(a: &[KArg], i: usize) -> GpuResult<f32> {
    match a.get(i) {
        Some(KArg::F32(v)) => Ok(*v),
        other => Err(GpuError::Invalid(format!(
            "argument {i}: expected f32, got {other:?}"
        ))),
    }
}

/// The row cap of an NVFP4 GEMV-shaped kernel (the tensor-core GEMMs take any m).
pub(super) fn nvfp4_row_cap(name: &str) -> usize {
    match name {
        "w4a16_gemv_batch2" | "w4a16_gemv_dual_batch2" => 2,
        "w4a16_gemv_batch3" | "w4a16_gemv_dual_batch3" => 3,
        "nvfp4_proj_small_m8" => 8,
        "nvfp4_proj_small_m16" => 16,
        "w4a16_gemm" => usize::MAX,
        _ => 4,
    }
}

pub(super) fn int(a: &[KArg], i: usize) -> GpuResult<usize> {
    match a.get(i) {
        Some(KArg::I32(v)) if *v >= 0 => Ok(*v as usize),
        Some(KArg::Dim(v)) if i32::try_from(*v).is_ok() => Ok(*v),
        other => Err(GpuError::Invalid(format!(
            "argument {i}: expected a non-negative i32, got {other:?}"
        ))),
    }
}

impl HostBackend {
    /// Run kernel `name` on the arguments `a`.
    pub(super) fn run_kernel(&self, name: &str, a: &[KArg]) -> GpuResult<()> {
        match name {
            "act_mul_silu" | "act_mul_gelu" => {
                let (rows, cols) = (int(a, 3)?, int(a, 4)?);
                let (gs, us, os) = (int(a, 5)?, int(a, 6)?, int(a, 7)?);
                let (g, u) = (self.read_f32(ptr(a, 0)?)?, self.read_f32(ptr(a, 1)?)?);
                let out = ptr(a, 2)?;
                for r in 0..rows {
                    let row: Vec<f32> = (0..cols)
                        .map(|c| {
                            let (gv, uv) = (g[r * gs + c], u[r * us + c]);
                            if name == "act_mul_silu" {
                                reference::silu_mul(gv, uv)
                            } else {
                                reference::gelu_mul(gv, uv)
                            }
                        })
                        .collect();
                    self.write_f32(out, r * os, &row)?;
                }
            }
            "f32_to_bf16" => {
                let x = self.read_f32(ptr(a, 0)?)?;
                let count = int(a, 2)?;
                let b: Vec<u8> = x[..count]
                    .iter()
                    .flat_map(|&v| crate::converters::bf16::from_f32(v).to_le_bytes())
                    .collect();
                self.write(ptr(a, 1)?, 0, &b)?;
            }
            "w8a16_gemv_batch4"
            | "w8a16_gemv_batch16"
            | "w8a16_gemm_m16"
            | "w8a16_gemm_pipelined"
            | "w8a16_gemm" => {
                let round = if name == "w8a16_gemm_m16" || name == "w8a16_gemm_pipelined" {
                    ActRound::Bf16
                } else {
                    ActRound::None
                };
                let (x, m) = (self.read_f32(ptr(a, 0)?)?, int(a, 1)?);
                let (w, s) = (self.read(ptr(a, 2)?)?, self.read_f32(ptr(a, 3)?)?);
                let (y, n, kk, kp, ldy) =
                    (ptr(a, 4)?, int(a, 5)?, int(a, 6)?, int(a, 7)?, int(a, 8)?);
                let cap = match name {
                    "w8a16_gemv_batch4" => 4,
                    "w8a16_gemv_batch16" | "w8a16_gemm_m16" => 16,
                    _ => usize::MAX,
                };
                if m > cap {
                    return Err(GpuError::Invalid(format!("{name}: m = {m} > {cap}")));
                }
                self.write_rows(y, ldy, m, n, |r, row| {
                    reference::fp8_block_row(
                        &x[r * kk..(r + 1) * kk],
                        &w,
                        &s,
                        n,
                        kk,
                        kp,
                        round,
                        row,
                    );
                })?;
            }
            "quantize_act_fp8_row" => {
                let (x, m, kk, kp) = (
                    self.read_f32(ptr(a, 0)?)?,
                    int(a, 1)?,
                    int(a, 2)?,
                    int(a, 3)?,
                );
                let (q, sx) = (ptr(a, 4)?, ptr(a, 5)?);
                for r in 0..m {
                    let (codes, scale) = reference::quantize_row_fp8(&x[r * kk..(r + 1) * kk], kp);
                    self.write(q, r * kp, &codes)?;
                    self.write_f32(sx, r, &[scale])?;
                }
            }
            "w8a8_gemm" => {
                let (q, sx, m) = (
                    self.read(ptr(a, 0)?)?,
                    self.read_f32(ptr(a, 1)?)?,
                    int(a, 2)?,
                );
                let (w, sw) = (self.read(ptr(a, 3)?)?, self.read_f32(ptr(a, 4)?)?);
                let (y, n, kp, ldy) = (ptr(a, 5)?, int(a, 6)?, int(a, 7)?, int(a, 8)?);
                self.write_rows(y, ldy, m, n, |r, row| {
                    reference::w8a8_row(&q[r * kp..(r + 1) * kp], sx[r], &w, &sw, n, kp, row);
                })?;
            }
            "w4a16_gemv"
            | "w4a16_gemv_ksplit"
            | "w4a16_gemv_batch2"
            | "w4a16_gemv_batch3"
            | "w4a16_gemv_dual"
            | "w4a16_gemv_dual_batch2"
            | "w4a16_gemv_dual_batch3"
            | "nvfp4_proj_small_m4"
            | "nvfp4_proj_small_m8"
            | "nvfp4_proj_small_m16"
            | "w4a16_gemm" => {
                let (x, m) = (self.read_f32(ptr(a, 0)?)?, int(a, 1)?);
                // The GEMVs take f32 activations and up to their row cap; the tensor-core GEMM
                // rounds activations to bf16 and takes any m.
                let round = if name == "w4a16_gemm" {
                    ActRound::Bf16
                } else {
                    ActRound::None
                };
                let cap = nvfp4_row_cap(name);
                if m > cap {
                    return Err(GpuError::Invalid(format!("{name}: m = {m} > {cap}")));
                }
                // (codes, scales, global, y) groups, then n, k, kp, ldy.
                let dual = name.starts_with("w4a16_gemv_dual");
                let groups: &[usize] = if dual { &[2, 6] } else { &[2] };
                let tail = if dual { 10 } else { 6 };
                let (n, kk, kp, ldy) = (
                    int(a, tail)?,
                    int(a, tail + 1)?,
                    int(a, tail + 2)?,
                    int(a, tail + 3)?,
                );
                for &gi in groups {
                    let (codes, scales, g, y) = (
                        self.read(ptr(a, gi)?)?,
                        self.read(ptr(a, gi + 1)?)?,
                        float(a, gi + 2)?,
                        ptr(a, gi + 3)?,
                    );
                    self.nvfp4_rows(&x, m, kk, &codes, &scales, g, n, kp, round, y, ldy)?;
                }
            }
            "w4a16_gemv_silu_down" => {
                let (gate, up, m) = (
                    self.read_f32(ptr(a, 0)?)?,
                    self.read_f32(ptr(a, 1)?)?,
                    int(a, 2)?,
                );
                let (codes, scales, g, y) = (
                    self.read(ptr(a, 3)?)?,
                    self.read(ptr(a, 4)?)?,
                    float(a, 5)?,
                    ptr(a, 6)?,
                );
                let (n, kk, kp, ldy, ldx) =
                    (int(a, 7)?, int(a, 8)?, int(a, 9)?, int(a, 10)?, int(a, 11)?);
                if m > 4 {
                    return Err(GpuError::Invalid(format!("{name}: m = {m} > 4")));
                }
                let x: Vec<f32> = (0..m)
                    .flat_map(|r| (0..kk).map(move |c| r * ldx + c))
                    .map(|i| reference::silu_mul(gate[i], up[i]))
                    .collect();
                self.nvfp4_rows(&x, m, kk, &codes, &scales, g, n, kp, ActRound::None, y, ldy)?;
            }
            "w4a16_gemm_t"
            | "w4a16_gemm_t_k64"
            | "w4a16_gemm_t_m128"
            | "w4a16_gemm_t_m128_v2"
            | "nvfp4_mmq_gemm" => {
                let (x, m) = (self.read_f32(ptr(a, 0)?)?, int(a, 1)?);
                // (x, m, ct, st, g, ...) for the _t GEMMs; (x, m, tiles, g, ...) for MMQ.
                let mmq = name == "nvfp4_mmq_gemm";
                let o = if mmq { 3 } else { 4 };
                let (g, y, n, np, kk, kp, ldy) = (
                    float(a, o)?,
                    ptr(a, o + 1)?,
                    int(a, o + 2)?,
                    int(a, o + 3)?,
                    int(a, o + 4)?,
                    int(a, o + 5)?,
                    int(a, o + 6)?,
                );
                let (codes, scales) = if mmq {
                    crate::converters::layouts::nvfp4_mmq::to_nvfp4(
                        &self.read(ptr(a, 2)?)?,
                        n,
                        np,
                        kp,
                    )
                } else {
                    crate::converters::layouts::nvfp4_t::to_nvfp4(
                        &self.read(ptr(a, 2)?)?,
                        &self.read(ptr(a, 3)?)?,
                        n,
                        np,
                        kp,
                    )
                };
                self.nvfp4_rows(&x, m, kk, &codes, &scales, g, n, kp, ActRound::Bf16, y, ldy)?;
            }
            "quantize_act_nvfp4" => {
                let (x, m, kk, kp) = (
                    self.read_f32(ptr(a, 0)?)?,
                    int(a, 1)?,
                    int(a, 2)?,
                    int(a, 3)?,
                );
                let (qc, qs, qg) = (ptr(a, 4)?, ptr(a, 5)?, ptr(a, 6)?);
                for r in 0..m {
                    let (c, s, g) = reference::quantize_row_nvfp4(&x[r * kk..(r + 1) * kk], kp);
                    self.write(qc, r * kp / 2, &c)?;
                    self.write(qs, r * kp / 16, &s)?;
                    self.write_f32(qg, r, &[g])?;
                }
            }
            "nvfp4_proj_mx" => {
                let (qc, qs, qg, m) = (
                    self.read(ptr(a, 0)?)?,
                    self.read(ptr(a, 1)?)?,
                    self.read_f32(ptr(a, 2)?)?,
                    int(a, 3)?,
                );
                let (codes, scales, gw, y) = (
                    self.read(ptr(a, 4)?)?,
                    self.read(ptr(a, 5)?)?,
                    float(a, 6)?,
                    ptr(a, 7)?,
                );
                let (n, kp, ldy) = (int(a, 8)?, int(a, 9)?, int(a, 10)?);
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
            }
            "lora_a" => {
                let (x, m, kk, ldx) = (
                    self.read_f32(ptr(a, 0)?)?,
                    int(a, 1)?,
                    int(a, 2)?,
                    int(a, 3)?,
                );
                let (am, r, xa) = (self.read(ptr(a, 4)?)?, int(a, 5)?, ptr(a, 6)?);
                for row in 0..m {
                    let v = reference::lora_a_row(&x[row * ldx..row * ldx + kk], &am, kk, r);
                    self.write_f32(xa, row * r, &v)?;
                }
            }
            "lora_b_add" => {
                let (xa, m, r) = (self.read_f32(ptr(a, 0)?)?, int(a, 1)?, int(a, 2)?);
                let (bm, scaling, y, n, ldy) = (
                    self.read(ptr(a, 3)?)?,
                    float(a, 4)?,
                    ptr(a, 5)?,
                    int(a, 6)?,
                    int(a, 7)?,
                );
                let yv = self.read_f32(y)?;
                for row in 0..m {
                    let mut out = yv[row * ldy..row * ldy + n].to_vec();
                    reference::lora_b_row(
                        &xa[row * r..(row + 1) * r],
                        &bm,
                        n,
                        r,
                        scaling,
                        &mut out,
                    );
                    self.write_f32(y, row * ldy, &out)?;
                }
            }
            "q2g128_gemv" | "q2g128_gemv_batchm" => {
                let (x, m, w) = (
                    self.read_f32(ptr(a, 0)?)?,
                    int(a, 1)?,
                    self.read(ptr(a, 2)?)?,
                );
                let (y, n, kk, kp, ldy) =
                    (ptr(a, 3)?, int(a, 4)?, int(a, 5)?, int(a, 6)?, int(a, 7)?);
                let cap = if name == "q2g128_gemv" { 1 } else { 4 };
                if m > cap {
                    return Err(GpuError::Invalid(format!("{name}: m = {m} > {cap}")));
                }
                self.write_rows(y, ldy, m, n, |r, row| {
                    reference::q2_row(&x[r * kk..(r + 1) * kk], &w, n, kk, kp, row);
                })?;
            }
            "q2g128_dequant_bf16" => {
                let (w, n, kp) = (self.read(ptr(a, 0)?)?, int(a, 1)?, int(a, 2)?);
                self.write(ptr(a, 3)?, 0, &reference::q2_dequant_bf16(&w, n, kp))?;
            }
            "quantize_act_q8_1" => {
                let (x, m, kk, kp) = (
                    self.read_f32(ptr(a, 0)?)?,
                    int(a, 1)?,
                    int(a, 2)?,
                    int(a, 3)?,
                );
                let out = ptr(a, 4)?;
                for r in 0..m {
                    let q = reference::quantize_row_q8_1_act(&x[r * kk..(r + 1) * kk], kp);
                    self.write(out, r * kp / Q8_1_ELEMS * Q8_1_BYTES, &q)?;
                }
            }
            "q2g128_mmq_gemm" => {
                let (xq, m, w) = (self.read(ptr(a, 0)?)?, int(a, 1)?, self.read(ptr(a, 2)?)?);
                let (y, n, kp, ldy) = (ptr(a, 3)?, int(a, 4)?, int(a, 5)?, int(a, 6)?);
                let bs = kp / Q8_1_ELEMS * Q8_1_BYTES;
                self.write_rows(y, ldy, m, n, |r, row| {
                    reference::q2_mmq_row(&xq[r * bs..(r + 1) * bs], &w, n, kp, row);
                })?;
            }
            "nvfp4_to_q4k" | "nvfp4_to_int8_rows" => {
                use crate::converters::layouts;
                let (codes, scales, g) =
                    (self.read(ptr(a, 0)?)?, self.read(ptr(a, 1)?)?, float(a, 2)?);
                let (n, kk, kp_nv, kp_q) = (int(a, 3)?, int(a, 4)?, int(a, 5)?, int(a, 6)?);
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
                self.write(ptr(a, 7)?, 0, &e.parts[0].1)?;
                if name == "nvfp4_to_int8_rows" {
                    self.write(ptr(a, 8)?, 0, &e.parts[1].1)?;
                }
            }
            "q4k_mmq_gemm" => {
                let (xq, m, w) = (self.read(ptr(a, 0)?)?, int(a, 1)?, self.read(ptr(a, 2)?)?);
                let (y, n, kp, ldy) = (ptr(a, 3)?, int(a, 4)?, int(a, 5)?, int(a, 6)?);
                let bs = kp / Q8_1_ELEMS * Q8_1_BYTES;
                self.write_rows(y, ldy, m, n, |r, row| {
                    reference::q4k_mmq_row(&xq[r * bs..(r + 1) * bs], &w, n, kp, row);
                })?;
            }
            "requant_a_bf16_int8" => {
                let (x, m, kk, kp) = (
                    self.read_f32(ptr(a, 0)?)?,
                    int(a, 1)?,
                    int(a, 2)?,
                    int(a, 3)?,
                );
                let (qc, qs) = (ptr(a, 4)?, ptr(a, 5)?);
                for r in 0..m {
                    let (q, d) = reference::requant_row_bf16_int8(&x[r * kk..(r + 1) * kk], kp);
                    self.write(qc, r * kp, &q)?;
                    self.write_f32(qs, r, &[d])?;
                }
            }
            "q4k_mmq_int8_down_gemm" => {
                let (aq, sa, m) = (
                    self.read(ptr(a, 0)?)?,
                    self.read_f32(ptr(a, 1)?)?,
                    int(a, 2)?,
                );
                let (wq, sw) = (self.read(ptr(a, 3)?)?, self.read_f32(ptr(a, 4)?)?);
                let (y, n, kp, ldy) = (ptr(a, 5)?, int(a, 6)?, int(a, 7)?, int(a, 8)?);
                self.write_rows(y, ldy, m, n, |r, row| {
                    reference::int8_row(&aq[r * kp..(r + 1) * kp], sa[r], &wq, &sw, n, kp, row);
                })?;
            }
            "nvfp4_mmq_repack" => {
                let (codes, scales) = (self.read(ptr(a, 0)?)?, self.read(ptr(a, 1)?)?);
                let (n, np, kp) = (int(a, 2)?, int(a, 3)?, int(a, 4)?);
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
                self.write(ptr(a, 5)?, 0, &e.parts[0].1)?;
            }
            "bf16_gemv_batch4" => {
                let (x, m) = (self.read_f32(ptr(a, 0)?)?, int(a, 1)?);
                let w = self.read(ptr(a, 2)?)?;
                let (y, n, kk, kp, ldy) =
                    (ptr(a, 3)?, int(a, 4)?, int(a, 5)?, int(a, 6)?, int(a, 7)?);
                if m > 4 {
                    return Err(GpuError::Invalid(format!("{name}: m = {m} > 4")));
                }
                self.write_rows(y, ldy, m, n, |r, row| {
                    reference::bf16_row(
                        &x[r * kk..(r + 1) * kk],
                        &w,
                        n,
                        kk,
                        kp,
                        ActRound::None,
                        row,
                    );
                })?;
            }
            other => {
                return Err(GpuError::Invalid(format!(
                    "host backend has no implementation of {other}"
                )));
            }
        }
        Ok(())
    }
}
