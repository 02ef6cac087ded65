//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm, plain_methods};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 5] = [
    arm("nvfp4", install_nvfp4, &[], Activation::Silu).with(RULES),
    arm("nvfp4 gelu", install_nvfp4, &[], Activation::Gelu).with(RULES),
    arm(
        "nvfp4 ksplit down",
        install_nvfp4,
        &[("METRALE_W4A16_GEMV_KSPLIT_MIN_K", "1")],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        "nvfp4 silu fused",
        install_nvfp4,
        &[
            ("METRALE_FFN_SILU_FUSED_DOWN", "1"),
            ("METRALE_DECODE_FFN_VIA_GEMM", "0"),
        ],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        "nvfp4 w4a4",
        install_nvfp4,
        &[
            ("METRALE_SINGLE_ROW_W4A4", "1"),
            ("METRALE_SMALL_BATCH_W4A4", "1"),
        ],
        Activation::Silu,
    )
    .with(W4A4),
];

/// The NVFP4 decode GEMVs: every row count also through `forward_km` up to 16 rows.
fn methods(m: usize) -> &'static [&'static str] {
    match m {
        1 => &["forward", "prefill", "km"],
        4..=16 => &["prefill", "km"],
        _ => plain_methods(m),
    }
}

/// The NVFP4 arms (and those built on its base): the decode GEMVs round activations to bf16
/// too, so 1e-3 at every row count.
pub(crate) const RULES: ArmRules = ArmRules {
    methods,
    tol: |_, _, _| 1e-3,
    fixed_rows: None,
};

/// W4A4: NVFP4 activations (a last-bit difference can move one E2M1 code: 2e-2) on the fixed
/// path, checked for batch invariance on 33 rows; the prefill as [`RULES`].
const W4A4: ArmRules = ArmRules {
    methods: |m| match m {
        4..=16 => &["prefill", "fixed", "km"],
        17.. => &["fixed"],
        _ => methods(m),
    },
    tol: |method, _, _| if method == "prefill" { 1e-3 } else { 2e-2 },
    fixed_rows: Some(33),
};
