//! The host twins of the `ggml` kernels (`src/layouts/ggml/kernels.cu`): the engine's GEMV
//! and its dequantization, through `twin.rs`.

use crate::converters::layouts::ggml::engine_type;
use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::Twin;
use crate::gpu::reference;
use crate::gpu::sizes::*;
use crate::gpu::table::{Args, KernelSpec};
use crate::gpu::{GpuError, GpuResult};

/// The GEMV forms whose activations are split (`quantize_act_q8_1s`).
pub(crate) const SPLIT_FORMS: [&str; 3] = ["ggml_gemv1", "ggml_gemv_split", "ggml_gemv_split4"];

impl HostBackend {
    /// `ggml_gemv`: each of the `m` rows of q8_1 blocks (split for `SPLIT_FORMS`) through the
    /// engine's twin, for each of its `projs` projections (`w`, `ty`, `sc`, `y`; then `w2`,
    /// `ty2`, `sc2`, `y2`): every form's sums.
    pub(crate) fn ggml_gemv(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let (xq, m) = (self.read(a.ptr("xq")?)?, a.dim("m")?);
        let (n, kp, ldy) = (a.dim("n")?, a.dim("kp")?, a.dim("ldy")?);
        let xq = if SPLIT_FORMS.contains(&spec.name) {
            let bytes = m * kp / Q8_1_ELEMS * Q8_1_BYTES;
            let split = xq.get(..bytes).ok_or_else(|| {
                GpuError::Invalid(format!("{}: {m} split rows past the buffer", spec.name))
            })?;
            reference::q8_1_join(split, m, kp)
        } else {
            xq
        };
        let row_q8 = kp / Q8_1_ELEMS * Q8_1_BYTES;
        let projs: &[(&str, &str, &str, &str)] = match a.dim("projs")? {
            1 => &[("w", "ty", "sc", "y")],
            2 => &[("w", "ty", "sc", "y"), ("w2", "ty2", "sc2", "y2")],
            p => {
                return Err(GpuError::Invalid(format!(
                    "ggml_gemv: projs {p}, not 1 or 2"
                )));
            }
        };
        for &(wn, tn, sn, yn) in projs {
            let sc = a.float(sn)?;
            let w = self.read(a.ptr(wn)?)?;
            let t = a.dim(tn)?;
            let ty = engine_type(t as u32).ok_or_else(|| {
                GpuError::Invalid(format!("ggml_gemv: type {t} is not an engine type"))
            })?;
            self.write_rows(a.ptr(yn)?, ldy, m, n, |r, out| {
                let xr = &xq[r * row_q8..(r + 1) * row_q8];
                reference::ggml_gemv_row(xr, &w, ty, sc, [n, kp], out);
            })?;
        }
        Ok(())
    }

    /// `ggml_dequant_bf16`: the weights through the twin into BF16 `[n, kp]`.
    pub(crate) fn ggml_dequant_bf16(&self, _spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let w = self.read(a.ptr("w")?)?;
        let ty = engine_type(a.dim("ty")? as u32)
            .ok_or_else(|| GpuError::Invalid("ggml_dequant_bf16: not an engine type".into()))?;
        let (n, kp) = (a.dim("n")?, a.dim("kp")?);
        let out: Vec<u8> = reference::ggml_dequant_bf16(&w, ty, a.float("sc")?, n, kp)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        self.write(a.ptr("out")?, 0, &out)
    }
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] = &[
    (
        &[
            "ggml_gemv",
            "ggml_gemv_sa",
            "ggml_gemv1",
            "ggml_gemv_split",
            "ggml_gemv_split4",
        ],
        HostBackend::ggml_gemv,
    ),
    (&["ggml_dequant_bf16"], HostBackend::ggml_dequant_bf16),
];
