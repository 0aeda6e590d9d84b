//! Regressions: each test pins a bug the scenario suite found in the engine (against IBTA,
//! rxe, or the verbs man pages) and that is now fixed: UC receives reused after a dropped
//! message, WRs before a bad WR left unsent, LAST_WQE_REACHED and SQ_DRAINED events,
//! query_qp's AV, QP reuse after RESET, SQD retransmission, UD counters, R_Keys checked
//! on every packet so that nothing in flight reaches a region after dereg_mr, and the
//! byte_len of a WRITE_WITH_IMM of several packets.

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::*;
use softrdma_wire::{Gid, Opcode, QKey};

fn state(s: QpState) -> QpAttr {
    QpAttr { qp_state: s, ..QpAttr::default() }
}

// ---- UC: a dropped message must not consume the receive (roce-wire.md §4.7, §6) ---------------

#[test]
fn uc_gap_leaves_the_receive_for_the_next_message() {
    let mut pair = Pair::connected(QpType::Uc, Mtu::Mtu256);
    let first = pattern(768, 3); // FIRST, MIDDLE, LAST
    let second = pattern(100, 99);
    let third = pattern(50, 42);
    pair.a.fill(0, &first);
    pair.a.fill(0x1000, &second);
    pair.a.fill(0x2000, &third);
    pair.b.post_recv(1, 0x8000, 1024);
    pair.b.post_recv(2, 0x9000, 1024);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if p.opcode() == Opcode::UC_SEND_MIDDLE && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let s1 = pair.a.sge(0, 768);
    let s2 = pair.a.sge(0x1000, 100);
    pair.a.post_send(wr(11, SendOp::Send, &[s1]));
    pair.a.post_send(wr(12, SendOp::Send, &[s2]));
    pair.drive();

    // rxe (resp.drop_msg; the WQE stays at the queue head) and rdmavt (RVT_R_REWIND_SGE) both
    // reuse the receive for the next message; no completion reports the lost one.
    let wcs = pair.b.poll_all();
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect::<Vec<_>>(),
        [(1, WcStatus::Success, 100)],
        "the lost message completes nothing; the next one lands in the receive it left"
    );
    assert_eq!(pair.b.read(0x8000, 100), &second[..]);

    let s3 = pair.a.sge(0x2000, 50);
    pair.a.post_send(wr(13, SendOp::Send, &[s3]));
    pair.drive();
    assert_eq!(outcomes(&pair.b.poll_all()), [(2, WcStatus::Success)], "the second receive is still posted");
    assert_eq!(pair.b.read(0x9000, 50), &third[..]);
}

#[test]
fn uc_send_too_long_for_the_receive_is_dropped_without_consuming_it() {
    let mut pair = Pair::connected(QpType::Uc, Mtu::Mtu1024);
    pair.a.fill(0, &pattern(64, 1));
    pair.a.fill(0x100, b"fits");
    pair.b.post_recv(1, 0x8000, 16);
    let long = pair.a.sge(0, 64);
    pair.a.post_send(wr(1, SendOp::Send, &[long]));
    pair.drive();
    // rxe_resp.c RESPST_ERR_LENGTH, UC without SRQ: "class D", drop_msg, no completion.
    assert_eq!(pair.b.poll_all(), [], "dropped silently");

    let short = pair.a.sge(0x100, 4);
    pair.a.post_send(wr(2, SendOp::Send, &[short]));
    pair.drive();
    assert_eq!(outcomes(&pair.b.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x8000, 4), b"fits");
}

// ---- post_send: WRs before *bad_wr are posted, and must be sent ------------------------------

#[test]
fn wrs_before_a_bad_wr_are_sent_without_another_post() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.drive(); // an idle QP: nothing left in the transmit round-robin
    pair.b.post_recv(1, 0x1000, 64);
    let good = [pair.a.sge(0, 8)];
    let five = [pair.a.sge(0, 8); 5]; // max_send_sge is 4
    let err = pair
        .a
        .try_post_send(&[wr(0, SendOp::Send, &good), wr(1, SendOp::Send, &five), wr(2, SendOp::Send, &good)])
        .unwrap_err();
    assert_eq!(err.index, 1);
    pair.drive();
    assert_eq!(pair.opcodes(true), [Opcode::RC_SEND_ONLY], "WR 0 was posted: it must go out");
    assert_eq!(outcomes(&pair.a.poll_all()), [(0, WcStatus::Success)]);
}

#[test]
fn wrs_before_a_full_send_queue_are_sent() {
    let cap = QpCap { max_send_wr: 2, ..QpCap::default() };
    let mut pair = Pair::connected_with(QpType::Rc, Mtu::Mtu1024, cap);
    pair.drive(); // an idle QP: nothing left in the transmit round-robin
    pair.b.post_recv(1, 0x1000, 64);
    pair.b.post_recv(2, 0x2000, 64);
    let sge = [pair.a.sge(0, 8)];
    let list = [0, 1, 2].map(|i| wr(i, SendOp::Send, &sge));
    assert_eq!(pair.a.try_post_send(&list).unwrap_err().index, 2);
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(0, WcStatus::Success), (1, WcStatus::Success)]);
}

// ---- SRQ: IBV_EVENT_QP_LAST_WQE_REACHED on every way into ERR --------------------------------

#[test]
fn modify_to_err_raises_last_wqe_reached_for_a_qp_with_an_srq() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let srq = pair.b.engine.create_srq(pair.b.pd, 8, 1).unwrap();
    let a_init = init_attr(&pair.a, QpType::Rc);
    let b_init = QpInitAttr { srq: Some(srq), ..init_attr(&pair.b, QpType::Rc) };
    let (_, b1) = pair.add_connected(&a_init, &b_init, Mtu::Mtu1024);
    pair.b.engine.modify_qp(b1, &state(QpState::Err), AttrMask::STATE).unwrap();
    assert_eq!(pair.b.events(), [Event::Async(AsyncEvent::QpLastWqeReached(b1))]);
}

// ---- query_qp ----------------------------------------------------------------------------------

#[test]
fn query_qp_returns_the_address_vector() {
    let pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let (attr, _) = pair.a.engine.query_qp(pair.a.qp).unwrap();
    let av = attr.ah_attr.expect("IBV_QP_AV was set on INIT→RTR");
    assert_eq!(av.dgid, Gid::from_ip(pair.b.addr));
    assert_eq!(av.hop_limit, 64);
}

// ---- RESET: a QP may be connected again --------------------------------------------------------

#[test]
fn qp_reset_and_connected_again_sends() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x1000, 64);
    pair.b.post_recv(2, 0x2000, 64);
    pair.a.fill(0, b"one");
    pair.a.fill(0x10, b"two");
    let one = pair.a.sge(0, 3);
    pair.a.post_send(wr(1, SendOp::Send, &[one]));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);

    // Both sides go through RESET and are connected afresh, as rdma_cm does on reconnect.
    for n in [&mut pair.a, &mut pair.b] {
        n.engine.modify_qp(n.qp, &state(QpState::Reset), AttrMask::STATE).unwrap();
    }
    let (aq, bq, aa, ba) = (pair.a.qp, pair.b.qp, pair.a.addr, pair.b.addr);
    connect(&mut pair.a, bq, ba, QpType::Rc, Mtu::Mtu1024, &|_| {});
    connect(&mut pair.b, aq, aa, QpType::Rc, Mtu::Mtu1024, &|_| {});
    pair.b.post_recv(3, 0x3000, 64);
    let two = pair.a.sge(0x10, 3);
    pair.a.post_send(wr(2, SendOp::Send, &[two]));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(2, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x3000, 3), b"two");
}

// ---- SQD -----------------------------------------------------------------------------------------

#[test]
fn sqd_with_notify_raises_sq_drained() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x1000, 64);
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive_for(Duration::from_nanos(1)); // sent, not yet acknowledged
    let sqd = QpAttr { qp_state: QpState::Sqd, en_sqd_async_notify: true, ..QpAttr::default() };
    pair.a.engine.modify_qp(pair.a.qp, &sqd, AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY).unwrap();
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(pair.a.events(), [Event::Async(AsyncEvent::SqDrained(pair.a.qp))], "IBA 11.6.3: SQ drained");
}

#[test]
fn sqd_still_retransmits_a_message_it_had_started() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x1000, 64);
    pair.a.fill(0, b"lost once");
    let mut dropped = false;
    pair.set_filter(move |p| {
        if p.from_a && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let sge = pair.a.sge(0, 9);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive_for(Duration::from_nanos(1)); // sent and lost
    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Sqd), AttrMask::STATE).unwrap();
    pair.drive();
    // SQD stops new WQEs; one already on the wire must still finish, retransmissions included.
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x1000, 9), b"lost once");
}

// ---- counters ------------------------------------------------------------------------------------

#[test]
fn ud_packet_with_a_wrong_qkey_is_not_counted_as_accepted() {
    let mut pair = Pair::connected(QpType::Ud, Mtu::Mtu4096);
    let ah = pair.a.ah_to(pair.b.addr);
    let dest = UdDest { ah, remote_qpn: pair.b.qp, remote_qkey: QKey(0x2222_2222) };
    pair.b.post_recv(1, 0x1000, 128);
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(ud_send(1, SendOp::Send, &[sge], dest));
    pair.drive();
    let c = pair.b.engine.counters();
    // rxe counts RCVD_PKTS only after check_keys; Counters::rcvd_packets says "received and accepted".
    assert_eq!((c.rcvd_packets, c.rcvd_dropped), (0, 1));
}

// ---- dereg_mr: "nothing in flight can reach the memory once this returns" (engine.rs) ----------

#[test]
fn write_packets_after_dereg_mr_do_not_reach_the_region() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu256);
    let region = pair.b.addr_of(0x10000);
    let keys = pair.b.engine.reg_mr(pair.b.pd, region, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let data = pattern(768, 7); // FIRST, MIDDLE, LAST
    pair.a.fill(0, &data);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if p.opcode() == Opcode::RC_RDMA_WRITE_MIDDLE && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let sge = pair.a.sge(0, 768);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: region, rkey: keys.rkey }, &[sge]));
    pair.drive_for(Duration::from_micros(3)); // FIRST landed; LAST came early and was NAKed
    assert_eq!(pair.b.read(0x10000, 256), &data[..256]);

    pair.b.engine.dereg_mr(keys.lkey).unwrap();
    pair.drive(); // MIDDLE and LAST are resent after the NAK
    assert!(pair.b.read(0x10100, 512).iter().all(|&x| x == 0), "the deregistered region was written");
    assert_ne!(pair.a.poll().unwrap().status, WcStatus::Success);
}

#[test]
fn read_responses_stop_at_dereg_mr() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu256);
    let region = pair.b.addr_of(0x10000);
    let keys = pair.b.engine.reg_mr(pair.b.pd, region, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    pair.b.fill(0x10000, &pattern(1024, 5));
    let dst = pair.a.sge(0x2000, 1024);
    pair.a.post_send(wr(1, SendOp::RdmaRead { remote_addr: region, rkey: keys.rkey }, &[dst]));

    // Step by hand: the READ request reaches b, b sends its first response, then b deregisters.
    let mut buf = vec![0u8; 4200];
    let (a, b) = (&mut pair.a, &mut pair.b);
    let t = a.engine.poll_transmit(Instant::ZERO, &mut a.mem, &mut buf).unwrap();
    b.engine.handle_datagram(Instant::ZERO, &t.envelope, &buf[..t.len], &mut b.mem);
    let t = b.engine.poll_transmit(Instant::ZERO, &mut b.mem, &mut buf).unwrap();
    assert_eq!(
        softrdma_wire::RocePacket::new_checked(&buf[..t.len]).unwrap().bth().opcode(),
        Opcode::RC_RDMA_READ_RESPONSE_FIRST
    );
    b.engine.dereg_mr(keys.lkey).unwrap();
    let mut after = Vec::new();
    while let Some(t) = b.engine.poll_transmit(Instant::ZERO, &mut b.mem, &mut buf) {
        after.push(softrdma_wire::RocePacket::new_checked(&buf[..t.len]).unwrap().bth().opcode());
    }
    assert!(
        !after.iter().any(|o| *o == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE || *o == Opcode::RC_RDMA_READ_RESPONSE_LAST),
        "response data read from a deregistered MR: {after:?}"
    );
}

// ---- RC: a NAK that advances renews the retry budget (found over veth with 5 % loss) ------

#[test]
fn sequence_naks_that_make_progress_never_exhaust_retry_cnt() {
    // retry_cnt 1: two sequence NAKs without progress would fail the QP. Every window here
    // loses a packet, so every round ends in a NAK, yet each NAK acknowledges more data.
    let cap = QpCap { max_send_wr: 64, ..QpCap::default() };
    let mut pair = Pair::connected_tweaked(QpType::Rc, Mtu::Mtu256, cap, &|a| a.retry_cnt = 1);
    let data = pattern(16 * 256, 5);
    pair.a.fill(0, &data);
    let mut n = 0u32;
    pair.set_filter(move |p| {
        if p.opcode() == Opcode::RC_RDMA_WRITE_MIDDLE {
            n += 1;
            return n % 7 != 0; // every 7th MIDDLE packet is lost
        }
        true
    });
    for i in 0..20 {
        let s = pair.a.sge(0, data.len() as u32);
        let op = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0x1_0000 + i * 0x1000), rkey: pair.b.mr.rkey };
        pair.a.post_send(wr(i, op, &[s]));
    }
    pair.drive();
    let wcs = pair.a.poll_all();
    assert_eq!(wcs.len(), 20);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{:?}", outcomes(&wcs));
    for i in 0..20 {
        assert_eq!(pair.b.read(0x1_0000 + i * 0x1000, data.len()), &data[..]);
    }
    assert!(pair.a.engine.counters().naks_rcvd >= 3, "the losses were recovered by sequence NAKs");
}

// ---- RC: a duplicate READ replaces the response still streaming (rxe duplicate_request) --

#[test]
fn duplicate_read_request_restarts_the_response_instead_of_queueing_another() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu256);
    let n = 32u32;
    pair.b.fill(0x4000, &pattern(n as usize * 256, 9));
    let s = pair.a.sge(0, n * 256);
    let op = SendOp::RdmaRead { remote_addr: pair.b.addr_of(0x4000), rkey: pair.b.mr.rkey };
    pair.a.post_send(wr(1, op, &[s]));
    let mut buf = vec![0u8; 4200];
    let now = Instant::ZERO;
    let t = pair.a.engine.poll_transmit(now, &mut pair.a.mem, &mut buf).expect("the READ request");
    let (envelope, request) = (t.envelope, buf[..t.len].to_vec());
    let b = &mut pair.b;
    b.engine.handle_datagram(now, &envelope, &request, &mut b.mem);
    let mut psns = Vec::new();
    let mut poll = |b: &mut Node, psns: &mut Vec<u32>, limit: usize| {
        for _ in 0..limit {
            let Some(t) = b.engine.poll_transmit(now, &mut b.mem, &mut buf) else { break };
            psns.push(softrdma_wire::RocePacket::new_checked(&buf[..t.len]).unwrap().bth().psn().value());
        }
    };
    poll(b, &mut psns, 5); // five responses leave; the rest of the stream is still queued
    // The requester lost response 2 and asks again for the rest (IBA 9.7.5.1.5).
    let repr =
        softrdma_wire::RoceRepr::parse(&softrdma_wire::RocePacket::new_checked(&request[..]).unwrap(), &envelope)
            .unwrap();
    let first = repr.bth.psn;
    let mut again = repr;
    again.bth.psn = first.wrapping_add(2);
    let reth = repr.ext.reth.unwrap();
    again.ext.reth = Some(softrdma_wire::RethRepr {
        virtual_address: reth.virtual_address + 512,
        dma_length: reth.dma_length - 512,
        ..reth
    });
    let mut dup = vec![0u8; again.buffer_len()];
    again.emit(&envelope, &mut dup).unwrap();
    b.engine.handle_datagram(now, &envelope, &dup, &mut b.mem);
    poll(b, &mut psns, 1000);
    let expect: Vec<u32> = (0..5).chain(2..n).map(|k| first.wrapping_add(k).value()).collect();
    assert_eq!(psns, expect, "the old stream stops where the replay starts");
}

// ---- WRITE_WITH_IMM: byte_len is the message's length, whatever its packets ------------------

#[test]
fn a_multi_packet_write_with_immediate_completes_with_the_messages_length() {
    // Only the FIRST packet carries the RETH (and its DMA length); the receive completes at
    // the LAST, which carries the immediate data, and must still say how much was written
    // (rxe: qp->resp.length, from the RETH). It said 0.
    for qp_type in [QpType::Rc, QpType::Uc] {
        let mut pair = Pair::connected(qp_type, Mtu::Mtu256);
        let data = pattern(600, 4); // FIRST, MIDDLE, LAST WITH IMMEDIATE
        pair.a.fill(0, &data);
        pair.b.post_recv(7, 0x9000, 64);
        let op = SendOp::RdmaWriteWithImm { remote_addr: pair.b.addr_of(0x100), rkey: pair.b.mr.rkey, imm: [5; 4] };
        let sge = pair.a.sge(0, 600);
        pair.a.post_send(wr(1, op, &[sge]));
        pair.drive();
        assert_eq!(pair.b.read(0x100, 600), &data[..], "{qp_type}");
        let wc = pair.b.poll().expect("the receive completes");
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data),
            (7, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 600, Some([5; 4])),
            "{qp_type}"
        );
    }
}
