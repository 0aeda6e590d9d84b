//! What steering costs: busy-polled UDP ping-pong over 127.0.0.1, one-way latency (half the
//! round trip), (a) between two plain sockets, (b) to a member of a 4-member reuseport group
//! with the steering program installed, (c) through a relay thread that forwards over a
//! Unix datagram socket, the per-host forwarding daemon that was rejected.
//!
//! `cargo test --release -p softrdma-udp --test host_latency -- --ignored --nocapture`
#![allow(clippy::print_stdout)]

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softrdma_udp::host::{HostConfig, Member};
use softrdma_udp::{Config, RecvBatch, RoceSocket};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const ROUNDS: usize = 20_000;
const WARMUP: usize = 1_000;

fn plain() -> RoceSocket {
    RoceSocket::bind_with(LOCALHOST, &Config { port: 0, ..Config::default() }).unwrap()
}

/// Busy-polls `socket` until one datagram arrives (yielding, as 2 cores hold 3 spinners in
/// case (c)); returns its source.
fn spin_recv(socket: &RoceSocket, batch: &mut RecvBatch, stop: &AtomicBool) -> Option<SocketAddr> {
    loop {
        if let Ok(n) = socket.recv(batch) {
            if n > 0 {
                return batch.iter().next().map(|d| d.source);
            }
        }
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        std::thread::yield_now();
    }
}

/// An echo server on `socket`: sends every datagram back to its source.
fn echo<T: Send + Sync + 'static>(
    owner: Arc<T>,
    get: fn(&T) -> &RoceSocket,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let socket = get(&owner);
        let mut batch = RecvBatch::new(1, 2048);
        while let Some(src) = spin_recv(socket, &mut batch, &stop) {
            let payload = batch.iter().next().unwrap().payload.to_vec();
            let _ = socket.send_to(src, &payload);
        }
    })
}

/// Pings `dst` from `socket` ROUNDS times with a BTH to `qpn`; returns one-way latencies.
fn ping(socket: &RoceSocket, dst: SocketAddr, qpn: u32) -> Vec<Duration> {
    let stop = AtomicBool::new(false);
    let mut packet = [0u8; 64];
    packet[0] = 0x04;
    packet[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    let mut batch = RecvBatch::new(1, 2048);
    let mut out = Vec::with_capacity(ROUNDS);
    for i in 0..WARMUP + ROUNDS {
        let t = Instant::now();
        socket.send_to(dst, &packet).unwrap();
        // A lost reply would hang: the first one must come within a second.
        if i == 0 {
            assert!(socket.wait_readable(Some(Duration::from_secs(1))).unwrap(), "no echo");
        }
        spin_recv(socket, &mut batch, &stop);
        if i >= WARMUP {
            out.push(t.elapsed() / 2);
        }
    }
    out
}

fn report(name: &str, mut v: Vec<Duration>) -> Duration {
    v.sort();
    let q = |f: f64| v[((v.len() - 1) as f64 * f) as usize].as_secs_f64() * 1e6;
    println!("{name:<44} one-way us: min {:.2}  median {:.2}  p99 {:.2}", q(0.0), q(0.5), q(0.99));
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn steering_latency() {
    let stop = Arc::new(AtomicBool::new(false));
    // (a) plain.
    let server = Arc::new(plain());
    let client = plain();
    let h = echo(server.clone(), |s| s, stop.clone());
    let a = report("(a) plain socket", ping(&client, server.local_addr(), 0x2000));
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();

    // (b) member of a 4-member group, program installed.
    stop.store(false, Ordering::Relaxed);
    let r = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    let config = HostConfig {
        device: format!("bench{}", std::process::id()),
        port: 20_000 + (r % 40_000) as u16,
        socket: Config::default(),
    };
    let members: Arc<Vec<Member>> = Arc::new((0..4).map(|_| Member::join(&[LOCALHOST], &config).unwrap()).collect());
    let target = &members[3];
    let h = echo(members.clone(), |m| &m[3].sockets()[0], stop.clone());
    let dst = SocketAddr::new(LOCALHOST, config.port);
    let b = report("(b) 4-member reuseport group + cBPF", ping(&client, dst, target.qpn_range().start + 7));
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    drop(members);

    // (c) through a relay: UDP -> relay thread -> Unix datagram -> app, and back.
    stop.store(false, Ordering::Relaxed);
    let relay = Arc::new(plain());
    let (relay_end, app_end) = UnixDatagram::pair().unwrap();
    relay_end.set_nonblocking(true).unwrap();
    app_end.set_nonblocking(true).unwrap();
    let app = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                match app_end.recv(&mut buf) {
                    Ok(n) => {
                        let _ = app_end.send(&buf[..n]);
                    }
                    Err(_) => std::thread::yield_now(),
                }
            }
        })
    };
    let forwarder = {
        let (relay, stop) = (relay.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut batch = RecvBatch::new(1, 2048);
            let mut buf = [0u8; 2048];
            while let Some(src) = spin_recv(&relay, &mut batch, &stop) {
                let payload = batch.iter().next().unwrap().payload.to_vec();
                relay_end.send(&payload).unwrap();
                let n = loop {
                    match relay_end.recv(&mut buf) {
                        Ok(n) => break n,
                        Err(_) => std::thread::yield_now(),
                    }
                };
                let _ = relay.send_to(src, &buf[..n]);
            }
        })
    };
    let c = report("(c) relay hop (UDP + Unix datagram)", ping(&client, relay.local_addr(), 0x2000));
    stop.store(true, Ordering::Relaxed);
    forwarder.join().unwrap();
    app.join().unwrap();
    println!(
        "median one-way: group - plain = {:+.2} us, relay - plain = {:+.2} us",
        (b.as_secs_f64() - a.as_secs_f64()) * 1e6,
        (c.as_secs_f64() - a.as_secs_f64()) * 1e6
    );
}
