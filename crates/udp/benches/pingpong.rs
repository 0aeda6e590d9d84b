//! What a busy-polled ping-pong costs at each step from a plain UDP socket to the way the
//! runtime uses a [`RoceSocket`], with no engine: the part of softrdma's polled latency
//! that belongs to the socket.
//!
//! `cargo bench -p softrdma-udp --bench pingpong` (two threads on 127.0.0.1, each spinning
//! on its own socket; medians of one-way times, half a round trip). Bounded: 20 000 round
//! trips per variant, and a variant stops after 10 s.

#![allow(clippy::print_stdout)]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use softrdma_udp::{Config, Outgoing, RecvBatch, RoceSocket};

const ROUND_TRIPS: usize = 20_000;
const LIMIT: Duration = Duration::from_secs(10);

/// Two connected ends.
type Pair = (Box<dyn End>, Box<dyn End>);

/// A variant: its name and how to make its two ends.
type Variant = (&'static str, fn() -> Pair);

/// One side of a ping-pong: sends its message, waits for one.
trait End: Send {
    fn send(&mut self);
    /// Polls once; whether the peer's message was there.
    fn poll(&mut self) -> bool;
}

struct Plain {
    sock: UdpSocket,
    peer: SocketAddr,
    buf: [u8; 2048],
}

impl End for Plain {
    fn send(&mut self) {
        self.sock.send_to(&[7u8; 8], self.peer).expect("send_to");
    }
    fn poll(&mut self) -> bool {
        self.sock.recv_from(&mut self.buf).is_ok()
    }
}

/// The runtime's way: one `sendmmsg` of a 44-byte RoCE-sized datagram (or a GSO pair of it
/// and a 20-byte ACK), and a `recvmmsg` of `batch` slots of `slot` bytes.
struct Roce {
    sock: RoceSocket,
    peer: SocketAddr,
    batch: RecvBatch,
    paired: bool,
    payload: Vec<u8>,
}

impl End for Roce {
    fn send(&mut self) {
        let envelope = self.sock.envelope_to(self.peer).expect("envelope");
        let mut out = Outgoing::new(envelope, &self.payload);
        if self.paired {
            out.segment_size = Some(44);
        }
        self.sock.send_batch(&[out]).expect("sendmmsg");
    }
    fn poll(&mut self) -> bool {
        matches!(self.sock.recv(&mut self.batch), Ok(n) if n > 0)
    }
}

fn plain_pair() -> Pair {
    let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    a.set_nonblocking(true).expect("nonblocking");
    b.set_nonblocking(true).expect("nonblocking");
    let (pa, pb) = (a.local_addr().expect("addr"), b.local_addr().expect("addr"));
    (Box::new(Plain { sock: a, peer: pb, buf: [0; 2048] }), Box::new(Plain { sock: b, peer: pa, buf: [0; 2048] }))
}

fn roce_pair(gro: bool, count: usize, paired: bool) -> Pair {
    let config = Config { port: 0, gro, ..Config::default() };
    let a = RoceSocket::bind_with(Ipv4Addr::LOCALHOST.into(), &config).expect("bind");
    let b = RoceSocket::bind_with(Ipv4Addr::LOCALHOST.into(), &config).expect("bind");
    let (pa, pb) = (a.local_addr(), b.local_addr());
    let slot = if gro { 65_536 } else { 4352 };
    let payload = vec![7u8; if paired { 64 } else { 44 }];
    let end = |sock, peer| -> Box<dyn End> {
        Box::new(Roce { sock, peer, batch: RecvBatch::new(count, slot), paired, payload: payload.clone() })
    };
    (end(a, pb), end(b, pa))
}

/// Median one-way time, in microseconds, of `ROUND_TRIPS` round trips.
fn run((mut a, mut b): Pair) -> f64 {
    let echo = std::thread::spawn(move || {
        let start = Instant::now();
        for _ in 0..ROUND_TRIPS {
            while !b.poll() {
                if start.elapsed() > LIMIT {
                    return;
                }
            }
            b.send();
        }
    });
    let start = Instant::now();
    let mut rtts = Vec::with_capacity(ROUND_TRIPS);
    for _ in 0..ROUND_TRIPS {
        let t = Instant::now();
        a.send();
        while !a.poll() {
            assert!(start.elapsed() < LIMIT, "the echo thread stopped answering");
        }
        rtts.push(t.elapsed());
    }
    echo.join().expect("echo thread");
    rtts.sort_unstable();
    rtts[rtts.len() / 2].as_secs_f64() * 1e6 / 2.0
}

fn main() {
    let variants: [Variant; 5] = [
        ("plain UdpSocket send_to/recv_from", plain_pair),
        ("RoceSocket, recvmmsg of 1 slot", || roce_pair(false, 1, false)),
        ("RoceSocket, recvmmsg of 32 slots", || roce_pair(false, 32, false)),
        ("RoceSocket, UDP_GRO, 32 slots of 64 KiB", || roce_pair(true, 32, false)),
        ("the same, request and ACK as one GSO send", || roce_pair(true, 32, true)),
    ];
    println!("busy-polled ping-pong over 127.0.0.1, {ROUND_TRIPS} round trips, median one way:");
    for (name, pair) in variants {
        println!("  {name:<45} {:>6.2} us", run(pair()));
    }
}
