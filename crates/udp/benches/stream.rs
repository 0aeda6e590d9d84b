//! What a stream of 64 KiB RDMA WRITEs costs the kernel alone, in the shape the runtime
//! sends it, against the UDP GSO+GRO stream `softrdma perf baseline` compares it with:
//! the part of softrdma's wire bandwidth that belongs to the sockets.
//!
//! `cargo bench -p softrdma-udp --bench stream` (two threads on 127.0.0.1, each spinning
//! on its own socket, the receiver with `UDP_GRO`; each variant runs 2 s, three times in
//! turn, and its best run counts, as `perf baseline`'s limits do). The variants:
//!
//! - *GSO+GRO*: GSO sends of 15 segments of 4136 bytes, as `perf baseline` sends, and a
//!   receiver that only counts.
//! - *a WRITE's shape*: each 64 KiB message as the runtime sends one with a path MTU of
//!   4096: the first packet (BTH, RETH, 4096 bytes, ICRC: 4128 bytes) and the second in
//!   one GSO send, the other fourteen (4112 bytes each) in another, both in one `sendmmsg`
//!   (a GSO send's segments must all be as long as its first, only the last may be
//!   shorter, and no GSO send may hold 64 KiB of payload and headers); the receiver
//!   answers every message with a 20-byte ACK, and the sender keeps at most 32 messages
//!   (the runtime's window of 512 packets) unacknowledged, reading the ACKs between sends.
//!
//! - *the same, gathered*: each packet's header and ICRC from one buffer and its data from
//!   another, as the runtime sends data from the application's memory: two `iovec`s a
//!   packet (a packet's ICRC and the next one's header lie together) where the first
//!   variant has one a GSO send.
//! - *the same, with the ICRCs and the copy into the region*: and each side computes every
//!   packet's ICRC over its bytes (`softrdma_wire::icrc::IcrcPrefixCache`, as the runtime
//!   does; with identification 0 for every segment, which costs what the right one does),
//!   and the receiver copies each packet's data into a 64 KiB region, as a responder
//!   places a WRITE: the passes over the data that RoCE over a socket adds to the
//!   kernel's copies.
//!
//! Payload goodput is counted for all: the 4096 bytes of data a packet carries (64 KiB a
//! message), and, for GSO+GRO, every byte of its segments (what the baseline counts).
//! Beyond that neither side touches the data or parses a header: what is left is the
//! kernel's part and the loop around it.

#![allow(clippy::print_stdout)]

use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softrdma_udp::{Config, Outgoing, Payload, RecvBatch, RoceSocket};
use softrdma_wire::icrc::{ICRC_LEN, IcrcPrefixCache};

const RUN: Duration = Duration::from_secs(2);
const RUNS: usize = 3;

/// `perf baseline`'s segment: an MTU-4096 RoCE packet with a RETH.
const BASELINE_SEGMENT: usize = 4096 + 40;
/// A WRITE_FIRST of 4096 bytes: BTH, RETH, data, ICRC.
const FIRST: usize = 12 + 16 + 4096 + 4;
/// A WRITE_MIDDLE or WRITE_LAST of 4096 bytes: BTH, data, ICRC.
const MIDDLE: usize = 12 + 4096 + 4;
/// Packets of a 64 KiB message.
const PACKETS: usize = 16;
/// BTH, AETH, ICRC.
const ACK: usize = 20;
/// Messages a sender may have unacknowledged: 512 packets.
const WINDOW: usize = 32;

/// Two sockets on 127.0.0.1: the sender's and the receiver's (with GRO, a big buffer).
fn pair() -> (RoceSocket, RoceSocket) {
    let base = Config { port: 0, ..Config::default() };
    let sender = RoceSocket::bind_with(Ipv4Addr::LOCALHOST.into(), &base).expect("bind the sender");
    let receiver = RoceSocket::bind_with(
        Ipv4Addr::LOCALHOST.into(),
        &Config { gro: true, recv_buffer_size: Some(8 << 20), ..base },
    )
    .expect("bind the receiver");
    (sender, receiver)
}

/// Runs `send` in this thread and `receive` in another until `RUN` has passed; returns
/// the receiver's count of bytes over the receiver's time from its first datagram, GB/s.
fn run(
    send: impl FnOnce(&RoceSocket, SocketAddr, &AtomicBool),
    receive: impl FnOnce(&RoceSocket, &AtomicBool) -> (u64, Duration) + Send + 'static,
) -> f64 {
    let (sender, receiver) = pair();
    let to = receiver.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let rx_stop = Arc::clone(&stop);
    let rx = std::thread::spawn(move || receive(&receiver, &rx_stop));
    let start = Instant::now();
    let timer_stop = Arc::clone(&stop);
    let timer = std::thread::spawn(move || {
        std::thread::sleep(RUN);
        timer_stop.store(true, Ordering::Relaxed);
    });
    send(&sender, to, &stop);
    stop.store(true, Ordering::Relaxed);
    timer.join().expect("timer");
    let (bytes, time) = rx.join().expect("receiver");
    assert!(start.elapsed() < RUN * 3, "a variant ran past its time");
    bytes as f64 / time.as_secs_f64().max(1e-9) / 1e9
}

/// `perf baseline`'s GSO sender and counting receiver.
fn gso_gro() -> f64 {
    run(
        |sock, to, stop| {
            let buf = vec![7u8; BASELINE_SEGMENT * 15];
            let envelope = sock.envelope_to(to).expect("envelope");
            while !stop.load(Ordering::Relaxed) {
                let out = Outgoing { segment_size: Some(BASELINE_SEGMENT as u16), ..Outgoing::new(envelope, &buf) };
                let _ = sock.send_batch(&[out]);
            }
        },
        |sock, stop| {
            let mut batch = RecvBatch::new(32, 65536);
            let (mut bytes, mut first) = (0u64, None);
            while !stop.load(Ordering::Relaxed) {
                if matches!(sock.recv(&mut batch), Ok(n) if n > 0) {
                    first.get_or_insert_with(Instant::now);
                    bytes += batch.bytes() as u64;
                }
            }
            (bytes, first.map_or(Duration::ZERO, |f| f.elapsed()))
        },
    )
}

/// How a sender lays out a message's packets.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// Each GSO send from one buffer.
    Whole,
    /// Headers and ICRCs from one buffer, the data from another.
    Gathered,
    /// From one buffer, every packet's ICRC computed first.
    WithIcrc,
}

/// The `iovec`s of a message whose packets' headers and ICRCs are in `arena` (64 bytes a
/// packet) and whose data is in `data`: the first GSO send's, then the second's.
fn gathered<'a>(arena: &'a [u8], data: &'a [u8]) -> (Vec<IoSlice<'a>>, Vec<IoSlice<'a>>) {
    let header = |i: usize| if i == 0 { FIRST - 4096 - ICRC_LEN } else { MIDDLE - 4096 - ICRC_LEN };
    let piece = |from: usize, len: usize| IoSlice::new(&arena[from..from + len]);
    let mut sends = [Vec::new(), Vec::new()];
    for (i, chunk) in data.chunks(4096).enumerate() {
        let send = &mut sends[usize::from(i >= 2)];
        if i == 0 || i == 2 {
            send.push(piece(i * 64, header(i)));
        }
        send.push(IoSlice::new(chunk));
        // This packet's ICRC and, within the same GSO send, the next one's header.
        let next = if i == 1 || i + 1 == PACKETS { 0 } else { header(i + 1) };
        send.push(piece(i * 64 + 32, ICRC_LEN + next));
    }
    let [first, second] = sends;
    (first, second)
}

/// 64 KiB WRITEs in the runtime's shape, an ACK per message, a window of 32 messages,
/// laid out as `layout` says; with [`Layout::WithIcrc`] the receiver checks every packet's
/// ICRC too, and copies its data into a region.
fn writes(layout: Layout) -> f64 {
    let icrc = layout == Layout::WithIcrc;
    run(
        move |sock, to, stop| {
            let mut head = vec![7u8; FIRST + MIDDLE];
            let mut rest = vec![7u8; MIDDLE * (PACKETS - 2)];
            let (arena, data) = (vec![9u8; PACKETS * 64], vec![7u8; PACKETS * 4096]);
            let (first, second) = gathered(&arena, &data);
            let envelope = sock.envelope_to(to).expect("envelope");
            let mut prefixes = IcrcPrefixCache::default();
            let mut acks = RecvBatch::new(32, 2048);
            let mut outstanding = 0usize;
            while !stop.load(Ordering::Relaxed) {
                if outstanding < WINDOW {
                    if icrc {
                        let (first, second) = head.split_at_mut(FIRST);
                        for p in [first, second].into_iter().chain(rest.chunks_mut(MIDDLE)) {
                            let (covered, value) = p.split_at_mut(p.len() - ICRC_LEN);
                            value.copy_from_slice(&prefixes.compute(&envelope, covered).to_le_bytes());
                        }
                    }
                    let (one, two) = match layout {
                        Layout::Gathered => (Payload::Parts(&first), Payload::Parts(&second)),
                        Layout::Whole | Layout::WithIcrc => (Payload::Bytes(&head), Payload::Bytes(&rest)),
                    };
                    let send = |payload, segment: usize| Outgoing {
                        envelope,
                        payload,
                        traffic_class: None,
                        segment_size: Some(segment as u16),
                    };
                    if sock.send_batch(&[send(one, FIRST), send(two, MIDDLE)]).is_ok_and(|n| n == 2) {
                        outstanding += 1;
                    }
                }
                if let Ok(n) = sock.recv(&mut acks) {
                    outstanding = outstanding.saturating_sub(n);
                }
            }
        },
        move |sock, stop| {
            let mut batch = RecvBatch::new(32, 65536);
            let ack = [0u8; ACK];
            let mut prefixes = IcrcPrefixCache::default();
            let mut region = vec![0u8; PACKETS * 4096];
            let (mut packets, mut first, mut sum) = (0u64, None, 0u32);
            while !stop.load(Ordering::Relaxed) {
                if matches!(sock.recv(&mut batch), Ok(n) if n > 0) {
                    first.get_or_insert_with(Instant::now);
                    for d in batch.iter() {
                        if icrc {
                            let envelope = d.envelope();
                            sum ^= prefixes.compute(&envelope, &d.payload[..d.payload.len() - ICRC_LEN]);
                            let data = &d.payload[d.payload.len() - ICRC_LEN - 4096..d.payload.len() - ICRC_LEN];
                            let at = (packets as usize % PACKETS) * 4096;
                            region[at..at + 4096].copy_from_slice(data);
                        }
                        packets += 1;
                        if packets % PACKETS as u64 == 0 {
                            let _ = sock.send_to(d.source, &ack);
                        }
                    }
                }
            }
            std::hint::black_box((sum, &region));
            (packets * 4096, first.map_or(Duration::ZERO, |f| f.elapsed()))
        },
    )
}

fn main() {
    println!("a stream over 127.0.0.1 with no engine, best of {RUNS} runs of {} s each:", RUN.as_secs());
    let (mut base, mut shaped, mut spread, mut checked) = (0f64, 0f64, 0f64, 0f64);
    for _ in 0..RUNS {
        base = base.max(gso_gro());
        shaped = shaped.max(writes(Layout::Whole));
        spread = spread.max(writes(Layout::Gathered));
        checked = checked.max(writes(Layout::WithIcrc));
    }
    println!("  UDP GSO+GRO, 15 segments of 4136 B (perf baseline's)    {base:>6.2} GB/s");
    println!(
        "  64 KiB WRITEs in the runtime's shape, an ACK each         {shaped:>6.2} GB/s of data ({:.2} x GSO+GRO)",
        shaped / base
    );
    println!(
        "  the same, gathered: header and ICRC apart from the data     {spread:>6.2} GB/s of data ({:.2} x GSO+GRO)",
        spread / base
    );
    println!(
        "  the same, with the ICRCs and the copy into the region      {checked:>6.2} GB/s of data ({:.2} x GSO+GRO)",
        checked / base
    );
}
