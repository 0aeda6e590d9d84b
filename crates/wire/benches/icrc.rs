//! The ICRC of one packet, as a sender computes it and a receiver checks it: from the
//! envelope each time (`icrc::compute`), and with the envelope's part kept for the flow
//! (`IcrcPrefixCache`, what the runtime and the engine use).
//!
//! `cargo bench -p softrdma-wire --features std --bench icrc`. The covered lengths are those of a 64-byte
//! SEND_ONLY, a 1 KiB one and a 4 KiB WRITE_MIDDLE (BTH through the payload).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group};
use softrdma_wire::Envelope;
use softrdma_wire::icrc::{self, IcrcPrefixCache};

fn icrc(c: &mut Criterion) {
    let envelope = Envelope::rocev2([127, 0, 0, 1].into(), 0xc123, [127, 0, 0, 2].into()).expect("one family");
    let mut g = c.benchmark_group("icrc");
    for (name, covered) in [("64B SEND", 12 + 64), ("1KiB SEND", 12 + 1024), ("4KiB WRITE_MIDDLE", 12 + 4096)] {
        let packet: Vec<u8> = (0..covered).map(|i| (i * 7 + 1) as u8).collect();
        g.throughput(Throughput::Bytes(covered as u64));
        g.bench_function(format!("{name}, from the envelope"), |b| {
            b.iter(|| icrc::compute(black_box(&envelope), black_box(&packet)))
        });
        let mut prefixes = IcrcPrefixCache::default();
        g.bench_function(format!("{name}, envelope's part cached"), |b| {
            b.iter(|| prefixes.compute(black_box(&envelope), black_box(&packet)))
        });
    }
    g.finish();
}

criterion_group!(benches, icrc);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
