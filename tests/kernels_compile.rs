//! Every kernel module compiles with NVRTC for sm_90 (sm_90a for the modules written for
//! Hopper's own instructions) and defines the entry points the layer and
//! the host backend name. Needs libnvrtc and the CUDA headers, no GPU: scripts/test.sh installs
//! them from PyPI (nvidia-cuda-nvrtc, nvidia-cuda-runtime) and sets METRALE_REQUIRE_NVRTC=1, so
//! in CI a missing NVRTC is a failure; elsewhere the test says it skipped.

use metrale_pack::gpu::{cuda, kernels};

/// Whether libnvrtc loads; without it a test skips, except in CI (`METRALE_REQUIRE_NVRTC`).
fn nvrtc() -> bool {
    if cuda::nvrtc_version().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("METRALE_REQUIRE_NVRTC").is_none(),
        "NVRTC required but libnvrtc could not be loaded (LD_LIBRARY_PATH?)"
    );
    eprintln!("SKIPPED: libnvrtc not found; run scripts/test.sh to install it");
    false
}

#[test]
fn every_module_compiles_for_sm90_with_its_entry_points() {
    if !nvrtc() {
        return;
    }
    let include = cuda::cuda_include_dir();
    assert!(
        include.is_some(),
        "no CUDA headers: set METRALE_CUDA_INCLUDE"
    );
    for (module, _) in kernels::MODULES.iter() {
        // Arch-specific modules (wgmma) build for their target, sm_90a on an sm_90 device.
        let arch = kernels::module_arch(module, "sm_90").expect("every module runs on sm_90");
        let cubin = cuda::compile_cubin(module, &arch, include.as_deref())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{module}: not an ELF cubin");
        let names = kernels::entry_points(module);
        assert!(!names.is_empty(), "{module}: no entry points");
        for n in names {
            assert!(
                cubin.windows(n.len()).any(|w| w == n.as_bytes()),
                "{module}: {n} missing from the cubin"
            );
        }
    }
    // A broken source is reported with NVRTC's log, naming the module.
    let e = cuda::compile_cubin("no_such_module", "sm_90", include.as_deref())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no kernel module no_such_module"), "{e}");
}

/// The block and tile sizes come from `gpu::sizes` (prepended as `#define MP_*`), not from
/// literals in the kernel sources: no 36, 144, 34 or 4608 outside comments.
#[test]
fn kernel_sources_take_block_sizes_from_the_shared_defines() {
    let defines = metrale_pack::gpu::sizes::cuda_defines();
    for (name, v) in metrale_pack::gpu::sizes::SHARED {
        assert!(defines.contains(&format!("#define {name} {v}\n")), "{name}");
    }
    let mut sources: Vec<(&str, &str)> = kernels::MODULES.to_vec();
    sources.push(("common.cuh", kernels::COMMON));
    for (module, src) in sources {
        for (i, line) in src.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            // Inline-PTX operand lists name registers by number (`%36`, `"+f"(d[36])`).
            let code = code.replace('%', "%_").replace("d[", "d[_");
            for lit in ["36", "144", "34", "4608"] {
                let hit = code
                    .split(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '.')
                    .any(|tok| tok == lit);
                assert!(!hit, "{module}:{}: literal {lit}: {line}", i + 1);
            }
        }
        assert!(
            kernels::source(module).is_none_or(|s| s.starts_with(&defines)),
            "{module}: the defines are not prepended"
        );
    }
}

/// The wgmma module builds only for an sm_90 device (as sm_90a); elsewhere its arms fall back.
#[test]
fn arch_specific_modules_build_only_for_their_device() {
    assert_eq!(
        kernels::module_arch("ffn_w8a8_wgmma", "sm_90").as_deref(),
        Some("sm_90a")
    );
    assert_eq!(kernels::module_arch("ffn_w8a8_wgmma", "sm_80"), None);
    assert_eq!(kernels::module_arch("ffn_w8a8_wgmma", "sm_100"), None);
    assert_eq!(
        kernels::module_arch("ffn_w8a8", "sm_80").as_deref(),
        Some("sm_80")
    );
    if cuda::nvrtc_version().is_err() {
        return;
    }
    // The portable target rejects the wgmma instruction: the module is not silently portable.
    let include = cuda::cuda_include_dir();
    assert!(cuda::compile_cubin("ffn_w8a8_wgmma", "sm_90", include.as_deref()).is_err());
}

/// ptxas keeps the wgmmas of the sm_90a modules asynchronous: no "wgmma.mma_async instructions
/// are serialized" note (C7514, C7518, ...: a wgmma under a per-thread branch, or an accumulator
/// read while its wgmma may be pending, makes ptxas wait after every wgmma, which cost the W8A8
/// GEMM most of its tensor-core time on the H200), and no spills.
#[test]
fn wgmma_modules_are_not_serialized_and_do_not_spill() {
    if cuda::nvrtc_version().is_err() {
        return;
    }
    let include = cuda::cuda_include_dir();
    for (module, _, target) in kernels::ARCH_SPECIFIC {
        let (_, log) = cuda::compile_with_log(module, target, include.as_deref(), &["-Xptxas=-v"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(log.contains("Used"), "{module}: no ptxas report:\n{log}");
        assert!(!log.contains("serialized"), "{module}:\n{log}");
        assert!(
            log.lines()
                .filter(|l| l.contains("spill"))
                .all(|l| l.contains("0 bytes spill stores, 0 bytes spill loads")),
            "{module}:\n{log}"
        );
    }
}

/// The block-format engine's one-row GEMV fits its register budget without spilling: its
/// `__launch_bounds__` (blocks an SM) would otherwise turn registers into local-memory traffic
/// on the decode's hot path.
#[test]
fn the_engine_one_row_gemv_does_not_spill() {
    if cuda::nvrtc_version().is_err() {
        return;
    }
    let include = cuda::cuda_include_dir();
    let (_, log) = cuda::compile_with_log("ffn_ggml", "sm_90", include.as_deref(), &["-Xptxas=-v"])
        .unwrap_or_else(|e| panic!("{e}"));
    // The one-row form and its few-row A/B forms, each under its register bound.
    for entry in ["ggml_gemv1", "ggml_gemv_split", "ggml_gemv_split4"] {
        let at = log
            .find(&format!("Function properties for {entry}\n"))
            .unwrap_or_else(|| panic!("{entry}: no ptxas report:\n{log}"));
        let props = log[at..].lines().nth(1).unwrap_or("");
        assert!(
            props.contains("0 bytes spill stores, 0 bytes spill loads"),
            "{entry}: {props}"
        );
    }
}

/// The cubins embedded in the binary (`gpu::prebuilt`) are, bit for bit, what NVRTC makes of the
/// current kernel sources, and the index records those sources: a kernel edited without
/// rebuilding them fails here. `METRALE_BLESS=1` rewrites `kernels/prebuilt/` (then rebuild).
#[test]
fn prebuilt_cubins_are_nvrtc_output_of_the_current_sources() {
    use metrale_pack::gpu::prebuilt;
    if !nvrtc() {
        return;
    }
    let include = cuda::cuda_include_dir();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/prebuilt");
    let bless = std::env::var_os("METRALE_BLESS").is_some();
    let mut index = String::new();
    let mut stale = Vec::new();
    for (module, _) in kernels::MODULES.iter() {
        let target =
            kernels::module_arch(module, prebuilt::PREBUILT_DEVICE).expect("runs on sm_90");
        let built = cuda::compile_cubin(module, &target, include.as_deref()).unwrap();
        let key = prebuilt::source_key(module, &target).unwrap();
        index.push_str(&format!("{module} {target} {key:016x}\n"));
        if bless {
            std::fs::write(dir.join(format!("{module}-{target}.cubin")), &built).unwrap();
            continue;
        }
        match prebuilt::cubin(module, &target) {
            Ok(embedded) if embedded == built.as_slice() => {}
            Ok(_) => stale.push(format!("{module}: the embedded cubin differs from NVRTC's")),
            Err(e) => stale.push(format!("{module}: {e:?}")),
        }
    }
    if bless {
        std::fs::write(dir.join("index.txt"), &index).unwrap();
        return;
    }
    assert!(
        stale.is_empty(),
        "prebuilt kernels out of date (run METRALE_BLESS=1 scripts/test.sh or \
         METRALE_BLESS=1 cargo test --release --test kernels_compile prebuilt, then rebuild): {stale:?}"
    );
    assert_eq!(prebuilt::INDEX, index);
    assert_eq!(prebuilt::PREBUILT.len(), kernels::MODULES.len());
    // Aligned as NVRTC's heap output is: the driver reads the ELF image in place.
    for (m, _, c) in prebuilt::PREBUILT {
        assert_eq!(c.as_ptr() as usize % 64, 0, "{m}");
        assert_eq!(&c[..4], b"\x7fELF", "{m}");
    }
}

/// A module whose source changed since its cubin was built, or a target none is built for,
/// goes to NVRTC.
#[test]
fn a_changed_source_or_another_target_has_no_prebuilt_cubin() {
    use metrale_pack::gpu::prebuilt::{self, Missing};
    assert_eq!(prebuilt::cubin("ffn_act", "sm_80"), Err(Missing::Target));
    assert_eq!(
        prebuilt::cubin("no_such_module", "sm_90"),
        Err(Missing::Target)
    );
    // The index names a hash no source has: as a kernel edited after the build.
    let (m, t, _) = prebuilt::PREBUILT[0];
    let key = prebuilt::source_key(m, t).unwrap();
    assert_ne!(prebuilt::source_key(m, "sm_90a"), Some(key));
}
