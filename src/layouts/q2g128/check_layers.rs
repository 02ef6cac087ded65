//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 2] = [
    arm("q2", install_q2, &[], Activation::Silu),
    arm(
        "q2 mmq",
        install_q2,
        &[("METRALE_Q2G128_MMQ", "1")],
        Activation::Silu,
    ),
];
