//! A layout defined here, in the test tree only: `toy_bf16`, BF16 rows with K padded to 64 (the
//! built-in `bf16` pads to 8), one blob per projection, served by arms of its own that launch
//! the BF16 GEMV four rows at a time. It registers as a built-in layout does, a spec
//! (`layout::register`) and a runtime (`ffn::register`: install, arms, named arms), and then
//! converts, opens, verifies, decodes, loads and forwards on the host backend like one, without
//! a line of it outside this file.

use half::bf16;
use metrale_pack::GgmlType;
use metrale_pack::error::Result;
use metrale_pack::ffn::{
    Arm, DenseFfnLayer, ForwardContext, LayerOverlays, Method, NamedArm, Overlays, Runtime,
};
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::gpu::{DevicePtr, GpuBackend, GpuResult, download_f32, upload_f32};
use metrale_pack::layout::{
    BlobRead, DownFormat, EncodeCx, Encoded, LayerViews, Layout, LayoutSpec, Proj, source_index,
};
use metrale_pack::loader::{EngineOptions, LoadedModel};
use metrale_pack::model::Model;
use metrale_pack::pack::{self, ConvertOptions, Pack, blob_name};
use std::sync::Arc;

const TOY: Layout = Layout::custom("toy_bf16");
/// K is padded to this many columns.
const K_ALIGN: u64 = 64;
const HIDDEN: usize = 256;
const INTER: usize = 288;

/// The toy layout's spec: storage, codec and binding.
struct ToyBf16;

impl LayoutSpec for ToyBf16 {
    fn layout(&self) -> Layout {
        TOY
    }
    fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
        &[""]
    }
    fn padded_shape(&self, _: Proj, [n, k]: [u64; 2]) -> Option<[u64; 2]> {
        Some([n, k.checked_next_multiple_of(K_ALIGN)?])
    }
    fn part_bytes(&self, part: &str, [np, kp]: [u64; 2], _: u64) -> Option<u64> {
        (part.is_empty()).then(|| np.checked_mul(kp)?.checked_mul(2))?
    }
    fn encode(&self, cx: &mut EncodeCx, proj: Proj) -> Result<Option<Encoded>> {
        let pi = source_index(proj);
        let [n, k] = cx.shape(pi)?;
        let kp = (k as u64).next_multiple_of(K_ALIGN) as usize;
        let w = cx.dense(pi)?;
        let mut bytes = vec![0u8; n * kp * 2];
        for r in 0..n {
            for c in 0..k {
                let b = bf16::from_f32(w[r * k + c]).to_le_bytes();
                bytes[(r * kp + c) * 2..(r * kp + c) * 2 + 2].copy_from_slice(&b);
            }
        }
        Ok(Some(Encoded {
            parts: vec![("", bytes)],
            padded: [n, kp],
            scalars: Vec::new(),
        }))
    }
    fn decode(&self, b: &BlobRead) -> Result<Vec<f32>> {
        let ([n, k], kp) = (b.shape, b.padded[1]);
        let bytes = b.part("")?;
        Ok((0..n * k)
            .map(|i| {
                let at = ((i / k) * kp + i % k) * 2;
                bf16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
            })
            .collect())
    }
    fn bind(&self, v: &LayerViews, o: &mut LayerOverlays) {
        let w = [Proj::Gate, Proj::Up, Proj::Down].map(|p| {
            v.get(p, "").map(|(ptr, fe)| ToyWeight {
                w: ptr,
                n: fe.shape[0] as usize,
                k: fe.shape[1] as usize,
                kp: fe.padded[1] as usize,
            })
        });
        if let [Some(g), Some(u), Some(d)] = w {
            o.overlays.set_any(TOY, Arc::new([g, u, d]));
        }
    }
}

/// One projection as the arms see it: a view into the loaded pack and its shape.
#[derive(Clone, Copy, Debug)]
struct ToyWeight {
    w: DevicePtr,
    n: usize,
    k: usize,
    kp: usize,
}

/// `y [m, n] = x [m, k] . w^T` through the BF16 GEMV, four rows at a time.
fn project(
    l: &DenseFfnLayer,
    c: &mut ForwardContext,
    w: &ToyWeight,
    x: DevicePtr,
    m: usize,
    y: DevicePtr,
    ldy: usize,
) -> GpuResult<()> {
    for r0 in (0..m).step_by(4) {
        let rows = (m - r0).min(4);
        let xv = x.view((r0 * w.k * 4) as u64, (rows * w.k * 4) as u64);
        let yv = y.view((r0 * ldy * 4) as u64, (rows * ldy * 4) as u64);
        let call = l.kernels().bf16_gemv.call().ptr("x", xv).dim("m", rows);
        let call = call.ptr("w", w.w).ptr("y", yv).dim("n", w.n).dim("k", w.k);
        l.launch(c, call.dim("kp", w.kp).dim("ldy", ldy))?;
    }
    Ok(())
}

/// The toy arm of every method: the gated FFN through [`project`].
fn run(l: &DenseFfnLayer, c: &mut ForwardContext, x: DevicePtr, m: usize) -> GpuResult<DevicePtr> {
    let w = l
        .overlay::<[ToyWeight; 3]>(TOY)
        .copied()
        .expect("the arm serves only layers holding the toy overlay");
    l.gated(c, x, m, false, &w, project)
}

fn always(_: &DenseFfnLayer, _: &ForwardContext, _: usize) -> bool {
    true
}

/// Install the layer's toy overlay from the loader's, if it holds one (a built-in layout's
/// install calls its validating `set_*` method; this one's weights were checked by the pack).
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.any(TOY) {
        Some(w) => l.set_overlay(TOY, w.clone()),
        None => Ok(()),
    }
}

/// The toy layout's runtime, as a built-in layout's `runtime.rs` declares its own.
static TOY_RUNTIME: Runtime = Runtime {
    layout: TOY,
    builds_on: None,
    install,
    arms: &[
        Arm::new(Method::Decode, "toy gemv", TOY, always, run).rank(90),
        Arm::new(Method::Small, "toy gemv", TOY, always, run).rank(90),
        Arm::new(Method::Verify, "toy gemv", TOY, always, run).rank(90),
        Arm::new(Method::Prefill, "toy gemv", TOY, always, run).rank(90),
    ],
    named: &[NamedArm::new("toy gemv", &[TOY], 90)],
};

/// The route every built-in layout takes too, at first use.
fn register() {
    assert_eq!(metrale_pack::layout::register(&ToyBf16).unwrap(), TOY);
    metrale_pack::ffn::register(&TOY_RUNTIME).unwrap();
}

/// `down(silu(gate x) * up x)` in float64 over the weights the pack holds (the harness's
/// float64 FFN).
fn reference(p: &Pack, layer: usize, x: &[f32], m: usize) -> Vec<f64> {
    let w = |proj| p.decode_ffn(&blob_name(layer, proj, TOY, "")).unwrap().0;
    let weights = metrale_pack::testing::DenseWeights {
        gate: w(Proj::Gate),
        up: w(Proj::Up),
        down: w(Proj::Down),
        hidden: HIDDEN,
        inter: INTER,
    };
    metrale_pack::testing::ffn_f64(x, m, &weights, metrale_pack::model::Activation::Silu)
}

#[test]
fn a_layout_from_the_test_tree_converts_loads_and_forwards() {
    register();
    let dir = tempfile::tempdir().unwrap();
    // A two-layer llama FFN in F32 (intermediate 288: not a multiple of 64).
    let src = dir.path().join("ffn.gguf");
    metrale_pack::testing::gen_model::gen_model(&src, HIDDEN, INTER, 2, GgmlType::F32, "llama")
        .unwrap();
    let out = dir.path().join("toy.mpk.gguf");
    let opts = ConvertOptions {
        layouts: Some(vec![TOY]),
        ..Default::default()
    };
    let man = pack::convert(Model::open(&src).unwrap(), &opts, &out, &|_, _| {}).unwrap();
    assert_eq!(man.layouts, ["toy_bf16"]);

    // Opened and verified as any pack: its blobs checked against the spec's sizes.
    let p = Pack::open(&out).unwrap();
    assert!(p.verify_checksums().unwrap().is_empty());
    let (gate, shape) = p.decode_ffn(&blob_name(1, Proj::Gate, TOY, "")).unwrap();
    assert_eq!(shape, [INTER as u64, HIDDEN as u64]);
    let model = Model::open(&src).unwrap();
    let t = model
        .tensors
        .iter()
        .position(|t| t.name == "blk.1.ffn_gate.weight")
        .unwrap();
    let f32s: Vec<f32> = model
        .data(t)
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    // The source's F32 rows in ggml order are the logical [inter, hidden] weight, rounded once.
    let want: Vec<f32> = f32s.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
    assert!(
        gate.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    let down = p
        .file
        .tensors
        .iter()
        .find(|t| t.name == blob_name(0, Proj::Down, TOY, ""));
    assert_eq!(
        down.unwrap().bytes,
        (HIDDEN * 320 * 2) as u64,
        "K 288 padded to 320"
    );
    drop(p);

    // Loaded and forwarded on the host backend by its own arms.
    let host = Arc::new(HostBackend::new());
    let backend: Arc<dyn GpuBackend> = host.clone();
    let eopts = EngineOptions {
        max_tokens: 9,
        verify_checksums: true,
        trace: true,
        ..Default::default()
    };
    let mut lm = LoadedModel::load(&out, backend.clone(), &eopts).unwrap();
    let x: Vec<f32> = (0..9 * HIDDEN)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.5)
        .collect();
    let input = backend.alloc((9 * HIDDEN * 4) as u64).unwrap();
    upload_f32(backend.as_ref(), input, &x).unwrap();
    // Offered by name, as a built-in layout's named arms are (`ffn-apply --arm`, Python's
    // `forward(..., arm=)`), and listed among the registry's arms.
    let ov = metrale_pack::loader::arms::layer_overlays(&lm.pack, 1).unwrap();
    let named: Vec<&str> = metrale_pack::loader::arms::arms_of(ov)
        .iter()
        .map(|a| a.name)
        .collect();
    assert_eq!(named, ["toy gemv"]);
    assert_eq!(
        metrale_pack::ffn::arms()
            .iter()
            .filter(|a| a.layout == TOY)
            .count(),
        4
    );
    for l in [0, 1] {
        let arm = lm.layer(l).unwrap().serving_arm(&lm.ctx, Method::Decode, 1);
        assert_eq!(arm.map(|a| a.name), Some("toy gemv"));
        for m in [1, 2, 9] {
            lm.ctx.trace.clear();
            let y = lm.forward(l, input, m).unwrap();
            let y = download_f32(backend.as_ref(), y.view(0, (m * HIDDEN * 4) as u64)).unwrap();
            let err = metrale_pack::testing::rel_err(
                &y,
                &reference(&lm.pack.pack, l, &x[..m * HIDDEN], m),
            );
            println!("layer {l}, {m} rows: {err:.2e} against the float64 FFN");
            // BF16 weights decoded exactly, f32 activations and sums (6e-8 to 7e-8 measured):
            // 1e-5 against the float64 FFN.
            assert!(err < 1e-5, "layer {l}, {m} rows: error {err:.2e}");
            let launches = 3 * m.div_ceil(4) + 1;
            assert_eq!(lm.ctx.trace.len(), launches, "{:?}", lm.ctx.trace);
            assert!(
                lm.ctx
                    .trace
                    .iter()
                    .all(|k| *k == "bf16_gemv_batch4" || *k == "act_mul_silu")
            );
        }
    }
    backend.free(input);
    drop(lm);
    assert_eq!(host.live_allocations(), 0);

    // A reader that has not registered it (the CLI) names the layout it does not know.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_metrale-pack"))
        .args(["verify", out.to_str().unwrap()])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("toy_bf16"), "{e}");
}

/// What registration refuses: a spec under a built-in tag, a tag that is not lowercase
/// `[a-z0-9_]`, a second spec under a tag taken; a second runtime for a layout (a built-in one
/// among them), a runtime built on a layout with no runtime, an arm needing such a layout.
#[test]
fn registration_refuses_taken_and_malformed_tags() {
    struct Claims(Layout);
    impl LayoutSpec for Claims {
        fn layout(&self) -> Layout {
            self.0
        }
        fn parts(&self, _: Proj, _: DownFormat) -> &'static [&'static str] {
            &[""]
        }
        fn padded_shape(&self, _: Proj, s: [u64; 2]) -> Option<[u64; 2]> {
            Some(s)
        }
        fn part_bytes(&self, _: &str, _: [u64; 2], _: u64) -> Option<u64> {
            None
        }
        fn encode(&self, _: &mut EncodeCx, _: Proj) -> Result<Option<Encoded>> {
            Ok(None)
        }
        fn decode(&self, _: &BlobRead) -> Result<Vec<f32>> {
            Ok(Vec::new())
        }
        fn bind(&self, _: &LayerViews, _: &mut LayerOverlays) {}
    }
    static BUILT_IN: Claims = Claims(Layout::Bf16);
    static BUILT_IN_TAG: Claims = Claims(Layout::custom("bf16"));
    static UPPER: Claims = Claims(Layout::custom("Toy"));
    static TAKEN: Claims = Claims(TOY);
    register();
    for spec in [&BUILT_IN, &BUILT_IN_TAG, &UPPER, &TAKEN] {
        let e = metrale_pack::layout::register(spec)
            .expect_err("refused")
            .to_string();
        assert!(e.starts_with("registering layout"), "{e}");
    }
    // The same spec again is the same layout.
    assert_eq!(metrale_pack::layout::register(&ToyBf16).unwrap(), TOY);
    // The same runtime again does nothing.
    metrale_pack::ffn::register(&TOY_RUNTIME).unwrap();
    const fn runtime(layout: Layout, builds_on: Option<Layout>, arms: &'static [Arm]) -> Runtime {
        Runtime {
            layout,
            builds_on,
            install,
            arms,
            named: &[],
        }
    }
    const ELSEWHERE: Layout = Layout::custom("toy_elsewhere");
    static BF16_AGAIN: Runtime = runtime(Layout::Bf16, None, &[]);
    static TOY_AGAIN: Runtime = runtime(TOY, None, &[]);
    static ON_NOTHING: Runtime = runtime(Layout::custom("toy_two"), Some(ELSEWHERE), &[]);
    static ARM_ELSEWHERE: Runtime = runtime(
        Layout::custom("toy_three"),
        None,
        &[Arm::new(Method::Decode, "mine", ELSEWHERE, always, run)],
    );
    for (rt, why) in [
        (&BF16_AGAIN, "another runtime serves that layout"),
        (&TOY_AGAIN, "another runtime serves that layout"),
        (&ON_NOTHING, "builds on toy_elsewhere"),
        (&ARM_ELSEWHERE, "needs layout toy_elsewhere"),
    ] {
        let e = metrale_pack::ffn::register(rt)
            .expect_err("refused")
            .to_string();
        assert!(
            e.starts_with("registering the runtime of layout") && e.contains(why),
            "{e}"
        );
    }
}
