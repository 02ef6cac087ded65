//! Timing GPU work: the median of synchronized runs (used by the runtime's copy-ceiling probes and by the benchmarks).

use super::{GpuBackend, GpuResult};
use std::time::Instant;

/// Median seconds of `reps` runs of `f` (synchronized before and after each).
pub fn time_median(
    b: &dyn GpuBackend,
    reps: usize,
    mut f: impl FnMut() -> GpuResult<()>,
) -> GpuResult<f64> {
    f()?;
    b.synchronize(0)?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        b.synchronize(0)?;
        t.push(t0.elapsed().as_secs_f64());
    }
    t.sort_by(|a, c| a.partial_cmp(c).unwrap());
    Ok(t[reps / 2])
}
