//! The kernel's own CM MADs (real rxe runs of rping and `ib_write_bw -R`, in tests/data) as
//! golden vectors: a listening Cm accepts the kernel's REQ, and the MADs our Cm emits for the
//! same addresses, ports, QPNs and PSNs equal the kernel's byte for byte, except the fields
//! that are random by design.
//!
//! Random by design: the local comm ID (MAD bytes 24..28), and the transaction ID (bytes
//! 8..16) of a message whose sender forms it (REQ, RTU, DREQ; `cm_form_tid` mixes the MAD
//! agent's random high half with the comm ID). A REP echoes the REQ's TID and a DREP the
//! DREQ's, so theirs must match exactly. Where the captured message names the kernel's own
//! comm ID (a REP's or DREP's remote comm ID), we feed our Cm the captured MAD with that
//! field replaced by the comm ID our Cm chose, as the kernel would have sent it to us.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::{CapturedMad, mad_at, mads_in};
use softrdma_cm::{Cm, CmConfig, CmEventKind, CmId, ConnParam};
use softrdma_engine::{Instant, QpType};
use softrdma_wire::cm::CmMessage;
use softrdma_wire::cma::PortSpace;
use softrdma_wire::mad::{MAD_LEN, MadPacket, MadRepr};

const TID: std::ops::Range<usize> = 8..16;
const LOCAL_COMM_ID: std::ops::Range<usize> = 24..28;
const REMOTE_COMM_ID: std::ops::Range<usize> = 28..32;

/// One rdma_cm connection in a capture: the frames of its MADs and what rdma_cm chose.
struct Connection {
    file: &'static str,
    req: usize,
    rep: usize,
    rtu: usize,
    /// A DREQ from the active side and its DREP, if the capture has that pair.
    dreq_drep: Option<(usize, usize)>,
    active_guid: u64,
    passive_guid: u64,
}

const CONNECTIONS: [Connection; 2] = [
    Connection {
        file: "rxe2rxe-rping.pcap",
        req: 3,
        rep: 4,
        rtu: 6,
        dreq_drep: Some((66, 67)),
        active_guid: 0x5054_00ff_fe18_0001,
        passive_guid: 0x5054_00ff_fe18_0002,
    },
    Connection {
        file: "rxe2rxe-ib_write_bw-rdma_cm.pcap",
        req: 1,
        rep: 2,
        rtu: 3,
        dreq_drep: None,
        active_guid: 0x5054_00ff_fe18_0001,
        passive_guid: 0x5054_00ff_fe18_0002,
    },
];

fn config(ip: IpAddr, guid: u64) -> CmConfig {
    CmConfig { seed: 7, comm_id_prefix: 9 << 21, addresses: vec![ip], node_guid: guid, ..CmConfig::default() }
}

fn parse(mad: &[u8]) -> CmMessage<'_> {
    let repr = MadRepr::parse(&MadPacket::new_checked(mad).unwrap()).unwrap();
    let data = &mad[24..];
    CmMessage::parse_data(repr.header.attribute_id, data).unwrap()
}

/// `ours` equals `theirs` outside `except`; names the first differing byte otherwise.
fn assert_same_except(what: &str, ours: &[u8], theirs: &[u8], except: &[std::ops::Range<usize>]) {
    assert_eq!(ours.len(), MAD_LEN);
    for (k, (a, b)) in ours.iter().zip(theirs).enumerate() {
        if except.iter().any(|r| r.contains(&k)) {
            continue;
        }
        assert_eq!(a, b, "{what}: MAD byte {k:#04x} differs (ours {a:#04x}, kernel {b:#04x})");
    }
}

fn with_comm_id(mad: &CapturedMad, range: std::ops::Range<usize>, comm_id: u32) -> Vec<u8> {
    let mut m = mad.bytes.clone();
    m[range].copy_from_slice(&comm_id.to_be_bytes());
    m
}

fn take_one(cm: &mut Cm) -> [u8; MAD_LEN] {
    let t = cm.poll_transmit().expect("a MAD");
    assert!(cm.poll_transmit().is_none(), "exactly one MAD");
    t.mad
}

#[test]
fn the_kernels_req_makes_a_connect_request_and_our_rep_matches_the_kernels() {
    for c in CONNECTIONS {
        let mads = mads_in(c.file);
        let (req, rep) = (mad_at(&mads, c.req), mad_at(&mads, c.rep));
        let CmMessage::Req(kreq) = parse(&req.bytes) else { panic!("REQ") };
        let CmMessage::Rep(krep) = parse(&rep.bytes) else { panic!("REP") };
        let (_, port) = softrdma_wire::cma::split_service_id(kreq.service_id).unwrap();
        let hdr = softrdma_wire::cma::CmaHeaderRepr::parse(kreq.private_data).unwrap();

        let now = Instant::ZERO;
        let mut b = Cm::new(config(req.dst, c.passive_guid));
        let l = b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
        b.bind_addr(l, SocketAddr::new("0.0.0.0".parse().unwrap(), port)).unwrap();
        b.listen(l, 0).unwrap();
        b.handle_mad(now, req.src, req.dst, &req.bytes);
        let e = b.poll_event().expect("CONNECT_REQUEST");
        assert_eq!(e.kind, CmEventKind::ConnectRequest, "{}", c.file);
        assert_eq!(e.listen_id, Some(l));
        assert_eq!(e.private_data, kreq.private_data[36..], "{}: the user's private data", c.file);
        assert_eq!(b.peer_addr(e.id), Some(SocketAddr::new(req.src, hdr.port)));
        assert_eq!(b.local_addr(e.id), Some(SocketAddr::new(req.dst, port)));
        let param = e.param.unwrap();
        assert_eq!(param.qp_num, kreq.local_qpn.value());
        assert_eq!(param.start_psn, Some(kreq.starting_psn.value()));
        assert_eq!(
            (param.responder_resources, param.initiator_depth),
            (kreq.initiator_depth, kreq.responder_resources)
        );

        // Accept with what the kernel's passive side chose.
        let accept = ConnParam {
            private_data: Vec::new(),
            responder_resources: krep.responder_resources,
            initiator_depth: krep.initiator_depth,
            flow_control: krep.end_to_end_flow_control,
            retry_count: 7,
            rnr_retry_count: krep.rnr_retry_count,
            srq: krep.srq,
            qp_num: krep.local_qpn.value(),
            start_psn: Some(krep.starting_psn.value()),
            qkey: 0,
        };
        b.accept(now, e.id, &accept).unwrap();
        let ours = take_one(&mut b);
        assert_same_except(&format!("{} REP", c.file), &ours, &rep.bytes, &[LOCAL_COMM_ID]);
        let our_comm_id = b.local_comm_id(e.id).unwrap();
        assert_eq!(ours[LOCAL_COMM_ID], our_comm_id.to_be_bytes());

        // The kernel's RTU (addressed to our comm ID) establishes it.
        let rtu = with_comm_id(mad_at(&mads, c.rtu), REMOTE_COMM_ID, our_comm_id);
        b.handle_mad(now, req.src, req.dst, &rtu);
        assert_eq!(b.poll_event().unwrap().kind, CmEventKind::Established, "{}", c.file);

        // The kernel's DREQ, and our DREP.
        if let Some((dreq, drep)) = c.dreq_drep {
            let dreq = with_comm_id(mad_at(&mads, dreq), REMOTE_COMM_ID, our_comm_id);
            b.handle_mad(now, req.src, req.dst, &dreq);
            assert_eq!(b.poll_event().unwrap().kind, CmEventKind::Disconnected);
            b.disconnect(now, e.id).unwrap();
            let ours = take_one(&mut b);
            assert_same_except(&format!("{} DREP", c.file), &ours, &mad_at(&mads, drep).bytes, &[LOCAL_COMM_ID]);
        }
        assert_eq!(b.counters().mads_dropped, 0);
    }
}

/// Our active side, for the kernel's addresses, ports, QPN and PSN.
fn active_like(c: &Connection, mads: &[CapturedMad]) -> (Cm, CmId, ConnParam) {
    let req = mad_at(mads, c.req);
    let CmMessage::Req(kreq) = parse(&req.bytes) else { panic!("REQ") };
    let (_, port) = softrdma_wire::cma::split_service_id(kreq.service_id).unwrap();
    let hdr = softrdma_wire::cma::CmaHeaderRepr::parse(kreq.private_data).unwrap();
    let now = Instant::ZERO;
    let mut a = Cm::new(config(req.src, c.active_guid));
    let id = a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    a.bind_addr(id, SocketAddr::new(req.src, hdr.port)).unwrap();
    a.resolve_addr(now, id, Some(SocketAddr::new(req.src, 0)), SocketAddr::new(req.dst, port)).unwrap();
    a.resolve_route(now, id).unwrap();
    let param = ConnParam {
        private_data: Vec::new(),
        responder_resources: kreq.responder_resources,
        initiator_depth: kreq.initiator_depth,
        flow_control: kreq.end_to_end_flow_control,
        retry_count: kreq.retry_count,
        rnr_retry_count: kreq.rnr_retry_count,
        srq: kreq.srq,
        qp_num: kreq.local_qpn.value(),
        start_psn: Some(kreq.starting_psn.value()),
        qkey: 0,
    };
    (a, id, param)
}

#[test]
fn our_req_rtu_and_dreq_match_the_kernels() {
    for c in CONNECTIONS {
        let mads = mads_in(c.file);
        let (mut a, id, param) = active_like(&c, &mads);
        let now = Instant::ZERO;
        a.connect(now, id, &param).unwrap();
        let req = mad_at(&mads, c.req);
        let ours = take_one(&mut a);
        assert_same_except(&format!("{} REQ", c.file), &ours, &req.bytes, &[TID, LOCAL_COMM_ID]);
        let our_comm_id = a.local_comm_id(id).unwrap();
        // cm_form_tid: the comm ID in the TID's low half, in the kernel's host byte order.
        assert_eq!(u64::from_be_bytes(ours[TID].try_into().unwrap()) as u32, our_comm_id.swap_bytes());

        let rep = with_comm_id(mad_at(&mads, c.rep), REMOTE_COMM_ID, our_comm_id);
        a.handle_mad(now, req.dst, req.src, &rep);
        let events: Vec<_> = std::iter::from_fn(|| a.poll_event()).map(|e| e.kind).collect();
        assert_eq!(events.last(), Some(&CmEventKind::ConnectResponse), "{}", c.file);
        a.establish(now, id).unwrap();
        let ours = take_one(&mut a);
        assert_same_except(&format!("{} RTU", c.file), &ours, &mad_at(&mads, c.rtu).bytes, &[TID, LOCAL_COMM_ID]);

        if let Some((dreq, _)) = c.dreq_drep {
            a.disconnect(now, id).unwrap();
            let ours = take_one(&mut a);
            assert_same_except(&format!("{} DREQ", c.file), &ours, &mad_at(&mads, dreq).bytes, &[TID, LOCAL_COMM_ID]);
        }
    }
}

/// guest-to-host-rping-cm-req.pcap: nobody answered rping's REQ, and rping gave up and
/// destroyed its ID, whose REQ was still unanswered: the kernel sent REJ reason 4 (timeout)
/// with its CA GUID as ARI. Our `destroy_id` in that state sends the same.
#[test]
fn our_req_and_timeout_rej_match_the_kernels() {
    let file = "guest-to-host-rping-cm-req.pcap";
    let mads = mads_in(file);
    let c = Connection {
        file,
        req: 1,
        rep: 0,
        rtu: 0,
        dreq_drep: None,
        active_guid: 0x5054_00ff_fe18_0001,
        passive_guid: 0,
    };
    let (mut a, id, param) = active_like(&c, &mads);
    let now = Instant::ZERO;
    a.connect(now, id, &param).unwrap();
    let req = take_one(&mut a);
    assert_same_except("REQ", &req, &mad_at(&mads, 1).bytes, &[TID, LOCAL_COMM_ID]);
    // The retransmission after the timeout is the same REQ.
    let t = a.poll_timeout().unwrap();
    assert_eq!(t - now, Duration::from_nanos(4096 << 20));
    a.handle_timeout(t);
    assert_eq!(take_one(&mut a), req);
    assert_same_except("REQ again", &req, &mad_at(&mads, 3).bytes, &[TID, LOCAL_COMM_ID]);
    a.destroy_id(t, id).unwrap();
    let rej = take_one(&mut a);
    assert_same_except("REJ", &rej, &mad_at(&mads, 5).bytes, &[TID, LOCAL_COMM_ID]);
    assert_eq!(rej[TID], req[TID], "the REJ reuses the exchange's TID");
}
