//! The values that go in and out of [`Cm`](crate::Cm): configuration, connection
//! parameters, events, transmissions, counters and errors.

use core::fmt;
use core::net::{IpAddr, SocketAddr, SocketAddrV6};
use core::time::Duration;

use softrdma_engine::{AddressVector, Mtu, QpState, QpType};
use softrdma_wire::cm::{RejReason, SidrStatus};
use softrdma_wire::cma::PortSpace;
use softrdma_wire::mad::MAD_LEN;

/// `CMA_CM_RESPONSE_TIMEOUT` (`cma.c`): the CM response timeout exponent rdma_cm sends in a
/// REQ, 4.096 µs · 2^20 ≈ 4.3 s.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;
/// `CMA_MAX_CM_RETRIES` (`cma.c`): how often rdma_cm resends a REQ, REP or DREQ.
pub const CMA_MAX_CM_RETRIES: u8 = 15;
/// `CMA_IBOE_PACKET_LIFETIME` (`cma.c`): the packet lifetime exponent of a RoCE path.
pub const CMA_IBOE_PACKET_LIFETIME: u8 = 18;
/// rxe's `local_ca_ack_delay` (`rxe_param.h: RXE_LOCAL_CA_ACK_DELAY`).
pub const RXE_LOCAL_CA_ACK_DELAY: u8 = 15;
/// The service timeout rdma_cm puts in its MRAs (`cma.c: CMA_CM_MRA_SETTING`, without the
/// delay flag): 4.096 µs · 2^24 ≈ 69 s.
pub const CMA_CM_MRA_SERVICE_TIMEOUT: u8 = 24;
/// The most listeners' pending connection requests ucma allows (`ucma.c: max_backlog`).
pub const MAX_BACKLOG: u32 = 1024;

/// How a [`Cm`](crate::Cm) behaves. [`Default`] gives the values of the Linux kernel's
/// rdma_cm over rxe; a runtime sets at least `seed`, `comm_id_prefix`, `addresses` and
/// `node_guid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmConfig {
    /// Seeds the ChaCha generator behind every random choice: the comm ID counter's start,
    /// the high half of transaction IDs, ephemeral ports and starting PSNs.
    pub seed: u64,
    /// Local comm IDs and SIDR request IDs are `comm_id_prefix | counter`, where the counter
    /// uses the low [`COMM_ID_COUNTER_BITS`](crate::COMM_ID_COUNTER_BITS) (21) bits. The
    /// prefix is `slot << 21`, given by the host's port-sharing layer so that the kernel can
    /// steer replies to the right process; its low 21 bits must be zero.
    pub comm_id_prefix: u32,
    /// The device's GID table as IP addresses: index = `sgid_index`.
    pub addresses: Vec<IpAddr>,
    /// The device's interface index: the scope (`sin6_scope_id`) of the link-local
    /// addresses the CM reports ([`Cm::local_addr`](crate::Cm::local_addr),
    /// [`Cm::peer_addr`](crate::Cm::peer_addr)), so that a program can use them as they
    /// are. 0: none.
    pub scope_id: u32,
    /// The port's active MTU; goes into the REQ as the path MTU (`iboe_get_mtu` of a 1500
    /// byte netdev gives 1024).
    pub port_mtu: Mtu,
    /// CM response timeout exponent: we answer within 4.096 µs · 2^value, and resend a REQ,
    /// REP, DREQ or SIDR_REQ that long after sending it. Kernel rdma_cm:
    /// [`CMA_CM_RESPONSE_TIMEOUT`] (20). A connection made for a peer's REQ resends its REP
    /// and DREQ on the REQ's Local CM Response Timeout instead, as `cm.c` does.
    pub response_timeout: u8,
    /// How often a REQ, REP, DREQ or SIDR_REQ is resent before giving up (4 bits on the wire;
    /// kernel rdma_cm: [`CMA_MAX_CM_RETRIES`], 15). A connection made for a peer's REQ uses
    /// the REQ's Max CM Retries instead.
    pub max_retries: u8,
    /// How long a connection stays in timewait after its disconnect completes, before the
    /// `TIMEWAIT_EXIT` event. Linux waits 4.096 µs · 2^(ACK timeout) ≈ 2.1 s with rxe.
    pub timewait: Duration,
    /// The CA's node GUID, sent as Local CA GUID in REQ and REP and as the ARI of a timeout
    /// REJ. rxe derives it from the interface's MAC address (EUI-64).
    pub node_guid: u64,
    /// The path's packet lifetime exponent (RoCE: [`CMA_IBOE_PACKET_LIFETIME`], 18).
    pub packet_life_time: u8,
    /// This CA's ACK delay exponent (rxe: [`RXE_LOCAL_CA_ACK_DELAY`], 15), sent as the REP's
    /// Target ACK Delay and used to compute the REQ's Local ACK Timeout.
    pub ca_ack_delay: u8,
    /// IP hop limit of the path (the route's; normally 64).
    pub hop_limit: u8,
    /// IP traffic class of the path (`rdma_set_service_type`; default 0).
    pub traffic_class: u8,
    /// Service timeout exponent of the MRAs we send ([`CMA_CM_MRA_SERVICE_TIMEOUT`], 24).
    pub mra_service_timeout: u8,
    /// The most CM IDs alive at once (listeners, connections and pending requests alike).
    pub max_ids: usize,
    /// The most MADs waiting in [`poll_transmit`](crate::Cm::poll_transmit); beyond it
    /// MADs are dropped and counted, like a full send queue.
    pub max_queued_transmits: usize,
    /// The range ephemeral ports are drawn from (Linux `ip_local_port_range`).
    pub ephemeral_ports: (u16, u16),
    /// How often a REQ to an address of this very device (the same host) that is
    /// rejected with Invalid Service ID (nobody listens there yet) is sent again, after
    /// 1, 2, 4, ... ms, before `REJECTED` is reported. The kernel's CM reports it at once
    /// (0, the default); softrdma's runtime sets 6 (63 ms in all). Programs such as
    /// perftest's `-R` tests call `rdma_listen` and `rdma_connect` at the same moment in
    /// two processes, synchronised by their own handshake: in the kernel the listen is a
    /// system call and wins by far; a user-space listen that opens a device and registers
    /// with the host's port sharing may lose. Peers on other hosts are never retried.
    pub same_host_rej_retries: u8,
    /// Authenticated mode of new IDs ([`crate::auth`]); off by default.
    pub auth: crate::auth::AuthPolicy,
    /// Seeds the generator of authenticated mode's X25519 secrets (kept apart from
    /// [`seed`](Self::seed), which is 64 bits and shows in comm IDs and PSNs): 32 bytes
    /// from the operating system's random source.
    pub auth_seed: [u8; 32],
}

impl Default for CmConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            comm_id_prefix: 0,
            addresses: Vec::new(),
            scope_id: 0,
            port_mtu: Mtu::Mtu1024,
            response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            max_retries: CMA_MAX_CM_RETRIES,
            timewait: Duration::from_millis(2048),
            node_guid: 0,
            packet_life_time: CMA_IBOE_PACKET_LIFETIME,
            ca_ack_delay: RXE_LOCAL_CA_ACK_DELAY,
            hop_limit: 64,
            traffic_class: 0,
            mra_service_timeout: CMA_CM_MRA_SERVICE_TIMEOUT,
            max_ids: 4096,
            max_queued_transmits: 1024,
            ephemeral_ports: (32768, 60999),
            same_host_rej_retries: 0,
            auth: crate::auth::AuthPolicy { required: false, psk: None },
            auth_seed: [0; 32],
        }
    }
}

impl CmConfig {
    /// `ip` and `port` as the CM reports them: a link-local IPv6 address with the device's
    /// scope ([`scope_id`](Self::scope_id)).
    pub(crate) fn socket_addr(&self, ip: IpAddr, port: u16) -> SocketAddr {
        match ip {
            IpAddr::V6(v6) if v6.is_unicast_link_local() => SocketAddrV6::new(v6, port, 0, self.scope_id).into(),
            _ => SocketAddr::new(ip, port),
        }
    }
}

/// A handle on one CM ID: a listener, a connection (either side) or a UD resolution.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct CmId(pub u32);

impl fmt::Display for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CM ID {}", self.0)
    }
}

/// `struct rdma_conn_param` plus what rdma_cm keeps beside it: what
/// [`Cm::connect`](crate::Cm::connect) and [`Cm::accept`](crate::Cm::accept) send, and what
/// `CONNECT_REQUEST`, `CONNECT_RESPONSE` and `ESTABLISHED` events report about the peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// The user's private data: at most 56 bytes in a REQ (92 minus rdma_cm's 36-byte
    /// header), 180 in a SIDR_REQ, 196 in a REP, 136 in a SIDR_REP.
    pub private_data: Vec<u8>,
    /// RDMA READ/atomic requests our QP accepts at once (its `max_dest_rd_atomic`). In an
    /// event: how many the peer accepts, i.e. the most we may issue.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests our QP issues at once (its `max_rd_atomic`). In an event:
    /// how many the peer issues, i.e. the most we must accept.
    pub initiator_depth: u8,
    /// End-to-end flow control (rdma_cm passes it through; rping leaves it 0).
    pub flow_control: bool,
    /// Transport retry count for both QPs, 0..=7 (REQ only).
    pub retry_count: u8,
    /// RNR retry count the *peer's* QP uses, 0..=7 (7 = forever).
    pub rnr_retry_count: u8,
    /// Our QP uses an SRQ.
    pub srq: bool,
    /// Our QP's number (in an event: the peer's).
    pub qp_num: u32,
    /// The first PSN our QP expects to receive (its `rq_psn`; the peer's QP sends from it).
    /// `None`: the CM's own random PSN for this ID, as rdma_cm's `seq_num`, which
    /// [`qp_attr`](crate::Cm::qp_attr) reports before and after. In an event: the PSN the
    /// peer expects from us.
    pub start_psn: Option<u32>,
    /// UD only: the Q_Key of our QP, sent in the SIDR_REP for the IB port space (the UDP
    /// port space always uses `RDMA_UDP_QKEY`, 0x01234567).
    pub qkey: u32,
}

impl Default for ConnParam {
    /// librdmacm's values for a NULL `conn_param`: retry and RNR retry 7, no RDMA READ, no
    /// private data, and a random starting PSN.
    fn default() -> Self {
        Self {
            private_data: Vec::new(),
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
            start_psn: None,
            qkey: 0,
        }
    }
}

/// What a UD sender needs to reach a resolved service: the `ESTABLISHED` event of a SIDR
/// exchange carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdParam {
    /// The service's QP number.
    pub remote_qpn: u32,
    /// The Q_Key to send with.
    pub qkey: u32,
    /// How to reach it (create an address handle from it).
    pub ah: AddressVector,
}

/// `enum rdma_cm_event_type`, with librdmacm's numeric values (`RDMA_CM_EVENT_ADDR_RESOLVED`
/// = 0, ...), so the C layer can cast.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[repr(u8)]
pub enum CmEventKind {
    /// `rdma_resolve_addr` found a local address for the destination.
    AddrResolved = 0,
    /// `rdma_resolve_addr` failed: no address of this device reaches the destination.
    AddrError = 1,
    /// `rdma_resolve_route` built the path.
    RouteResolved = 2,
    /// `rdma_resolve_route` failed.
    RouteError = 3,
    /// A peer asks to connect; the event's `id` is a new ID for it, `listen_id` the listener.
    ConnectRequest = 4,
    /// The passive side accepted (REP): move the QP to RTR and RTS with
    /// [`qp_attr`](crate::Cm::qp_attr), then call [`establish`](crate::Cm::establish).
    ConnectResponse = 5,
    /// The connection failed after the REP.
    ConnectError = 6,
    /// The peer did not answer (REQ, REP or SIDR_REQ retries exhausted) or refused a SIDR.
    Unreachable = 7,
    /// The peer rejected the connection: `status` holds the reason.
    Rejected = 8,
    /// The connection is up (for UD: the service is resolved, see `ud`).
    Established = 9,
    /// The connection is down: a DREQ arrived, our DREQ was answered, or its retries ran out.
    Disconnected = 10,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL` (never raised here).
    DeviceRemoval = 11,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`: a multicast join is done (raised by the runtime's
    /// `rdma_join_multicast`, not by this CM: on RoCE a join needs no MAD).
    MulticastJoin = 12,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR` (never raised: a join that cannot be made fails at once).
    MulticastError = 13,
    /// `RDMA_CM_EVENT_ADDR_CHANGE` (never raised here).
    AddrChange = 14,
    /// The connection left timewait: its QP may be reused.
    TimewaitExit = 15,
}

/// Why an event happened, for the events that can fail. The C layer maps it to
/// `rdma_cm_event.status`: `TimedOut` → `-ETIMEDOUT`, `Rejected(r)` → `r`, `Sidr(s)` → `s`,
/// `AddrNotAvailable` → `-EADDRNOTAVAIL`, `InvalidQkey` → `-EINVAL`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum CmStatus {
    /// Success.
    #[default]
    Ok,
    /// Retries ran out without an answer.
    TimedOut,
    /// A REJ with this reason.
    Rejected(RejReason),
    /// A SIDR_REP with this non-zero status.
    Sidr(SidrStatus),
    /// No address of this device can reach the destination.
    AddrNotAvailable,
    /// A SIDR_REP for the UDP port space carried a Q_Key other than `RDMA_UDP_QKEY`.
    InvalidQkey,
    /// Authenticated mode: the peer's REP carried no offer (it is not softrdma, or not in
    /// a version that authenticates), so we rejected it.
    NotAuthenticated,
}

/// One thing that happened to a CM ID (`struct rdma_cm_event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmEvent {
    /// The ID it happened to; for `CONNECT_REQUEST` a new ID created for the request.
    pub id: CmId,
    /// What happened.
    pub kind: CmEventKind,
    /// Why, when it is a failure.
    pub status: CmStatus,
    /// The peer's private data, rdma_cm header stripped, as the kernel reports it: the whole
    /// fixed-size area (56 bytes for a REQ, 196 for a REP, 148 for a REJ, ...), zero-padded,
    /// since the receiver cannot learn the sender's length.
    pub private_data: Vec<u8>,
    /// The peer's connection parameters, for `CONNECT_REQUEST`, `CONNECT_RESPONSE` and
    /// (again) the RC/UC `ESTABLISHED`: from our point of view, i.e. `responder_resources`
    /// is what we must accept, `initiator_depth` what we may issue.
    pub param: Option<ConnParam>,
    /// For `CONNECT_REQUEST`: the listener the request came in on.
    pub listen_id: Option<CmId>,
    /// For the active side's `ESTABLISHED` after SIDR: the remote UD QP.
    pub ud: Option<UdParam>,
}

/// A MAD to send: the runtime wraps it in a UD SEND_ONLY from QP1 to QP1, Q_Key
/// 0x80010000, P_Key 0xffff, between these IP addresses.
#[derive(Clone, PartialEq, Eq)]
pub struct CmTransmit {
    /// Our address (an entry of [`CmConfig::addresses`]).
    pub src: IpAddr,
    /// The peer's address.
    pub dst: IpAddr,
    /// The 256 MAD bytes.
    pub mad: [u8; MAD_LEN],
    /// Authenticated mode's offer, sent right after the MAD (a REQ's or REP's only).
    pub offer: Option<[u8; crate::auth::OFFER_LEN]>,
    /// Authenticated mode's seal, sent right after the MAD (an authenticated connection's
    /// DREQ or DREP).
    pub seal: Option<[u8; crate::auth::SEAL_LEN]>,
}

impl CmTransmit {
    /// The UD payload: the MAD, then the offer or the seal if there is one.
    pub fn payload(&self) -> Vec<u8> {
        let mut p = self.mad.to_vec();
        if let Some(offer) = &self.offer {
            p.extend_from_slice(offer);
        }
        if let Some(seal) = &self.seal {
            p.extend_from_slice(seal);
        }
        p
    }
}

impl fmt::Debug for CmTransmit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attr = u16::from_be_bytes([self.mad[16], self.mad[17]]);
        write!(f, "CmTransmit {{ {} -> {}, attr {attr:#06x} }}", self.src, self.dst)
    }
}

/// What the CM has done since it was created.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct CmCounters {
    /// MADs handed to [`poll_transmit`](crate::Cm::poll_transmit), retransmissions included.
    pub mads_sent: u64,
    /// MADs given to [`handle_mad`](crate::Cm::handle_mad).
    pub mads_received: u64,
    /// Received MADs dropped: malformed, not CM, or for no ID of ours.
    pub mads_dropped: u64,
    /// Retransmissions of REQ, REP, DREQ and SIDR_REQ after a timeout.
    pub mads_retried: u64,
    /// Duplicates recognised and answered or ignored (REQ, REP, DREQ, SIDR_REQ).
    pub duplicates: u64,
    /// MADs not queued because [`CmConfig::max_queued_transmits`] were waiting.
    pub transmit_queue_full: u64,
}

/// Why a call to [`Cm`](crate::Cm) was refused. Each message names what was wrong and how
/// to fix the call. Errors of the peer or the network never show up here: they are events.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The handle does not name a live ID.
    #[error("{op}: {id} does not exist (never created, or destroyed)")]
    NoSuchId {
        /// The call.
        op: &'static str,
        /// The handle.
        id: CmId,
    },
    /// The ID is in the wrong state for this call.
    #[error("{op}: {id} is {state}; {hint}")]
    InvalidState {
        /// The call.
        op: &'static str,
        /// The handle.
        id: CmId,
        /// Its state.
        state: &'static str,
        /// What to do instead.
        hint: &'static str,
    },
    /// `max_ids` IDs are alive.
    #[error("{op}: {max} CM IDs are alive, the configured maximum (CmConfig::max_ids); destroy some first")]
    TooManyIds {
        /// The call.
        op: &'static str,
        /// The limit.
        max: usize,
    },
    /// The port space does not fit the QP type.
    #[error("create_id: port space {ps} cannot carry a {qp_type:?} QP (TCP: RC or UC, UDP: UD, IB: any)")]
    PortSpaceMismatch {
        /// The port space.
        ps: PortSpace,
        /// The QP type.
        qp_type: QpType,
    },
    /// The address is already bound in this port space.
    #[error("bind_addr: {addr} is already bound in port space {ps}; pick another port or port 0 for an ephemeral one")]
    AddrInUse {
        /// The address.
        addr: SocketAddr,
        /// The port space.
        ps: PortSpace,
    },
    /// The address is not one of this device's.
    #[error(
        "{op}: {ip} is not an address of this device (CmConfig::addresses); bind to one of them or to the wildcard"
    )]
    AddrNotAvailable {
        /// The call.
        op: &'static str,
        /// The address.
        ip: IpAddr,
    },
    /// No ephemeral port is free.
    #[error("bind_addr: every ephemeral port of port space {ps} is taken")]
    NoFreePort {
        /// The port space.
        ps: PortSpace,
    },
    /// The private data does not fit the message.
    #[error("{op}: {len} bytes of private data, but the {message} leaves room for {max}")]
    PrivateDataTooLong {
        /// The call.
        op: &'static str,
        /// The message that would carry it.
        message: &'static str,
        /// The length given.
        len: usize,
        /// The room.
        max: usize,
    },
    /// A QP attribute state was asked for that the CM does not produce.
    #[error("qp_attr: {id} has no attributes for {target:?}; ask for INIT, RTR or RTS")]
    NoAttrsForState {
        /// The handle.
        id: CmId,
        /// The state asked for.
        target: QpState,
    },
    /// Every comm ID of this prefix is in use.
    #[error("{op}: all 2^21 - 1 comm IDs of the prefix are in use")]
    CommIdsExhausted {
        /// The call.
        op: &'static str,
    },
}
