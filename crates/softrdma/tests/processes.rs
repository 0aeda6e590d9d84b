//! softrdma devices in separate processes over the kernel's UDP: a passive target that only
//! sleeps, a peer killed with SIGKILL mid-transfer, and two hosts in network namespaces
//! joined by a veth pair that drops 5 % of packets (nftables).
//!
//! Children are this test binary run again (`common::child`), in the role named by
//! `SOFTRDMA_TEST_ROLE`; `child_entry` is their entry point and does nothing otherwise.

// Tests talk to the child processes they start over stdout, and say why they skip.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::child::*;
use common::netns::NetnsPair;
use common::*;
use softrdma::*;

const ENTRY: &str = "child_entry";

/// Runs the child role named in the environment; a no-op when this is not a child.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    match role.as_str() {
        "target" => target(),
        "initiator" => initiator(),
        "ud" => ud_peer(),
        "cm-server" => cm_server(),
        "cm-server-exits" => cm_server_exits(false),
        "cm-server-drops-and-returns" => cm_server_exits(true),
        "cm-server-exits-on-disconnect" => cm_server_exits_on_disconnect(),
        other => panic!("unknown child role {other}"),
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"))
}

/// The device, QP and buffer a child sets up from its environment.
fn child_side() -> (Side, Advert) {
    let ip: IpAddr = env("SOFTRDMA_TEST_IP").parse().unwrap();
    let port: u16 = env("SOFTRDMA_TEST_PORT").parse().unwrap();
    let len: usize = env("SOFTRDMA_TEST_LEN").parse().unwrap();
    let device = Device::with_addresses(&env("SOFTRDMA_TEST_IFACE"), vec![ip]);
    let ctx = device.open_with(&ContextOptions { port, ..ContextOptions::default() }).expect("open the device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 256;
    let qp = pd.create_qp(&init).unwrap();
    let mr = pd.reg_mr(len, Access::ALL).unwrap();
    let advert = Advert { qpn: qp.qpn(), ip, psn: 1000, addr: mr.addr(), rkey: mr.rkey(), len: len as u64 };
    (Side { ctx, pd, cq, qp, mr }, advert)
}

fn connect_to_peer(side: &Side, me: &Advert) -> Advert {
    say(&me.line());
    let peer = Advert::parse(&read_stdin_line().expect("the peer's EP line"));
    // 16.8 ms local ACK timeout by default: the retry budget (8 tries) outlasts a process
    // starved of CPU for 100 ms on a loaded 2-core CI machine, and tail losses still
    // recover quickly. Tests that crowd the machine more ask for a longer one.
    let timeout = std::env::var("SOFTRDMA_TEST_ACK_TIMEOUT").ok().and_then(|t| t.parse().ok()).unwrap_or(12);
    let opts = ConnectOptions { timeout, retry_cnt: 7, ..ConnectOptions::default() };
    side.qp.connect(me.psn, &peer.endpoint(), &opts).expect("connect");
    peer
}

/// A target: advertises its buffer, connects, then sleeps in `read(2)` on stdin while the
/// peer WRITEs and READs; answers `CHECK <offset> <len> <seed>` lines, and `WORD <offset>`
/// with the 8 bytes there.
fn target() {
    let (side, me) = child_side();
    side.mr.write(0, &pattern(side.mr.len(), 0xaa)).unwrap();
    connect_to_peer(&side, &me);
    // A receive for a SEND, in the last KiB (which WRITE and READ tests leave alone). An
    // early SEND meets an RNR NAK and is retried (rnr_retry 7: forever).
    let rsge = [side.mr.sge(side.mr.len() - 1024..side.mr.len()).unwrap()];
    side.qp.post_recv(&[RecvWr { wr_id: 1, sg_list: &rsge }]).unwrap();
    say("CONNECTED");
    while let Some(line) = read_stdin_line() {
        if line == "RECV" {
            let wc = side.cq.wait(WAIT).expect("a receive completion");
            let mut got = vec![0u8; wc.byte_len as usize];
            side.mr.read(side.mr.len() - 1024, &mut got).unwrap();
            let ok = wc.status == WcStatus::Success && got == pattern(200, 0x77);
            say(&format!("RECV {}", if ok { "ok" } else { "bad" }));
            continue;
        }
        if let Some(offset) = line.strip_prefix("WORD ") {
            say(&format!("WORD {}", side.mr.read_u64(offset.parse().unwrap()).unwrap()));
            continue;
        }
        let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
        let (offset, len, seed) = (f[0] as usize, f[1] as usize, f[2]);
        let mut got = vec![0u8; len];
        side.mr.read(offset, &mut got).unwrap();
        let ok = got == pattern(len, seed);
        say(&format!("CHECK {}", if ok { "ok" } else { "bad" }));
    }
}

/// An initiator: WRITEs `SOFTRDMA_TEST_MSGS` messages of `SOFTRDMA_TEST_SIZE` bytes into
/// the peer's buffer, READs them all back and compares; prints `DONE ok|bad ...`.
fn initiator() {
    let (side, me) = child_side();
    let peer = connect_to_peer(&side, &me);
    let msgs: usize = env("SOFTRDMA_TEST_MSGS").parse().unwrap();
    let size: usize = env("SOFTRDMA_TEST_SIZE").parse().unwrap();
    let half = side.mr.len() / 2;
    assert!(msgs * size <= half && (msgs * size) as u64 <= peer.len);
    side.mr.write(0, &pattern(msgs * size, 0x5c)).unwrap();
    for batch in (0..msgs).collect::<Vec<_>>().chunks(32) {
        for &i in batch {
            let sge = [side.mr.sge(i * size..(i + 1) * size).unwrap()];
            let op = SendOp::RdmaWrite { remote_addr: peer.addr + (i * size) as u64, rkey: peer.rkey() };
            side.qp.post_send(&[wr(i as u64, op, &sge)]).unwrap();
        }
        for wc in side.cq.wait_n(batch.len(), Duration::from_secs(60)).unwrap() {
            assert_eq!(wc.status, WcStatus::Success, "write {}", wc.wr_id);
        }
    }
    let sge = [side.mr.sge(half..half + msgs * size).unwrap()];
    let op = SendOp::RdmaRead { remote_addr: peer.addr, rkey: peer.rkey() };
    side.qp.post_send(&[wr(u64::MAX, op, &sge)]).unwrap();
    let wc = side.cq.wait(Duration::from_secs(60)).unwrap();
    assert_eq!(wc.status, WcStatus::Success, "the READ back: {:?}", side.ctx.counters());
    let mut back = vec![0u8; msgs * size];
    side.mr.read(half, &mut back).unwrap();
    let read_ok = back == pattern(msgs * size, 0x5c);
    let first_bad = back.iter().zip(pattern(msgs * size, 0x5c)).position(|(a, b)| *a != b);
    let atomics_ok = atomics_and_send(&side, &peer);
    if !read_ok || !atomics_ok {
        eprintln!(
            "initiator: read back ok: {read_ok} (first bad byte {first_bad:?}), atomics and send ok: {atomics_ok}"
        );
    }
    let ok = read_ok && atomics_ok;
    let c = side.ctx.counters().engine;
    say(&format!(
        "DONE {} bytes={} retransmitted={} timeouts={} naks={}",
        if ok { "ok" } else { "bad" },
        2 * msgs * size,
        c.retransmitted_packets,
        c.ack_timeouts,
        c.naks_rcvd
    ));
}

/// Fetch-add twice and compare-swap once on a word of the peer's buffer (past the data the
/// WRITEs cover), checking every returned value, then a 200-byte SEND into the receive the
/// target posted.
fn atomics_and_send(side: &Side, peer: &Advert) -> bool {
    let len = side.mr.len();
    let word = (peer.len as usize - 2048) & !7;
    let initial = u64::from_ne_bytes(pattern(peer.len as usize, 0xaa)[word..word + 8].try_into().unwrap());
    let addr = peer.addr + word as u64;
    let ops = [
        SendOp::FetchAdd { remote_addr: addr, rkey: peer.rkey(), add: 1 },
        SendOp::FetchAdd { remote_addr: addr, rkey: peer.rkey(), add: 1 },
        SendOp::CompareSwap { remote_addr: addr, rkey: peer.rkey(), compare: initial.wrapping_add(2), swap: 42 },
    ];
    let mut ok = true;
    let mut expect = |what: &str, good: bool| {
        if !good {
            eprintln!("initiator: {what} failed");
        }
        ok &= good;
    };
    for (i, op) in ops.into_iter().enumerate() {
        let sge = [side.mr.sge(len - 64..len - 56).unwrap()];
        side.qp.post_send(&[wr(i as u64, op, &sge)]).unwrap();
        let wc = side.cq.wait(WAIT).unwrap();
        expect(&format!("atomic {i}: {wc:?}"), wc.status == WcStatus::Success && wc.wr_id == i as u64);
        let got = side.mr.read_u64(len - 64).unwrap();
        expect(
            &format!("atomic {i} returned {got:#x}, not {:#x}", initial.wrapping_add(i as u64)),
            got == initial.wrapping_add(i as u64),
        );
    }
    side.mr.write(len - 512, &pattern(200, 0x77)).unwrap();
    let sge = [side.mr.sge(len - 512..len - 312).unwrap()];
    side.qp.post_send(&[wr(9, SendOp::Send, &sge)]).unwrap();
    let wc = side.cq.wait(WAIT).unwrap();
    expect(&format!("the SEND: {wc:?}"), wc.status == WcStatus::Success);
    // READ the word back: the compare-swap stored 42.
    let sge = [side.mr.sge(len - 64..len - 56).unwrap()];
    side.qp.post_send(&[wr(10, SendOp::RdmaRead { remote_addr: addr, rkey: peer.rkey() }, &sge)]).unwrap();
    let wc = side.cq.wait(WAIT).unwrap();
    expect(&format!("the READ of the word: {wc:?}"), wc.status == WcStatus::Success);
    let got = side.mr.read_u64(len - 64).unwrap();
    expect(&format!("the word holds {got}, not 42"), got == 42);
    ok
}

/// A UD peer: exchanges QPNs, sends eight datagrams to the other, and checks the eight it
/// receives (GRH first, then the payload).
fn ud_peer() {
    let ip: IpAddr = env("SOFTRDMA_TEST_IP").parse().unwrap();
    let port: u16 = env("SOFTRDMA_TEST_PORT").parse().unwrap();
    let ctx = Device::with_addresses("lo", vec![ip])
        .open_with(&ContextOptions { port, ..ContextOptions::default() })
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Ud, &cq)).unwrap();
    qp.ready_ud(0x0ddba11, 0).unwrap();
    let mr = pd.reg_mr(16 * 1024, Access::LOCAL_WRITE).unwrap();
    let sges: Vec<[Sge; 1]> = (0..8).map(|i| [mr.sge(i * 1024..(i + 1) * 1024).unwrap()]).collect();
    let wrs: Vec<RecvWr<'_>> = sges.iter().enumerate().map(|(i, s)| RecvWr { wr_id: i as u64, sg_list: s }).collect();
    qp.post_recv(&wrs).unwrap();
    say(&format!("UD {}", qp.qpn()));
    let line = read_stdin_line().expect("the peer's UD line");
    let peer_qpn: u32 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let av = AddressVector { dgid: Gid::from_ip(ip), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let ah = pd.create_ah(av).unwrap();
    let dest = UdDest { ah: ah.id(), remote_qpn: Qpn::from_u24_truncating(peer_qpn), remote_qkey: QKey(0x0ddba11) };
    for i in 0..8u64 {
        mr.write(8192 + i as usize * 128, &pattern(100, i)).unwrap();
        let sge = [mr.sge(8192 + i as usize * 128..8192 + i as usize * 128 + 100).unwrap()];
        let w = SendWr {
            wr_id: 100 + i,
            op: SendOp::Send,
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: Some(dest),
            xrc_srqn: None,
        };
        qp.post_send(&[w]).unwrap();
    }
    let (mut sent, mut got) = (0, std::collections::BTreeSet::new());
    let deadline = Instant::now() + WAIT;
    while sent < 8 || got.len() < 8 {
        assert!(Instant::now() < deadline, "UD: {sent} sent, {} received", got.len());
        let Some(wc) = cq.poll_one() else { continue };
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.opcode == WcOpcode::Send {
            sent += 1;
            continue;
        }
        assert_eq!((wc.byte_len, wc.grh, wc.src_qp.value()), (140, Some(NetworkHdr::Ipv4), peer_qpn));
        let mut buf = vec![0u8; 140];
        mr.read(wc.wr_id as usize * 1024, &mut buf).unwrap();
        // Which datagram it was: the payload after the GRH names it.
        let seq = (0..8u64).find(|&s| buf[40..] == pattern(100, s)[..]).expect("a datagram the peer sent");
        got.insert(seq);
    }
    say("UD ok");
    let _ = read_stdin_line();
}

/// This process's side of a connection to a child target on `child_ip`.
fn local_initiator(ip: [u8; 4], port: u16, target: &mut ChildProc) -> (Side, Advert) {
    let ctx = open(ip, port);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 256;
    let qp = pd.create_qp(&init).unwrap();
    let mr = pd.reg_mr(64 * 1024, Access::ALL).unwrap();
    let me = Advert { qpn: qp.qpn(), ip: IpAddr::from(ip), psn: 7, addr: mr.addr(), rkey: mr.rkey(), len: 0 };
    let peer = Advert::parse(&target.expect_line("EP ", WAIT));
    target.send_line(&me.line());
    let opts = ConnectOptions { timeout: 10, retry_cnt: 7, ..ConnectOptions::default() };
    qp.connect(me.psn, &peer.endpoint(), &opts).unwrap();
    target.expect_line("CONNECTED", WAIT);
    (Side { ctx, pd, cq, qp, mr }, peer)
}

fn target_env(ip: &str, port: u16, len: usize) -> Vec<(&'static str, String)> {
    vec![
        ("SOFTRDMA_TEST_IFACE", "lo".into()),
        ("SOFTRDMA_TEST_IP", ip.into()),
        ("SOFTRDMA_TEST_PORT", port.to_string()),
        ("SOFTRDMA_TEST_LEN", len.to_string()),
    ]
}

#[test]
fn passive_target_process_sleeps_while_writes_and_reads_complete() {
    let port = test_port();
    let mut target = ChildProc::spawn(ENTRY, "target", &target_env("127.0.0.1", port, 1 << 20), None);
    let (a, peer) = local_initiator([127, 0, 0, 1], port, &mut target);
    // READ the target's initial pattern, then WRITE a new one over 1 MiB and check it there.
    let sge = [a.mr.sge(0..65536).unwrap()];
    a.qp.post_send(&[wr(1, SendOp::RdmaRead { remote_addr: peer.addr, rkey: peer.rkey() }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let mut got = vec![0u8; 65536];
    a.mr.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(1 << 20, 0xaa)[..65536]);
    write_and_check(&a, &peer, &mut target, 3);
    target.close_stdin();
    assert!(target.wait_success(WAIT));
}

/// WRITEs to `peer`'s buffer (16 × 64 KiB of `seed`'s pattern), each checked there.
fn write_and_check(a: &Side, peer: &Advert, target: &mut ChildProc, seed: u64) {
    let sge = [a.mr.sge(0..65536).unwrap()];
    a.mr.write(0, &pattern(65536, seed)).unwrap();
    for i in 0..16u64 {
        let op = SendOp::RdmaWrite { remote_addr: peer.addr + i * 65536, rkey: peer.rkey() };
        a.qp.post_send(&[wr(i, op, &sge)]).unwrap();
    }
    for wc in a.cq.wait_n(16, WAIT).unwrap() {
        assert_eq!(wc.status, WcStatus::Success);
    }
    for i in 0..16 {
        target.send_line(&format!("CHECK {} 65536 {seed}", i * 65536));
        assert_eq!(target.expect_line("CHECK", WAIT), "CHECK ok", "block {i}");
    }
}

/// The names in `/dev/shm` of the same-host inbox (and its bell) of `slot` on `port`.
fn inbox_files(port: u16, slot: u32) -> Vec<String> {
    let suffix = format!(".lo.{port}.{slot}");
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("softrdma.") && (n.ends_with(&suffix) || n.ends_with(&format!("{suffix}.bell"))))
        .collect()
}

#[test]
fn processes_write_through_shared_memory_and_an_exiting_one_removes_its_inbox() {
    let port = test_port();
    let mut first = ChildProc::spawn(ENTRY, "target", &target_env("127.0.0.1", port, 1 << 20), None);
    let (a, peer) = local_initiator([127, 0, 0, 1], port, &mut first);
    let slot = peer.qpn >> 13;
    assert_eq!(inbox_files(port, slot).len(), 2, "the target's inbox and bell: {:?}", inbox_files(port, slot));
    write_and_check(&a, &peer, &mut first, 3);
    let c = a.ctx.counters();
    assert!(c.same_host_sent >= 16 && c.same_host_sent == c.engine.sent_packets, "{c:?}");
    // By now the target has said it copies from this process: 16 more WRITEs of 64 KiB
    // go by reference (a packet each, where by value they take 16), every byte checked.
    write_and_check(&a, &peer, &mut first, 4);
    let more = a.ctx.counters().same_host_sent - c.same_host_sent;
    assert!((16..64).contains(&more), "16 WRITEs by reference, not 256 packets by value: {more}");
    first.close_stdin();
    assert!(first.wait_success(WAIT));
    assert_eq!(inbox_files(port, slot), Vec::<String>::new(), "an exiting process removes its inbox");
    // The next process is reached the same way.
    let mut second = ChildProc::spawn(ENTRY, "target", &target_env("127.0.0.1", port, 1 << 20), None);
    let (b, peer2) = local_initiator([127, 0, 0, 1], port, &mut second);
    write_and_check(&b, &peer2, &mut second, 5);
    assert!(b.ctx.counters().same_host_sent >= 16, "{:?}", b.ctx.counters());
    second.close_stdin();
    assert!(second.wait_success(WAIT));
}

#[test]
fn atomics_to_another_process_are_applied_directly_and_it_sees_every_one() {
    let port = test_port();
    let mut target = ChildProc::spawn(ENTRY, "target", &target_env("127.0.0.1", port, 1 << 20), None);
    let (a, peer) = local_initiator([127, 0, 0, 1], port, &mut target);
    let word = 4096u64;
    let initial = u64::from_ne_bytes(pattern(1 << 20, 0xaa)[word as usize..word as usize + 8].try_into().unwrap());
    let sge = [a.mr.sge(0..8).unwrap()];
    for i in 0..1000u64 {
        let op = SendOp::FetchAdd { remote_addr: peer.addr + word, rkey: peer.rkey(), add: 3 };
        a.qp.post_send(&[wr(i, op, &sge)]).unwrap();
        assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
        assert_eq!(a.mr.read_u64(0).unwrap(), initial.wrapping_add(3 * i), "atomic {i}");
    }
    target.send_line(&format!("WORD {word}"));
    assert_eq!(target.expect_line("WORD", WAIT), format!("WORD {}", initial.wrapping_add(3000)));
    let c = a.ctx.counters();
    // The first by packet; the rest on a mapping of the target's region, granted with it.
    assert!(c.engine.direct_atomics >= 990, "{c:?}");
    assert!(c.engine.sent_packets < 50, "{c:?}");
    target.close_stdin();
    assert!(target.wait_success(WAIT));
}

#[test]
fn a_killed_responder_applies_no_more_atomics_they_fail_as_its_packets_would() {
    let port = test_port();
    let mut target = ChildProc::spawn(ENTRY, "target", &target_env("127.0.0.1", port, 1 << 20), None);
    let (a, peer) = local_initiator([127, 0, 0, 1], port, &mut target);
    let sge = [a.mr.sge(0..8).unwrap()];
    let op = SendOp::FetchAdd { remote_addr: peer.addr + 4096, rkey: peer.rkey(), add: 1 };
    for i in 0..100u64 {
        a.qp.post_send(&[wr(i, op, &sge)]).unwrap();
        assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    }
    let direct = a.ctx.counters().engine.direct_atomics;
    assert!(direct >= 90, "applied through the grant before the kill: {direct}");
    // SIGKILL, and reaped: the responder's memory is no one's now.
    target.kill();
    a.qp.post_send(&[wr(100, op, &sge)]).unwrap();
    let wc = a.cq.wait(Duration::from_secs(10)).expect("an error completion, not a hang");
    assert_eq!(wc.status, WcStatus::RetryExcErr, "an atomic to a dead process: {wc:?}");
    assert_eq!(a.ctx.counters().engine.direct_atomics, direct, "none applied after the kill");
    assert_eq!(a.qp.state(), Some(QpState::Err));
}

#[test]
fn peer_killed_mid_transfer_gives_retry_exceeded_not_a_hang() {
    let port = test_port();
    let mut target = ChildProc::spawn(ENTRY, "target", &target_env("127.0.0.1", port, 1 << 20), None);
    let (a, peer) = local_initiator([127, 0, 0, 1], port, &mut target);
    let sge = [a.mr.sge(0..65536).unwrap()];
    let write = |i: u64| {
        let op = SendOp::RdmaWrite { remote_addr: peer.addr + (i % 16) * 65536, rkey: peer.rkey() };
        a.qp.post_send(&[wr(i, op, &sge)])
    };
    let mut posted = 0u64;
    for _ in 0..8 {
        write(posted).unwrap();
        posted += 1;
    }
    let mut completed = 0u64;
    let started = Instant::now();
    let mut killed_at = None;
    let error = loop {
        assert!(started.elapsed() < Duration::from_secs(20), "no error completion: the survivor hangs");
        let Some(wc) = a.cq.poll_one() else {
            std::thread::yield_now();
            continue;
        };
        if wc.status != WcStatus::Success {
            break wc;
        }
        completed += 1;
        if completed == 20 {
            target.kill(); // SIGKILL mid-transfer
            killed_at = Some(Instant::now());
        }
        if write(posted).is_ok() {
            posted += 1;
        }
    };
    let killed_at = killed_at.expect("the target was killed after 20 completions");
    assert_eq!(error.status, WcStatus::RetryExcErr, "{error:?}");
    // timeout 10 (4.19 ms) × (1 + retry_cnt 7) tries = 34 ms, plus scheduling slack.
    let took = killed_at.elapsed();
    assert!(took < Duration::from_secs(5), "error after {took:?}");
    eprintln!("RETRY_EXC_ERR {took:?} after the SIGKILL");
    // Everything still queued is flushed, and the QP is in the error state.
    assert_eq!(a.qp.state(), Some(QpState::Err));
    while let Some(wc) = a.cq.poll_one() {
        assert_eq!(wc.status, WcStatus::WrFlushErr);
    }
}

#[test]
fn two_hosts_over_veth_with_five_percent_loss_move_data_byte_exact() {
    if std::process::Command::new("nft").arg("-V").output().is_err() {
        eprintln!("skipped: `nft` is not installed (nftables)");
        return;
    }
    // Each end drops 5 % of the UDP 4791 packets it receives.
    let Some(ns) = NetnsPair::create_or_skip("loss", ["srdma-va", "srdma-vb"]) else { return };
    for (i, addr) in ["10.77.0.1/24", "10.77.0.2/24"].into_iter().enumerate() {
        ns.add_address(i, addr);
        let rules = "add table inet loss; \
            add chain inet loss input { type filter hook input priority 0; }; \
            add rule inet loss input udp dport 4791 numgen random mod 100 < 5 drop";
        ns.exec(i, &["nft", rules]).expect("the nftables loss rule");
    }
    let side_env = |iface: &str, ip: &str| {
        vec![
            ("SOFTRDMA_TEST_IFACE", iface.to_string()),
            ("SOFTRDMA_TEST_IP", ip.to_string()),
            ("SOFTRDMA_TEST_PORT", "4791".to_string()),
            ("SOFTRDMA_TEST_LEN", (5 << 20).to_string()),
            ("SOFTRDMA_TEST_MSGS", "32".to_string()),
            ("SOFTRDMA_TEST_SIZE", "65536".to_string()),
        ]
    };
    let mut a = ChildProc::spawn(ENTRY, "initiator", &side_env("srdma-va", "10.77.0.1"), Some(&ns.names[0]));
    let mut b = ChildProc::spawn(ENTRY, "target", &side_env("srdma-vb", "10.77.0.2"), Some(&ns.names[1]));
    let (ea, eb) = (a.expect_line("EP ", WAIT), b.expect_line("EP ", WAIT));
    a.send_line(&eb);
    b.send_line(&ea);
    let done = a.expect_line("DONE", Duration::from_secs(120));
    eprintln!("{done}");
    assert!(done.starts_with("DONE ok"), "{done}");
    let retransmitted: u64 = done.split("retransmitted=").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(retransmitted > 0, "5 % loss must have cost retransmissions: {done}");
    // And the target holds the data too.
    b.send_line("CHECK 0 2097152 92");
    assert_eq!(b.expect_line("CHECK", WAIT), "CHECK ok");
    b.close_stdin();
    assert!(a.wait_success(WAIT) && b.wait_success(WAIT));
}

#[test]
fn six_processes_share_one_address_two_rc_pairs_and_a_ud_pair() {
    // Port 4791, so that the captures each process writes decode as RoCEv2.
    let port = 4791;
    let dir = tempfile::tempdir().unwrap();
    let captures = std::cell::Cell::new(0);
    let env = |extra: &[(&'static str, &str)]| {
        let mut e = target_env("127.0.0.1", port, 1 << 20);
        e.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        captures.set(captures.get() + 1);
        e.push((CAPTURE_ENV, dir.path().join(format!("{}.pcap", captures.get())).display().to_string()));
        e
    };
    // Six processes, their captures and tshark on two cores, while the other tests of this
    // binary (the namespace test's two busy processes among them) run alongside: a 268 ms
    // local ACK timeout (2.1 s of retries). With 16.8 ms, about one run in ten lost an
    // atomic's eight tries to a stall of over 134 ms; alone, the test never did.
    let work = [("SOFTRDMA_TEST_MSGS", "8"), ("SOFTRDMA_TEST_SIZE", "65536"), ("SOFTRDMA_TEST_ACK_TIMEOUT", "16")];
    let mut procs: Vec<ChildProc> = Vec::new();
    for _ in 0..2 {
        procs.push(ChildProc::spawn(ENTRY, "target", &env(&[]), None));
        procs.push(ChildProc::spawn(ENTRY, "initiator", &env(&work), None));
    }
    procs.push(ChildProc::spawn(ENTRY, "ud", &env(&[]), None));
    procs.push(ChildProc::spawn(ENTRY, "ud", &env(&[]), None));
    // Everyone is up at once; then the pairs exchange their endpoints.
    let eps: Vec<String> = procs[..4].iter_mut().map(|p| p.expect_line("EP ", WAIT)).collect();
    let uds: Vec<String> = procs[4..].iter_mut().map(|p| p.expect_line("UD ", WAIT)).collect();
    let qpns: std::collections::BTreeSet<&str> = eps.iter().map(|l| l.split(' ').nth(1).unwrap()).collect();
    assert_eq!(qpns.len(), 4, "QPNs are unique on the address: {eps:?}");
    for pair in [0, 2] {
        procs[pair].send_line(&eps[pair + 1]);
        procs[pair + 1].send_line(&eps[pair]);
    }
    procs[4].send_line(&uds[1]);
    procs[5].send_line(&uds[0]);
    for pair in [0, 2] {
        procs[pair].expect_line("CONNECTED", WAIT);
        let done = procs[pair + 1].expect_line("DONE", WAIT);
        assert!(done.starts_with("DONE ok"), "pair {pair}: {done}");
        procs[pair].send_line("RECV");
        assert_eq!(procs[pair].expect_line("RECV", WAIT), "RECV ok", "pair {pair}: the SEND arrived");
        procs[pair].send_line("CHECK 0 524288 92");
        assert_eq!(procs[pair].expect_line("CHECK", WAIT), "CHECK ok", "pair {pair}: the WRITEs landed");
    }
    for p in &mut procs[4..] {
        assert_eq!(p.expect_line("UD ok", WAIT), "UD ok");
    }
    for p in &mut procs {
        p.close_stdin();
    }
    for p in &mut procs {
        assert!(p.wait_success(WAIT), "{} exited with an error", p.name);
    }
    // Every process's capture decodes cleanly (the codec and tshark).
    for i in 1..=captures.get() {
        common::assert_clean_capture(&dir.path().join(format!("{i}.pcap")));
    }
}

fn cm_channel() -> EventChannel {
    let port: u16 = env("SOFTRDMA_TEST_PORT").parse().unwrap();
    EventChannel::with_options(ContextOptions { port, cm_response_timeout: 14, ..ContextOptions::default() }).unwrap()
}

fn cm_cap() -> QpCap {
    QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

/// Listens on 127.0.0.1:$SOFTRDMA_TEST_SERVICE, says LISTENING, and takes the first
/// connection request: its ID gets a QP, then `before_accept` (posting receives, say),
/// then the accept; returns when the connection is established: the channel, the
/// listener (still listening), the connection's ID and what `before_accept` made.
fn accept_one<T>(before_accept: impl FnOnce(&CmId) -> T) -> (EventChannel, CmId, CmId, T) {
    let service: u16 = env("SOFTRDMA_TEST_SERVICE").parse().unwrap();
    let ch = cm_channel();
    let listen = ch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    listen.bind_addr(std::net::SocketAddr::from(([127, 0, 0, 1], service))).unwrap();
    listen.listen(4).unwrap();
    say("LISTENING");
    let id = ch.expect(CmEventKind::ConnectRequest, WAIT).unwrap().id;
    let pd = id.context().unwrap().alloc_pd().unwrap();
    id.create_qp(&pd, cm_cap()).unwrap();
    let made = before_accept(&id);
    id.accept(&ConnParam::default()).unwrap();
    ch.expect(CmEventKind::Established, WAIT).unwrap();
    (ch, listen, id, made)
}

/// rdma_server's shape: listen, accept one connection, echo one message, wait for the
/// peer's disconnect.
fn cm_server() {
    let (ch, _listen, id, msgs) = accept_one(|id| {
        let msgs = id.reg_msgs(256).unwrap();
        id.post_recv(1, &msgs, 0..256).unwrap();
        msgs
    });
    let wc = id.get_recv_comp(WAIT).unwrap();
    assert_eq!(wc.status, WcStatus::Success);
    id.post_send(2, &msgs, 0..wc.byte_len as usize, SendFlags::SIGNALED).unwrap();
    assert_eq!(id.get_send_comp(WAIT).unwrap().status, WcStatus::Success);
    ch.expect(CmEventKind::Disconnected, WAIT).unwrap();
    assert_eq!(id.qp().unwrap().state(), Some(QpState::Err));
    id.disconnect().unwrap(); // the DREP, as rdma_disconnect after DISCONNECTED
    say("SERVER done");
}

/// A server that accepts one connection, then exits with it open (softrdma's `atexit`
/// handler destroys the IDs); or, with `drop_first`, drops every handle first and returns
/// from `main` at once, the DREQ it never saw coming in meanwhile or not.
fn cm_server_exits(drop_first: bool) {
    let (ch, listen, id, ()) = accept_one(|_| ());
    say("GONE");
    if drop_first {
        drop((id, listen, ch));
        return;
    }
    std::process::exit(0);
}

/// A server that lets go of everything and exits as soon as its peer disconnects, as
/// `rdma_server`-like programs return from `main`: the DREP owed goes out on the way out
/// (with the ID's burial, or at the exit).
fn cm_server_exits_on_disconnect() {
    let service: u16 = env("SOFTRDMA_TEST_SERVICE").parse().unwrap();
    let port: u16 = env("SOFTRDMA_TEST_PORT").parse().unwrap();
    let options = ContextOptions { port, cm_response_timeout: 14, ..ContextOptions::default() };
    let at = std::net::SocketAddr::from(([127, 0, 0, 1], service));
    let listen = CmEndpoint::listen_on(at, QpType::Rc, cm_cap(), options, 4, WAIT).unwrap();
    say("LISTENING");
    let (ep, _request) = listen.get_request().unwrap();
    ep.accept(&ConnParam::default()).unwrap();
    let ev = ep.next_event().unwrap();
    assert_eq!(ev.map(|e| e.kind), Some(CmEventKind::Disconnected));
    drop((ep, listen));
    std::process::exit(0);
}

/// An active side whose connection is established with the `cm-server` role of `role`.
fn connect_to_child(role: &str) -> (ChildProc, EventChannel, CmId) {
    let port = test_port();
    let service = 7000 + (port % 1000);
    let mut env = target_env("127.0.0.1", port, 4096);
    env.push(("SOFTRDMA_TEST_SERVICE", service.to_string()));
    let mut server = ChildProc::spawn(ENTRY, role, &env, None);
    server.expect_line("LISTENING", WAIT);
    let ch = EventChannel::with_options(ContextOptions { port, cm_response_timeout: 14, ..ContextOptions::default() })
        .unwrap();
    let id = ch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    id.resolve_addr(None, std::net::SocketAddr::from(([127, 0, 0, 1], service))).unwrap();
    ch.expect(CmEventKind::AddrResolved, WAIT).unwrap();
    id.resolve_route().unwrap();
    ch.expect(CmEventKind::RouteResolved, WAIT).unwrap();
    let pd = id.context().unwrap().alloc_pd().unwrap();
    id.create_qp(&pd, cm_cap()).unwrap();
    id.connect(&ConnParam::default()).unwrap();
    ch.expect(CmEventKind::Established, WAIT).unwrap();
    (server, ch, id)
}

#[test]
fn a_process_that_exits_with_its_connections_open_disconnects_its_peer() {
    // Dropping the last handles can leave the device's last reference to its progress
    // thread (an event it was delivering): it must send the DREQ on its way out too, hence
    // the rounds.
    let roles = std::iter::once("cm-server-exits").chain(std::iter::repeat_n("cm-server-drops-and-returns", 4));
    for role in roles {
        let (mut server, ch, id) = connect_to_child(role);
        server.expect_line("GONE", WAIT);
        // Without the DREQ nothing would ever tell this side (no keepalive in RC).
        if let Err(e) = ch.expect(CmEventKind::Disconnected, Duration::from_secs(5)) {
            panic!("{role}: no DISCONNECTED: {e}");
        }
        assert_eq!(id.qp().unwrap().state(), Some(QpState::Err), "{role}");
        assert!(server.wait_success(WAIT), "{role}");
    }
}

/// A client whose `disconnect` crosses its peer's exit: the peer's DREP comes, however
/// late in its exit the DREQ reaches it (a server that returned from `main` when the DREQ
/// told it the client was done used to leave the DREQ unanswered now and then, and the
/// client's `disconnect` waited out every retry).
#[test]
fn disconnect_gets_its_drep_from_a_peer_that_exits_on_it() {
    for round in 0..10 {
        let (mut server, ch, id) = connect_to_child("cm-server-exits-on-disconnect");
        let retried = || id.context().unwrap().counters().cm.mads_retried;
        let before = retried();
        id.disconnect().unwrap();
        ch.expect(CmEventKind::Disconnected, WAIT).unwrap();
        // DISCONNECTED also comes once the DREQ's retries run out: the DREP must have come
        // to the first DREQ.
        assert_eq!(retried(), before, "round {round}: the DREQ was sent again: no DREP to the first");
        assert!(server.wait_success(WAIT), "round {round}");
    }
}

#[test]
fn rdma_cm_connects_two_processes_echoes_and_disconnects() {
    let (mut server, ch, id) = connect_to_child("cm-server");
    let msgs = id.reg_msgs(256).unwrap();
    id.post_recv(1, &msgs, 128..256).unwrap();
    msgs.write(0, b"echo me across processes").unwrap();
    id.post_send(2, &msgs, 0..24, SendFlags::SIGNALED).unwrap();
    assert_eq!(id.get_send_comp(WAIT).unwrap().status, WcStatus::Success);
    let wc = id.get_recv_comp(WAIT).unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 24));
    let mut got = [0u8; 24];
    msgs.read(128, &mut got).unwrap();
    assert_eq!(&got, b"echo me across processes");
    id.disconnect().unwrap();
    ch.expect(CmEventKind::Disconnected, WAIT).unwrap();
    server.expect_line("SERVER done", WAIT);
    assert!(server.wait_success(WAIT));
}
