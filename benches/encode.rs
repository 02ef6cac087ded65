//! Encoder throughput: source MB/s (f32 input) per thread for the Q8_0, Q4_K and Q2_K encoders
//! at 1 and 2 threads, against libgguf 0.2.2's `quantize_rows` (ggml's reference quantizers,
//! single-threaded) on the same data in the same run. `cargo bench --bench encode`.

use metrale_pack::converters::{self, BlockEncode, q2_k::Q2K, q4_k::Q4K, q8_0::Q8_0};
use metrale_pack::npy;
use std::time::Instant;

const ROWS: usize = 2048;
const COLS: usize = 4096;
const REPS: usize = 3;

fn best_secs<F: BlockEncode>(x: &[f32], threads: usize) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut out = vec![0u8; x.len() / F::BLOCK_ELEMS * converters::block_bytes::<F>()];
    (0..REPS)
        .map(|_| {
            let t = Instant::now();
            pool.install(|| converters::encode_blocks::<F>(x, &mut out));
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let mut s = 0x1234_5678u64;
    let x: Vec<f32> = (0..ROWS * COLS)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect();
    let mb = (x.len() * 4) as f64 / 1e6;
    let dir = std::env::temp_dir().join(format!("metrale-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x.npy");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    npy::write_f32(&mut f, &[ROWS, COLS], &x).unwrap();
    drop(f);
    let py = std::env::var("METRALE_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/bench_libgguf.py");
    let out = std::process::Command::new(py)
        .args([
            script,
            path.to_str().unwrap(),
            &REPS.to_string(),
            "Q8_0",
            "Q4_K",
            "Q2_K",
        ])
        .output()
        .expect("python3 with libgguf");
    let peer: Vec<(String, f64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.parse().unwrap()))
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    println!("encode {ROWS}x{COLS} f32 ({mb:.0} MB), best of {REPS}");
    println!(
        "{:<6} {:>14} {:>14} {:>16} {:>14}",
        "type", "ours 1t MB/s", "ours 2t MB/s", "libgguf 1t MB/s", "ours/libgguf"
    );
    type Timer = fn(&[f32], usize) -> f64;
    let rows: [(&str, Timer); 3] = [
        ("Q8_0", best_secs::<Q8_0>),
        ("Q4_K", best_secs::<Q4K>),
        ("Q2_K", best_secs::<Q2K>),
    ];
    for (name, f) in rows {
        let t1 = f(&x, 1);
        let t2 = f(&x, 2);
        let p = peer
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .unwrap_or(f64::NAN);
        println!(
            "{:<6} {:>14.0} {:>14.0} {:>16.0} {:>14.2}",
            name,
            mb / t1,
            mb / t2,
            mb / p,
            p / t1
        );
    }
}
