//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 1] = [arm(
    // The same seeded adapter on both backends.
    "nvfp4 lora",
    |b, l, w| {
        install_nvfp4(b, l, w)?;
        LoraAdapter::random(&mut Rand(77), w.hidden, w.inter, 16).install(b, l)
    },
    &[],
    Activation::Silu,
)
.with(crate::layouts::nvfp4::check_layers::RULES)];
