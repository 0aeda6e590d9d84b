//! RC scenarios on a `Pair`, each reading like the protocol.

mod common;

use common::*;
use softrdma_engine::*;
use softrdma_wire::{NakCode, Opcode, Syndrome};

#[test]
fn send_of_three_packets_lands_and_both_sides_complete() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let data = pattern(3000, 7);
    pair.a.fill(0, &data);
    pair.b.post_recv(11, 0x8000, 4096);
    let sge = pair.a.sge(0, 3000);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();

    assert_eq!(pair.opcodes(true), [Opcode::RC_SEND_FIRST, Opcode::RC_SEND_MIDDLE, Opcode::RC_SEND_LAST]);
    assert_eq!(pair.opcodes(false), [Opcode::RC_ACKNOWLEDGE], "one ACK, for the AckReq on the last packet");
    assert_eq!(pair.b.read(0x8000, 3000), &data[..]);
    let recv = pair.b.poll().unwrap();
    assert_eq!((recv.wr_id, recv.status, recv.opcode, recv.byte_len), (11, WcStatus::Success, WcOpcode::Recv, 3000));
    let send = pair.a.poll().unwrap();
    assert_eq!((send.wr_id, send.status, send.opcode), (1, WcStatus::Success, WcOpcode::Send));
    assert_eq!(pair.a.poll(), None);
}

#[test]
fn write_then_read_back() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu256);
    let data = pattern(1000, 3);
    pair.a.fill(0, &data);
    let rkey = pair.b.mr.rkey;
    let remote = pair.b.addr_of(0x4000);
    let src = pair.a.sge(0, 1000);
    let dst = pair.a.sge(0x2000, 1000);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[src]));
    pair.a.post_send(wr(2, SendOp::RdmaRead { remote_addr: remote, rkey }, &[dst]));
    pair.drive();

    assert_eq!(pair.b.read(0x4000, 1000), &data[..]);
    assert_eq!(pair.a.read(0x2000, 1000), &data[..]);
    let wcs = pair.a.poll_all();
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect::<Vec<_>>(),
        [(1, WcStatus::Success, WcOpcode::RdmaWrite), (2, WcStatus::Success, WcOpcode::RdmaRead)]
    );
    // 1000 bytes at MTU 256: WRITE FIRST, 2 MIDDLE, LAST; READ responses FIRST, 2 MIDDLE, LAST.
    let b_sent = pair.opcodes(false);
    assert_eq!(b_sent.iter().filter(|o| o.0 >= 0x0d && o.0 <= 0x10).count(), 4);
    assert!(pair.b.poll().is_none(), "a WRITE completes nothing at the target");
}

#[test]
fn atomics_execute_once_at_the_responder() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.fill(0x100, &5u64.to_ne_bytes());
    let rkey = pair.b.mr.rkey;
    let target = pair.b.addr_of(0x100);
    let r1 = pair.a.sge(0x10, 8);
    let r2 = pair.a.sge(0x18, 8);
    let r3 = pair.a.sge(0x20, 8);
    pair.a.post_send(wr(1, SendOp::FetchAdd { remote_addr: target, rkey, add: 10 }, &[r1]));
    pair.a.post_send(wr(2, SendOp::CompareSwap { remote_addr: target, rkey, compare: 15, swap: 99 }, &[r2]));
    pair.a.post_send(wr(3, SendOp::CompareSwap { remote_addr: target, rkey, compare: 15, swap: 7 }, &[r3]));
    pair.drive();

    assert_eq!(pair.a.read(0x10, 8), 5u64.to_ne_bytes(), "fetch-add returns the old value");
    assert_eq!(pair.a.read(0x18, 8), 15u64.to_ne_bytes(), "the swap saw 15 and stored 99");
    assert_eq!(pair.a.read(0x20, 8), 99u64.to_ne_bytes(), "the second swap saw 99 and did not store");
    assert_eq!(pair.b.read(0x100, 8), 99u64.to_ne_bytes());
    assert_eq!(pair.a.poll_all().len(), 3);
}

#[test]
fn write_with_immediate_consumes_a_receive() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.a.fill(0, b"hello, target");
    pair.b.post_recv(7, 0x9000, 64);
    let rkey = pair.b.mr.rkey;
    let sge = pair.a.sge(0, 13);
    let op = SendOp::RdmaWriteWithImm { remote_addr: pair.b.addr_of(0x100), rkey, imm: [1, 2, 3, 4] };
    pair.a.post_send(wr(1, op, &[sge]));
    pair.drive();
    assert_eq!(pair.b.read(0x100, 13), b"hello, target");
    let wc = pair.b.poll().unwrap();
    assert_eq!((wc.wr_id, wc.opcode, wc.imm_data, wc.byte_len), (7, WcOpcode::RecvRdmaWithImm, Some([1, 2, 3, 4]), 13));
    assert_eq!(pair.b.read(0x9000, 13), &[0; 13], "no data goes to the receive buffer");
}

#[test]
fn receiver_not_ready_then_the_retry_lands() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.a.fill(0, b"hi");
    let sge = pair.a.sge(0, 2);
    pair.a.post_send(wr(1, SendOp::Send, &[sge])); // b has posted no receive yet
    pair.drive_for(std::time::Duration::from_micros(5));
    assert!(matches!(pair.log.last().and_then(|p| p.syndrome()), Some(Syndrome::RnrNak(_))));
    assert_eq!(pair.b.engine.counters().rnr_naks_sent, 1);

    pair.b.post_recv(9, 0x100, 64);
    pair.drive(); // the RNR timer (10 µs) fires, the retry lands
    assert_eq!(pair.b.read(0x100, 2), b"hi");
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::Success);
    assert_eq!(pair.b.poll().unwrap().wr_id, 9);
}

#[test]
fn rnr_retries_exhausted() {
    let mut pair = Pair::connected_tweaked(QpType::Rc, Mtu::Mtu1024, QpCap::default(), &|rts| rts.rnr_retry = 2);
    // RNR_RETRY is settable only on RTR→RTS (IBA o10-...; Linux qp_state_table).
    let again = QpAttr { rnr_retry: 3, ..QpAttr::default() };
    let err = pair.a.engine.modify_qp(pair.a.qp, &again, AttrMask::RNR_RETRY).unwrap_err();
    assert!(err.to_string().contains("IBV_QP_RNR_RETRY"), "{err}");
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.a.post_send(wr(2, SendOp::Send, &[sge]));
    pair.drive();
    let wcs = pair.a.poll_all();
    assert_eq!(wcs.iter().map(|w| w.status).collect::<Vec<_>>(), [WcStatus::RnrRetryExcErr, WcStatus::WrFlushErr]);
    assert_eq!(pair.a.engine.counters().rnr_naks_rcvd, 3, "the first try and two retries");
    assert_eq!(pair.a.engine.qp_state(pair.a.qp), Some(QpState::Err));
}

#[test]
fn lost_middle_packet_is_naked_and_resent_from_there() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu256);
    let data = pattern(1024, 9);
    pair.a.fill(0, &data);
    pair.b.post_recv(1, 0x1000, 1024);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if p.from_a && p.opcode() == Opcode::RC_SEND_MIDDLE && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let sge = pair.a.sge(0, 1024);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();

    assert!(
        pair.log.iter().any(|p| !p.from_a && p.syndrome() == Some(Syndrome::Nak(NakCode::PsnSequenceError))),
        "the responder NAKs the gap"
    );
    assert_eq!(pair.b.read(0x1000, 1024), &data[..]);
    assert_eq!(pair.b.poll().unwrap().byte_len, 1024);
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::Success);
    assert_eq!(pair.b.engine.counters().naks_sent, 1, "one NAK per gap");
    // Go-back-N resends the lost packet and the two after it: three packets resent.
    let sent_by_a = pair.log.iter().filter(|p| p.from_a).count() as u64;
    assert_eq!(pair.a.engine.counters().sent_packets, sent_by_a);
    assert_eq!(pair.a.engine.counters().retransmitted_packets, 3, "every packet of the retry counts");
    assert_eq!(sent_by_a, 4 + 3);
}

#[test]
fn read_response_lost_requester_retries_after_timeout_data_lands_once() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let data = pattern(100, 1);
    pair.b.fill(0x300, &data);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if !p.from_a && p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let dst = pair.a.sge(0x40, 100);
    pair.a.post_send(wr(5, SendOp::RdmaRead { remote_addr: pair.b.addr_of(0x300), rkey: pair.b.mr.rkey }, &[dst]));
    pair.drive();
    assert_eq!(pair.a.engine.counters().ack_timeouts, 1);
    assert_eq!(pair.b.engine.counters().duplicate_requests, 1, "the retry is a duplicate READ, answered again");
    assert_eq!(pair.a.engine.counters().retransmitted_packets, 1, "the READ request, once");
    assert_eq!(pair.a.read(0x40, 100), &data[..]);
    assert_eq!(pair.a.poll_all().len(), 1);
}

#[test]
fn a_sequence_nak_past_a_read_whose_answer_was_lost_retries_the_read() {
    // The READ's response is lost and so is the middle of the SEND after it: the
    // responder NAKs the gap, a PSN past the READ. The requester must go back to the READ
    // (its answer never came), not to the NAKed PSN; had it moved its acknowledged PSN past
    // the READ, the READ's answer would look stale when it came, and the READ would be
    // asked for until the retries ran out (RETRY_EXC_ERR).
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu256);
    let data = pattern(100, 5);
    pair.b.fill(0x300, &data);
    pair.b.post_recv(1, 0x1000, 1024);
    let mut dropped = [false; 2];
    pair.set_filter(move |p| match p.opcode() {
        Opcode::RC_RDMA_READ_RESPONSE_ONLY => std::mem::replace(&mut dropped[0], true),
        Opcode::RC_SEND_MIDDLE => std::mem::replace(&mut dropped[1], true),
        _ => true,
    });
    let dst = pair.a.sge(0x40, 100);
    pair.a.post_send(wr(1, SendOp::RdmaRead { remote_addr: pair.b.addr_of(0x300), rkey: pair.b.mr.rkey }, &[dst]));
    let sge = pair.a.sge(0x1000, 768);
    pair.a.post_send(wr(2, SendOp::Send, &[sge]));
    pair.drive();
    assert!(pair.log.iter().any(|p| p.syndrome() == Some(Syndrome::Nak(NakCode::PsnSequenceError))));
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(pair.a.read(0x40, 100), &data[..]);
    assert_eq!(pair.a.engine.counters().ack_timeouts, 0, "the NAK started the retry, no timer had to");
    assert_eq!(outcomes(&pair.b.poll_all()), [(1, WcStatus::Success)]);
}

#[test]
fn atomic_ack_lost_the_retry_is_answered_not_re_executed() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if !p.from_a && p.opcode() == Opcode::RC_ATOMIC_ACKNOWLEDGE && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let r = pair.a.sge(0, 8);
    pair.a.post_send(wr(
        1,
        SendOp::FetchAdd { remote_addr: pair.b.addr_of(0x800), rkey: pair.b.mr.rkey, add: 1 },
        &[r],
    ));
    pair.drive();
    assert_eq!(pair.b.read(0x800, 8), 1u64.to_ne_bytes(), "added once, not twice");
    assert_eq!(pair.a.read(0, 8), 0u64.to_ne_bytes(), "the answer is the original value");
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::Success);
}

#[test]
fn a_nak_past_a_read_whose_answer_was_lost_is_not_the_reads_error() {
    // The READ executed at B, its response was lost, and the WRITE after it broke a rule:
    // B NAKs the WRITE and goes to the error state. The NAK says nothing of the READ's
    // data, which A never got: A asks for it again (rxe's completer too), B no longer
    // answers, and the READ ends in RETRY_EXC_ERR, not in the WRITE's REM_ACCESS_ERR.
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.set_filter(|p| p.from_a || p.opcode() != Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    let dst = pair.a.sge(0x40, 100);
    pair.a.post_send(wr(1, SendOp::RdmaRead { remote_addr: pair.b.addr_of(0x300), rkey: pair.b.mr.rkey }, &[dst]));
    let sge = pair.a.sge(0, 8);
    let bad = softrdma_wire::RKey(pair.b.mr.rkey.0 ^ 1);
    pair.a.post_send(wr(2, SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: bad }, &[sge]));
    pair.drive();
    assert!(pair.log.iter().any(|p| p.syndrome() == Some(Syndrome::Nak(NakCode::RemoteAccessError))));
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
    assert!(pair.a.engine.counters().ack_timeouts > 0);
}

#[test]
fn wrong_rkey_is_a_remote_access_error_and_memory_is_untouched() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.a.fill(0, &[0xee; 64]);
    let before = pair.b.mem.clone();
    let bad = softrdma_wire::RKey(pair.b.mr.rkey.0 ^ 1);
    let sge = pair.a.sge(0, 64);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: bad }, &[sge]));
    pair.a.post_send(wr(2, SendOp::Send, &[sge]));
    pair.drive();
    assert!(pair.log.iter().any(|p| p.syndrome() == Some(Syndrome::Nak(NakCode::RemoteAccessError))));
    let wcs = pair.a.poll_all();
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(pair.b.mem, before, "not one byte of target memory changed");
    assert_eq!(pair.b.engine.qp_state(pair.b.qp), Some(QpState::Err));
    assert_eq!(pair.b.engine.poll_event(), Some(Event::Async(AsyncEvent::QpAccessError(pair.b.qp))));
    assert_eq!(pair.b.engine.counters().resp_remote_access_errors, 1);
}

#[test]
fn write_outside_the_region_or_without_rights_is_refused() {
    for case in 0..3 {
        let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
        let before = pair.b.mem.clone();
        let (remote, rkey) = match case {
            // One byte past the end of the MR.
            0 => (pair.b.addr_of(MEM_LEN as u64 - 8), pair.b.mr.rkey),
            // A region registered without REMOTE_WRITE.
            1 => {
                let keys =
                    pair.b.engine.reg_mr(pair.b.pd, BASE, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
                (BASE, keys.rkey)
            }
            // A region of another PD.
            _ => {
                let pd = pair.b.engine.alloc_pd();
                (BASE, pair.b.engine.reg_mr(pd, BASE, 4096, Access::ALL).unwrap().rkey)
            }
        };
        let sge = pair.a.sge(0, 9);
        pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[sge]));
        pair.drive();
        assert_eq!(pair.a.poll().unwrap().status, WcStatus::RemAccessErr, "case {case}");
        assert_eq!(pair.b.mem, before, "case {case}: memory changed");
    }
}

/// A local error the requester finds in a WQE while an earlier one waits for its ACK
/// belongs to the WQE that caused it: the earlier completes as its ACK says, the failing
/// one with the error, the rest flushed, in order (rxe: the requester marks the WQE, the
/// completer fails the QP when it reaches it). It was the earlier WRITE, already
/// delivered, that completed with the error, and the one that caused it was flushed.
#[test]
fn a_local_error_behind_a_message_in_flight_completes_the_request_that_caused_it() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.a.fill(0, &pattern(3000, 4));
    let (remote, rkey) = (pair.b.addr_of(0x1000), pair.b.mr.rkey);
    let good = pair.a.sge(0, 3000);
    let bad = Sge { addr: BASE, length: 8, lkey: LKey(pair.a.mr.lkey.0 ^ 0x100) };
    let write = SendOp::RdmaWrite { remote_addr: remote, rkey };
    pair.a.post_send(wr(1, write, &[good]));
    pair.a.post_send(wr(2, write, &[bad]));
    pair.a.post_send(wr(3, write, &[good]));
    pair.drive();
    let wcs: Vec<_> = pair.a.poll_all().iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(wcs, [(1, WcStatus::Success), (2, WcStatus::LocProtErr), (3, WcStatus::WrFlushErr)]);
    assert_eq!(pair.b.read(0x1000, 3000), pattern(3000, 4), "the first WRITE landed");
    assert_eq!(pair.a.engine.qp_state(pair.a.qp), Some(QpState::Err));
    assert_eq!(pair.opcodes(true).len(), 3, "the first WRITE's three packets, nothing of the third");
}

#[test]
fn bad_lkey_is_a_local_protection_error() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let sge = Sge { addr: BASE, length: 8, lkey: LKey(pair.a.mr.lkey.0 ^ 0x100) };
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::LocProtErr);
    assert!(pair.log.is_empty(), "nothing was sent");
}

#[test]
fn peer_gone_retries_exhausted() {
    let mut pair = Pair::connected_tweaked(QpType::Rc, Mtu::Mtu1024, QpCap::default(), &|rts| rts.retry_cnt = 3);
    pair.set_filter(|p| !p.from_a); // everything a sends is lost
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::RetryExcErr);
    assert_eq!(pair.a.engine.counters().ack_timeouts, 4, "the first try and three retries");
    assert_eq!(pair.log.len(), 4);
}

#[test]
fn inline_data_is_copied_at_post_time() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x100, 64);
    pair.a.fill(0, b"inline!");
    // An lkey of 0: inline data needs no registration (rdma_post_write(3)).
    let sge = Sge { addr: BASE, length: 7, lkey: LKey(0) };
    let w = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &[sge],
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        ud: None,
        xrc_srqn: None,
    };
    pair.a.engine.post_send(pair.a.qp, &[w], &pair.a.mem).unwrap();
    pair.a.fill(0, b"changed"); // the buffer is reusable at once
    pair.drive();
    assert_eq!(pair.b.read(0x100, 7), b"inline!");
}

#[test]
fn psns_wrap_past_2_pow_24() {
    // The harness starts every QP at PSN 0xfffffe: ten messages cross the wrap.
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu256);
    for i in 0..10 {
        pair.b.post_recv(i, 0x1000 * i, 600);
    }
    let sge = pair.a.sge(0, 600);
    for i in 0..10 {
        pair.a.post_send(wr(i, SendOp::Send, &[sge]));
    }
    pair.drive();
    assert_eq!(pair.a.poll_all().len(), 10);
    assert_eq!(pair.b.poll_all().len(), 10);
    assert!(pair.log.iter().any(|p| p.psn().value() == 0xffffff) && pair.log.iter().any(|p| p.psn().value() == 2));
}

#[test]
fn thousands_of_qps_each_deliver_their_message() {
    const QPS: usize = 3000;
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let (ai, bi) = (init_attr(&pair.a, QpType::Rc), init_attr(&pair.b, QpType::Rc));
    let big_cq = |n: &mut Node| n.engine.create_cq(2 * QPS as u32).unwrap();
    let (acq, bcq) = (big_cq(&mut pair.a), big_cq(&mut pair.b));
    let ai = QpInitAttr { send_cq: acq, recv_cq: acq, ..ai };
    let bi = QpInitAttr { send_cq: bcq, recv_cq: bcq, ..bi };
    let qps: Vec<_> = (0..QPS).map(|_| pair.add_connected(&ai, &bi, Mtu::Mtu1024)).collect();
    for (i, &(aq, bq)) in qps.iter().enumerate() {
        let r = pair.b.sge(0x1000 + 8 * i as u64, 8);
        pair.b.engine.post_recv(bq, &[RecvWr { wr_id: i as u64, sg_list: &[r] }]).unwrap();
        pair.a.fill(0x8_0000 + 8 * i as u64, &(i as u64).to_le_bytes());
        let s = pair.a.sge(0x8_0000 + 8 * i as u64, 8);
        pair.a.engine.post_send(aq, &[wr(i as u64, SendOp::Send, &[s])], &pair.a.mem).unwrap();
    }
    pair.drive();
    let sent = std::iter::from_fn(|| pair.a.engine.poll_cq(acq)).filter(|w| w.status == WcStatus::Success).count();
    let got = std::iter::from_fn(|| pair.b.engine.poll_cq(bcq)).filter(|w| w.status == WcStatus::Success).count();
    assert_eq!((sent, got), (QPS, QPS));
    for i in 0..QPS {
        assert_eq!(pair.b.read(0x1000 + 8 * i as u64, 8), (i as u64).to_le_bytes(), "QP {i}");
    }
}

#[test]
fn acks_coalesce_when_the_responder_is_behind() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    for i in 0..5 {
        pair.b.post_recv(i, 0x100 * i, 64);
    }
    let sge = pair.a.sge(0, 8);
    for i in 0..5 {
        pair.a.post_send(wr(i, SendOp::Send, &[sge]));
    }
    pair.drive();
    // Five AckReq'd SENDs arrive together; the responder answers the newest PSN only.
    assert_eq!(pair.opcodes(false), [Opcode::RC_ACKNOWLEDGE]);
    assert_eq!(pair.a.poll_all().len(), 5, "one cumulative ACK completes all five");
}

#[test]
fn lost_ack_is_implied_by_the_next_read_response() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x100, 64);
    pair.set_filter(|p| p.opcode() != Opcode::RC_ACKNOWLEDGE); // every ACK is lost
    let s = pair.a.sge(0, 8);
    let d = pair.a.sge(0x40, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[s]));
    pair.a.post_send(wr(2, SendOp::RdmaRead { remote_addr: pair.b.addr_of(0x200), rkey: pair.b.mr.rkey }, &[d]));
    pair.drive();
    let wcs = pair.a.poll_all();
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(pair.a.engine.counters().ack_timeouts, 0, "the READ response acknowledged the SEND");
}

#[test]
fn duplicate_send_is_re_acked_and_delivered_once() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x100, 64);
    pair.b.post_recv(2, 0x200, 64);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if p.opcode() == Opcode::RC_ACKNOWLEDGE && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    pair.a.fill(0, b"once");
    let s = pair.a.sge(0, 4);
    pair.a.post_send(wr(1, SendOp::Send, &[s]));
    pair.drive();
    assert_eq!(pair.a.engine.counters().ack_timeouts, 1, "the ACK was lost, the SEND went again");
    assert_eq!(pair.b.engine.counters().duplicate_requests, 1);
    assert_eq!(pair.b.poll_all().len(), 1, "delivered once; the second receive is still posted");
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::Success);
}

#[test]
fn local_ack_timeout_is_4_096_us_times_2_pow_timeout() {
    // timeout 10: 4.096 µs × 1024 = 4.194304 ms between tries.
    let mut pair = Pair::connected_tweaked(QpType::Rc, Mtu::Mtu1024, QpCap::default(), &|rts| {
        rts.timeout = 10;
        rts.retry_cnt = 2;
    });
    pair.set_filter(|p| !p.from_a);
    let s = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[s]));
    pair.drive();
    let sent: Vec<u64> = pair.log.iter().map(|p| p.at.as_nanos()).collect();
    assert_eq!(sent, [0, 4_194_304, 2 * 4_194_304]);
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::RetryExcErr);
    assert!(pair.now.as_nanos() >= 3 * 4_194_304, "the error came after the third timeout");
}

#[test]
fn rnr_nak_carries_the_min_rnr_timer_and_the_retry_waits_that_long() {
    // The harness sets min_rnr_timer 1 (10 µs); code 14 is 1.28 ms (IBA Table 45).
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let attr = QpAttr { min_rnr_timer: 14, ..QpAttr::default() };
    let mask = AttrMask::MIN_RNR_TIMER;
    pair.b.engine.modify_qp(pair.b.qp, &attr, mask).unwrap();
    let s = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[s]));
    pair.drive_for(std::time::Duration::from_millis(2));
    let naks: Vec<&Pkt> =
        pair.log.iter().filter(|p| matches!(p.syndrome(), Some(softrdma_wire::Syndrome::RnrNak(_)))).collect();
    assert!(matches!(naks[0].syndrome(), Some(softrdma_wire::Syndrome::RnrNak(t)) if t.code() == 14));
    let sends: Vec<u64> = pair.log.iter().filter(|p| p.from_a).map(|p| p.at.as_nanos()).collect();
    // First try at 0; the NAK arrives after two 2 µs hops; the retry waits 1.28 ms from then.
    assert_eq!(sends[..2], [0, 4_000 + 1_280_000]);
}
