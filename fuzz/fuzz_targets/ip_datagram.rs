//! `cargo fuzz run ip_datagram`: see softrdma_fuzzing::ip_datagram for what it feeds and checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzzing::ip_datagram::run(data));
