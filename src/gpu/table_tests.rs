//! The kernel table's tests: descriptions against the parsed `.cu` signatures, grids and
//! tensor maps from rules, and named-argument calls.
use super::*;
use crate::gpu::Tmap;

#[test]
fn every_description_matches_its_parsed_cu_signature() {
    for s in &KERNELS {
        let sigs = super::super::kernels::signatures(s.module);
        let (_, parsed) = sigs
            .iter()
            .find(|(n, _)| n == s.name)
            .unwrap_or_else(|| panic!("{}::{} has no signature", s.module, s.name));
        let want: Vec<(String, ParamKind)> = s.params().map(|(n, k)| (n.to_string(), k)).collect();
        assert_eq!(&want, parsed, "{}::{}", s.module, s.name);
    }
}

/// A kernel launched as a programmatic dependent must wait for the launch before it
/// (`pdl_wait()` in its source): without the wait it would read that launch's output early.
/// And a kernel that waits is launched so (else the wait buys nothing).
#[test]
fn dependent_kernels_are_those_that_wait() {
    let mut marked = 0;
    for s in &KERNELS {
        let waits = super::super::kernels::calls_pdl_wait(s.module, s.name);
        assert_eq!(s.dependent, waits, "{}::{} dependent", s.module, s.name);
        marked += usize::from(s.dependent);
    }
    // The decode chains' kernels (the act-mul, the layouts' GEMVs and activation quantizers).
    assert!(marked >= 27, "{marked} dependent kernels");
}

#[test]
fn every_entry_point_is_in_the_table_once() {
    for (m, _) in super::super::kernels::MODULES.iter() {
        for e in super::super::kernels::entry_points(m) {
            let n = KERNELS
                .iter()
                .filter(|s| s.module == *m && s.name == e)
                .count();
            assert_eq!(n, 1, "{m}::{e}");
        }
    }
    let mut fields: Vec<_> = KERNELS.iter().map(|s| s.field).collect();
    fields.sort();
    fields.dedup();
    assert_eq!(fields.len(), KERNELS.len());
}

/// The FP8 quantizer spreads a decode row over kp / 1024 blocks, keeps one block per row in
/// prefill, and is refused more rows than a grid's y axis holds; the wgmma GEMM's launch carries
/// its dynamic shared memory.
#[test]
fn grids_from_rules_and_shared_memory_from_the_table() {
    let b = crate::gpu::host::HostBackend::new();
    let k = Kernels::resolve(&b);
    let p = DevicePtr { addr: 64, bytes: 4 };
    let quant = |m: usize| {
        let c = k.quant_fp8_row.call().ptr("x", p).ptr("q", p).ptr("sx", p);
        c.dim("m", m).dim("k", 14336).dim("kp", 14336).finish()
    };
    assert_eq!(quant(1).unwrap().cfg.grid, (14, 1, 1));
    assert_eq!(quant(16).unwrap().cfg.grid, (14, 16, 1));
    assert_eq!(quant(17).unwrap().cfg.grid, (1, 17, 1));
    let e = quant(65536).unwrap_err().to_string();
    assert!(e.contains("grid 1 x 65536 does not fit"), "{e}");
    let c = k.w8a8_wgmma.call().ptr("q", p).ptr("sx", p).ptr("w", p);
    let c = c.ptr("sw", p).ptr("y", p).dim("m", 300).dim("n", 4096);
    let l = c.dim("kp", 14336).dim("ldy", 4096).finish().unwrap();
    // Persistent: the table gives every tile a block; the backend clamps to its
    // multiprocessors at run.
    assert_eq!(l.cfg.grid, (3 * 32, 1, 1));
    assert!(l.spec.grid.persistent);
    assert_eq!(l.cfg.smem as usize, crate::gpu::sizes::W8A8_WGMMA_SMEM);
    assert_eq!(l.cfg.block, (384, 1, 1));
    // The tensor maps from the pointers and the named sizes.
    let want = |rows, box_rows| {
        KArg::Tmap(Tmap {
            base: p,
            row_bytes: 14336,
            rows,
            box_rows,
            box_bytes: 128,
        })
    };
    assert_eq!(l.args[0], want(300, 128));
    assert_eq!(l.args[3], want(4096, 128));
    // On a device: at most one block per multiprocessor; without a count (the host), as given.
    assert_eq!(l.cfg_on(Some(132)).grid, (96, 1, 1));
    assert_eq!(l.cfg_on(Some(64)).grid, (64, 1, 1));
    assert_eq!(l.cfg_on(None).grid, (96, 1, 1));
    // A grid that is not persistent is never clamped.
    let q = quant(17).unwrap();
    assert_eq!(q.cfg_on(Some(4)).grid, (1, 17, 1));
}

#[test]
fn a_call_orders_named_arguments_and_refuses_wrong_ones() {
    let b = crate::gpu::host::HostBackend::new();
    let k = Kernels::resolve(&b);
    let p = DevicePtr { addr: 64, bytes: 4 };
    let l = k
        .q2_gemv_m
        .call()
        .dim("ldy", 7)
        .ptr("y", p)
        .dim("kp", 256)
        .dim("k", 200)
        .dim("n", 9)
        .ptr("w", p)
        .dim("m", 3)
        .ptr("x", p)
        .finish()
        .unwrap();
    assert_eq!(
        l.args,
        [
            KArg::Ptr(p),
            KArg::Dim(3),
            KArg::Ptr(p),
            KArg::Ptr(p),
            KArg::Dim(9),
            KArg::Dim(200),
            KArg::Dim(256),
            KArg::Dim(7)
        ]
    );
    assert_eq!(l.cfg, LaunchCfg::grid(2, 1, 256));
    let full = |c: Call| {
        c.ptr("x", p)
            .ptr("w", p)
            .ptr("y", p)
            .dim("n", 9)
            .dim("k", 200)
            .dim("kp", 256)
            .dim("ldy", 7)
    };
    // Over the row cap, a missing, an unknown, a repeated and a mis-kinded argument.
    assert!(full(k.q2_gemv_m.call()).dim("m", 5).finish().is_err());
    assert!(full(k.q2_gemv_m.call()).finish().is_err());
    assert!(
        full(k.q2_gemv_m.call())
            .dim("m", 1)
            .dim("rows", 1)
            .finish()
            .is_err()
    );
    assert!(
        full(k.q2_gemv_m.call())
            .dim("m", 1)
            .dim("m", 1)
            .finish()
            .is_err()
    );
    assert!(full(k.q2_gemv_m.call()).float("m", 1.0).finish().is_err());
    assert!(
        full(k.q2_gemv_m.call())
            .dim("m", i32::MAX as usize + 1)
            .finish()
            .is_err()
    );
    // More arguments than any kernel takes: refused, not an out-of-bounds write.
    let mut many = full(k.q2_gemv_m.call()).dim("m", 1);
    for _ in 0..MAX_PARAMS {
        many = many.dim("ldy", 1);
    }
    assert!(many.finish().is_err());
    let hidden = crate::gpu::host::HostBackend::without(&["q2g128_gemv_batchm"]);
    let e = full(Kernels::resolve(&hidden).q2_gemv_m.call())
        .dim("m", 1)
        .finish()
        .unwrap_err();
    assert!(matches!(e, GpuError::MissingKernel { .. }), "{e}");
}

/// The dequantizing GEMMs' activation map counts bf16 bytes: rows of 2 k bytes in boxes of 128
/// rows of 128 bytes (64 values); the int8 GEMM's maps are `w8a8_wgmma`'s under its names.
#[test]
fn tensor_maps_scale_rows_by_the_element_size() {
    let b = crate::gpu::host::HostBackend::new();
    let k = Kernels::resolve(&b);
    let p = DevicePtr {
        addr: 64,
        bytes: 1 << 20,
    };
    let c = k
        .q4k_wgmma
        .call()
        .ptr("x", p)
        .dim("m", 300)
        .ptr("w", p)
        .ptr("y", p);
    let l = c
        .dim("n", 4096)
        .dim("k", 1000)
        .dim("kp", 1024)
        .dim("ldy", 4096);
    let l = l.finish().unwrap();
    let want = Tmap {
        base: p,
        row_bytes: 2000,
        rows: 300,
        box_rows: crate::gpu::sizes::DQ_WGMMA_BM,
        box_bytes: 128,
    };
    assert_eq!(l.args[0], KArg::Tmap(want));
    assert_eq!(l.cfg.grid, (3 * 32, 1, 1));
    assert_eq!(l.cfg.smem as usize, crate::gpu::sizes::DQ_WGMMA_SMEM);
    let c = k
        .int8_wgmma
        .call()
        .ptr("aq", p)
        .ptr("sa", p)
        .ptr("wq", p)
        .ptr("sw", p);
    let l = c
        .ptr("y", p)
        .dim("m", 5)
        .dim("n", 7)
        .dim("kp", 256)
        .dim("ldy", 7);
    let l = l.finish().unwrap();
    let KArg::Tmap(t) = l.args[3] else {
        panic!("{:?}", l.args[3])
    };
    assert_eq!((t.row_bytes, t.rows, t.box_bytes), (256, 7, 128));
}
