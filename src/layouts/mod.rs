//! Every built-in layout, one folder each (docs/contributing.md, "A built-in layout is one
//! folder"). The folders' files are mounted into the layers they implement by each layer's
//! registry; this module only declares them.

pub mod affine;
pub mod bf16;
pub mod fp8;
pub mod lora;
pub mod nvfp4;
pub mod nvfp4_mmq;
pub mod nvfp4_t;
pub mod q2g128;
pub mod q4k_mmq;
pub mod w8a8;
