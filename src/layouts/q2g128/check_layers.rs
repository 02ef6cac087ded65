//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm, plain_tol};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 2] = [
    arm("q2", install_q2, &[], Activation::Silu).with(BF16_PREFILL),
    arm(
        "q2 mmq",
        install_q2,
        &[("METRALE_Q2G128_MMQ", "1")],
        Activation::Silu,
    )
    .with(MMQ_PREFILL),
];

/// Its prefill through the BF16 GEMM: weights and activations rounded to BF16 (1e-3); its
/// GEMVs keep f32 activations.
const BF16_PREFILL: ArmRules = ArmRules {
    tol: |method, m, l| {
        if method == "prefill" {
            1e-3
        } else {
            plain_tol(method, m, l)
        }
    },
    ..ArmRules::PLAIN
};

/// Its prefill through the MMQ GEMM: q8_1 activations, a last-bit difference can move one code
/// (5e-3).
const MMQ_PREFILL: ArmRules = ArmRules {
    tol: |method, m, l| {
        if method == "prefill" {
            5e-3
        } else {
            plain_tol(method, m, l)
        }
    },
    ..ArmRules::PLAIN
};
