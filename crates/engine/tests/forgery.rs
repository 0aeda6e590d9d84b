//! A host on the path forges packets with a valid ICRC: what plain RoCE lets it do, what
//! the source-port check and authenticated mode ([`softrdma_engine::auth`]) stop.

mod common;

use common::*;
use softrdma_engine::*;
use softrdma_wire::{BthRepr, Envelope, ExtHeaders, Opcode, PKey, Psn, Qpn, RKey, RethRepr, RoceRepr};

/// A zero-length RDMA WRITE ONLY to `qp` at `psn`, as the attacker builds it: no R_Key is
/// needed for zero bytes.
fn forged_write(dest_qp: Qpn, psn: Psn, envelope: &Envelope) -> Vec<u8> {
    let repr = RoceRepr {
        bth: BthRepr {
            opcode: Opcode::RC_RDMA_WRITE_ONLY,
            solicited_event: false,
            mig_req: false,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: true,
            psn,
        },
        ext: ExtHeaders {
            reth: Some(RethRepr { virtual_address: 0, rkey: RKey(0), dma_length: 0 }),
            ..Default::default()
        },
        payload: &[],
    };
    let mut buf = vec![0; repr.buffer_len()];
    repr.emit(envelope, &mut buf).unwrap();
    buf
}

/// The envelope `a` sends to `b` in, as a sniffer on the path sees it, and the PSN `b`
/// expects next: one SEND from a to b, watched.
fn sniff(pair: &mut Pair) -> (Envelope, Psn) {
    pair.b.post_recv(50, 0x9000, 64);
    pair.a.fill(0, b"hello");
    let sge = pair.a.sge(0, 5);
    pair.a.post_send(wr(1, SendOp::Send, &[sge]));
    pair.drive();
    assert_eq!(pair.a.poll().map(|w| w.status), Some(WcStatus::Success));
    assert_eq!(pair.b.poll().map(|w| w.status), Some(WcStatus::Success));
    let last = pair.sent(true).last().cloned().cloned().expect("a sent its SEND");
    (last.envelope, last.psn().next())
}

/// An honest 64-byte WRITE from a to b, at b offset 0x4000; returns a's completion status.
fn honest_write(pair: &mut Pair) -> WcStatus {
    let data = pattern(64, 9);
    pair.a.fill(0x100, &data);
    let (rkey, remote, src) = (pair.b.mr.rkey, pair.b.addr_of(0x4000), pair.a.sge(0x100, 64));
    pair.a.post_send(wr(2, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[src]));
    pair.drive();
    pair.a.poll().expect("the WRITE completes").status
}

fn keyed(seed: u8) -> (PacketKeys, PacketKeys) {
    let (x, y) = ([seed; 16], [seed.wrapping_add(1); 16]);
    (PacketKeys { send: x, receive: y }, PacketKeys { send: y, receive: x })
}

/// A pair whose QPs are in authenticated mode with matching keys.
fn authenticated(qp_type: QpType) -> Pair {
    let (ka, kb) = keyed(3);
    connected_after_setup(qp_type, Mtu::Mtu1024, &|n: &mut Node| {
        let keys = if n.addr == std::net::IpAddr::from([10, 0, 0, 1]) { ka.clone() } else { kb.clone() };
        n.engine.set_qp_keys(n.qp, keys).unwrap();
    })
}

#[test]
fn in_plain_mode_a_forged_empty_write_at_the_expected_psn_makes_the_next_write_vanish() {
    // The weakness authenticated mode exists for (IBTA and rxe behave the same): the
    // honest WRITE after the forgery is taken for a duplicate, ACKed, and never lands.
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let (envelope, expected) = sniff(&mut pair);
    let forged = forged_write(pair.b.qp, expected, &envelope);
    pair.b.engine.handle_datagram(pair.now, &envelope, &forged, &mut pair.b.mem);
    assert_eq!(honest_write(&mut pair), WcStatus::Success, "the requester is told it worked");
    assert_eq!(pair.b.read(0x4000, 64), &[0u8; 64][..], "but no byte landed");
}

#[test]
fn in_authenticated_mode_the_forgery_is_dropped_and_the_honest_write_lands() {
    let mut pair = authenticated(QpType::Rc);
    let (envelope, expected) = sniff(&mut pair);
    let before = pair.b.engine.counters();
    let forged = forged_write(pair.b.qp, expected, &envelope);
    pair.b.engine.handle_datagram(pair.now, &envelope, &forged, &mut pair.b.mem);
    let after = pair.b.engine.counters();
    assert_eq!(after.rcvd_auth_failures, before.rcvd_auth_failures + 1);
    assert_eq!(after.rcvd_packets, before.rcvd_packets, "nothing of the forgery was acted on");
    assert_eq!(honest_write(&mut pair), WcStatus::Success);
    assert_eq!(pair.b.read(0x4000, 64), &pattern(64, 9)[..], "the honest WRITE landed");
    assert_eq!(pair.b.engine.counters().rcvd_auth_failures, after.rcvd_auth_failures);
}

#[test]
fn a_forgery_that_copies_a_sniffed_trailer_is_dropped_too() {
    // The tag covers the headers: a sniffed packet's counter and tag on a new packet do not verify.
    let mut pair = authenticated(QpType::Rc);
    let (envelope, expected) = sniff(&mut pair);
    let sniffed = pair.sent(true).last().cloned().cloned().unwrap();
    let mut forged = forged_write(pair.b.qp, expected, &envelope);
    let trailer_at = sniffed.bytes.len() - 4 - auth::TRAILER_LEN;
    let icrc_at = forged.len() - 4;
    forged.splice(icrc_at..icrc_at, sniffed.bytes[trailer_at..trailer_at + auth::TRAILER_LEN].iter().copied());
    softrdma_wire::RocePacket::new_unchecked(&mut forged[..]).fill_icrc(&envelope);
    let before = pair.b.engine.counters().rcvd_auth_failures;
    pair.b.engine.handle_datagram(pair.now, &envelope, &forged, &mut pair.b.mem);
    assert_eq!(pair.b.engine.counters().rcvd_auth_failures, before + 1);
    assert_eq!(honest_write(&mut pair), WcStatus::Success);
    assert_eq!(pair.b.read(0x4000, 64), &pattern(64, 9)[..]);
}

#[test]
fn authenticated_qps_carry_every_operation_with_tags() {
    for qp_type in [QpType::Rc, QpType::Uc] {
        let mut pair = authenticated(qp_type);
        let data = pattern(3000, 4);
        pair.a.fill(0, &data);
        pair.b.post_recv(11, 0x8000, 4096);
        let (rkey, remote) = (pair.b.mr.rkey, pair.b.addr_of(0x4000));
        pair.a.post_send(wr(1, SendOp::Send, &[pair.a.sge(0, 3000)]));
        pair.a.post_send(wr(2, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(0, 3000)]));
        if qp_type == QpType::Rc {
            pair.a.post_send(wr(3, SendOp::RdmaRead { remote_addr: remote, rkey }, &[pair.a.sge(0x2000, 3000)]));
        }
        pair.drive();
        assert_eq!(pair.b.read(0x8000, 3000), &data[..], "{qp_type:?} SEND");
        assert_eq!(pair.b.read(0x4000, 3000), &data[..], "{qp_type:?} WRITE");
        if qp_type == QpType::Rc {
            assert_eq!(pair.a.read(0x2000, 3000), &data[..], "RC READ");
        }
        assert!(pair.a.poll_all().iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(pair.a.engine.counters().rcvd_auth_failures + pair.b.engine.counters().rcvd_auth_failures, 0);
        for p in &pair.log {
            let plain = softrdma_wire::RoceRepr::parse_ignoring_icrc(&softrdma_wire::RocePacket::new_unchecked(
                &p.bytes[..p.bytes.len() - auth::TRAILER_LEN],
            ))
            .expect("the packet under the tag parses");
            let pad = plain.payload.len().wrapping_neg() & 3;
            assert_eq!(p.bytes.len(), plain.header_len() + plain.payload.len() + pad + auth::TRAILER_LEN + 4);
            assert!(softrdma_wire::RocePacket::new_unchecked(&p.bytes[..]).verify_icrc(&p.envelope), "ICRC over all");
        }
    }
}

#[test]
fn keys_that_do_not_match_let_nothing_through() {
    let (ka, _) = keyed(3);
    let (_, kb) = keyed(40);
    let mut pair = connected_after_setup(QpType::Rc, Mtu::Mtu1024, &|n: &mut Node| {
        let keys = if n.addr == std::net::IpAddr::from([10, 0, 0, 1]) { ka.clone() } else { kb.clone() };
        n.engine.set_qp_keys(n.qp, keys).unwrap();
    });
    assert_eq!(honest_write(&mut pair), WcStatus::RetryExcErr);
    assert_eq!(pair.b.read(0x4000, 64), &[0u8; 64][..]);
    assert!(pair.b.engine.counters().rcvd_auth_failures > 0);
}

#[test]
fn keys_are_taken_only_before_rtr_and_only_by_connected_qps() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let err = pair.a.engine.set_qp_keys(pair.a.qp, keyed(1).0).unwrap_err();
    assert!(err.to_string().contains("RESET or INIT"), "{err}");
    let mut ud = node([10, 0, 0, 9], 9, QpType::Ud, QpCap::default());
    let err = ud.engine.set_qp_keys(ud.qp, keyed(1).0).unwrap_err();
    assert!(err.to_string().contains("only RC and UC"), "{err}");
    assert!(!pair.a.engine.qp_authenticated(pair.a.qp));
}

#[test]
fn once_the_peer_is_heard_a_packet_from_another_source_port_is_dropped() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let (envelope, expected) = sniff(&mut pair);
    let elsewhere = match envelope {
        Envelope::V4(mut e) => {
            e.src_port = e.src_port.wrapping_add(1);
            Envelope::V4(e)
        }
        Envelope::V6(mut e) => {
            e.src_port = e.src_port.wrapping_add(1);
            Envelope::V6(e)
        }
    };
    let forged = forged_write(pair.b.qp, expected, &elsewhere);
    pair.b.engine.handle_datagram(pair.now, &elsewhere, &forged, &mut pair.b.mem);
    assert_eq!(pair.b.engine.counters().rcvd_wrong_source, 1);
    assert_eq!(honest_write(&mut pair), WcStatus::Success);
    assert_eq!(pair.b.read(0x4000, 64), &pattern(64, 9)[..], "the forgery moved no PSN");
}

#[test]
fn a_blind_forgery_at_a_wrong_psn_does_not_take_the_peers_port() {
    // Before the peer is heard from, a packet from another port is judged on its own; one
    // at a PSN the responder does not expect must not make the real peer's port the wrong one.
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let real = pair.a.engine.query_qp(pair.a.qp).map(|(a, _)| a.dest_qp_num).unwrap();
    assert_eq!(real, pair.b.qp.value());
    let envelope = Envelope::rocev2(pair.a.addr, 40000, pair.b.addr).unwrap();
    let forged = forged_write(pair.b.qp, Psn::from_u24_truncating(12345), &envelope);
    pair.b.engine.handle_datagram(pair.now, &envelope, &forged, &mut pair.b.mem);
    pair.drive();
    assert_eq!(honest_write(&mut pair), WcStatus::Success);
    assert_eq!(pair.b.read(0x4000, 64), &pattern(64, 9)[..]);
    assert_eq!(pair.b.engine.counters().rcvd_wrong_source, 0, "the real peer's packets all passed");
}
