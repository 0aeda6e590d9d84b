//! UD datagrams with address handles and the 40-byte GRH, and a shared receive queue, over
//! real loopback sockets.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::*;
use softrdma::*;

#[test]
fn ud_receive_starts_with_the_grh_of_the_sender() {
    let port = test_port();
    let (a, b) = (ud_side([127, 0, 0, 1], port), ud_side([127, 0, 0, 2], port));
    let rsge = [b.mr.sge(0..2048).unwrap()];
    b.qp.post_recv(&[RecvWr { wr_id: 4, sg_list: &rsge }]).unwrap();
    let av =
        AddressVector { dgid: b.ctx.gid(0).unwrap(), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let ah = a.pd.create_ah(av).unwrap();
    a.mr.write(0, b"a datagram").unwrap();
    let sge = [a.mr.sge(0..10).unwrap()];
    let dest = UdDest { ah: ah.id(), remote_qpn: Qpn::from_u24_truncating(b.qp.qpn()), remote_qkey: QKey(0x1111_2222) };
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &sge,
        flags: SendFlags::SIGNALED,
        ud: Some(dest),
        xrc_srqn: None,
    }])
    .unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let wc = b.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len, wc.grh), (4, WcStatus::Success, 40 + 10, Some(NetworkHdr::Ipv4)));
    assert_eq!(wc.src_qp.value(), a.qp.qpn());
    let mut got = [0u8; 50];
    b.mr.read(0, &mut got).unwrap();
    // An IPv4 GRH: 20 zero bytes, then the sender's IPv4 header (ibv_post_recv(3)).
    assert!(got[..20].iter().all(|&x| x == 0));
    assert_eq!(got[20] >> 4, 4, "IPv4 version");
    assert_eq!(IpAddr::from(Ipv4Addr::new(got[32], got[33], got[34], got[35])), IpAddr::from([127, 0, 0, 1]));
    assert_eq!(IpAddr::from(Ipv4Addr::new(got[36], got[37], got[38], got[39])), IpAddr::from([127, 0, 0, 2]));
    assert_eq!(&got[40..], b"a datagram");

    // ibv_create_ah_from_wc: the header answers with the sender as destination, the
    // address it was sent to as source; the reply reaches A.
    let reply = b.ctx.device().reply_av(&got[..40]).unwrap();
    assert_eq!((reply.dgid, reply.sgid_index), (a.ctx.gid(0).unwrap(), 0));
    assert_eq!(reply.hop_limit, 64, "the received TTL");
    let rah = b.pd.create_ah(reply).unwrap();
    a.qp.post_recv(&[RecvWr { wr_id: 5, sg_list: &[a.mr.sge(4096..6144).unwrap()] }]).unwrap();
    b.mr.write(100, b"the reply").unwrap();
    let dest = UdDest { ah: rah.id(), remote_qpn: wc.src_qp, remote_qkey: QKey(0x1111_2222) };
    let sge = [b.mr.sge(100..109).unwrap()];
    b.qp.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sg_list: &sge,
        flags: SendFlags::SIGNALED,
        ud: Some(dest),
        xrc_srqn: None,
    }])
    .unwrap();
    assert_eq!(b.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    assert_eq!(a.cq.wait(WAIT).unwrap().byte_len, 40 + 9);
    let mut got = [0u8; 9];
    a.mr.read(4096 + 40, &mut got).unwrap();
    assert_eq!(&got, b"the reply");

    // A header that is no IP header, and one sent to an address of another device.
    let err = b.ctx.device().reply_av(&[0xee; 40]).unwrap_err().to_string();
    assert!(err.contains("no IPv4 or IPv6 header"), "{err}");
    let err = a.ctx.device().reply_av(&got_header(&b)).unwrap_err().to_string();
    assert!(err.contains("127.0.0.2") && err.contains("not an address of"), "{err}");
}

#[test]
fn the_address_vectors_traffic_class_is_the_datagrams() {
    // An AH's traffic class (DSCP 46, "expedited forwarding") reaches the wire: the
    // receiver's GRH shows it, with the ECN bits the device sends with (ECT(0) when
    // congestion control runs, 0 otherwise).
    let port = test_port();
    let (a, b) = (ud_side([127, 0, 0, 1], port), ud_side([127, 0, 0, 2], port));
    b.qp.post_recv(&[RecvWr { wr_id: 4, sg_list: &[b.mr.sge(0..2048).unwrap()] }]).unwrap();
    let av =
        AddressVector { dgid: b.ctx.gid(0).unwrap(), sgid_index: 0, hop_limit: 64, traffic_class: 0xb8, flow_label: 0 };
    let ah = a.pd.create_ah(av).unwrap();
    let dest = UdDest { ah: ah.id(), remote_qpn: Qpn::from_u24_truncating(b.qp.qpn()), remote_qkey: QKey(0x1111_2222) };
    let sge = [a.mr.sge(0..8).unwrap()];
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &sge,
        flags: SendFlags::SIGNALED,
        ud: Some(dest),
        xrc_srqn: None,
    }])
    .unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    assert_eq!(b.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let tos = got_header(&b)[21];
    assert_eq!(tos & !0b11, 0xb8, "the DSCP of the AH, in the IPv4 header's TOS: {tos:#04x}");
    assert!(matches!(tos & 0b11, 0b00 | 0b10), "not ECT(0) or not-ECT: {tos:#04x}");
    assert_eq!(b.ctx.device().reply_av(&got_header(&b)).unwrap().traffic_class & !0b11, 0xb8);
}

/// The first 40 bytes of B's receive buffer (the GRH of A's datagram to 127.0.0.2).
fn got_header(b: &Side) -> [u8; 40] {
    let mut h = [0u8; 40];
    b.mr.read(0, &mut h).unwrap();
    h
}

#[test]
fn wrong_qkey_is_dropped_and_counted() {
    let port = test_port();
    let (a, b) = (ud_side([127, 0, 0, 1], port), ud_side([127, 0, 0, 2], port));
    let rsge = [b.mr.sge(0..2048).unwrap()];
    b.qp.post_recv(&[RecvWr { wr_id: 4, sg_list: &rsge }]).unwrap();
    let av =
        AddressVector { dgid: b.ctx.gid(0).unwrap(), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let ah = a.pd.create_ah(av).unwrap();
    let sge = [a.mr.sge(0..10).unwrap()];
    let dest = UdDest { ah: ah.id(), remote_qpn: Qpn::from_u24_truncating(b.qp.qpn()), remote_qkey: QKey(0xdead) };
    a.qp.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sg_list: &sge,
        flags: SendFlags::SIGNALED,
        ud: Some(dest),
        xrc_srqn: None,
    }])
    .unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success, "UD sends complete when sent");
    let deadline = std::time::Instant::now() + WAIT;
    while b.ctx.counters().engine.rcvd_dropped == 0 {
        assert!(std::time::Instant::now() < deadline, "the datagram never arrived");
        assert!(b.cq.poll_one().is_none(), "a wrong Q_Key must not complete a receive");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(b.cq.poll_one().is_none());
}

#[test]
fn two_rc_qps_share_one_srq() {
    let port = test_port();
    let (a, b) = (open([127, 0, 0, 1], port), open([127, 0, 0, 2], port));
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(64, None).unwrap(), b.create_cq(64, None).unwrap());
    let srq = pb.create_srq(16, 1).unwrap();
    let mb = pb.reg_mr(4 * 256, Access::LOCAL_WRITE).unwrap();
    let mut sges = Vec::new();
    for i in 0..4 {
        sges.push([mb.sge(i * 256..(i + 1) * 256).unwrap()]);
    }
    let wrs: Vec<RecvWr<'_>> = sges.iter().enumerate().map(|(i, s)| RecvWr { wr_id: i as u64, sg_list: s }).collect();
    srq.post_recv(&wrs).unwrap();
    let ma = pa.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    ma.write(0, b"from qp one, from qp two").unwrap();
    for k in 0..2 {
        let qa = pa.create_qp(&QpInit::new(QpType::Rc, &cqa)).unwrap();
        let mut init = QpInit::new(QpType::Rc, &cqb);
        init.srq = Some(&srq);
        let qb = pb.create_qp(&init).unwrap();
        qa.connect(1, &qb.endpoint(0, 2).unwrap(), &ConnectOptions::default()).unwrap();
        qb.connect(2, &qa.endpoint(0, 1).unwrap(), &ConnectOptions::default()).unwrap();
        let err = qb.post_recv(&[RecvWr { wr_id: 9, sg_list: &sges[0] }]).unwrap_err();
        assert!(matches!(err, Error::Post { index: 0, .. }), "a QP with an SRQ refuses post_recv: {err}");
        let sge = [ma.sge(k * 13..k * 13 + 10).unwrap()];
        qa.post_send(&[wr(k as u64, SendOp::Send, &sge)]).unwrap();
        assert_eq!(cqa.wait(WAIT).unwrap().status, WcStatus::Success);
        let wc = cqb.wait(WAIT).unwrap();
        assert_eq!((wc.wr_id, wc.status, wc.qp_num.value()), (k as u64, WcStatus::Success, qb.qpn()));
    }
    let mut got = [0u8; 10];
    mb.read(256, &mut got).unwrap();
    assert_eq!(&got, b"from qp tw");
}

/// A QP with an SRQ that goes to the error state queues IBV_EVENT_QP_LAST_WQE_REACHED;
/// destroying it takes its events with it (the kernel's destroy does), whether the driver
/// dispatched them to the context's queue already or not: its QPN may name another QP next,
/// and libibverbs would have no `ibv_qp` to name.
#[test]
fn a_destroyed_qp_leaves_no_asynchronous_events() {
    let port = test_port();
    let b = open([127, 0, 0, 1], port);
    let pb = b.alloc_pd().unwrap();
    let cqb = b.create_cq(64, None).unwrap();
    let srq = pb.create_srq(16, 1).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cqb);
    init.srq = Some(&srq);
    let error = QpAttr { qp_state: QpState::Err, ..QpAttr::default() };
    for wait_for_dispatch in [false, true] {
        let (kept, doomed) = (pb.create_qp(&init).unwrap(), pb.create_qp(&init).unwrap());
        kept.connect(1, &doomed.endpoint(0, 2).unwrap(), &ConnectOptions::default()).unwrap();
        doomed.connect(2, &kept.endpoint(0, 1).unwrap(), &ConnectOptions::default()).unwrap();
        for q in [&kept, &doomed] {
            q.modify(&error, AttrMask::STATE).unwrap();
        }
        if wait_for_dispatch {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let doomed_qpn = doomed.qpn();
        drop(doomed);
        let mut events = Vec::new();
        while let Some(e) = b.get_async_event(Some(std::time::Duration::from_millis(100))).unwrap() {
            events.push(e);
        }
        assert_eq!(
            events,
            [AsyncEvent::QpLastWqeReached(Qpn::from_u24_truncating(kept.qpn()))],
            "only the live QP's event (the destroyed one was {doomed_qpn:#x}; dispatched before: {wait_for_dispatch})"
        );
    }
}
