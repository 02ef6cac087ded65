//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 2] = [
    arm("nvfp4 mmq", install_nvfp4_mmq, &[], Activation::Silu)
        .with(crate::layouts::nvfp4::check_layers::RULES),
    arm(
        // The portable MMQ GEMM (what a device without sm_90a runs).
        "nvfp4 mmq mma.sync",
        install_nvfp4_mmq,
        &[("METRALE_DQ_WGMMA", "0")],
        Activation::Silu,
    )
    .with(crate::layouts::nvfp4::check_layers::RULES),
];
