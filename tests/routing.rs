//! The routing matrix (`check::routing`): which kernels serve every forward method at every row
//! count, for every layer-check arm and for layers holding several layouts, on the host backend,
//! against `tests/fixtures/routing.txt`. A change to the routing must show as a change to that
//! file: `METRALE_BLESS=1 cargo test --test routing` rewrites it. And the arms a loaded layer
//! offers by name, from the layouts' runtimes.

mod common;

use common::pack::{all_but_lora, generated_pack};
use metrale_pack::layout::Layout;

#[test]
fn the_routing_matrix_is_the_recorded_one() {
    let got = metrale_pack::check::routing::routing_matrix().unwrap();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/routing.txt");
    if std::env::var_os("METRALE_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap();
    let diff: Vec<String> = want
        .lines()
        .zip(got.lines())
        .filter(|(a, b)| a != b)
        .take(20)
        .map(|(a, b)| format!("- {a}\n+ {b}"))
        .collect();
    assert!(
        diff.is_empty() && want.lines().count() == got.lines().count(),
        "the routing changed ({} lines recorded, {} now):\n{}",
        want.lines().count(),
        got.lines().count(),
        diff.join("\n")
    );
}

/// Every arm of the table serves some line of the matrix, but the fallbacks to the prefill
/// GEMMs of the BF16 decode and the q4k_mmq decode and 2-3 rows: the host backend resolves
/// their GEMVs, so only a backend without those kernels takes them.
#[test]
fn every_arm_serves_some_call_of_the_matrix() {
    use metrale_pack::ffn::{Method, arms};
    let got = metrale_pack::check::routing::routing_matrix().unwrap();
    let method = |m: &str| match m {
        "forward" => Method::Decode,
        "forward_k2" | "forward_k3" => Method::Small,
        "km" => Method::Verify,
        "fixed" => Method::Fixed,
        _ => Method::Prefill,
    };
    let seen: Vec<(Method, String)> = got
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(" | ").collect();
            (method(f[1]), f[3].to_string())
        })
        .collect();
    let unseen: Vec<String> = arms()
        .iter()
        .filter(|a| !seen.iter().any(|(m, n)| *m == a.method && n == a.name))
        .map(|a| format!("{:?} {}", a.method, a.name))
        .collect();
    assert_eq!(
        unseen,
        [
            "Decode bf16 via prefill",
            "Decode q4k via prefill",
            "Small q4k via prefill"
        ]
    );
}

/// The layouts' arm rows sort into one order per method: no two arms of a method share a rank
/// (an order the registry's sequence would otherwise decide), and each method's arms come in
/// rising rank.
#[test]
fn no_two_arms_of_a_method_share_a_rank() {
    use metrale_pack::ffn::arms;
    let a = arms();
    assert!(a.len() >= 30, "{} arms", a.len());
    for (i, x) in a.iter().enumerate() {
        for y in &a[i + 1..] {
            assert!(
                x.method != y.method || x.rank != y.rank,
                "{:?}: {} and {} share rank {}",
                x.method,
                x.name,
                y.name,
                x.rank
            );
            assert!(
                (x.method, x.rank) < (y.method, y.rank),
                "{} before {}",
                x.name,
                y.name
            );
        }
    }
}

/// The arms a layer holding every layout but `lora` offers by name, in the order the loader
/// listed them before each layout declared its own (`ffn::NamedArm` in its runtime), and a
/// layer holding one layout offers only that layout's.
#[test]
fn named_arms_keep_their_order_and_need_their_layouts() {
    let dir = tempfile::tempdir().unwrap();
    let (_, p) = generated_pack(dir.path(), 128, 256, 2, Some(all_but_lora()));
    let b: std::sync::Arc<dyn metrale_pack::GpuBackend> =
        std::sync::Arc::new(metrale_pack::HostBackend::new());
    let m = metrale_pack::LoadedModel::load(&p, b.clone(), &Default::default()).unwrap();
    let want = [
        "bf16",
        "fp8",
        "w8a8",
        "w8a8 fixed (W8A8)",
        "nvfp4",
        "nvfp4 silu fused down",
        "nvfp4 fixed (W4A4)",
        "nvfp4_t",
        "nvfp4_mmq",
        "q4k_mmq",
        "q2g128",
        "affine",
        "q4k",
        "ggml",
    ];
    assert_eq!(m.arm_names(1).unwrap(), want);
    assert_eq!(metrale_pack::loader::arms::rows_per_call("w8a8", 1000), 64);
    assert_eq!(
        metrale_pack::loader::arms::rows_per_call("w8a8 fixed (W8A8)", 1000),
        1000
    );
    drop(m);
    let dir = tempfile::tempdir().unwrap();
    let (_, p) = generated_pack(
        dir.path(),
        128,
        256,
        1,
        Some(vec![Layout::Nvfp4, Layout::Nvfp4T]),
    );
    let m = metrale_pack::LoadedModel::load(&p, b, &Default::default()).unwrap();
    assert_eq!(
        m.arm_names(0).unwrap(),
        [
            "nvfp4",
            "nvfp4 silu fused down",
            "nvfp4 fixed (W4A4)",
            "nvfp4_t"
        ]
    );
}
