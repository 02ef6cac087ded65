//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 3] = [
    arm(
        "w8a8",
        install_w8a8,
        &[("METRALE_W8A8_MAX_ROWS", "4096")],
        Activation::Silu,
    ),
    arm(
        // The portable GEMM (what a device without sm_90a runs).
        "w8a8 portable",
        install_w8a8,
        &[
            ("METRALE_W8A8_MAX_ROWS", "4096"),
            ("METRALE_W8A8_WGMMA", "0"),
        ],
        Activation::Silu,
    ),
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
    ),
];
