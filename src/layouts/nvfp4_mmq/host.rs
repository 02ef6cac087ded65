//! The host twins of the MMQ repack (in `nvfp4`'s module), through `gpu::reference`.

use crate::gpu::host::HostBackend;
use crate::gpu::host::impls::*;
use crate::gpu::table::{Args, KernelSpec};
use crate::gpu::{GpuError, GpuResult};

impl HostBackend {
    /// `nvfp4_mmq_repack`.
    pub(crate) fn nvfp4_mmq_repack(&self, spec: &KernelSpec, a: &Args) -> GpuResult<()> {
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
}

/// Its kernels' host twins, by the kernel names each serves (`gpu::host`'s table).
pub(crate) static TWINS: &[(&[&str], Twin)] =
    &[(&["nvfp4_mmq_repack"], HostBackend::nvfp4_mmq_repack)];
