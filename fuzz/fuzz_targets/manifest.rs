//! Fuzz target `manifest`: any manifest JSON placed in a real pack (the template
//! `fuzz/seeds/pack/template.gguf`); see `metrale_pack::fuzzing::manifest_json`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static TEMPLATE: OnceLock<Vec<u8>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let t = TEMPLATE.get_or_init(|| {
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/seeds/pack/template.gguf"))
            .expect("fuzz/seeds/pack/template.gguf (scripts/fuzz-seeds.sh)")
    });
    metrale_pack::fuzzing::manifest_json(t, data)
});
