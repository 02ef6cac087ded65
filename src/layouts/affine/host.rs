//! The host twins of the `affine` kernels (`src/layouts/affine/kernels.cu`).

use crate::converters::layouts::affine::Scheme;
use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::Twin;
use crate::gpu::reference;
use crate::gpu::sizes::*;
use crate::gpu::table::{Args, KernelSpec};
use crate::gpu::{GpuError, GpuResult};

/// The scheme a kernel's `bits`, `form`, `gshift` and `kp` arguments name.
fn scheme(name: &str, bits: u32, a: &Args) -> GpuResult<Scheme> {
    let (form, gshift, kp) = (a.dim("form")?, a.dim("gshift")?, a.dim("kp")?);
    Scheme::from_args(bits, form as u32, gshift as u32, kp).ok_or_else(|| {
        GpuError::Invalid(format!(
            "{name}: bits {bits}, form {form}, gshift {gshift}, kp {kp} name no affine scheme"
        ))
    })
}

impl HostBackend {
    /// `affine4_gemv`, `affine8_gemv` and their batch forms (the bits from the name), over the
    /// activations `affine_quantize_act` wrote: one projection, or with `projs` 2 two.
    pub(crate) fn affine_gemv(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let bits = if spec.name.starts_with("affine4") {
            4
        } else {
            8
        };
        let (xq, xs, m) = (
            self.read(a.ptr("xq")?)?,
            self.read_f32(a.ptr("xs")?)?,
            a.dim("m")?,
        );
        let (n, kp) = (a.dim("n")?, a.dim("kp")?);
        // The `_act` forms: gate and up, unstrided; the `_ks` forms one projection.
        let fused = spec.name.ends_with("_act");
        let ldy = if fused { n } else { a.dim("ldy")? };
        let sc = scheme(spec.name, bits, a)?;
        let groups = kp / AFFINE_GROUP;
        if xq.len() < m * kp || xs.len() < m * groups * 4 {
            return Err(GpuError::Invalid(format!(
                "{}: activations of {} bytes / {} floats for {m} rows of kp {kp}",
                spec.name,
                xq.len(),
                xs.len()
            )));
        }
        let projections = [("cg", "sg", "yg"), ("cu", "su", "yu")];
        // The `_ks` forms take one projection whatever `projs` says (their grid has no y).
        let projs = match (fused, spec.name.ends_with("_ks")) {
            (true, _) => 2,
            (_, true) => 1,
            _ => a.dim("projs")?.min(2),
        };
        for (c, s, y) in projections.into_iter().take(projs) {
            let (codes, sb) = (self.read(a.ptr(c)?)?, self.read(a.ptr(s)?)?);
            self.write_rows(a.ptr(y)?, ldy, m, n, |r, row| {
                let q = &xq[r * kp..(r + 1) * kp];
                let d = &xs[r * groups * 4..(r + 1) * groups * 4];
                reference::affine_q8_row(q, d, &codes, &sb, sc, n, kp, row);
            })?;
        }
        Ok(())
    }

    /// `affine4_gemv_act`, `affine8_gemv_act`: the gate and up GEMVs, then the down input's
    /// quantization of their act-mul (`affine_quantize_act` over `yg` and `yu`, one row of `n`)
    /// into `dq` and `ds` for `bitsd`-bit weights of padded k `kpd`. The counters are the
    /// kernel's own (left as they were: zero).
    pub(crate) fn affine_gemv_act(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        self.affine_gemv(spec, a)?;
        let (n, act, kpd) = (a.dim("n")?, a.dim("act")?, a.dim("kpd")?);
        let (yg, yu) = (self.read_f32(a.ptr("yg")?)?, self.read_f32(a.ptr("yu")?)?);
        if !(1..=2).contains(&act) || kpd < n {
            return Err(GpuError::Invalid(format!(
                "{}: act {act}, kpd {kpd} for n {n}",
                spec.name
            )));
        }
        let v = reference::affine_act_row(&yg, &yu, act, 0, n, n)
            .ok_or_else(|| GpuError::Invalid(format!("{}: yg or yu short", spec.name)))?;
        let (q, d) = reference::affine_quantize_act_row(&v, kpd, a.dim("bitsd")? as u32);
        self.write(a.ptr("dq")?, 0, &q)?;
        self.write_f32(a.ptr("ds")?, 0, &d)
    }

    /// `affine_from_ggml`: the converter's carry of the GGUF blocks; a block it refuses sets
    /// `bad` (the outputs then undefined, as the caller must refuse them).
    pub(crate) fn affine_from_ggml(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (ty, n, kk, kp) = (a.dim("ty")?, a.dim("n")?, a.dim("k")?, a.dim("kp")?);
        let ty = crate::GgmlType::from_id(ty as u32)
            .ok_or_else(|| GpuError::Invalid(format!("affine_from_ggml: ggml type {ty}")))?;
        let bytes = n * kk / 32 * ty.block_bytes() as usize;
        let raw = self.read(a.ptr("raw")?)?;
        let raw = raw.get(..bytes).ok_or_else(|| {
            GpuError::Invalid(format!(
                "affine_from_ggml: {} bytes, not {bytes}",
                raw.len()
            ))
        })?;
        match crate::converters::layouts::affine::carry(ty, raw, n, kk) {
            Ok(e) if e.padded[1] == kp => {
                self.write(a.ptr("codes")?, 0, &e.parts[0].1)?;
                self.write(a.ptr("sb")?, 0, &e.parts[1].1)
            }
            Ok(e) => Err(GpuError::Invalid(format!(
                "affine_from_ggml: kp {kp}, the layout's {}",
                e.padded[1]
            ))),
            Err(_) => self.write(a.ptr("bad")?, 0, &1u32.to_le_bytes()),
        }
    }

    /// `affine_from_awq`: the converter's carry of the AutoAWQ tensors; a weight it refuses
    /// sets `bad` (the outputs then undefined, as the caller must refuse them).
    pub(crate) fn affine_from_awq(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (n, kk, kp, group) = (a.dim("n")?, a.dim("k")?, a.dim("kp")?, a.dim("group")?);
        let groups = kk / group.max(1);
        let (qw, qz, sc) = (
            self.read(a.ptr("qweight")?)?,
            self.read(a.ptr("qzeros")?)?,
            self.read(a.ptr("scales")?)?,
        );
        let words = n / 8 * 4;
        if qw.len() < kk * words || qz.len() < groups * words || sc.len() < groups * n * 2 {
            return Err(GpuError::Invalid(format!(
                "affine_from_awq: {} / {} / {} bytes for [{n}, {kk}] in groups of {group}",
                qw.len(),
                qz.len(),
                sc.len()
            )));
        }
        let scales: Vec<f32> = sc[..groups * n * 2]
            .chunks_exact(2)
            .map(|h| crate::converters::f16::to_f32(u16::from_le_bytes([h[0], h[1]])))
            .collect();
        let int = crate::converters::awq::to_int(&qw, &qz, &scales, [n, kk], group);
        match super::groups::AffineGroups::from_int(&int.source()) {
            Ok(g) => {
                let e = crate::converters::layouts::affine::from_groups(&g);
                if e.padded[1] != kp {
                    return Err(GpuError::Invalid(format!(
                        "affine_from_awq: kp {kp}, the layout's {}",
                        e.padded[1]
                    )));
                }
                self.write(a.ptr("codes")?, 0, &e.parts[0].1)?;
                self.write(a.ptr("sb")?, 0, &e.parts[1].1)
            }
            Err(_) => self.write(a.ptr("bad")?, 0, &1u32.to_le_bytes()),
        }
    }

    /// `affine_from_gptq`: the converter's carry of the GPTQ tensors (group order); what it
    /// refuses sets `bad` as the kernel does (1 a scale not finite, 2 a zero point field of all
    /// ones, 4 a `g_idx` out of group order), the outputs then undefined.
    pub(crate) fn affine_from_gptq(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        use super::groups::{AffineError, AffineGroups};
        use crate::converters::gptq;
        let (n, kk, kp, group) = (a.dim("n")?, a.dim("k")?, a.dim("kp")?, a.dim("group")?);
        let bits = a.dim("bits")? as u32;
        let groups = kk / group.max(1);
        let per = 32 / bits.max(1) as usize;
        let (qw, qz, sc) = (
            self.read(a.ptr("qweight")?)?,
            self.read(a.ptr("qzeros")?)?,
            self.read(a.ptr("scales")?)?,
        );
        let ok = matches!(bits, 4 | 8)
            && qw.len() >= kk / per * n * 4
            && qz.len() >= groups * (n / per) * 4
            && sc.len() >= groups * n * 2;
        if !ok {
            return Err(GpuError::Invalid(format!(
                "affine_from_gptq: {} / {} / {} bytes for [{n}, {kk}] at {bits} bits in groups of {group}",
                qw.len(),
                qz.len(),
                sc.len()
            )));
        }
        let mut flag = 0u32;
        let g_idx = a.ptr("g_idx")?;
        if !g_idx.is_null() {
            let g: Vec<i32> = self.read(g_idx)?[..kk * 4]
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if !gptq::ordered(&g, group) {
                flag |= 4;
            }
        }
        let scales: Vec<f32> = sc[..groups * n * 2]
            .chunks_exact(2)
            .map(|h| crate::converters::f16::to_f32(u16::from_le_bytes([h[0], h[1]])))
            .collect();
        let in_order: Vec<i32> = (0..kk).map(|i| (i / group.max(1)) as i32).collect();
        let groups = gptq::to_int(&qw, &qz, &scales, &in_order, bits, [n, kk], group)
            .map(|(int, group_of)| AffineGroups::from_int_grouped(&int.source(), &group_of));
        match groups {
            Ok(Ok(g)) if flag == 0 => {
                let e = crate::converters::layouts::affine::from_groups(&g);
                if e.padded[1] != kp {
                    return Err(GpuError::Invalid(format!(
                        "affine_from_gptq: kp {kp}, the layout's {}",
                        e.padded[1]
                    )));
                }
                self.write(a.ptr("codes")?, 0, &e.parts[0].1)?;
                return self.write(a.ptr("sb")?, 0, &e.parts[1].1);
            }
            Ok(Ok(_)) => {}
            Err(gptq::GptqError::Zero(_)) => flag |= 2,
            Ok(Err(AffineError::NonFinite { .. })) => flag |= 1,
            Ok(Err(e)) => return Err(GpuError::Invalid(format!("affine_from_gptq: {e}"))),
        }
        self.write(a.ptr("bad")?, 0, &flag.to_le_bytes())
    }

    /// `affine_quantize_act`: `x`, or `act(x, u)` (1 SiLU, 2 GELU), rows at stride `ld`.
    pub(crate) fn affine_quantize_act(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (act, m, kk, ld) = (a.dim("act")?, a.dim("m")?, a.dim("k")?, a.dim("ld")?);
        let (kp, bits) = (a.dim("kp")?, a.dim("bits")? as u32);
        let (x, u) = self.act_inputs(a, act)?;
        let (xq, xs) = (a.ptr("xq")?, a.ptr("xs")?);
        let perm = self.perm(a, kk)?;
        for r in 0..m {
            let v = reference::affine_act_row(&x, &u, act, r, kk, ld).ok_or_else(|| {
                GpuError::Invalid("affine_quantize_act: a row past its input".into())
            })?;
            let v = match &perm {
                // Value c is column perm[c] (one past k reads 0).
                Some(p) => (0..kk)
                    .map(|c| v.get(p[c] as usize).copied().unwrap_or(0.0))
                    .collect(),
                None => v,
            };
            let (q, d) = reference::affine_quantize_act_row(&v, kp, bits);
            self.write(xq, r * kp, &q)?;
            self.write_f32(xs, r * (kp / AFFINE_GROUP) * 4, &d)?;
        }
        Ok(())
    }

    /// `affine_dequant_bf16`.
    pub(crate) fn affine_dequant_bf16(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (codes, sb) = (self.read(a.ptr("codes")?)?, self.read(a.ptr("sb")?)?);
        let (n, kp, bits) = (a.dim("n")?, a.dim("kp")?, a.dim("bits")?);
        let sc = scheme("affine_dequant_bf16", bits as u32, a)?;
        let out = match self.perm(a, kp)? {
            Some(perm) => reference::affine_dequant_bf16_perm(&codes, &sb, sc, n, kp, &perm),
            None => reference::affine_dequant_bf16(&codes, &sb, sc, n, kp),
        };
        self.write(a.ptr("out")?, 0, &out)
    }

    /// `affine_gather_bf16`: the values of `x` (or the act-mul of `x` and `u`) rounded to BF16,
    /// in the stored column order `perm` where there is one.
    pub(crate) fn affine_gather_bf16(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (act, m, kk, ld) = (a.dim("act")?, a.dim("m")?, a.dim("k")?, a.dim("ld")?);
        let (x, u) = self.act_inputs(a, act)?;
        let perm = self.perm(a, kk)?;
        let mut v = Vec::with_capacity(m * kk);
        for r in 0..m {
            v.extend(
                reference::affine_act_row(&x, &u, act, r, kk, ld).ok_or_else(|| {
                    GpuError::Invalid("affine_gather_bf16: a row past its input".into())
                })?,
            );
        }
        let out = reference::affine_gather_bf16(&v, perm.as_deref(), m, kk);
        self.write(a.ptr("y")?, 0, &out)
    }

    /// The `x` argument's f32 values, and `u`'s where `act` (1 SiLU, 2 GELU) reads it.
    fn act_inputs(&self, a: &Args, act: usize) -> GpuResult<(Vec<f32>, Vec<f32>)> {
        let x = self.read_f32(a.ptr("x")?)?;
        let u = if act == 0 {
            Vec::new()
        } else {
            self.read_f32(a.ptr("u")?)?
        };
        Ok((x, u))
    }

    /// The `perm` argument's first `count` u32 (`None` for null).
    fn perm(&self, a: &Args, count: usize) -> GpuResult<Option<Vec<u32>>> {
        let p = a.ptr("perm")?;
        if p.is_null() {
            return Ok(None);
        }
        let b = self.read(p)?;
        let v = b
            .get(..4 * count)
            .ok_or_else(|| GpuError::Invalid(format!("perm: {} bytes for {count}", b.len())))?;
        Ok(Some(
            v.chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect(),
        ))
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] = &[
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
];
