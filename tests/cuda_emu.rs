//! The CUDA source of `finalize_q4k_load`'s Q4_K encoder (the host-emulated region of
//! `kernels/ffn_q4k.cu`) compiled as C++ on the host, with stand-ins for the few CUDA builtins
//! it uses (`tests/cuda_emu/prelude.h`), run over its whole grid, and compared byte for byte
//! with the converter's Q4_K encoder (itself byte-identical to ggml's reference quantizer:
//! `tests/interop_codecs.rs`). This catches indexing and operation-order mistakes in the kernel
//! without a GPU; the H200's `gpu-check` repeats the comparison on the device.

use metrale_pack::converters::layouts;
use metrale_pack::ffn::testing::Rand;
use std::process::Command;

fn cxx() -> Option<String> {
    let mut candidates: Vec<String> = std::env::var("CXX").into_iter().collect();
    candidates.extend(["c++", "g++", "clang++"].map(String::from));
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn emulator(dir: &std::path::Path, cxx: &str) -> std::path::PathBuf {
    let (_, src) = metrale_pack::gpu::kernels::MODULES
        .iter()
        .find(|(m, _)| *m == "ffn_q4k")
        .unwrap();
    let begin = src
        .find("// ---- host-emulated: begin")
        .expect("begin marker");
    let end = src.find("// ---- host-emulated: end").expect("end marker");
    let program = format!(
        "{}\n{}\n{}",
        include_str!("cuda_emu/prelude.h"),
        &src[begin..end],
        include_str!("cuda_emu/driver_q4k.cpp")
    );
    let cpp = dir.join("emu_q4k.cpp");
    std::fs::write(&cpp, program).unwrap();
    let exe = dir.join("emu_q4k");
    let out = Command::new(cxx)
        .args([
            "-std=c++17",
            "-O2",
            "-ffp-contract=off",
            "-fno-fast-math",
            "-o",
        ])
        .arg(&exe)
        .arg(&cpp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compiling the kernel region failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn the_q4k_encoder_kernel_source_gives_the_converters_bytes() {
    let Some(cxx) = cxx() else {
        assert!(
            std::env::var_os("METRALE_REQUIRE_CXX").is_none(),
            "a C++ compiler is required (METRALE_REQUIRE_CXX) but none was found"
        );
        eprintln!("SKIPPED: no C++ compiler (c++, g++, clang++ or $CXX)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let exe = emulator(dir.path(), &cxx);
    let mut r = Rand(97);
    // (rows, k): k not a multiple of 256 (padding), exactly 256, and longer rows.
    for (n, k) in [(5usize, 576usize), (3, 256), (4, 1536), (64, 4096)] {
        let mut w = r.vec(n * k, 0.05);
        // Row 0 all zero; row 1 one outlier; row 2 constant: the encoder's edge cases.
        w[..k].fill(0.0);
        w[k + 7] = 3.0;
        w[2 * k..3 * k].fill(-0.02);
        let e = layouts::nvfp4::encode(&w, n, k);
        let (codes, scales, g, kp_nv) = (&e.parts[0].1, &e.parts[1].1, e.scalars[0].1, e.padded[1]);
        let values = layouts::crop(
            &layouts::nvfp4::decode_padded(codes, scales, g, n, kp_nv),
            kp_nv,
            n,
            k,
        );
        let want = layouts::q4k_mmq::encode_q4k(&values, n, k);
        let kp_q = want.padded[1];
        let mut input = Vec::new();
        for v in [n, k, kp_nv, kp_q] {
            input.extend_from_slice(&(v as i32).to_le_bytes());
        }
        input.extend_from_slice(&g.to_le_bytes());
        input.extend_from_slice(codes);
        input.extend_from_slice(scales);
        let (inp, outp) = (dir.path().join("in.bin"), dir.path().join("out.bin"));
        std::fs::write(&inp, &input).unwrap();
        let st = Command::new(&exe).arg(&inp).arg(&outp).status().unwrap();
        assert!(st.success(), "emulator exited with {st}");
        let got = std::fs::read(&outp).unwrap();
        let want = &want.parts[0].1;
        assert_eq!(got.len(), want.len());
        if let Some(i) = got.iter().zip(want.iter()).position(|(a, b)| a != b) {
            panic!(
                "[{n}, {k}]: byte {i} (row {}, block {}, offset {}) is {:#04x}, the converter's {:#04x}",
                i / (kp_q / 256 * 144),
                i / 144 % (kp_q / 256),
                i % 144,
                got[i],
                want[i]
            );
        }
    }
}
