//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm, plain_methods};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 4] = [
    arm(
        "w8a8",
        install_w8a8,
        &[("METRALE_W8A8_MAX_ROWS", "4096")],
        Activation::Silu,
    )
    .with(WGMMA),
    arm(
        // A GELU layer: the act-mul and the fused FP8 quantizer with the tanh GELU.
        "w8a8 gelu",
        install_w8a8,
        &[("METRALE_W8A8_MAX_ROWS", "4096")],
        Activation::Gelu,
    )
    .with(WGMMA),
    arm(
        // The portable GEMM (what a device without sm_90a runs).
        "w8a8 portable",
        install_w8a8,
        &[
            ("METRALE_W8A8_MAX_ROWS", "4096"),
            ("METRALE_W8A8_WGMMA", "0"),
        ],
        Activation::Silu,
    )
    .with(PORTABLE),
    arm(
        // m <= 16 through w8a8_gemv; the fixed-path row below checks its bits against the
        // GEMM's (one row alone against 130 rows).
        "w8a8 decode gemv",
        install_w8a8,
        &[
            ("METRALE_W8A8_MAX_ROWS", "4096"),
            ("METRALE_W8A8_DECODE_GEMV", "1"),
            ("METRALE_W8A8_WGMMA", "0"),
        ],
        Activation::Silu,
    )
    .with(PORTABLE),
];

/// The W8A8 arm: FP8 activations on the fixed path from 4 rows, its batch invariance checked on
/// 130 rows (two m tiles of the wgmma GEMM); FP8 activations can move by one step on a
/// last-bit difference (5e-3).
const PORTABLE: ArmRules = ArmRules {
    methods: |m| match m {
        4.. => &["prefill", "fixed"],
        _ => plain_methods(m),
    },
    tol: |_, _, _| 5e-3,
    fixed_rows: Some(130),
};

/// The wgmma GEMMs sum each 128-k stage on Hopper's FP8 accumulator (about 1e-4 from the f64
/// twin, their kernel rows); that moves some FP8 codes of the down projection's quantized
/// input by one step (2^-3): 2e-2, as for the NVFP4 activations.
const WGMMA: ArmRules = ArmRules {
    tol: |_, _, _| 2e-2,
    ..PORTABLE
};
