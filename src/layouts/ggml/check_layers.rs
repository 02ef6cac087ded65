//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm, int8_activation_rules};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms: the mix of `install_ggml`, SiLU and GELU.
pub(crate) static ARMS: [LayerArm; 2] = [
    arm("ggml", install_ggml, &[], Activation::Silu).with(RULES),
    arm("ggml gelu", install_ggml, &[], Activation::Gelu).with(RULES),
];

/// Its GEMV (up to `GGML_PREFILL_MIN_ROWS - 1` rows) takes q8_1 activations, the down
/// projection's made from the gated product, whose `tanhf`/`expf` may differ from the host's
/// in the last bit: that moves one int8 code (the H100 run of 2026-12-05 measured 1.06e-4 on
/// one GELU row of the llama-8B shape, every other row bit for bit).
const RULES: ArmRules = int8_activation_rules::<{ crate::gpu::sizes::GGML_PREFILL_MIN_ROWS - 1 }>();
