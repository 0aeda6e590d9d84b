//! UC and UD scenarios on a `Pair`, and the UD GRH checked against a kernel capture.

mod common;

use std::net::IpAddr;
use std::path::PathBuf;

use common::*;
use softrdma_engine::*;
use softrdma_pcap::CaptureReader;
use softrdma_wire::grh::{GRH_LEN, GrhRepr};
use softrdma_wire::{Gid, Opcode, QKey, Qpn, RKey, RocePacket, RoceRepr, UdpDatagram};

const QKEY: QKey = QKey(0x1111_1111); // what the harness gives every UD QP

fn ack_req(p: &Pkt) -> bool {
    RocePacket::new_checked(&p.bytes[..]).unwrap().bth().ack_req()
}

// ---- UC ---------------------------------------------------------------------------------------

#[test]
fn uc_send_and_write_land_without_a_single_ack() {
    let mut pair = Pair::connected(QpType::Uc, Mtu::Mtu256);
    let msg = pattern(600, 1);
    let blob = pattern(300, 2);
    pair.a.fill(0, &msg);
    pair.a.fill(0x1000, &blob);
    pair.b.post_recv(7, 0x8000, 1024);
    let send_sge = pair.a.sge(0, 600);
    let write_sge = pair.a.sge(0x1000, 300);
    let write = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0x4000), rkey: pair.b.mr.rkey };
    pair.a.post_send(wr(1, SendOp::Send, &[send_sge]));
    pair.a.post_send(wr(2, write, &[write_sge]));
    pair.drive();

    assert_eq!(
        pair.opcodes(true),
        [
            Opcode::UC_SEND_FIRST,
            Opcode::UC_SEND_MIDDLE,
            Opcode::UC_SEND_LAST,
            Opcode::UC_RDMA_WRITE_FIRST,
            Opcode::UC_RDMA_WRITE_LAST
        ]
    );
    assert!(pair.log.iter().all(|p| !ack_req(p)), "UC never asks for an ACK");
    assert!(pair.opcodes(false).is_empty(), "UC has no ACKs: the responder sends nothing");
    assert_eq!(pair.b.read(0x8000, 600), &msg[..]);
    assert_eq!(pair.b.read(0x4000, 300), &blob[..]);
    let recv = pair.b.poll().unwrap();
    assert_eq!((recv.wr_id, recv.status, recv.opcode, recv.byte_len), (7, WcStatus::Success, WcOpcode::Recv, 600));
    assert_eq!(pair.b.poll(), None, "a WRITE completes nothing at the target");
    let wcs = pair.a.poll_all();
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect::<Vec<_>>(),
        [(1, WcStatus::Success, WcOpcode::Send), (2, WcStatus::Success, WcOpcode::RdmaWrite)]
    );
}

#[test]
fn uc_lost_middle_packet_drops_that_message_and_the_next_one_lands() {
    let mut pair = Pair::connected(QpType::Uc, Mtu::Mtu256);
    let first = pattern(768, 3); // FIRST, MIDDLE, LAST
    let second = pattern(100, 99); // ONLY
    pair.a.fill(0, &first);
    pair.a.fill(0x1000, &second);
    // Both receives name the same buffer, so what lands there does not depend on which WQE the
    // responder uses for the second message (found_bugs.rs checks that part).
    pair.b.post_recv(1, 0x8000, 1024);
    pair.b.post_recv(2, 0x8000, 1024);
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

    assert_eq!(
        pair.opcodes(true),
        [Opcode::UC_SEND_FIRST, Opcode::UC_SEND_MIDDLE, Opcode::UC_SEND_LAST, Opcode::UC_SEND_ONLY]
    );
    assert!(pair.opcodes(false).is_empty(), "no NAK for the gap: UC has none");
    assert_eq!(pair.b.engine.counters().out_of_sequence, 1);
    let received = pair.b.poll_all();
    let delivered: Vec<u32> = received.iter().filter(|w| w.status == WcStatus::Success).map(|w| w.byte_len).collect();
    assert_eq!(delivered, [100], "the damaged message is never delivered; the next one is, whole");
    assert_eq!(pair.b.read(0x8000, 100), &second[..]);
    assert_eq!(
        outcomes(&pair.a.poll_all()),
        [(11, WcStatus::Success), (12, WcStatus::Success)],
        "the UC sender cannot know: both WRs succeed"
    );
}

#[test]
fn uc_send_without_a_posted_receive_is_dropped_silently() {
    let mut pair = Pair::connected(QpType::Uc, Mtu::Mtu1024);
    pair.a.fill(0, b"nobody listens");
    pair.a.fill(0x100, b"now somebody does");
    let s1 = pair.a.sge(0, 14);
    pair.a.post_send(wr(1, SendOp::Send, &[s1]));
    pair.drive();
    assert!(pair.opcodes(false).is_empty(), "no RNR NAK: UC has none");
    assert_eq!(pair.b.poll(), None);
    assert_eq!(pair.b.engine.counters().rcvd_dropped, 1, "dropped, and counted");

    pair.b.post_recv(5, 0x4000, 64);
    let s2 = pair.a.sge(0x100, 17);
    pair.a.post_send(wr(2, SendOp::Send, &[s2]));
    pair.drive();
    let wc = pair.b.poll().unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (5, WcStatus::Success, 17));
    assert_eq!(pair.b.read(0x4000, 17), b"now somebody does");
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

// ---- UD ---------------------------------------------------------------------------------------

fn ud_pair() -> (Pair, UdDest) {
    let mut pair = Pair::connected(QpType::Ud, Mtu::Mtu4096);
    let ah = pair.a.ah_to(pair.b.addr);
    let dest = UdDest { ah, remote_qpn: pair.b.qp, remote_qkey: QKEY };
    (pair, dest)
}

#[test]
fn ud_send_lands_behind_a_40_byte_grh() {
    let (mut pair, dest) = ud_pair();
    pair.a.fill(0, b"hello, datagram");
    pair.b.post_recv(5, 0x2000, 40 + 64);
    let sge = pair.a.sge(0, 15);
    pair.a.post_send(ud_send(1, SendOp::Send, &[sge], dest));
    pair.drive();

    assert_eq!(pair.opcodes(true), [Opcode::UD_SEND_ONLY]);
    assert!(pair.opcodes(false).is_empty(), "UD has no ACKs");
    let wc = pair.b.poll().unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.opcode, wc.byte_len), (5, WcStatus::Success, WcOpcode::Recv, 15 + 40));
    assert_eq!(wc.grh, Some(NetworkHdr::Ipv4), "every UD receive carries a GRH, here an IPv4 header");
    assert_eq!(wc.src_qp, pair.a.qp, "src_qp is the sender's QPN, from the DETH");
    assert_eq!(wc.qp_num, pair.b.qp);

    // IPv4 form: 20 zero bytes, then the IPv4 header as it arrived, checksum included.
    let area = pair.b.read(0x2000, GRH_LEN).to_vec();
    assert_eq!(area[..20], [0; 20]);
    let GrhRepr::V4(h) = GrhRepr::parse(&area).unwrap() else { panic!("an IPv4 packet gives the IPv4 form") };
    assert_eq!((h.source, h.destination), ([10, 0, 0, 1], [10, 0, 0, 2]));
    assert_eq!(h.header_checksum, h.calc_header_checksum(), "Linux tells IPv4 from IPv6 by this checksum");
    assert_eq!(usize::from(h.total_len), 20 + 8 + pair.log[0].bytes.len(), "IP + UDP + the RoCE packet");
    assert_eq!(h.protocol, etherparse::IpNumber::UDP);
    assert_eq!(h.time_to_live, 64);
    assert_eq!(pair.b.read(0x2000 + 40, 15), b"hello, datagram", "the payload starts at offset 40");
    let sent = pair.a.poll().unwrap();
    assert_eq!((sent.wr_id, sent.status, sent.opcode), (1, WcStatus::Success, WcOpcode::Send));
}

#[test]
fn ud_grh_fills_the_first_sge_and_the_payload_the_second() {
    let (mut pair, dest) = ud_pair();
    pair.a.fill(0, b"scattered");
    let sges = [pair.b.sge(0x3000, 40), pair.b.sge(0x5000, 64)];
    pair.b.engine.post_recv(pair.b.qp, &[RecvWr { wr_id: 9, sg_list: &sges }]).unwrap();
    let sge = pair.a.sge(0, 9);
    pair.a.post_send(ud_send(1, SendOp::Send, &[sge], dest));
    pair.drive();

    let wc = pair.b.poll().unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (9, WcStatus::Success, 49));
    assert!(matches!(GrhRepr::parse(pair.b.read(0x3000, 40)), Ok(GrhRepr::V4(_))));
    assert_eq!(pair.b.read(0x5000, 9), b"scattered");
}

#[test]
fn ud_wrong_qkey_is_dropped_and_counted() {
    let (mut pair, dest) = ud_pair();
    pair.a.fill(0, b"knock knock");
    pair.b.post_recv(5, 0x2000, 128);
    let sge = pair.a.sge(0, 11);
    let wrong = UdDest { remote_qkey: QKey(0x2222_2222), ..dest };
    pair.a.post_send(ud_send(1, SendOp::Send, &[sge], wrong));
    pair.drive();
    assert_eq!(pair.b.poll(), None, "IBA 10.2.4: a Q_Key mismatch is dropped");
    assert_eq!(pair.b.engine.counters().rcvd_dropped, 1);
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::Success, "the UD sender cannot know");

    // The receive was not consumed: the right Q_Key lands in it.
    pair.a.post_send(ud_send(2, SendOp::Send, &[sge], dest));
    pair.drive();
    let wc = pair.b.poll().unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (5, WcStatus::Success, 51));
    assert_eq!(pair.b.read(0x2000 + 40, 11), b"knock knock");
}

#[test]
fn ud_without_a_posted_receive_is_dropped_ud_has_no_rnr() {
    let (mut pair, dest) = ud_pair();
    pair.a.fill(0, b"early");
    pair.a.fill(0x10, b"on time");
    let early = pair.a.sge(0, 5);
    pair.a.post_send(ud_send(1, SendOp::Send, &[early], dest));
    pair.drive();
    assert!(pair.opcodes(false).is_empty(), "no RNR NAK: UD has none");
    assert_eq!(pair.b.engine.counters().rcvd_dropped, 1);
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::Success);

    pair.b.post_recv(5, 0x2000, 128);
    pair.drive();
    assert_eq!(pair.b.poll(), None, "the dropped datagram is gone for good");
    let on_time = pair.a.sge(0x10, 7);
    pair.a.post_send(ud_send(2, SendOp::Send, &[on_time], dest));
    pair.drive();
    assert_eq!(pair.b.poll().unwrap().byte_len, 47);
    assert_eq!(pair.b.read(0x2000 + 40, 7), b"on time");
}

#[test]
fn ud_message_larger_than_the_port_mtu_is_refused_at_post_time() {
    let (mut pair, dest) = ud_pair();
    let mtu = pair.a.engine.config().port_mtu.bytes();
    let data = pattern(mtu as usize, 5);
    pair.a.fill(0, &data);
    let too_big = pair.a.sge(0, mtu + 1);
    let err = pair.a.try_post_send(&[ud_send(1, SendOp::Send, &[too_big], dest)]).unwrap_err();
    assert_eq!(err.index, 0);
    assert!(matches!(&err.kind, PostErrorKind::Invalid(m) if m.contains("MTU")), "{err}");

    // Exactly one MTU still fits one packet.
    pair.b.post_recv(5, 0x2000, 40 + mtu);
    let fits = pair.a.sge(0, mtu);
    pair.a.post_send(ud_send(2, SendOp::Send, &[fits], dest));
    pair.drive();
    assert_eq!(pair.opcodes(true), [Opcode::UD_SEND_ONLY], "the refused WR never reached the wire");
    assert_eq!(outcomes(&pair.a.poll_all()), [(2, WcStatus::Success)]);
    assert_eq!(pair.b.poll().unwrap().byte_len, 40 + mtu);
    assert_eq!(pair.b.read(0x2000 + 40, mtu as usize), &data[..]);
}

#[test]
fn ud_send_with_immediate_delivers_the_immediate() {
    let (mut pair, dest) = ud_pair();
    pair.a.fill(0, b"imm");
    pair.b.post_recv(5, 0x2000, 128);
    let sge = pair.a.sge(0, 3);
    pair.a.post_send(ud_send(1, SendOp::SendWithImm { imm: [0xde, 0xad, 0xbe, 0xef] }, &[sge], dest));
    pair.drive();
    assert_eq!(pair.opcodes(true), [Opcode::UD_SEND_ONLY_WITH_IMMEDIATE]);
    let wc = pair.b.poll().unwrap();
    assert_eq!(
        (wc.status, wc.opcode, wc.imm_data, wc.byte_len, wc.src_qp),
        (WcStatus::Success, WcOpcode::Recv, Some([0xde, 0xad, 0xbe, 0xef]), 43, pair.a.qp)
    );
    assert_eq!(pair.b.read(0x2000 + 40, 3), b"imm");
}

// ---- the GRH against rxe2rxe-ibv_ud_pingpong.pcap ---------------------------------------------

/// The first UD SEND in the kernel capture: its IP packet (as bytes) and where its UDP payload starts.
fn captured_ud_send() -> (Vec<u8>, usize) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/rxe2rxe-ibv_ud_pingpong.pcap");
    for frame in CaptureReader::open(&path).unwrap() {
        let frame = frame.unwrap();
        let Ok(ip) = frame.ip_packet() else { continue };
        let Ok(d) = UdpDatagram::parse(ip) else { continue };
        if d.is_roce() && d.payload.first() == Some(&Opcode::UD_SEND_ONLY.0) {
            let offset = ip.len() - d.payload.len();
            return (ip.to_vec(), offset);
        }
    }
    panic!("no UD SEND in {}", path.display());
}

/// The GRH `grh_for` builds for the captured packet, with the TTL and TOS it arrived with.
fn grh_of(ip: &[u8], udp_payload_at: usize) -> ([u8; GRH_LEN], IpInfo) {
    let d = UdpDatagram::parse(ip).unwrap();
    let envelope = d.envelope();
    let repr = RoceRepr::parse(&RocePacket::new_checked(&ip[udp_payload_at..]).unwrap(), &envelope).unwrap();
    let info = IpInfo { hop_limit: ip[8], traffic_class: ip[1], flow_label: 0 };
    let mut area = [0xa5; GRH_LEN]; // catches bytes emit forgets to write
    grh_for(&envelope, info, &repr).unwrap().emit(&mut area).unwrap();
    (area, info)
}

#[test]
fn grh_equals_the_ipv4_header_rxe_put_on_the_wire() {
    let (ip, at) = captured_ud_send();
    let (area, _) = grh_of(&ip, at);
    assert_eq!(area[..20], [0; 20]);
    assert_eq!(area[20..], ip[..20], "byte for byte the captured IPv4 header");
}

#[test]
fn captured_ud_send_lands_in_a_matching_qp_with_that_grh() {
    let (ip, at) = captured_ud_send();
    let (grh, info) = grh_of(&ip, at);
    let d = UdpDatagram::parse(&ip).unwrap();
    let envelope = d.envelope();
    let repr = RoceRepr::parse(&RocePacket::new_checked(d.payload).unwrap(), &envelope).unwrap();
    let deth = repr.ext.deth.unwrap();
    let dest_qp = repr.bth.dest_qp;

    // The receiving host of the capture: its address, and a UD QP with the captured QPN and Q_Key.
    let mut engine = Engine::new(DeviceConfig {
        addresses: vec![envelope.dst_ip()],
        qpn_base: dest_qp.value(),
        ..DeviceConfig::default()
    });
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(16).unwrap();
    let mr = engine.reg_mr(pd, BASE, MEM_LEN as u64, Access::LOCAL_WRITE).unwrap();
    let init = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        qp_type: QpType::Ud,
        cap: QpCap::default(),
        sq_sig_all: false,
    };
    let qp = engine.create_qp(&init).unwrap();
    assert_eq!(qp, dest_qp);
    let to_init = QpAttr { qp_state: QpState::Init, qkey: deth.qkey, ..QpAttr::default() };
    engine.modify_qp(qp, &to_init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY).unwrap();
    engine.modify_qp(qp, &QpAttr { qp_state: QpState::Rtr, ..QpAttr::default() }, AttrMask::STATE).unwrap();
    let mut mem = VecMemory::new(BASE, MEM_LEN);
    let len = (GRH_LEN + repr.payload.len()) as u32;
    engine.post_recv(qp, &[RecvWr { wr_id: 1, sg_list: &[Sge { addr: BASE, length: len, lkey: mr.lkey }] }]).unwrap();

    engine.handle_datagram_with(Instant::ZERO, &envelope, info, d.payload, &mut mem);

    assert_eq!(engine.counters().rcvd_icrc_errors, 0, "the captured ICRC verifies");
    let wc = engine.poll_cq(cq).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len, wc.grh), (1, WcStatus::Success, len, Some(NetworkHdr::Ipv4)));
    assert_eq!(wc.src_qp, deth.src_qp);
    assert_eq!(wc.src_qp, Qpn::new(0x5d).unwrap(), "the sender of the capture");
    assert_eq!(mem.slice(BASE, GRH_LEN), grh);
    assert_eq!(mem.slice(BASE + 20, 20), &ip[..20]);
    assert_eq!(mem.slice(BASE + GRH_LEN as u64, repr.payload.len()), repr.payload);
}

#[test]
fn uc_write_with_a_bad_rkey_is_dropped_silently_and_the_qp_carries_on() {
    let mut pair = Pair::connected(QpType::Uc, Mtu::Mtu256);
    let before = pair.b.mem.clone();
    pair.a.fill(0, &pattern(600, 8));
    pair.b.post_recv(1, 0x100, 64);
    let long = pair.a.sge(0, 600);
    let bad = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0x4000), rkey: RKey(pair.b.mr.rkey.0 ^ 1) };
    pair.a.post_send(wr(1, bad, &[long]));
    pair.drive();
    assert_eq!(pair.b.mem, before, "not one byte written");
    assert!(pair.opcodes(false).is_empty(), "no NAK: UC has none");
    assert_eq!(pair.b.engine.qp_state(pair.b.qp), Some(QpState::Rts), "a UC responder error is no QP error");
    assert_eq!(pair.b.engine.poll_event(), None);
    assert_eq!(pair.b.engine.counters().resp_remote_access_errors, 1, "dropped, and counted");

    pair.a.fill(0x1000, b"still here");
    let short = pair.a.sge(0x1000, 10);
    pair.a.post_send(wr(2, SendOp::Send, &[short]));
    pair.drive();
    assert_eq!(outcomes(&pair.b.poll_all()), [(1, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x100, 10), b"still here");
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn ud_over_ipv6_grh_is_the_40_byte_ipv6_header() {
    let (a6, b6): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
    let mut pair = pair_of(node_at(a6, 1, QpType::Ud), node_at(b6, 2, QpType::Ud), QpType::Ud, Mtu::Mtu4096);
    let ah = pair.a.ah_to(b6);
    let dest = UdDest { ah, remote_qpn: pair.b.qp, remote_qkey: QKEY };
    pair.a.fill(0, b"six");
    pair.b.post_recv(5, 0x2000, 128);
    let sge = pair.a.sge(0, 3);
    pair.a.post_send(ud_send(1, SendOp::Send, &[sge], dest));
    pair.drive();

    let wc = pair.b.poll().unwrap();
    assert_eq!((wc.status, wc.byte_len, wc.grh, wc.src_qp), (WcStatus::Success, 43, Some(NetworkHdr::Ipv6), pair.a.qp));
    let GrhRepr::V6(h) = GrhRepr::parse(pair.b.read(0x2000, GRH_LEN)).unwrap() else {
        panic!("an IPv6 packet gives its IPv6 header")
    };
    assert_eq!((h.source, h.destination), (Gid::from_ip(a6).0, Gid::from_ip(b6).0));
    assert_eq!(usize::from(h.payload_length), 8 + pair.log[0].bytes.len(), "UDP header + the RoCE packet");
    assert_eq!((h.next_header, h.hop_limit), (etherparse::IpNumber::UDP, 64));
    assert_eq!(pair.b.read(0x2000 + 40, 3), b"six");
}

#[test]
fn uc_send_side_error_moves_the_qp_to_sqe_and_rts_resumes() {
    // IBA 10.3.1.5: on UC and UD a send-side error stops the send queue only (SQE).
    let mut pair = Pair::connected(QpType::Uc, Mtu::Mtu1024);
    let bad = Sge { addr: BASE, length: 8, lkey: LKey(pair.a.mr.lkey.0 ^ 0x10) };
    let good = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, SendOp::Send, &[bad]));
    pair.a.post_send(wr(2, SendOp::Send, &[good]));
    pair.drive();
    let wcs = pair.a.poll_all();
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(pair.a.engine.qp_state(pair.a.qp), Some(QpState::Sqe));

    // The receive side still works in SQE.
    pair.a.post_recv(7, 0x100, 64);
    pair.b.fill(0, b"still here");
    let s = pair.b.sge(0, 10);
    pair.b.post_send(wr(3, SendOp::Send, &[s]));
    pair.drive();
    assert_eq!(pair.a.poll().map(|w| (w.wr_id, w.status)), Some((7, WcStatus::Success)));
    assert_eq!(pair.a.read(0x100, 10), b"still here");

    // Sends posted in SQE are flushed at once.
    pair.a.post_send(wr(9, SendOp::Send, &[good]));
    assert_eq!(pair.a.poll().map(|w| (w.wr_id, w.status)), Some((9, WcStatus::WrFlushErr)));

    // SQE→RTS, and sending resumes.
    let rts = QpAttr { qp_state: QpState::Rts, ..QpAttr::default() };
    pair.a.engine.modify_qp(pair.a.qp, &rts, AttrMask::STATE).unwrap();
    pair.b.post_recv(8, 0x300, 64);
    pair.a.post_send(wr(4, SendOp::Send, &[good]));
    pair.drive();
    assert_eq!(pair.a.poll().map(|w| (w.wr_id, w.status)), Some((4, WcStatus::Success)));
    assert_eq!(pair.b.poll_all().iter().filter(|w| w.wr_id == 8).count(), 1);
}
