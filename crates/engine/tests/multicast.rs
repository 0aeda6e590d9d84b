//! UD multicast (rxe `rxe_mcast.c`, `rxe_rcv_mcast_pkt`): QPs attached to a group each get
//! a copy of a packet to QPN 0xFFFFFF and the group's address, under their own Q_Key;
//! QPs not attached never see it; the device's limits are `max_mcast_*`.

mod common;

use std::net::IpAddr;

use common::*;
use softrdma_engine::*;
use softrdma_wire::grh::{GRH_LEN, GrhRepr};
use softrdma_wire::{Gid, Opcode, QKey, Qpn};

const QKEY: QKey = QKey(0x1111_1111); // what common::connect gives UD QPs

fn group(ip: &str) -> Gid {
    Gid::from_ip(ip.parse::<IpAddr>().unwrap())
}

/// One more UD QP on `n`'s PD and CQ, in RTS with `qkey`.
fn ud_qp(n: &mut Node, qkey: QKey) -> Qpn {
    let qp = n.engine.create_qp(&init_attr(n, QpType::Ud)).unwrap();
    let init = QpAttr { qp_state: QpState::Init, qkey, ..QpAttr::default() };
    let mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY;
    n.engine.modify_qp(qp, &init, mask).unwrap();
    n.engine.modify_qp(qp, &QpAttr { qp_state: QpState::Rtr, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    let rts = QpAttr { qp_state: QpState::Rts, sq_psn: 1, ..QpAttr::default() };
    n.engine.modify_qp(qp, &rts, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
    qp
}

fn post_recv_on(n: &mut Node, qp: Qpn, wr_id: u64, offset: u64) {
    let sge = n.sge(offset, (GRH_LEN + 256) as u32);
    n.engine.post_recv(qp, &[RecvWr { wr_id, sg_list: &[sge] }]).unwrap();
}

/// A's UD SEND of `msg` to `gid`, QPN 0xFFFFFF, Q_Key `qkey`.
fn send_to_group(pair: &mut Pair, gid: Gid, msg: &[u8], qkey: QKey) {
    let av = AddressVector { dgid: gid, sgid_index: 0, hop_limit: 1, traffic_class: 0, flow_label: 0 };
    let ah = pair.a.engine.create_ah(pair.a.pd, av).unwrap();
    pair.a.fill(0, msg);
    let sge = pair.a.sge(0, msg.len() as u32);
    let dest = UdDest { ah, remote_qpn: Qpn::MULTICAST, remote_qkey: qkey };
    pair.a.post_send(ud_send(7, SendOp::Send, &[sge], dest));
    pair.drive();
}

/// The receive completions on B's CQ, as (QP, wr_id).
fn received(pair: &mut Pair) -> Vec<(Qpn, u64)> {
    pair.b.poll_all().iter().filter(|w| w.opcode == WcOpcode::Recv).map(|w| (w.qp_num, w.wr_id)).collect()
}

#[test]
fn every_attached_qp_gets_a_copy_and_no_other_qp_sees_it() {
    let mut pair = Pair::connected(QpType::Ud, Mtu::Mtu1024);
    let g = group("230.1.2.3");
    let (b1, b2, b3) = (pair.b.qp, ud_qp(&mut pair.b, QKEY), ud_qp(&mut pair.b, QKEY));
    let other_key = ud_qp(&mut pair.b, QKey(0x2222_2222));
    for qp in [b1, b2, other_key] {
        pair.b.engine.attach_mcast(qp, g).unwrap();
    }
    assert_eq!(pair.b.engine.mcast_groups().collect::<Vec<_>>(), [g]);
    assert_eq!(pair.b.engine.mcast_members(g), [b1, b2, other_key]);
    for (i, qp) in [b1, b2, b3, other_key].into_iter().enumerate() {
        post_recv_on(&mut pair.b, qp, i as u64 + 1, 0x1000 * (i as u64 + 1));
    }
    let dropped = pair.b.engine.counters().rcvd_dropped;

    send_to_group(&mut pair, g, b"to the group", QKEY);
    let sent = pair.sent(true);
    assert_eq!(sent.len(), 1, "one packet on the wire, whatever the group's size");
    assert_eq!(sent[0].opcode(), Opcode::UD_SEND_ONLY);
    assert_eq!(sent[0].envelope.dst_ip(), "230.1.2.3".parse::<IpAddr>().unwrap());
    let bth = softrdma_wire::RocePacket::new_checked(&sent[0].bytes[..]).unwrap().bth().dest_qp();
    assert_eq!(bth, Qpn::MULTICAST);

    assert_eq!(received(&mut pair), [(b1, 1), (b2, 2)], "the attached QPs with the group's Q_Key, in attach order");
    assert_eq!(pair.b.engine.counters().rcvd_dropped, dropped + 1, "the other Q_Key's copy is dropped");
    for offset in [0x1000, 0x2000] {
        assert_eq!(pair.b.read(offset + GRH_LEN as u64, 12), b"to the group");
        let GrhRepr::V4(h) = GrhRepr::parse(pair.b.read(offset, GRH_LEN)).unwrap() else { panic!("IPv4 GRH") };
        assert_eq!((h.source, h.destination), ([10, 0, 0, 1], [230, 1, 2, 3]), "the GRH names the group");
    }
    let send = pair.a.poll().unwrap();
    assert_eq!((send.wr_id, send.status), (7, WcStatus::Success));

    // b3 never attached and other_key's Q_Key differs: their receives are still posted.
    pair.b.engine.attach_mcast(b3, g).unwrap();
    send_to_group(&mut pair, g, b"second", QKEY);
    assert_eq!(received(&mut pair), [(b3, 3)], "b1 and b2 have no receive left; b3 now has it");
}

#[test]
fn a_detached_or_destroyed_qp_no_longer_receives() {
    let mut pair = Pair::connected(QpType::Ud, Mtu::Mtu1024);
    let g = group("239.0.0.7");
    let (b1, b2) = (pair.b.qp, ud_qp(&mut pair.b, QKEY));
    pair.b.engine.attach_mcast(b1, g).unwrap();
    pair.b.engine.attach_mcast(b1, g).unwrap(); // twice is once (rxe)
    pair.b.engine.attach_mcast(b2, g).unwrap();
    assert_eq!(pair.b.engine.mcast_members(g), [b1, b2]);
    post_recv_on(&mut pair.b, b1, 1, 0x1000);
    post_recv_on(&mut pair.b, b2, 2, 0x2000);

    pair.b.engine.detach_mcast(b1, g).unwrap();
    send_to_group(&mut pair, g, b"one", QKEY);
    assert_eq!(received(&mut pair), [(b2, 2)]);
    let e = pair.b.engine.detach_mcast(b1, g).unwrap_err();
    assert!(matches!(e, VerbsError::Invalid(_)), "detaching what is not attached is EINVAL: {e:?}");

    // Destroying an attached QP detaches it; the group goes with its last QP.
    pair.b.engine.destroy_qp(b2).unwrap();
    assert_eq!(pair.b.engine.mcast_groups().count(), 0);
    let dropped = pair.b.engine.counters().rcvd_dropped;
    send_to_group(&mut pair, g, b"two", QKEY);
    assert_eq!(received(&mut pair), [], "b1's receive is still posted, and it is not attached");
    assert_eq!(pair.b.engine.counters().rcvd_dropped, dropped + 1);
}

#[test]
fn the_sender_receives_its_own_packet_when_attached() {
    // Multicast loops back to the sending host (IP_MULTICAST_LOOP): a device hands its own
    // packet to its attached QPs, the sender's too if it is one of them.
    let mut pair = Pair::connected(QpType::Ud, Mtu::Mtu1024);
    let g = group("230.9.9.9");
    let a = pair.a.qp;
    pair.a.engine.attach_mcast(a, g).unwrap();
    pair.a.post_recv(1, 0x8000, (GRH_LEN + 64) as u32);
    send_to_group(&mut pair, g, b"echo", QKEY);
    let p = pair.sent(true)[0].clone();
    pair.a.engine.handle_datagram(pair.now, &p.envelope, &p.bytes, &mut pair.a.mem);
    let wcs = pair.a.poll_all();
    let recv = wcs.iter().find(|w| w.opcode == WcOpcode::Recv).expect("the looped-back copy");
    assert_eq!((recv.qp_num, recv.src_qp, recv.status), (a, a, WcStatus::Success));
    assert_eq!(pair.a.read(0x8000 + GRH_LEN as u64, 4), b"echo");
}

#[test]
fn ipv6_groups_work_the_same() {
    let a = node_at("fd00::1".parse().unwrap(), 1, QpType::Ud);
    let b = node_at("fd00::2".parse().unwrap(), 2, QpType::Ud);
    let mut pair = pair_of(a, b, QpType::Ud, Mtu::Mtu1024);
    let g = group("ff0e::1:2");
    pair.b.engine.attach_mcast(pair.b.qp, g).unwrap();
    pair.b.post_recv(1, 0, (GRH_LEN + 64) as u32);
    send_to_group(&mut pair, g, b"six", QKEY);
    let wc = pair.b.poll().unwrap();
    assert_eq!((wc.status, wc.grh), (WcStatus::Success, Some(NetworkHdr::Ipv6)));
    let GrhRepr::V6(h) = GrhRepr::parse(pair.b.read(0, GRH_LEN)).unwrap() else { panic!("IPv6 GRH") };
    assert_eq!(h.destination, "ff0e::1:2".parse::<std::net::Ipv6Addr>().unwrap().octets());
    assert_eq!(pair.b.read(GRH_LEN as u64, 3), b"six");
}

#[test]
fn only_ud_packets_to_qpn_0xffffff_and_a_group_reach_attached_qps() {
    let mut pair = Pair::connected(QpType::Ud, Mtu::Mtu1024);
    let g = group("230.1.1.1");
    pair.b.engine.attach_mcast(pair.b.qp, g).unwrap();
    pair.b.post_recv(1, 0, (GRH_LEN + 64) as u32);
    // To the group, but the QP's own number: not a multicast packet, and the group is no
    // address of the device.
    let av = AddressVector { dgid: g, sgid_index: 0, hop_limit: 1, traffic_class: 0, flow_label: 0 };
    let ah = pair.a.engine.create_ah(pair.a.pd, av).unwrap();
    let sge = pair.a.sge(0, 8);
    let dest = UdDest { ah, remote_qpn: pair.b.qp, remote_qkey: QKEY };
    pair.a.post_send(ud_send(1, SendOp::Send, &[sge], dest));
    pair.drive();
    // To QPN 0xFFFFFF at B's unicast address: no group.
    let ah = pair.a.ah_to(pair.b.addr);
    let dest = UdDest { ah, remote_qpn: Qpn::MULTICAST, remote_qkey: QKEY };
    pair.a.post_send(ud_send(2, SendOp::Send, &[sge], dest));
    pair.drive();
    assert_eq!(pair.sent(true).len(), 2);
    assert_eq!(received(&mut pair), []);
    assert_eq!(pair.b.engine.counters().rcvd_dropped, 2);
}

#[test]
fn attach_checks_the_gid_the_qp_type_and_the_limits() {
    let mut n = node_configured([10, 0, 0, 1], 1, QpType::Ud, QpCap::default(), &|c| {
        c.max_mcast_grp = 2;
        c.max_mcast_qp_attach = 2;
        c.max_total_mcast_qp_attach = 3;
    });
    let einval = |r: Result<(), VerbsError>| matches!(r, Err(VerbsError::Invalid(_)));
    let enomem = |r: Result<(), VerbsError>| matches!(r, Err(VerbsError::NoResources(_)));
    let qp = n.qp;
    for unicast in ["10.0.0.1", "223.1.1.1", "fe80::1", "::1"] {
        assert!(einval(n.engine.attach_mcast(qp, group(unicast))), "{unicast}");
    }
    let rc = n.engine.create_qp(&init_attr(&n, QpType::Rc)).unwrap();
    let uc = n.engine.create_qp(&init_attr(&n, QpType::Uc)).unwrap();
    assert!(einval(n.engine.attach_mcast(rc, group("230.0.0.1"))));
    assert!(einval(n.engine.attach_mcast(uc, group("230.0.0.1"))));
    assert!(matches!(
        n.engine.attach_mcast(Qpn::from_u24_truncating(0x777), group("230.0.0.1")),
        Err(VerbsError::NotFound { .. })
    ));

    let (q2, q3) = (ud_qp(&mut n, QKEY), ud_qp(&mut n, QKEY));
    let (g1, g2, g3) = (group("230.0.0.1"), group("ff1e::5"), group("230.0.0.3"));
    n.engine.attach_mcast(qp, g1).unwrap();
    n.engine.attach_mcast(q2, g1).unwrap();
    assert!(enomem(n.engine.attach_mcast(q3, g1)), "max_mcast_qp_attach: 2 per group");
    n.engine.attach_mcast(qp, g2).unwrap();
    assert!(enomem(n.engine.attach_mcast(qp, g3)), "max_mcast_grp: 2 groups");
    assert!(enomem(n.engine.attach_mcast(q2, g2)), "max_total_mcast_qp_attach: 3 in all");
    n.engine.attach_mcast(qp, g1).unwrap(); // already attached: no new attachment, no error
    n.engine.detach_mcast(q2, g1).unwrap();
    n.engine.attach_mcast(q3, g2).unwrap();
    n.engine.detach_mcast(qp, g1).unwrap();
    n.engine.attach_mcast(q3, g3).unwrap();
    assert_eq!(n.engine.mcast_groups().collect::<Vec<_>>(), [g3, g2]);
    assert!(einval(n.engine.detach_mcast(q2, g1)), "a group with no QP");
}
