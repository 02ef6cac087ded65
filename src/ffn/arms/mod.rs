//! The kernels' launches by arm family: each built-in layout's in its folder
//! (`src/layouts/TAG/arms.rs`; the W8A8 arms beside FP8's, `nvfp4_t`'s and `nvfp4_mmq`'s beside
//! NVFP4's), and the dequantizing wgmma prefill the NVFP4 MMQ and Q4_K arms share here.

#[path = "../../layouts/affine/arms.rs"]
mod affine;
#[path = "../../layouts/bf16/arms.rs"]
mod bf16;
mod dq_wgmma;
#[path = "../../layouts/fp8/arms.rs"]
pub(crate) mod fp8;
#[path = "../../layouts/lora/arms.rs"]
mod lora;
#[path = "../../layouts/nvfp4/arms.rs"]
pub(crate) mod nvfp4;
#[path = "../../layouts/q2g128/arms.rs"]
mod q2;
#[path = "../../layouts/q4k_mmq/arms.rs"]
mod q4k;
