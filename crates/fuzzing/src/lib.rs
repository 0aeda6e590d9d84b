//! softrdma's fuzz targets, as plain functions of one input that panic when an oracle
//! does not hold.
//!
//! Two drivers run them: `cargo fuzz` (the `fuzz/` directory, nightly and libFuzzer), which
//! searches for inputs that break them, and `cargo test` on stable (`tests/corpus.rs`),
//! which replays every input checked in under `fuzz/corpus/<target>/`, so that what a
//! fuzzer once found stays fixed. See `fuzz/README.md`.
//!
//! | target | what it feeds |
//! |---|---|
//! | [`roce_packet`] | one RoCEv2 UDP payload to the codec |
//! | [`ip_datagram`] | one IP packet, Ethernet frame or GRH area to the codec |
//! | [`mad`] | one MAD or CM data area to the codec |
//! | [`engine_ingress`] | datagrams to an engine with live RC, UC and UD QPs |
//! | [`cm`] | a network and two applications around two connection managers |
//! | [`nic`] | a network, an attacker and two applications around two whole NICs with a live connection |

pub mod cm;
pub mod engine_ingress;
mod flight;
pub mod ip_datagram;
pub mod mad;
pub mod nic;
pub mod roce_packet;

/// A target: runs one input, panics when an oracle does not hold.
pub type Target = fn(&[u8]);

/// Every target, by the name `cargo fuzz` and the corpus directory use.
pub const TARGETS: &[(&str, Target)] = &[
    ("roce_packet", roce_packet::run),
    ("ip_datagram", ip_datagram::run),
    ("mad", mad::run),
    ("engine_ingress", engine_ingress::run),
    ("cm", cm::run),
    ("nic", nic::run),
];
