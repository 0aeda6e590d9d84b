//! `cargo fuzz run mad`: see softrdma_fuzzing::mad for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzzing::mad::run(data));
