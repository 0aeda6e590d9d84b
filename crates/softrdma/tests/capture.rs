//! Packet capture: a device opened with a capture file (or `SOFTRDMA_PCAP`) records every
//! packet it sends and receives, and the file decodes as RoCEv2 with every ICRC valid,
//! by softrdma's own codec and by Wireshark's tshark with nothing malformed.

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
