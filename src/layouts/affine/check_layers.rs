//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{ArmRules, LayerArm, arm, int8_activation_rules};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 5] = [
    arm(
        // 8-bit codes (a Q8_0 or float source).
        "affine q8",
        |b, l, w| install_affine(b, l, w, AffineKind::Q8_0),
        &[],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        // 4-bit codes with offsets (a Q4_1 source), GELU.
        "affine q4 gelu",
        |b, l, w| install_affine(b, l, w, AffineKind::Q4_1),
        &[],
        Activation::Gelu,
    )
    .with(RULES),
    arm(
        // 4-bit codes in groups of 128 with zero points and half scales (an AWQ or
        // compressed-tensors int4 source).
        "affine int4 g128",
        |b, l, w| install_affine(b, l, w, AffineKind::Int4G128),
        &[],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        // 8-bit codes, one group a row, f32 scale and zero point (compressed-tensors int8 per
        // channel in f32).
        "affine int8 channel",
        |b, l, w| install_affine(b, l, w, AffineKind::Int8Channel),
        &[],
        Activation::Silu,
    )
    .with(RULES),
    arm(
        // 4-bit groups of 128 with act-order (GPTQ desc_act): columns sorted by group, the
        // activations gathered, the prefill's BF16 weights scattered back.
        "affine int4 g128 act-order",
        |b, l, w| install_affine(b, l, w, AffineKind::Int4G128Perm),
        &[],
        Activation::Silu,
    )
    .with(RULES),
];

/// Its GEMVs take int8 activations, up to `AFFINE_GEMV_MAX_ROWS` rows.
const RULES: ArmRules = int8_activation_rules::<{ crate::gpu::sizes::AFFINE_GEMV_MAX_ROWS }>();
