//! Its arms of `gpu-check`'s layer section (`check::layers::LAYER_ARMS`, in the list's order):
//! each an installation, levers and an activation, run on CUDA against the same layer on the
//! host backend.

use crate::check::layers::{LayerArm, arm};
use crate::model::Activation;
use crate::testing::*;

/// Its layer-check arms.
pub(crate) static ARMS: [LayerArm; 5] = [
    arm("nvfp4", install_nvfp4, &[], Activation::Silu),
    arm("nvfp4 gelu", install_nvfp4, &[], Activation::Gelu),
    arm(
        "nvfp4 ksplit down",
        install_nvfp4,
        &[("METRALE_W4A16_GEMV_KSPLIT_MIN_K", "1")],
        Activation::Silu,
    ),
    arm(
        "nvfp4 silu fused",
        install_nvfp4,
        &[
            ("METRALE_FFN_SILU_FUSED_DOWN", "1"),
            ("METRALE_DECODE_FFN_VIA_GEMM", "0"),
        ],
        Activation::Silu,
    ),
    arm(
        "nvfp4 w4a4",
        install_nvfp4,
        &[
            ("METRALE_SINGLE_ROW_W4A4", "1"),
            ("METRALE_SMALL_BATCH_W4A4", "1"),
        ],
        Activation::Silu,
    ),
];
