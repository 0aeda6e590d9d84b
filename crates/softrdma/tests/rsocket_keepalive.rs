//! rsockets' keepalives (`SO_KEEPALIVE`, `TCP_KEEPIDLE`): the options as rdma-core's
//! rsockets answer them, and what they are for: a socket whose peer is gone without a word
//! (SIGKILL, so no DREQ and no disconnect message) fails with keepalives on, where one
//! without them, idle, would wait forever.
//!
//! The peer is this test binary run again (`common::child`) in the role named by
//! `SOFTRDMA_TEST_ROLE`; `child_entry` is its entry point and does nothing otherwise.

// Tests talk to the child processes they start over stdout.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::child::{ChildProc, ROLE_ENV};
use softrdma::rsocket::{self, PollItem, PollTarget, RSocket, events, os_error};

const ENTRY: &str = "child_entry";

/// Runs the child role named in the environment; a no-op when this is not a child.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    assert_eq!(role, "two-connections", "unknown child role");
    // Two connections to the parent's listener, then nothing until killed.
    let addr: SocketAddr = std::env::var("RS_ADDR").expect("RS_ADDR").parse().unwrap();
    let (a, b) = (RSocket::new().unwrap(), RSocket::new().unwrap());
    a.connect(addr).unwrap();
    b.connect(addr).unwrap();
    println!("connected");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop((a, b));
}

fn kernel_keepalive_time() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(7200)
}

#[test]
fn keepalive_options_answer_as_rdma_cores() {
    let s = RSocket::new().unwrap();
    assert!(!s.keepalive());
    assert_eq!(s.keepalive_idle(), 0, "no TCP_KEEPIDLE before either option is set");
    s.set_keepalive(true).unwrap();
    assert!(s.keepalive());
    assert_eq!(s.keepalive_idle(), kernel_keepalive_time(), "SO_KEEPALIVE takes the kernel's tcp_keepalive_time");
    for bad in [0, -1] {
        let e = s.set_keepalive_idle(bad).unwrap_err();
        assert_eq!(os_error(&e), Some(libc::EINVAL), "TCP_KEEPIDLE {bad}: {e}");
        assert!(e.to_string().contains("1 s or more"), "{e}");
    }
    s.set_keepalive_idle(5).unwrap();
    assert_eq!(s.keepalive_idle(), 5);
    s.set_keepalive(false).unwrap();
    assert!(!s.keepalive());
    assert_eq!(s.keepalive_idle(), 5, "turning keepalives off keeps the interval");
    // Set before SO_KEEPALIVE, the interval is the one keepalives then use.
    let t = RSocket::new().unwrap();
    t.set_keepalive_idle(3).unwrap();
    t.set_keepalive(true).unwrap();
    assert_eq!(t.keepalive_idle(), 3);
}

/// What `poll` says of `s` at once.
fn revents(s: &RSocket) -> i16 {
    let mut items = [PollItem { target: PollTarget::Socket(s), events: events::IN | events::OUT, revents: 0 }];
    rsocket::poll(&mut items, Some(Duration::ZERO)).unwrap();
    items[0].revents
}

#[test]
fn a_peer_killed_without_a_word_fails_the_socket_that_sends_keepalives() {
    // rdma_cm's port space, as the other rsocket tests' (the device is the default one).
    let addr: SocketAddr = "127.0.0.1:27601".parse().unwrap();
    let listener = RSocket::new().unwrap();
    listener.bind(addr).unwrap();
    listener.listen(2).unwrap();
    let mut peer = ChildProc::spawn(ENTRY, "two-connections", &[("RS_ADDR", addr.to_string())], None);
    let watched = listener.accept().unwrap();
    let idle = listener.accept().unwrap();
    peer.expect_line("connected", Duration::from_secs(10));
    // Both connected and quiet: writable, nothing else. The first look sends each
    // socket's receive credits; the second, once they are acknowledged, finds nothing
    // unacknowledged (a credit the peer never acknowledged would fail the socket too).
    for _ in 0..2 {
        assert_eq!(revents(&watched), events::OUT);
        assert_eq!(revents(&idle), events::OUT);
        std::thread::sleep(Duration::from_millis(300));
    }
    watched.set_keepalive_idle(1).unwrap();
    watched.set_keepalive(true).unwrap();

    // SIGKILL: no DREQ, no disconnect message. The first keepalive goes 1 s after it was
    // turned on, and its retries run out: 8 tries of the ACK timeout rdma_cm gives the QP
    // (rxe's, 2^19 × 4.096 µs: 17.2 s in all).
    peer.kill();
    let killed = Instant::now();
    let mut items = [PollItem { target: PollTarget::Socket(&watched), events: events::IN, revents: 0 }];
    let n = rsocket::poll(&mut items, Some(Duration::from_secs(40))).unwrap();
    let took = killed.elapsed();
    assert_eq!(n, 1, "no error within 40 s of the peer's death");
    assert_ne!(items[0].revents & events::ERR, 0, "revents {:#x}", items[0].revents);
    assert_eq!(watched.take_error(), libc::EIO, "SO_ERROR");
    let mut buf = [0u8; 8];
    assert_eq!(watched.recv(&mut buf).unwrap(), 0, "rrecv reads the end of the stream, as rdma-core's");
    eprintln!("keepalive: the connection failed {took:?} after the peer's SIGKILL");

    // The socket without keepalives, as idle, has heard nothing.
    assert_eq!(revents(&idle), events::OUT, "the socket without keepalives");
}
