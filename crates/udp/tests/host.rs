//! Many processes, one host: real member processes (this test binary, re-executed) join a
//! device on 127.0.0.1 and the kernel steers datagrams to them by the installed program.
#![allow(clippy::print_stdout)]
// fork(2), for a child that holds copies of the descriptors and none of the threads.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

mod common;

use common::{data_packet, group, random, report, resume, stop};
use softrdma_udp::host::{HostConfig, Member};
use softrdma_udp::{Config, RecvBatch};

const CHILD_ENV: &str = "SOFTRDMA_HOST_CHILD";
/// Set: the child says "waiting" and joins only when a line arrives on its stdin, so that
/// the parent can release many joins at the same instant.
const BARRIER_ENV: &str = "SOFTRDMA_HOST_BARRIER";
/// Set: the child joins as a process of that host protocol version (`Member::join_as`).
const VERSION_ENV: &str = "SOFTRDMA_HOST_VERSION";
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The member process: joins, listens as told, and reports every datagram it gets.
#[test]
fn host_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let mut parts = spec.split(',');
    let device = parts.next().unwrap().to_string();
    let port: u16 = parts.next().unwrap().parse().unwrap();
    let listens: Vec<u64> = parts.map(|s| s.parse().unwrap()).collect();
    let config = HostConfig { device, port, socket: Config::default() };
    if std::env::var_os(BARRIER_ENV).is_some() {
        println!("@@ waiting");
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
    let version = std::env::var(VERSION_ENV).map_or(softrdma_udp::host::PROTOCOL_VERSION, |v| v.parse().unwrap());
    let member = match Member::join_as(&[LOCALHOST], &config, version) {
        Ok(m) => m,
        Err(e) => {
            println!("@@ join_err {e}");
            return;
        }
    };
    let out = |s: String| {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "@@ {s}");
        let _ = o.flush();
    };
    out(format!("ready {} {}", member.slot(), u8::from(member.is_coordinator())));
    // Exit when the parent goes away (it holds our stdin).
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    let mut coordinator = member.is_coordinator();
    let mut batch = RecvBatch::new(32, 2048);
    let socket = &member.sockets()[0];
    let mut listened = false;
    loop {
        if !listened {
            // Listen from the loop that answers probes, as a runtime would.
            listened = true;
            let m = &member;
            let results: Vec<String> = std::thread::scope(|s| {
                let h = s.spawn(|| {
                    listens
                        .iter()
                        .map(|&svc| match m.listen(svc) {
                            Ok(()) => format!("listening {svc}"),
                            Err(e) => format!("listen_err {svc} {}", e.raw_os_error().unwrap_or(0)),
                        })
                        .collect()
                });
                while !h.is_finished() {
                    if socket.recv_timeout(&mut batch, Duration::from_millis(5)).unwrap_or(0) > 0 {
                        for d in batch.iter() {
                            if Member::is_probe(d.payload) {
                                m.answer_probe(d.payload);
                            }
                        }
                    }
                }
                h.join().unwrap()
            });
            for r in results {
                out(r);
            }
        }
        if member.is_coordinator() != coordinator {
            coordinator = member.is_coordinator();
            out(format!("coord {}", u8::from(coordinator)));
        }
        if socket.recv_timeout(&mut batch, Duration::from_millis(20)).unwrap_or(0) == 0 {
            continue;
        }
        report(&member, &batch, out);
    }
}

struct Proc {
    child: Child,
    lines: Receiver<String>,
    slot: u32,
    coordinator: bool,
    listen_results: Vec<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn spawn(device: &str, port: u16, listens: &[u64]) -> Proc {
        let mut p = Proc::start(device, port, listens, false);
        p.await_ready(listens.len(), Duration::from_secs(10));
        p
    }

    /// [`spawn`](Self::spawn) as a process of host protocol `version`.
    fn spawn_as(device: &str, port: u16, version: u32) -> Proc {
        let mut p = Proc::start_as(device, port, &[], false, Some(version));
        p.await_ready(0, Duration::from_secs(10));
        p
    }

    /// Starts a child of host protocol `version` that must fail to join: its error, and how
    /// long it took from the start of the process.
    fn refused_as(device: &str, port: u16, version: Option<u32>) -> (String, Duration) {
        let start = Instant::now();
        let p = Proc::start_as(device, port, &[], false, version);
        let line = p.lines.recv_timeout(Duration::from_secs(10)).expect("the join ends");
        let took = start.elapsed();
        let err = line.strip_prefix("join_err ").unwrap_or_else(|| panic!("a join error: {line}"));
        (err.to_string(), took)
    }

    /// Starts the child; with `barrier`, it waits for [`release`](Self::release) to join.
    fn start(device: &str, port: u16, listens: &[u64], barrier: bool) -> Proc {
        Proc::start_as(device, port, listens, barrier, None)
    }

    /// [`start`](Self::start) as a process of host protocol `version`.
    fn start_as(device: &str, port: u16, listens: &[u64], barrier: bool, version: Option<u32>) -> Proc {
        let mut spec = format!("{device},{port}");
        for l in listens {
            spec.push_str(&format!(",{l}"));
        }
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "host_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, spec)
            .envs(barrier.then_some((BARRIER_ENV, "1".to_string())))
            .envs(version.map(|v| (VERSION_ENV, v.to_string())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The harness may have printed "test host_child ... " on the same line.
                if let Some(at) = line.find("@@ ") {
                    if tx.send(line[at + 3..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let p = Proc { child, lines: rx, slot: 0, coordinator: false, listen_results: Vec::new() };
        if barrier {
            let line = p.lines.recv_timeout(Duration::from_secs(10)).expect("child starts within 10 s");
            assert_eq!(line, "waiting");
        }
        p
    }

    /// Lets a child started with a barrier join.
    fn release(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for the child's "ready" line (its join returned) and its listen results.
    fn await_ready(&mut self, listens: usize, within: Duration) {
        let line = self.lines.recv_timeout(within).expect("child joins in time");
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[0], "ready", "child: {line}");
        self.slot = f[1].parse().unwrap();
        self.coordinator = f[2] == "1";
        for _ in 0..listens {
            let l = self.lines.recv_timeout(Duration::from_secs(10)).expect("listen answered");
            assert!(l.starts_with("listen"), "{l}");
            self.listen_results.push(l);
        }
    }

    /// Lines received so far (waiting `wait` first).
    fn drain(&self, wait: Duration) -> Vec<String> {
        std::thread::sleep(wait);
        self.lines.try_iter().collect()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

/// A CM MAD to QP1: `field` at `offset` of the datagram, the tag after the ICRC.
fn cm_packet(attr: u16, offset: usize, field: &[u8], tag: u64) -> Vec<u8> {
    let mut p = vec![0u8; 12 + 8 + 256 + 4];
    p[0] = 0x64;
    p[7] = 1;
    p[20] = 1; // base version
    p[21] = 0x07; // CM
    p[22] = 2;
    p[23] = 0x03; // SEND
    p[36..38].copy_from_slice(&attr.to_be_bytes());
    p[offset..offset + field.len()].copy_from_slice(field);
    p.extend_from_slice(&tag.to_be_bytes());
    p
}

const SERVICE_ID: usize = 20 + 24 + 8;
const REMOTE_COMM_ID: usize = 20 + 24 + 4;
const SIDR_REP_REQUEST_ID: usize = 20 + 24;

fn tags_of(lines: &[String]) -> BTreeSet<u64> {
    lines.iter().filter_map(|l| l.strip_prefix("rx ")).map(|t| t.parse().unwrap()).collect()
}

/// Sends one datagram per member per round (tags `round << 32 | slot << 8 | i`) and checks
/// that each member received exactly its own; returns whether it did.
fn data_round(sender: &UdpSocket, port: u16, procs: &[&Proc], round: u64, per_member: u32) -> bool {
    for p in procs {
        for i in 0..per_member {
            let qpn = (p.slot << 13) | ((i * 997) % 8192);
            sender
                .send_to(&data_packet(qpn, round << 32 | u64::from(p.slot) << 8 | u64::from(i)), (LOCALHOST, port))
                .unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(150));
    let mut ok = true;
    for p in procs {
        let got: BTreeSet<u64> = tags_of(&p.drain(Duration::ZERO)).into_iter().filter(|t| t >> 32 == round).collect();
        let want: BTreeSet<u64> =
            (0..per_member).map(|i| round << 32 | u64::from(p.slot) << 8 | u64::from(i)).collect();
        ok &= got == want;
    }
    ok
}

fn wait_steered(sender: &UdpSocket, port: u16, procs: &[&Proc], within: Duration, first_round: u64) -> Duration {
    let start = Instant::now();
    let mut round = first_round;
    loop {
        for p in procs {
            p.drain(Duration::ZERO);
        }
        for p in procs {
            for i in 0..4u32 {
                let qpn = p.slot << 13 | i;
                sender
                    .send_to(&data_packet(qpn, round << 32 | u64::from(p.slot) << 8 | u64::from(i)), (LOCALHOST, port))
                    .unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut ok = true;
        for p in procs {
            let got: BTreeSet<u64> =
                tags_of(&p.lines.try_iter().collect::<Vec<_>>()).into_iter().filter(|t| t >> 32 == round).collect();
            let want: BTreeSet<u64> = (0..4).map(|i| round << 32 | u64::from(p.slot) << 8 | i).collect();
            if got != want && start.elapsed() >= within {
                panic!("slot {}: got {got:x?}, want {want:x?}", p.slot);
            }
            ok &= got == want;
        }
        if ok {
            return start.elapsed();
        }
        round += 1;
    }
}

fn sender() -> UdpSocket {
    UdpSocket::bind((LOCALHOST, 0)).unwrap()
}

#[test]
fn members_receive_their_own_qpns() {
    let (device, port) = group("test");
    let mut procs: Vec<Proc> = (0..5).map(|_| Proc::spawn(&device, port, &[])).collect();
    let slots: BTreeSet<u32> = procs.iter().map(|p| p.slot).collect();
    assert_eq!(slots.len(), 5, "distinct slots");
    assert_eq!(procs.iter().filter(|p| p.coordinator).count(), 1);
    let s = sender();
    let refs: Vec<&Proc> = procs.iter().collect();
    // Let the last join's program settle, then every member must get exactly its own.
    wait_steered(&s, port, &refs, Duration::from_secs(2), 1);
    assert!(data_round(&s, port, &refs, 100, 50), "each member receives exactly its QPNs");
    // QPNs in no slot, garbage and short datagrams: no crash; they land anywhere.
    for qpn in [0u32, 1, 2, 1000 << 13, 2047 << 13 | 5] {
        s.send_to(&data_packet(qpn, 7 << 32), (LOCALHOST, port)).unwrap();
    }
    for len in 0..40 {
        let junk: Vec<u8> = (0..len).map(|i| (random() as u8).wrapping_add(i)).collect();
        s.send_to(&junk, (LOCALHOST, port)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    let refs: Vec<&Proc> = procs.iter().collect();
    assert!(data_round(&s, port, &refs, 101, 20));
    for p in &mut procs {
        assert!(p.alive());
    }
}

#[test]
fn cm_messages_are_steered() {
    let (device, port) = group("test");
    const SVC_A: u64 = 0x0106_0000_0000_1c06;
    const SVC_B: u64 = 0x0002_0000_0000_4791;
    let a = Proc::spawn(&device, port, &[SVC_A]);
    let b = Proc::spawn(&device, port, &[SVC_B]);
    let c = Proc::spawn(&device, port, &[]);
    let d = Proc::spawn(&device, port, &[SVC_A]);
    assert_eq!(d.listen_results, [format!("listen_err {SVC_A} {}", libc_eaddrinuse())]);
    assert_eq!(a.listen_results, [format!("listening {SVC_A}")]);
    let s = sender();
    wait_steered(&s, port, &[&a, &b, &c, &d], Duration::from_secs(2), 1);
    let comm = |p: &Proc, n: u32| (p.slot << 21 | n).to_be_bytes();
    let cases: Vec<(Vec<u8>, &Proc)> = vec![
        (cm_packet(0x10, SERVICE_ID, &SVC_A.to_be_bytes(), 1), &a),
        (cm_packet(0x17, SERVICE_ID, &SVC_B.to_be_bytes(), 2), &b),
        (cm_packet(0x10, SERVICE_ID, &SVC_B.to_be_bytes(), 3), &b),
        (cm_packet(0x13, REMOTE_COMM_ID, &comm(&c, 5), 4), &c),
        (cm_packet(0x14, REMOTE_COMM_ID, &comm(&d, 1), 5), &d),
        (cm_packet(0x15, REMOTE_COMM_ID, &comm(&a, 0x1f_ffff), 6), &a),
        (cm_packet(0x16, REMOTE_COMM_ID, &comm(&b, 0), 7), &b),
        (cm_packet(0x12, REMOTE_COMM_ID, &comm(&c, 9), 8), &c),
        (cm_packet(0x11, REMOTE_COMM_ID, &comm(&d, 9), 9), &d),
        (cm_packet(0x19, REMOTE_COMM_ID, &comm(&a, 9), 10), &a),
        (cm_packet(0x1a, REMOTE_COMM_ID, &comm(&b, 9), 11), &b),
        (cm_packet(0x18, SIDR_REP_REQUEST_ID, &comm(&c, 3), 12), &c),
        (cm_packet(0x18, SIDR_REP_REQUEST_ID, &comm(&b, 3), 13), &b),
    ];
    for _ in 0..3 {
        for (p, _) in &cases {
            s.send_to(p, (LOCALHOST, port)).unwrap();
        }
    }
    // A REQ and a SIDR_REQ for a service nobody listens to: the coordinator, which answers
    // REJ 8 (SIDR_REP status 1), from whichever source port (not the hash).
    assert!(a.coordinator);
    let unlistened = unlistened_reqs(port, 100);
    std::thread::sleep(Duration::from_millis(200));
    let mut got: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    for p in [&a, &b, &c, &d] {
        got.insert(p.slot, tags_of(&p.drain(Duration::ZERO)));
    }
    for (tag, (_, want)) in cases.iter().enumerate() {
        let tag = tag as u64 + 1;
        for (&slot, tags) in &got {
            assert_eq!(tags.contains(&tag), slot == want.slot, "tag {tag} at slot {slot}: {got:?}");
        }
    }
    for (&slot, tags) in &got {
        let here: BTreeSet<u64> = tags.intersection(&unlistened).copied().collect();
        assert_eq!(here, if slot == a.slot { unlistened.clone() } else { BTreeSet::new() }, "slot {slot}");
    }
}

/// Sends REQs and SIDR_REQs for a service nobody listens to, each from a socket of its own
/// (another source port, another hash), tagged `round << 32 | i`: their tags.
fn unlistened_reqs(port: u16, round: u64) -> BTreeSet<u64> {
    (0..24u64)
        .map(|i| {
            let tag = round << 32 | i;
            let attr = if i % 2 == 0 { 0x10 } else { 0x17 };
            sender().send_to(&cm_packet(attr, SERVICE_ID, &(7 + i).to_be_bytes(), tag), (LOCALHOST, port)).unwrap();
            tag
        })
        .collect()
}

/// A socket of the group's user on the port that no member registered holds an index of
/// the kernel's group: a program's that bound it with `SO_REUSEPORT` itself, or one a
/// coordinator that is gone made for its guest (which CI met twice: a process that found
/// such a socket at index 0 failed to join, "not steered within 5 s ... its probes did not
/// reach its sockets", its coordinator's only probe taken by that socket). The coordinator
/// counts the port's sockets of its user, so its probes cover that index too: members join
/// beside it and are steered.
#[test]
fn members_join_beside_a_socket_of_their_user_that_nobody_registered() {
    let (device, port) = group("test");
    let stray = softrdma_udp::RoceSocket::bind_with(LOCALHOST, &Config { port, reuse_port: true, ..Config::default() })
        .expect("a socket of the port's group, before any member");
    let procs: Vec<Proc> = (0..2).map(|_| Proc::spawn(&device, port, &[])).collect();
    let s = sender();
    let refs: Vec<&Proc> = procs.iter().collect();
    wait_steered(&s, port, &refs, Duration::from_secs(2), 1);
    assert!(data_round(&s, port, &refs, 100, 20), "each member receives exactly its QPNs");
    drop(stray);
}

fn libc_eaddrinuse() -> i32 {
    std::io::Error::from(std::io::ErrorKind::AddrInUse).raw_os_error().unwrap_or(98)
}

#[test]
fn killed_member_frees_its_slot() {
    let (device, port) = group("test");
    let mut procs: Vec<Proc> = (0..4).map(|_| Proc::spawn(&device, port, &[])).collect();
    let s = sender();
    wait_steered(&s, port, &procs.iter().collect::<Vec<_>>(), Duration::from_secs(2), 1);
    // Kill a member that is not the coordinator and not last in the group, so that the
    // last socket moves into its index.
    let victim = procs.iter().position(|p| !p.coordinator).unwrap();
    let mut dead = procs.remove(victim);
    let dead_slot = dead.slot;
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let took = wait_steered(&s, port, &procs.iter().collect::<Vec<_>>(), Duration::from_secs(2), 100);
    println!("survivors steered again {took:?} after SIGKILL");
    let newcomer = Proc::spawn(&device, port, &[]);
    assert_ne!(newcomer.slot, dead_slot, "fresh slots are used before the freed one");
    procs.push(newcomer);
    wait_steered(&s, port, &procs.iter().collect::<Vec<_>>(), Duration::from_secs(2), 200);
    // The dead member's QPNs reach no live member as their own.
    assert!(data_round(&s, port, &procs.iter().collect::<Vec<_>>(), 300, 10));
    // REQs nobody listens for reach the coordinator, none the dead member's socket, which
    // the coordinator holds in the group without reading it (hashed, a third were lost
    // there, each with all its retries: the client waited out its CM timeouts).
    let want = unlistened_reqs(port, 400);
    std::thread::sleep(Duration::from_millis(150));
    for p in &procs {
        let got: BTreeSet<u64> = tags_of(&p.drain(Duration::ZERO)).into_iter().filter(|t| t >> 32 == 400).collect();
        assert_eq!(got, if p.coordinator { want.clone() } else { BTreeSet::new() }, "slot {}", p.slot);
    }
}

#[test]
fn killed_coordinator_is_replaced() {
    const SVC: u64 = 0x0106_0000_0000_2000;
    let (device, port) = group("test");
    let mut procs = vec![Proc::spawn(&device, port, &[])];
    assert!(procs[0].coordinator);
    procs.push(Proc::spawn(&device, port, &[SVC]));
    procs.push(Proc::spawn(&device, port, &[]));
    procs.push(Proc::spawn(&device, port, &[]));
    assert_eq!(procs[1].listen_results, [format!("listening {SVC}")]);
    let s = sender();
    wait_steered(&s, port, &procs.iter().collect::<Vec<_>>(), Duration::from_secs(2), 1);
    let mut old = procs.remove(0);
    let start = Instant::now();
    old.child.kill().unwrap();
    old.child.wait().unwrap();
    // One survivor becomes coordinator.
    let mut coordinators = 0;
    while coordinators == 0 {
        assert!(start.elapsed() < Duration::from_secs(2), "no new coordinator within 2 s");
        for p in &procs {
            coordinators += p.drain(Duration::from_millis(10)).iter().filter(|l| *l == "coord 1").count();
        }
    }
    assert_eq!(coordinators, 1);
    let took = wait_steered(&s, port, &procs.iter().collect::<Vec<_>>(), Duration::from_secs(2), 100);
    println!("survivors steered {:?} after the coordinator's SIGKILL", start.elapsed().max(took));
    assert!(start.elapsed() < Duration::from_secs(3));
    // The listener survived the failover.
    for p in &procs {
        p.drain(Duration::ZERO);
    }
    s.send_to(&cm_packet(0x10, SERVICE_ID, &SVC.to_be_bytes(), 42), (LOCALHOST, port)).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    for (i, p) in procs.iter().enumerate() {
        assert_eq!(tags_of(&p.drain(Duration::ZERO)).contains(&42), i == 0, "REQ for the listened service");
    }
    // A new member can join the new coordinator.
    procs.push(Proc::spawn(&device, port, &[]));
    wait_steered(&s, port, &procs.iter().collect::<Vec<_>>(), Duration::from_secs(2), 200);
}

/// `n` processes join one device and port at the same instant (released together from a
/// barrier), `rounds` times on the same port; every one must be steered, with one
/// coordinator and distinct slots. Stops early after `budget`.
fn simultaneous_joins(n: usize, rounds: usize, budget: Duration) {
    let (device, port) = group("test");
    let s = sender();
    let start = Instant::now();
    let mut done = 0;
    for round in 0..rounds as u64 {
        if start.elapsed() >= budget {
            break;
        }
        let mut procs: Vec<Proc> = (0..n).map(|_| Proc::start(&device, port, &[], true)).collect();
        for p in &mut procs {
            p.release();
        }
        for p in &mut procs {
            p.await_ready(0, Duration::from_secs(10));
        }
        let slots: BTreeSet<u32> = procs.iter().map(|p| p.slot).collect();
        assert_eq!(slots.len(), n, "round {round}: distinct slots");
        let coordinators = procs.iter().filter(|p| p.coordinator).count();
        assert_eq!(coordinators, 1, "round {round}: one coordinator");
        wait_steered(&s, port, &procs.iter().collect::<Vec<_>>(), Duration::from_secs(2), round << 16);
        assert!(data_round(&s, port, &procs.iter().collect::<Vec<_>>(), round << 16 | 0xffff, 8), "round {round}");
        done += 1;
        // Every member exits before the next round: the group and the name start afresh.
        drop(procs);
    }
    println!("{n} simultaneous joins: {done} rounds steered in {:?}", start.elapsed());
    assert!(done >= 3, "at least three rounds");
}

#[test]
fn two_simultaneous_joins() {
    simultaneous_joins(2, 40, Duration::from_secs(20));
}

#[test]
fn three_simultaneous_joins() {
    simultaneous_joins(3, 30, Duration::from_secs(20));
}

#[test]
fn eight_simultaneous_joins() {
    simultaneous_joins(8, 15, Duration::from_secs(25));
}

/// Sends datagrams to `qpn` (tags `0xab << 32 | n`) every 500 µs until `stop`; returns how
/// many it sent.
fn stream(port: u16, qpn: u32, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let s = sender();
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            s.send_to(&data_packet(qpn, 0xab << 32 | n), (LOCALHOST, port)).unwrap();
            n += 1;
            std::thread::sleep(Duration::from_micros(500));
        }
        n
    })
}

/// SIGKILLs `a`, then `b` after `gap`.
fn kill_two(a: &mut Proc, b: &mut Proc, gap: Duration) {
    a.child.kill().unwrap();
    std::thread::sleep(gap);
    b.child.kill().unwrap();
    a.child.wait().unwrap();
    b.child.wait().unwrap();
}

/// A member receives a steady stream while other processes join and leave, coordinators
/// included: a coordinator dies and another member right after (the member that dies
/// second had its sockets held by the dead coordinator besides itself), the next
/// coordinator dies with a newcomer, members die one after another, newcomers join. The
/// member's socket must never move away from the index the program steers its QPNs to:
/// every datagram of the stream reaches it, none reaches anyone else.
#[test]
fn a_member_keeps_its_stream_while_others_come_and_go() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut coordinator_deaths = 0;
    for episode in 0..4u64 {
        let (device, port) = group("test");
        // The stream's member joins last: when a socket before it closes, the kernel
        // moves the member's socket into that place.
        let mut c0 = Proc::spawn(&device, port, &[]);
        assert!(c0.coordinator);
        let mut c1 = Proc::spawn(&device, port, &[]);
        let mut q = Proc::spawn(&device, port, &[]);
        let p = Proc::spawn(&device, port, &[]);
        let s = sender();
        wait_steered(&s, port, &[&c0, &c1, &q, &p], Duration::from_secs(2), episode << 20 | 1);
        p.drain(Duration::ZERO);
        let stop = Arc::new(AtomicBool::new(false));
        let streamer = stream(port, p.slot << 13 | 7, stop.clone());
        std::thread::sleep(Duration::from_millis(50));
        // The coordinator dies, then a member whose sockets only it held besides itself.
        let gap = Duration::from_millis([0, 1, 5, 20][episode as usize]);
        kill_two(&mut c0, &mut c1, gap);
        coordinator_deaths += 1;
        std::thread::sleep(Duration::from_millis(400));
        // Newcomers join after the member; the next coordinator (if not the member) dies
        // with one of them, then the others leave one by one.
        let mut c2 = Proc::spawn(&device, port, &[]);
        let mut c3 = Proc::spawn(&device, port, &[]);
        let mut c4 = Proc::spawn(&device, port, &[]);
        std::thread::sleep(Duration::from_millis(100));
        let q_coordinates = q.coordinator || q.drain(Duration::ZERO).iter().any(|l| l == "coord 1");
        if q_coordinates {
            kill_two(&mut q, &mut c2, gap);
            coordinator_deaths += 1;
        } else {
            kill_two(&mut c2, &mut q, gap);
        }
        std::thread::sleep(Duration::from_millis(200));
        let c5 = Proc::spawn(&device, port, &[]);
        kill_two(&mut c3, &mut c4, Duration::from_millis(2));
        std::thread::sleep(Duration::from_millis(400));
        stop.store(true, Ordering::Relaxed);
        let sent = streamer.join().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let got: BTreeSet<u64> = tags_of(&p.drain(Duration::ZERO))
            .into_iter()
            .filter(|t| t >> 32 == 0xab)
            .map(|t| t & 0xffff_ffff)
            .collect();
        let lost: Vec<u64> = (0..sent).filter(|n| !got.contains(n)).collect();
        let mut astray = 0;
        for c in [&c0, &c1, &q, &c2, &c3, &c4, &c5] {
            astray += tags_of(&c.drain(Duration::ZERO)).into_iter().filter(|t| t >> 32 == 0xab).count();
        }
        println!(
            "episode {episode} (second death {gap:?} after the first; the second coordinator died: {q_coordinates}): \
             {sent} sent, {} lost, {astray} astray",
            lost.len()
        );
        assert!(
            lost.is_empty() && astray == 0,
            "episode {episode}: {} of {sent} datagrams lost (numbers {:?} to {:?}), {astray} reached other members",
            lost.len(),
            lost.first(),
            lost.last()
        );
    }
    println!("{coordinator_deaths} coordinators died");
}

/// The coordinator's abstract socket name for a device and port (the one part of the host
/// protocol that never changes between versions).
fn coordinator_name(device: &str, port: u16) -> Vec<u8> {
    format!("softrdma.{}.{device}.{port}", rustix::process::getuid().as_raw()).into_bytes()
}

/// A process of another build, played by hand: a connection to the coordinator on which
/// it sent `first` with its UDP socket, bound in the group; or, without `first`, only a
/// connection that never says anything. Both stay open for as long as this value lives.
struct RawMember {
    _socket: Option<softrdma_udp::RoceSocket>,
    conn: std::os::fd::OwnedFd,
}

impl RawMember {
    fn new(device: &str, port: u16, first: Option<&[u8]>) -> RawMember {
        use rustix::net::{
            AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketType,
        };
        use std::os::fd::AsFd;
        let conn = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        let name = SocketAddrUnix::new_abstract_name(&coordinator_name(device, port)).unwrap();
        let Some(first) = first else {
            rustix::net::connect(&conn, &name).unwrap();
            return RawMember { _socket: None, conn };
        };
        let config = Config { port, reuse_port: true, ..Config::default() };
        let socket = softrdma_udp::RoceSocket::bind_with(LOCALHOST, &config).unwrap();
        rustix::net::connect(&conn, &name).unwrap();
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [socket.as_fd()];
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg(&conn, &[std::io::IoSlice::new(first)], &mut control, SendFlags::empty()).unwrap();
        RawMember { _socket: Some(socket), conn }
    }

    /// The first record the coordinator sends, within `within`.
    fn answer(&self, within: Duration) -> Option<Vec<u8>> {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.conn, PollFlags::IN)];
        let ts = Timespec { tv_sec: within.as_secs() as i64, tv_nsec: i64::from(within.subsec_nanos()) };
        if rustix::event::poll(&mut fds, Some(&ts)).unwrap() == 0 {
            return None;
        }
        let mut buf = [0u8; 4096];
        let n = rustix::net::recv(&self.conn, &mut buf, rustix::net::RecvFlags::empty()).unwrap().0;
        Some(buf[..n].to_vec())
    }
}

/// The hello of host protocol 1 (builds before `6d9d9e4`): tag 1, pid, slot 0, no listeners.
fn hello_of_protocol_1() -> Vec<u8> {
    let mut b = vec![1u8];
    b.extend_from_slice(&4242u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b
}

/// A versioned hello of a version this build does not know.
fn join_of_version_99() -> Vec<u8> {
    let mut b = vec![7u8];
    b.extend_from_slice(&99u32.to_le_bytes());
    b.extend_from_slice(&4243u32.to_le_bytes());
    b.extend_from_slice(&[0, 0, 0, 0]); // build and program: empty
    b.extend_from_slice(&[0xa5; 40]); // whatever version 99 says next
    b
}

/// A process of a version this build does not speak joins a group: it fails at once,
/// naming the coordinator and both sides' versions; the group keeps working and takes
/// newcomers.
#[test]
fn a_member_of_another_version_is_refused_at_once() {
    let (device, port) = group("test");
    let a = Proc::spawn(&device, port, &[]);
    assert!(a.coordinator);
    let b = Proc::spawn(&device, port, &[]);
    let (err, took) = Proc::refused_as(&device, port, Some(99));
    println!("{err} ({took:?} from the start of the process)");
    assert!(err.contains(&format!("is coordinated by process {} (", a.child.id())), "{err}");
    assert!(err.contains("which speaks host protocols 2 to 3;"), "{err}");
    assert!(err.contains("speaks host protocol 99:"), "{err}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    let c = Proc::spawn(&device, port, &[]);
    let s = sender();
    wait_steered(&s, port, &[&a, &b, &c], Duration::from_secs(2), 1);
    assert!(data_round(&s, port, &[&a, &b, &c], 100, 20));
}

/// The coordinator is a process of a version this build does not speak: this build's
/// newcomers fail at once, naming it; so do those of protocol 2 (with the error those
/// builds report). Its own group keeps working and takes newcomers of its version.
#[test]
fn a_coordinator_of_another_version_refuses_at_once() {
    let (device, port) = group("test");
    let x = Proc::spawn_as(&device, port, 99);
    assert!(x.coordinator);
    let y = Proc::spawn_as(&device, port, 99);
    let (err, took) = Proc::refused_as(&device, port, None);
    println!("{err} ({took:?} from the start of the process)");
    assert!(err.contains(&format!("is coordinated by process {} (", x.child.id())), "{err}");
    assert!(err.contains("which speaks host protocol 99;"), "{err}");
    assert!(err.contains("this process (softrdma "), "{err}");
    assert!(err.contains("speaks host protocols 2 to 3:"), "{err}");
    assert!(err.contains(&format!("Stop process {}", x.child.id())), "{err}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    let (err, took) = Proc::refused_as(&device, port, Some(2));
    println!("protocol 2: {err} ({took:?})");
    assert!(err.contains("refused this member"), "{err}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    let z = Proc::spawn_as(&device, port, 99);
    let s = sender();
    wait_steered(&s, port, &[&x, &y, &z], Duration::from_secs(2), 1);
    assert!(data_round(&s, port, &[&x, &y, &z], 100, 20));
}

/// Builds from before versions (host protocol 2, played by `join_as(.., 2)`: its hello in
/// protocol 2's layout; as coordinator it hangs up on a versioned hello) and this build
/// share a port both ways, across failovers from one to the other.
#[test]
fn builds_of_protocol_2_work_beside_this_one() {
    let (device, port) = group("test");
    let s = sender();
    let mut old = Proc::spawn_as(&device, port, 2);
    assert!(old.coordinator);
    // A process of a later version that does not speak protocol 2 fails at once.
    let (err, took) = Proc::refused_as(&device, port, Some(99));
    println!("{err} ({took:?} from the start of the process)");
    assert!(err.contains(&format!("is coordinated by process {} (", old.child.id())), "{err}");
    assert!(err.contains("hung up on this process's hello in host protocol 99"), "{err}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // This build's members say hello again in protocol 2's layout.
    let mut a = Proc::spawn(&device, port, &[]);
    let mut b = Proc::spawn(&device, port, &[]);
    wait_steered(&s, port, &[&old, &a, &b], Duration::from_secs(2), 1);
    // One of them takes over, and takes a member of protocol 2.
    old.child.kill().unwrap();
    old.child.wait().unwrap();
    let start = Instant::now();
    while !(a.coordinator || b.coordinator) {
        assert!(start.elapsed() < Duration::from_secs(2), "no new coordinator within 2 s");
        for p in [&mut a, &mut b] {
            p.coordinator |= p.drain(Duration::from_millis(10)).iter().any(|l| l == "coord 1");
        }
    }
    let old2 = Proc::spawn_as(&device, port, 2);
    wait_steered(&s, port, &[&a, &b, &old2], Duration::from_secs(2), 100);
    // Its death: the other member of this build, or the one of protocol 2, takes over.
    let (mut dead, survivor) = if a.coordinator { (a, b) } else { (b, a) };
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    let c = Proc::spawn(&device, port, &[]);
    let old3 = Proc::spawn_as(&device, port, 2);
    let all = [&survivor, &old2, &c, &old3];
    wait_steered(&s, port, &all, Duration::from_secs(2), 200);
    assert!(data_round(&s, port, &all, 300, 20));
}

/// A process of host protocol 1 (builds before `6d9d9e4`) gets, at once, a `Welcome`
/// without a slot and `EPROTONOSUPPORT`, which those builds report as the coordinator
/// refusing them; before, the coordinator hung up and it said hello again for 5 s.
#[test]
fn a_member_of_protocol_1_is_refused_at_once() {
    let (device, port) = group("test");
    let a = Proc::spawn(&device, port, &[]);
    let old = RawMember::new(&device, port, Some(&hello_of_protocol_1()));
    let mut welcome = vec![1u8, 0, 0, 0, 0];
    welcome.extend_from_slice(&libc_eprotonosupport().to_le_bytes());
    assert_eq!(old.answer(Duration::from_secs(1)), Some(welcome));
    drop(old);
    let b = Proc::spawn(&device, port, &[]);
    let s = sender();
    wait_steered(&s, port, &[&a, &b], Duration::from_secs(2), 1);
}

fn libc_eprotonosupport() -> i32 {
    93
}

/// Processes that stopped answering, of this build or of others, beside a group: a member
/// stopped after it joined (SIGSTOP, a debugger), a process of an older build (its hello in
/// the layout of host protocol 1) and one of a newer build (a versioned hello of a version
/// this build does not know), each with its socket in the group and its connection open,
/// never reading; and a connection that never says anything. Newcomers still join within
/// 1.5 s each, and every member gets exactly its own datagrams.
#[test]
fn stuck_processes_do_not_block_joins() {
    let (device, port) = group("test");
    let a = Proc::spawn(&device, port, &[]);
    assert!(a.coordinator);
    let b = Proc::spawn(&device, port, &[]);
    let stopped = Proc::spawn(&device, port, &[]);
    stop(stopped.child.id());
    let _older = RawMember::new(&device, port, Some(&hello_of_protocol_1()));
    let _newer = RawMember::new(&device, port, Some(&join_of_version_99()));
    let _silent = RawMember::new(&device, port, None);
    let mut joined = Vec::new();
    for _ in 0..2 {
        let start = Instant::now();
        let mut p = Proc::start(&device, port, &[], false);
        p.await_ready(0, Duration::from_secs(3));
        println!("joined beside the stuck processes in {:?}", start.elapsed());
        assert!(start.elapsed() < Duration::from_millis(1500), "joined in {:?}", start.elapsed());
        joined.push(p);
    }
    let s = sender();
    let live: Vec<&Proc> = [&a, &b].into_iter().chain(&joined).collect();
    wait_steered(&s, port, &live, Duration::from_secs(2), 1);
    assert!(data_round(&s, port, &live, 100, 20));
    resume(stopped.child.id());
}

/// A coordinator whose process is ending hangs up on hellos while its listener is still
/// open (the kernel closes an ending process's descriptors in numeric order, accepted
/// connections often first): played here by a listener that hangs up on every connection
/// for 100 ms from the first, then closes. A newcomer waits it out and coordinates, where it took the
/// hang-ups for a build of an older host protocol and failed (EIO from the verbs; CI met
/// it beside a child of `fork` that was exiting).
#[test]
fn a_coordinator_hanging_up_as_its_process_ends_is_waited_out() {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let (device, port) = group("test");
    let listener = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&listener, &SocketAddrUnix::new_abstract_name(&coordinator_name(&device, port)).unwrap())
        .unwrap();
    rustix::net::listen(&listener, 16).unwrap();
    let ending = std::thread::spawn(move || {
        let start = Instant::now();
        let mut first: Option<Instant> = None;
        let mut hung_up = 0;
        while first.map_or(start.elapsed() < Duration::from_secs(10), |f| f.elapsed() < Duration::from_millis(100)) {
            match rustix::net::accept(&listener) {
                Ok(conn) => {
                    drop(conn);
                    first.get_or_insert_with(Instant::now);
                    hung_up += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        hung_up
    });
    let mut p = Proc::start(&device, port, &[], false);
    p.await_ready(0, Duration::from_secs(10));
    let hung_up = ending.join().unwrap();
    println!("the ending coordinator hung up {hung_up} times");
    assert!(hung_up >= 2, "the newcomer said hello in both layouts to the ending coordinator");
    assert!(p.coordinator, "the newcomer coordinates once the name is free");
}

/// A coordinator that stops answering (SIGSTOP, a debugger) holds the name: nobody else
/// can coordinate the port. A newcomer fails within a second, naming the process and its
/// state, instead of waiting 5 s; once it runs again, newcomers join.
#[test]
fn a_stopped_coordinator_fails_joins_fast_and_names_itself() {
    let (device, port) = group("test");
    let c = Proc::spawn(&device, port, &[]);
    assert!(c.coordinator);
    let m = Proc::spawn(&device, port, &[]);
    stop(c.child.id());
    let (err, took) = Proc::refused_as(&device, port, None);
    println!("{err} ({took:?} from the start of the process)");
    assert!(err.contains(&format!("is coordinated by process {} (", c.child.id())), "{err}");
    assert!(err.contains("it is stopped"), "{err}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    resume(c.child.id());
    let late = Proc::spawn(&device, port, &[]);
    let s = sender();
    wait_steered(&s, port, &[&c, &m, &late], Duration::from_secs(2), 1);
}

/// Forks a child that only sleeps for `secs` and exits: a process that lives on with copies
/// of every descriptor and none of the threads, as Python's `multiprocessing` players do.
fn fork_sleeper(secs: u32) -> libc::pid_t {
    // SAFETY: the child calls only sleep and _exit, which are async-signal-safe.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: as above; _exit never returns.
        unsafe {
            libc::sleep(secs);
            libc::_exit(0);
        }
    }
    assert!(child > 0, "fork");
    child
}

fn end_child(child: libc::pid_t) {
    // SAFETY: signals and reaps the child this test forked.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
}

#[test]
fn a_child_of_fork_keeps_no_socket_or_coordination_of_its_parent() {
    let (device, port) = group("test");
    let config = HostConfig { device, port, socket: Config::default() };
    let first = Member::join(&[LOCALHOST], &config).unwrap();
    assert!(first.is_coordinator());
    let child = fork_sleeper(30);
    // The member and its coordinator go; the child's copies of their descriptors must not
    // keep the name bound or the sockets in the group.
    drop(first);
    let started = Instant::now();
    let second = Member::join(&[LOCALHOST], &config);
    let took = started.elapsed();
    end_child(child);
    let second = second.expect("a member joins while the forked child lives");
    assert!(second.is_coordinator(), "it coordinates: the old name was free");
    assert!(took < Duration::from_secs(2), "joined in {took:?}");
    // Its QPNs reach it.
    let s = sender();
    let mut batch = RecvBatch::new(8, 2048);
    let qpn = second.qpn_range().start;
    let got = (0..50).any(|i| {
        s.send_to(&data_packet(qpn, 0xfeed + i), (LOCALHOST, port)).unwrap();
        matches!(second.sockets()[0].recv_timeout(&mut batch, Duration::from_millis(20)), Ok(n) if n > 0)
    });
    assert!(got, "a datagram to its QPN reaches its socket");
}
