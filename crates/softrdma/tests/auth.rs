//! Authenticated mode over real loopback sockets: two event channels in one process agree
//! on keys through the CM, and every packet of the connection carries a tag.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use softrdma::*;

const T: Duration = Duration::from_secs(10);

fn channel(port: u16, authenticate: bool, capture: Option<std::path::PathBuf>) -> EventChannel {
    let options = ContextOptions {
        port,
        cm_response_timeout: 12,
        cm_max_retries: 3,
        authenticate,
        capture: capture.map(Into::into),
        ..ContextOptions::default()
    };
    EventChannel::with_options(options).unwrap()
}

fn cap() -> QpCap {
    QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 }
}

struct Sides {
    port: u16,
    sch: EventChannel,
    cch: EventChannel,
    cid: CmId,
    _listen: CmId,
    _pd: Pd,
}

/// A listener (`server_auth`) on 127.0.0.1:`service` and a client (`client_auth`) that
/// connects to it; returns before anything is accepted.
fn sides(service: u16, server_auth: bool, client_auth: bool, capture: Option<std::path::PathBuf>) -> Sides {
    let port = test_port();
    // The first channel opens the process's one context of the port: it records.
    let sch = channel(port, server_auth, capture);
    let listen = sch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    listen.bind_addr(SocketAddr::from(([127, 0, 0, 1], service))).unwrap();
    listen.listen(8).unwrap();
    let cch = channel(port, client_auth, None);
    let cid = cch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    cid.resolve_addr(None, SocketAddr::from(([127, 0, 0, 1], service))).unwrap();
    cch.expect(CmEventKind::AddrResolved, T).unwrap();
    cid.resolve_route().unwrap();
    cch.expect(CmEventKind::RouteResolved, T).unwrap();
    let pd = cid.context().unwrap().alloc_pd().unwrap();
    cid.create_qp(&pd, cap()).unwrap();
    let param = ConnParam { responder_resources: 4, initiator_depth: 4, ..ConnParam::default() };
    cid.connect(&param).unwrap();
    Sides { port, sch, cch, cid, _listen: listen, _pd: pd }
}

/// Accepts the request on `s`, then a SEND and a 16-byte WRITE from the client.
fn accept_and_exchange(s: &Sides) -> CmId {
    let req = s.sch.expect(CmEventKind::ConnectRequest, T).unwrap();
    let sid = req.id.clone();
    let spd = sid.context().unwrap().alloc_pd().unwrap();
    sid.create_qp(&spd, cap()).unwrap();
    let smsgs = sid.reg_msgs(4096).unwrap();
    sid.post_recv(1, &smsgs, 0..256).unwrap();
    let target = sid.reg_write(4096).unwrap();
    sid.accept(&ConnParam { responder_resources: 4, initiator_depth: 4, ..ConnParam::default() }).unwrap();
    s.cch.expect(CmEventKind::Established, T).unwrap();
    s.sch.expect(CmEventKind::Established, T).unwrap();

    let cmsgs = s.cid.reg_msgs(4096).unwrap();
    cmsgs.write(0, b"an authenticated message").unwrap();
    s.cid.post_send(10, &cmsgs, 0..24, SendFlags::SIGNALED).unwrap();
    assert_eq!(s.cid.get_send_comp(T).unwrap().status, WcStatus::Success);
    let wc = sid.get_recv_comp(T).unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 24));
    let mut got = [0u8; 24];
    smsgs.read(0, &mut got).unwrap();
    assert_eq!(&got, b"an authenticated message");

    let w = target.remote(0..16).unwrap();
    s.cid.post_write_inline(11, b"sixteen bytes...", SendFlags::SIGNALED, w.addr, w.rkey).unwrap();
    assert_eq!(s.cid.get_send_comp(T).unwrap().status, WcStatus::Success);
    let mut got = [0u8; 16];
    target.read(0, &mut got).unwrap();
    assert_eq!(&got, b"sixteen bytes...");
    sid
}

#[test]
fn both_ends_authenticated_agree_on_keys_and_tag_every_packet() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.pcap");
    let s = sides(7481, true, true, Some(path.clone()));
    let sid = accept_and_exchange(&s);
    assert!(s.cid.qp().unwrap().authenticated() && sid.qp().unwrap().authenticated());
    let (c, srv) = (s.cid.context().unwrap().counters(), sid.context().unwrap().counters());
    assert_eq!(c.engine.rcvd_auth_failures + srv.engine.rcvd_auth_failures, 0);
    s.cid.disconnect().unwrap();
    s.cch.expect(CmEventKind::Disconnected, T).unwrap();
    s.sch.expect(CmEventKind::Disconnected, T).unwrap();
    let port = s.port;
    drop(s);

    // Every frame has a valid ICRC over the whole packet, tag included; the REQ and REP
    // carry the offer after their MAD; the WRITE's 16 bytes are followed by the 24-byte trailer.
    let mut reader = softrdma_pcap::CaptureReader::open(&path).unwrap();
    let (mut frames, mut offers, mut write) = (0, 0, None);
    while let Some(frame) = reader.next_frame() {
        let frame = frame.unwrap();
        let d = softrdma_wire::UdpDatagram::parse(frame.ip_packet().unwrap()).unwrap();
        let packet = softrdma_wire::RocePacket::new_checked(d.payload).unwrap();
        assert!(packet.verify_icrc(&d.envelope()), "frame {frames}: the ICRC covers the tag");
        frames += 1;
        let bth = packet.bth();
        if bth.dest_qp() == softrdma_wire::Qpn::GSI && d.payload.len() == 12 + 8 + 256 + 40 + 4 {
            assert_eq!(&d.payload[12 + 8 + 256..][..8], b"sRDMAau1");
            offers += 1;
        }
        if bth.opcode() == softrdma_wire::Opcode::RC_RDMA_WRITE_ONLY {
            write = Some(d.payload[12 + 16..d.payload.len() - 4].to_vec());
        }
    }
    assert_eq!(offers, 4, "the REQ and the REP, each recorded as sent and as received");
    let write = write.expect("the WRITE was captured");
    assert_eq!(write.len(), 16 + 24, "the data, then the counter and the tag");
    assert_eq!(&write[..16], b"sixteen bytes...");
    // Wireshark decodes every frame as InfiniBand and finds none malformed (the tag reads
    // as payload, or as trailing data after an ACK).
    let tshark = std::process::Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args(["-d", &format!("udp.port=={port},infiniband")])
        .args(["-T", "fields", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed"])
        .output();
    match tshark {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(text.lines().count(), frames);
            for line in text.lines() {
                let mut f = line.split('\t');
                assert!(!f.next().unwrap_or("").is_empty(), "decoded as InfiniBand: {line:?}");
                assert_eq!(f.next().unwrap_or(""), "", "malformed: {line:?}");
            }
        }
        _ => println!("SKIP tshark half: tshark is not installed (apt-get install tshark; .ci/run does)"),
    }
}

#[test]
fn a_plain_listener_answers_an_authenticating_client() {
    let s = sides(7482, false, true, None);
    let sid = accept_and_exchange(&s);
    assert!(s.cid.qp().unwrap().authenticated() && sid.qp().unwrap().authenticated());
}

#[test]
fn a_listener_that_requires_it_rejects_a_plain_client() {
    let s = sides(7483, true, false, None);
    let rej = s.cch.expect(CmEventKind::Rejected, T).unwrap();
    assert!(matches!(rej.status, CmStatus::Rejected(_)), "{:?}", rej.status);
    assert!(s.sch.expect(CmEventKind::ConnectRequest, Duration::from_millis(200)).is_err(), "no request raised");
}

#[test]
fn plain_connections_stay_plain() {
    let s = sides(7484, false, false, None);
    let sid = accept_and_exchange(&s);
    assert!(!s.cid.qp().unwrap().authenticated() && !sid.qp().unwrap().authenticated());
}
