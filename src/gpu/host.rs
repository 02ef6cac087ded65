//! The host reference backend: "device" memory in host vectors and every kernel name of
//! `kernels/*.cu` implemented with the [`reference`](super::reference) numerics, so routing and
//! layer logic run in CI without a GPU. Kernels can be hidden to exercise fall-through paths.

use super::reference::{self, ActRound};
use super::{
    DevicePtr, EventId, GemmBf16, GpuBackend, GpuError, GpuResult, KArg, KernelHandle, LaunchCfg,
    StreamId, kernels,
};
use crate::gpu::sizes::*;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The CPU implementation of the runtime.
pub struct HostBackend {
    mem: Mutex<BTreeMap<u64, Vec<u8>>>,
    next: AtomicU64,
    names: Vec<(String, String)>,
    /// Each kernel's parameter kinds, parsed from its `.cu` signature (by handle - 1): every
    /// launch is checked against them, so an argument list that drifts from the source fails.
    params: Vec<Vec<kernels::ParamKind>>,
    hidden: HashSet<String>,
    no_blas: bool,
    launches: AtomicU64,
    events: Mutex<Vec<Option<std::time::Instant>>>,
    pinned: Mutex<std::collections::HashMap<usize, usize>>,
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl HostBackend {
    /// Every kernel of every module available, and BLAS.
    pub fn new() -> Self {
        let mut names = Vec::new();
        let mut params = Vec::new();
        for (m, _) in kernels::MODULES {
            let sigs = kernels::signatures(m);
            for n in kernels::entry_points(m) {
                let kinds = sigs
                    .iter()
                    .find(|(s, _)| *s == n)
                    .map(|(_, k)| k.clone())
                    .unwrap_or_default();
                names.push((m.to_string(), n));
                params.push(kinds);
            }
        }
        HostBackend {
            params,
            mem: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0x1000_0000),
            names,
            hidden: HashSet::new(),
            no_blas: false,
            launches: AtomicU64::new(0),
            events: Mutex::new(Vec::new()),
            pinned: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The same, with the named kernels missing (`"gemm_bf16"` hides BLAS).
    pub fn without(names: &[&str]) -> Self {
        let mut b = Self::new();
        b.hidden = names.iter().map(|s| s.to_string()).collect();
        b.no_blas = b.hidden.contains("gemm_bf16");
        b
    }

    fn locate(&self, p: DevicePtr) -> GpuResult<(u64, usize)> {
        let mem = self.mem.lock().unwrap();
        let (&base, v) = mem
            .range(..=p.addr)
            .next_back()
            .ok_or_else(|| GpuError::Invalid(format!("host backend: {p:?} is not allocated")))?;
        let off = (p.addr - base) as usize;
        if off + p.bytes as usize > v.len() {
            return Err(GpuError::Invalid(format!(
                "host backend: {p:?} overruns its allocation of {} bytes",
                v.len()
            )));
        }
        Ok((base, off))
    }

    fn read(&self, p: DevicePtr) -> GpuResult<Vec<u8>> {
        let (base, off) = self.locate(p)?;
        Ok(self.mem.lock().unwrap()[&base][off..off + p.bytes as usize].to_vec())
    }

    fn read_f32(&self, p: DevicePtr) -> GpuResult<Vec<f32>> {
        Ok(self
            .read(p)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn write(&self, p: DevicePtr, off_bytes: usize, data: &[u8]) -> GpuResult<()> {
        let (base, off) = self.locate(p)?;
        if off_bytes + data.len() > p.bytes as usize {
            return Err(GpuError::Invalid(format!(
                "host backend: write of {} bytes at +{off_bytes} overruns {p:?}",
                data.len()
            )));
        }
        self.mem.lock().unwrap().get_mut(&base).unwrap()
            [off + off_bytes..off + off_bytes + data.len()]
            .copy_from_slice(data);
        Ok(())
    }

    fn write_f32(&self, p: DevicePtr, off_elems: usize, v: &[f32]) -> GpuResult<()> {
        self.write(
            p,
            off_elems * 4,
            &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
        )
    }

    /// Compute `m` output rows of `n` values (row `r` by `f(r, row)`, rows in parallel) and
    /// write them into `y` at row stride `ldy`.
    fn write_rows(
        &self,
        y: DevicePtr,
        ldy: usize,
        m: usize,
        n: usize,
        f: impl Fn(usize, &mut [f32]) + Sync,
    ) -> GpuResult<()> {
        let rows: Vec<Vec<f32>> = (0..m)
            .into_par_iter()
            .map(|r| {
                let mut row = vec![0f32; n];
                f(r, &mut row);
                row
            })
            .collect();
        for (r, row) in rows.iter().enumerate() {
            self.write_f32(y, r * ldy, row)?;
        }
        Ok(())
    }

    /// `m` rows of an NVFP4 (`nvfp4` layout) product into `y` at row stride `ldy`.
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

    /// The launch's arguments against the kernel's parsed `.cu` signature: count and kinds.
    fn check_args(&self, k: KernelHandle, name: &str, a: &[KArg]) -> GpuResult<()> {
        use kernels::ParamKind as P;
        let want = &self.params[(k.0 as usize) - 1];
        let ok = want.len() == a.len()
            && want.iter().zip(a).all(|(w, g)| {
                matches!(
                    (w, g),
                    (P::Ptr, KArg::Ptr(_))
                        | (P::Int, KArg::I32(_) | KArg::Dim(_))
                        | (P::Float, KArg::F32(_))
                )
            });
        if ok {
            Ok(())
        } else {
            Err(GpuError::Invalid(format!(
                "{name}: launched with {a:?}, but its signature takes {want:?}"
            )))
        }
    }

    fn name_of(&self, k: KernelHandle) -> GpuResult<&str> {
        self.names
            .get((k.0 as usize).wrapping_sub(1))
            .map(|(_, n)| n.as_str())
            .ok_or_else(|| GpuError::Invalid(format!("host backend: bad kernel handle {}", k.0)))
    }
}

fn ptr(a: &[KArg], i: usize) -> GpuResult<DevicePtr> {
    match a.get(i) {
        Some(KArg::Ptr(p)) => Ok(*p),
        other => Err(GpuError::Invalid(format!(
            "argument {i}: expected a pointer, got {other:?}"
        ))),
    }
}

fn float(a: &[KArg], i: usize) -> GpuResult<f32> {
    match a.get(i) {
        Some(KArg::F32(v)) => Ok(*v),
        other => Err(GpuError::Invalid(format!(
            "argument {i}: expected f32, got {other:?}"
        ))),
    }
}

/// The row cap of an NVFP4 GEMV-shaped kernel (the tensor-core GEMMs take any m).
fn nvfp4_row_cap(name: &str) -> usize {
    match name {
        "w4a16_gemv_batch2" | "w4a16_gemv_dual_batch2" => 2,
        "w4a16_gemv_batch3" | "w4a16_gemv_dual_batch3" => 3,
        "nvfp4_proj_small_m8" => 8,
        "nvfp4_proj_small_m16" => 16,
        "w4a16_gemm" => usize::MAX,
        _ => 4,
    }
}

fn int(a: &[KArg], i: usize) -> GpuResult<usize> {
    match a.get(i) {
        Some(KArg::I32(v)) if *v >= 0 => Ok(*v as usize),
        Some(KArg::Dim(v)) if i32::try_from(*v).is_ok() => Ok(*v),
        other => Err(GpuError::Invalid(format!(
            "argument {i}: expected a non-negative i32, got {other:?}"
        ))),
    }
}

impl GpuBackend for HostBackend {
    fn name(&self) -> String {
        "host reference".into()
    }
    fn arch(&self) -> String {
        "host".into()
    }
    fn alloc(&self, bytes: u64) -> GpuResult<DevicePtr> {
        let addr = self
            .next
            .fetch_add(bytes.div_ceil(256) * 256 + 256, Ordering::Relaxed);
        self.mem
            .lock()
            .unwrap()
            .insert(addr, vec![0xA5; bytes as usize]);
        Ok(DevicePtr { addr, bytes })
    }
    fn free(&self, p: DevicePtr) {
        self.mem.lock().unwrap().remove(&p.addr);
    }
    fn upload(&self, dst: DevicePtr, src: &[u8]) -> GpuResult<()> {
        self.write(
            DevicePtr {
                addr: dst.addr,
                bytes: src.len() as u64,
            },
            0,
            src,
        )
    }
    fn download(&self, src: DevicePtr, dst: &mut [u8]) -> GpuResult<()> {
        dst.copy_from_slice(&self.read(DevicePtr {
            addr: src.addr,
            bytes: dst.len() as u64,
        })?);
        Ok(())
    }
    fn fill(&self, dst: DevicePtr, byte: u8) -> GpuResult<()> {
        self.write(dst, 0, &vec![byte; dst.bytes as usize])
    }
    fn kernel(&self, module: &str, name: &str) -> KernelHandle {
        if self.hidden.contains(name) {
            return KernelHandle(0);
        }
        match self
            .names
            .iter()
            .position(|(m, n)| m == module && n == name)
        {
            Some(i) => KernelHandle(i as u64 + 1),
            None => KernelHandle(0),
        }
    }
    fn launch(
        &self,
        k: KernelHandle,
        _cfg: LaunchCfg,
        _stream: StreamId,
        a: &[KArg],
    ) -> GpuResult<()> {
        self.launches.fetch_add(1, Ordering::Relaxed);
        let name = self.name_of(k)?.to_string();
        self.check_args(k, &name, a)?;
        match name.as_str() {
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
                let cap = match name.as_str() {
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
                let cap = nvfp4_row_cap(&name);
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
    fn gemm_bf16(&self, gm: &GemmBf16, _s: StreamId) -> GpuResult<()> {
        let GemmBf16 {
            x,
            w,
            y,
            m,
            n,
            k,
            kw,
        } = *gm;
        if self.no_blas {
            return Err(GpuError::MissingKernel {
                module: "cublas".into(),
                name: "gemm_bf16".into(),
            });
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        let xb = self.read(x)?;
        let xf: Vec<f32> = xb
            .chunks_exact(2)
            .map(|c| crate::converters::bf16::to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        let wb = self.read(w)?;
        let rows: Vec<Vec<f32>> = (0..m)
            .into_par_iter()
            .map(|r| {
                let mut row = vec![0f32; n];
                reference::bf16_row(
                    &xf[r * k..(r + 1) * k],
                    &wb,
                    n,
                    k,
                    kw,
                    ActRound::None,
                    &mut row,
                );
                row
            })
            .collect();
        for (r, row) in rows.iter().enumerate() {
            self.write_f32(y, r * n, row)?;
        }
        Ok(())
    }
    fn synchronize(&self, _s: StreamId) -> GpuResult<()> {
        Ok(())
    }
    fn launch_count(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }
    fn new_stream(&self) -> GpuResult<StreamId> {
        Ok(1)
    }
    fn new_event(&self) -> GpuResult<EventId> {
        let mut ev = self.events.lock().unwrap();
        ev.push(None);
        Ok(ev.len() as EventId)
    }
    fn record_event(&self, event: EventId, _stream: StreamId) -> GpuResult<()> {
        // Host work is synchronous: the event completes when it is recorded.
        let mut ev = self.events.lock().unwrap();
        let slot = ev
            .get_mut((event as usize).wrapping_sub(1))
            .ok_or_else(|| GpuError::Invalid(format!("no event {event}")))?;
        *slot = Some(std::time::Instant::now());
        Ok(())
    }
    fn elapsed_ms(&self, start: EventId, end: EventId) -> GpuResult<f32> {
        let ev = self.events.lock().unwrap();
        let get = |e: EventId| {
            ev.get((e as usize).wrapping_sub(1))
                .copied()
                .flatten()
                .ok_or_else(|| GpuError::Invalid(format!("event {e} not recorded")))
        };
        Ok(get(end)?
            .saturating_duration_since(get(start)?)
            .as_secs_f32()
            * 1e3)
    }
    unsafe fn register_host(
        &self,
        _ptr: *const u8,
        _len: usize,
        _read_only: bool,
    ) -> GpuResult<()> {
        if self.hidden.contains("register_host") {
            return Err(GpuError::Cuda {
                call: "cuMemHostRegister".into(),
                msg: "refused (hidden on the host backend)".into(),
            });
        }
        Ok(())
    }
    unsafe fn unregister_host(&self, _ptr: *const u8) {}
    fn alloc_pinned(&self, bytes: usize) -> GpuResult<*mut u8> {
        // Page-aligned like cuMemHostAlloc's memory (O_DIRECT reads into it need that).
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), 4096)
            .map_err(|e| GpuError::Invalid(format!("alloc_pinned({bytes}): {e}")))?;
        // SAFETY: a non-zero-sized layout; the pointer is checked for null below.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(GpuError::Invalid(format!(
                "alloc_pinned({bytes}): out of memory"
            )));
        }
        self.pinned.lock().unwrap().insert(p as usize, bytes.max(1));
        Ok(p)
    }
    unsafe fn free_pinned(&self, p: *mut u8) {
        if let Some(len) = self.pinned.lock().unwrap().remove(&(p as usize)) {
            // SAFETY: `p` was allocated by alloc_pinned with this size and alignment, and is
            // freed once (removed from the table above).
            unsafe {
                std::alloc::dealloc(p, std::alloc::Layout::from_size_align_unchecked(len, 4096))
            };
        }
    }
    unsafe fn upload_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        _stream: StreamId,
    ) -> GpuResult<()> {
        // SAFETY: the caller guarantees `src..src+len` is valid.
        let s = unsafe { std::slice::from_raw_parts(src, len) };
        self.upload(dst, s)
    }
}
