//! IB connection manager messages (IBA 12.6), the data areas of MADs of class
//! [`MgmtClass::CM`], which rdma_cm exchanges on RoCE to connect RC QPs and to resolve UD
//! services.
//!
//! Each message has a `Repr` holding its fields as typed values and its private data borrowed
//! from the MAD. Layouts follow `include/rdma/ibta_vol1_c12.h` (bit 0 of a byte there is its
//! most significant bit); offsets below are from the start of the 232-byte MAD data area.
//! [`CmMessage`] dispatches on the attribute ID and keeps unknown attributes verbatim.
//!
//! Every `emit` writes all [`MAD_DATA_LEN`] bytes: reserved bits as zero, fields masked to
//! their width, and private data zero-padded to its fixed size (as the kernel does, since it
//! builds messages in a zeroed MAD). For every message `r`, `parse(emit(r)) == r` as long as
//! the private data has its full size.
//!
//! ```
//! use softrdma_wire::cm::{CmMessage, RtuRepr};
//! use softrdma_wire::mad::{MAD_LEN, MadPacket, MadRepr};
//!
//! let rtu = CmMessage::Rtu(RtuRepr { local_comm_id: 0x8fdc_bc2d, remote_comm_id: 0xe1ae_a61d, private_data: &[] });
//! let mut mad = [0u8; MAD_LEN];
//! let mut packet = MadPacket::new_unchecked(&mut mad[..]);
//! rtu.mad_header(0x2_2dbc_dc8f).emit(&mut packet);
//! rtu.emit(packet.data_mut()).unwrap();
//!
//! let parsed = MadRepr::parse(&MadPacket::new_unchecked(&mad[..])).unwrap();
//! let message = CmMessage::parse(&parsed).unwrap();
//! assert_eq!(message.name(), "RTU");
//! assert_eq!(message.remote_comm_id(), Some(0xe1ae_a61d));
//! ```

use core::fmt;

use crate::field::{self, Field};
use crate::mad::{AttributeId, MAD_DATA_LEN, MadHeader, MadRepr, MgmtClass};
use crate::psn::Psn;
use crate::types::{PKey, QKey, Qpn};
use crate::{Error, Result};

/// Private data bytes in a REQ (`include/rdma/ib_cm.h: IB_CM_REQ_PRIVATE_DATA_SIZE`).
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private data bytes in an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Private data bytes in a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Private data bytes in a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private data bytes in an RTU.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Private data bytes in a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Private data bytes in a DREP.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// Private data bytes in a SIDR_REQ.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Private data bytes in a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Bytes of additional reject information in a REJ (`IB_CM_REJ_ARI_LENGTH`).
pub const REJ_ARI_LEN: usize = 72;
/// Bytes of additional information in a SIDR_REP (`IB_CM_SIDR_REP_INFO_LENGTH`).
pub const SIDR_REP_INFO_LEN: usize = 72;
/// Bytes of one path in a REQ (primary and alternate alike).
pub const CM_PATH_LEN: usize = 44;

/// A REJ reason (IBA Table 109; Linux `enum ib_cm_rej_reason`). Open: unknown reasons are
/// kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RejReason(pub u16);

impl RejReason {
    /// No QP available.
    pub const NO_QP: Self = Self(1);
    /// No EE context available.
    pub const NO_EEC: Self = Self(2);
    /// No resources available.
    pub const NO_RESOURCES: Self = Self(3);
    /// The sender gave up waiting for a response (ARI: its CA GUID).
    pub const TIMEOUT: Self = Self(4);
    /// The REQ asks for something the receiver does not support.
    pub const UNSUPPORTED: Self = Self(5);
    /// The communication ID is not known.
    pub const INVALID_COMM_ID: Self = Self(6);
    /// The communication instance is not known.
    pub const INVALID_COMM_INSTANCE: Self = Self(7);
    /// No listener for the service ID.
    pub const INVALID_SERVICE_ID: Self = Self(8);
    /// The transport service type is not supported.
    pub const INVALID_TRANSPORT_TYPE: Self = Self(9);
    /// A connection with this QPN and CA GUID exists already (Linux also sends a DREQ).
    pub const STALE_CONN: Self = Self(10);
    /// The RD channel does not exist.
    pub const RDC_NOT_EXIST: Self = Self(11);
    /// The primary GID is unusable (ARI: the GID).
    pub const INVALID_GID: Self = Self(12);
    /// The primary LID is unusable.
    pub const INVALID_LID: Self = Self(13);
    /// The primary SL is unusable.
    pub const INVALID_SL: Self = Self(14);
    /// The primary traffic class is unusable.
    pub const INVALID_TRAFFIC_CLASS: Self = Self(15);
    /// The primary hop limit is unusable.
    pub const INVALID_HOP_LIMIT: Self = Self(16);
    /// The primary packet rate is unusable.
    pub const INVALID_PACKET_RATE: Self = Self(17);
    /// The alternate GID is unusable.
    pub const INVALID_ALT_GID: Self = Self(18);
    /// The alternate LID is unusable.
    pub const INVALID_ALT_LID: Self = Self(19);
    /// The alternate SL is unusable.
    pub const INVALID_ALT_SL: Self = Self(20);
    /// The alternate traffic class is unusable.
    pub const INVALID_ALT_TRAFFIC_CLASS: Self = Self(21);
    /// The alternate hop limit is unusable.
    pub const INVALID_ALT_HOP_LIMIT: Self = Self(22);
    /// The alternate packet rate is unusable.
    pub const INVALID_ALT_PACKET_RATE: Self = Self(23);
    /// Redirect to another CM (ARI: ClassPortInfo).
    pub const PORT_CM_REDIRECT: Self = Self(24);
    /// Redirect to another port.
    pub const PORT_REDIRECT: Self = Self(25);
    /// The path MTU is unusable.
    pub const INVALID_MTU: Self = Self(26);
    /// Not enough responder resources for the requested initiator depth.
    pub const INSUFFICIENT_RESP_RESOURCES: Self = Self(27);
    /// The consumer rejected the connection (`rdma_reject`); the reason is in the private
    /// data.
    pub const CONSUMER_DEFINED: Self = Self(28);
    /// The RNR retry count is unusable.
    pub const INVALID_RNR_RETRY: Self = Self(29);
    /// The local communication ID is a duplicate.
    pub const DUPLICATE_LOCAL_COMM_ID: Self = Self(30);
    /// The class version is not supported.
    pub const INVALID_CLASS_VERSION: Self = Self(31);
    /// The primary flow label is unusable.
    pub const INVALID_FLOW_LABEL: Self = Self(32);
    /// The alternate flow label is unusable.
    pub const INVALID_ALT_FLOW_LABEL: Self = Self(33);
    /// An ECE vendor option is not supported.
    pub const VENDOR_OPTION_NOT_SUPPORTED: Self = Self(35);

    /// The reason's name, if it is a known one.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::NO_QP => "NO_QP",
            Self::NO_EEC => "NO_EEC",
            Self::NO_RESOURCES => "NO_RESOURCES",
            Self::TIMEOUT => "TIMEOUT",
            Self::UNSUPPORTED => "UNSUPPORTED",
            Self::INVALID_COMM_ID => "INVALID_COMM_ID",
            Self::INVALID_COMM_INSTANCE => "INVALID_COMM_INSTANCE",
            Self::INVALID_SERVICE_ID => "INVALID_SERVICE_ID",
            Self::INVALID_TRANSPORT_TYPE => "INVALID_TRANSPORT_TYPE",
            Self::STALE_CONN => "STALE_CONN",
            Self::RDC_NOT_EXIST => "RDC_NOT_EXIST",
            Self::INVALID_GID => "INVALID_GID",
            Self::INVALID_LID => "INVALID_LID",
            Self::INVALID_SL => "INVALID_SL",
            Self::INVALID_TRAFFIC_CLASS => "INVALID_TRAFFIC_CLASS",
            Self::INVALID_HOP_LIMIT => "INVALID_HOP_LIMIT",
            Self::INVALID_PACKET_RATE => "INVALID_PACKET_RATE",
            Self::INVALID_ALT_GID => "INVALID_ALT_GID",
            Self::INVALID_ALT_LID => "INVALID_ALT_LID",
            Self::INVALID_ALT_SL => "INVALID_ALT_SL",
            Self::INVALID_ALT_TRAFFIC_CLASS => "INVALID_ALT_TRAFFIC_CLASS",
            Self::INVALID_ALT_HOP_LIMIT => "INVALID_ALT_HOP_LIMIT",
            Self::INVALID_ALT_PACKET_RATE => "INVALID_ALT_PACKET_RATE",
            Self::PORT_CM_REDIRECT => "PORT_CM_REDIRECT",
            Self::PORT_REDIRECT => "PORT_REDIRECT",
            Self::INVALID_MTU => "INVALID_MTU",
            Self::INSUFFICIENT_RESP_RESOURCES => "INSUFFICIENT_RESP_RESOURCES",
            Self::CONSUMER_DEFINED => "CONSUMER_DEFINED",
            Self::INVALID_RNR_RETRY => "INVALID_RNR_RETRY",
            Self::DUPLICATE_LOCAL_COMM_ID => "DUPLICATE_LOCAL_COMM_ID",
            Self::INVALID_CLASS_VERSION => "INVALID_CLASS_VERSION",
            Self::INVALID_FLOW_LABEL => "INVALID_FLOW_LABEL",
            Self::INVALID_ALT_FLOW_LABEL => "INVALID_ALT_FLOW_LABEL",
            Self::VENDOR_OPTION_NOT_SUPPORTED => "VENDOR_OPTION_NOT_SUPPORTED",
            _ => return None,
        })
    }
}

impl fmt::Display for RejReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "UNKNOWN({})", self.0),
        }
    }
}

/// Which message a REJ rejects or an MRA acknowledges (2 bits; Linux
/// `enum cm_msg_response`). Open: the reserved value 3 is kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct CmMsgResponse(pub u8);

impl CmMsgResponse {
    /// A REQ.
    pub const REQ: Self = Self(0);
    /// A REP.
    pub const REP: Self = Self(1);
    /// Anything else: a LAP for an MRA; for a REJ, the sender's own connection attempt (a
    /// timeout, for instance).
    pub const OTHER: Self = Self(2);
}

impl fmt::Display for CmMsgResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::REQ => f.write_str("REQ"),
            Self::REP => f.write_str("REP"),
            Self::OTHER => f.write_str("OTHER"),
            Self(v) => write!(f, "RESERVED({v})"),
        }
    }
}

/// The transport service type of a REQ (2 bits). Open: every value is kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TransportServiceType(pub u8);

impl TransportServiceType {
    /// Reliable connection.
    pub const RC: Self = Self(0);
    /// Unreliable connection.
    pub const UC: Self = Self(1);
    /// Reliable datagram.
    pub const RD: Self = Self(2);
    /// See the extended transport type (1 = XRC; `cm_msgs.h: cm_req_get_qp_type`).
    pub const EXTENDED: Self = Self(3);
}

impl fmt::Display for TransportServiceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::RC => f.write_str("RC"),
            Self::UC => f.write_str("UC"),
            Self::RD => f.write_str("RD"),
            Self::EXTENDED => f.write_str("EXTENDED"),
            Self(v) => write!(f, "{v:#04x}"),
        }
    }
}

/// The status of a SIDR_REP (IBA Table 121; Linux `enum ib_cm_sidr_status`). Open: unknown
/// values are kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: Self = Self(0);
    /// The service ID is not supported.
    pub const UNSUPPORTED: Self = Self(1);
    /// The service provider rejected the request.
    pub const REJECT: Self = Self(2);
    /// No QP is available.
    pub const NO_QP: Self = Self(3);
    /// Ask again elsewhere (additional information: ClassPortInfo).
    pub const REDIRECT: Self = Self(4);
    /// The class version is not supported.
    pub const UNSUPPORTED_VERSION: Self = Self(5);
}

impl fmt::Display for SidrStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::SUCCESS => f.write_str("SUCCESS"),
            Self::UNSUPPORTED => f.write_str("UNSUPPORTED"),
            Self::REJECT => f.write_str("REJECT"),
            Self::NO_QP => f.write_str("NO_QP"),
            Self::REDIRECT => f.write_str("REDIRECT"),
            Self::UNSUPPORTED_VERSION => f.write_str("UNSUPPORTED_VERSION"),
            Self(v) => write!(f, "UNKNOWN({v})"),
        }
    }
}

/// The 232-byte data area of `data`, or [`Error::Truncated`].
fn area(data: &[u8]) -> Result<&[u8]> {
    data.get(..MAD_DATA_LEN).ok_or(Error::Truncated)
}

/// The 232-byte data area of `out` to write into, after checking that `fixed` (private data
/// or similar) fits in `len` bytes. Nothing is written when this fails.
fn area_mut<'b>(out: &'b mut [u8], fixed: &[(&[u8], usize)]) -> Result<&'b mut [u8]> {
    if fixed.iter().any(|(bytes, len)| bytes.len() > *len) {
        return Err(Error::FieldTooLong);
    }
    out.get_mut(..MAD_DATA_LEN).ok_or(Error::BufferTooSmall)
}

/// Copies `bytes` to `b[at..at + len]` and zero-fills the rest of the field. The caller has
/// checked `bytes.len() <= len` through [`area_mut`].
fn put_padded(b: &mut [u8], at: usize, len: usize, bytes: &[u8]) {
    let dst = &mut b[at..at + len];
    let n = bytes.len().min(len);
    dst[..n].copy_from_slice(&bytes[..n]);
    dst[n..].fill(0);
}

/// One path of a REQ (44 bytes): where packets go and how (IBA 12.6.5, Table 106).
///
/// On RoCE the LIDs are 0xFFFF (hop limit > 1) and the GIDs are IP addresses. An alternate
/// path that is all zero means there is none.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct CmPath {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (the sender's IP as a GID on RoCE).
    pub local_gid: [u8; 16],
    /// Remote port GID (the receiver's IP as a GID on RoCE).
    pub remote_gid: [u8; 16],
    /// Flow label, 20 bits.
    pub flow_label: u32,
    /// Packet rate, 6 bits (IB rate enum; 0 = port current).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level, 4 bits.
    pub sl: u8,
    /// Subnet local (Linux: set iff the hop limit is at most 1).
    pub subnet_local: bool,
    /// Local ACK timeout, 5 bits: 4.096 µs · 2^value.
    pub local_ack_timeout: u8,
}

mod path {
    use super::Field;
    pub(super) const LOCAL_LID: Field = 0..2;
    pub(super) const REMOTE_LID: Field = 2..4;
    pub(super) const LOCAL_GID: Field = 4..20;
    pub(super) const REMOTE_GID: Field = 20..36;
    /// Flow label [31:12], reserved [11:6], packet rate [5:0].
    pub(super) const FLOW_RATE: Field = 36..40;
    pub(super) const TRAFFIC_CLASS: usize = 40;
    pub(super) const HOP_LIMIT: usize = 41;
    /// SL [7:4], subnet local [3], reserved [2:0].
    pub(super) const SL_SUBNET_LOCAL: usize = 42;
    /// Local ACK timeout [7:3]; the rest is reserved, but SAP supported [2] in the
    /// alternate path of a REQ.
    pub(super) const LOCAL_ACK_TIMEOUT: usize = 43;
}

impl CmPath {
    /// Parses a path from its 44 bytes. `b` must hold at least [`CM_PATH_LEN`] bytes.
    fn parse(b: &[u8]) -> Self {
        let flow_rate = field::u32_at(b, path::FLOW_RATE);
        let mut local_gid = [0u8; 16];
        local_gid.copy_from_slice(&b[path::LOCAL_GID]);
        let mut remote_gid = [0u8; 16];
        remote_gid.copy_from_slice(&b[path::REMOTE_GID]);
        Self {
            local_lid: field::u16_at(b, path::LOCAL_LID),
            remote_lid: field::u16_at(b, path::REMOTE_LID),
            local_gid,
            remote_gid,
            flow_label: flow_rate >> 12,
            packet_rate: (flow_rate & 0x3f) as u8,
            traffic_class: b[path::TRAFFIC_CLASS],
            hop_limit: b[path::HOP_LIMIT],
            sl: b[path::SL_SUBNET_LOCAL] >> 4,
            subnet_local: b[path::SL_SUBNET_LOCAL] & 0x08 != 0,
            local_ack_timeout: b[path::LOCAL_ACK_TIMEOUT] >> 3,
        }
    }

    /// Writes the 44 bytes of a path, reserved bits zero, fields masked to their width.
    fn emit(&self, b: &mut [u8]) {
        field::set_u16(b, path::LOCAL_LID, self.local_lid);
        field::set_u16(b, path::REMOTE_LID, self.remote_lid);
        b[path::LOCAL_GID].copy_from_slice(&self.local_gid);
        b[path::REMOTE_GID].copy_from_slice(&self.remote_gid);
        let flow_rate = ((self.flow_label & 0xf_ffff) << 12) | u32::from(self.packet_rate & 0x3f);
        field::set_u32(b, path::FLOW_RATE, flow_rate);
        b[path::TRAFFIC_CLASS] = self.traffic_class;
        b[path::HOP_LIMIT] = self.hop_limit;
        b[path::SL_SUBNET_LOCAL] = ((self.sl & 0x0f) << 4) | (u8::from(self.subnet_local) << 3);
        b[path::LOCAL_ACK_TIMEOUT] = (self.local_ack_timeout & 0x1f) << 3;
    }
}

mod req {
    use super::Field;
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const RESERVED_4: usize = 4;
    pub(super) const VENDOR_ID: Field = 5..8;
    pub(super) const SERVICE_ID: Field = 8..16;
    pub(super) const LOCAL_CA_GUID: Field = 16..24;
    pub(super) const RESERVED_24: Field = 24..28;
    pub(super) const LOCAL_QKEY: Field = 28..32;
    pub(super) const LOCAL_QPN: Field = 32..35;
    pub(super) const RESPONDER_RESOURCES: usize = 35;
    pub(super) const LOCAL_EECN: Field = 36..39;
    pub(super) const INITIATOR_DEPTH: usize = 39;
    pub(super) const REMOTE_EECN: Field = 40..43;
    /// Remote CM response timeout [7:3], transport service type [2:1], end-to-end flow
    /// control [0].
    pub(super) const RCRT_TST_E2E: usize = 43;
    pub(super) const STARTING_PSN: Field = 44..47;
    /// Local CM response timeout [7:3], retry count [2:0].
    pub(super) const LCRT_RETRY: usize = 47;
    pub(super) const PKEY: Field = 48..50;
    /// Path MTU [7:4], RDC exists [3], RNR retry count [2:0].
    pub(super) const MTU_RDC_RNR: usize = 50;
    /// Max CM retries [7:4], SRQ [3], extended transport type [2:0].
    pub(super) const MAXCM_SRQ_XRC: usize = 51;
    pub(super) const PRIMARY_PATH: Field = 52..96;
    pub(super) const ALTERNATE_PATH: Field = 96..140;
    /// The last byte of the alternate path; bit [2] is SAP supported.
    pub(super) const SAP_SUPPORTED: usize = 139;
    pub(super) const PRIVATE_DATA: usize = 140;
}

/// A REQ: the active side asks to connect a QP to a service (IBA 12.6.5, Table 106).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ReqRepr<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID, 24 bits (IBA comment 9434; 0 unless ECE is used).
    pub vendor_id: u32,
    /// The service to connect to; rdma_cm's is `(port space << 16) | port`
    /// ([`crate::cma::service_id`]).
    pub service_id: u64,
    /// The sender's CA (node) GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (RC: unused, Linux sends 0).
    pub local_qkey: QKey,
    /// The sender's QP.
    pub local_qpn: Qpn,
    /// RDMA READ/atomic requests the sender accepts at once (its max_dest_rd_atomic).
    pub responder_resources: u8,
    /// Local EE context number, 24 bits (RD only; 0).
    pub local_eecn: u32,
    /// RDMA READ/atomic requests the sender issues at once (its max_rd_atomic).
    pub initiator_depth: u8,
    /// Remote EE context number, 24 bits (RD only; 0).
    pub remote_eecn: u32,
    /// How long the receiver may take to answer, 5 bits: 4.096 µs · 2^value.
    pub remote_cm_response_timeout: u8,
    /// Transport service type, 2 bits.
    pub transport_service_type: TransportServiceType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The first PSN the sender expects to receive: the passive side's send PSN.
    pub starting_psn: Psn,
    /// How long the sender takes to answer, 5 bits.
    pub local_cm_response_timeout: u8,
    /// Transport retry count for both QPs, 3 bits.
    pub retry_count: u8,
    /// Partition key.
    pub pkey: PKey,
    /// Path packet payload MTU, 4 bits (IB enum: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RD channel exists.
    pub rdc_exists: bool,
    /// RNR retry count the passive QP uses, 3 bits (7 = forever).
    pub rnr_retry_count: u8,
    /// How many times the sender will resend this REQ, 4 bits.
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type, 3 bits (1 = XRC with transport service type 3).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary_path: CmPath,
    /// The alternate path; all zero when there is none.
    pub alternate_path: CmPath,
    /// SAP supported (bit 2 of the alternate path's last byte).
    pub sap_supported: bool,
    /// Private data, [`REQ_PRIVATE_DATA_LEN`] bytes; rdma_cm puts a
    /// [`CmaHeaderRepr`](crate::cma::CmaHeaderRepr) first.
    pub private_data: &'a [u8],
}

impl<'a> ReqRepr<'a> {
    /// Parses a REQ from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        Ok(Self {
            local_comm_id: field::u32_at(b, req::LOCAL_COMM_ID),
            vendor_id: field::u24_at(b, req::VENDOR_ID),
            service_id: field::u64_at(b, req::SERVICE_ID),
            local_ca_guid: field::u64_at(b, req::LOCAL_CA_GUID),
            local_qkey: QKey(field::u32_at(b, req::LOCAL_QKEY)),
            local_qpn: Qpn::from_u24_truncating(field::u24_at(b, req::LOCAL_QPN)),
            responder_resources: b[req::RESPONDER_RESOURCES],
            local_eecn: field::u24_at(b, req::LOCAL_EECN),
            initiator_depth: b[req::INITIATOR_DEPTH],
            remote_eecn: field::u24_at(b, req::REMOTE_EECN),
            remote_cm_response_timeout: b[req::RCRT_TST_E2E] >> 3,
            transport_service_type: TransportServiceType((b[req::RCRT_TST_E2E] >> 1) & 0x3),
            end_to_end_flow_control: b[req::RCRT_TST_E2E] & 0x1 != 0,
            starting_psn: Psn::from_u24_truncating(field::u24_at(b, req::STARTING_PSN)),
            local_cm_response_timeout: b[req::LCRT_RETRY] >> 3,
            retry_count: b[req::LCRT_RETRY] & 0x7,
            pkey: PKey(field::u16_at(b, req::PKEY)),
            path_mtu: b[req::MTU_RDC_RNR] >> 4,
            rdc_exists: b[req::MTU_RDC_RNR] & 0x8 != 0,
            rnr_retry_count: b[req::MTU_RDC_RNR] & 0x7,
            max_cm_retries: b[req::MAXCM_SRQ_XRC] >> 4,
            srq: b[req::MAXCM_SRQ_XRC] & 0x8 != 0,
            extended_transport_type: b[req::MAXCM_SRQ_XRC] & 0x7,
            primary_path: CmPath::parse(&b[req::PRIMARY_PATH]),
            alternate_path: CmPath::parse(&b[req::ALTERNATE_PATH]),
            sap_supported: b[req::SAP_SUPPORTED] & 0x4 != 0,
            private_data: &b[req::PRIVATE_DATA..],
        })
    }

    /// Writes the REQ into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the private data is longer than [`REQ_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b = area_mut(data, &[(self.private_data, REQ_PRIVATE_DATA_LEN)])?;
        field::set_u32(b, req::LOCAL_COMM_ID, self.local_comm_id);
        b[req::RESERVED_4] = 0;
        field::set_u24(b, req::VENDOR_ID, self.vendor_id & 0xff_ffff);
        field::set_u64(b, req::SERVICE_ID, self.service_id);
        field::set_u64(b, req::LOCAL_CA_GUID, self.local_ca_guid);
        field::set_u32(b, req::RESERVED_24, 0);
        field::set_u32(b, req::LOCAL_QKEY, self.local_qkey.0);
        field::set_u24(b, req::LOCAL_QPN, self.local_qpn.value());
        b[req::RESPONDER_RESOURCES] = self.responder_resources;
        field::set_u24(b, req::LOCAL_EECN, self.local_eecn & 0xff_ffff);
        b[req::INITIATOR_DEPTH] = self.initiator_depth;
        field::set_u24(b, req::REMOTE_EECN, self.remote_eecn & 0xff_ffff);
        b[req::RCRT_TST_E2E] = ((self.remote_cm_response_timeout & 0x1f) << 3)
            | ((self.transport_service_type.0 & 0x3) << 1)
            | u8::from(self.end_to_end_flow_control);
        field::set_u24(b, req::STARTING_PSN, self.starting_psn.value());
        b[req::LCRT_RETRY] = ((self.local_cm_response_timeout & 0x1f) << 3) | (self.retry_count & 0x7);
        field::set_u16(b, req::PKEY, self.pkey.0);
        b[req::MTU_RDC_RNR] =
            ((self.path_mtu & 0xf) << 4) | (u8::from(self.rdc_exists) << 3) | (self.rnr_retry_count & 0x7);
        b[req::MAXCM_SRQ_XRC] =
            ((self.max_cm_retries & 0xf) << 4) | (u8::from(self.srq) << 3) | (self.extended_transport_type & 0x7);
        self.primary_path.emit(&mut b[req::PRIMARY_PATH]);
        self.alternate_path.emit(&mut b[req::ALTERNATE_PATH]);
        b[req::SAP_SUPPORTED] |= u8::from(self.sap_supported) << 2;
        put_padded(b, req::PRIVATE_DATA, REQ_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }

    /// The path MTU in bytes, or `None` for a code outside 1..=5.
    pub const fn path_mtu_bytes(&self) -> Option<u32> {
        match self.path_mtu {
            1..=5 => Some(128 << self.path_mtu),
            _ => None,
        }
    }
}

mod rep {
    use super::Field;
    pub(super) const LOCAL_COMM_ID: Field = 0..4;
    pub(super) const REMOTE_COMM_ID: Field = 4..8;
    pub(super) const LOCAL_QKEY: Field = 8..12;
    pub(super) const LOCAL_QPN: Field = 12..15;
    pub(super) const VENDOR_ID_H: usize = 15;
    pub(super) const LOCAL_EECN: Field = 16..19;
    pub(super) const VENDOR_ID_M: usize = 19;
    pub(super) const STARTING_PSN: Field = 20..23;
    pub(super) const VENDOR_ID_L: usize = 23;
    pub(super) const RESPONDER_RESOURCES: usize = 24;
    pub(super) const INITIATOR_DEPTH: usize = 25;
    /// Target ACK delay [7:3], failover accepted [2:1], end-to-end flow control [0].
    pub(super) const TAD_FAILOVER_E2E: usize = 26;
    /// RNR retry count [7:5], SRQ [4], reserved [3:0].
    pub(super) const RNR_SRQ: usize = 27;
    pub(super) const LOCAL_CA_GUID: Field = 28..36;
    pub(super) const PRIVATE_DATA: usize = 36;
}

/// A REP: the passive side accepts a REQ (IBA 12.6.8, Table 110).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RepRepr<'a> {
    /// The replier's communication ID.
    pub local_comm_id: u32,
    /// The REQ's local communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key (RC: unused).
    pub local_qkey: QKey,
    /// The replier's QP.
    pub local_qpn: Qpn,
    /// ECE vendor ID, 24 bits, carried split over bytes 15, 19 and 23.
    pub vendor_id: u32,
    /// Local EE context number, 24 bits (RD only).
    pub local_eecn: u32,
    /// The first PSN the replier expects to receive: the active side's send PSN.
    pub starting_psn: Psn,
    /// RDMA READ/atomic requests the replier accepts at once.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests the replier issues at once.
    pub initiator_depth: u8,
    /// The replier's CA ACK delay, 5 bits (rxe: 15).
    pub target_ack_delay: u8,
    /// Failover accepted, 2 bits (rdma_cm: 0).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count the active QP uses, 3 bits.
    pub rnr_retry_count: u8,
    /// The replier's QP uses an SRQ.
    pub srq: bool,
    /// The replier's CA (node) GUID.
    pub local_ca_guid: u64,
    /// Private data, [`REP_PRIVATE_DATA_LEN`] bytes (no rdma_cm header).
    pub private_data: &'a [u8],
}

impl<'a> RepRepr<'a> {
    /// Parses a REP from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        Ok(Self {
            local_comm_id: field::u32_at(b, rep::LOCAL_COMM_ID),
            remote_comm_id: field::u32_at(b, rep::REMOTE_COMM_ID),
            local_qkey: QKey(field::u32_at(b, rep::LOCAL_QKEY)),
            local_qpn: Qpn::from_u24_truncating(field::u24_at(b, rep::LOCAL_QPN)),
            vendor_id: u32::from_be_bytes([0, b[rep::VENDOR_ID_H], b[rep::VENDOR_ID_M], b[rep::VENDOR_ID_L]]),
            local_eecn: field::u24_at(b, rep::LOCAL_EECN),
            starting_psn: Psn::from_u24_truncating(field::u24_at(b, rep::STARTING_PSN)),
            responder_resources: b[rep::RESPONDER_RESOURCES],
            initiator_depth: b[rep::INITIATOR_DEPTH],
            target_ack_delay: b[rep::TAD_FAILOVER_E2E] >> 3,
            failover_accepted: (b[rep::TAD_FAILOVER_E2E] >> 1) & 0x3,
            end_to_end_flow_control: b[rep::TAD_FAILOVER_E2E] & 0x1 != 0,
            rnr_retry_count: b[rep::RNR_SRQ] >> 5,
            srq: b[rep::RNR_SRQ] & 0x10 != 0,
            local_ca_guid: field::u64_at(b, rep::LOCAL_CA_GUID),
            private_data: &b[rep::PRIVATE_DATA..],
        })
    }

    /// Writes the REP into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the private data is longer than [`REP_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b = area_mut(data, &[(self.private_data, REP_PRIVATE_DATA_LEN)])?;
        let [_, vendor_h, vendor_m, vendor_l] = self.vendor_id.to_be_bytes();
        field::set_u32(b, rep::LOCAL_COMM_ID, self.local_comm_id);
        field::set_u32(b, rep::REMOTE_COMM_ID, self.remote_comm_id);
        field::set_u32(b, rep::LOCAL_QKEY, self.local_qkey.0);
        field::set_u24(b, rep::LOCAL_QPN, self.local_qpn.value());
        b[rep::VENDOR_ID_H] = vendor_h;
        field::set_u24(b, rep::LOCAL_EECN, self.local_eecn & 0xff_ffff);
        b[rep::VENDOR_ID_M] = vendor_m;
        field::set_u24(b, rep::STARTING_PSN, self.starting_psn.value());
        b[rep::VENDOR_ID_L] = vendor_l;
        b[rep::RESPONDER_RESOURCES] = self.responder_resources;
        b[rep::INITIATOR_DEPTH] = self.initiator_depth;
        b[rep::TAD_FAILOVER_E2E] = ((self.target_ack_delay & 0x1f) << 3)
            | ((self.failover_accepted & 0x3) << 1)
            | u8::from(self.end_to_end_flow_control);
        b[rep::RNR_SRQ] = ((self.rnr_retry_count & 0x7) << 5) | (u8::from(self.srq) << 4);
        field::set_u64(b, rep::LOCAL_CA_GUID, self.local_ca_guid);
        put_padded(b, rep::PRIVATE_DATA, REP_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }
}

/// The two communication IDs every connected-mode message but REQ starts with.
const LOCAL_COMM_ID: Field = 0..4;
const REMOTE_COMM_ID: Field = 4..8;

/// An RTU: the active side is ready to use the connection (IBA 12.6.9, Table 111).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RtuRepr<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, [`RTU_PRIVATE_DATA_LEN`] bytes.
    pub private_data: &'a [u8],
}

impl<'a> RtuRepr<'a> {
    const PRIVATE_DATA: usize = 8;

    /// Parses an RTU from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        Ok(Self {
            local_comm_id: field::u32_at(b, LOCAL_COMM_ID),
            remote_comm_id: field::u32_at(b, REMOTE_COMM_ID),
            private_data: &b[Self::PRIVATE_DATA..],
        })
    }

    /// Writes the RTU into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the private data is longer than [`RTU_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b = area_mut(data, &[(self.private_data, RTU_PRIVATE_DATA_LEN)])?;
        field::set_u32(b, LOCAL_COMM_ID, self.local_comm_id);
        field::set_u32(b, REMOTE_COMM_ID, self.remote_comm_id);
        put_padded(b, Self::PRIVATE_DATA, RTU_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }
}

mod rej {
    use super::Field;
    /// Message rejected [7:6], reserved [5:0].
    pub(super) const MESSAGE_REJECTED: usize = 8;
    /// Reject info length [7:1], reserved [0].
    pub(super) const REJECT_INFO_LENGTH: usize = 9;
    pub(super) const REASON: Field = 10..12;
    pub(super) const ARI: usize = 12;
    pub(super) const PRIVATE_DATA: usize = 84;
}

/// A REJ: a connection attempt is refused or abandoned (IBA 12.6.7, Table 108).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RejRepr<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID, 0 if the sender does not know it.
    pub remote_comm_id: u32,
    /// Which message is rejected, 2 bits.
    pub message_rejected: CmMsgResponse,
    /// How many bytes of the ARI are meaningful, 7 bits.
    pub reject_info_length: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional reject information, [`REJ_ARI_LEN`] bytes (see
    /// [`ari`](Self::ari) for the meaningful part).
    pub additional_reject_info: &'a [u8],
    /// Private data, [`REJ_PRIVATE_DATA_LEN`] bytes (rdma_reject's reason, for instance).
    pub private_data: &'a [u8],
}

impl<'a> RejRepr<'a> {
    /// Parses a REJ from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        Ok(Self {
            local_comm_id: field::u32_at(b, LOCAL_COMM_ID),
            remote_comm_id: field::u32_at(b, REMOTE_COMM_ID),
            message_rejected: CmMsgResponse(b[rej::MESSAGE_REJECTED] >> 6),
            reject_info_length: b[rej::REJECT_INFO_LENGTH] >> 1,
            reason: RejReason(field::u16_at(b, rej::REASON)),
            additional_reject_info: &b[rej::ARI..rej::PRIVATE_DATA],
            private_data: &b[rej::PRIVATE_DATA..],
        })
    }

    /// Writes the REJ into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the ARI is longer than [`REJ_ARI_LEN`] or the private data
    /// longer than [`REJ_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b =
            area_mut(data, &[(self.additional_reject_info, REJ_ARI_LEN), (self.private_data, REJ_PRIVATE_DATA_LEN)])?;
        field::set_u32(b, LOCAL_COMM_ID, self.local_comm_id);
        field::set_u32(b, REMOTE_COMM_ID, self.remote_comm_id);
        b[rej::MESSAGE_REJECTED] = (self.message_rejected.0 & 0x3) << 6;
        b[rej::REJECT_INFO_LENGTH] = (self.reject_info_length & 0x7f) << 1;
        field::set_u16(b, rej::REASON, self.reason.0);
        put_padded(b, rej::ARI, REJ_ARI_LEN, self.additional_reject_info);
        put_padded(b, rej::PRIVATE_DATA, REJ_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }

    /// The meaningful part of the ARI: its first `reject_info_length` bytes (at most 72).
    pub fn ari(&self) -> &'a [u8] {
        let n = usize::from(self.reject_info_length).min(self.additional_reject_info.len());
        &self.additional_reject_info[..n]
    }
}

mod mra {
    /// Message MRAed [7:6], reserved [5:0].
    pub(super) const MESSAGE_MRAED: usize = 8;
    /// Service timeout [7:3], reserved [2:0].
    pub(super) const SERVICE_TIMEOUT: usize = 9;
    pub(super) const PRIVATE_DATA: usize = 10;
}

/// An MRA: the sender got a message and needs more time to answer it (IBA 12.6.6,
/// Table 107).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MraRepr<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged, 2 bits ([`CmMsgResponse::OTHER`] = a LAP).
    pub message_mraed: CmMsgResponse,
    /// How much longer to wait, 5 bits: 4.096 µs · 2^value.
    pub service_timeout: u8,
    /// Private data, [`MRA_PRIVATE_DATA_LEN`] bytes.
    pub private_data: &'a [u8],
}

impl<'a> MraRepr<'a> {
    /// Parses an MRA from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        Ok(Self {
            local_comm_id: field::u32_at(b, LOCAL_COMM_ID),
            remote_comm_id: field::u32_at(b, REMOTE_COMM_ID),
            message_mraed: CmMsgResponse(b[mra::MESSAGE_MRAED] >> 6),
            service_timeout: b[mra::SERVICE_TIMEOUT] >> 3,
            private_data: &b[mra::PRIVATE_DATA..],
        })
    }

    /// Writes the MRA into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the private data is longer than [`MRA_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b = area_mut(data, &[(self.private_data, MRA_PRIVATE_DATA_LEN)])?;
        field::set_u32(b, LOCAL_COMM_ID, self.local_comm_id);
        field::set_u32(b, REMOTE_COMM_ID, self.remote_comm_id);
        b[mra::MESSAGE_MRAED] = (self.message_mraed.0 & 0x3) << 6;
        b[mra::SERVICE_TIMEOUT] = (self.service_timeout & 0x1f) << 3;
        put_padded(b, mra::PRIVATE_DATA, MRA_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }
}

/// A DREQ: the sender disconnects (IBA 12.6.10, Table 112).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DreqRepr<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN (or EECN); Linux drops a DREQ whose value is not its local QPN.
    pub remote_qpn: Qpn,
    /// Private data, [`DREQ_PRIVATE_DATA_LEN`] bytes.
    pub private_data: &'a [u8],
}

impl<'a> DreqRepr<'a> {
    const REMOTE_QPN: Field = 8..11;
    const RESERVED: usize = 11;
    const PRIVATE_DATA: usize = 12;

    /// Parses a DREQ from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        Ok(Self {
            local_comm_id: field::u32_at(b, LOCAL_COMM_ID),
            remote_comm_id: field::u32_at(b, REMOTE_COMM_ID),
            remote_qpn: Qpn::from_u24_truncating(field::u24_at(b, Self::REMOTE_QPN)),
            private_data: &b[Self::PRIVATE_DATA..],
        })
    }

    /// Writes the DREQ into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the private data is longer than [`DREQ_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b = area_mut(data, &[(self.private_data, DREQ_PRIVATE_DATA_LEN)])?;
        field::set_u32(b, LOCAL_COMM_ID, self.local_comm_id);
        field::set_u32(b, REMOTE_COMM_ID, self.remote_comm_id);
        field::set_u24(b, Self::REMOTE_QPN, self.remote_qpn.value());
        b[Self::RESERVED] = 0;
        put_padded(b, Self::PRIVATE_DATA, DREQ_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }
}

/// A DREP: the answer to a DREQ (IBA 12.6.11, Table 113).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DrepRepr<'a> {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, [`DREP_PRIVATE_DATA_LEN`] bytes.
    pub private_data: &'a [u8],
}

impl<'a> DrepRepr<'a> {
    const PRIVATE_DATA: usize = 8;

    /// Parses a DREP from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        Ok(Self {
            local_comm_id: field::u32_at(b, LOCAL_COMM_ID),
            remote_comm_id: field::u32_at(b, REMOTE_COMM_ID),
            private_data: &b[Self::PRIVATE_DATA..],
        })
    }

    /// Writes the DREP into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the private data is longer than [`DREP_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b = area_mut(data, &[(self.private_data, DREP_PRIVATE_DATA_LEN)])?;
        field::set_u32(b, LOCAL_COMM_ID, self.local_comm_id);
        field::set_u32(b, REMOTE_COMM_ID, self.remote_comm_id);
        put_padded(b, Self::PRIVATE_DATA, DREP_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }
}

/// A SIDR_REQ: which UD QP and Q_Key serve this service ID? (IBA 12.11.1, Table 119)
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SidrReqRepr<'a> {
    /// The requester's ID, echoed by the SIDR_REP.
    pub request_id: u32,
    /// Partition key.
    pub pkey: PKey,
    /// The service to resolve.
    pub service_id: u64,
    /// Private data, [`SIDR_REQ_PRIVATE_DATA_LEN`] bytes; rdma_cm puts a
    /// [`CmaHeaderRepr`](crate::cma::CmaHeaderRepr) first.
    pub private_data: &'a [u8],
}

impl<'a> SidrReqRepr<'a> {
    const REQUEST_ID: Field = 0..4;
    const PKEY: Field = 4..6;
    const RESERVED: Field = 6..8;
    const SERVICE_ID: Field = 8..16;
    const PRIVATE_DATA: usize = 16;

    /// Parses a SIDR_REQ from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        Ok(Self {
            request_id: field::u32_at(b, Self::REQUEST_ID),
            pkey: PKey(field::u16_at(b, Self::PKEY)),
            service_id: field::u64_at(b, Self::SERVICE_ID),
            private_data: &b[Self::PRIVATE_DATA..],
        })
    }

    /// Writes the SIDR_REQ into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the private data is longer than
    /// [`SIDR_REQ_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b = area_mut(data, &[(self.private_data, SIDR_REQ_PRIVATE_DATA_LEN)])?;
        field::set_u32(b, Self::REQUEST_ID, self.request_id);
        field::set_u16(b, Self::PKEY, self.pkey.0);
        field::set_u16(b, Self::RESERVED, 0);
        field::set_u64(b, Self::SERVICE_ID, self.service_id);
        put_padded(b, Self::PRIVATE_DATA, SIDR_REQ_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }
}

mod sidr_rep {
    use super::Field;
    pub(super) const REQUEST_ID: Field = 0..4;
    pub(super) const STATUS: usize = 4;
    pub(super) const ADDITIONAL_INFO_LENGTH: usize = 5;
    /// Vendor ID [23:8] (`CM_SIDR_REP_VENDOR_ID_H`, a 16-bit field).
    pub(super) const VENDOR_ID_H: Field = 6..8;
    pub(super) const QPN: Field = 8..11;
    /// Vendor ID [7:0] (`CM_SIDR_REP_VENDOR_ID_L`).
    pub(super) const VENDOR_ID_L: usize = 11;
    pub(super) const SERVICE_ID: Field = 12..20;
    pub(super) const QKEY: Field = 20..24;
    pub(super) const ADDITIONAL_INFO: usize = 24;
    pub(super) const PRIVATE_DATA: usize = 96;
}

/// A SIDR_REP: the answer to a SIDR_REQ (IBA 12.11.2, Table 120).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SidrRepRepr<'a> {
    /// The SIDR_REQ's request ID.
    pub request_id: u32,
    /// Outcome.
    pub status: SidrStatus,
    /// How many bytes of the additional information are meaningful.
    pub additional_info_length: u8,
    /// ECE vendor ID, 24 bits: bytes 6–7 hold bits 23:8 and byte 11 bits 7:0. (Linux writes
    /// only bits 15:0, into bytes 7 and 11.)
    pub vendor_id: u32,
    /// The UD QP that serves the service.
    pub qpn: Qpn,
    /// The service ID.
    pub service_id: u64,
    /// The Q_Key to send with (rdma_cm UDP: [`QKey::RDMA_CM_UDP`]).
    pub qkey: QKey,
    /// Additional information, [`SIDR_REP_INFO_LEN`] bytes (ClassPortInfo for a redirect).
    pub additional_info: &'a [u8],
    /// Private data, [`SIDR_REP_PRIVATE_DATA_LEN`] bytes.
    pub private_data: &'a [u8],
}

impl<'a> SidrRepRepr<'a> {
    /// Parses a SIDR_REP from a MAD data area of at least [`MAD_DATA_LEN`] bytes.
    pub fn parse(data: &'a [u8]) -> Result<Self> {
        let b = area(data)?;
        let vendor_h = field::u16_at(b, sidr_rep::VENDOR_ID_H);
        Ok(Self {
            request_id: field::u32_at(b, sidr_rep::REQUEST_ID),
            status: SidrStatus(b[sidr_rep::STATUS]),
            additional_info_length: b[sidr_rep::ADDITIONAL_INFO_LENGTH],
            vendor_id: (u32::from(vendor_h) << 8) | u32::from(b[sidr_rep::VENDOR_ID_L]),
            qpn: Qpn::from_u24_truncating(field::u24_at(b, sidr_rep::QPN)),
            service_id: field::u64_at(b, sidr_rep::SERVICE_ID),
            qkey: QKey(field::u32_at(b, sidr_rep::QKEY)),
            additional_info: &b[sidr_rep::ADDITIONAL_INFO..sidr_rep::PRIVATE_DATA],
            private_data: &b[sidr_rep::PRIVATE_DATA..],
        })
    }

    /// Writes the SIDR_REP into the first [`MAD_DATA_LEN`] bytes of `data`.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if the additional information is longer than
    /// [`SIDR_REP_INFO_LEN`] or the private data longer than [`SIDR_REP_PRIVATE_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let b = area_mut(
            data,
            &[(self.additional_info, SIDR_REP_INFO_LEN), (self.private_data, SIDR_REP_PRIVATE_DATA_LEN)],
        )?;
        field::set_u32(b, sidr_rep::REQUEST_ID, self.request_id);
        b[sidr_rep::STATUS] = self.status.0;
        b[sidr_rep::ADDITIONAL_INFO_LENGTH] = self.additional_info_length;
        field::set_u16(b, sidr_rep::VENDOR_ID_H, ((self.vendor_id >> 8) & 0xffff) as u16);
        field::set_u24(b, sidr_rep::QPN, self.qpn.value());
        b[sidr_rep::VENDOR_ID_L] = (self.vendor_id & 0xff) as u8;
        field::set_u64(b, sidr_rep::SERVICE_ID, self.service_id);
        field::set_u32(b, sidr_rep::QKEY, self.qkey.0);
        put_padded(b, sidr_rep::ADDITIONAL_INFO, SIDR_REP_INFO_LEN, self.additional_info);
        put_padded(b, sidr_rep::PRIVATE_DATA, SIDR_REP_PRIVATE_DATA_LEN, self.private_data);
        Ok(())
    }

    /// The meaningful part of the additional information (at most 72 bytes).
    pub fn info(&self) -> &'a [u8] {
        let n = usize::from(self.additional_info_length).min(self.additional_info.len());
        &self.additional_info[..n]
    }
}

/// A CM message: the data area of a MAD of class [`MgmtClass::CM`], by attribute.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CmMessage<'a> {
    /// Connection request.
    Req(ReqRepr<'a>),
    /// Message receipt acknowledgement.
    Mra(MraRepr<'a>),
    /// Reject.
    Rej(RejRepr<'a>),
    /// Reply.
    Rep(RepRepr<'a>),
    /// Ready to use.
    Rtu(RtuRepr<'a>),
    /// Disconnect request.
    Dreq(DreqRepr<'a>),
    /// Disconnect reply.
    Drep(DrepRepr<'a>),
    /// Service ID resolution request.
    SidrReq(SidrReqRepr<'a>),
    /// Service ID resolution reply.
    SidrRep(SidrRepRepr<'a>),
    /// Any other attribute (LAP, APR, ClassPortInfo, unknown ones), kept verbatim. Its
    /// attribute ID should not be one of the nine above: those parse as their own variant.
    Other {
        /// The attribute ID.
        attribute_id: AttributeId,
        /// The data area, [`MAD_DATA_LEN`] bytes.
        data: &'a [u8],
    },
}

impl<'a> CmMessage<'a> {
    /// Parses the data area of a CM MAD. Fails with [`Error::NotCm`] unless the class is
    /// [`MgmtClass::CM`]; the class version and method are not checked (Linux sends version 2
    /// and SEND), so a decoder sees whatever arrived.
    pub fn parse(mad: &MadRepr<'a>) -> Result<Self> {
        if mad.header.mgmt_class != MgmtClass::CM {
            return Err(Error::NotCm);
        }
        if mad.data.len() != MAD_DATA_LEN {
            return Err(Error::BadMadLength);
        }
        Self::parse_data(mad.header.attribute_id, mad.data)
    }

    /// Parses a CM data area of at least [`MAD_DATA_LEN`] bytes as the message
    /// `attribute_id` names.
    pub fn parse_data(attribute_id: AttributeId, data: &'a [u8]) -> Result<Self> {
        Ok(match attribute_id {
            AttributeId::REQ => Self::Req(ReqRepr::parse(data)?),
            AttributeId::MRA => Self::Mra(MraRepr::parse(data)?),
            AttributeId::REJ => Self::Rej(RejRepr::parse(data)?),
            AttributeId::REP => Self::Rep(RepRepr::parse(data)?),
            AttributeId::RTU => Self::Rtu(RtuRepr::parse(data)?),
            AttributeId::DREQ => Self::Dreq(DreqRepr::parse(data)?),
            AttributeId::DREP => Self::Drep(DrepRepr::parse(data)?),
            AttributeId::SIDR_REQ => Self::SidrReq(SidrReqRepr::parse(data)?),
            AttributeId::SIDR_REP => Self::SidrRep(SidrRepRepr::parse(data)?),
            _ => Self::Other { attribute_id, data: area(data)? },
        })
    }

    /// Writes the message into the first [`MAD_DATA_LEN`] bytes of `data` (the MAD's data
    /// area; see [`MadPacket::data_mut`](crate::mad::MadPacket::data_mut)). An `Other`
    /// message shorter than the area is zero-padded.
    ///
    /// Fails with [`Error::BufferTooSmall`] if `data` is shorter, and with
    /// [`Error::FieldTooLong`] if a variable part is longer than its field.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        match self {
            Self::Req(r) => r.emit(data),
            Self::Mra(r) => r.emit(data),
            Self::Rej(r) => r.emit(data),
            Self::Rep(r) => r.emit(data),
            Self::Rtu(r) => r.emit(data),
            Self::Dreq(r) => r.emit(data),
            Self::Drep(r) => r.emit(data),
            Self::SidrReq(r) => r.emit(data),
            Self::SidrRep(r) => r.emit(data),
            Self::Other { data: bytes, .. } => {
                let b = area_mut(data, &[(*bytes, MAD_DATA_LEN)])?;
                put_padded(b, 0, MAD_DATA_LEN, bytes);
                Ok(())
            }
        }
    }

    /// The attribute ID that carries this message.
    pub const fn attribute_id(&self) -> AttributeId {
        match self {
            Self::Req(_) => AttributeId::REQ,
            Self::Mra(_) => AttributeId::MRA,
            Self::Rej(_) => AttributeId::REJ,
            Self::Rep(_) => AttributeId::REP,
            Self::Rtu(_) => AttributeId::RTU,
            Self::Dreq(_) => AttributeId::DREQ,
            Self::Drep(_) => AttributeId::DREP,
            Self::SidrReq(_) => AttributeId::SIDR_REQ,
            Self::SidrRep(_) => AttributeId::SIDR_REP,
            Self::Other { attribute_id, .. } => *attribute_id,
        }
    }

    /// The MAD header Linux puts on this message (`cm.c: cm_format_mad_hdr`): class CM
    /// version 2, method SEND, this message's attribute, attribute modifier 0.
    pub const fn mad_header(&self, transaction_id: u64) -> MadHeader {
        MadHeader::cm(self.attribute_id(), transaction_id)
    }

    /// A short name: "REQ", "REP", …, "LAP", "APR", "CLASS_PORT_INFO", or "OTHER".
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Req(_) => "REQ",
            Self::Mra(_) => "MRA",
            Self::Rej(_) => "REJ",
            Self::Rep(_) => "REP",
            Self::Rtu(_) => "RTU",
            Self::Dreq(_) => "DREQ",
            Self::Drep(_) => "DREP",
            Self::SidrReq(_) => "SIDR_REQ",
            Self::SidrRep(_) => "SIDR_REP",
            Self::Other { attribute_id, .. } => match attribute_id.name(MgmtClass::CM) {
                Some(name) => name,
                None => "OTHER",
            },
        }
    }

    /// The sender's communication ID; for a SIDR_REQ its request ID. `None` for a SIDR_REP
    /// (whose request ID is the requester's: see [`remote_comm_id`](Self::remote_comm_id))
    /// and for attributes other than LAP and APR.
    pub fn local_comm_id(&self) -> Option<u32> {
        match self {
            Self::Req(r) => Some(r.local_comm_id),
            Self::Mra(r) => Some(r.local_comm_id),
            Self::Rej(r) => Some(r.local_comm_id),
            Self::Rep(r) => Some(r.local_comm_id),
            Self::Rtu(r) => Some(r.local_comm_id),
            Self::Dreq(r) => Some(r.local_comm_id),
            Self::Drep(r) => Some(r.local_comm_id),
            Self::SidrReq(r) => Some(r.request_id),
            Self::SidrRep(_) => None,
            Self::Other { attribute_id, data } => Self::lap_apr_id(*attribute_id, data, LOCAL_COMM_ID),
        }
    }

    /// The receiver's communication ID; for a SIDR_REP the request ID it answers. `None` for
    /// a REQ and a SIDR_REQ, which do not know it yet, and for attributes other than LAP and
    /// APR. A REJ carries 0 when the sender does not know it.
    pub fn remote_comm_id(&self) -> Option<u32> {
        match self {
            Self::Req(_) | Self::SidrReq(_) => None,
            Self::Mra(r) => Some(r.remote_comm_id),
            Self::Rej(r) => Some(r.remote_comm_id),
            Self::Rep(r) => Some(r.remote_comm_id),
            Self::Rtu(r) => Some(r.remote_comm_id),
            Self::Dreq(r) => Some(r.remote_comm_id),
            Self::Drep(r) => Some(r.remote_comm_id),
            Self::SidrRep(r) => Some(r.request_id),
            Self::Other { attribute_id, data } => Self::lap_apr_id(*attribute_id, data, REMOTE_COMM_ID),
        }
    }

    /// LAP and APR start with the two communication IDs too (Tables 115 and 116).
    fn lap_apr_id(attribute_id: AttributeId, data: &[u8], at: Field) -> Option<u32> {
        if attribute_id != AttributeId::LAP && attribute_id != AttributeId::APR {
            return None;
        }
        data.get(at).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::mad::{MAD_LEN, MadPacket, Method};

    /// The REQ of reference §7.9 (rping from 192.168.1.10, rdma_cm port 40000, to
    /// 192.168.1.20 port 7174), as the 256-byte MAD.
    fn reference_req_mad() -> [u8; MAD_LEN] {
        #[rustfmt::skip]
        let head: [u8; 0xd0] = [
            0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x5a, 0x5a, 0x00, 0x01,
            0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x5a, 0x5a, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x01, 0x06, 0x1c, 0x06, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x11, 0x01, 0x00, 0x00, 0x00, 0x01,
            0x00, 0x00, 0x00, 0xa0, 0x0a, 0xbc, 0xde, 0xa7, 0xff, 0xff, 0x37, 0xf0, 0xff, 0xff, 0xff, 0xff,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xc0, 0xa8, 0x01, 0x0a,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xc0, 0xa8, 0x01, 0x14,
            0x30, 0x7c, 0x60, 0x00, 0x00, 0x40, 0x00, 0x98, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x9c, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0xc0, 0xa8, 0x01, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0xc0, 0xa8, 0x01, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        let mut mad = [0u8; MAD_LEN];
        mad[..head.len()].copy_from_slice(&head);
        mad
    }

    fn ipv4_gid(a: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&a);
        g
    }

    #[test]
    fn golden_reference_req() {
        let bytes = reference_req_mad();
        let mad = MadRepr::parse(&MadPacket::new_unchecked(&bytes[..])).unwrap();
        assert_eq!(mad.header, MadHeader::cm(AttributeId::REQ, 0x0000_0001_5a5a_0001));
        let msg = CmMessage::parse(&mad).unwrap();
        let CmMessage::Req(req) = msg else { panic!("not a REQ: {msg:?}") };
        let primary = CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: ipv4_gid([192, 168, 1, 10]),
            remote_gid: ipv4_gid([192, 168, 1, 20]),
            flow_label: 0x307c6,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 19,
        };
        let expected = ReqRepr {
            local_comm_id: 0x5a5a_0001,
            vendor_id: 0,
            service_id: 0x0000_0000_0106_1c06,
            local_ca_guid: 0x5054_00ff_fe12_3456,
            local_qkey: QKey(0),
            local_qpn: Qpn::new(0x11).unwrap(),
            responder_resources: 1,
            local_eecn: 0,
            initiator_depth: 1,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: TransportServiceType::RC,
            end_to_end_flow_control: false,
            starting_psn: Psn::new(0x0abcde).unwrap(),
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: PKey::DEFAULT,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary_path: primary,
            alternate_path: CmPath::default(),
            sap_supported: false,
            private_data: &bytes[164..256],
        };
        assert_eq!(req, expected);
        assert_eq!(req.private_data.len(), REQ_PRIVATE_DATA_LEN);
        assert_eq!(req.private_data[..4], [0x00, 0x40, 0x9c, 0x40]);
        assert_eq!(req.path_mtu_bytes(), Some(1024));
        assert_eq!(msg.name(), "REQ");
        assert_eq!(msg.local_comm_id(), Some(0x5a5a_0001));
        assert_eq!(msg.remote_comm_id(), None);

        let mut out = [0xa5u8; MAD_LEN];
        let mut packet = MadPacket::new_unchecked(&mut out[..]);
        msg.mad_header(0x0000_0001_5a5a_0001).emit(&mut packet);
        msg.emit(packet.data_mut()).unwrap();
        assert_eq!(out, bytes);
    }

    /// The REJ the active side sent after its REQ timed out, from
    /// `guest-to-host-rping-cm-req.pcap` frame 5 (data area).
    fn captured_timeout_rej() -> [u8; MAD_DATA_LEN] {
        let mut d = [0u8; MAD_DATA_LEN];
        d[..20].copy_from_slice(&[
            0x8c, 0xdc, 0xbc, 0x2d, 0, 0, 0, 0, 0x80, 0x10, 0x00, 0x04, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x18, 0x00, 0x01,
        ]);
        d
    }

    #[test]
    fn golden_captured_rej() {
        let d = captured_timeout_rej();
        let CmMessage::Rej(rej) = CmMessage::parse_data(AttributeId::REJ, &d).unwrap() else { panic!() };
        assert_eq!(rej.local_comm_id, 0x8cdc_bc2d);
        assert_eq!(rej.remote_comm_id, 0);
        assert_eq!(rej.message_rejected, CmMsgResponse::OTHER);
        assert_eq!(rej.reject_info_length, 8);
        assert_eq!(rej.reason, RejReason::TIMEOUT);
        assert_eq!(rej.reason.to_string(), "TIMEOUT");
        assert_eq!(rej.ari(), &[0x50, 0x54, 0x00, 0xff, 0xfe, 0x18, 0x00, 0x01]);
        assert_eq!(rej.additional_reject_info.len(), REJ_ARI_LEN);
        assert_eq!(rej.private_data.len(), REJ_PRIVATE_DATA_LEN);
        let mut out = [0xa5u8; MAD_DATA_LEN];
        rej.emit(&mut out).unwrap();
        assert_eq!(out, d);
    }

    #[test]
    fn unknown_reason_round_trips() {
        let mut d = captured_timeout_rej();
        d[10] = 0xbe;
        d[11] = 0xef;
        let msg = CmMessage::parse_data(AttributeId::REJ, &d).unwrap();
        let CmMessage::Rej(rej) = msg else { panic!() };
        assert_eq!(rej.reason, RejReason(0xbeef));
        assert_eq!(rej.reason.to_string(), "UNKNOWN(48879)");
        let mut out = [0xa5u8; MAD_DATA_LEN];
        msg.emit(&mut out).unwrap();
        assert_eq!(out, d);
    }

    #[test]
    fn unknown_attribute_round_trips() {
        let mut bytes = [0x5cu8; MAD_LEN];
        bytes[..24].copy_from_slice(&[
            0x01, 0x07, 0x02, 0x03, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x42, 0, 0, 0, 0, 0, 0,
        ]);
        let mad = MadRepr::parse(&MadPacket::new_unchecked(&bytes[..])).unwrap();
        let msg = CmMessage::parse(&mad).unwrap();
        assert_eq!(msg, CmMessage::Other { attribute_id: AttributeId(0x42), data: &bytes[24..] });
        assert_eq!(msg.name(), "OTHER");
        assert_eq!(msg.local_comm_id(), None);
        assert_eq!(msg.remote_comm_id(), None);
        let mut out = [0xa5u8; MAD_LEN];
        let mut packet = MadPacket::new_unchecked(&mut out[..]);
        mad.header.emit(&mut packet);
        msg.emit(packet.data_mut()).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn lap_and_apr_keep_their_comm_ids() {
        let mut d = [0u8; MAD_DATA_LEN];
        d[..8].copy_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2]);
        let lap = CmMessage::parse_data(AttributeId::LAP, &d).unwrap();
        assert_eq!((lap.name(), lap.local_comm_id(), lap.remote_comm_id()), ("LAP", Some(1), Some(2)));
        let apr = CmMessage::parse_data(AttributeId::APR, &d).unwrap();
        assert_eq!((apr.name(), apr.attribute_id()), ("APR", AttributeId::APR));
        let cpi = CmMessage::parse_data(AttributeId::CLASS_PORT_INFO, &d).unwrap();
        assert_eq!((cpi.name(), cpi.local_comm_id()), ("CLASS_PORT_INFO", None));
    }

    #[test]
    fn not_cm() {
        let mut bytes = reference_req_mad();
        bytes[1] = MgmtClass::PERF.0;
        let mad = MadRepr::parse(&MadPacket::new_unchecked(&bytes[..])).unwrap();
        assert_eq!(CmMessage::parse(&mad), Err(Error::NotCm));
        let short = MadRepr { header: MadHeader::cm(AttributeId::REQ, 0), data: &bytes[..100] };
        assert_eq!(CmMessage::parse(&short), Err(Error::BadMadLength));
    }

    #[test]
    fn truncated_data_is_an_error() {
        let d = [0u8; MAD_DATA_LEN];
        for attr in 0x10..=0x1b {
            for len in [0, 1, 8, 139, MAD_DATA_LEN - 1] {
                assert_eq!(CmMessage::parse_data(AttributeId(attr), &d[..len]), Err(Error::Truncated), "{attr} {len}");
            }
        }
    }

    #[test]
    fn emit_checks_sizes() {
        let d = [0u8; MAD_DATA_LEN];
        let rtu = RtuRepr { local_comm_id: 1, remote_comm_id: 2, private_data: &d[..RTU_PRIVATE_DATA_LEN + 1] };
        let mut out = [0xa5u8; MAD_DATA_LEN];
        assert_eq!(rtu.emit(&mut out), Err(Error::FieldTooLong));
        assert!(out.iter().all(|&b| b == 0xa5), "nothing written on error");
        let rtu = RtuRepr { private_data: &d[..4], ..rtu };
        assert_eq!(rtu.emit(&mut out[..MAD_DATA_LEN - 1]), Err(Error::BufferTooSmall));
        let rej = RejRepr {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: CmMsgResponse::REQ,
            reject_info_length: 0,
            reason: RejReason::CONSUMER_DEFINED,
            additional_reject_info: &d[..REJ_ARI_LEN + 1],
            private_data: &[],
        };
        assert_eq!(rej.emit(&mut out), Err(Error::FieldTooLong));
        let other = CmMessage::Other { attribute_id: AttributeId::LAP, data: &[0u8; MAD_DATA_LEN + 1] };
        assert_eq!(other.emit(&mut out), Err(Error::FieldTooLong));
    }

    #[test]
    fn short_private_data_is_zero_padded() {
        let rtu = RtuRepr { local_comm_id: 1, remote_comm_id: 2, private_data: b"hi" };
        let mut out = [0xa5u8; MAD_DATA_LEN];
        rtu.emit(&mut out).unwrap();
        assert_eq!(out[..10], [0, 0, 0, 1, 0, 0, 0, 2, b'h', b'i']);
        assert!(out[10..].iter().all(|&b| b == 0));
        let parsed = RtuRepr::parse(&out).unwrap();
        assert_eq!(parsed.private_data.len(), RTU_PRIVATE_DATA_LEN);
    }

    #[test]
    fn narrow_fields_are_masked_and_reserved_bits_zero() {
        let bytes = reference_req_mad();
        let CmMessage::Req(mut req) = CmMessage::parse_data(AttributeId::REQ, &bytes[24..]).unwrap() else { panic!() };
        req.vendor_id = 0xffff_ffff;
        req.local_eecn = 0xffff_ffff;
        req.remote_eecn = 0xffff_ffff;
        req.remote_cm_response_timeout = 0xff;
        req.transport_service_type = TransportServiceType(0xff);
        req.local_cm_response_timeout = 0xff;
        req.retry_count = 0xff;
        req.path_mtu = 0xff;
        req.rnr_retry_count = 0xff;
        req.max_cm_retries = 0xff;
        req.extended_transport_type = 0xff;
        req.primary_path.flow_label = 0xffff_ffff;
        req.primary_path.packet_rate = 0xff;
        req.primary_path.sl = 0xff;
        req.primary_path.local_ack_timeout = 0xff;
        req.alternate_path.local_ack_timeout = 0xff;
        req.sap_supported = true;
        let mut out = [0xa5u8; MAD_DATA_LEN];
        req.emit(&mut out).unwrap();
        assert_eq!(out[4], 0, "reserved byte 4");
        assert_eq!(out[5..8], [0xff; 3]);
        assert_eq!(out[24..28], [0; 4], "reserved 24..28");
        assert_eq!(out[36..39], [0xff; 3]);
        assert_eq!(out[43], 0xfe, "timeout, type, end-to-end flow control off");
        assert_eq!(out[47], 0xff);
        assert_eq!(out[50], 0xf7);
        assert_eq!(out[51], 0xf7);
        assert_eq!(out[88..92], [0xff, 0xff, 0xf0, 0x3f], "flow label, reserved [11:6], rate");
        assert_eq!(out[94], 0xf0, "SL, subnet local 0, reserved");
        assert_eq!(out[95], 0xf8, "local ACK timeout, reserved");
        assert_eq!(out[139], 0xfc, "alternate local ACK timeout, SAP supported");
        let back = ReqRepr::parse(&out).unwrap();
        assert_eq!(back.remote_cm_response_timeout, 0x1f);
        assert_eq!(back.transport_service_type, TransportServiceType::EXTENDED);
        assert_eq!(back.primary_path.flow_label, 0xf_ffff);
        assert!(back.sap_supported);

        let rep = RepRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            local_qkey: QKey(0),
            local_qpn: Qpn::MAX,
            vendor_id: 0xffff_ffff,
            local_eecn: 0xffff_ffff,
            starting_psn: Psn::MAX,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0xff,
            failover_accepted: 0xff,
            end_to_end_flow_control: true,
            rnr_retry_count: 0xff,
            srq: true,
            local_ca_guid: 0,
            private_data: &[],
        };
        rep.emit(&mut out).unwrap();
        assert_eq!(out[12..24], [0xff; 12]);
        assert_eq!(out[26..28], [0xff, 0xf0], "RNR retry, SRQ, reserved [3:0]");

        let mra = MraRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_mraed: CmMsgResponse(0xff),
            service_timeout: 0xff,
            private_data: &[],
        };
        mra.emit(&mut out).unwrap();
        assert_eq!(out[8..10], [0xc0, 0xf8]);
        let rej = RejRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: CmMsgResponse(0xff),
            reject_info_length: 0xff,
            reason: RejReason(0),
            additional_reject_info: &[],
            private_data: &[],
        };
        rej.emit(&mut out).unwrap();
        assert_eq!(out[8..10], [0xc0, 0xfe]);
        let dreq = DreqRepr { local_comm_id: 0, remote_comm_id: 0, remote_qpn: Qpn::MAX, private_data: &[] };
        dreq.emit(&mut out).unwrap();
        assert_eq!(out[8..12], [0xff, 0xff, 0xff, 0]);
        let sidr_req = SidrReqRepr { request_id: 0, pkey: PKey(0xffff), service_id: 0, private_data: &[] };
        sidr_req.emit(&mut out).unwrap();
        assert_eq!(out[4..8], [0xff, 0xff, 0, 0]);
    }

    #[test]
    fn sidr_rep_vendor_id_layout() {
        let rep = SidrRepRepr {
            request_id: 0x1234_5678,
            status: SidrStatus::SUCCESS,
            additional_info_length: 0,
            vendor_id: 0x00ab_cdef,
            qpn: Qpn::new(0x42).unwrap(),
            service_id: 0x0000_0000_0111_1c06,
            qkey: QKey::RDMA_CM_UDP,
            additional_info: &[],
            private_data: &[],
        };
        let mut out = [0xa5u8; MAD_DATA_LEN];
        rep.emit(&mut out).unwrap();
        assert_eq!(
            out[..24],
            [
                0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0xab, 0xcd, 0x00, 0x00, 0x42, 0xef, 0, 0, 0, 0, 0x01, 0x11, 0x1c,
                0x06, 0x01, 0x23, 0x45, 0x67
            ]
        );
        let back = SidrRepRepr::parse(&out).unwrap();
        assert_eq!(back.vendor_id, 0x00ab_cdef);
        assert_eq!(back.info(), &[] as &[u8]);
        assert_eq!(back.status.to_string(), "SUCCESS");
        assert_eq!(SidrStatus(9).to_string(), "UNKNOWN(9)");
        let msg = CmMessage::SidrRep(back);
        assert_eq!((msg.local_comm_id(), msg.remote_comm_id()), (None, Some(0x1234_5678)));
    }

    #[test]
    fn displays() {
        assert_eq!(CmMsgResponse::REP.to_string(), "REP");
        assert_eq!(CmMsgResponse(3).to_string(), "RESERVED(3)");
        assert_eq!(TransportServiceType::UC.to_string(), "UC");
        assert_eq!(RejReason::VENDOR_OPTION_NOT_SUPPORTED.to_string(), "VENDOR_OPTION_NOT_SUPPORTED");
        assert_eq!(RejReason(34).name(), None);
        let header = CmMessage::Rtu(RtuRepr { local_comm_id: 0, remote_comm_id: 0, private_data: &[] }).mad_header(9);
        assert_eq!((header.method, header.class_version, header.transaction_id), (Method::SEND, 2, 9));
    }

    // Property tests: for every message, parse(emit(r)) == r over the whole value space,
    // with emit writing every byte of a 0xa5-filled buffer.

    fn bytes(n: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), n)
    }

    prop_compose! {
        fn path()(
            lids in any::<(u16, u16)>(),
            gids in any::<([u8; 16], [u8; 16])>(),
            flow_label in 0u32..1 << 20,
            packet_rate in 0u8..64,
            tc_hop in any::<(u8, u8)>(),
            sl in 0u8..16,
            subnet_local in any::<bool>(),
            local_ack_timeout in 0u8..32,
        ) -> CmPath {
            CmPath {
                local_lid: lids.0,
                remote_lid: lids.1,
                local_gid: gids.0,
                remote_gid: gids.1,
                flow_label,
                packet_rate,
                traffic_class: tc_hop.0,
                hop_limit: tc_hop.1,
                sl,
                subnet_local,
                local_ack_timeout,
            }
        }
    }

    fn qpn() -> impl Strategy<Value = Qpn> {
        (0u32..1 << 24).prop_map(Qpn::from_u24_truncating)
    }

    fn psn() -> impl Strategy<Value = Psn> {
        (0u32..1 << 24).prop_map(Psn::from_u24_truncating)
    }

    /// Emits `msg` into a 0xa5-filled data area, checks nothing was left unwritten where the
    /// message has zero bits, and parses it back.
    fn round_trip(msg: &CmMessage<'_>) -> std::result::Result<(), TestCaseError> {
        let mut out = [0xa5u8; MAD_DATA_LEN];
        msg.emit(&mut out).unwrap();
        let back = CmMessage::parse_data(msg.attribute_id(), &out).unwrap();
        prop_assert_eq!(&back, msg);
        let mut zeroed = [0u8; MAD_DATA_LEN];
        msg.emit(&mut zeroed).unwrap();
        prop_assert_eq!(out, zeroed, "emit left bytes unwritten");
        Ok(())
    }

    proptest! {
        #[test]
        fn req_round_trips(
            ids in any::<(u32, u64, u64, u32)>(),
            vendor_id in 0u32..1 << 24,
            local_qpn in qpn(),
            eecns in (0u32..1 << 24, 0u32..1 << 24),
            rr_id in any::<(u8, u8)>(),
            timeouts in (0u8..32, 0u8..32),
            tst in 0u8..4,
            flags in any::<(bool, bool, bool, bool)>(),
            starting_psn in psn(),
            counts in (0u8..8, 0u8..8, 0u8..16, 0u8..16, 0u8..8),
            pkey in any::<u16>(),
            paths in (path(), path()),
            private_data in bytes(REQ_PRIVATE_DATA_LEN),
        ) {
            let req = ReqRepr {
                local_comm_id: ids.0,
                vendor_id,
                service_id: ids.1,
                local_ca_guid: ids.2,
                local_qkey: QKey(ids.3),
                local_qpn,
                responder_resources: rr_id.0,
                local_eecn: eecns.0,
                initiator_depth: rr_id.1,
                remote_eecn: eecns.1,
                remote_cm_response_timeout: timeouts.0,
                transport_service_type: TransportServiceType(tst),
                end_to_end_flow_control: flags.0,
                starting_psn,
                local_cm_response_timeout: timeouts.1,
                retry_count: counts.0,
                pkey: PKey(pkey),
                path_mtu: counts.2,
                rdc_exists: flags.1,
                rnr_retry_count: counts.1,
                max_cm_retries: counts.3,
                srq: flags.2,
                extended_transport_type: counts.4,
                primary_path: paths.0,
                alternate_path: paths.1,
                sap_supported: flags.3,
                private_data: &private_data,
            };
            round_trip(&CmMessage::Req(req))?;
        }

        #[test]
        fn rep_round_trips(
            ids in any::<(u32, u32, u32, u64)>(),
            local_qpn in qpn(),
            vendor_id in 0u32..1 << 24,
            local_eecn in 0u32..1 << 24,
            starting_psn in psn(),
            rr_id in any::<(u8, u8)>(),
            target_ack_delay in 0u8..32,
            failover_accepted in 0u8..4,
            rnr_retry_count in 0u8..8,
            flags in any::<(bool, bool)>(),
            private_data in bytes(REP_PRIVATE_DATA_LEN),
        ) {
            let rep = RepRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                local_qkey: QKey(ids.2),
                local_qpn,
                vendor_id,
                local_eecn,
                starting_psn,
                responder_resources: rr_id.0,
                initiator_depth: rr_id.1,
                target_ack_delay,
                failover_accepted,
                end_to_end_flow_control: flags.0,
                rnr_retry_count,
                srq: flags.1,
                local_ca_guid: ids.3,
                private_data: &private_data,
            };
            round_trip(&CmMessage::Rep(rep))?;
        }

        #[test]
        fn rtu_drep_round_trip(ids in any::<(u32, u32)>(), private_data in bytes(RTU_PRIVATE_DATA_LEN)) {
            let rtu = RtuRepr { local_comm_id: ids.0, remote_comm_id: ids.1, private_data: &private_data };
            round_trip(&CmMessage::Rtu(rtu))?;
            let drep = DrepRepr { local_comm_id: ids.0, remote_comm_id: ids.1, private_data: &private_data };
            round_trip(&CmMessage::Drep(drep))?;
        }

        #[test]
        fn rej_round_trips(
            ids in any::<(u32, u32, u16)>(),
            message_rejected in 0u8..4,
            reject_info_length in 0u8..128,
            ari in bytes(REJ_ARI_LEN),
            private_data in bytes(REJ_PRIVATE_DATA_LEN),
        ) {
            let rej = RejRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                message_rejected: CmMsgResponse(message_rejected),
                reject_info_length,
                reason: RejReason(ids.2),
                additional_reject_info: &ari,
                private_data: &private_data,
            };
            prop_assert!(rej.ari().len() <= REJ_ARI_LEN);
            round_trip(&CmMessage::Rej(rej))?;
        }

        #[test]
        fn mra_round_trips(
            ids in any::<(u32, u32)>(),
            message_mraed in 0u8..4,
            service_timeout in 0u8..32,
            private_data in bytes(MRA_PRIVATE_DATA_LEN),
        ) {
            let mra = MraRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                message_mraed: CmMsgResponse(message_mraed),
                service_timeout,
                private_data: &private_data,
            };
            round_trip(&CmMessage::Mra(mra))?;
        }

        #[test]
        fn dreq_round_trips(ids in any::<(u32, u32)>(), local_qpn in qpn(), private_data in bytes(DREQ_PRIVATE_DATA_LEN)) {
            let dreq = DreqRepr { local_comm_id: ids.0, remote_comm_id: ids.1, remote_qpn: local_qpn, private_data: &private_data };
            round_trip(&CmMessage::Dreq(dreq))?;
        }

        #[test]
        fn sidr_req_round_trips(ids in any::<(u32, u16, u64)>(), private_data in bytes(SIDR_REQ_PRIVATE_DATA_LEN)) {
            let sidr = SidrReqRepr { request_id: ids.0, pkey: PKey(ids.1), service_id: ids.2, private_data: &private_data };
            round_trip(&CmMessage::SidrReq(sidr))?;
        }

        #[test]
        fn sidr_rep_round_trips(
            ids in any::<(u32, u8, u8, u64, u32)>(),
            vendor_id in 0u32..1 << 24,
            local_qpn in qpn(),
            info in bytes(SIDR_REP_INFO_LEN),
            private_data in bytes(SIDR_REP_PRIVATE_DATA_LEN),
        ) {
            let sidr = SidrRepRepr {
                request_id: ids.0,
                status: SidrStatus(ids.1),
                additional_info_length: ids.2,
                vendor_id,
                qpn: local_qpn,
                service_id: ids.3,
                qkey: QKey(ids.4),
                additional_info: &info,
                private_data: &private_data,
            };
            prop_assert!(sidr.info().len() <= SIDR_REP_INFO_LEN);
            round_trip(&CmMessage::SidrRep(sidr))?;
        }

        #[test]
        fn other_round_trips(attribute_id in any::<u16>(), data in bytes(MAD_DATA_LEN)) {
            prop_assume!(!(0x10..=0x18).contains(&attribute_id));
            round_trip(&CmMessage::Other { attribute_id: AttributeId(attribute_id), data: &data })?;
        }

        /// Arbitrary MADs never panic, and whatever parses re-parses to itself.
        #[test]
        fn any_mad_never_panics(
            mut mad in bytes(MAD_LEN),
            force_cm in any::<bool>(),
            attribute_id in 0x0fu16..0x1b,
        ) {
            if force_cm {
                mad[1] = MgmtClass::CM.0;
                mad[16..18].copy_from_slice(&attribute_id.to_be_bytes());
            }
            let Ok(parsed) = MadRepr::parse(&MadPacket::new_unchecked(&mad[..])) else {
                return Err(TestCaseError::fail("a 256-byte MAD always parses"));
            };
            match CmMessage::parse(&parsed) {
                Ok(msg) => {
                    prop_assert_eq!(parsed.header.mgmt_class, MgmtClass::CM);
                    let _ = (msg.name(), msg.local_comm_id(), msg.remote_comm_id());
                    round_trip(&msg)?;
                }
                Err(e) => {
                    prop_assert_eq!(e, Error::NotCm);
                    prop_assert!(!force_cm);
                }
            }
        }

        /// Data areas of any length never panic.
        #[test]
        fn any_data_never_panics(data in prop::collection::vec(any::<u8>(), 0..240), attribute_id in 0x0fu16..0x1b) {
            match CmMessage::parse_data(AttributeId(attribute_id), &data) {
                Ok(_) => prop_assert!(data.len() >= MAD_DATA_LEN),
                Err(e) => prop_assert_eq!((e, data.len() < MAD_DATA_LEN), (Error::Truncated, true)),
            }
        }
    }
}
