//! `cargo fuzz run nic`: see softrdma_fuzzing::nic for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzzing::nic::run(data));
