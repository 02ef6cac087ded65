//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm};
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
/// one GELU row of the llama-8B shape, every other row bit for bit): 5e-3, as `affine`'s
/// int8 GEMVs; from `GGML_PREFILL_MIN_ROWS` rows BF16 weights and activations (1e-3).
const RULES: ArmRules = ArmRules {
    tol: |method, m, _| {
        if method != "prefill" || m < crate::gpu::sizes::GGML_PREFILL_MIN_ROWS {
            5e-3
        } else {
            1e-3
        }
    },
    ..ArmRules::PLAIN
};
