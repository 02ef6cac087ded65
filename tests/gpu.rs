//! The GPU check as a test: on a machine with a CUDA device, the quick kernel and layer checks
//! must all pass; without one the test says SKIPPED (CI has no GPU; the device run uses
//! `metrale-pack gpu-check`, which runs the full set).

use metrale_pack::check;
use metrale_pack::gpu::GpuBackend;
use metrale_pack::gpu::cuda::CudaBackend;
use metrale_pack::testing::Rand;
use std::sync::Arc;

#[test]
fn gpu_kernels_and_layer_match_the_host_reference() {
    let b = match CudaBackend::new(0) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    eprintln!("device {} {}", b.name(), b.arch());
    let mut r = Rand(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    let mut rows = check::kernel_checks(
        b.clone(),
        &check::SHAPES[..1],
        &[1, 4, 17, 64],
        &mut r,
        &|_| true,
    )
    .unwrap();
    rows.extend(check::layer_checks(b, &check::SHAPES[..1], &[1, 2, 3, 17], &mut r).unwrap());
    assert!(check::print_table(&rows));
}
