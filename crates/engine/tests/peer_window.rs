//! Many QPs to one peer share that peer's window (`softrdma_engine::window`): one sender
//! streams RDMA WRITEs on 128 RC QPs into a receiver whose switch port buffers 1 MiB (as a
//! receiving socket buffers a few MiB) and drains at a quarter of the sender's link rate.
//! Each QP alone stays within 128 packets, but 128 of them put 64 MiB on the way: the
//! buffer overflows and go-back-N resends whole windows. With a window per peer smaller
//! than the buffer (and smaller than the number of QPs times their own windows), nothing is
//! dropped or resent, and every WRITE completes.

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::*;
use softrdma_sim::{Config, DropReason, Fabric, SwitchPort, Time};

const QPS: usize = 128;
const WRITES_PER_QP: u64 = 16;
const MSG: u32 = 65536;

/// Datagrams dropped at the port, packets resent, WRITEs completed successfully and not.
fn run(peer_window: Option<u32>) -> (u64, u64, u64, u64) {
    let port = SwitchPort { bits_per_sec: 10_000_000_000, buffer_bytes: 1 << 20, ecn: None };
    let config = Config {
        latency: Duration::from_micros(2),
        bandwidth_bits_per_sec: Some(40_000_000_000),
        switch: Some(port),
        ..Config::default()
    };
    let mut sim = Fabric::with_config(0x9e7, config);
    let cap = QpCap { max_send_wr: 32, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let tweak = |c: &mut DeviceConfig| c.peer_window = peer_window;
    let mut sender = node_configured([10, 0, 0, 1], 1, QpType::Rc, cap, &tweak);
    let mut receiver = node_configured([10, 0, 0, 2], 2, QpType::Rc, cap, &tweak);
    let init = QpInitAttr { cap, ..init_attr(&sender, QpType::Rc) };
    let mut qps = Vec::new();
    for _ in 0..QPS {
        let ours = sender.engine.create_qp(&init).unwrap();
        let r_init = QpInitAttr { cap, ..init_attr(&receiver, QpType::Rc) };
        let theirs = connect_another(&mut receiver, &r_init, (ours, sender.addr), Mtu::Mtu4096);
        let saved = std::mem::replace(&mut sender.qp, ours);
        connect(&mut sender, theirs, receiver.addr, QpType::Rc, Mtu::Mtu4096, &|_| {});
        sender.qp = saved;
        qps.push(ours);
    }
    let rkey = receiver.mr.rkey;
    for i in 0..WRITES_PER_QP {
        for &q in &qps {
            let sge = Sge { addr: BASE, length: MSG, lkey: sender.mr.lkey };
            let op = SendOp::RdmaWrite { remote_addr: BASE, rkey };
            let wr = SendWr { wr_id: i, op, sg_list: &[sge], flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None };
            sender.engine.post_send(q, &[wr], &sender.mem).unwrap();
        }
    }
    let s = sim.add_node(sender);
    sim.add_node(receiver);
    let (mut ok, mut failed) = (0, 0);
    let deadline = Time::ZERO + Duration::from_secs(5);
    while ok + failed < QPS as u64 * WRITES_PER_QP && sim.now() < deadline && sim.step() {
        let n = sim.node_mut::<Node>(s);
        while let Some(wc) = n.engine.poll_cq(n.cq) {
            if wc.status == WcStatus::Success { ok += 1 } else { failed += 1 }
        }
    }
    let resent = sim.node::<Node>(s).engine.counters().retransmitted_packets;
    (sim.counters().dropped_by(DropReason::PortFull), resent, ok, failed)
}

#[test]
fn qps_to_one_peer_share_a_window_the_receiver_can_hold() {
    let all = QPS as u64 * WRITES_PER_QP;
    let (dropped, resent, ok, failed) = run(None);
    println!("without a peer window: {dropped} dropped, {resent} resent, {ok} WRITEs done, {failed} failed");
    assert!(dropped > 0 && resent > 0, "128 QPs × 128 packets overflow the buffer");
    // 192 packets of 4 KiB and their headers: under the 1 MiB buffer.
    let (dropped, resent, ok, failed) = run(Some(192));
    println!("with a window of 192 packets: {dropped} dropped, {resent} resent, {ok} WRITEs done, {failed} failed");
    assert_eq!((ok, failed), (all, 0), "every WRITE succeeds");
    assert_eq!((dropped, resent), (0, 0), "with a window the receiver can hold, nothing is lost");
}
