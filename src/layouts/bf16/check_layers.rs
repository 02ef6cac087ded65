//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 1] =
    [arm("bf16", install_bf16, &[], Activation::Silu).with(RULES)];

/// BF16 activations at every row count: 1e-3.
const RULES: ArmRules = ArmRules {
    tol: |_, _, _| 1e-3,
    ..ArmRules::PLAIN
};
