//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 5] = [
    arm(
        "nvfp4 q4k mmq",
        |b, l, w| install_nvfp4_q4k(b, l, w, false),
        &[("METRALE_Q4K_MMQ", "1")],
        Activation::Silu,
    ),
    arm(
        "nvfp4 q4k mmq mma.sync",
        |b, l, w| install_nvfp4_q4k(b, l, w, false),
        &[("METRALE_Q4K_MMQ", "1"), ("METRALE_DQ_WGMMA", "0")],
        Activation::Silu,
    ),
    arm(
        "nvfp4 q4k mmq q4k-down",
        |b, l, w| install_nvfp4_q4k(b, l, w, true),
        &[("METRALE_Q4K_MMQ", "1")],
        Activation::Silu,
    ),
    arm(
        // q4k_mmq alone: the decode GEMVs over its bytes, the MMQ prefill.
        "q4k",
        |b, l, w| install_q4k(b, l, w, false),
        &[],
        Activation::Silu,
    ),
    arm(
        "q4k q4k-down",
        |b, l, w| install_q4k(b, l, w, true),
        &[],
        Activation::Silu,
    ),
];
