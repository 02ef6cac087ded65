//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms: the mix of `install_ggml`, SiLU and GELU.
pub(crate) static ARMS: [LayerArm; 2] = [
    arm("ggml", install_ggml, &[], Activation::Silu),
    arm("ggml gelu", install_ggml, &[], Activation::Gelu),
];
