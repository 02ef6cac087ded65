//! Fuzz target `convert`: see `metrale_pack::fuzzing::convert_bytes` for what it asserts.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| metrale_pack::fuzzing::convert_bytes(data));
