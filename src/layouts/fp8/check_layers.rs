//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm, tensor_core_rows};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 9] = [
    arm(
        "fp8 fused",
        |b, l, w| install_fp8(b, l, w, true),
        &[],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        "fp8",
        |b, l, w| install_fp8(b, l, w, false),
        &[],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        // The f32 FFMA GEMV (f32 activations) for m <= 4, fused gate+up: the default for 2..4
        // rows before 2026-12-02 (session 17).
        "fp8 ffma gemv",
        |b, l, w| install_fp8(b, l, w, true),
        &[("METRALE_FP8_GEMV_MMA", "0")],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        // The tensor-core GEMV (bf16 activations) from one row to its 8, fused gate+up.
        "fp8 mma gemv",
        |b, l, w| install_fp8(b, l, w, true),
        &[
            ("METRALE_FP8_GEMV_MMA_MIN_ROWS", "1"),
            ("METRALE_FP8_W8A8_MIN_ROWS", "9"),
        ],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        // The w8a16 contract (bf16 activations) at every m: the FP8 W8A8 prefill off.
        "fp8 w8a16",
        |b, l, w| install_fp8(b, l, w, false),
        &[("METRALE_FP8_W8A8", "0")],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        // W8A8 (per-group FP8 activations) from 33 rows, the default before 2026-12-02: 5..32
        // rows on the w8a16 GEMMs.
        "fp8 w8a8 from 33 rows",
        |b, l, w| install_fp8(b, l, w, true),
        &[("METRALE_FP8_W8A8_MIN_ROWS", "33")],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        "fp8 m16_tc",
        |b, l, w| install_fp8(b, l, w, false),
        &[
            ("METRALE_FFN_M16_TC", "1"),
            ("METRALE_FP8_W8A8_MIN_ROWS", "33"),
        ],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        "fp8 batch16",
        |b, l, w| install_fp8(b, l, w, false),
        &[
            ("METRALE_FFN_BATCH16", "1"),
            ("METRALE_FP8_W8A8_MIN_ROWS", "33"),
        ],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        "fp8 gelu",
        |b, l, w| install_fp8(b, l, w, false),
        &[],
        Activation::Gelu,
    )
    .with(RULES),
];

/// The W8A8 prefill (FP8 activations per 128-column group: a last-bit difference can move an
/// FP8 code, 2e-2) from its lever's rows; bf16-rounded activations (1e-3) from the
/// tensor-core rows and on the tensor-core GEMVs' rows; f32 activations (1e-4) below.
const RULES: ArmRules = ArmRules {
    tol: |_, m, l| {
        if l.fp8_w8a8 && m >= l.fp8_w8a8_min_rows {
            2e-2
        } else if m > tensor_core_rows(l)
            || (l.fp8_gemv_mma && (l.fp8_gemv_mma_min_rows..=8).contains(&m))
        {
            1e-3
        } else {
            1e-4
        }
    },
    ..ArmRules::PLAIN
};
