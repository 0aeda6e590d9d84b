//! Every MAD that the Linux kernel put on the wire in the project's captures (tests/data, real
//! rxe runs) parses, and re-emits byte for byte from its parsed form: the CM messages of
//! rping and `ib_write_bw -R` through `CmMessage`, the PerfMgmt probes through `MadRepr`.
//!
//! Frames are cut by hand at fixed offsets (Ethernet 14, IPv4 20, UDP 8, BTH 12, DETH 8) so
//! that this test depends only on the MAD modules.
//!
//! The literal values below were read from `tshark -r <file> -Y infiniband.mad -V`, except
//! the REQ flow label, which tshark misdecodes (it shows 0x004a8 and a non-zero reserved
//! field for bytes `4a 85 60 00`).

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use pcap_file::pcap::PcapReader;
use softrdma_wire::Error;
use softrdma_wire::cm::{CmMessage, CmMsgResponse, RejReason, TransportServiceType};
use softrdma_wire::cma::{CMA_VERSION, CmaHeaderRepr, PortSpace, split_service_id};
use softrdma_wire::mad::{AttributeId, MAD_LEN, MadHeader, MadPacket, MadRepr, Method, MgmtClass};
use softrdma_wire::types::{Gid, PKey, QKey, Qpn};

const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const UDP_LEN: usize = 8;
const ICMP_LEN: usize = 8;
const BTH_LEN: usize = 12;
const DETH_LEN: usize = 8;
const ICRC_LEN: usize = 4;
const UD_SEND_ONLY: u8 = 0x64;

fn data_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data"))
}

/// One MAD found in a capture.
struct CapturedMad {
    /// 1-based, as tshark numbers frames.
    frame: usize,
    /// The IP addresses of the packet that carried it.
    src: Ipv4Addr,
    dst: Ipv4Addr,
    /// Quoted in an ICMP destination-unreachable error rather than sent.
    quoted: bool,
    bytes: Vec<u8>,
}

/// The RoCEv2 payload (BTH onward) of an IPv4 packet, if it is UDP to port 4791, with the IP
/// addresses.
fn roce_payload(ip: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, &[u8])> {
    if ip.len() < IPV4_LEN + UDP_LEN || ip[0] != 0x45 || ip[9] != 17 {
        return None;
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let udp = &ip[IPV4_LEN..];
    if u16::from_be_bytes([udp[2], udp[3]]) != 4791 {
        return None;
    }
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    Some((src, dst, &udp[UDP_LEN..udp_len]))
}

/// Every MAD in the capture `name`: UD SEND_ONLY packets to QP 1, sent or quoted in ICMP.
fn mads_in(name: &str) -> Vec<CapturedMad> {
    let file = File::open(data_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut reader = PcapReader::new(file).unwrap();
    let mut mads = Vec::new();
    let mut frame = 0;
    while let Some(packet) = reader.next_packet() {
        frame += 1;
        let data = packet.unwrap().data.into_owned();
        if data.len() < ETH_LEN + IPV4_LEN || data[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &data[ETH_LEN..];
        let (found, quoted) = match ip[9] {
            17 => (roce_payload(ip), false),
            // ICMP destination unreachable quotes the whole original packet here.
            1 if ip[IPV4_LEN] == 3 => (roce_payload(&ip[IPV4_LEN + ICMP_LEN..]), true),
            _ => continue,
        };
        let Some((src, dst, roce)) = found else { continue };
        let dest_qp = u32::from_be_bytes([0, roce[5], roce[6], roce[7]]);
        if roce[0] != UD_SEND_ONLY || dest_qp != Qpn::GSI.value() {
            continue;
        }
        assert_eq!(roce.len(), BTH_LEN + DETH_LEN + MAD_LEN + ICRC_LEN, "{name} frame {frame}: GSI packet size");
        let deth = &roce[BTH_LEN..BTH_LEN + DETH_LEN];
        assert_eq!(deth[..4], QKey::GSI.0.to_be_bytes(), "{name} frame {frame}: GSI Q_Key");
        assert_eq!(deth[5..], [0, 0, 1], "{name} frame {frame}: source QP 1");
        let mad = &roce[BTH_LEN + DETH_LEN..BTH_LEN + DETH_LEN + MAD_LEN];
        mads.push(CapturedMad { frame, src, dst, quoted, bytes: mad.to_vec() });
    }
    mads
}

/// Parses a captured MAD, re-emits it from its parsed form into a 0xa5-filled buffer, and
/// checks the bytes are the same. Returns the parsed MAD.
fn parse_and_reemit<'a>(name: &str, mad: &'a CapturedMad) -> (MadRepr<'a>, Option<CmMessage<'a>>) {
    let what = format!("{name} frame {}", mad.frame);
    let repr = MadRepr::parse(&MadPacket::new_checked(&mad.bytes[..]).unwrap()).unwrap();
    let mut out = vec![0xa5u8; MAD_LEN];
    let mut packet = MadPacket::new_unchecked(&mut out[..]);
    let message = match CmMessage::parse(&repr) {
        Ok(message) => {
            assert_eq!(repr.header, message.mad_header(repr.header.transaction_id), "{what}: a Linux CM header");
            repr.header.emit(&mut packet);
            message.emit(packet.data_mut()).unwrap();
            Some(message)
        }
        Err(Error::NotCm) => {
            assert_ne!(repr.header.mgmt_class, MgmtClass::CM);
            repr.emit(&mut packet).unwrap();
            None
        }
        Err(e) => panic!("{what}: {e}"),
    };
    assert_eq!(out, mad.bytes, "{what}: re-emitted MAD differs");
    (repr, message)
}

fn name_of(repr: &MadRepr<'_>, message: &Option<CmMessage<'_>>) -> String {
    match message {
        Some(m) => m.name().to_string(),
        None => format!("{}:{}", repr.header.mgmt_class, repr.header.method),
    }
}

/// (file, the MADs sent in it, then those quoted in ICMP errors), named as
/// `tshark -Y infiniband.mad` lists them.
const CAPTURES: [(&str, &[&str], &[&str]); 13] = [
    ("guest-to-host-rping-cm-req.pcap", &["REQ", "REQ", "REJ"], &["REQ", "REQ", "REJ"]),
    (
        "host-guest-mad-probe.guest-eth0.pcap",
        &["PERF:GET", "PERF:GET_RESP", "PERF:GET", "PERF:GET_RESP", "PERF:GET", "PERF:GET_RESP"],
        &[],
    ),
    (
        "host-guest-mad-probe.pcap",
        &["PERF:GET", "PERF:GET_RESP", "PERF:GET", "PERF:GET_RESP", "PERF:GET", "PERF:GET_RESP"],
        &[],
    ),
    ("rxe2rxe-ib_read_lat.pcap", &[], &[]),
    ("rxe2rxe-ib_send_bw.pcap", &[], &[]),
    ("rxe2rxe-ib_send_lat.pcap", &[], &[]),
    (
        "rxe2rxe-ib_write_bw-rdma_cm.pcap",
        &["REQ", "REP", "RTU", "REQ", "REP", "RTU", "DREQ", "DREQ", "DREP", "DREQ", "DREP"],
        &[],
    ),
    ("rxe2rxe-ib_write_bw.pcap", &[], &[]),
    ("rxe2rxe-ib_write_lat.pcap", &[], &[]),
    ("rxe2rxe-ibv_rc_pingpong.pcap", &[], &[]),
    ("rxe2rxe-ibv_ud_pingpong.pcap", &[], &[]),
    ("rxe2rxe-rping.guest1-eth0.pcap", &["REQ", "REP", "RTU", "DREQ", "DREP"], &[]),
    ("rxe2rxe-rping.pcap", &["REQ", "REP", "RTU", "DREQ", "DREP"], &[]),
];

#[test]
fn every_project_capture_is_listed() {
    let mut on_disk: Vec<String> = std::fs::read_dir(data_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".pcap"))
        .collect();
    on_disk.sort();
    let listed: Vec<&str> = CAPTURES.iter().map(|c| c.0).collect();
    assert_eq!(on_disk, listed);
}

#[test]
fn every_captured_mad_reemits_identically() {
    let (mut cm_sent, mut cm_quoted, mut perf) = (0, 0, 0);
    for (name, sent, quoted) in CAPTURES {
        let mut names_sent = Vec::new();
        let mut names_quoted = Vec::new();
        for mad in &mads_in(name) {
            let (repr, message) = parse_and_reemit(name, mad);
            match (&message, mad.quoted) {
                (Some(_), false) => cm_sent += 1,
                (Some(_), true) => cm_quoted += 1,
                (None, _) => perf += 1,
            }
            let label = name_of(&repr, &message);
            if mad.quoted {
                names_quoted.push(label)
            } else {
                names_sent.push(label)
            }

            // rdma_cm's header in every REQ names the IP addresses the REQ travelled between.
            if let Some(CmMessage::Req(req)) = message {
                let what = format!("{name} frame {}", mad.frame);
                let cma = CmaHeaderRepr::parse(req.private_data).unwrap();
                assert_eq!(cma.cma_version, CMA_VERSION, "{what}");
                assert_eq!(cma.src_ip(), Some(IpAddr::V4(mad.src)), "{what}: cma_hdr src_addr");
                assert_eq!(cma.dst_ip(), Some(IpAddr::V4(mad.dst)), "{what}: cma_hdr dst_addr");
                assert_eq!(req.primary_path.local_gid, Gid::from_ip(mad.src.into()).0, "{what}: local GID");
                assert_eq!(req.primary_path.remote_gid, Gid::from_ip(mad.dst.into()).0, "{what}: remote GID");
                // cma.c hashes the rdma_cm ports into the flow label: (sport * 31 + dport) & 0xfffff.
                let (port_space, dport) = split_service_id(req.service_id).unwrap();
                assert_eq!(port_space, PortSpace::TCP, "{what}");
                let hash = (u32::from(cma.port) * 31 + u32::from(dport)) & 0xf_ffff;
                assert_eq!(req.primary_path.flow_label, hash, "{what}: flow label");
                // cm_form_tid puts the __be32 comm ID in the TID as a host (little-endian) u32.
                assert_eq!(repr.header.transaction_id as u32, req.local_comm_id.swap_bytes(), "{what}: TID");
            }
        }
        assert_eq!(names_sent, sent, "{name}: MADs sent");
        assert_eq!(names_quoted, quoted, "{name}: MADs quoted in ICMP errors");
    }
    assert_eq!((cm_sent, cm_quoted, perf), (24, 3, 12));
}

/// The MAD at tshark frame number `frame`, as sent (not quoted).
fn mad_at(mads: &[CapturedMad], frame: usize) -> &CapturedMad {
    mads.iter().find(|m| m.frame == frame && !m.quoted).unwrap_or_else(|| panic!("no MAD in frame {frame}"))
}

#[test]
fn rping_connection_by_hand() {
    let name = "rxe2rxe-rping.pcap";
    let mads = mads_in(name);
    let req_mad = mad_at(&mads, 3);
    let (repr, message) = parse_and_reemit(name, req_mad);
    assert_eq!(repr.header, MadHeader::cm(AttributeId::REQ, 0x0000_0002_2dbc_dc8f));
    let Some(CmMessage::Req(req)) = message else { panic!("frame 3 is the REQ") };
    assert_eq!(req.local_comm_id, 0x8fdc_bc2d);
    assert_eq!(req.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(split_service_id(req.service_id), Some((PortSpace::TCP, 7174)));
    assert_eq!(req.local_ca_guid, 0x5054_00ff_fe18_0001);
    assert_eq!(req.local_qpn.value(), 0x00005b);
    assert_eq!(req.starting_psn.value(), 0x0b3beb);
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!((req.remote_cm_response_timeout, req.local_cm_response_timeout), (0x14, 0x14));
    assert_eq!(req.transport_service_type, TransportServiceType::RC);
    assert_eq!((req.retry_count, req.rnr_retry_count, req.max_cm_retries), (7, 7, 15));
    assert_eq!((req.pkey, req.path_mtu), (PKey::DEFAULT, 3));
    assert_eq!((req.primary_path.local_lid, req.primary_path.remote_lid), (0xffff, 0xffff));
    assert_eq!(req.primary_path.flow_label, 0x4a856);
    assert_eq!((req.primary_path.hop_limit, req.primary_path.local_ack_timeout), (0x40, 0x13));
    assert_eq!(req.alternate_path, Default::default());
    let cma = CmaHeaderRepr::parse(req.private_data).unwrap();
    assert_eq!(cma.port, 0xa9b0);

    let rep_mad = mad_at(&mads, 4);
    let (_, message) = parse_and_reemit(name, rep_mad);
    let Some(CmMessage::Rep(rep)) = message else { panic!("frame 4 is the REP") };
    assert_eq!((rep.local_comm_id, rep.remote_comm_id), (0xe1ae_a61d, 0x8fdc_bc2d));
    assert_eq!(rep.local_qpn.value(), 0x000011);
    assert_eq!(rep.starting_psn.value(), 0x296126);
    assert_eq!((rep.responder_resources, rep.initiator_depth), (1, 1));
    assert_eq!((rep.target_ack_delay, rep.failover_accepted, rep.rnr_retry_count), (0x0f, 0, 7));
    assert_eq!(rep.local_ca_guid, 0x5054_00ff_fe18_0002);
    let message = message.unwrap();
    assert_eq!((message.local_comm_id(), message.remote_comm_id()), (Some(0xe1ae_a61d), Some(0x8fdc_bc2d)));

    let (_, message) = parse_and_reemit(name, mad_at(&mads, 6));
    let message = message.unwrap();
    assert_eq!(message.name(), "RTU");
    assert_eq!((message.local_comm_id(), message.remote_comm_id()), (Some(0x8fdc_bc2d), Some(0xe1ae_a61d)));

    let (_, message) = parse_and_reemit(name, mad_at(&mads, 66));
    let Some(CmMessage::Dreq(dreq)) = message else { panic!("frame 66 is the DREQ") };
    assert_eq!((dreq.local_comm_id, dreq.remote_comm_id), (0x8fdc_bc2d, 0xe1ae_a61d));
    assert_eq!(dreq.remote_qpn, rep.local_qpn, "the DREQ names the peer's QP");

    let (_, message) = parse_and_reemit(name, mad_at(&mads, 67));
    let message = message.unwrap();
    assert_eq!(message.name(), "DREP");
    assert_eq!((message.local_comm_id(), message.remote_comm_id()), (Some(0xe1ae_a61d), Some(0x8fdc_bc2d)));
}

#[test]
fn ib_write_bw_rdma_cm_by_hand() {
    let name = "rxe2rxe-ib_write_bw-rdma_cm.pcap";
    let mads = mads_in(name);
    let (_, message) = parse_and_reemit(name, mad_at(&mads, 1));
    let Some(CmMessage::Req(req)) = message else { panic!("frame 1 is a REQ") };
    assert_eq!(req.local_comm_id, 0x8edc_bc2d);
    assert_eq!(split_service_id(req.service_id), Some((PortSpace::TCP, 0x4853)));
    assert_eq!((req.local_qpn.value(), req.starting_psn.value()), (0x000063, 0xfca8af));
    assert_eq!(CmaHeaderRepr::parse(req.private_data).unwrap().port, 0x83c2);

    let (_, message) = parse_and_reemit(name, mad_at(&mads, 2));
    let Some(CmMessage::Rep(rep)) = message else { panic!("frame 2 is a REP") };
    assert_eq!((rep.local_comm_id, rep.remote_comm_id), (0xe3ae_a61d, 0x8edc_bc2d));
    assert_eq!((rep.local_qpn.value(), rep.starting_psn.value()), (0x000019, 0xfc44f3));

    // Both sides disconnect the second connection at once: two DREQs cross.
    let (repr, message) = parse_and_reemit(name, mad_at(&mads, 252));
    let Some(CmMessage::Dreq(dreq)) = message else { panic!("frame 252 is a DREQ") };
    assert_eq!(repr.header.transaction_id, 0x0000_0002_1da6_aee5);
    assert_eq!((dreq.local_comm_id, dreq.remote_comm_id, dreq.remote_qpn.value()), (0xe5ae_a61d, 0x91dc_bc2d, 0x64));
}

#[test]
fn rejected_rping_by_hand() {
    let name = "guest-to-host-rping-cm-req.pcap";
    let mads = mads_in(name);
    let (_, message) = parse_and_reemit(name, mad_at(&mads, 1));
    let Some(CmMessage::Req(req)) = message else { panic!("frame 1 is the REQ") };
    assert_eq!(req.local_comm_id, 0x8cdc_bc2d);
    assert_eq!((req.local_qpn.value(), req.starting_psn.value()), (0x00005a, 0xdf68e0));

    // Nobody answered (the host's port 4791 was closed: see the ICMP errors), so after its
    // retries the active side rejected its own REQ with reason 4, ARI = its CA GUID.
    let (repr, message) = parse_and_reemit(name, mad_at(&mads, 5));
    assert_eq!(repr.header.transaction_id, 0x0000_0002_2dbc_dc8c);
    let Some(CmMessage::Rej(rej)) = message else { panic!("frame 5 is the REJ") };
    assert_eq!(rej.reason, RejReason::TIMEOUT);
    assert_eq!(rej.reason.0, 0x0004);
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (0x8cdc_bc2d, 0));
    assert_eq!(rej.message_rejected, CmMsgResponse::OTHER);
    assert_eq!(rej.reject_info_length, 8);
    assert_eq!(rej.ari(), req.local_ca_guid.to_be_bytes());
}

#[test]
fn perf_probe_is_not_cm() {
    let name = "host-guest-mad-probe.pcap";
    let mads = mads_in(name);
    let get = mad_at(&mads, 1);
    let repr = MadRepr::parse(&MadPacket::new_checked(&get.bytes[..]).unwrap()).unwrap();
    assert_eq!(CmMessage::parse(&repr), Err(Error::NotCm));
    assert_eq!(
        repr.header,
        MadHeader {
            base_version: 1,
            mgmt_class: MgmtClass::PERF,
            class_version: 1,
            method: Method::GET,
            status: 0,
            class_specific: 0,
            transaction_id: 0x30e1_7d90_d183_9b5f,
            attribute_id: AttributeId::PORT_COUNTERS,
            attribute_modifier: 0,
        }
    );
    assert_eq!(repr.header.attribute_name(), Some("PORT_COUNTERS"));
    parse_and_reemit(name, get);

    // rxe has no PMA: the answer is status 0x000c, "unsupported method/attribute".
    let (resp, message) = parse_and_reemit(name, mad_at(&mads, 2));
    assert!(message.is_none());
    assert_eq!((resp.header.method, resp.header.status), (Method::GET_RESP, 0x000c));
    assert_eq!(resp.header.transaction_id, repr.header.transaction_id);
    assert!(resp.data.iter().all(|&b| b == 0));
}
