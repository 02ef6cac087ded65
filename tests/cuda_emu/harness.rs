//! The emulator harness shared by `tests/cuda_emu.rs` and `tests/cuda_emu_w8a8.rs`: the kernel
//! sources compiled as C++ with `prelude.h` and `driver.cpp` (once per test process), a launch
//! through a command file, and the buffer helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub enum A {
    P(Vec<u8>),
    I(usize),
    F(f32),
    /// A tensor map over a buffer: bytes, row bytes, rows, box rows, box bytes (not written back).
    T(Vec<u8>, usize, usize, usize, usize),
}

pub fn cxx() -> Option<String> {
    let mut candidates: Vec<String> = std::env::var("CXX").into_iter().collect();
    candidates.extend(["c++", "g++", "clang++"].map(String::from));
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The emulator binary, built once per test process; None (with a message) without a compiler.
pub fn emulator() -> Option<&'static Path> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| {
        let Some(cxx) = cxx() else {
            assert!(
                std::env::var_os("METRALE_REQUIRE_CXX").is_none(),
                "a C++ compiler is required (METRALE_REQUIRE_CXX) but none was found"
            );
            eprintln!("SKIPPED: no C++ compiler (c++, g++, clang++ or $CXX)");
            return None;
        };
        let raw = |m: &str| {
            metrale_pack::gpu::kernels::MODULES
                .iter()
                .find(|(n, _)| *n == m)
                .unwrap()
                .1
        };
        let strip_includes = |s: &str| -> String {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("#include"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let common = metrale_pack::gpu::kernels::COMMON;
        let begin = common
            .find("// ---- host-emulated: begin")
            .expect("begin marker");
        let end = common
            .find("// ---- host-emulated: end")
            .expect("end marker");
        let mut program = String::from(include_str!("prelude.h"));
        program.push_str(&metrale_pack::gpu::sizes::cuda_defines());
        program.push_str(&common[begin..end]);
        for m in [
            "ffn_q8_1",
            "ffn_q2g128",
            "ffn_q4k_mmq",
            "ffn_lora",
            "ffn_ggml",
        ] {
            program.push_str(&format!("\n// ---- {m} ----\n"));
            program.push_str(&strip_includes(raw(m)));
        }
        // The NVFP4, FP8 and BF16 GEMVs (the tensor-core GEMMs after them need the device), and
        // the W8A8 GEMM with its decode GEMV.
        for m in [
            "ffn_nvfp4",
            "ffn_fp8",
            "ffn_bf16",
            "ffn_affine",
            "ffn_w8a8",
            "ffn_w8a8_wgmma",
            "probe",
            "rules",
        ] {
            let src = raw(m);
            let b = src
                .find("// ---- host-emulated: begin")
                .unwrap_or_else(|| panic!("{m}: begin marker"));
            let e = src
                .find("// ---- host-emulated: end")
                .unwrap_or_else(|| panic!("{m}: end marker"));
            program.push_str(&format!("\n// ---- {m} GEMVs ----\n"));
            program.push_str(&src[b..e]);
        }
        program.push_str(include_str!("driver.cpp"));
        let dir = std::env::temp_dir().join(format!("metrale-cuda-emu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cpp = dir.join("emu.cpp");
        std::fs::write(&cpp, program).unwrap();
        let exe = dir.join("emu");
        let out = Command::new(&cxx)
            .args([
                "-std=c++20",
                "-O2",
                "-ffp-contract=off",
                "-fno-fast-math",
                "-Wno-unknown-pragmas",
                "-pthread",
                "-o",
            ])
            .arg(&exe)
            .arg(&cpp)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "compiling the kernel sources as C++ failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(exe)
    })
    .as_deref()
}

/// Launch `name` on the emulator; buffers come back updated.
pub fn launch(exe: &Path, name: &str, grid: (usize, usize), block: usize, args: &mut [A]) {
    let mut cmd = Vec::new();
    cmd.extend_from_slice(&(name.len() as u32).to_le_bytes());
    cmd.extend_from_slice(name.as_bytes());
    for v in [grid.0, grid.1, block, args.len()] {
        cmd.extend_from_slice(&(v as u32).to_le_bytes());
    }
    for a in args.iter() {
        match a {
            A::P(b) => {
                cmd.push(b'P');
                cmd.extend_from_slice(&(b.len() as u64).to_le_bytes());
                cmd.extend_from_slice(b);
            }
            A::I(v) => {
                cmd.push(b'I');
                cmd.extend_from_slice(&(*v as i32).to_le_bytes());
            }
            A::F(v) => {
                cmd.push(b'F');
                cmd.extend_from_slice(&v.to_le_bytes());
            }
            A::T(b, row_bytes, rows, box_rows, box_bytes) => {
                cmd.push(b'T');
                cmd.extend_from_slice(&(b.len() as u64).to_le_bytes());
                cmd.extend_from_slice(b);
                cmd.extend_from_slice(&(*row_bytes as u64).to_le_bytes());
                cmd.extend_from_slice(&(*rows as u64).to_le_bytes());
                cmd.extend_from_slice(&(*box_rows as u32).to_le_bytes());
                cmd.extend_from_slice(&(*box_bytes as u32).to_le_bytes());
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (inp, outp) = (dir.path().join("in"), dir.path().join("out"));
    std::fs::write(&inp, &cmd).unwrap();
    let st = Command::new(exe).arg(&inp).arg(&outp).status().unwrap();
    assert!(st.success(), "{name}: emulator exited with {st}");
    let out = std::fs::read(&outp).unwrap();
    let mut at = 0;
    for a in args.iter_mut() {
        if let A::P(b) = a {
            let n = u64::from_le_bytes(out[at..at + 8].try_into().unwrap()) as usize;
            *b = out[at + 8..at + 8 + n].to_vec();
            at += 8 + n;
        }
    }
}

pub fn f32b(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
pub fn bf32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
pub fn buf(a: &A) -> &[u8] {
    match a {
        A::P(b) => b,
        _ => panic!("not a buffer"),
    }
}
/// Rows of a reference computed per row, as one f64 vector.
pub fn rows64(m: usize, n: usize, f: impl Fn(usize, &mut [f32])) -> Vec<f64> {
    let mut out = Vec::with_capacity(m * n);
    for r in 0..m {
        let mut row = vec![0f32; n];
        f(r, &mut row);
        out.extend(row.iter().map(|&v| v as f64));
    }
    out
}
