//! The host backend's kernels: every kernel entry point, by name, with the
//! [`reference`](super::super::reference) numerics: the shared kernels' (`kernels/*.cu`) here,
//! each layout's in its folder (`src/layouts/TAG/host.rs`). Arguments are read by parameter name
//! through the kernel table ([`Args`]), after the launch was checked against the table's
//! description (count, kinds and row cap); each kernel's activation rounding is the table's.

use super::super::reference;
use super::super::table::{Args, KernelSpec};
use super::super::{DevicePtr, GpuError, GpuResult};
use super::HostBackend;

/// A host twin: the kernel's work on the host backend's memory.
pub(crate) type Twin = fn(&HostBackend, &KernelSpec, &Args) -> GpuResult<()>;

/// The host twins of the shared kernels (`kernels/`), by the kernel names each serves.
const SHARED: &[(&[&str], Twin)] = &[
    (
        &[
            "act_mul_silu",
            "act_mul_gelu",
            "act_mul_silu_il8",
            "act_mul_gelu_il8",
        ],
        HostBackend::act_mul_silu,
    ),
    (&["f32_to_bf16_il8"], HostBackend::f32_to_bf16_il8),
    (&["f32_to_bf16"], HostBackend::f32_to_bf16),
    (
        &["quantize_act_q8_1", "quantize_act_q8_1s"],
        HostBackend::quantize_act_q8_1,
    ),
    (
        &["quantize_act_mul_q8_1", "quantize_act_mul_q8_1s"],
        HostBackend::quantize_act_mul_q8_1,
    ),
    (&["stream_probe"], HostBackend::stream_probe),
    (&["blob_rules"], HostBackend::blob_rules),
];

/// Generates [`TWINS`] from the list of built-in layouts (`layouts::builtin_layouts!`).
macro_rules! twins {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        /// Every kernel's host twin, by the kernel names it serves: the shared kernels', then
        /// each built-in layout's (`src/layouts/TAG/host.rs`), in `Layout` order.
        static TWINS: std::sync::LazyLock<Vec<(&'static [&'static str], Twin)>> =
            std::sync::LazyLock::new(|| {
                let mut v = SHARED.to_vec();
                $(v.extend_from_slice(crate::layouts::$t::host::TWINS);)*
                v
            });
    };
}
crate::layouts::builtin_layouts!(twins);

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

    /// A GEMV over rows of quantized blocks `w` (`x:p m:i w:p y:p n:i k:i kp:i ldy:i`): each of
    /// the `m` activation rows through the f64 twin `row`.
    pub(crate) fn blocks_gemv(&self, a: &Args, row: BlocksRow) -> GpuResult<()> {
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

    /// `quantize_act_q8_1` (`quantize_act_q8_1s`: the blocks split).
    fn quantize_act_q8_1(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
        let x = self.read_f32(a.ptr("x")?)?;
        let (m, kk, kp) = (a.dim("m")?, a.dim("k")?, a.dim("kp")?);
        let q: Vec<u8> = (0..m)
            .flat_map(|r| reference::quantize_row_q8_1_act(&x[r * kk..(r + 1) * kk], kp))
            .collect();
        self.write_q8_1(spec, a.ptr("out")?, q, m, kp)
    }

    /// `m` rows of q8_1 blocks at `out`, split where the kernel is a `_q8_1s` one.
    fn write_q8_1(
        &self,
        spec: &KernelSpec,
        out: DevicePtr,
        q: Vec<u8>,
        m: usize,
        kp: usize,
    ) -> GpuResult<()> {
        let q = if spec.name.ends_with("_q8_1s") {
            reference::q8_1_split(&q, m, kp)
        } else {
            q
        };
        self.write(out, 0, &q)
    }

    /// `quantize_act_mul_q8_1`: the twin's gated product, then its q8_1 blocks
    /// (`quantize_act_mul_q8_1s`: split).
    fn quantize_act_mul_q8_1(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
        let q: Vec<u8> = (0..m)
            .flat_map(|r| {
                let row: Vec<f32> = (0..kk).map(|e| act(g[r * ld + e], u[r * ld + e])).collect();
                reference::quantize_row_q8_1_act(&row, kp)
            })
            .collect();
        self.write_q8_1(spec, a.ptr("out")?, q, m, kp)
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
}

/// A projection kernel's output and shape arguments: `(y, n, k, kp, ldy)`.
/// An f64 twin of one activation row through rows of quantized blocks: `(x, w, n, k, kp, y)`
/// (`reference::q2_row`, `reference::q4k_row`).
pub(crate) type BlocksRow = fn(&[f32], &[u8], usize, usize, usize, &mut [f32]);

pub(crate) fn projection_out(
    a: &Args,
) -> GpuResult<(crate::gpu::DevicePtr, usize, usize, usize, usize)> {
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
    pub(crate) fn quantizer_rows(&self, name: &str, a: &Args) -> GpuResult<Vec<Vec<f32>>> {
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
pub(crate) fn bf16_il8_bytes(x: &[f32]) -> Vec<u8> {
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
