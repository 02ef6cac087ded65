//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 2] = [
    arm("nvfp4 t", install_nvfp4_t, &[], Activation::Silu)
        .with(crate::layouts::nvfp4::check_layers::RULES),
    arm(
        "nvfp4 t k64",
        install_nvfp4_t,
        &[("METRALE_W4A16_K64_MIN_K", "64")],
        Activation::Silu,
    )
    .with(crate::layouts::nvfp4::check_layers::RULES),
];
