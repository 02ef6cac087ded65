//! The kernels' launches by arm family are in each built-in layout's folder
//! (`src/layouts/TAG/arms.rs`: inherent methods of `DenseFfnLayer`; the W8A8 arms beside FP8's,
//! those of the layouts built on NVFP4 beside its); here the dequantizing wgmma prefill the
//! NVFP4 MMQ and Q4_K arms share.

mod dq_wgmma;
