//! `cargo fuzz run engine_ingress`: see softrdma_fuzzing::engine_ingress for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzzing::engine_ingress::run(data));
