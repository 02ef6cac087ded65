//! The GPU check and benchmarks that `metrale-pack gpu-check` / `bench-gpu` run on a device:
//! every kernel and every layer arm against the host reference on fresh random data, poisoned
//! outputs, the fixed path's batch invariance, then bandwidth and TFLOP/s figures against the
//! copy ceiling and cuBLAS measured in the same run.

pub mod activations;
pub(crate) mod bench;
pub(crate) mod bench_decode;
pub mod bench_load;
pub(crate) mod kernels;
pub(crate) mod layers;
pub(crate) mod load;
pub mod probe_io;
pub mod routing;
pub mod tp;

pub use crate::gpu::timing::time_median;
pub use bench::benchmarks;
pub use kernels::kernel_checks;
pub use layers::{LAYER_ARMS, LayerArm, layer_checks, layer_checks_of};
pub use load::{load_checks, load_checks_from};

use crate::converters::layouts;
use crate::ffn::Fp8Weight;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, alloc_upload, download_f32};
use crate::testing::*;
use rayon::prelude::*;

/// One line of the result table.
#[derive(Clone, Debug)]
pub struct Row {
    /// What was checked (kernel or arm).
    pub check: String,
    /// The FFN shape, `hidden x inter`.
    pub shape: String,
    /// Rows.
    pub m: usize,
    /// Relative error against the reference (NaN: an output left unwritten).
    pub err: f64,
    /// The tolerance.
    pub tol: f64,
    /// Whether `err <= tol`.
    pub pass: bool,
}

/// The row counts of the GPU issue.
pub const M_SET: [usize; 12] = [1, 2, 3, 4, 5, 16, 17, 32, 33, 64, 512, 2048];
/// SmolLM2 and llama-8B FFN shapes (hidden, inter).
pub const SHAPES: [(usize, usize); 2] = [(576, 1536), (4096, 14336)];

fn sample_rows(m: usize) -> Vec<usize> {
    if m <= 8 {
        return (0..m).collect();
    }
    let mut v = vec![0, 1, m / 3, m / 2, m - 2, m - 1];
    v.dedup();
    v
}

pub(crate) fn upload_fp8(
    b: &dyn GpuBackend,
    x: &[f32],
    n: usize,
    k: usize,
) -> GpuResult<(Fp8Weight, Vec<u8>, Vec<f32>)> {
    let e = layouts::fp8::encode(x, n, k);
    let w = Fp8Weight {
        weight: alloc_upload(b, &e.parts[0].1)?,
        scale: alloc_upload(b, &e.parts[1].1)?,
        n,
        k,
        np: e.padded[0],
        kp: e.padded[1],
    };
    Ok((w, e.parts[0].1.clone(), layouts::f32_from(&e.parts[1].1)))
}

/// Whether two f32 outputs are the same bits, element for element (and the same length).
pub(crate) fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

pub(crate) fn push(
    rows: &mut Vec<Row>,
    check: &str,
    shape: (usize, usize),
    m: usize,
    err: f64,
    tol: f64,
) {
    let pass = err.is_finite() && err <= tol;
    rows.push(Row {
        check: check.into(),
        shape: format!("{}x{}", shape.0, shape.1),
        m,
        err,
        tol,
        pass,
    });
}

/// A fresh scratch folder under the temp dir, unique per process and call.
fn scratch_dir(tag: &str) -> std::path::PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("metrale-{tag}-{}-{n}", std::process::id()))
}

/// ‖y − reference‖ / ‖reference‖ over the sampled rows of the device output `yd` (`[m, n]`
/// f32, row stride n); NaN when any element of `y` was left unwritten (outputs are poisoned with
/// NaN before each launch). `reference(r)` computes row `r` on the CPU.
pub(crate) fn sampled_err(
    b: &dyn GpuBackend,
    yd: DevicePtr,
    m: usize,
    n: usize,
    reference: impl Fn(usize) -> Vec<f32> + Sync,
) -> GpuResult<f64> {
    let y = download_f32(b, yd.view(0, (m * n * 4) as u64))?;
    if !y.iter().all(|v| v.is_finite()) {
        return Ok(f64::NAN);
    }
    let srows = sample_rows(m);
    let want: Vec<f64> = srows
        .par_iter()
        .flat_map(|&r| {
            reference(r)
                .into_iter()
                .map(|v| v as f64)
                .collect::<Vec<_>>()
        })
        .collect();
    let got: Vec<f32> = srows
        .iter()
        .flat_map(|&r| y[r * n..(r + 1) * n].to_vec())
        .collect();
    Ok(rel_err(&got, &want))
}

/// The relative error of a CUDA layer output against the host backend's, or NaN (a failing
/// row) when the two took different routes or the CUDA output has a non-finite value.
pub(crate) fn cuda_vs_host_err(cuda: &[f32], host: &[f32], same_route: bool) -> f64 {
    if !same_route || !cuda.iter().all(|v| v.is_finite()) {
        return f64::NAN;
    }
    let want: Vec<f64> = host.iter().map(|&v| v as f64).collect();
    rel_err(cuda, &want)
}

/// Lines printed as they are produced (a long run that fails still shows what it measured).
struct Lines(Vec<String>);

impl Lines {
    fn push(&mut self, s: String) {
        println!("{s}");
        self.0.push(s);
    }
}

/// Print the table and return whether every row passed.
pub fn print_table(rows: &[Row]) -> bool {
    print_header();
    print_rows(rows);
    print_summary(rows)
}

/// The table's header line.
pub fn print_header() {
    println!(
        "{:<44} {:>11} {:>5} {:>10} {:>8} {:>5}",
        "check", "shape", "m", "rel err", "tol", "ok"
    );
}

/// One line per row, flushed (a run cut short keeps the rows printed so far).
pub fn print_rows(rows: &[Row]) {
    use std::io::Write;
    for r in rows {
        println!(
            "{:<44} {:>11} {:>5} {:>10.2e} {:>8.0e} {:>5}",
            r.check,
            r.shape,
            r.m,
            r.err,
            r.tol,
            if r.pass { "PASS" } else { "FAIL" }
        );
    }
    let _ = std::io::stdout().flush();
}

/// `N passed, M failed`; whether none failed.
pub fn print_summary(rows: &[Row]) -> bool {
    let failed = rows.iter().filter(|r| !r.pass).count();
    println!("{} passed, {} failed", rows.len() - failed, failed);
    failed == 0
}
