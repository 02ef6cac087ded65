//! Every FFN blob against its layout's rules at load (formats.md, "Each layout's own rules"):
//! the rules over whole blobs (a stored permutation) on the CPU beside the copy, and the
//! element rules (finite scales, zero points that are codes, no E4M3 NaN) on the bytes the
//! copy put on the device, one `blob_rules` launch per part (`kernels/rules.cu`; the host
//! backend runs its twin), read back once. Checking on the device costs a read of the scales
//! at the device's bandwidth and no second read of the file, warm or cold; a CPU pass beside
//! the copy measured +4-10% of the load on the H200 (BENCHMARKS-history.md, "Every blob against its
//! layout's rules at load"). Where no `blob_rules` kernel serves, the CPU checks every rule.

use crate::error::{Error, Result};
use crate::gpu::table::{Kernel, spec};
use crate::gpu::{DevicePtr, GpuBackend, GpuError};
use crate::pack::Pack;

/// What the side thread leaves for after the copy: the kernel to launch, or (none serving)
/// the CPU having checked every rule already.
pub(crate) enum Pending {
    /// Launch the element rules on the copied bytes.
    Device(Kernel),
    /// Every rule was checked on the CPU.
    Done,
}

/// Beside the copy: the structure rules on the CPU and the `blob_rules` kernel resolved (its
/// module loaded off the critical path); with no kernel, every rule on the CPU.
pub(crate) fn beside_copy(b: &dyn GpuBackend, pack: &Pack) -> Result<Pending> {
    let spec = spec("rules", "blob_rules").expect("in the kernel table");
    let kernel = Kernel {
        handle: b.kernel("rules", "blob_rules"),
        spec,
    };
    if !kernel.handle.ok() {
        pack.check_blob_rules()?;
        return Ok(Pending::Done);
    }
    pack.check_blob_structures()?;
    Ok(Pending::Device(kernel))
}

/// After the copy: every element rule of every blob part on the device (`ptr` gives a
/// tensor's device bytes; a tensor not loaded, another rank's, is skipped). A part that breaks
/// one is named through the CPU's check of its blob (the same words `verify` prints).
pub(crate) fn after_copy(
    b: &dyn GpuBackend,
    pack: &Pack,
    kernel: Kernel,
    ptr: impl Fn(usize) -> Option<DevicePtr>,
) -> Result<()> {
    let jobs: Vec<_> = pack
        .element_rules()?
        .into_iter()
        .filter_map(|r| Some((r.blob, r.part, ptr(r.tensor)?, r.rule, r.elements)))
        .filter(|j| j.4 > 0)
        .collect();
    if jobs.is_empty() {
        return Ok(());
    }
    let gpu = |e: GpuError| Error::Unsupported {
        file: pack.file.path.display().to_string(),
        reason: format!("checking the blobs' rules on the device: {e}"),
    };
    let bad = b.alloc(4 * jobs.len() as u64).map_err(gpu)?;
    let run = || -> std::result::Result<Vec<u8>, GpuError> {
        b.fill(bad, 0xff)?;
        for (slot, (_, _, p, rule, n)) in jobs.iter().enumerate() {
            kernel
                .call()
                .ptr("p", *p)
                .dim("n", *n)
                .dim("kind", rule.kind())
                .dim("top", rule.top())
                .ptr("bad", bad)
                .dim("slot", slot)
                .finish()?
                .run(b, 0)?;
        }
        b.synchronize(0)?;
        let mut out = vec![0u8; 4 * jobs.len()];
        b.download(bad, &mut out)?;
        Ok(out)
    };
    let found = run();
    b.free(bad);
    let found = found.map_err(gpu)?;
    for ((name, part, _, rule, _), w) in jobs.iter().zip(found.chunks_exact(4)) {
        let first = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        if first == u32::MAX {
            continue;
        }
        // The CPU's check of the blob names it as `verify` does; were it to pass (bytes that
        // changed on their way to the device), the device's finding stands.
        pack.check_blob(name)?;
        return Err(Error::Tensor {
            file: pack.file.path.display().to_string(),
            tensor: format!("{name}.{part}"),
            field: "rules",
            reason: format!(
                "on the device: {}",
                crate::layout::element_reason(*rule, first)
            ),
        });
    }
    Ok(())
}
