//! What the host tests (`host.rs`, `users.rs`) share: a device name and port of their own,
//! and the datagrams they steer.

#![allow(dead_code, unreachable_pub)]

use std::hash::BuildHasher;
use std::time::Instant;

use softrdma_udp::RecvBatch;
use softrdma_udp::host::Member;

pub fn random() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(Instant::now())
}

/// A device name (`prefix` with this process and a random number) and port of the test's
/// own. The port is below the kernel's ephemeral range (32768 up), where the tests' senders
/// and coordinators' probe sockets bind: one of those on the port made a member's bind fail
/// (`EADDRINUSE`).
pub fn group(prefix: &str) -> (String, u16) {
    let r = random();
    (format!("{prefix}{}-{}", std::process::id(), r % 1_000_000), 20_000 + (r >> 20) as u16 % 12_000)
}

/// An RC SEND to `qpn` whose last 8 bytes are `tag`.
pub fn data_packet(qpn: u32, tag: u64) -> Vec<u8> {
    let mut p = vec![0u8; 12];
    p[0] = 0x04;
    p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    p.extend_from_slice(&tag.to_be_bytes());
    p
}

/// What a member child does with each datagram of `batch`: a probe goes to `member`; any
/// other is reported through `out`, as `rx TAG` (its last 8 bytes) or `short`.
pub fn report(member: &Member, batch: &RecvBatch, out: impl Fn(String)) {
    for d in batch.iter() {
        if Member::is_probe(d.payload) {
            member.answer_probe(d.payload);
        } else if d.payload.len() >= 20 {
            let tag = u64::from_be_bytes(d.payload[d.payload.len() - 8..].try_into().unwrap());
            out(format!("rx {tag}"));
        } else {
            out("short".into());
        }
    }
}
