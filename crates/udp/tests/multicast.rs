//! Multicast over loopback (IPv4 groups on `lo`, which Linux loops back with
//! `IP_MULTICAST_LOOP`; TTL 1, never leaving the host): every socket bound to the group
//! ([`RoceSocket::bind_group`]) gets its own copy, with the group as the destination the
//! ICRC covers; a socket that left (was closed) gets nothing more.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softrdma_udp::{Config, RecvBatch, RoceSocket};
use softrdma_wire::{BthRepr, DethRepr, ExtHeaders, Opcode, PKey, Psn, QKey, Qpn, RocePacket, RoceRepr};

const WAIT: Duration = Duration::from_secs(2);

fn lo_index() -> u32 {
    std::fs::read_to_string("/sys/class/net/lo/ifindex").unwrap().trim().parse().unwrap()
}

fn ud_to_group(payload: &[u8]) -> RoceRepr<'_> {
    RoceRepr {
        bth: BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            solicited_event: false,
            mig_req: true,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::MULTICAST,
            ack_req: false,
            psn: Psn::new(1).unwrap(),
        },
        ext: ExtHeaders {
            deth: Some(DethRepr { qkey: QKey(7), src_qp: Qpn::new(0x11).unwrap() }),
            ..Default::default()
        },
        payload,
    }
}

#[test]
fn every_socket_bound_to_the_group_gets_a_copy() {
    let group: IpAddr = Ipv4Addr::new(230, 77, 12, 34).into();
    let lo = lo_index();
    // The first binds an ephemeral port; the second shares it, as processes share 4791.
    let a = RoceSocket::bind_group(group, lo, &Config { port: 0, ..Config::default() }).unwrap();
    let port = a.local_addr().port();
    let b = RoceSocket::bind_group(group, lo, &Config { port, ..Config::default() }).unwrap();
    let tx = RoceSocket::bind_with(
        Ipv4Addr::LOCALHOST.into(),
        &Config { port: 0, multicast_interface: Some(lo), ..Config::default() },
    )
    .unwrap();
    let envelope = tx.envelope_to((group, port).into()).unwrap();
    let repr = ud_to_group(b"to all members");
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&envelope, &mut buf).unwrap();
    tx.send(&envelope, &buf).unwrap();

    let mut batch = RecvBatch::new(4, 2048);
    for s in [&a, &b] {
        assert_eq!(s.recv_timeout(&mut batch, WAIT).unwrap(), 1, "each member's socket gets the datagram");
        let d = batch.iter().next().unwrap();
        assert_eq!(d.envelope(), envelope, "the group is the destination, ID 0 and DF as sent");
        assert_eq!(d.ifindex, lo);
        assert_eq!(d.hop_limit, 1, "multicast leaves with TTL 1: the link");
        let parsed = RoceRepr::parse(&RocePacket::new_checked(d.payload).unwrap(), &d.envelope()).unwrap();
        assert_eq!(parsed.payload, b"to all members", "the ICRC verifies over the group address");
    }

    drop(a); // leaves the group
    tx.send(&envelope, &buf).unwrap();
    assert_eq!(b.recv_timeout(&mut batch, WAIT).unwrap(), 1, "the other member still receives");
}

#[test]
fn only_a_multicast_address_binds_as_a_group() {
    let e = RoceSocket::bind_group(Ipv4Addr::LOCALHOST.into(), lo_index(), &Config { port: 0, ..Config::default() })
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
}
