//! The routing matrix: which arm of `ffn::arms()` and which kernels (or which refusal) serve
//! every forward method at every row count, for every arm configuration of the layer checks and for layers that hold several
//! layouts at once, on the host backend. `tests/routing.rs` holds it against
//! `tests/fixtures/routing.txt`, so a change to the routing shows as a diff of that file.

use super::layers::{ArmRules, LAYER_ARMS, LayerArm, call_method};
use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext, Method};
use crate::gpu::host::HostBackend;
use crate::gpu::{GpuBackend, GpuError, GpuResult, upload_f32};
use crate::model::Activation;
use crate::testing::*;
use std::fmt::Write;
use std::sync::Arc;

/// Layers holding several layouts: the routing's priority between them.
pub static COMBINED: [LayerArm; 6] = [
    LayerArm {
        name: "every layout",
        install: |b, l, w| {
            install_nvfp4_q4k(b, l, w, false)?;
            install_fp8(b, l, w, true)?;
            install_bf16(b, l, w)?;
            install_w8a8(b, l, w)?;
            install_q2(b, l, w)
        },
        levers: &[("METRALE_Q4K_MMQ", "1")],
        act: Activation::Silu,
        rules: ArmRules::PLAIN,
    },
    LayerArm {
        name: "every layout but w8a8 and q2",
        install: |b, l, w| {
            install_nvfp4_q4k(b, l, w, false)?;
            install_fp8(b, l, w, true)?;
            install_bf16(b, l, w)
        },
        levers: &[("METRALE_Q4K_MMQ", "1")],
        act: Activation::Silu,
        rules: ArmRules::PLAIN,
    },
    LayerArm {
        name: "nvfp4 and bf16",
        install: |b, l, w| {
            install_nvfp4(b, l, w)?;
            install_bf16(b, l, w)
        },
        levers: &[],
        act: Activation::Silu,
        rules: ArmRules::PLAIN,
    },
    LayerArm {
        name: "nvfp4 mmq and w8a8, w8a8 to 16 rows",
        install: |b, l, w| {
            install_nvfp4_mmq(b, l, w)?;
            install_w8a8(b, l, w)
        },
        levers: &[("METRALE_W8A8_MAX_ROWS", "16")],
        act: Activation::Silu,
        rules: ArmRules::PLAIN,
    },
    LayerArm {
        name: "nvfp4, decode through the prefill GEMM",
        install: install_nvfp4,
        levers: &[("METRALE_DECODE_FFN_VIA_GEMM", "1")],
        act: Activation::Silu,
        rules: ArmRules::PLAIN,
    },
    LayerArm {
        name: "w8a8 alone, to 16 rows, a4 declared",
        install: install_w8a8,
        levers: &[
            ("METRALE_W8A8_MAX_ROWS", "16"),
            ("METRALE_ACTIVATION_QUANTIZATION", "a4"),
        ],
        act: Activation::Silu,
        rules: ArmRules::PLAIN,
    },
];

/// The row counts of the matrix.
pub const ROUTING_MS: [usize; 10] = [1, 2, 3, 4, 5, 8, 16, 17, 64, 130];

/// The matrix as text: one line per (arm, method, m): the kernels launched, or the error's
/// kind and message. A layer with no weights at all is the last block.
pub fn routing_matrix() -> GpuResult<String> {
    let (h, i) = (256, 512);
    let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
    let w = DenseWeights::random(&mut Rand(5), h, i);
    let cfg = FfnConfig {
        hidden: h,
        inter: i,
    };
    let mmax = *ROUTING_MS.iter().max().expect("not empty");
    let none = LayerArm {
        name: "no weights",
        install: |_, _, _| Ok(()),
        levers: &[],
        act: Activation::Silu,
        rules: ArmRules::PLAIN,
    };
    let mut out = String::new();
    for a in LAYER_ARMS.iter().chain(&COMBINED).chain([&none]) {
        let mut c = ForwardContext::new(b.clone(), cfg, mmax, a.model_levers())?;
        c.tracing = true;
        let mut l = DenseFfnLayer::new_with_activation(&c, a.act);
        (a.install)(b.as_ref(), &mut l, &w)?;
        for m in ROUTING_MS {
            let x = b.alloc((m * h * 4) as u64)?;
            upload_f32(b.as_ref(), x, &Rand(m as u64).vec(m * h, 1.0))?;
            let first: &[&str] = match m {
                1 => &["forward"],
                2 => &["forward_k2"],
                3 => &["forward_k3"],
                _ => &[],
            };
            for method in first.iter().chain(&["km", "prefill", "fixed"]) {
                let arm = l
                    .serving_arm(&c, method_of(method), m)
                    .map_or("-", |a| a.name);
                c.trace.clear();
                let got = match call_method(&l, &mut c, x, method, m) {
                    Ok(_) => c.trace.join(" "),
                    Err(e) => refusal(&e),
                };
                writeln!(out, "{} | {method} | m={m} | {arm} | {got}", a.name).expect("a string");
            }
            b.free(x);
        }
    }
    Ok(out)
}

/// The arm table's method of a check's method name.
fn method_of(name: &str) -> Method {
    match name {
        "forward" => Method::Decode,
        "forward_k2" | "forward_k3" => Method::Small,
        "km" => Method::Verify,
        "fixed" => Method::Fixed,
        _ => Method::Prefill,
    }
}

fn refusal(e: &GpuError) -> String {
    let kind = match e {
        GpuError::Shape(_) => "Shape",
        GpuError::Order(_) => "Order",
        GpuError::NotServed(_) => "NotServed",
        GpuError::Invalid(_) => "Invalid",
        _ => "other",
    };
    format!("{kind}: {e}")
}
