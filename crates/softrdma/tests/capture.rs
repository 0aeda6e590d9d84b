//! Packet capture: a device opened with a capture file (or `SOFTRDMA_PCAP`) records every
//! packet it sends and receives, and the file decodes as RoCEv2 with every ICRC valid,
//! by softrdma's own codec and by Wireshark's tshark with nothing malformed. Filtered by
//! QP, it keeps only that QP's packets; as a ring, only the last ones, written when the
//! device closes or the process exits, and lost when the process is killed.

// Tests talk to the child processes they start over stdout, and say why they skip.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::net::IpAddr;

use common::*;
use softrdma::*;
use softrdma_wire::Opcode;

/// Runs SEND, WRITE, READ and an atomic between a capturing device and a plain one.
fn traffic(net: u8, capture: Option<std::path::PathBuf>) {
    // Port 4791, so that decoders know the packets for RoCEv2, on addresses of this test's own.
    let port = 4791;
    let mk = |ip: [u8; 4], capture: Option<std::path::PathBuf>| {
        let device = Device::with_addresses("lo", vec![IpAddr::from(ip)]);
        let ctx = device
            .open_with(&ContextOptions { port, capture: capture.map(Into::into), ..ContextOptions::default() })
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
        let mr = pd.reg_mr(16384, Access::ALL).unwrap();
        Side { ctx, pd, cq, qp, mr }
    };
    let a = mk([127, 0, net, 1], capture);
    let b = mk([127, 0, net, 2], None);
    a.qp.connect(1, &b.qp.endpoint(0, 2).unwrap(), &ConnectOptions::default()).unwrap();
    b.qp.connect(2, &a.qp.endpoint(0, 1).unwrap(), &ConnectOptions::default()).unwrap();
    let rsge = [b.mr.sge(0..4096).unwrap()];
    b.qp.post_recv(&[RecvWr { wr_id: 1, sg_list: &rsge }]).unwrap();
    let bm = b.mr.remote(0..16384).unwrap();
    let s = [a.mr.sge(0..9000).unwrap()];
    let s8 = [a.mr.sge(0..8).unwrap()];
    let small = [a.mr.sge(0..4000).unwrap()];
    a.qp.post_send(&[wr(1, SendOp::Send, &small)]).unwrap();
    let ops = [
        SendOp::RdmaWrite { remote_addr: bm.addr + 4096, rkey: bm.rkey },
        SendOp::RdmaRead { remote_addr: bm.addr, rkey: bm.rkey },
        SendOp::FetchAdd { remote_addr: (bm.addr + 15000) & !7, rkey: bm.rkey, add: 1 },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let sg = if op.is_atomic() { &s8[..] } else { &s[..] };
        a.qp.post_send(&[wr(10 + i as u64, op, sg)]).unwrap();
    }
    for wc in a.cq.wait_n(4, WAIT).unwrap() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
}

fn check(path: &std::path::Path) {
    let opcodes = common::assert_clean_capture(path);
    for op in [
        Opcode::RC_SEND_ONLY,
        Opcode::RC_RDMA_WRITE_FIRST,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_FETCH_ADD,
        Opcode::RC_ATOMIC_ACKNOWLEDGE,
        Opcode::RC_ACKNOWLEDGE,
    ] {
        assert!(opcodes.contains(&op), "{op} captured (both directions): {opcodes:?}");
    }
}

#[test]
fn capture_option_records_both_directions_and_decodes_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pcap");
    traffic(9, Some(path.clone()));
    check(&path);
}

/// In a child process (the environment variable is read once per process): traffic with
/// only `SOFTRDMA_PCAP` set.
#[test]
fn child_entry() {
    if std::env::var(common::child::ROLE_ENV).as_deref() == Ok("env-capture") {
        traffic(10, None);
        common::child::say("TRAFFIC done");
    }
}

#[test]
fn softrdma_pcap_environment_variable_captures_a_whole_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("env.pcap");
    let env = [(CAPTURE_ENV, path.display().to_string())];
    let mut child = common::child::ChildProc::spawn("child_entry", "env-capture", &env, None);
    child.expect_line("TRAFFIC done", WAIT);
    assert!(child.wait_success(WAIT));
    check(&path);
}

/// One context with two RC QPs on one CQ and a buffer.
struct Two {
    _ctx: Context,
    _pd: Pd,
    cq: Cq,
    qps: [Qp; 2],
    mr: Mr,
}

/// On port 4791 (so that decoders know the packets for RoCEv2), at an address of the test's.
fn two(ip: [u8; 4], capture: Option<CaptureOptions>) -> Two {
    let device = Device::with_addresses("lo", vec![IpAddr::from(ip)]);
    let ctx = device.open_with(&ContextOptions { port: 4791, capture, ..ContextOptions::default() }).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 256;
    init.cap.max_recv_wr = 256;
    let qps = [pd.create_qp(&init).unwrap(), pd.create_qp(&init).unwrap()];
    let mr = pd.reg_mr(1 << 16, Access::ALL).unwrap();
    Two { _ctx: ctx, _pd: pd, cq, qps, mr }
}

/// Connects QP i of `a` to QP i of `b` (A's PSNs from 100, B's from 5000).
fn connect_pairs(a: &Two, b: &Two) {
    for i in 0..2 {
        a.qps[i].connect(100, &b.qps[i].endpoint(0, 5000).unwrap(), &ConnectOptions::default()).unwrap();
        b.qps[i].connect(5000, &a.qps[i].endpoint(0, 100).unwrap(), &ConnectOptions::default()).unwrap();
    }
}

/// `n` one-packet WRITEs from `from`'s QP `qp` into `to`'s buffer, each waited for.
fn writes(from: &Two, to: &Two, qp: usize, n: u64) {
    let remote = to.mr.remote(0..1 << 16).unwrap();
    let sge = [from.mr.sge(0..512).unwrap()];
    for i in 0..n {
        let op = SendOp::RdmaWrite { remote_addr: remote.addr + (i % 64) * 512, rkey: remote.rkey };
        from.qps[qp].post_send(&[wr(i, op, &sge)]).unwrap();
        assert_eq!(from.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    }
}

/// Each frame of a capture: its BTH's destination QP, opcode and PSN.
fn packets(path: &std::path::Path) -> Vec<(u32, Opcode, u32)> {
    softrdma_pcap::CaptureReader::open(path)
        .unwrap()
        .map(|f| {
            let f = f.unwrap();
            let d = softrdma_wire::DatagramRepr::parse(f.ip_packet().unwrap()).expect("a RoCEv2 datagram");
            (d.roce.bth.dest_qp.value(), d.roce.bth.opcode, d.roce.bth.psn.value())
        })
        .collect()
}

#[test]
fn a_qp_filter_keeps_only_the_packets_of_that_qp() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qp.pcap");
    let b = two([127, 0, 11, 2], None);
    // A captures what concerns B's first QP: A's packets to it, and nothing of the second pair.
    let wanted = Qpn::new(b.qps[0].qpn()).unwrap();
    let options = CaptureOptions { qps: Some([wanted].into()), ..CaptureOptions::new(&path) };
    let a = two([127, 0, 11, 1], Some(options));
    connect_pairs(&a, &b);
    writes(&a, &b, 0, 5);
    writes(&a, &b, 1, 5);
    writes(&b, &a, 0, 3); // B's requests come to A's first QP, which ACKs them to B's
    drop(a);
    let got = packets(&path);
    let writes_seen = got.iter().filter(|p| p.1 == Opcode::RC_RDMA_WRITE_ONLY).count();
    let acks_seen = got.iter().filter(|p| p.1 == Opcode::RC_ACKNOWLEDGE).count();
    assert_eq!(writes_seen, 5, "A's WRITEs to B's first QP, not those to its second: {got:?}");
    assert!(acks_seen >= 1, "A's ACKs to B's WRITEs: {got:?}");
    assert!(got.iter().all(|p| p.0 == wanted.value()), "only packets to {wanted}: {got:?}");
    common::assert_clean_capture(&path);
}

#[test]
fn a_ring_keeps_only_the_last_packets_and_writes_them_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring.pcap");
    let b = two([127, 0, 12, 2], None);
    let options = CaptureOptions { ring: Some(RingSize::Packets(20)), ..CaptureOptions::new(&path) };
    let a = two([127, 0, 12, 1], Some(options));
    connect_pairs(&a, &b);
    writes(&a, &b, 0, 200);
    assert!(packets(&path).is_empty(), "the ring stays in memory while the device is open");
    drop(a);
    let got = packets(&path);
    assert_eq!(got.len(), 20, "{got:?}");
    // The last of A's 200 WRITEs has PSN 100 + 199; the ring holds the newest ones, ending
    // with that WRITE (or its ACK).
    let psns: Vec<u32> = got.iter().filter(|p| p.1 == Opcode::RC_RDMA_WRITE_ONLY).map(|p| p.2).collect();
    assert!(psns.len() >= 9, "{got:?}");
    assert_eq!(*psns.last().unwrap(), 299, "{got:?}");
    assert!(psns.windows(2).all(|w| w[1] == w[0] + 1), "consecutive: {psns:?}");
    common::assert_clean_capture(&path);
}

/// In a child process: `SOFTRDMA_PCAP` with a ring, WRITEs, and an exit that leaves the
/// device open (a program that never closes it); or, for the role "ring-killed", a wait
/// to be killed.
#[test]
fn child_ring_entry() {
    let role = std::env::var(common::child::ROLE_ENV).unwrap_or_default();
    if role == "ring-exit" || role == "ring-killed" {
        let net = if role == "ring-exit" { 13 } else { 14 };
        let b = two([127, 0, net, 2], None);
        let a = two([127, 0, net, 1], None);
        connect_pairs(&a, &b);
        writes(&a, &b, 0, 50);
        common::child::say("TRAFFIC done");
        if role == "ring-killed" {
            let _ = common::child::read_stdin_line();
        }
        std::mem::forget((a, b));
    }
    if role == "bad-ring" {
        match Device::with_addresses("lo", vec![IpAddr::from([127, 0, 15, 1])]).open() {
            Ok(_) => common::child::say("OPENED"),
            Err(e) => common::child::say(&format!("ERROR {e}")),
        }
    }
}

#[test]
fn an_environment_ring_is_written_when_the_process_exits_and_lost_when_it_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    for (role, frames) in [("ring-exit", 10), ("ring-killed", 0)] {
        let path = dir.path().join(format!("{role}.pcap"));
        let env = [(CAPTURE_ENV, path.display().to_string()), (CAPTURE_RING_ENV, "10p".to_string())];
        let mut child = common::child::ChildProc::spawn("child_ring_entry", role, &env, None);
        child.expect_line("TRAFFIC done", WAIT);
        if role == "ring-killed" {
            child.kill();
        } else {
            assert!(child.wait_success(WAIT));
        }
        // Killed, the file holds the pcap header written when the device opened, no packet.
        assert_eq!(packets(&path).len(), frames, "{role}");
    }
}

#[test]
fn a_bad_ring_size_names_the_variable_and_a_good_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("never.pcap").display().to_string();
    let env = [(CAPTURE_ENV, path), (CAPTURE_RING_ENV, "64X".to_string())];
    let mut child = common::child::ChildProc::spawn("child_ring_entry", "bad-ring", &env, None);
    let line = child.expect_line("ERROR", WAIT);
    assert!(line.contains("SOFTRDMA_PCAP_RING=\"64X\""), "{line}");
    assert!(line.contains("for example SOFTRDMA_PCAP_RING=64M"), "{line}");
    assert!(child.wait_success(WAIT));
}
