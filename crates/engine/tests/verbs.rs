//! The verbs' contracts on a `Pair`: posting lists (`*bad_wr`), SRQs, completion events,
//! signaling, fences, the initiator depth, `modify_qp`, the error state, CQ overflow, SQD, and
//! the lifetime of MRs, QPs and PDs.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use softrdma_engine::qp_state::ModifyQpError;
use softrdma_engine::*;
use softrdma_wire::{Gid, NakCode, Opcode, RKey, Syndrome};

/// The RTR attributes `connect` uses for an RC QP talking to `peer_qp` on `peer`.
fn rc_rtr(peer: std::net::IpAddr, peer_qp: softrdma_wire::Qpn) -> (QpAttr, AttrMask) {
    let av = AddressVector { dgid: Gid::from_ip(peer), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(av),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer_qp.value(),
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    let mask = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    (attr, mask)
}

fn to_init() -> (QpAttr, AttrMask) {
    let attr = QpAttr { qp_state: QpState::Init, qp_access_flags: Access::ALL, ..QpAttr::default() };
    (attr, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS)
}

fn state(s: QpState) -> QpAttr {
    QpAttr { qp_state: s, ..QpAttr::default() }
}

// ---- posting lists: ibv_post_recv(3) / ibv_post_send(3) *bad_wr --------------------------------

#[test]
fn post_recv_stops_at_the_bad_wr_and_keeps_the_ones_before_it() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let one = [pair.b.sge(0x1000, 64)];
    let five = [0, 1, 2, 3, 4].map(|i| pair.b.sge(0x2000 + 64 * i, 64)); // max_recv_sge is 4
    let three = [pair.b.sge(0x3000, 64)];
    let list =
        [RecvWr { wr_id: 0, sg_list: &one }, RecvWr { wr_id: 1, sg_list: &five }, RecvWr { wr_id: 2, sg_list: &three }];
    let err = pair.b.engine.post_recv(pair.b.qp, &list).unwrap_err();
    assert_eq!(err.index, 1, "bad_wr is the middle WR");
    assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains("max_recv_sge")), "{err}");

    pair.a.fill(0, b"first");
    pair.a.fill(0x10, b"second");
    let s1 = pair.a.sge(0, 5);
    let s2 = pair.a.sge(0x10, 6);
    pair.a.post_send(wr(10, SendOp::Send, &[s1]));
    pair.a.post_send(wr(11, SendOp::Send, &[s2]));
    pair.drive_for(Duration::from_micros(200));

    assert_eq!(outcomes(&pair.b.poll_all()), [(0, WcStatus::Success)], "WR 0 was posted");
    assert_eq!(pair.b.read(0x1000, 5), b"first");
    assert_eq!(pair.b.read(0x3000, 6), [0; 6], "WR 2 was not posted");
    assert!(pair.b.engine.counters().rnr_naks_sent >= 1, "the second SEND finds no receive");
}

#[test]
fn post_send_stops_at_the_bad_wr_and_keeps_the_ones_before_it() {
    for case in ["too many SGEs", "inline too long", "atomic with a 4-byte buffer"] {
        let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
        for i in 0..4 {
            pair.b.post_recv(i, 0x1000 * (i + 1), 256);
        }
        pair.a.fill(0, &pattern(256, 1));
        let good = [pair.a.sge(0, 8)];
        let five = [pair.a.sge(0, 8); 5]; // max_send_sge is 4
        let long = [Sge { addr: BASE, length: 65, lkey: LKey(0) }]; // max_inline_data is 64
        let small = [pair.a.sge(0x800, 4)];
        let target = pair.b.addr_of(0x100);
        let rkey = pair.b.mr.rkey;
        let (bad, why) = match case {
            "too many SGEs" => (wr(1, SendOp::Send, &five), "max_send_sge"),
            "inline too long" => {
                (wr_with(1, SendOp::Send, &long, SendFlags::SIGNALED | SendFlags::INLINE), "max_inline_data")
            }
            _ => (wr(1, SendOp::FetchAdd { remote_addr: target, rkey, add: 1 }, &small), "8 bytes"),
        };
        let err = pair.a.try_post_send(&[wr(0, SendOp::Send, &good), bad, wr(2, SendOp::Send, &good)]).unwrap_err();
        assert_eq!(err.index, 1, "{case}");
        assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains(why)), "{case}: {err}");

        // found_bugs.rs: WR 0 should go out without this later post.
        pair.a.post_send(wr(3, SendOp::Send, &good));
        pair.drive();
        assert_eq!(
            outcomes(&pair.a.poll_all()),
            [(0, WcStatus::Success), (3, WcStatus::Success)],
            "{case}: WR 0 was posted, WR 2 was not"
        );
        assert_eq!(pair.b.poll_all().len(), 2, "{case}");
        assert_eq!(pair.b.read(0x100, 8), [0; 8], "{case}: no atomic ran");
    }
}

/// As rxe (`rxe_qp_init_req`): a send WQE holds `max_send_sge` SGEs or as many bytes inline,
/// whichever is more, so a QP asked for no inline data sends 16 bytes per SGE inline (and
/// says so: `rdma_xclient` sends 16 inline bytes from a QP created with `max_inline_data` 0).
#[test]
fn inline_room_is_at_least_sixteen_bytes_per_send_sge() {
    let no_inline = QpCap { max_inline_data: 0, max_send_sge: 1, ..QpCap::default() };
    let mut pair = connected_after_setup(QpType::Rc, Mtu::Mtu1024, &|n| {
        n.qp = n.engine.create_qp(&QpInitAttr { cap: no_inline, ..init_attr(n, QpType::Rc) }).unwrap();
    });
    assert_eq!(pair.a.engine.query_qp(pair.a.qp).unwrap().1.max_inline_data, 16);
    let more = QpCap { max_inline_data: 100, max_send_sge: 2, ..QpCap::default() };
    let q = pair.a.engine.create_qp(&QpInitAttr { cap: more, ..init_attr(&pair.a, QpType::Rc) }).unwrap();
    assert_eq!(pair.a.engine.query_qp(q).unwrap().1.max_inline_data, 100, "what was asked, when more");
    pair.b.post_recv(1, 0x1000, 64);
    pair.a.fill(0, b"sixteen inline b");
    let sixteen = [Sge { addr: BASE, length: 16, lkey: LKey(0) }];
    let seventeen = [Sge { addr: BASE, length: 17, lkey: LKey(0) }];
    let inline = SendFlags::SIGNALED | SendFlags::INLINE;
    let err = pair.a.try_post_send(&[wr_with(2, SendOp::Send, &seventeen, inline)]).unwrap_err();
    assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains("max_inline_data = 16")), "{err}");
    pair.a.post_send(wr_with(1, SendOp::Send, &sixteen, inline));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x1000, 16), b"sixteen inline b");
}

#[test]
fn full_receive_queue_refuses_the_wr_that_does_not_fit() {
    let cap = QpCap { max_recv_wr: 2, ..QpCap::default() };
    let mut pair = Pair::connected_with(QpType::Rc, Mtu::Mtu1024, cap);
    let sges = [0, 1, 2].map(|i| [pair.b.sge(0x1000 * (i + 1), 64)]);
    let list = [0, 1, 2].map(|i| RecvWr { wr_id: i as u64, sg_list: &sges[i] });
    let err = pair.b.engine.post_recv(pair.b.qp, &list).unwrap_err();
    assert_eq!(err, PostError { index: 2, kind: PostErrorKind::QueueFull { depth: 2 } });

    let sge = pair.a.sge(0, 8);
    for i in 0..3 {
        pair.a.post_send(wr(10 + i, SendOp::Send, &[sge]));
    }
    pair.drive_for(Duration::from_micros(200));
    assert_eq!(outcomes(&pair.b.poll_all()), [(0, WcStatus::Success), (1, WcStatus::Success)]);
    assert!(pair.b.engine.counters().rnr_naks_sent >= 1, "the third SEND finds the queue empty");
}

#[test]
fn full_send_queue_refuses_the_wr_that_does_not_fit() {
    let cap = QpCap { max_send_wr: 2, ..QpCap::default() };
    let mut pair = Pair::connected_with(QpType::Rc, Mtu::Mtu1024, cap);
    let sge = [pair.a.sge(0, 8)];
    let list = [0, 1, 2].map(|i| wr(i, SendOp::Send, &sge));
    let err = pair.a.try_post_send(&list).unwrap_err();
    assert_eq!(err, PostError { index: 2, kind: PostErrorKind::QueueFull { depth: 2 } });
    // The two before it were posted: they fill the queue.
    let again = pair.a.try_post_send(&[wr(3, SendOp::Send, &sge)]).unwrap_err();
    assert_eq!(again, PostError { index: 0, kind: PostErrorKind::QueueFull { depth: 2 } });
    assert!(again.to_string().contains("poll completions first"), "{again}");
}

#[test]
fn post_recv_to_a_qp_with_an_srq_is_refused_and_names_the_srq_verb() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let srq = pair.b.engine.create_srq(pair.b.pd, 8, 1).unwrap();
    let mut init = init_attr(&pair.b, QpType::Rc);
    init.srq = Some(srq);
    let qp = pair.b.engine.create_qp(&init).unwrap();
    let (attr, mask) = to_init();
    pair.b.engine.modify_qp(qp, &attr, mask).unwrap();
    let sge = [pair.b.sge(0, 64)];
    let err = pair.b.engine.post_recv(qp, &[RecvWr { wr_id: 1, sg_list: &sge }]).unwrap_err();
    assert_eq!(err.index, 0);
    assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains("post_srq_recv")), "{err}");
}

#[test]
fn post_send_before_rts_is_refused() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let qp = pair.a.engine.create_qp(&init_attr(&pair.a, QpType::Rc)).unwrap();
    let sge = [pair.a.sge(0, 8)];
    let (init, init_mask) = to_init();
    let (rtr, rtr_mask) = rc_rtr(pair.b.addr, pair.b.qp);
    for step in [None, Some((init, init_mask)), Some((rtr, rtr_mask))] {
        if let Some((attr, mask)) = step {
            pair.a.engine.modify_qp(qp, &attr, mask).unwrap();
        }
        let err = pair.a.engine.post_send(qp, &[wr(1, SendOp::Send, &sge)], &pair.a.mem).unwrap_err();
        assert_eq!(err.index, 0);
        assert!(err.to_string().contains("RTS"), "{err}");
    }
    pair.drive();
    assert!(pair.log.is_empty());
}

// ---- shared receive queues ---------------------------------------------------------------------

#[test]
fn two_qps_share_an_srq_and_its_limit_fires_once() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let srq = pair.b.engine.create_srq(pair.b.pd, 8, 1).unwrap();
    let a_init = init_attr(&pair.a, QpType::Rc);
    let b_init = QpInitAttr { srq: Some(srq), ..init_attr(&pair.b, QpType::Rc) };
    let (a1, b1) = pair.add_connected(&a_init, &b_init, Mtu::Mtu1024);
    let (a2, b2) = pair.add_connected(&a_init, &b_init, Mtu::Mtu1024);
    let sges = [0, 1, 2, 3].map(|i| [pair.b.sge(0x1000 * (i + 1), 64)]);
    let list = [0, 1, 2, 3].map(|i| RecvWr { wr_id: 100 + i as u64, sg_list: &sges[i] });
    pair.b.engine.post_srq_recv(srq, &list).unwrap();
    pair.b.engine.arm_srq_limit(srq, 2).unwrap();

    pair.a.fill(0, b"from one");
    pair.a.fill(0x10, b"from two");
    let one = [pair.a.sge(0, 8)];
    let two = [pair.a.sge(0x10, 8)];
    pair.a.engine.post_send(a1, &[wr(1, SendOp::Send, &one)], &pair.a.mem).unwrap();
    pair.drive();
    pair.a.engine.post_send(a2, &[wr(2, SendOp::Send, &two)], &pair.a.mem).unwrap();
    pair.drive();
    let wcs = pair.b.poll_all();
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.qp_num, w.status)).collect::<Vec<_>>(),
        [(100, b1, WcStatus::Success), (101, b2, WcStatus::Success)],
        "each QP takes the SRQ's next receive"
    );
    assert_eq!(pair.b.read(0x1000, 8), b"from one");
    assert_eq!(pair.b.read(0x2000, 8), b"from two");
    assert_eq!(pair.b.events(), [], "two receives left: not below the limit of 2 yet");

    pair.a.engine.post_send(a1, &[wr(3, SendOp::Send, &one)], &pair.a.mem).unwrap();
    pair.drive();
    assert_eq!(pair.b.events(), [Event::Async(AsyncEvent::SrqLimitReached(srq))], "one left: below the limit");
    pair.a.engine.post_send(a2, &[wr(4, SendOp::Send, &two)], &pair.a.mem).unwrap();
    pair.drive();
    assert_eq!(pair.b.events(), [], "the limit disarmed itself");
    assert_eq!(outcomes(&pair.b.poll_all()), [(102, WcStatus::Success), (103, WcStatus::Success)]);
}

#[test]
fn qp_with_an_srq_that_fails_raises_last_wqe_reached() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let srq = pair.b.engine.create_srq(pair.b.pd, 8, 1).unwrap();
    let a_init = init_attr(&pair.a, QpType::Rc);
    let b_init = QpInitAttr { srq: Some(srq), ..init_attr(&pair.b, QpType::Rc) };
    let (a1, b1) = pair.add_connected(&a_init, &b_init, Mtu::Mtu1024);
    let sge = [pair.a.sge(0, 8)];
    let bad = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: RKey(pair.b.mr.rkey.0 ^ 1) };
    pair.a.engine.post_send(a1, &[wr(1, bad, &sge)], &pair.a.mem).unwrap();
    pair.drive();
    assert_eq!(pair.b.engine.qp_state(b1), Some(QpState::Err));
    assert_eq!(
        pair.b.events(),
        [Event::Async(AsyncEvent::QpAccessError(b1)), Event::Async(AsyncEvent::QpLastWqeReached(b1))]
    );
}

// ---- completion events -------------------------------------------------------------------------

#[test]
fn armed_cq_raises_one_completion_event_then_disarms() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x100, 64);
    pair.b.post_recv(2, 0x200, 64);
    pair.b.post_recv(3, 0x300, 64);
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(pair.b.events(), [], "not armed: no event");

    pair.b.engine.req_notify_cq(pair.b.cq, false).unwrap();
    pair.a.post_send(wr(2, SendOp::Send, &[sge]));
    pair.a.post_send(wr(3, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(pair.b.events(), [Event::Completion(pair.b.cq)], "one event for two completions");
    assert_eq!(pair.b.poll_all().len(), 3);
}

#[test]
fn solicited_only_cq_wakes_for_a_solicited_send_only() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x100, 64);
    pair.b.post_recv(2, 0x200, 64);
    pair.b.engine.req_notify_cq(pair.b.cq, true).unwrap();
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(pair.b.events(), [], "an unsolicited receive does not wake a solicited-only CQ");
    let quiet = pair.b.poll().unwrap();
    assert!(!quiet.solicited);

    pair.a.post_send(wr_with(2, SendOp::Send, &[sge], SendFlags::SIGNALED | SendFlags::SOLICITED));
    pair.drive();
    assert!(pair.log.last().is_some_and(|p| !p.from_a), "the ACK came last");
    let se = pair.log.iter().rev().find(|p| p.from_a).unwrap();
    assert!(softrdma_wire::RocePacket::new_checked(&se.bytes[..]).unwrap().bth().solicited_event());
    assert_eq!(pair.b.events(), [Event::Completion(pair.b.cq)]);
    let loud = pair.b.poll().unwrap();
    assert_eq!((loud.wr_id, loud.solicited), (2, true));
}

/// Completion timestamps: a completion carries the `now` of the call that made it, the
/// receive's when the SEND arrived, the SEND's when its ACK did; a flush made by
/// `modify_qp` (which takes no `now`) the latest `now` the engine was given.
#[test]
fn completions_carry_the_time_the_engine_made_them() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x100, 64);
    let sge = pair.a.sge(0, 8);
    let posted = pair.now;
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    let (recv, send) = (pair.b.poll().unwrap(), pair.a.poll().unwrap());
    assert_eq!(recv.completed_at, Some(posted + pair.latency), "the receive: when the SEND arrived");
    assert_eq!(send.completed_at, Some(posted + pair.latency * 2), "the SEND: when its ACK arrived");
    pair.b.post_recv(2, 0x200, 64);
    pair.b.engine.modify_qp(pair.b.qp, &state(QpState::Err), AttrMask::STATE).unwrap();
    let flushed = pair.b.poll().unwrap();
    assert_eq!((flushed.wr_id, flushed.status), (2, WcStatus::WrFlushErr));
    let at = flushed.completed_at.unwrap();
    assert!(recv.completed_at.unwrap() <= at && at <= pair.now, "a flush: the latest now b was given");
}

/// A region whose addresses are not where its bytes are (`ibv_reg_mr_iova`; zero-based for
/// device memory): WRITE, READ and atomics name it by its iova and reach its bytes, a SEND
/// gathers from it and a receive scatters into it by iova, and an iova outside it is a
/// protection error, though the host address would be inside.
#[test]
fn a_region_is_named_by_its_iova_and_touched_where_its_bytes_are() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let access = Access::ALL;
    // b: 256 bytes at host offset 0x800, named 0..256 (zero-based).
    let zb = pair.b.engine.reg_mr_iova(pair.b.pd, pair.b.addr_of(0x800), 256, 0, access).unwrap();
    // a: 128 bytes at host offset 0x400, named 0x7000_0000.
    let ia = pair.a.engine.reg_mr_iova(pair.a.pd, pair.a.addr_of(0x400), 128, 0x7000_0000, access).unwrap();
    let data = pattern(64, 9);
    pair.a.fill(0x400 + 16, &data);
    let from_iova = [Sge { addr: 0x7000_0000 + 16, length: 64, lkey: ia.lkey }];
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: 32, rkey: zb.rkey }, &from_iova));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x800 + 32, 64), &data[..], "the WRITE landed at the host bytes of iova 32");

    let into_iova = [Sge { addr: 0x7000_0000 + 100, length: 8, lkey: ia.lkey }];
    pair.a.post_send(wr(2, SendOp::RdmaRead { remote_addr: 32, rkey: zb.rkey }, &into_iova));
    pair.b.fill(0x800 + 200, &7u64.to_ne_bytes());
    let old = [Sge { addr: 0x7000_0000 + 120, length: 8, lkey: ia.lkey }];
    pair.a.post_send(wr(3, SendOp::FetchAdd { remote_addr: 200, rkey: zb.rkey, add: 5 }, &old));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(2, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!(pair.a.read(0x400 + 100, 8), &data[..8], "the READ came from iova 32 and landed at iova 100");
    assert_eq!(pair.b.read(0x800 + 200, 8), &12u64.to_ne_bytes(), "the atomic added at iova 200");
    assert_eq!(pair.a.read(0x400 + 120, 8), &7u64.to_ne_bytes(), "its original value landed at iova 120");

    let recv = [Sge { addr: 8, length: 64, lkey: zb.lkey }];
    pair.b.engine.post_recv(pair.b.qp, &[RecvWr { wr_id: 4, sg_list: &recv }]).unwrap();
    pair.a.post_send(wr(5, SendOp::Send, &from_iova));
    pair.drive();
    assert_eq!(outcomes(&pair.b.poll_all()), [(4, WcStatus::Success)]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(5, WcStatus::Success)], "it gathered from iova 16");
    assert_eq!(pair.b.read(0x800 + 8, 64), &data[..], "the SEND scattered into iova 8");

    // The host address of its bytes is no iova of it.
    let outside = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0x800), rkey: zb.rkey };
    pair.a.post_send(wr(6, outside, &from_iova));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(6, WcStatus::RemAccessErr)]);
}

/// A QP reset after an error leaves none of its completions in its CQs (the flushes it
/// made), as a ConnectX's driver cleans them; another QP's completions there stay.
/// rdma-core's `test_mr_rereg_pd`/`_addr` bring QPs back through RESET and poll on.
#[test]
fn reset_takes_the_qps_own_completions_out_of_its_cqs() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.a.post_recv(1, 0x100, 64);
    pair.b.post_recv(2, 0x100, 64);
    let sge = pair.b.sge(0, 8);
    pair.b.post_send(wr(3, SendOp::Send, &[sge]));
    pair.drive();
    // a's CQ: a's receive of b's SEND; then a fails and flushes nothing (no WR left), b's
    // receive flushes when b fails.
    pair.a.post_recv(4, 0x200, 64);
    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Err), AttrMask::STATE).unwrap();
    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Reset), AttrMask::STATE).unwrap();
    assert_eq!(pair.a.poll_all(), [], "a's receive and a's flush are gone with the reset");
    pair.b.engine.modify_qp(pair.b.qp, &state(QpState::Err), AttrMask::STATE).unwrap();
    let b = outcomes(&pair.b.poll_all());
    assert_eq!(b, [(3, WcStatus::Success), (2, WcStatus::WrFlushErr)], "b's stay until b is reset");
}

/// ATOMIC_WRITE (IBA 1.5): the 8 bytes land as one store at an aligned address the target
/// allows to be written, the answer is a zero-length READ response (as rxe's), and what the
/// target refuses (no REMOTE_WRITE on the region, a misaligned address) completes in error.
#[test]
fn atomic_write_stores_eight_bytes_and_is_answered_as_a_read_of_nothing() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let value = 0x0102_0304_0506_0708u64.to_ne_bytes();
    let op = SendOp::AtomicWrite { remote_addr: pair.b.addr_of(0x40), rkey: pair.b.mr.rkey, value };
    pair.a.post_send(wr(1, op, &[]));
    pair.drive();
    let wcs = pair.a.poll_all();
    assert_eq!(outcomes(&wcs), [(1, WcStatus::Success)]);
    assert_eq!(wcs[0].opcode, WcOpcode::AtomicWrite);
    assert_eq!(pair.b.read(0x40, 8), &value, "the 8 bytes landed");
    assert_eq!(pair.opcodes(false), [Opcode::RC_RDMA_READ_RESPONSE_ONLY], "answered by one zero-length READ response");
    assert!(pair.sent(false).iter().all(|p| p.bytes.len() == 12 + 4 + 4), "BTH, AETH, ICRC: no payload");

    let sge = pair.a.sge(0, 8);
    let err = pair.a.engine.post_send(pair.a.qp, &[wr(2, op, &[sge])], &pair.a.mem).unwrap_err();
    assert!(format!("{err:?}").contains("takes no SGEs"), "{err:?}");

    let misaligned = SendOp::AtomicWrite { remote_addr: pair.b.addr_of(0x44), rkey: pair.b.mr.rkey, value };
    pair.a.post_send(wr(3, misaligned, &[]));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(3, WcStatus::RemInvReqErr)]);
}

// ---- signaling ---------------------------------------------------------------------------------

#[test]
fn unsignaled_success_is_silent_but_an_unsignaled_error_completes() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x100, 64);
    pair.b.post_recv(2, 0x200, 64);
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr_with(1, SendOp::Send, &[sge], SendFlags::default()));
    pair.a.post_send(wr(2, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(2, WcStatus::Success)], "only the signaled WR completes");
    assert_eq!(pair.b.poll_all().len(), 2, "both were delivered");

    let bad = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: RKey(pair.b.mr.rkey.0 ^ 1) };
    pair.a.post_send(wr_with(3, bad, &[sge], SendFlags::default()));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(3, WcStatus::RemAccessErr)], "errors always complete");
}

#[test]
fn sq_sig_all_signals_every_wr() {
    let mut pair = connected_after_setup(QpType::Rc, Mtu::Mtu1024, &|n| {
        n.qp = n.engine.create_qp(&QpInitAttr { sq_sig_all: true, ..init_attr(n, QpType::Rc) }).unwrap();
    });
    pair.b.post_recv(1, 0x100, 64);
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr_with(1, SendOp::Send, &[sge], SendFlags::default()));
    pair.a.post_send(wr_with(
        2,
        SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0x800), rkey: pair.b.mr.rkey },
        &[sge],
        SendFlags::default(),
    ));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

// ---- ordering: fence and initiator depth -------------------------------------------------------

/// `a` READs from `b` and then SENDs with `flags`; the first READ response is lost, so the READ
/// completes only after a local ACK timeout. Returns the pair after it settled.
fn read_then_send(flags: SendFlags) -> Pair {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.fill(0x300, &pattern(64, 4));
    pair.b.post_recv(1, 0x100, 64);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let dst = pair.a.sge(0x1000, 64);
    let src = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::RdmaRead { remote_addr: pair.b.addr_of(0x300), rkey: pair.b.mr.rkey }, &[dst]));
    pair.a.post_send(wr_with(2, SendOp::Send, &[src], SendFlags::SIGNALED | flags));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(pair.a.read(0x1000, 64), pattern(64, 4));
    pair
}

#[test]
fn unfenced_send_goes_out_behind_the_read_request() {
    let pair = read_then_send(SendFlags::default());
    assert_eq!(pair.opcodes(true)[..2], [Opcode::RC_RDMA_READ_REQUEST, Opcode::RC_SEND_ONLY]);
}

#[test]
fn fenced_send_waits_for_the_read_to_complete() {
    let pair = read_then_send(SendFlags::FENCE);
    let response = pair.log.iter().find(|p| p.delivered && p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY).unwrap();
    let send = pair.log.iter().find(|p| p.opcode() == Opcode::RC_SEND_ONLY).unwrap();
    assert_eq!(
        pair.opcodes(true),
        [Opcode::RC_RDMA_READ_REQUEST, Opcode::RC_RDMA_READ_REQUEST, Opcode::RC_SEND_ONLY],
        "the request, its retry after the timeout, then the fenced SEND"
    );
    assert!(send.at >= response.at + pair.latency, "the SEND left {:?}, the READ completed {:?}", send.at, response.at);
}

#[test]
fn initiator_depth_of_one_holds_the_second_read_until_the_first_is_answered() {
    for (depth, overlap) in [(1, false), (4, true)] {
        let mut pair =
            Pair::connected_tweaked(QpType::Rc, Mtu::Mtu1024, QpCap::default(), &|rts| rts.max_rd_atomic = depth);
        let rkey = pair.b.mr.rkey;
        let d1 = pair.a.sge(0x1000, 64);
        let d2 = pair.a.sge(0x2000, 64);
        pair.a.post_send(wr(1, SendOp::RdmaRead { remote_addr: pair.b.addr_of(0), rkey }, &[d1]));
        pair.a.post_send(wr(2, SendOp::RdmaRead { remote_addr: pair.b.addr_of(0x40), rkey }, &[d2]));
        pair.drive();
        assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);
        let requests: Vec<_> = pair.log.iter().filter(|p| p.opcode() == Opcode::RC_RDMA_READ_REQUEST).collect();
        let first_response = pair.log.iter().find(|p| p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_ONLY).unwrap();
        assert_eq!(requests.len(), 2);
        assert_eq!(
            requests[1].at < first_response.at + pair.latency,
            overlap,
            "max_rd_atomic {depth}: second READ sent {:?}, first answer arrived {:?}",
            requests[1].at,
            first_response.at + pair.latency
        );
    }
}

// ---- modify_qp ---------------------------------------------------------------------------------

#[test]
fn reset_to_rtr_is_not_a_transition() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let qp = pair.a.engine.create_qp(&init_attr(&pair.a, QpType::Rc)).unwrap();
    let (rtr, mask) = rc_rtr(pair.b.addr, pair.b.qp);
    let err = pair.a.engine.modify_qp(qp, &rtr, mask).unwrap_err();
    assert!(
        matches!(
            err,
            VerbsError::ModifyQp(ModifyQpError::InvalidTransition { current: QpState::Reset, next: QpState::Rtr, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("IBV_QPS_INIT"), "the message says where RESET may go: {err}");
    assert_eq!(pair.a.engine.qp_state(qp), Some(QpState::Reset));
}

#[test]
fn init_to_rtr_without_the_address_vector_names_ibv_qp_av() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let qp = pair.a.engine.create_qp(&init_attr(&pair.a, QpType::Rc)).unwrap();
    let (init, init_mask) = to_init();
    pair.a.engine.modify_qp(qp, &init, init_mask).unwrap();
    let (rtr, mask) = rc_rtr(pair.b.addr, pair.b.qp);
    let err = pair.a.engine.modify_qp(qp, &rtr, mask - AttrMask::AV).unwrap_err();
    assert!(err.to_string().contains("IBV_QP_AV"), "{err}");
    assert_eq!(pair.a.engine.qp_state(qp), Some(QpState::Init));
}

#[test]
fn unexpected_attribute_is_named() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let qp = pair.a.engine.create_qp(&init_attr(&pair.a, QpType::Rc)).unwrap();
    let (init, init_mask) = to_init();
    let err = pair.a.engine.modify_qp(qp, &init, init_mask | AttrMask::QKEY).unwrap_err();
    assert!(matches!(err, VerbsError::ModifyQp(ModifyQpError::UnexpectedAttributes { .. })), "{err}");
    assert!(err.to_string().contains("IBV_QP_QKEY"), "an RC QP has no Q_Key: {err}");
    assert_eq!(pair.a.engine.qp_state(qp), Some(QpState::Reset));
}

#[test]
fn out_of_range_values_are_refused_naming_the_attribute() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let qp = pair.a.engine.create_qp(&init_attr(&pair.a, QpType::Rc)).unwrap();
    let (init, init_mask) = to_init();
    let err = pair.a.engine.modify_qp(qp, &QpAttr { port_num: 2, ..init }, init_mask).unwrap_err();
    assert!(matches!(&err, VerbsError::Invalid(m) if m.contains("port_num")), "{err}");
    assert_eq!(pair.a.engine.qp_state(qp), Some(QpState::Reset), "a refused modify changes nothing");

    pair.a.engine.modify_qp(qp, &init, init_mask).unwrap();
    let (rtr, rtr_mask) = rc_rtr(pair.b.addr, pair.b.qp);
    pair.a.engine.modify_qp(qp, &rtr, rtr_mask).unwrap();
    let rts = QpAttr { qp_state: QpState::Rts, timeout: 32, retry_cnt: 7, rnr_retry: 7, ..QpAttr::default() };
    let rts_mask = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    let err = pair.a.engine.modify_qp(qp, &rts, rts_mask).unwrap_err();
    assert!(matches!(&err, VerbsError::Invalid(m) if m.contains("timeout")), "{err}");
    let err = pair.a.engine.modify_qp(qp, &QpAttr { timeout: 14, retry_cnt: 8, ..rts }, rts_mask).unwrap_err();
    assert!(matches!(&err, VerbsError::Invalid(m) if m.contains("retry_cnt")), "{err}");
    assert_eq!(pair.a.engine.qp_state(qp), Some(QpState::Rtr));
    pair.a.engine.modify_qp(qp, &QpAttr { timeout: 14, ..rts }, rts_mask).unwrap();
    assert_eq!(pair.a.engine.qp_state(qp), Some(QpState::Rts));
}

#[test]
fn query_qp_returns_what_was_set() {
    let pair = Pair::connected(QpType::Rc, Mtu::Mtu512);
    let (attr, cap) = pair.a.engine.query_qp(pair.a.qp).unwrap();
    assert_eq!(attr.qp_state, QpState::Rts);
    assert_eq!(attr.qp_access_flags, Access::ALL);
    assert_eq!(attr.path_mtu, Mtu::Mtu512);
    assert_eq!(attr.dest_qp_num, pair.b.qp.value());
    assert_eq!((attr.rq_psn, attr.sq_psn), (0xfffffe, 0xfffffe));
    assert_eq!((attr.max_dest_rd_atomic, attr.min_rnr_timer), (4, 1));
    assert_eq!((attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic), (10, 7, 7, 4));
    assert_eq!(cap, QpCap::default());
}

#[test]
fn reset_discards_outstanding_wrs_without_completions() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.set_filter(|p| !p.from_a); // a's sends stay outstanding
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.a.post_send(wr(2, SendOp::Send, &[sge]));
    pair.a.post_recv(3, 0x100, 64);
    pair.drive_for(Duration::from_micros(100));
    let sent = pair.log.len();

    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Reset), AttrMask::STATE).unwrap();
    pair.drive();
    assert_eq!(pair.a.poll_all(), [], "RESET completes nothing");
    assert_eq!(pair.log.len(), sent, "and sends nothing, retries included");
    assert_eq!(pair.a.engine.poll_timeout(), None, "no timer survives RESET");
}

// ---- the error state ---------------------------------------------------------------------------

#[test]
fn error_state_flushes_everything_outstanding_and_everything_posted_later() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.set_filter(|p| !p.from_a); // a's sends stay outstanding
    let sge = pair.a.sge(0, 8);
    pair.a.post_recv(21, 0x100, 64);
    pair.a.post_recv(22, 0x200, 64);
    pair.a.post_send(wr(11, SendOp::Send, &[sge]));
    let write = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: pair.b.mr.rkey };
    pair.a.post_send(wr_with(12, write, &[sge], SendFlags::default())); // unsignaled: flushed anyway
    pair.drive_for(Duration::from_micros(100));
    let sent = pair.log.len();

    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Err), AttrMask::STATE).unwrap();
    let mut wcs: Vec<_> = pair.a.poll_all().iter().map(|w| (w.wr_id, w.status, w.opcode, w.qp_num)).collect();
    wcs.sort_by_key(|w| w.0);
    let flushed = |id, op| (id, WcStatus::WrFlushErr, op, pair.a.qp);
    assert_eq!(
        wcs,
        [
            flushed(11, WcOpcode::Send),
            flushed(12, WcOpcode::RdmaWrite),
            flushed(21, WcOpcode::Recv),
            flushed(22, WcOpcode::Recv)
        ]
    );

    pair.a.post_send(wr(13, SendOp::Send, &[sge]));
    pair.a.post_recv(23, 0x300, 64);
    assert_eq!(
        outcomes(&pair.a.poll_all()),
        [(13, WcStatus::WrFlushErr), (23, WcStatus::WrFlushErr)],
        "WRs posted in ERR complete at once, flushed"
    );
    pair.drive();
    assert_eq!(pair.log.len(), sent, "nothing is sent in ERR");
}

// ---- CQ overflow -------------------------------------------------------------------------------

#[test]
fn cq_overflow_is_an_async_cq_error() {
    let mut pair = connected_after_setup(QpType::Rc, Mtu::Mtu1024, &|n| {
        n.cq = n.engine.create_cq(2).unwrap();
        n.qp = n.engine.create_qp(&init_attr(n, QpType::Rc)).unwrap();
    });
    for i in 0..3 {
        pair.b.post_recv(i, 0x100 * (i + 1), 64);
    }
    let sge = pair.a.sge(0, 8);
    for i in 0..3 {
        pair.a.post_send(wr(i, SendOp::Send, &[sge]));
    }
    pair.drive();
    assert_eq!(pair.a.events(), [Event::Async(AsyncEvent::CqError(pair.a.cq))]);
    assert_eq!(pair.b.events(), [Event::Async(AsyncEvent::CqError(pair.b.cq))]);
    assert_eq!(pair.a.poll_all().len(), 2, "the CQ holds what fit");
}

#[test]
fn resize_cq_keeps_what_it_holds_and_the_new_size_bounds_it() {
    let mut pair = connected_after_setup(QpType::Rc, Mtu::Mtu1024, &|n| {
        n.cq = n.engine.create_cq(2).unwrap();
        n.qp = n.engine.create_qp(&init_attr(n, QpType::Rc)).unwrap();
    });
    for i in 0..4 {
        pair.b.post_recv(i, 0x100 * (i + 1), 64);
    }
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(0, SendOp::Send, &[sge]));
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    // Two completions held: not fewer room than that, nor 0, nor past the device's limit.
    let (cq, max) = (pair.a.cq, pair.a.engine.config().max_cqe);
    for bad in [1, 0, max + 1] {
        let e = pair.a.engine.resize_cq(cq, bad).unwrap_err().to_string();
        assert!(e.contains("resize_cq"), "{e}");
    }
    assert_eq!(pair.a.engine.resize_cq(cq, 4), Ok(4));
    let b_cq = pair.b.cq;
    assert_eq!(pair.b.engine.resize_cq(b_cq, 4), Ok(4));
    // Room for four now: two more SENDs complete without a CQ error, and all four are there.
    pair.a.post_send(wr(2, SendOp::Send, &[sge]));
    pair.a.post_send(wr(3, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(pair.a.events(), [], "no CQ error with the room the resize gave");
    assert_eq!(pair.b.events(), []);
    assert_eq!(outcomes(&pair.a.poll_all()).len(), 4);
    assert!(pair.a.engine.resize_cq(CqId(999), 8).is_err(), "no such CQ");
}

// ---- SQD ---------------------------------------------------------------------------------------

#[test]
fn sqd_starts_nothing_new_and_rts_resumes() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.post_recv(1, 0x100, 64);
    pair.a.fill(0, b"held");
    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Sqd), AttrMask::STATE).unwrap();
    let sge = pair.a.sge(0, 4);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    assert!(pair.log.is_empty(), "SQD starts no new WQE");
    assert_eq!(pair.a.poll(), None);

    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Rts), AttrMask::STATE).unwrap();
    pair.drive();
    assert_eq!(pair.opcodes(true), [Opcode::RC_SEND_ONLY]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x100, 4), b"held");
}

// ---- MRs, QPs and PDs --------------------------------------------------------------------------

#[test]
fn deregistered_mr_refuses_its_old_rkey() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let region = pair.b.addr_of(0x10000);
    let keys = pair.b.engine.reg_mr(pair.b.pd, region, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    pair.a.fill(0, b"before!!");
    pair.a.fill(0x10, b"after!!!");
    let before = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: region, rkey: keys.rkey }, &[before]));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x10000, 8), b"before!!");

    pair.b.engine.dereg_mr(keys.lkey).unwrap();
    let after = pair.a.sge(0x10, 8);
    pair.a.post_send(wr(2, SendOp::RdmaWrite { remote_addr: region, rkey: keys.rkey }, &[after]));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(2, WcStatus::RemAccessErr)]);
    assert!(pair.log.iter().any(|p| p.syndrome() == Some(Syndrome::Nak(NakCode::RemoteAccessError))));
    assert_eq!(pair.b.read(0x10000, 8), b"before!!", "the old R_Key reached nothing");
    assert!(matches!(pair.b.engine.dereg_mr(keys.lkey), Err(VerbsError::NotFound { .. })));
}

#[test]
fn rkeys_are_distinct_and_not_sequential() {
    let mut engine = Engine::new(DeviceConfig::default());
    let pd = engine.alloc_pd();
    let rkeys: Vec<u32> =
        (0..64).map(|i| engine.reg_mr(pd, BASE + i * 4096, 4096, Access::ALL).unwrap().rkey.0).collect();
    assert_eq!(rkeys.iter().collect::<BTreeSet<_>>().len(), 64, "every R_Key is distinct");
    let steps: BTreeSet<u32> = rkeys.windows(2).map(|w| w[1].wrapping_sub(w[0])).collect();
    assert!(steps.len() > 1, "R_Keys must not be guessable from one another: steps {steps:?}");
}

#[test]
fn packets_for_a_destroyed_qp_are_dropped_and_counted() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.b.engine.destroy_qp(pair.b.qp).unwrap();
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive_for(Duration::from_millis(1)); // before a's first retry
    assert_eq!(pair.opcodes(true), [Opcode::RC_SEND_ONLY]);
    assert!(pair.opcodes(false).is_empty(), "nobody answers for a destroyed QP");
    let c = pair.b.engine.counters();
    assert_eq!((c.rcvd_dropped, c.rcvd_packets), (1, 0));
    assert!(matches!(pair.b.engine.destroy_qp(pair.b.qp), Err(VerbsError::NotFound { kind: "QP", .. })));
}

#[test]
fn pd_with_live_mrs_cannot_be_deallocated() {
    let mut engine = Engine::new(DeviceConfig::default());
    let pd = engine.alloc_pd();
    let keys = engine.reg_mr(pd, BASE, 4096, Access::LOCAL_WRITE).unwrap();
    let err = engine.dealloc_pd(pd).unwrap_err();
    assert!(matches!(&err, VerbsError::Busy(m) if m.contains("MR")), "{err}");
    engine.dereg_mr(keys.lkey).unwrap();
    engine.dealloc_pd(pd).unwrap();
    assert!(matches!(engine.dealloc_pd(pd), Err(VerbsError::NotFound { kind: "PD", .. })));
}

#[test]
fn rereg_mr_moves_a_region_between_pds_and_refuses_what_reg_mr_refuses() {
    let mut engine = Engine::new(DeviceConfig::default());
    let (old, new) = (engine.alloc_pd(), engine.alloc_pd());
    let keys = engine.reg_mr(old, BASE, 4096, Access::LOCAL_WRITE).unwrap();
    let err = engine.rereg_mr(keys.lkey, None, None, Some(Access::REMOTE_WRITE)).unwrap_err();
    assert!(err.to_string().contains("LOCAL_WRITE"), "{err}");
    let err = engine.rereg_mr(keys.lkey, Some(new), Some((u64::MAX - 1, 4096)), None).unwrap_err();
    assert!(err.to_string().contains("wraps"), "{err}");
    engine.dealloc_pd(new).unwrap(); // a refused rereg left the new PD unused
    let new = engine.alloc_pd();
    engine.rereg_mr(keys.lkey, Some(new), Some((BASE + 4096, 8192)), None).unwrap();
    engine.dealloc_pd(old).unwrap(); // the region left it
    assert!(matches!(engine.dealloc_pd(new), Err(VerbsError::Busy(_))), "the region is the new PD's");
    assert!(matches!(
        engine.rereg_mr(LKey(keys.lkey.0 ^ 1), None, None, Some(Access::LOCAL_WRITE)),
        Err(VerbsError::NotFound { kind: "MR", .. })
    ));
    engine.dereg_mr(keys.lkey).unwrap();
    engine.dealloc_pd(new).unwrap();
}

#[test]
fn solicited_only_cq_wakes_for_an_error_completion() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    pair.a.post_recv(1, 0x100, 64);
    pair.a.engine.req_notify_cq(pair.a.cq, true).unwrap();
    // IBA 11.4.2.2: a solicited-only CQ is also woken by an unsuccessful completion.
    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Err), AttrMask::STATE).unwrap();
    assert_eq!(pair.a.events(), [Event::Completion(pair.a.cq)]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::WrFlushErr)]);
}

#[test]
fn qpns_stay_in_the_configured_range_and_wrap_inside_it() {
    // A runtime that shares one host port among engines gives each a QPN range (a slot).
    let mut e = Engine::new(DeviceConfig { qpn_base: 3 << 13, max_qp: 4, ..DeviceConfig::default() });
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    let init = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        qp_type: QpType::Rc,
        cap: QpCap::default(),
        sq_sig_all: false,
    };
    let qpns: Vec<u32> = (0..4).map(|_| e.create_qp(&init).unwrap().value()).collect();
    assert_eq!(qpns, [3 << 13, (3 << 13) + 1, (3 << 13) + 2, (3 << 13) + 3]);
    assert!(matches!(e.create_qp(&init), Err(VerbsError::NoResources(_))), "a fifth QP exceeds max_qp");
    e.destroy_qp(softrdma_wire::Qpn::from_u24_truncating((3 << 13) + 1)).unwrap();
    // The allocator wraps to the start of the range, skipping live QPNs.
    assert_eq!(e.create_qp(&init).unwrap().value(), (3 << 13) + 1);
}

/// `ibv_wr_complete` posts all of a batch or none of it (ibv_wr_post(3): "the entire
/// posting will be aborted").
#[test]
fn post_send_all_posts_a_whole_batch_or_nothing() {
    let cap = QpCap { max_send_wr: 3, ..QpCap::default() };
    let mut pair = Pair::connected_with(QpType::Rc, Mtu::Mtu1024, cap);
    for i in 0..3 {
        pair.b.post_recv(i, 0x1000 * (i + 1), 256);
    }
    let good = [pair.a.sge(0, 8)];
    let five = [pair.a.sge(0, 8); 5]; // max_send_sge is 4
    let long = [Sge { addr: BASE, length: 65, lkey: LKey(0) }]; // max_inline_data is 64
    let (qp, engine) = (pair.a.qp, &mut pair.a.engine);
    let mem = &pair.a.mem;
    let err = engine.post_send_all(qp, &[wr(0, SendOp::Send, &good), wr(1, SendOp::Send, &five)], mem).unwrap_err();
    assert_eq!(err.index, 1);
    let inline = wr_with(1, SendOp::Send, &long, SendFlags::SIGNALED | SendFlags::INLINE);
    assert_eq!(engine.post_send_all(qp, &[wr(0, SendOp::Send, &good), inline], mem).unwrap_err().index, 1);
    let four = [0, 1, 2, 3].map(|i| wr(10 + i, SendOp::Send, &good));
    let err = engine.post_send_all(qp, &four, mem).unwrap_err();
    assert_eq!(err, PostError { index: 3, kind: PostErrorKind::QueueFull { depth: 3 } });
    pair.drive();
    assert!(pair.a.poll_all().is_empty(), "nothing of the refused batches was posted");
    assert!(pair.b.poll_all().is_empty());

    // Three fit: all go.
    pair.a.engine.post_send_all(pair.a.qp, &four[..3], &pair.a.mem).unwrap();
    pair.drive();
    assert_eq!(
        outcomes(&pair.a.poll_all()),
        [(10, WcStatus::Success), (11, WcStatus::Success), (12, WcStatus::Success)]
    );
}

// ---- memory windows ----------------------------------------------------------------------------

/// Where B's windows live: a region of B's memory registered for binding (the node's own
/// region covers all memory with every right but MW_BIND).
const WIN: u64 = 0x8_0000;
const WIN_LEN: u64 = 0x1_0000;

fn window_region(n: &mut Node, access: Access) -> MrKeys {
    n.engine.reg_mr(n.pd, n.addr_of(WIN), WIN_LEN, access).unwrap()
}

/// The R_Key a window whose R_Key is `mw` gets from a bind choosing `key`.
fn with_key(mw: RKey, key: u8) -> RKey {
    RKey((mw.0 & !0xff) | u32::from(key))
}

/// A signaled BIND_MW of the window whose R_Key is `mw` (its upper 24 bits are the
/// window's handle) choosing `key`.
fn bind_wr(wr_id: u64, mw: RKey, key: u8, bind: MwBind) -> SendWr<'static> {
    wr(wr_id, SendOp::BindMw { mw: MwId(mw.0 >> 8), rkey: with_key(mw, key), bind }, &[])
}

fn binding(mr: &MrKeys, offset: u64, length: u64, access: Access) -> MwBind {
    MwBind { mr: mr.lkey, addr: BASE + WIN + offset, length, access }
}

/// Posts `w` on B and drives: B's completions.
fn on_b(pair: &mut Pair, w: SendWr<'_>) -> Vec<Wc> {
    pair.b.post_send(w);
    pair.drive();
    pair.b.poll_all()
}

/// Posts `op` of `len` bytes from A (offset 0) and drives: A's completions.
fn from_a(pair: &mut Pair, wr_id: u64, op: SendOp, len: u32) -> Vec<Wc> {
    let sge = pair.a.sge(0, len);
    pair.a.post_send(wr(wr_id, op, &[sge]));
    pair.drive();
    pair.a.poll_all()
}

/// An RC pair with a type `t` window on B bound over `[WIN + 0x100, +0x200)` with `access`
/// (the region allows local write and binding): the pair, the region and the window's
/// handle and bound R_Key.
fn bound_window(t: MwType, access: Access) -> (Pair, MrKeys, MwId, RKey) {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let mr = window_region(&mut pair.b, Access::LOCAL_WRITE | Access::MW_BIND);
    let (mw, rkey) = pair.b.engine.alloc_mw(pair.b.pd, t).unwrap();
    let wcs = on_b(&mut pair, bind_wr(7, rkey, 0x42, binding(&mr, 0x100, 0x200, access)));
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status, wcs[0].opcode), (7, WcStatus::Success, WcOpcode::BindMw));
    (pair, mr, mw, with_key(rkey, 0x42))
}

/// A WRITE to `offset` in B's window region through `rkey`.
fn remote_write(offset: u64, rkey: RKey) -> SendOp {
    SendOp::RdmaWrite { remote_addr: BASE + WIN + offset, rkey }
}

/// A READ of `offset` in B's window region through `rkey`.
fn remote_read(offset: u64, rkey: RKey) -> SendOp {
    SendOp::RdmaRead { remote_addr: BASE + WIN + offset, rkey }
}

#[test]
fn a_type2_window_gives_what_it_was_bound_with_and_nothing_past_its_bounds() {
    let rights = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let (mut pair, mr, mw, rkey) = bound_window(MwType::Type2, rights);
    let info = pair.b.engine.query_mw(mw).unwrap();
    assert_eq!((info.mw_type, info.rkey, info.pd), (MwType::Type2, rkey, pair.b.pd));
    let expect =
        MwBinding { mr: mr.lkey, addr: BASE + WIN + 0x100, length: 0x200, access: rights, qp: Some(pair.b.qp) };
    assert_eq!(info.binding, Some(expect), "bound to the QP that bound it");
    assert_eq!(rkey.0 & 0xff, 0x42, "the low 8 bits are the key the bind chose");
    assert_eq!(rkey.0 >> 8, mw.0, "the upper 24 are the window's");

    // The whole window, each way.
    let data = pattern(0x200, 3);
    pair.a.fill(0, &data);
    assert_eq!(outcomes(&from_a(&mut pair, 1, remote_write(0x100, rkey), 0x200)), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(WIN + 0x100, 0x200), &data[..]);
    pair.a.fill(0, &[0; 0x200]);
    assert_eq!(outcomes(&from_a(&mut pair, 2, remote_read(0x100, rkey), 0x200)), [(2, WcStatus::Success)]);
    assert_eq!(pair.a.read(0, 0x200), &data[..]);
    let add = SendOp::FetchAdd { remote_addr: pair.b.addr_of(WIN + 0x2f8), rkey, add: 5 };
    assert_eq!(outcomes(&from_a(&mut pair, 3, add, 8)), [(3, WcStatus::Success)]);

    // One byte past the end: the region holds it, the window does not.
    let past = from_a(&mut pair, 4, remote_write(0x200, rkey), 0x101);
    assert_eq!(outcomes(&past), [(4, WcStatus::RemAccessErr)]);
    assert_eq!(pair.b.events(), [Event::Async(AsyncEvent::QpAccessError(pair.b.qp))]);
    assert_eq!(pair.b.read(WIN + 0x300, 1), [0], "nothing landed past the window");
    assert_eq!(pair.b.engine.counters().resp_remote_access_errors, 1);
}

#[test]
fn a_window_gives_its_own_rights_not_its_regions() {
    // test_qpex's bind: a region open to remote writes, a window bound with local write only.
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let mr = window_region(&mut pair.b, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::MW_BIND);
    let (_, rkey) = pair.b.engine.alloc_mw(pair.b.pd, MwType::Type2).unwrap();
    let wcs = on_b(&mut pair, bind_wr(1, rkey, 1, binding(&mr, 0, WIN_LEN, Access::LOCAL_WRITE)));
    assert_eq!(outcomes(&wcs), [(1, WcStatus::Success)]);
    let rkey = with_key(rkey, 1);
    assert_eq!(outcomes(&from_a(&mut pair, 2, remote_write(0, rkey), 8)), [(2, WcStatus::RemAccessErr)]);

    // And a region with no remote right at all serves a window that reads.
    let (mut pair, _, _, rkey) = bound_window(MwType::Type1, Access::REMOTE_READ);
    assert_eq!(outcomes(&from_a(&mut pair, 1, remote_read(0x100, rkey), 64)), [(1, WcStatus::Success)]);
    assert_eq!(outcomes(&from_a(&mut pair, 2, remote_write(0x100, rkey), 8)), [(2, WcStatus::RemAccessErr)]);
}

#[test]
fn binds_that_break_a_rule_complete_with_mw_bind_err_and_fail_the_qp() {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    type Case = (&'static str, MwType, Access, fn(&MrKeys) -> MwBind);
    let cases: [Case; 7] = [
        ("region without MW_BIND", MwType::Type2, Access::LOCAL_WRITE, |mr| binding(mr, 0, 64, Access::REMOTE_READ)),
        ("writable window, region without LOCAL_WRITE", MwType::Type2, Access::MW_BIND, |mr| {
            binding(mr, 0, 64, Access::REMOTE_WRITE)
        }),
        ("leaves the region", MwType::Type2, all | Access::MW_BIND, |mr| {
            binding(mr, WIN_LEN - 8, 16, Access::REMOTE_READ)
        }),
        ("starts before the region", MwType::Type1, all | Access::MW_BIND, |mr| MwBind {
            addr: BASE + WIN - 8,
            ..binding(mr, 0, 16, Access::REMOTE_READ)
        }),
        ("type 2 with length 0", MwType::Type2, all | Access::MW_BIND, |mr| binding(mr, 0, 0, Access::REMOTE_READ)),
        ("zero-based type 1", MwType::Type1, all | Access::MW_BIND, |mr| {
            binding(mr, 0, 64, Access::REMOTE_READ | Access::ZERO_BASED)
        }),
        ("unknown access bit", MwType::Type2, all | Access::MW_BIND, |mr| binding(mr, 0, 64, Access(1 << 9))),
    ];
    for (what, t, region, bind) in cases {
        let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
        let mr = window_region(&mut pair.b, region);
        let (mw, rkey) = pair.b.engine.alloc_mw(pair.b.pd, t).unwrap();
        pair.b.post_send(bind_wr(1, rkey, 9, bind(&mr)));
        let sge = pair.b.sge(0, 8);
        pair.b.post_send(wr(2, SendOp::Send, &[sge]));
        pair.drive();
        let wcs = pair.b.poll_all();
        assert_eq!(outcomes(&wcs), [(1, WcStatus::MwBindErr), (2, WcStatus::WrFlushErr)], "{what}");
        assert_eq!(wcs[0].opcode, WcOpcode::BindMw);
        assert_eq!(pair.b.engine.qp_state(pair.b.qp), Some(QpState::Err), "{what}");
        let info = pair.b.engine.query_mw(mw).unwrap();
        assert_eq!((info.rkey, info.binding), (rkey, None), "{what}: a failed bind changes nothing");
    }
}

#[test]
fn a_type2_window_binds_again_only_once_invalidated_and_a_deallocated_one_never() {
    let (mut pair, mr, mw, rkey) = bound_window(MwType::Type2, Access::REMOTE_READ);
    let again = on_b(&mut pair, bind_wr(1, rkey, 0x43, binding(&mr, 0, 64, Access::REMOTE_READ)));
    assert_eq!(outcomes(&again), [(1, WcStatus::MwBindErr)], "o10-37.2.30: a bound type 2 window is not free");

    let (mut pair, mr, mw2, rkey) = bound_window(MwType::Type2, Access::REMOTE_READ);
    assert_eq!(mw, mw2, "both devices have the same seed");
    let inv = on_b(&mut pair, wr(1, SendOp::LocalInv { rkey }, &[]));
    assert_eq!(inv.len(), 1);
    assert_eq!((inv[0].status, inv[0].opcode), (WcStatus::Success, WcOpcode::LocalInv));
    assert_eq!(pair.b.engine.query_mw(mw).unwrap().binding, None);
    assert_eq!(pair.b.engine.query_mw(mw).unwrap().rkey, rkey, "invalidation keeps the R_Key");
    let stale = RKey(rkey.0 ^ 1);
    let rebound = on_b(&mut pair, bind_wr(2, rkey, 0x44, binding(&mr, 0x800, 64, Access::REMOTE_READ)));
    assert_eq!(outcomes(&rebound), [(2, WcStatus::Success)]);
    let new = with_key(rkey, 0x44);
    assert_eq!(outcomes(&from_a(&mut pair, 3, remote_read(0x800, new), 64)), [(3, WcStatus::Success)]);
    assert_eq!(outcomes(&from_a(&mut pair, 4, remote_read(0x800, rkey), 64)), [(4, WcStatus::RemAccessErr)], "old key");

    // The window is named by its handle: a key byte that is not current does not matter
    // (as mlx5; rxe, whose kernel gets only the R_Key, refuses it).
    let (mut pair, mr, mw, rkey) = bound_window(MwType::Type2, Access::REMOTE_READ);
    on_b(&mut pair, wr(1, SendOp::LocalInv { rkey }, &[]));
    let wcs = on_b(&mut pair, bind_wr(2, stale, 0x45, binding(&mr, 0, 64, Access::REMOTE_READ)));
    assert_eq!(outcomes(&wcs), [(2, WcStatus::Success)]);
    assert_eq!(pair.b.engine.query_mw(mw).unwrap().rkey, with_key(rkey, 0x45));
    on_b(&mut pair, wr(3, SendOp::LocalInv { rkey: with_key(rkey, 0x45) }, &[]));
    pair.b.engine.dealloc_mw(mw).unwrap();
    let wcs = on_b(&mut pair, bind_wr(4, rkey, 0x46, binding(&mr, 0, 64, Access::REMOTE_READ)));
    assert_eq!(outcomes(&wcs), [(4, WcStatus::MwBindErr)], "a deallocated window");
}

#[test]
fn a_type1_window_rebinds_unbinds_with_length_zero_and_is_never_invalidated() {
    let (mut pair, mr, mw, rkey) = bound_window(MwType::Type1, Access::REMOTE_WRITE);
    assert_eq!(pair.b.engine.query_mw(mw).unwrap().binding.unwrap().qp, None, "type 1: any QP of the PD");
    // Bound again elsewhere with no unbind between (type 1 windows stay valid).
    let wcs = on_b(&mut pair, bind_wr(1, rkey, 0x50, binding(&mr, 0x1000, 16, Access::REMOTE_WRITE)));
    assert_eq!(outcomes(&wcs), [(1, WcStatus::Success)]);
    let new = with_key(rkey, 0x50);
    pair.a.fill(0, b"windowed");
    assert_eq!(outcomes(&from_a(&mut pair, 2, remote_write(0x1000, new), 8)), [(2, WcStatus::Success)]);
    assert_eq!(pair.b.read(WIN + 0x1000, 8), b"windowed");
    // LOCAL_INV refuses a type 1 window (o10-37.2.26): LOC_QP_OP_ERR.
    let wcs = on_b(&mut pair, wr(3, SendOp::LocalInv { rkey: new }, &[]));
    assert_eq!(outcomes(&wcs), [(3, WcStatus::LocQpOpErr)]);
    assert!(pair.b.engine.query_mw(mw).unwrap().binding.is_some(), "still bound");

    // Length 0 unbinds (test_mr's invalidate_mw_type1): nothing reaches the memory, by the
    // old R_Key or the new one (each refusal fails the QP: a pair for each).
    for (wr_id, old) in [(2, true), (3, false)] {
        let (mut pair, mr, mw, rkey) = bound_window(MwType::Type1, Access::REMOTE_WRITE);
        let unbind = MwBind { length: 0, ..binding(&mr, 0, 0, Access(0)) };
        assert_eq!(outcomes(&on_b(&mut pair, bind_wr(1, rkey, 0x51, unbind))), [(1, WcStatus::Success)]);
        let info = pair.b.engine.query_mw(mw).unwrap();
        assert_eq!((info.rkey, info.binding), (with_key(rkey, 0x51), None));
        let key = if old { rkey } else { info.rkey };
        let wcs = from_a(&mut pair, wr_id, remote_write(0x100, key), 8);
        assert_eq!(outcomes(&wcs), [(wr_id, WcStatus::RemAccessErr)]);
    }
}

#[test]
fn send_with_invalidate_invalidates_the_window_once_the_message_is_placed() {
    for len in [8u32, 3000] {
        let (mut pair, _, mw, rkey) = bound_window(MwType::Type2, Access::REMOTE_WRITE);
        pair.b.post_recv(1, 0x1_0000, 4096);
        let data = pattern(len as usize, 9);
        pair.a.fill(0, &data);
        let wcs = from_a(&mut pair, 2, SendOp::SendWithInv { rkey }, len);
        assert_eq!(wcs.len(), 1);
        assert_eq!((wcs[0].status, wcs[0].opcode), (WcStatus::Success, WcOpcode::Send));
        let want: &[Opcode] = if len == 8 {
            &[Opcode::RC_SEND_ONLY_WITH_INVALIDATE]
        } else {
            &[Opcode::RC_SEND_FIRST, Opcode::RC_SEND_MIDDLE, Opcode::RC_SEND_LAST_WITH_INVALIDATE]
        };
        assert_eq!(pair.opcodes(true), want);
        let recv = pair.b.poll_all();
        assert_eq!(recv.len(), 1);
        assert_eq!((recv[0].status, recv[0].opcode, recv[0].byte_len), (WcStatus::Success, WcOpcode::Recv, len));
        assert_eq!((recv[0].invalidated_rkey, recv[0].imm_data), (Some(rkey), None));
        assert_eq!(pair.b.read(0x1_0000, len as usize), &data[..]);
        assert_eq!(pair.b.engine.query_mw(mw).unwrap().binding, None, "free again");
        let after = from_a(&mut pair, 3, remote_write(0x100, rkey), 8);
        assert_eq!(outcomes(&after), [(3, WcStatus::RemAccessErr)]);
    }
}

#[test]
fn a_send_with_invalidate_that_cannot_invalidate_fails_both_ends() {
    // What the IETH names: a region (user regions are never invalidated), a type 1 window,
    // a free window, a window bound to another QP, a key that names nothing.
    type Case = (&'static str, fn(&mut Pair) -> RKey);
    let cases: [Case; 5] = [
        ("a region", |p| p.b.mr.rkey),
        ("a type 1 window", |_| bound_window(MwType::Type1, Access::REMOTE_READ).3),
        ("a free window", |p| p.b.engine.alloc_mw(p.b.pd, MwType::Type2).unwrap().1),
        ("a window of another QP", |p| {
            // Bound by a second QP of B's, connected to a second QP of A's.
            let (ai, bi) = (init_attr(&p.a, QpType::Rc), init_attr(&p.b, QpType::Rc));
            let (_, other) = p.add_connected(&ai, &bi, Mtu::Mtu1024);
            let mr = window_region(&mut p.b, Access::LOCAL_WRITE | Access::MW_BIND);
            let (mw, rkey) = p.b.engine.alloc_mw(p.b.pd, MwType::Type2).unwrap();
            let bind = SendOp::BindMw { mw, rkey, bind: binding(&mr, 0, 64, Access::REMOTE_READ) };
            p.b.engine.post_send(other, &[wr(99, bind, &[])], &p.b.mem).unwrap();
            p.drive();
            assert_eq!(outcomes(&p.b.poll_all()), [(99, WcStatus::Success)]);
            rkey
        }),
        ("nothing", |p| RKey(p.b.mr.rkey.0 ^ 0x8000_0000)),
    ];
    for (what, target) in cases {
        let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
        let rkey = target(&mut pair);
        pair.b.post_recv(1, 0x1_0000, 64);
        pair.b.post_recv(2, 0x2_0000, 64);
        let wcs = from_a(&mut pair, 3, SendOp::SendWithInv { rkey }, 8);
        assert_eq!(outcomes(&wcs), [(3, WcStatus::RemInvReqErr)], "{what}");
        assert_eq!(outcomes(&pair.b.poll_all()), [(1, WcStatus::RemInvReqErr), (2, WcStatus::WrFlushErr)], "{what}");
        assert_eq!(pair.b.engine.qp_state(pair.b.qp), Some(QpState::Err), "{what}");
        assert!(pair.log.iter().any(|p| p.syndrome() == Some(Syndrome::Nak(NakCode::InvalidRequest))), "{what}");
    }
}

#[test]
fn a_type2_window_is_reached_only_through_the_qp_that_bound_it() {
    let (mut pair, _, _, rkey) = bound_window(MwType::Type2, Access::REMOTE_WRITE);
    let (ai, bi) = (init_attr(&pair.a, QpType::Rc), init_attr(&pair.b, QpType::Rc));
    let (aq, _) = pair.add_connected(&ai, &bi, Mtu::Mtu1024);
    let sge = pair.a.sge(0, 8);
    pair.a.engine.post_send(aq, &[wr(1, remote_write(0x100, rkey), &[sge])], &pair.a.mem).unwrap();
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::RemAccessErr)]);
    // Through the QP that bound it, the same write goes.
    let (mut pair, _, _, rkey) = bound_window(MwType::Type2, Access::REMOTE_WRITE);
    assert_eq!(outcomes(&from_a(&mut pair, 2, remote_write(0x100, rkey), 8)), [(2, WcStatus::Success)]);
}

#[test]
fn a_zero_based_window_takes_offsets_from_its_start() {
    let access = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::ZERO_BASED;
    let (mut pair, _, _, rkey) = bound_window(MwType::Type2, access);
    pair.a.fill(0, b"zero-based");
    let op = SendOp::RdmaWrite { remote_addr: 0x10, rkey };
    assert_eq!(outcomes(&from_a(&mut pair, 1, op, 10)), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(WIN + 0x110, 10), b"zero-based");
    let op = SendOp::RdmaRead { remote_addr: 0x1f8, rkey };
    assert_eq!(outcomes(&from_a(&mut pair, 2, op, 8)), [(2, WcStatus::Success)]);
    assert_eq!(pair.a.read(0, 8), pair.b.read(WIN + 0x2f8, 8));
    assert_eq!(outcomes(&from_a(&mut pair, 3, op, 9)), [(3, WcStatus::RemAccessErr)], "past its length");
}

#[test]
fn deallocated_windows_reach_nothing_and_bound_regions_stay_registered() {
    let (mut pair, mr, mw, rkey) = bound_window(MwType::Type2, Access::REMOTE_WRITE);
    // IBA 10.6.7.2.6, rxe: a region with windows bound is neither deregistered nor changed.
    let err = pair.b.engine.dereg_mr(mr.lkey).unwrap_err();
    assert!(matches!(&err, VerbsError::Invalid(m) if m.contains("memory windows")), "{err}");
    let err = pair.b.engine.rereg_mr(mr.lkey, None, None, Some(Access::LOCAL_WRITE)).unwrap_err();
    assert!(matches!(&err, VerbsError::Invalid(m) if m.contains("memory windows")), "{err}");
    let err = pair.b.engine.dealloc_pd(pair.b.pd).unwrap_err();
    assert!(matches!(&err, VerbsError::Busy(m) if m.contains("MWs")), "{err}");
    pair.b.engine.dealloc_mw(mw).unwrap();
    assert_eq!(pair.b.engine.query_mw(mw), None);
    assert!(matches!(pair.b.engine.dealloc_mw(mw), Err(VerbsError::NotFound { kind: "MW", .. })));
    pair.b.engine.rereg_mr(mr.lkey, None, None, Some(Access::LOCAL_WRITE | Access::MW_BIND)).unwrap();
    pair.b.engine.dereg_mr(mr.lkey).unwrap();
    assert_eq!(outcomes(&from_a(&mut pair, 1, remote_write(0x100, rkey), 8)), [(1, WcStatus::RemAccessErr)]);

    // dereg_mr_unbinding (for an owner about to free the memory) unbinds them instead.
    let (mut pair, mr, mw, rkey) = bound_window(MwType::Type2, Access::REMOTE_WRITE);
    pair.b.engine.dereg_mr_unbinding(mr.lkey).unwrap();
    assert_eq!(pair.b.engine.query_mw(mw).unwrap().binding, None);
    assert_eq!(outcomes(&from_a(&mut pair, 1, remote_write(0x100, rkey), 8)), [(1, WcStatus::RemAccessErr)]);

    // A destroyed QP frees the type 2 windows it bound.
    let (mut pair, _, mw, _) = bound_window(MwType::Type2, Access::REMOTE_WRITE);
    pair.b.engine.destroy_qp(pair.b.qp).unwrap();
    assert_eq!(pair.b.engine.query_mw(mw).unwrap().binding, None);
}

#[test]
fn local_operations_take_effect_when_reached_and_complete_in_order() {
    // A's own windows: a WRITE in flight, then a BIND_MW, then a LOCAL_INV of it.
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let mr = window_region(&mut pair.a, Access::LOCAL_WRITE | Access::MW_BIND);
    let (mw, rkey) = pair.a.engine.alloc_mw(pair.a.pd, MwType::Type2).unwrap();
    let sge = pair.a.sge(0, 4000);
    let target = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: pair.b.mr.rkey };
    pair.a.post_send(wr(1, target, &[sge]));
    pair.a.post_send(bind_wr(2, rkey, 1, binding(&mr, 0, 64, Access::REMOTE_READ)));
    pair.a.post_send(wr(3, SendOp::LocalInv { rkey: with_key(rkey, 1) }, &[]));
    pair.drive_for(Duration::from_nanos(1)); // the WRITE is sent, not yet acknowledged
    assert_eq!(pair.opcodes(true).len(), 4);
    assert!(pair.a.engine.query_mw(mw).unwrap().binding.is_some(), "the bind took effect when reached");
    assert_eq!(pair.a.poll_all(), [], "but completes after the WRITE before it");
    pair.drive();
    let wcs = pair.a.poll_all();
    assert_eq!(outcomes(&wcs), [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
    let ops: Vec<WcOpcode> = wcs.iter().map(|w| w.opcode).collect();
    assert_eq!(ops, [WcOpcode::RdmaWrite, WcOpcode::BindMw, WcOpcode::LocalInv]);
    assert_eq!(pair.a.engine.query_mw(mw).unwrap().binding, None, "the LOCAL_INV ran after both");
}

#[test]
fn local_invalidate_waits_for_every_earlier_work_request() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let mr = window_region(&mut pair.a, Access::LOCAL_WRITE | Access::MW_BIND);
    let (mw, rkey) = pair.a.engine.alloc_mw(pair.a.pd, MwType::Type2).unwrap();
    pair.a.post_send(bind_wr(1, rkey, 1, binding(&mr, 0, 64, Access::REMOTE_READ)));
    let sge = pair.a.sge(0, 8);
    pair.b.post_recv(9, 0, 64);
    pair.a.post_send(wr(2, SendOp::Send, &[sge]));
    pair.a.post_send(wr(3, SendOp::LocalInv { rkey: with_key(rkey, 1) }, &[]));
    pair.drive_for(Duration::from_nanos(1));
    assert!(pair.a.engine.query_mw(mw).unwrap().binding.is_some(), "the SEND is not acknowledged yet");
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!(pair.a.engine.query_mw(mw).unwrap().binding, None);
}

#[test]
fn a_failed_bind_behind_outstanding_requests_completes_after_them() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let (_, rkey) = pair.a.engine.alloc_mw(pair.a.pd, MwType::Type2).unwrap();
    let sge = pair.a.sge(0, 3000);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: pair.b.mr.rkey }, &[sge]));
    // The node's region lacks MW_BIND.
    let bad = MwBind { mr: pair.a.mr.lkey, addr: BASE, length: 64, access: Access::REMOTE_READ };
    pair.a.post_send(bind_wr(2, rkey, 1, bad));
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(3, SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: pair.b.mr.rkey }, &[sge]));
    pair.drive();
    let wcs = pair.a.poll_all();
    assert_eq!(outcomes(&wcs), [(1, WcStatus::Success), (2, WcStatus::MwBindErr), (3, WcStatus::WrFlushErr)]);
    assert_eq!(pair.opcodes(true).len(), 3, "nothing after the failed bind was sent");
}

#[test]
fn go_back_n_does_not_bind_twice() {
    // A type 2 bind done twice would fail the second time (the window is no longer free).
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let mr = window_region(&mut pair.a, Access::LOCAL_WRITE | Access::MW_BIND);
    let (mw, rkey) = pair.a.engine.alloc_mw(pair.a.pd, MwType::Type2).unwrap();
    let mut dropped = false;
    pair.set_filter(move |p| {
        // The WRITE's first packet, once: the WRITE and everything after it go again.
        let first = p.from_a && p.opcode() == Opcode::RC_RDMA_WRITE_FIRST && !dropped;
        dropped |= first;
        !first
    });
    let write = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: pair.b.mr.rkey };
    let sge = pair.a.sge(0, 3000);
    pair.a.post_send(wr(1, write, &[sge]));
    pair.a.post_send(bind_wr(2, rkey, 1, binding(&mr, 0, 64, Access::REMOTE_READ)));
    let sge = pair.a.sge(0, 8);
    pair.a.post_send(wr(3, write, &[sge]));
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
    assert!(pair.a.engine.counters().retransmitted_packets > 0);
    assert_eq!(pair.a.engine.query_mw(mw).unwrap().rkey, with_key(rkey, 1));
}

#[test]
fn memory_window_work_requests_are_checked_when_posted() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let (mw, rkey) = pair.b.engine.alloc_mw(pair.b.pd, MwType::Type2).unwrap();
    let bind =
        SendOp::BindMw { mw, rkey, bind: MwBind { mr: pair.b.mr.lkey, addr: BASE, length: 8, access: Access(0) } };
    let sge = [pair.b.sge(0, 8)];
    let err = pair.b.try_post_send(&[wr(1, bind, &sge)]).unwrap_err();
    assert!(err.to_string().contains("no SGEs"), "{err}");
    let inline = wr_with(1, SendOp::LocalInv { rkey }, &[], SendFlags::INLINE);
    assert!(pair.b.try_post_send(&[inline]).unwrap_err().to_string().contains("INLINE"));

    let mut uc = Pair::connected(QpType::Uc, Mtu::Mtu1024);
    let err = uc.a.try_post_send(&[wr(1, SendOp::SendWithInv { rkey }, &sge)]).unwrap_err();
    assert!(err.to_string().contains("RC only"), "{err}");
    uc.a.try_post_send(&[wr(2, SendOp::LocalInv { rkey }, &[])]).unwrap(); // UC may (and fails it: no such window)
    let mut ud = Pair::connected(QpType::Ud, Mtu::Mtu1024);
    let err = ud.a.try_post_send(&[wr(1, bind, &[])]).unwrap_err();
    assert!(err.to_string().contains("UD QPs"), "{err}");
}

#[test]
fn window_rkeys_never_share_an_index_with_region_keys() {
    let mut engine = Engine::new(DeviceConfig { max_mw: 300, ..DeviceConfig::default() });
    let pd = engine.alloc_pd();
    let mut indexes = BTreeSet::new();
    for i in 0..300 {
        let (mw, rkey) = engine.alloc_mw(pd, if i % 2 == 0 { MwType::Type1 } else { MwType::Type2 }).unwrap();
        assert_eq!(rkey.0 >> 8, mw.0);
        assert!(indexes.insert(mw.0), "window indexes are distinct");
        let keys = engine.reg_mr(pd, BASE, 4096, Access::LOCAL_WRITE).unwrap();
        assert!(!indexes.contains(&(keys.lkey.0 >> 8)) && !indexes.contains(&(keys.rkey.0 >> 8)));
    }
    assert!(matches!(engine.alloc_mw(pd, MwType::Type1), Err(VerbsError::NoResources(_))), "max_mw");
}

#[test]
fn sqd_does_no_local_operation_and_rts_does_it() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let mr = window_region(&mut pair.a, Access::LOCAL_WRITE | Access::MW_BIND);
    let (mw, rkey) = pair.a.engine.alloc_mw(pair.a.pd, MwType::Type2).unwrap();
    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Sqd), AttrMask::STATE).unwrap();
    pair.a.post_send(bind_wr(1, rkey, 1, binding(&mr, 0, 64, Access::REMOTE_READ)));
    pair.drive();
    assert_eq!((pair.a.engine.query_mw(mw).unwrap().binding, pair.a.poll_all()), (None, vec![]));
    pair.a.engine.modify_qp(pair.a.qp, &state(QpState::Rts), AttrMask::STATE).unwrap();
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
    assert!(pair.a.engine.query_mw(mw).unwrap().binding.is_some());
}

/// FLUSH (IBA 1.5, rxe's responder): a range or the whole region, to global visibility or
/// persistence, needs the placement in the region's and in the target QP's access flags;
/// it goes as `RC_FLUSH` with a RETH and a FETH and is answered by a zero-length READ
/// response; what it may not do is a remote access error, and the QP fails.
#[test]
fn flush_needs_the_placement_in_the_region_and_the_qp_and_is_answered_as_a_read() {
    let flush =
        |remote_addr, rkey, length, placement, level| SendOp::Flush { remote_addr, rkey, length, placement, level };
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let both = Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT;
    let rts = QpAttr { qp_state: QpState::Rts, qp_access_flags: Access::ALL | both, ..QpAttr::default() };
    pair.b.engine.modify_qp(pair.b.qp, &rts, AttrMask::ACCESS_FLAGS).unwrap();
    let region = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::FLUSH_GLOBAL;
    let keys = pair.b.engine.reg_mr(pair.b.pd, BASE + 0x8000, 0x1000, region).unwrap();
    let at = BASE + 0x8100;
    pair.a.post_send(wr(1, flush(at, keys.rkey, 64, SendOp::FLUSH_GLOBAL, SendOp::FLUSH_RANGE), &[]));
    // The whole region: the RETH's address is not looked at.
    pair.a.post_send(wr(2, flush(0, keys.rkey, 0, SendOp::FLUSH_GLOBAL, SendOp::FLUSH_MR), &[]));
    pair.drive();
    let wcs = pair.a.poll_all();
    assert_eq!(
        outcomes(&wcs),
        [(1, WcStatus::Success), (2, WcStatus::Success)],
        "{:?} {:?}",
        pair.opcodes(false),
        pair.b.engine.counters()
    );
    assert!(wcs.iter().all(|w| w.opcode == WcOpcode::Flush));
    let from_a: Vec<_> = pair.log.iter().filter(|p| p.from_a).collect();
    use softrdma_wire::{RocePacket, RoceRepr};
    let req = RoceRepr::parse_ignoring_icrc(&RocePacket::new_checked(&from_a[0].bytes[..]).unwrap()).unwrap();
    assert_eq!(req.bth.opcode, Opcode::RC_FLUSH);
    assert_eq!(req.ext.feth.map(|f| (f.selectivity, f.placement_type)), Some((0, 1)));
    assert_eq!(req.ext.reth.map(|r| (r.virtual_address, r.dma_length)), Some((at, 64)));
    assert_eq!(pair.opcodes(false)[..2], [Opcode::RC_RDMA_READ_RESPONSE_ONLY; 2]);
    let resp = pair.log.iter().find(|p| !p.from_a).unwrap();
    assert!(
        RoceRepr::parse_ignoring_icrc(&RocePacket::new_checked(&resp.bytes[..]).unwrap()).unwrap().payload.is_empty()
    );

    // Persistence the region does not allow; a range past its end; a region without FLUSH:
    // remote access errors.
    for case in ["persistence", "out of the region", "a region without FLUSH"] {
        let mut p = Pair::connected(QpType::Rc, Mtu::Mtu1024);
        p.b.engine.modify_qp(p.b.qp, &rts, AttrMask::ACCESS_FLAGS).unwrap();
        let k = p.b.engine.reg_mr(p.b.pd, BASE + 0x8000, 0x1000, region).unwrap();
        let op = match case {
            "persistence" => flush(at, k.rkey, 64, SendOp::FLUSH_PERSISTENT, SendOp::FLUSH_RANGE),
            "out of the region" => flush(BASE + 0x8f00, k.rkey, 0x200, SendOp::FLUSH_GLOBAL, SendOp::FLUSH_RANGE),
            _ => flush(BASE, p.b.mr.rkey, 8, SendOp::FLUSH_GLOBAL, SendOp::FLUSH_RANGE),
        };
        p.a.post_send(wr(1, op, &[]));
        p.drive();
        assert_eq!(outcomes(&p.a.poll_all()), [(1, WcStatus::RemAccessErr)], "{case}");
    }
    // A QP that does not allow FLUSH.
    let mut p = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let k = p.b.engine.reg_mr(p.b.pd, BASE + 0x8000, 0x1000, region).unwrap();
    p.a.post_send(wr(1, flush(BASE + 0x8000, k.rkey, 8, SendOp::FLUSH_GLOBAL, SendOp::FLUSH_RANGE), &[]));
    p.drive();
    assert_eq!(outcomes(&p.a.poll_all()), [(1, WcStatus::RemAccessErr)], "the QP's access flags");
    // Refused at post: SGEs, no placement, an unknown level.
    let sge = [p.a.sge(0, 8)];
    for (op, sg, why) in [
        (flush(0, k.rkey, 8, SendOp::FLUSH_GLOBAL, 0), &sge[..], "no SGEs"),
        (flush(0, k.rkey, 8, 0, 0), &[][..], "IBV_FLUSH_GLOBAL (1)"),
        (flush(0, k.rkey, 8, SendOp::FLUSH_GLOBAL, 2), &[][..], "IBV_FLUSH_MR (1)"),
    ] {
        let err = p.a.try_post_send(&[wr(9, op, sg)]).unwrap_err();
        assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains(why)), "{err}");
    }
}
