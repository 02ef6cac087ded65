//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm, plain_tol};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 5] = [
    arm(
        "nvfp4 q4k mmq",
        |b, l, w| install_nvfp4_q4k(b, l, w, false),
        &[("METRALE_Q4K_MMQ", "1")],
        Activation::Silu,
    )
    .with(WITH_NVFP4),
    arm(
        "nvfp4 q4k mmq mma.sync",
        |b, l, w| install_nvfp4_q4k(b, l, w, false),
        &[("METRALE_Q4K_MMQ", "1"), ("METRALE_DQ_WGMMA", "0")],
        Activation::Silu,
    )
    .with(WITH_NVFP4),
    arm(
        "nvfp4 q4k mmq q4k-down",
        |b, l, w| install_nvfp4_q4k(b, l, w, true),
        &[("METRALE_Q4K_MMQ", "1")],
        Activation::Silu,
    )
    .with(WITH_NVFP4),
    arm(
        // q4k_mmq alone: the decode GEMVs over its bytes, the MMQ prefill.
        "q4k",
        |b, l, w| install_q4k(b, l, w, false),
        &[],
        Activation::Silu,
    )
    .with(ALONE),
    arm(
        "q4k q4k-down",
        |b, l, w| install_q4k(b, l, w, true),
        &[],
        Activation::Silu,
    )
    .with(ALONE),
];

/// Its MMQ prefill quantizes activations to q8_1: a last-bit difference can move one code.
const PREFILL_TOL: f64 = 5e-3;

/// Beside the NVFP4 base: its decode through the NVFP4 GEMVs, its prefill through the MMQ.
const WITH_NVFP4: ArmRules = ArmRules {
    tol: |method, m, l| {
        if method == "prefill" {
            PREFILL_TOL
        } else {
            (crate::layouts::nvfp4::check_layers::RULES.tol)(method, m, l)
        }
    },
    ..crate::layouts::nvfp4::check_layers::RULES
};

/// Alone: its own decode GEMVs, then the MMQ prefill.
const ALONE: ArmRules = ArmRules {
    tol: |method, m, l| {
        if method == "prefill" {
            PREFILL_TOL
        } else {
            plain_tol(method, m, l)
        }
    },
    ..ArmRules::PLAIN
};
