//! `cargo fuzz run cm`: see softrdma_fuzzing::cm for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzzing::cm::run(data));
