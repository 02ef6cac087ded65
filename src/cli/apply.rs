//! `metrale-pack ffn-apply`: one layer's FFN from a pack by one arm, on rows from a `.npy`.

use super::*;

/// `ffn-apply`: the input and output rules of `convert` and `dump` (the output is neither input
/// nor a folder, the input a regular `.npy` of f32 `[rows, hidden]` with the pack's hidden size),
/// on the first GPU, or on the host backend where there is none.
pub(crate) fn ffn_apply(
    pack: &Path,
    layer: usize,
    arm: &str,
    input: &Path,
    output: &Path,
) -> Result<()> {
    use metrale_pack::gpu::GpuBackend;
    atomic::refuse_inputs(output, &[pack.to_path_buf(), input.to_path_buf()])?;
    gguf::require_regular(input)?;
    let hidden = Pack::open(pack)?.manifest.model.hidden_size as usize;
    let npy = npy::parse(&std::fs::read(input).with_context(|| input.display().to_string())?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
    anyhow::ensure!(
        npy.dtype == npy::NpyDtype::F32 && npy.shape.len() == 2 && npy.shape[1] == hidden,
        "{}: {:?} {:?}: expected f32 [rows, {hidden}] (the pack's hidden size)",
        input.display(),
        npy.dtype,
        npy.shape
    );
    let b: std::sync::Arc<dyn GpuBackend> = match metrale_pack::gpu::cuda::CudaBackend::new(0) {
        Ok(b) => std::sync::Arc::new(b),
        Err(e) => {
            eprintln!("no GPU ({e}): running on the host backend");
            std::sync::Arc::new(metrale_pack::gpu::host::HostBackend::new())
        }
    };
    let y = metrale_pack::check::activations::apply_arm(b, pack, layer, arm, &npy.to_f32())?;
    atomic::write_atomic(output, |w| -> Result<()> {
        npy::write_f32(w, &npy.shape, &y)?;
        Ok(())
    })?;
    eprintln!("wrote {:?} f32 to {}", npy.shape, output.display());
    Ok(())
}
