//! # softrdma-cm
//!
//! A sans-IO connection manager for RoCE: the IB CM protocol (IBA chapter 12) carried in
//! MADs between QP1s, with rdma_cm's addressing on top (service IDs from port spaces and
//! ports, the 36-byte private-data header with the IP addresses), wire-compatible with
//! Linux's `drivers/infiniband/core/cm.c` and `cma.c` as librdmacm uses them with kernel
//! rxe. Messages are built and parsed by [`softrdma_wire::cm`], [`softrdma_wire::mad`] and
//! [`softrdma_wire::cma`]; the QP attributes it hands out are `softrdma-engine`'s.
//!
//! [`Cm`] is the state machine; its documentation gives the calling contract. It does no
//! I/O, reads no clock and takes its randomness from the seed in [`CmConfig`].
//!
//! ## Comm IDs and steering
//!
//! Several processes share one UDP port 4791 on a host; the kernel steers each MAD that
//! arrives for QP1 to a process by reading, for a REQ or SIDR_REQ, the service ID; for a
//! SIDR_REP, the request ID; for every other CM message, the remote comm ID (see
//! [`steering_key`]). So every local comm ID and SIDR request ID a [`Cm`] allocates is
//!
//! ```text
//!  31                  21 20                              0
//! +----------------------+---------------------------------+
//! | comm_id_prefix >> 21 |  counter (1 ..= 2^21 - 1)       |
//! +----------------------+---------------------------------+
//! ```
//!
//! where the prefix (the host's slot for this process, shifted left by
//! [`COMM_ID_COUNTER_BITS`]) comes from [`CmConfig::comm_id_prefix`], and the counter starts
//! at a random value and counts up, wrapping, never 0 and never a value still in use.
//!
//! ## Example: two CMs connect an RC QP pair
//!
//! ```
//! use std::net::{IpAddr, SocketAddr};
//! use softrdma_cm::{Cm, CmConfig, CmEventKind, ConnParam};
//! use softrdma_engine::{Instant, QpState, QpType};
//! use softrdma_wire::cma::PortSpace;
//!
//! let (ip_a, ip_b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
//! let config = |seed, ip| CmConfig { seed, addresses: vec![ip], ..CmConfig::default() };
//! let (mut a, mut b) = (Cm::new(config(1, ip_a)), Cm::new(config(2, ip_b)));
//! let now = Instant::ZERO;
//! // Carry every MAD to the other side, as the runtime does over UDP.
//! fn pump(now: Instant, a: &mut Cm, b: &mut Cm) {
//!     loop {
//!         if let Some(t) = a.poll_transmit() { b.handle_mad(now, t.src, t.dst, &t.mad); continue; }
//!         if let Some(t) = b.poll_transmit() { a.handle_mad(now, t.src, t.dst, &t.mad); continue; }
//!         break;
//!     }
//! }
//!
//! // Passive side: listen on port 7174 of every address.
//! let listener = b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
//! b.bind_addr(listener, SocketAddr::new("0.0.0.0".parse().unwrap(), 7174)).unwrap();
//! b.listen(listener, 16).unwrap();
//!
//! // Active side: resolve, route, connect.
//! let id = a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
//! a.resolve_addr(now, id, Some(SocketAddr::new(ip_a, 0)), SocketAddr::new(ip_b, 7174)).unwrap();
//! a.resolve_route(now, id).unwrap();
//! let param = ConnParam { qp_num: 0x11, private_data: b"hello".to_vec(), ..ConnParam::default() };
//! a.connect(now, id, &param).unwrap();
//! pump(now, &mut a, &mut b);
//!
//! let req = b.poll_event().unwrap();
//! assert_eq!(req.kind, CmEventKind::ConnectRequest);
//! assert!(req.private_data.starts_with(b"hello"));
//! b.accept(now, req.id, &ConnParam { qp_num: 0x22, ..ConnParam::default() }).unwrap();
//! pump(now, &mut a, &mut b);
//!
//! assert_eq!(a.poll_event().unwrap().kind, CmEventKind::AddrResolved);
//! assert_eq!(a.poll_event().unwrap().kind, CmEventKind::RouteResolved);
//! assert_eq!(a.poll_event().unwrap().kind, CmEventKind::ConnectResponse);
//! let (rtr, _) = a.qp_attr(id, QpState::Rtr).unwrap(); // the runtime modifies its QP
//! assert_eq!(rtr.dest_qp_num, 0x22);
//! a.establish(now, id).unwrap();
//! pump(now, &mut a, &mut b);
//! assert_eq!(a.poll_event().unwrap().kind, CmEventKind::Established);
//! assert_eq!(b.poll_event().unwrap().kind, CmEventKind::Established);
//! ```
#![forbid(unsafe_code)]

pub mod auth;
mod cm;
mod nic;
mod types;

pub use cm::{Cm, CmIdInfo, CmState, cm_ack_timeout, ib_timeout, rdma_flow_label};
pub use nic::{Nic, NicCounters, NicError, NicEvent};
pub use types::{
    CMA_CM_MRA_SERVICE_TIMEOUT, CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME, CMA_MAX_CM_RETRIES, CmConfig,
    CmCounters, CmError, CmEvent, CmEventKind, CmId, CmStatus, CmTransmit, ConnParam, MAX_BACKLOG,
    RXE_LOCAL_CA_ACK_DELAY, UdParam,
};

use softrdma_wire::mad::{AttributeId, MAD_HEADER_LEN, MAD_LEN, MgmtClass};

/// Bits of a comm ID (or SIDR request ID) that the CM counts in; the bits above are
/// [`CmConfig::comm_id_prefix`].
pub const COMM_ID_COUNTER_BITS: u32 = 21;
/// The counter part of a comm ID.
pub const COMM_ID_COUNTER_MASK: u32 = (1 << COMM_ID_COUNTER_BITS) - 1;

/// MAD offset of the service ID of a REQ or SIDR_REQ (data offset 8).
pub const SERVICE_ID_MAD_OFFSET: usize = MAD_HEADER_LEN + 8;
/// MAD offset of a SIDR_REP's request ID (data offset 0).
pub const SIDR_REP_REQUEST_ID_MAD_OFFSET: usize = MAD_HEADER_LEN;
/// MAD offset of the remote comm ID of REP, RTU, REJ, MRA, DREQ, DREP, LAP and APR (data
/// offset 4).
pub const REMOTE_COMM_ID_MAD_OFFSET: usize = MAD_HEADER_LEN + 4;
/// MAD offset of the attribute ID (2 bytes, big-endian).
pub const ATTRIBUTE_ID_MAD_OFFSET: usize = 16;

/// What the host's steering program reads from a CM MAD to choose the receiving process.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum SteeringKey {
    /// A REQ or SIDR_REQ: the listener registered for this service ID.
    ServiceId(u64),
    /// A SIDR_REP: the process whose prefix this request ID carries.
    RequestId(u32),
    /// Any other CM message: the process whose prefix this (our local) comm ID carries.
    RemoteCommId(u32),
}

impl SteeringKey {
    /// The comm ID prefix slot the key steers to (`id >> 21`), for the two ID kinds.
    pub fn slot(self) -> Option<u32> {
        match self {
            SteeringKey::ServiceId(_) => None,
            SteeringKey::RequestId(id) | SteeringKey::RemoteCommId(id) => Some(id >> COMM_ID_COUNTER_BITS),
        }
    }
}

/// The steering key of a received MAD, read at fixed offsets exactly as the host's BPF
/// program does: the class at byte 1, the attribute ID at bytes 16–17, then the service ID
/// at byte 32 (REQ, SIDR_REQ), the request ID at byte 24 (SIDR_REP) or the remote comm ID
/// at byte 28 (everything else). `None` if `mad` is not a whole CM MAD.
pub fn steering_key(mad: &[u8]) -> Option<SteeringKey> {
    if mad.len() < MAD_LEN || mad[1] != MgmtClass::CM.0 {
        return None;
    }
    let at = |off: usize| u32::from_be_bytes([mad[off], mad[off + 1], mad[off + 2], mad[off + 3]]);
    let attr = AttributeId(u16::from_be_bytes([mad[ATTRIBUTE_ID_MAD_OFFSET], mad[ATTRIBUTE_ID_MAD_OFFSET + 1]]));
    Some(match attr {
        AttributeId::REQ | AttributeId::SIDR_REQ => SteeringKey::ServiceId(
            (u64::from(at(SERVICE_ID_MAD_OFFSET)) << 32) | u64::from(at(SERVICE_ID_MAD_OFFSET + 4)),
        ),
        AttributeId::SIDR_REP => SteeringKey::RequestId(at(SIDR_REP_REQUEST_ID_MAD_OFFSET)),
        _ => SteeringKey::RemoteCommId(at(REMOTE_COMM_ID_MAD_OFFSET)),
    })
}

#[cfg(test)]
mod tests {
    use softrdma_wire::cm::{
        CmMessage, CmMsgResponse, DrepRepr, DreqRepr, MraRepr, RejReason, RejRepr, RepRepr, ReqRepr, RtuRepr,
        SidrRepRepr, SidrReqRepr, SidrStatus,
    };
    use softrdma_wire::mad::MadPacket;
    use softrdma_wire::types::Qpn;

    use super::*;

    fn mad_of(msg: &CmMessage<'_>) -> [u8; MAD_LEN] {
        let mut mad = [0xa5u8; MAD_LEN];
        let mut p = MadPacket::new_unchecked(&mut mad[..]);
        msg.mad_header(0x1234).emit(&mut p);
        msg.emit(p.data_mut()).unwrap();
        mad
    }

    /// The offsets the host's steering program uses, pinned against the wire codec: every
    /// message's ID lands where `steering_key` (and the BPF program) reads it, and agrees
    /// with `CmMessage::remote_comm_id`.
    #[test]
    fn steering_offsets_match_the_codec() {
        let (local, remote) = (0x1122_3344, 0x0aa0_0001);
        assert_eq!(REMOTE_COMM_ID_MAD_OFFSET, 28);
        assert_eq!(SERVICE_ID_MAD_OFFSET, 32);
        assert_eq!(SIDR_REP_REQUEST_ID_MAD_OFFSET, 24);
        let rep = RepRepr {
            local_comm_id: local,
            remote_comm_id: remote,
            local_qkey: Default::default(),
            local_qpn: Qpn::from_u24_truncating(5),
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: softrdma_wire::Psn::from_u24_truncating(9),
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0xdead,
            private_data: &[],
        };
        let messages = [
            CmMessage::Rep(rep),
            CmMessage::Rtu(RtuRepr { local_comm_id: local, remote_comm_id: remote, private_data: &[] }),
            CmMessage::Rej(RejRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                message_rejected: CmMsgResponse::REQ,
                reject_info_length: 0,
                reason: RejReason::CONSUMER_DEFINED,
                additional_reject_info: &[],
                private_data: &[],
            }),
            CmMessage::Mra(MraRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                message_mraed: CmMsgResponse::REQ,
                service_timeout: 24,
                private_data: &[],
            }),
            CmMessage::Dreq(DreqRepr {
                local_comm_id: local,
                remote_comm_id: remote,
                remote_qpn: Qpn::from_u24_truncating(7),
                private_data: &[],
            }),
            CmMessage::Drep(DrepRepr { local_comm_id: local, remote_comm_id: remote, private_data: &[] }),
        ];
        for msg in &messages {
            let mad = mad_of(msg);
            assert_eq!(mad[28..32], remote.to_be_bytes(), "{}", msg.name());
            assert_eq!(steering_key(&mad), Some(SteeringKey::RemoteCommId(remote)), "{}", msg.name());
            assert_eq!(msg.remote_comm_id(), Some(remote));
            assert_eq!(steering_key(&mad).unwrap().slot(), Some(remote >> 21));
        }

        let sid = 0x0000_0000_0106_1c06;
        let req = ReqRepr {
            local_comm_id: local,
            vendor_id: 0,
            service_id: sid,
            local_ca_guid: 1,
            local_qkey: Default::default(),
            local_qpn: Qpn::from_u24_truncating(1),
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: softrdma_wire::cm::TransportServiceType::RC,
            end_to_end_flow_control: false,
            starting_psn: Default::default(),
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: softrdma_wire::types::PKey::DEFAULT,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary_path: Default::default(),
            alternate_path: Default::default(),
            sap_supported: false,
            private_data: &[],
        };
        let mad = mad_of(&CmMessage::Req(req));
        assert_eq!(mad[32..40], sid.to_be_bytes());
        assert_eq!(steering_key(&mad), Some(SteeringKey::ServiceId(sid)));
        let sreq = SidrReqRepr { request_id: local, pkey: Default::default(), service_id: sid, private_data: &[] };
        assert_eq!(steering_key(&mad_of(&CmMessage::SidrReq(sreq))), Some(SteeringKey::ServiceId(sid)));
        let srep = SidrRepRepr {
            request_id: remote,
            status: SidrStatus::SUCCESS,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: Qpn::from_u24_truncating(3),
            service_id: sid,
            qkey: Default::default(),
            additional_info: &[],
            private_data: &[],
        };
        let mad = mad_of(&CmMessage::SidrRep(srep));
        assert_eq!(mad[24..28], remote.to_be_bytes());
        assert_eq!(steering_key(&mad), Some(SteeringKey::RequestId(remote)));
        assert_eq!(CmMessage::SidrRep(srep).remote_comm_id(), Some(remote));
    }

    #[test]
    fn not_cm_has_no_key() {
        assert_eq!(steering_key(&[0u8; 10]), None);
        let mut mad = [0u8; MAD_LEN];
        mad[1] = MgmtClass::PERF.0;
        assert_eq!(steering_key(&mad), None);
    }
}
