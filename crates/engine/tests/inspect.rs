//! The engine's read-only snapshots (`Engine::qps`, `cqs`, `mrs`, `srqs`, `pds`): what
//! `softrdma res` shows, checked against what the protocol did on a `Pair`.

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::*;

fn qp_info(n: &Node) -> QpInfo {
    n.engine.qps().find(|q| q.qpn == n.qp).expect("the node's QP is listed")
}

#[test]
fn a_connected_rc_qp_shows_its_psns_peer_and_queues() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let (a, b) = (qp_info(&pair.a), qp_info(&pair.b));
    assert_eq!((a.qp_type, a.state), (QpType::Rc, QpState::Rts));
    let peer = a.peer.expect("a connected QP has a peer");
    assert_eq!(peer.qpn, pair.b.qp);
    assert_eq!(peer.gid.to_ip(), pair.b.addr);
    assert_eq!(peer.local_ip, Some(pair.a.addr));
    assert_eq!(peer.udp_port, Some(4791));
    assert_eq!(peer.source_port, None, "no packet from the peer yet");
    assert_eq!((a.pd, a.send_cq, a.recv_cq, a.srq), (pair.a.pd, pair.a.cq, pair.a.cq, None));
    assert_eq!(a.sq_psn, a.unacked_psn, "nothing outstanding");
    assert_eq!(a.rq_psn, b.sq_psn, "each expects what the other sends next");

    // A 3-packet SEND, held on the wire: three packets and one message in flight.
    pair.b.post_recv(11, 0x8000, 4096);
    let sge = pair.a.sge(0, 3000);
    let before = a.sq_psn;
    pair.set_filter(|_| false);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive_for(Duration::from_micros(1));
    let a = qp_info(&pair.a);
    assert_eq!(a.sq_psn, before.wrapping_add(3));
    assert_eq!((a.unacked_psn, a.packets_in_flight, a.messages_in_flight, a.send_queued), (before, 3, 1, 1));
    assert_eq!(qp_info(&pair.b).recv_queued, 1);

    // Lost: the ACK timeout resends them, and the counters say so.
    pair.filter = None;
    pair.drive();
    let (a, b) = (qp_info(&pair.a), qp_info(&pair.b));
    assert_eq!(
        (a.unacked_psn, a.sq_psn, a.packets_in_flight, a.messages_in_flight),
        (a.sq_psn, before.wrapping_add(3), 0, 0)
    );
    assert_eq!(b.rq_psn, a.sq_psn);
    assert_eq!(a.counters.ack_timeouts, 1);
    assert_eq!(a.counters.retransmitted_packets, 3);
    assert_eq!(a.counters, QpCounters { ack_timeouts: 1, retransmitted_packets: 3, ..QpCounters::default() });
    let a_port = pair.log.iter().find(|p| p.from_a).unwrap().envelope.src_port();
    assert_eq!(b.peer.and_then(|p| p.source_port), Some(a_port), "b learnt a's source port");
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::Success);
}

#[test]
fn rnr_naks_count_on_both_qps_and_an_error_shows() {
    let mut pair = Pair::connected_tweaked(QpType::Rc, Mtu::Mtu1024, QpCap::default(), &|rts| rts.rnr_retry = 1);
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge])); // b posts no receive
    pair.drive();
    let (a, b) = (qp_info(&pair.a), qp_info(&pair.b));
    assert_eq!((a.counters.rnr_naks_rcvd, b.counters.rnr_naks_sent), (2, 2), "the first try and one retry");
    assert_eq!((a.rnr_retry, a.state), (1, QpState::Err));
    assert_eq!(pair.a.engine.counters().rnr_naks_rcvd, 2, "the device counts the same");
}

#[test]
fn cqs_mrs_srqs_and_pds_are_listed() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let e = &mut pair.a.engine;
    let srq = e.create_srq(pair.a.pd, 32, 2).unwrap();
    e.arm_srq_limit(srq, 4).unwrap();
    e.req_notify_cq(pair.a.cq, false).unwrap();
    let cqs: Vec<CqInfo> = e.cqs().collect();
    assert_eq!(cqs.len(), 1);
    assert_eq!((cqs[0].cq, cqs[0].queued, cqs[0].armed, cqs[0].users), (pair.a.cq, 0, true, 1));
    let mrs: Vec<MrInfo> = e.mrs().collect();
    assert_eq!(mrs.len(), 1);
    assert_eq!((mrs[0].lkey, mrs[0].rkey, mrs[0].pd), (pair.a.mr.lkey, pair.a.mr.rkey, pair.a.pd));
    assert_eq!((mrs[0].iova, mrs[0].length), (BASE, MEM_LEN as u64));
    let srqs: Vec<SrqInfo> = e.srqs().collect();
    assert_eq!((srqs[0].srq, srqs[0].depth, srqs[0].queued, srqs[0].limit), (srq, 32, 0, 4));
    let pds: Vec<(PdId, u32)> = e.pds().collect();
    assert_eq!(pds, [(pair.a.pd, 3)], "the MR, the QP and the SRQ use it");

    // A completion waits in the CQ until polled.
    pair.b.post_recv(1, 0, 8);
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(pair.a.engine.cqs().next().unwrap().queued, 1);
    assert_eq!(qp_info(&pair.a).sq_psn, qp_info(&pair.b).rq_psn);
}
