//! The kernels' launches by arm family are in each built-in layout's folder
//! (`src/layouts/TAG/arms.rs`: inherent methods of `DenseFfnLayer`; the W8A8 arms beside FP8's,
//! `nvfp4_t`'s and `nvfp4_mmq`'s beside NVFP4's); here the dequantizing wgmma prefill the NVFP4
//! MMQ and Q4_K arms share.

mod dq_wgmma;
