//! `cargo fuzz run roce_packet`: see softrdma_fuzzing::roce_packet for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzzing::roce_packet::run(data));
