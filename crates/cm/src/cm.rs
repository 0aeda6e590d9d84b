//! The connection manager state machine: one [`Cm`] per device.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use core::time::Duration;
use std::collections::{BTreeMap, VecDeque};

use rand_chacha::{ChaCha12Rng, ChaCha20Rng};
use rand_core::{Rng, SeedableRng};
use softrdma_engine::{Access, AddressVector, AttrMask, Instant, Mtu, QpAttr, QpState, QpType};
use softrdma_wire::Psn;
use softrdma_wire::cm::{
    CmMessage, CmMsgResponse, CmPath, DrepRepr, DreqRepr, MraRepr, REJ_PRIVATE_DATA_LEN, REP_PRIVATE_DATA_LEN,
    RejReason, RejRepr, RepRepr, ReqRepr, RtuRepr, SIDR_REP_PRIVATE_DATA_LEN, SidrRepRepr, SidrReqRepr, SidrStatus,
    TransportServiceType,
};
use softrdma_wire::cma::{
    CMA_HEADER_LEN, CMA_VERSION, CmaHeaderRepr, PortSpace, REQ_USER_PRIVATE_DATA_LEN_MAX,
    SIDR_REQ_USER_PRIVATE_DATA_LEN_MAX, service_id, split_service_id, user_private_data,
};
use softrdma_wire::mad::{AttributeId, MAD_LEN, MadHeader, MadPacket, MadRepr, Method, MgmtClass};
use softrdma_wire::types::{Gid, PKey, QKey, Qpn};

use crate::COMM_ID_COUNTER_MASK;
use crate::types::{
    CmConfig, CmCounters, CmError, CmEvent, CmEventKind, CmId, CmStatus, CmTransmit, ConnParam, MAX_BACKLOG, UdParam,
};

/// A sans-IO connection manager: IB CM over MADs on QP1 with rdma_cm's addressing, for one
/// RoCE device (port 1).
///
/// It never opens a socket, reads a clock, spawns a thread or draws from a global RNG; it
/// is driven entirely by the calls below, in the manner of quinn-proto's `Connection`.
///
/// # Methods, by kind
///
/// - **Commands** (the `rdma_*` calls of librdmacm): [`create_id`](Self::create_id),
///   [`bind_addr`](Self::bind_addr), [`resolve_addr`](Self::resolve_addr),
///   [`resolve_route`](Self::resolve_route), [`listen`](Self::listen),
///   [`connect`](Self::connect), [`accept`](Self::accept), [`reject`](Self::reject),
///   [`establish`](Self::establish), [`notify`](Self::notify),
///   [`disconnect`](Self::disconnect), [`destroy_id`](Self::destroy_id). They check their
///   arguments and the ID's state, and return [`CmError`] for a misuse; anything the peer
///   or the network does shows up later as an event.
/// - **Inputs**: [`handle_mad`](Self::handle_mad) for every MAD that arrives at QP1 (one
///   MAD per call; bad ones are counted and dropped), and
///   [`handle_timeout`](Self::handle_timeout) when the instant from
///   [`poll_timeout`](Self::poll_timeout) has come.
/// - **Outputs**: [`poll_transmit`](Self::poll_transmit) (MADs to send),
///   [`poll_event`](Self::poll_event) (`rdma_cm_event`s), [`poll_timeout`](Self::poll_timeout).
/// - **Getters**: [`qp_attr`](Self::qp_attr) (`rdma_init_qp_attr`),
///   [`local_addr`](Self::local_addr), [`peer_addr`](Self::peer_addr),
///   [`local_comm_id`](Self::local_comm_id), [`listen_service_id`](Self::listen_service_id),
///   [`id_count`](Self::id_count), [`counters`](Self::counters).
///
/// # Calling contract
///
/// After every command and every input, the caller drains `poll_transmit` (wrapping each
/// MAD in a UD SEND_ONLY from QP1 to QP1 of `dst`, Q_Key 0x80010000, P_Key 0xffff) and
/// `poll_event`, then re-reads `poll_timeout` and arms its timer for that instant. Time
/// only moves forward; `now` is the caller's monotonic clock.
///
/// An RC connection, active side: `create_id(TCP, Rc)`, `resolve_addr` → `ADDR_RESOLVED`,
/// `resolve_route` → `ROUTE_RESOLVED`, create the QP and move it to INIT with
/// `qp_attr(id, Init)`, `connect` (REQ) → `CONNECT_RESPONSE` (REP): move the QP to RTR and
/// RTS with `qp_attr`, then `establish` (RTU) → `ESTABLISHED`.
///
/// Passive side: `create_id`, `bind_addr`, `listen`; a REQ raises `CONNECT_REQUEST` on a
/// new ID: create a QP, move it to INIT, RTR and RTS with `qp_attr` of that ID, `accept`
/// (REP) → `ESTABLISHED` when the RTU arrives (or when the runtime calls `notify` on the
/// QP's first received packet, as `ib_cm_notify(IB_EVENT_COMM_EST)` does in the kernel).
///
/// Either side: `disconnect` (move the QP to ERR first) sends a DREQ, or the DREP when a
/// DREQ came in; both sides get `DISCONNECTED`, then `TIMEWAIT_EXIT` after
/// [`CmConfig::timewait`]. `destroy_id` cleans up whatever the state needs (REJ, DREQ or
/// DREP, as `cm_destroy_id` does).
///
/// UD (`PortSpace::UDP`): `connect` sends a SIDR_REQ; the listener gets `CONNECT_REQUEST`
/// and `accept` answers with its QPN and Q_Key; the active side gets `ESTABLISHED` with
/// [`UdParam`].
///
/// Every comm ID and SIDR request ID this CM allocates is
/// `config.comm_id_prefix | counter` (see [`COMM_ID_COUNTER_BITS`](crate::COMM_ID_COUNTER_BITS)).
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    rng: ChaCha12Rng,
    /// Authenticated mode's X25519 secrets (seeded from [`CmConfig::auth_seed`]).
    key_rng: ChaCha20Rng,
    /// High half of every transaction ID we originate (`mad_agent->hi_tid` in Linux).
    hi_tid: u32,
    /// The last comm ID counter value handed out.
    counter: u32,
    next_handle: u32,
    ids: BTreeMap<CmId, Id>,
    /// Our local comm IDs (and SIDR request IDs) → their ID.
    by_comm_id: BTreeMap<u32, CmId>,
    out: Out,
}

/// Queues and counters, apart from the IDs so that both can be borrowed at once.
#[derive(Debug)]
struct Out {
    transmits: VecDeque<CmTransmit>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
    max_transmits: usize,
}

impl Out {
    fn send(&mut self, src: IpAddr, dst: IpAddr, mad: [u8; MAD_LEN]) {
        if self.transmits.len() >= self.max_transmits {
            self.counters.transmit_queue_full += 1;
            return;
        }
        self.counters.mads_sent += 1;
        self.transmits.push_back(CmTransmit { src, dst, mad, offer: None, seal: None });
    }

    fn event(&mut self, id: CmId, kind: CmEventKind, status: CmStatus) {
        self.event_with(CmEvent { id, kind, status, private_data: Vec::new(), param: None, listen_id: None, ud: None });
    }

    /// `ESTABLISHED`, with the peer's parameters from its REQ or REP.
    fn established(&mut self, id: CmId, peer: Option<ConnParam>) {
        self.event_with(CmEvent {
            id,
            kind: CmEventKind::Established,
            status: CmStatus::Ok,
            private_data: Vec::new(),
            param: peer,
            listen_id: None,
            ud: None,
        });
    }

    fn event_with(&mut self, event: CmEvent) {
        if event.status == CmStatus::Ok {
            tracing::debug!(target: "softrdma::cm", "{}: {:?}", event.id, event.kind);
        } else {
            tracing::info!(target: "softrdma::cm", "{}: {:?}, {:?}", event.id, event.kind, event.status);
        }
        self.events.push_back(event);
    }
}

/// The states of one ID: rdma_cm's and ib_cm's merged (Linux `enum rdma_cm_state` and
/// `enum ib_cm_state`). [`CmIdInfo::state`] shows it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CmState {
    /// Created; no address yet.
    Idle,
    /// Bound to a local address (`rdma_bind_addr`).
    AddrBound,
    /// Active: the peer's address resolved (`rdma_resolve_addr`).
    AddrResolved,
    /// Active: the route resolved (`rdma_resolve_route`).
    RouteResolved,
    /// Listening for connection requests.
    Listen,
    /// Active: REQ sent, no answer yet.
    ReqSent,
    /// Active: REP received, `CONNECT_RESPONSE` raised, waiting for `establish`.
    RepRcvd,
    /// Passive: REQ received, `CONNECT_REQUEST` raised, waiting for `accept` or `reject`.
    /// rdma_cm has called `ib_send_cm_mra(IB_CM_MRA_FLAG_DELAY)`: an MRA goes out only if
    /// the REQ is repeated.
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    /// Connected.
    Established,
    /// Disconnecting: DREQ sent, no DREP yet.
    DreqSent,
    /// Disconnected by the peer: DREQ received.
    DreqRcvd,
    /// Disconnected, waiting out timewait before the QP may be reused.
    Timewait,
    /// UD: SIDR_REQ sent, no SIDR_REP yet.
    SidrReqSent,
    /// UD: SIDR_REQ received, waiting for `accept` or `reject`.
    SidrReqRcvd,
    /// UD: the SIDR exchange is over (either side).
    SidrDone,
    /// Rejected, unreachable, or out of timewait: only `destroy_id` is left.
    Closed,
}

use CmState as State;

impl CmState {
    /// What the state means, in words (for errors and logs).
    pub const fn name(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::AddrBound => "bound",
            State::AddrResolved => "address-resolved",
            State::RouteResolved => "route-resolved",
            State::Listen => "listening",
            State::ReqSent => "waiting for a REP (REQ sent)",
            State::RepRcvd => "waiting for establish (REP received)",
            State::ReqRcvd => "waiting for accept or reject (REQ received)",
            State::RepSent => "waiting for the RTU (REP sent)",
            State::Established => "established",
            State::DreqSent => "disconnecting (DREQ sent)",
            State::DreqRcvd => "disconnected by the peer (DREQ received)",
            State::Timewait => "in timewait",
            State::SidrReqSent => "waiting for a SIDR_REP",
            State::SidrReqRcvd => "waiting for accept or reject (SIDR_REQ received)",
            State::SidrDone => "resolved (UD)",
            State::Closed => "closed",
        }
    }

    /// The `enum rdma_cm_state` name the kernel's `rdma res show cm_id` prints for it
    /// (`LISTEN`, `CONNECT`, ...): every state of the IB CM exchange and an established
    /// connection are `CONNECT`, as in the kernel, which keeps the detail in ib_cm.
    pub const fn rdma_cm_name(self) -> &'static str {
        match self {
            State::Idle => "IDLE",
            State::AddrBound => "ADDR_BOUND",
            State::AddrResolved => "ADDR_RESOLVED",
            State::RouteResolved => "ROUTE_RESOLVED",
            State::Listen => "LISTEN",
            State::ReqSent
            | State::RepRcvd
            | State::ReqRcvd
            | State::RepSent
            | State::Established
            | State::SidrReqSent
            | State::SidrReqRcvd
            | State::SidrDone => "CONNECT",
            State::DreqSent | State::DreqRcvd | State::Timewait | State::Closed => "DISCONNECT",
        }
    }

    /// The `enum ib_cm_state` name of the IB CM exchange's state (`IB_CM_` left out:
    /// `REQ_SENT`, `ESTABLISHED`, `TIMEWAIT`), or `IDLE` where no exchange runs.
    pub const fn ib_cm_name(self) -> &'static str {
        match self {
            State::Idle | State::AddrBound | State::AddrResolved | State::RouteResolved | State::Closed => "IDLE",
            State::Listen => "LISTEN",
            State::ReqSent => "REQ_SENT",
            State::RepRcvd => "REP_RCVD",
            State::ReqRcvd => "REQ_RCVD",
            State::RepSent => "REP_SENT",
            State::Established => "ESTABLISHED",
            State::DreqSent => "DREQ_SENT",
            State::DreqRcvd => "DREQ_RCVD",
            State::Timewait => "TIMEWAIT",
            State::SidrReqSent => "SIDR_REQ_SENT",
            State::SidrReqRcvd => "SIDR_REQ_RCVD",
            State::SidrDone => "IDLE",
        }
    }
}

/// One CM ID as [`Cm::id_info`] sees it (what `rdma res show cm_id` shows).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CmIdInfo {
    /// The ID.
    pub id: CmId,
    /// Its port space (TCP, UDP, IB, IPoIB).
    pub ps: PortSpace,
    /// The type of QP it was created for.
    pub qp_type: QpType,
    /// Its state.
    pub state: CmState,
    /// Its local address, once bound or resolved.
    pub local: Option<SocketAddr>,
    /// The peer's address, once resolved or taken from a request.
    pub peer: Option<SocketAddr>,
    /// Made for an incoming request (passive side).
    pub passive: bool,
    /// For a passive ID: the listener it came from.
    pub listener: Option<CmId>,
    /// The service ID it listens on or connects to (0 before it has one).
    pub service_id: u64,
    /// Its local and remote comm IDs (0 before the exchange gives them).
    pub local_comm_id: u32,
    /// See `local_comm_id`.
    pub remote_comm_id: u32,
    /// The peer's QPN, once the exchange gave it.
    pub remote_qpn: Option<u32>,
}

/// What a pending retransmission resends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sent {
    Req,
    Rep,
    Dreq,
    SidrReq,
}

#[derive(Clone, Debug)]
struct Pending {
    mad: Box<[u8; MAD_LEN]>,
    retries_left: u8,
    what: Sent,
}

/// The path, as `cma_resolve_iboe_route` builds it (or as the REQ gives it, passively).
#[derive(Clone, Copy, Debug)]
struct Route {
    src: IpAddr,
    dst: IpAddr,
    sgid_index: u8,
    flow_label: u32,
    hop_limit: u8,
    traffic_class: u8,
}

/// What the CM exchange settled about the QPs, from this side's point of view.
#[derive(Clone, Copy, Debug, Default)]
struct Conn {
    /// Set once the peer's QPN and PSN are known (REQ received or REP received).
    remote_known: bool,
    remote_qpn: u32,
    /// The PSN the peer expects first: our `sq_psn`.
    remote_psn: u32,
    local_qpn: u32,
    /// Our `max_dest_rd_atomic`.
    responder_resources: u8,
    /// Our `max_rd_atomic`.
    initiator_depth: u8,
    retry_count: u8,
    /// Our QP's `rnr_retry`.
    rnr_retry: u8,
    mtu: Option<Mtu>,
    ack_timeout: u8,
    flow_control: bool,
    srq: bool,
    /// UD: our Q_Key.
    qkey: u32,
    /// The CM exchange has started (REQ sent or received): INIT gets cm.c's access flags.
    exchanged: bool,
}

#[derive(Clone, Debug)]
struct Id {
    ps: PortSpace,
    qp_type: QpType,
    state: State,
    /// Owns `local`'s port in its port space (set by `bind_addr`/`resolve_addr`; IDs made
    /// for incoming requests share their listener's port and own nothing).
    bound: bool,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    route: Option<Route>,
    backlog: u32,
    /// For a listener: its `CONNECT_REQUEST`s not yet taken by the application, which the
    /// backlog bounds ([`Cm::request_taken`]).
    untaken: u32,
    /// For a passive ID: the listener it came from.
    listener: Option<CmId>,
    /// For a passive ID: its `CONNECT_REQUEST` counts in the listener's `untaken`.
    in_backlog: bool,
    local_comm_id: u32,
    remote_comm_id: u32,
    /// The transaction ID of the exchange: ours for an active ID, the REQ's for a passive.
    tid: u64,
    /// The transaction ID of the DREQ we answer.
    dreq_tid: u64,
    service_id: u64,
    /// Our starting PSN (rdma_cm's `seq_num`): our QP's `rq_psn`.
    seq_num: u32,
    conn: Conn,
    pending: Option<Pending>,
    /// When the pending MAD is resent, or timewait ends.
    deadline: Option<Instant>,
    /// The last REP, RTU or DREP we sent, resent when its trigger is repeated.
    last_reply: Option<Box<[u8; MAD_LEN]>>,
    /// An MRA for our REQ or REP came in: the retry timer was extended once.
    mra_received: bool,
    /// Times our REQ was sent again after a same-host Invalid Service ID REJ
    /// ([`CmConfig::same_host_rej_retries`]).
    same_host_rejs: u8,
    disconnected_reported: bool,
    /// In timewait since a REJ came while established: REJECTED was reported, and no
    /// TIMEWAIT_EXIT will be (rdma_cm reports that only for a connection its user
    /// disconnected: `cma_ib_handler` drops it for an ID still connecting or connected).
    rejected_established: bool,
    /// Made for an incoming REQ or SIDR_REQ.
    passive: bool,
    /// The peer's parameters from its REQ or REP, for the `ESTABLISHED` event.
    peer_param: Option<ConnParam>,
    /// Retransmission interval exponent and retry count of this ID's REQ/REP/DREQ/SIDR_REQ:
    /// the configured ones, or for a passive ID the REQ's Local CM Response Timeout and Max
    /// CM Retries (`cm.c: cm_req_handler`).
    cm_timeout: u8,
    cm_retries: u8,
    /// Authenticated mode's exchange, for an RC/UC ID that offered or answered an offer.
    auth: Option<crate::auth::Exchange>,
    /// Whether this ID requires authenticated mode, and with which pre-shared key.
    policy: crate::auth::AuthPolicy,
    /// `RDMA_OPTION_ID_TOS`: the traffic class its route takes, instead of the device's.
    tos: Option<u8>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: its QP's local ACK timeout, instead of the path's.
    ack_timeout: Option<u8>,
}

impl Id {
    fn new(ps: PortSpace, qp_type: QpType, seq_num: u32, config: &CmConfig) -> Self {
        Self {
            ps,
            qp_type,
            state: State::Idle,
            bound: false,
            local: None,
            peer: None,
            route: None,
            backlog: 0,
            untaken: 0,
            listener: None,
            in_backlog: false,
            local_comm_id: 0,
            remote_comm_id: 0,
            tid: 0,
            dreq_tid: 0,
            service_id: 0,
            seq_num,
            conn: Conn::default(),
            pending: None,
            deadline: None,
            last_reply: None,
            mra_received: false,
            same_host_rejs: 0,
            disconnected_reported: false,
            rejected_established: false,
            passive: false,
            peer_param: None,
            cm_timeout: config.response_timeout,
            cm_retries: config.max_retries,
            auth: None,
            policy: config.auth,
            tos: None,
            ack_timeout: None,
        }
    }
}

/// 4.096 µs · 2^exponent, the IBA time unit of every CM timeout field.
pub fn ib_timeout(exponent: u8) -> Duration {
    Duration::from_nanos(4096u64 << exponent.min(31))
}

/// `cm.c: cm_ack_timeout`: the QP's local ACK timeout from the CA's ACK delay and the path's
/// packet lifetime (rxe: 15 and 18 give 19).
pub fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let d = u32::from(ca_ack_delay);
    let mut t = u32::from(packet_life_time) + 1;
    if t >= d {
        t += u32::from(d + 1 >= t);
    } else {
        t = d + u32::from(t + 1 >= d);
    }
    t.min(31) as u8
}

/// `cma.c: cma_iboe_set_path_rec_l2_fields` (newer kernels): the flow label rdma_cm
/// derives from the rdma_cm ports, `(sport * 31 + dport) & 0xfffff`.
pub fn rdma_flow_label(src_port: u16, dst_port: u16) -> u32 {
    (u32::from(src_port) * 31 + u32::from(dst_port)) & 0xf_ffff
}

fn emit_mad(msg: &CmMessage<'_>, tid: u64) -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    let mut packet = MadPacket::new_unchecked(&mut mad[..]);
    msg.mad_header(tid).emit(&mut packet);
    // Every caller checked the private data against the message's room, and the buffer is
    // a whole MAD, so emit cannot fail.
    let emitted = msg.emit(packet.data_mut());
    debug_assert!(emitted.is_ok(), "{emitted:?}");
    mad
}

/// Whether `mad` is a REJ.
fn is_rej(mad: &[u8; MAD_LEN]) -> bool {
    MadPacket::new_checked(&mad[..]).is_ok_and(|p| p.attribute_id() == AttributeId::REJ)
}

fn unspecified(v6: bool) -> IpAddr {
    if v6 { Ipv6Addr::UNSPECIFIED.into() } else { Ipv4Addr::UNSPECIFIED.into() }
}

/// Whether two bound IPs overlap (one is a wildcard, or they are equal). `[::]` covers IPv4
/// as well, as Linux does with `bindv6only = 0`.
fn ips_overlap(a: IpAddr, b: IpAddr) -> bool {
    let covers = |w: IpAddr, x: IpAddr| w.is_unspecified() && (w.is_ipv6() || x.is_ipv4());
    a == b || covers(a, b) || covers(b, a)
}

impl Cm {
    /// A CM with no IDs.
    pub fn new(config: CmConfig) -> Self {
        let mut rng = ChaCha12Rng::seed_from_u64(config.seed);
        let hi_tid = rng.next_u32() | 1;
        let counter = rng.next_u32() & COMM_ID_COUNTER_MASK;
        let max_transmits = config.max_queued_transmits;
        let key_rng = ChaCha20Rng::from_seed(config.auth_seed);
        Self {
            config,
            rng,
            key_rng,
            hi_tid,
            counter,
            next_handle: 1,
            ids: BTreeMap::new(),
            by_comm_id: BTreeMap::new(),
            out: Out {
                transmits: VecDeque::new(),
                events: VecDeque::new(),
                counters: CmCounters::default(),
                max_transmits,
            },
        }
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &CmConfig {
        &self.config
    }

    // ---------------------------------------------------------------- commands

    /// `rdma_create_id`: a new ID in port space `ps` for a QP of type `qp_type` (TCP: RC or
    /// UC; UDP: UD; IB: any).
    pub fn create_id(&mut self, ps: PortSpace, qp_type: QpType) -> Result<CmId, CmError> {
        let fits = match ps {
            PortSpace::TCP => matches!(qp_type, QpType::Rc | QpType::Uc),
            PortSpace::UDP => qp_type == QpType::Ud,
            PortSpace::IB => qp_type != QpType::Gsi,
            _ => false,
        };
        if !fits {
            return Err(CmError::PortSpaceMismatch { ps, qp_type });
        }
        let seq_num = self.rng.next_u32() & Psn::MAX.value();
        self.insert(Id::new(ps, qp_type, seq_num, &self.config), "create_id")
    }

    /// Sets `id`'s authenticated mode ([`crate::auth`]), before it connects or listens (a
    /// listener's requests take its policy).
    pub fn set_auth_policy(&mut self, id: CmId, policy: crate::auth::AuthPolicy) -> Result<(), CmError> {
        const OP: &str = "set_auth_policy";
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
        match i.state {
            State::Idle | State::AddrBound | State::AddrResolved | State::RouteResolved => {
                i.policy = policy;
                Ok(())
            }
            s => Err(invalid(OP, id, s, "set the authentication policy before connect or listen")),
        }
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)` (`rdma_set_service_type`): the traffic class
    /// (DSCP and ECN bits) of the route `resolve_route` makes for `id` from now on, and so of
    /// its QP's packets; in any state, as the kernel's, but a route already made keeps its
    /// own.
    pub fn set_tos(&mut self, id: CmId, tos: u8) -> Result<(), CmError> {
        self.get_mut("set_tos", id)?.tos = Some(tos);
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)` (`rdma_set_ack_timeout`): the local
    /// ACK timeout exponent (4.096 µs · 2^`timeout`, 0..=31) that [`qp_attr`](Self::qp_attr)
    /// gives `id`'s QP at RTS, instead of the one derived from the path. RC only, as the
    /// kernel's.
    pub fn set_ack_timeout(&mut self, id: CmId, timeout: u8) -> Result<(), CmError> {
        const OP: &str = "set_ack_timeout";
        let i = self.get_mut(OP, id)?;
        if i.qp_type != QpType::Rc {
            return Err(invalid(OP, id, i.state, "only an RC ID's QP has a local ACK timeout"));
        }
        if timeout > 31 {
            return Err(invalid(OP, id, i.state, "the ACK timeout is a 5-bit exponent (0..=31)"));
        }
        i.ack_timeout = Some(timeout);
        Ok(())
    }

    /// `rdma_destroy_id`: forgets the ID, first sending what its state calls for
    /// (`cm.c: cm_destroy_id`): a REJ (reason TIMEOUT with our GUID while our REQ is
    /// unanswered, CONSUMER_DEFINED while a REQ or REP waits for us or our REP is
    /// unanswered), a DREQ while established (sent once), a DREP when a DREQ came in.
    pub fn destroy_id(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        let _ = now;
        self.request_taken(id);
        let i = self.ids.remove(&id).ok_or(CmError::NoSuchId { op: "destroy_id", id })?;
        if i.local_comm_id != 0 {
            self.by_comm_id.remove(&i.local_comm_id);
        }
        let Some(route) = i.route else { return Ok(()) };
        let guid = self.config.node_guid.to_be_bytes();
        let mad = match i.state {
            State::ReqSent => Some(self.rej_mad(&i, RejReason::TIMEOUT, CmMsgResponse::OTHER, &guid, &[])),
            State::ReqRcvd => Some(self.rej_mad(&i, RejReason::CONSUMER_DEFINED, CmMsgResponse::REQ, &[], &[])),
            State::RepSent => Some(self.rej_mad(&i, RejReason::CONSUMER_DEFINED, CmMsgResponse::OTHER, &[], &[])),
            State::RepRcvd => Some(self.rej_mad(&i, RejReason::CONSUMER_DEFINED, CmMsgResponse::REP, &[], &[])),
            State::Established => Some(self.dreq_mad(&i)),
            State::DreqRcvd => Some(Self::drep_mad(&i)),
            State::SidrReqRcvd => Some(self.sidr_rep_mad(&i, SidrStatus::REJECT, 0, 0, &[])),
            _ => None,
        };
        if let Some(mad) = mad {
            self.out.send(route.src, route.dst, mad);
        }
        Ok(())
    }

    /// The application took the `CONNECT_REQUEST` of `id` (`rdma_get_cm_event` returned
    /// it): it no longer counts in its listener's backlog. As ucma, the backlog bounds the
    /// requests reported and not yet taken, not those taken and still unanswered (those age
    /// out with the requester's own timeouts); `accept`, `reject` and `destroy_id` take it
    /// too. Anything else, or a second call, does nothing.
    pub fn request_taken(&mut self, id: CmId) {
        let Some(i) = self.ids.get_mut(&id) else { return };
        if !std::mem::take(&mut i.in_backlog) {
            return;
        }
        let listener = i.listener;
        if let Some(l) = listener.and_then(|l| self.ids.get_mut(&l)) {
            l.untaken = l.untaken.saturating_sub(1);
        }
    }

    /// `rdma_bind_addr`: binds the ID to `addr` in its port space. Port 0 picks a free
    /// ephemeral port; an unspecified IP binds every address of the device.
    pub fn bind_addr(&mut self, id: CmId, addr: SocketAddr) -> Result<(), CmError> {
        const OP: &str = "bind_addr";
        let i = self.get(OP, id)?;
        if i.state != State::Idle {
            return Err(invalid(OP, id, i.state, "bind an ID once, before resolve_addr or listen"));
        }
        if !addr.ip().is_unspecified() && !self.config.addresses.contains(&addr.ip()) {
            return Err(CmError::AddrNotAvailable { op: OP, ip: addr.ip() });
        }
        let ps = i.ps;
        let port = if addr.port() == 0 {
            self.ephemeral_port(ps, addr.ip()).ok_or(CmError::NoFreePort { ps })?
        } else if self.port_taken(ps, addr.ip(), addr.port()) {
            return Err(CmError::AddrInUse { addr, ps });
        } else {
            addr.port()
        };
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
        i.local = Some(self.config.socket_addr(addr.ip(), port));
        i.bound = true;
        i.state = State::AddrBound;
        Ok(())
    }

    /// `rdma_resolve_addr`: `src` is the local address the runtime's route lookup chose for
    /// `dst` (its port, if not 0, is bound). Raises `ADDR_RESOLVED`, or `ADDR_ERROR` when no
    /// address of this device can reach `dst` (`src` missing, not one of
    /// [`CmConfig::addresses`], or of the other IP family).
    pub fn resolve_addr(
        &mut self,
        now: Instant,
        id: CmId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
    ) -> Result<(), CmError> {
        const OP: &str = "resolve_addr";
        let _ = now;
        let i = self.get(OP, id)?;
        if !matches!(i.state, State::Idle | State::AddrBound) {
            return Err(invalid(OP, id, i.state, "resolve an address on a new or bound ID"));
        }
        let bound = i.local.filter(|_| i.bound);
        let ip = match bound {
            Some(b) if !b.ip().is_unspecified() => Some(b.ip()),
            _ => src.map(|s| s.ip()),
        };
        let usable = ip.filter(|ip| self.config.addresses.contains(ip) && ip.is_ipv4() == dst.is_ipv4());
        let Some(ip) = usable else {
            self.out.event(id, CmEventKind::AddrError, CmStatus::AddrNotAvailable);
            return Ok(());
        };
        let port = match bound {
            Some(b) => b.port(),
            None => {
                self.bind_addr(id, SocketAddr::new(ip, src.map_or(0, |s| s.port())))?;
                self.ids.get(&id).and_then(|i| i.local).map_or(0, |l| l.port())
            }
        };
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
        i.local = Some(self.config.socket_addr(ip, port));
        i.peer = Some(self.config.socket_addr(dst.ip(), dst.port()));
        i.state = State::AddrResolved;
        self.out.event(id, CmEventKind::AddrResolved, CmStatus::Ok);
        Ok(())
    }

    /// `rdma_resolve_route`: on RoCE there is no SA; the path is built locally
    /// (`cma.c: cma_resolve_iboe_route`): GIDs from the IPs, the configured hop limit and
    /// traffic class, the flow label from the ports. Raises `ROUTE_RESOLVED`.
    pub fn resolve_route(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        const OP: &str = "resolve_route";
        let _ = now;
        let sgid = |ip: IpAddr| self.config.addresses.iter().position(|a| *a == ip);
        let i = self.get(OP, id)?;
        let (hop_limit, traffic_class) = (self.config.hop_limit, i.tos.unwrap_or(self.config.traffic_class));
        if i.state != State::AddrResolved {
            return Err(invalid(OP, id, i.state, "call resolve_addr first and wait for ADDR_RESOLVED"));
        }
        let (Some(local), Some(peer)) = (i.local, i.peer) else {
            return Err(invalid(OP, id, i.state, "call resolve_addr first"));
        };
        let Some(sgid_index) = sgid(local.ip()).and_then(|x| u8::try_from(x).ok()) else {
            self.out.event(id, CmEventKind::RouteError, CmStatus::AddrNotAvailable);
            return Ok(());
        };
        let route = Route {
            src: local.ip(),
            dst: peer.ip(),
            sgid_index,
            flow_label: rdma_flow_label(local.port(), peer.port()),
            hop_limit,
            traffic_class,
        };
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
        i.route = Some(route);
        i.state = State::RouteResolved;
        self.out.event(id, CmEventKind::RouteResolved, CmStatus::Ok);
        Ok(())
    }

    /// `rdma_listen`: REQs (or SIDR_REQs, for UD) for this ID's service ID and address
    /// raise `CONNECT_REQUEST`. Binds an ephemeral port first if the ID is not bound. At
    /// most `backlog` requests are reported and not yet taken by the application
    /// ([`Cm::request_taken`]) at once (0 or more than 1024: 1024, as ucma); a REQ beyond
    /// them gets no answer, so that its sender tries again, and a SIDR_REQ a REJECT.
    pub fn listen(&mut self, id: CmId, backlog: u32) -> Result<(), CmError> {
        const OP: &str = "listen";
        let i = self.get(OP, id)?;
        match i.state {
            State::AddrBound => {}
            State::Idle => {
                let any = unspecified(self.config.addresses.iter().any(IpAddr::is_ipv6));
                self.bind_addr(id, SocketAddr::new(any, 0))?;
            }
            s => return Err(invalid(OP, id, s, "listen on a new or bound ID")),
        }
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
        i.backlog = if backlog == 0 || backlog > MAX_BACKLOG { MAX_BACKLOG } else { backlog };
        i.state = State::Listen;
        Ok(())
    }

    /// `rdma_connect`: sends a REQ (RC, UC) or SIDR_REQ (UD) to the resolved peer, with
    /// rdma_cm's header before `param.private_data`. Needs `ROUTE_RESOLVED`. The answer is
    /// `CONNECT_RESPONSE`, `REJECTED` or `UNREACHABLE` (UD: `ESTABLISHED` or
    /// `UNREACHABLE`).
    pub fn connect(&mut self, now: Instant, id: CmId, param: &ConnParam) -> Result<(), CmError> {
        const OP: &str = "connect";
        let i = self.get(OP, id)?;
        if i.state != State::RouteResolved {
            return Err(invalid(OP, id, i.state, "call resolve_route first and wait for ROUTE_RESOLVED"));
        }
        let ud = i.qp_type == QpType::Ud;
        let (max, message) =
            if ud { (SIDR_REQ_USER_PRIVATE_DATA_LEN_MAX, "SIDR_REQ") } else { (REQ_USER_PRIVATE_DATA_LEN_MAX, "REQ") };
        if param.private_data.len() > max {
            return Err(CmError::PrivateDataTooLong { op: OP, message, len: param.private_data.len(), max });
        }
        let comm_id = self.alloc_comm_id(OP)?;
        self.by_comm_id.insert(comm_id, id);
        let tid = self.form_tid(comm_id);
        let required = self.get(OP, id)?.policy.required;
        let exchange = (required && !ud).then(|| self.new_exchange());
        let ack_timeout = cm_ack_timeout(self.config.ca_ack_delay, self.config.packet_life_time);
        let port_mtu = self.config.port_mtu;
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
        let (Some(local), Some(peer), Some(route)) = (i.local, i.peer, i.route) else {
            return Err(invalid(OP, id, i.state, "call resolve_route first"));
        };
        i.local_comm_id = comm_id;
        i.tid = tid;
        i.auth = exchange;
        i.service_id = service_id(i.ps, peer.port());
        if let Some(psn) = param.start_psn {
            i.seq_num = psn & Psn::MAX.value();
        }
        i.conn = Conn {
            remote_known: false,
            remote_qpn: 0,
            remote_psn: 0,
            local_qpn: param.qp_num & Qpn::MAX.value(),
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            retry_count: param.retry_count & 7,
            rnr_retry: 7,
            mtu: Some(port_mtu),
            ack_timeout,
            flow_control: param.flow_control,
            srq: param.srq,
            qkey: param.qkey,
            exchanged: true,
        };
        let mut private = [0u8; 216];
        // The addresses are of one family: resolve_addr checked it.
        if let Some(hdr) = CmaHeaderRepr::new(local.port(), local.ip(), peer.ip()) {
            let _ = hdr.emit(&mut private);
        }
        private[CMA_HEADER_LEN..CMA_HEADER_LEN + param.private_data.len()].copy_from_slice(&param.private_data);
        let (mad, what, state) = if ud {
            let msg = CmMessage::SidrReq(SidrReqRepr {
                request_id: comm_id,
                pkey: PKey::DEFAULT,
                service_id: i.service_id,
                private_data: &private[..CMA_HEADER_LEN + SIDR_REQ_USER_PRIVATE_DATA_LEN_MAX],
            });
            (emit_mad(&msg, tid), Sent::SidrReq, State::SidrReqSent)
        } else {
            let req =
                self_req(&self.config, i, &route, &private[..CMA_HEADER_LEN + REQ_USER_PRIVATE_DATA_LEN_MAX], param);
            (emit_mad(&CmMessage::Req(req), tid), Sent::Req, State::ReqSent)
        };
        i.state = state;
        i.pending = Some(Pending { mad: Box::new(mad), retries_left: i.cm_retries, what });
        i.deadline = Some(now + ib_timeout(i.cm_timeout));
        self.out.send(route.src, route.dst, mad);
        Ok(())
    }

    /// `rdma_accept`: answers the `CONNECT_REQUEST` on `id` with a REP (its private data
    /// at most 196 bytes), or for UD with a SIDR_REP carrying `param.qp_num` and the Q_Key
    /// (`RDMA_UDP_QKEY` for the UDP port space, else `param.qkey`). The RC/UC passive side
    /// gets `ESTABLISHED` when the RTU arrives.
    pub fn accept(&mut self, now: Instant, id: CmId, param: &ConnParam) -> Result<(), CmError> {
        const OP: &str = "accept";
        self.request_taken(id);
        let i = self.get(OP, id)?;
        match i.state {
            State::ReqRcvd => {
                check_len(OP, "REP", &param.private_data, REP_PRIVATE_DATA_LEN)?;
                let target_ack_delay = self.config.ca_ack_delay;
                let guid = self.config.node_guid;
                let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
                if let Some(psn) = param.start_psn {
                    i.seq_num = psn & Psn::MAX.value();
                }
                i.conn.local_qpn = param.qp_num & Qpn::MAX.value();
                i.conn.responder_resources = param.responder_resources;
                i.conn.initiator_depth = param.initiator_depth;
                i.conn.srq = param.srq;
                i.conn.flow_control = param.flow_control;
                // cm.c: cm_format_rep: an XRC TGT QP's number goes in the local EE context
                // number, which the XRC INI side reads it from; its SRQ bit is set.
                let xrc = i.qp_type == QpType::XrcTgt;
                let qpn = Qpn::from_u24_truncating(i.conn.local_qpn);
                let rep = RepRepr {
                    local_comm_id: i.local_comm_id,
                    remote_comm_id: i.remote_comm_id,
                    local_qkey: QKey(0),
                    local_qpn: if xrc { Qpn::from_u24_truncating(0) } else { qpn },
                    vendor_id: 0,
                    local_eecn: if xrc { qpn.value() } else { 0 },
                    starting_psn: Psn::from_u24_truncating(i.seq_num),
                    responder_resources: param.responder_resources,
                    initiator_depth: if xrc { 0 } else { param.initiator_depth },
                    target_ack_delay,
                    failover_accepted: 0,
                    end_to_end_flow_control: !xrc && param.flow_control,
                    rnr_retry_count: param.rnr_retry_count & 7,
                    srq: xrc || param.srq,
                    local_ca_guid: guid,
                    private_data: &param.private_data,
                };
                let mad = emit_mad(&CmMessage::Rep(rep), i.tid);
                i.state = State::RepSent;
                i.pending = Some(Pending { mad: Box::new(mad), retries_left: i.cm_retries, what: Sent::Rep });
                i.deadline = Some(now + ib_timeout(i.cm_timeout));
                i.last_reply = Some(Box::new(mad));
                i.listener = None;
                let route = i.route.ok_or(CmError::NoSuchId { op: OP, id })?;
                self.out.send(route.src, route.dst, mad);
                Ok(())
            }
            State::SidrReqRcvd => {
                check_len(OP, "SIDR_REP", &param.private_data, SIDR_REP_PRIVATE_DATA_LEN)?;
                let qkey = if i.ps == PortSpace::UDP { QKey::RDMA_CM_UDP.0 } else { param.qkey };
                let mad = self.sidr_rep_mad(i, SidrStatus::SUCCESS, param.qp_num, qkey, &param.private_data);
                let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
                i.conn.local_qpn = param.qp_num & Qpn::MAX.value();
                i.conn.qkey = qkey;
                i.state = State::SidrDone;
                i.listener = None;
                // Kept for a repeat of the SIDR_REQ, whose sender did not get it.
                i.last_reply = Some(Box::new(mad));
                let route = i.route.ok_or(CmError::NoSuchId { op: OP, id })?;
                self.out.send(route.src, route.dst, mad);
                Ok(())
            }
            s => Err(invalid(OP, id, s, "accept the ID of a CONNECT_REQUEST event, once")),
        }
    }

    /// `rdma_reject`: refuses the `CONNECT_REQUEST` on `id` with a REJ of reason 28
    /// (consumer defined) and `private_data` (at most 148 bytes), or for UD a SIDR_REP with
    /// status REJECT (at most 136 bytes). The active side may also reject a REP it got.
    pub fn reject(&mut self, now: Instant, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        const OP: &str = "reject";
        self.request_taken(id);
        let _ = now;
        let i = self.get(OP, id)?;
        let mad = match i.state {
            State::ReqRcvd | State::RepRcvd => {
                check_len(OP, "REJ", private_data, REJ_PRIVATE_DATA_LEN)?;
                let msg = if i.state == State::ReqRcvd { CmMsgResponse::REQ } else { CmMsgResponse::REP };
                self.rej_mad(i, RejReason::CONSUMER_DEFINED, msg, &[], private_data)
            }
            State::SidrReqRcvd => {
                check_len(OP, "SIDR_REP", private_data, SIDR_REP_PRIVATE_DATA_LEN)?;
                self.sidr_rep_mad(i, SidrStatus::REJECT, 0, 0, private_data)
            }
            s => return Err(invalid(OP, id, s, "reject a CONNECT_REQUEST (or a CONNECT_RESPONSE), once")),
        };
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
        i.state = State::Closed;
        i.pending = None;
        i.deadline = None;
        i.listener = None;
        // Kept for a repeat of the REQ, whose sender did not get it (on_req).
        i.last_reply = Some(Box::new(mad));
        let route = i.route.ok_or(CmError::NoSuchId { op: OP, id })?;
        self.out.send(route.src, route.dst, mad);
        Ok(())
    }

    /// `rdma_establish`, active side: after `CONNECT_RESPONSE` the runtime moved its QP to
    /// RTR and RTS; this sends the RTU and raises `ESTABLISHED`.
    pub fn establish(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        const OP: &str = "establish";
        let _ = now;
        let i = self.get(OP, id)?;
        if i.state != State::RepRcvd {
            return Err(invalid(OP, id, i.state, "call establish once, after CONNECT_RESPONSE"));
        }
        let rtu = RtuRepr { local_comm_id: i.local_comm_id, remote_comm_id: i.remote_comm_id, private_data: &[] };
        let mad = emit_mad(&CmMessage::Rtu(rtu), i.tid);
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
        i.state = State::Established;
        i.last_reply = Some(Box::new(mad));
        let route = i.route.ok_or(CmError::NoSuchId { op: OP, id })?;
        let peer = i.peer_param.clone();
        self.out.send(route.src, route.dst, mad);
        self.out.established(id, peer);
        Ok(())
    }

    /// `ib_cm_notify(IB_EVENT_COMM_EST)`, passive side: the QP received its first packet
    /// while the RTU is still missing (lost, or overtaken). Establishes the connection as
    /// an RTU would (`cm.c: cm_establish`). A no-op in any other state, so the runtime may
    /// call it on every communication-established event.
    pub fn notify(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        let _ = now;
        let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: "notify", id })?;
        if i.state == State::RepSent {
            i.state = State::Established;
            i.pending = None;
            i.deadline = None;
            self.out.established(id, i.peer_param.clone());
        }
        Ok(())
    }

    /// `rdma_disconnect`: sends a DREQ (established) or the DREP (after a DREQ came in).
    /// The runtime moves the QP to ERR first. Both sides then get `DISCONNECTED` and,
    /// [`CmConfig::timewait`] later, `TIMEWAIT_EXIT`.
    pub fn disconnect(&mut self, now: Instant, id: CmId) -> Result<(), CmError> {
        const OP: &str = "disconnect";
        let i = self.get(OP, id)?;
        let route = i.route;
        match i.state {
            State::Established => {
                let mad = self.dreq_mad(i);
                let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
                i.state = State::DreqSent;
                i.pending = Some(Pending { mad: Box::new(mad), retries_left: i.cm_retries, what: Sent::Dreq });
                i.deadline = Some(now + ib_timeout(i.cm_timeout));
                if let Some(r) = route {
                    self.out.send(r.src, r.dst, mad);
                }
                Ok(())
            }
            // cma.c's rdma_disconnect of a connection a REJ ended: the QP to ERR (it is
            // there already), no DREQ (cm.c refuses one in timewait), and no error.
            State::Timewait | State::Closed if i.rejected_established => Ok(()),
            State::DreqRcvd => {
                let mad = Self::drep_mad(i);
                let timewait = self.config.timewait;
                let i = self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op: OP, id })?;
                enter_timewait(i, now, timewait, mad);
                if let Some(r) = route {
                    self.out.send(r.src, r.dst, mad);
                }
                Ok(())
            }
            s => Err(invalid(OP, id, s, "disconnect an established connection, once")),
        }
    }

    // ---------------------------------------------------------------- getters

    /// `rdma_init_qp_attr`: the attributes and mask that move the ID's QP to `target`
    /// (INIT, RTR or RTS), from what the CM exchange settled:
    ///
    /// - INIT: P_Key index 0, port 1, and for RC/UC the access flags of
    ///   `cm.c: cm_init_qp_init_attr` (REMOTE_WRITE, plus REMOTE_READ and REMOTE_ATOMIC when
    ///   our responder resources are not 0; none before the exchange starts, as
    ///   `cma_ib_init_qp_attr`), for UD the Q_Key.
    /// - RTR: the AV (peer's GID, our GID index, hop limit, traffic class, flow label),
    ///   path MTU, the peer's QPN, `rq_psn` = our starting PSN, and for RC
    ///   `max_dest_rd_atomic` and `min_rnr_timer` 0. UD: the state only.
    /// - RTS: `sq_psn` = the peer's starting PSN, and for RC the ACK timeout, retry count,
    ///   RNR retry count and `max_rd_atomic`. UD: `sq_psn` 0.
    ///
    /// As librdmacm does (`ucma_modify_qp_rtr`), apply INIT again (INIT→INIT) just before
    /// RTR: the access flags are only known once the exchange has started.
    pub fn qp_attr(&self, id: CmId, target: QpState) -> Result<(QpAttr, AttrMask), CmError> {
        const OP: &str = "qp_attr";
        let i = self.get(OP, id)?;
        let mut a = QpAttr { qp_state: target, ..QpAttr::default() };
        // The responder's attributes are RC's and XRC TGT's, the requester's RC's and XRC INI's
        // (cm.c: cm_init_qp_rtr_attr, cm_init_qp_rts_attr).
        let responder = matches!(i.qp_type, QpType::Rc | QpType::XrcTgt);
        let requester = matches!(i.qp_type, QpType::Rc | QpType::XrcIni);
        let ud = matches!(i.qp_type, QpType::Ud);
        match target {
            QpState::Init => {
                a.pkey_index = 0;
                a.port_num = 1;
                let mut mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
                if ud {
                    a.qkey = QKey(if i.ps == PortSpace::UDP { QKey::RDMA_CM_UDP.0 } else { i.conn.qkey });
                    mask |= AttrMask::QKEY;
                } else {
                    a.qp_access_flags = if !i.conn.exchanged {
                        Access(0)
                    } else if i.conn.responder_resources > 0 && responder {
                        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
                    } else {
                        Access::REMOTE_WRITE
                    };
                    mask |= AttrMask::ACCESS_FLAGS;
                }
                Ok((a, mask))
            }
            QpState::Rtr if ud => Ok((a, AttrMask::STATE)),
            QpState::Rts if ud => {
                a.sq_psn = 0;
                Ok((a, AttrMask::STATE | AttrMask::SQ_PSN))
            }
            QpState::Rtr => {
                let route = i.route.filter(|_| i.conn.remote_known).ok_or_else(|| {
                    invalid(OP, id, i.state, "RTR needs the peer's QP: wait for CONNECT_REQUEST or CONNECT_RESPONSE")
                })?;
                a.ah_attr = Some(av(&route));
                a.path_mtu = i.conn.mtu.unwrap_or(self.config.port_mtu);
                a.dest_qp_num = i.conn.remote_qpn;
                a.rq_psn = i.seq_num;
                let mut mask =
                    AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
                if responder {
                    a.max_dest_rd_atomic = i.conn.responder_resources;
                    a.min_rnr_timer = 0;
                    mask |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
                }
                Ok((a, mask))
            }
            QpState::Rts => {
                if !i.conn.remote_known {
                    return Err(invalid(
                        OP,
                        id,
                        i.state,
                        "RTS needs the peer's PSN: wait for CONNECT_REQUEST or CONNECT_RESPONSE",
                    ));
                }
                a.sq_psn = i.conn.remote_psn;
                let mut mask = AttrMask::STATE | AttrMask::SQ_PSN;
                if requester {
                    a.timeout = i.ack_timeout.unwrap_or(i.conn.ack_timeout);
                    a.retry_cnt = i.conn.retry_count;
                    a.rnr_retry = i.conn.rnr_retry;
                    a.max_rd_atomic = i.conn.initiator_depth;
                    mask |= AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
                } else if i.qp_type == QpType::XrcTgt {
                    // It sends nothing but responses; its table row wants a timeout anyway.
                    a.timeout = i.ack_timeout.unwrap_or(i.conn.ack_timeout);
                    mask |= AttrMask::TIMEOUT;
                }
                Ok((a, mask))
            }
            _ => Err(CmError::NoAttrsForState { id, target }),
        }
    }

    /// `rdma_get_local_addr`: the bound or resolved local address.
    pub fn local_addr(&self, id: CmId) -> Option<SocketAddr> {
        self.ids.get(&id)?.local
    }

    /// `rdma_get_peer_addr`: the peer's address (resolved, or from the request's header).
    pub fn peer_addr(&self, id: CmId) -> Option<SocketAddr> {
        self.ids.get(&id)?.peer
    }

    /// The ID's local comm ID (or SIDR request ID), once it has one.
    pub fn local_comm_id(&self, id: CmId) -> Option<u32> {
        self.ids.get(&id).map(|i| i.local_comm_id).filter(|&c| c != 0)
    }

    /// The service ID a listening ID answers REQs and SIDR_REQs for: the runtime
    /// registers it with the host's steering program so that they reach this process.
    /// `None` unless the ID listens.
    pub fn listen_service_id(&self, id: CmId) -> Option<u64> {
        let i = self.ids.get(&id).filter(|i| i.state == State::Listen)?;
        Some(service_id(i.ps, i.local?.port()))
    }

    /// The type of QP the ID was created for.
    pub fn qp_type(&self, id: CmId) -> Option<QpType> {
        self.ids.get(&id).map(|i| i.qp_type)
    }

    /// What `id` is: its state, addresses and the exchange's numbers.
    pub fn id_info(&self, id: CmId) -> Option<CmIdInfo> {
        let i = self.ids.get(&id)?;
        Some(CmIdInfo {
            id,
            ps: i.ps,
            qp_type: i.qp_type,
            state: i.state,
            local: i.local,
            peer: i.peer,
            passive: i.passive,
            listener: i.listener,
            // A listener's is its port's, computed when a REQ asks for it.
            service_id: match (i.state, i.local) {
                (State::Listen, Some(local)) => service_id(i.ps, local.port()),
                _ => i.service_id,
            },
            local_comm_id: i.local_comm_id,
            remote_comm_id: i.remote_comm_id,
            remote_qpn: i.conn.remote_known.then_some(i.conn.remote_qpn),
        })
    }

    /// How many IDs are alive.
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    /// Every ID alive, in creation order.
    pub fn ids(&self) -> Vec<CmId> {
        self.ids.keys().copied().collect()
    }

    /// What the CM has done so far.
    pub fn counters(&self) -> CmCounters {
        self.out.counters
    }

    // ---------------------------------------------------------------- outputs

    /// The next MAD to send, if any.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<CmTransmit> {
        let mut t = self.out.transmits.pop_front()?;
        t.offer = self.offer_for(&t.mad);
        t.seal = self.seal_for(&t.mad);
        Some(t)
    }

    /// The next event, if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.out.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) wants to be called: the earliest
    /// retransmission or timewait end. `None` when nothing waits.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ids.values().filter_map(|i| i.deadline).min()
    }

    // ---------------------------------------------------------------- inputs

    /// Resends, gives up on, or ends timewait for, every ID whose deadline is `now` or
    /// earlier. A REQ, REP, DREQ or SIDR_REQ is resent up to [`CmConfig::max_retries`]
    /// times, 4.096 µs · 2^[`response_timeout`](CmConfig::response_timeout) apart (for a
    /// connection made for a peer's REQ: the REQ's response timeout and retries); then
    /// an unanswered REQ or SIDR_REQ raises `UNREACHABLE`, an unanswered REP also
    /// `UNREACHABLE` (`cma.c` maps `IB_CM_REP_ERROR` so), and an unanswered DREQ
    /// `DISCONNECTED` with status `TimedOut`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<CmId> =
            self.ids.iter().filter(|(_, i)| i.deadline.is_some_and(|d| d <= now)).map(|(k, _)| *k).collect();
        let timewait = self.config.timewait;
        for id in due {
            let Some(i) = self.ids.get_mut(&id) else { continue };
            if i.state == State::Timewait {
                i.state = State::Closed;
                i.deadline = None;
                if !i.rejected_established {
                    self.out.event(id, CmEventKind::TimewaitExit, CmStatus::Ok);
                }
                continue;
            }
            let Some(p) = i.pending.as_mut() else {
                i.deadline = None;
                continue;
            };
            let Some(route) = i.route else {
                // Unreachable: nothing is pending without a route. Never spin on it.
                i.deadline = None;
                continue;
            };
            if p.retries_left > 0 {
                p.retries_left -= 1;
                let mad = *p.mad;
                i.deadline = Some(now + ib_timeout(i.cm_timeout));
                self.out.counters.mads_retried += 1;
                self.out.send(route.src, route.dst, mad);
                continue;
            }
            let what = p.what;
            i.pending = None;
            i.deadline = None;
            match what {
                Sent::Req | Sent::Rep | Sent::SidrReq => {
                    i.state = State::Closed;
                    self.out.event(id, CmEventKind::Unreachable, CmStatus::TimedOut);
                }
                Sent::Dreq => {
                    // cm.c: an unanswered DREQ enters timewait; cma reports DISCONNECTED.
                    i.state = State::Timewait;
                    i.deadline = Some(now + timewait);
                    if !i.disconnected_reported {
                        i.disconnected_reported = true;
                        self.out.event(id, CmEventKind::Disconnected, CmStatus::TimedOut);
                    }
                }
            }
        }
    }

    /// One MAD received at QP1: `mad` is the UD payload (256 bytes, or 256 and an
    /// authenticated-mode offer of [`OFFER_LEN`](crate::auth::OFFER_LEN)), `src`/`dst` the IP
    /// addresses of the packet. Anything malformed, not a CM MAD of class version 2 and
    /// method SEND, or meant for no ID of ours, is counted in
    /// [`CmCounters::mads_dropped`] and otherwise ignored; this never panics.
    pub fn handle_mad(&mut self, now: Instant, src: IpAddr, dst: IpAddr, mad: &[u8]) {
        self.out.counters.mads_received += 1;
        if !self.dispatch(now, src, dst, mad) {
            self.out.counters.mads_dropped += 1;
        }
    }

    // ---------------------------------------------------------------- internals

    fn dispatch(&mut self, now: Instant, src: IpAddr, dst: IpAddr, payload: &[u8]) -> bool {
        // A MAD, or a MAD and authenticated mode's offer (crate::auth).
        let (mad, offer, seal) = match payload.split_at_checked(MAD_LEN) {
            Some((mad, [])) => (mad, None, None),
            Some((mad, rest)) if rest.len() == crate::auth::OFFER_LEN => match crate::auth::offer_in(rest) {
                Some(offer) => (mad, Some(*offer), None),
                None => return false,
            },
            Some((mad, rest)) if rest.len() == crate::auth::SEAL_LEN => match crate::auth::seal_in(rest) {
                Some(seal) => (mad, None, Some(seal)),
                None => return false,
            },
            _ => return false,
        };
        let Ok(packet) = MadPacket::new_checked(mad) else { return false };
        let Ok(repr) = MadRepr::parse(&packet) else { return false };
        let h = repr.header;
        if h.mgmt_class != MgmtClass::CM
            || h.class_version != MadHeader::CM_CLASS_VERSION
            || h.base_version != MadHeader::BASE_VERSION
            || h.method != Method::SEND
        {
            return false;
        }
        let Ok(msg) = CmMessage::parse(&repr) else { return false };
        let tid = h.transaction_id;
        match msg {
            CmMessage::Req(req) => self.on_req(now, src, dst, tid, &req, offer),
            CmMessage::Rep(rep) => self.on_rep(src, &rep, offer),
            CmMessage::Rtu(rtu) => self.on_rtu(src, rtu.remote_comm_id),
            CmMessage::Rej(rej) => self.on_rej(now, src, &rej),
            CmMessage::Mra(mra) => self.on_mra(now, src, &mra),
            CmMessage::Dreq(dreq) => {
                self.sealed_by_peer(src, dreq.remote_comm_id, mad, seal) && self.on_dreq(now, src, dst, tid, &dreq)
            }
            CmMessage::Drep(drep) => {
                self.sealed_by_peer(src, drep.remote_comm_id, mad, seal) && self.on_drep(now, src, drep.remote_comm_id)
            }
            CmMessage::SidrReq(sreq) => self.on_sidr_req(src, dst, tid, &sreq),
            CmMessage::SidrRep(srep) => self.on_sidr_rep(src, &srep),
            CmMessage::Other { .. } => false,
        }
    }

    /// The ID whose local comm ID a message names, if it came from that ID's peer.
    fn by_local(&self, comm_id: u32, src: IpAddr) -> Option<CmId> {
        if comm_id & !COMM_ID_COUNTER_MASK != self.config.comm_id_prefix & !COMM_ID_COUNTER_MASK {
            return None;
        }
        let id = *self.by_comm_id.get(&comm_id)?;
        let i = self.ids.get(&id)?;
        (i.route?.dst == src).then_some(id)
    }

    /// The passive ID made for the peer `src`'s comm ID (or, `sidr`, SIDR request ID)
    /// `remote`.
    fn by_remote(&self, src: IpAddr, remote: u32, sidr: bool) -> Option<CmId> {
        self.ids
            .iter()
            .find(|(_, i)| {
                i.passive
                    && i.remote_comm_id == remote
                    && (i.qp_type == QpType::Ud) == sidr
                    && i.route.is_some_and(|r| r.dst == src)
            })
            .map(|(k, _)| *k)
    }

    /// The listener for `(ps, port)` on `ip`, or for `(ps, port)` on any address when `ip`
    /// is `None`.
    fn listener(&self, ps: PortSpace, port: u16, ip: Option<IpAddr>) -> Option<CmId> {
        self.ids
            .iter()
            .find(|(_, i)| {
                i.state == State::Listen
                    && i.ps == ps
                    && i.local.is_some_and(|l| l.port() == port && ip.is_none_or(|ip| ips_overlap(l.ip(), ip)))
            })
            .map(|(k, _)| *k)
    }

    fn on_req(
        &mut self,
        now: Instant,
        src: IpAddr,
        dst: IpAddr,
        tid: u64,
        req: &ReqRepr<'_>,
        offer: Option<[u8; crate::auth::OFFER_LEN]>,
    ) -> bool {
        let _ = now;
        if let Some(id) = self.by_remote(src, req.local_comm_id, false) {
            // cm.c: cm_dup_req_handler. rdma_cm's delayed MRA goes out now; a REP waiting
            // for its RTU is resent at once rather than at its next retry.
            self.out.counters.duplicates += 1;
            let mra_timeout = self.config.mra_service_timeout;
            let Some(i) = self.ids.get_mut(&id) else { return true };
            let mad = match i.state {
                State::ReqRcvd => {
                    let mra = MraRepr {
                        local_comm_id: i.local_comm_id,
                        remote_comm_id: i.remote_comm_id,
                        message_mraed: CmMsgResponse::REQ,
                        service_timeout: mra_timeout,
                        private_data: &[],
                    };
                    Some(emit_mad(&CmMessage::Mra(mra), i.tid))
                }
                State::RepSent => i.last_reply.as_deref().copied(),
                // A REQ repeated after we rejected it: the REJ was lost, and its sender would
                // wait out every REQ retry (or an MRA's 69 s) to report UNREACHABLE. cm.c
                // forgets a rejected REQ and raises a new request, which the consumer
                // rejects again; the REJ goes out again here, without a second request.
                State::Closed => i.last_reply.as_deref().copied().filter(is_rej),
                // cm.c: cm_dup_req_handler answers a REQ for a connection in timewait
                // with REJ 10 (stale connection).
                State::Timewait => {
                    let rej = RejRepr {
                        local_comm_id: i.local_comm_id,
                        remote_comm_id: i.remote_comm_id,
                        message_rejected: CmMsgResponse::REQ,
                        reject_info_length: 0,
                        reason: RejReason::STALE_CONN,
                        additional_reject_info: &[],
                        private_data: &[],
                    };
                    Some(emit_mad(&CmMessage::Rej(rej), i.tid))
                }
                _ => None,
            };
            if let Some(mad) = mad {
                self.out.send(dst, src, mad);
            }
            return true;
        }
        let reject = |this: &mut Self, reason: RejReason, ari: &[u8]| {
            let rej = RejRepr {
                local_comm_id: 0,
                remote_comm_id: req.local_comm_id,
                message_rejected: CmMsgResponse::REQ,
                reject_info_length: ari.len() as u8,
                reason,
                additional_reject_info: ari,
                private_data: &[],
            };
            this.out.send(dst, src, emit_mad(&CmMessage::Rej(rej), tid));
            true
        };
        // cm.c: cm_req_handler finds the ib_cm listener by service ID alone.
        let Some((ps, port)) = split_service_id(req.service_id) else {
            return reject(self, RejReason::INVALID_SERVICE_ID, &[]);
        };
        if self.listener(ps, port, None).is_none() {
            return reject(self, RejReason::INVALID_SERVICE_ID, &[]);
        }
        // cm.c: cm_init_av_by_path fails without a local GID for the REQ's remote GID, and
        // the REJ carries that GID as ARI.
        let Some(sgid_index) = self.config.addresses.iter().position(|a| *a == dst) else {
            return reject(self, RejReason::INVALID_GID, &req.primary_path.remote_gid);
        };
        // cma.c: cma_ib_req_handler's checks (header, addresses, QP type) fail with an
        // error from the handler, which ib_cm answers with REJ 28 (consumer defined).
        let hdr = CmaHeaderRepr::parse(req.private_data).ok().filter(|h| h.cma_version == CMA_VERSION);
        let addrs = hdr.and_then(|h| Some((h, h.src_ip()?, h.dst_ip()?)));
        let Some((hdr, hsrc, hdst)) = addrs else {
            return reject(self, RejReason::CONSUMER_DEFINED, &[]);
        };
        let Some(lid) = self.listener(ps, port, Some(hdst)) else {
            return reject(self, RejReason::CONSUMER_DEFINED, &[]);
        };
        let qp_type = match (req.transport_service_type, req.extended_transport_type) {
            (TransportServiceType::RC, _) => QpType::Rc,
            (TransportServiceType::UC, _) => QpType::Uc,
            // cm_msgs.h: cm_req_get_qp_type: XRC INI at the sender, XRC TGT here.
            (TransportServiceType::EXTENDED, 1) => QpType::XrcTgt,
            _ => return reject(self, RejReason::INVALID_TRANSPORT_TYPE, &[]),
        };
        let Some(l) = self.ids.get(&lid) else { return false };
        let lqp = l.qp_type;
        let backlog = l.backlog;
        let policy = l.policy;
        let xrc = qp_type == QpType::XrcTgt || lqp == QpType::XrcTgt;
        if (ps == PortSpace::TCP || xrc) && lqp != qp_type || ps == PortSpace::UDP {
            return reject(self, RejReason::CONSUMER_DEFINED, &[]);
        }
        if l.untaken >= backlog {
            // The kernel's answer to a full backlog (ucma's -ENOMEM, ib_cm's "do not reject
            // to allow future retries"): no answer, so the requester sends its REQ again
            // (counted as dropped).
            return false;
        }
        if self.ids.len() >= self.config.max_ids {
            return reject(self, RejReason::CONSUMER_DEFINED, &[]);
        }
        if policy.required && offer.is_none() {
            // Authenticated mode: a REQ without an offer is refused (crate::auth).
            return reject(self, RejReason::CONSUMER_DEFINED, &[]);
        }
        let Ok(comm_id) = self.alloc_comm_id("handle_mad") else {
            return reject(self, RejReason::NO_RESOURCES, &[]);
        };
        let auth = match offer {
            Some(offer) => {
                let mut exchange = self.new_exchange();
                if !exchange.complete(&offer, false, (req.local_comm_id, comm_id), policy.psk.as_ref()) {
                    return reject(self, RejReason::CONSUMER_DEFINED, &[]);
                }
                Some(exchange)
            }
            None => None,
        };
        let seq_num = self.rng.next_u32() & Psn::MAX.value();
        let mut i = Id::new(ps, qp_type, seq_num, &self.config);
        i.state = State::ReqRcvd;
        i.passive = true;
        i.cm_timeout = req.local_cm_response_timeout;
        i.cm_retries = req.max_cm_retries;
        i.local = Some(self.config.socket_addr(hdst, port));
        i.peer = Some(self.config.socket_addr(hsrc, hdr.port));
        i.route = Some(Route {
            src: dst,
            dst: src,
            sgid_index: sgid_index as u8,
            flow_label: req.primary_path.flow_label,
            hop_limit: req.primary_path.hop_limit,
            traffic_class: req.primary_path.traffic_class,
        });
        i.listener = Some(lid);
        i.local_comm_id = comm_id;
        i.remote_comm_id = req.local_comm_id;
        i.tid = tid;
        i.service_id = req.service_id;
        i.auth = auth;
        i.policy = policy;
        let mtu = Mtu::from_ibv(req.path_mtu).map(|m| m.min(self.config.port_mtu));
        // cm.c: cm_format_req_event swaps the depths to our point of view.
        i.conn = Conn {
            remote_known: true,
            remote_qpn: req.local_qpn.value(),
            remote_psn: req.starting_psn.value(),
            local_qpn: 0,
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            retry_count: req.retry_count,
            rnr_retry: req.rnr_retry_count,
            mtu,
            ack_timeout: req.primary_path.local_ack_timeout,
            flow_control: req.end_to_end_flow_control,
            srq: req.srq,
            qkey: 0,
            exchanged: true,
        };
        let param = ConnParam {
            private_data: user_private_data(req.private_data).unwrap_or_default().to_vec(),
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            flow_control: req.end_to_end_flow_control,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
            qp_num: req.local_qpn.value(),
            start_psn: Some(req.starting_psn.value()),
            qkey: 0,
        };
        i.peer_param = Some(param.clone());
        i.in_backlog = true;
        let Ok(id) = self.insert(i, "handle_mad") else {
            return reject(self, RejReason::NO_RESOURCES, &[]);
        };
        self.by_comm_id.insert(comm_id, id);
        if let Some(l) = self.ids.get_mut(&lid) {
            l.untaken += 1;
        }
        self.out.event_with(CmEvent {
            id,
            kind: CmEventKind::ConnectRequest,
            status: CmStatus::Ok,
            private_data: param.private_data.clone(),
            param: Some(param),
            listen_id: Some(lid),
            ud: None,
        });
        true
    }

    fn on_rep(&mut self, src: IpAddr, rep: &RepRepr<'_>, offer: Option<[u8; crate::auth::OFFER_LEN]>) -> bool {
        let Some(id) = self.by_local(rep.remote_comm_id, src) else { return false };
        if !self.complete_exchange(id, rep.local_comm_id, offer) {
            return true;
        }
        let plt = self.config.packet_life_time;
        let Some(i) = self.ids.get_mut(&id) else { return false };
        match i.state {
            State::ReqSent => {}
            State::Established => {
                // cm.c: cm_dup_rep_handler resends the RTU.
                self.out.counters.duplicates += 1;
                if let (Some(mad), Some(r)) = (i.last_reply.as_deref().copied(), i.route) {
                    self.out.send(r.src, r.dst, mad);
                }
                return true;
            }
            State::RepRcvd => {
                self.out.counters.duplicates += 1;
                return true;
            }
            _ => return false,
        }
        i.remote_comm_id = rep.local_comm_id;
        i.pending = None;
        i.deadline = None;
        i.state = State::RepRcvd;
        // cm.c: cm_rep_handler swaps the depths; the REP's RNR retry count is ours.
        i.conn.remote_known = true;
        // cm.c: cm_rep_get_qpn: an XRC TGT QP's number is in the local EE context number.
        i.conn.remote_qpn = if i.qp_type == QpType::XrcIni { rep.local_eecn } else { rep.local_qpn.value() };
        i.conn.remote_psn = rep.starting_psn.value();
        i.conn.responder_resources = rep.initiator_depth;
        i.conn.initiator_depth = rep.responder_resources;
        i.conn.rnr_retry = rep.rnr_retry_count;
        i.conn.ack_timeout = cm_ack_timeout(rep.target_ack_delay, plt);
        let param = ConnParam {
            private_data: rep.private_data.to_vec(),
            responder_resources: rep.initiator_depth,
            initiator_depth: rep.responder_resources,
            flow_control: rep.end_to_end_flow_control,
            retry_count: i.conn.retry_count,
            rnr_retry_count: rep.rnr_retry_count,
            srq: rep.srq,
            qp_num: rep.local_qpn.value(),
            start_psn: Some(rep.starting_psn.value()),
            qkey: 0,
        };
        i.peer_param = Some(param.clone());
        self.out.event_with(CmEvent {
            id,
            kind: CmEventKind::ConnectResponse,
            status: CmStatus::Ok,
            private_data: param.private_data.clone(),
            param: Some(param),
            listen_id: None,
            ud: None,
        });
        true
    }

    fn on_rtu(&mut self, src: IpAddr, remote_comm_id: u32) -> bool {
        let Some(id) = self.by_local(remote_comm_id, src) else { return false };
        let Some(i) = self.ids.get_mut(&id) else { return false };
        if i.state != State::RepSent {
            // An RTU after notify() established the connection, or a repeated one.
            self.out.counters.duplicates += 1;
            return i.state == State::Established;
        }
        i.state = State::Established;
        i.pending = None;
        i.deadline = None;
        self.out.established(id, i.peer_param.clone());
        true
    }

    fn on_rej(&mut self, now: Instant, src: IpAddr, rej: &RejRepr<'_>) -> bool {
        // A REJ names our comm ID, unless its sender gave up on its own REQ before hearing
        // from us (reason TIMEOUT, remote comm ID 0): then it names only its own.
        let id = self
            .by_local(rej.remote_comm_id, src)
            .or_else(|| (rej.remote_comm_id == 0).then(|| self.by_remote(src, rej.local_comm_id, false)).flatten());
        let Some(id) = id else { return false };
        let timewait = self.config.timewait;
        let Some(i) = self.ids.get_mut(&id) else { return false };
        if i.state == State::Established {
            // cm.c: cm_rej_handler takes a REJ while established (no path migration under
            // way) and enters timewait; cma.c reports REJECTED and moves the QP to ERR. The
            // peer gave up on the connection: it destroyed its ID before our RTU reached it
            // (a lost RTU), say, which sends a REJ where the connection had been.
            i.state = State::Timewait;
            i.pending = None;
            i.deadline = Some(now + timewait);
            i.rejected_established = true;
            self.report_rejected(id, rej);
            return true;
        }
        if !matches!(i.state, State::ReqSent | State::RepRcvd | State::ReqRcvd | State::RepSent) {
            return false;
        }
        // Nobody listens yet on this very host: send the REQ again shortly (the pending
        // REQ, resent by handle_timeout at the deadline) instead of reporting REJECTED.
        let same_host = i.route.is_some_and(|r| self.config.addresses.contains(&r.dst));
        if i.state == State::ReqSent
            && rej.reason == RejReason::INVALID_SERVICE_ID
            && same_host
            && i.same_host_rejs < self.config.same_host_rej_retries
            && i.pending.as_ref().is_some_and(|p| p.what == Sent::Req)
        {
            i.deadline = Some(now + Duration::from_millis(1 << i.same_host_rejs));
            i.same_host_rejs += 1;
            if let Some(p) = i.pending.as_mut() {
                // This resend is not one of the REQ's timeout retries.
                p.retries_left = p.retries_left.saturating_add(1);
            }
            return true;
        }
        i.state = State::Closed;
        i.pending = None;
        i.deadline = None;
        i.listener = None;
        self.report_rejected(id, rej);
        true
    }

    /// Raises `REJECTED` on `id` with `rej`'s reason and private data.
    fn report_rejected(&mut self, id: CmId, rej: &RejRepr<'_>) {
        let mut event = CmEvent {
            id,
            kind: CmEventKind::Rejected,
            status: CmStatus::Rejected(rej.reason),
            private_data: rej.private_data.to_vec(),
            param: None,
            listen_id: None,
            ud: None,
        };
        event.private_data.resize(REJ_PRIVATE_DATA_LEN, 0);
        self.out.event_with(event);
    }

    fn on_mra(&mut self, now: Instant, src: IpAddr, mra: &MraRepr<'_>) -> bool {
        let Some(id) = self.by_local(mra.remote_comm_id, src) else { return false };
        let Some(i) = self.ids.get_mut(&id) else { return false };
        let expected = match i.state {
            State::ReqSent => CmMsgResponse::REQ,
            State::RepSent => CmMsgResponse::REP,
            _ => return false,
        };
        if mra.message_mraed != expected || i.pending.is_none() {
            return false;
        }
        if i.mra_received {
            self.out.counters.duplicates += 1;
            return true;
        }
        // cm.c: cm_mra_handler waits conv(service timeout) + conv(packet lifetime) more.
        i.mra_received = true;
        i.deadline = Some(now + ib_timeout(mra.service_timeout) + ib_timeout(i.conn.ack_timeout));
        true
    }

    fn on_dreq(&mut self, now: Instant, src: IpAddr, dst: IpAddr, tid: u64, dreq: &DreqRepr<'_>) -> bool {
        let Some(id) = self.by_local(dreq.remote_comm_id, src) else {
            return self.drep_unknown(src, dst, tid, dreq);
        };
        let timewait = self.config.timewait;
        let Some(i) = self.ids.get_mut(&id) else { return false };
        // cm.c: cm_dreq_handler drops a DREQ for another QP.
        if dreq.remote_qpn.value() != i.conn.local_qpn || dreq.local_comm_id != i.remote_comm_id {
            return false;
        }
        let route = i.route;
        match i.state {
            State::Established | State::RepSent | State::RepRcvd => {
                i.dreq_tid = tid;
                i.state = State::DreqRcvd;
                i.pending = None;
                i.deadline = None;
                i.disconnected_reported = true;
                self.out.event(id, CmEventKind::Disconnected, CmStatus::Ok);
            }
            State::DreqSent => {
                // Both sides disconnected at once. Our user asked to disconnect already, so
                // the DREP goes out now rather than at destroy_id (`rdma_disconnect`
                // would send it on a second call).
                i.dreq_tid = tid;
                let mad = Self::drep_mad(i);
                enter_timewait(i, now, timewait, mad);
                if !i.disconnected_reported {
                    i.disconnected_reported = true;
                    self.out.event(id, CmEventKind::Disconnected, CmStatus::Ok);
                }
                if let Some(r) = route {
                    self.out.send(r.src, r.dst, mad);
                }
            }
            State::Timewait => {
                // cm.c: a repeated DREQ is answered with the DREP again.
                self.out.counters.duplicates += 1;
                if let (Some(mad), Some(r)) = (i.last_reply.as_deref().copied(), route) {
                    self.out.send(r.src, r.dst, mad);
                }
            }
            State::DreqRcvd => self.out.counters.duplicates += 1,
            _ => return false,
        }
        true
    }

    /// A DREQ for a comm ID of ours that no ID holds (destroyed, or an earlier process's on
    /// this host slot: one that died connected) gets a DREP, as cm.c's cm_dreq_handler answers
    /// one it cannot match (cm_issue_drep). Unanswered, the peer keeps the connection through
    /// every DREQ retry, and Linux meanwhile rejects a new REQ from the same QPN as a stale
    /// connection (REJ reason 10): a restarted process whose QPNs start where its
    /// predecessor's did could not connect to that peer for a minute. A comm ID of another
    /// member's prefix (a MAD the steering could not place) is left alone.
    fn drep_unknown(&mut self, src: IpAddr, dst: IpAddr, tid: u64, dreq: &DreqRepr<'_>) -> bool {
        if dreq.remote_comm_id & !COMM_ID_COUNTER_MASK != self.config.comm_id_prefix & !COMM_ID_COUNTER_MASK {
            return false;
        }
        let drep =
            DrepRepr { local_comm_id: dreq.remote_comm_id, remote_comm_id: dreq.local_comm_id, private_data: &[] };
        // cm.c counts it as a duplicate DREQ.
        self.out.counters.duplicates += 1;
        self.out.send(dst, src, emit_mad(&CmMessage::Drep(drep), tid));
        true
    }

    fn on_drep(&mut self, now: Instant, src: IpAddr, remote_comm_id: u32) -> bool {
        let Some(id) = self.by_local(remote_comm_id, src) else { return false };
        let timewait = self.config.timewait;
        let Some(i) = self.ids.get_mut(&id) else { return false };
        if i.state != State::DreqSent {
            self.out.counters.duplicates += 1;
            return i.state == State::Timewait;
        }
        i.pending = None;
        i.state = State::Timewait;
        i.deadline = Some(now + timewait);
        if !i.disconnected_reported {
            i.disconnected_reported = true;
            self.out.event(id, CmEventKind::Disconnected, CmStatus::Ok);
        }
        true
    }

    fn on_sidr_req(&mut self, src: IpAddr, dst: IpAddr, tid: u64, sreq: &SidrReqRepr<'_>) -> bool {
        if let Some(id) = self.by_remote(src, sreq.request_id, true) {
            // cm.c: cm_sidr_req_handler drops a request it is still handling. One this side
            // answered comes again when the answer was lost: the answer goes again (cm.c
            // would take it for a new request, once its ID is out of the remote SIDR table,
            // and raise a second CONNECT_REQUEST for the one connect; dropped as while it is
            // handled, every retry of the requester would go unanswered until it gives up).
            self.out.counters.duplicates += 1;
            if let Some(i) = self.ids.get(&id)
                && let (Some(mad), Some(r)) = (i.last_reply.as_deref().copied(), i.route)
            {
                self.out.send(r.src, r.dst, mad);
            }
            return true;
        }
        let answer = |this: &mut Self, status: SidrStatus| {
            let rep = SidrRepRepr {
                request_id: sreq.request_id,
                status,
                additional_info_length: 0,
                vendor_id: 0,
                qpn: Qpn::default(),
                service_id: sreq.service_id,
                qkey: QKey(0),
                additional_info: &[],
                private_data: &[],
            };
            this.out.send(dst, src, emit_mad(&CmMessage::SidrRep(rep), tid));
            true
        };
        let Some((ps, port)) = split_service_id(sreq.service_id) else {
            return answer(self, SidrStatus::UNSUPPORTED);
        };
        if self.listener(ps, port, None).is_none() {
            return answer(self, SidrStatus::UNSUPPORTED);
        }
        let hdr = CmaHeaderRepr::parse(sreq.private_data).ok().filter(|h| h.cma_version == CMA_VERSION);
        let addrs = hdr.and_then(|h| Some((h, h.src_ip()?, h.dst_ip()?)));
        let sgid_index = self.config.addresses.iter().position(|a| *a == dst);
        let (Some((hdr, hsrc, hdst)), Some(sgid_index)) = (addrs, sgid_index) else {
            return answer(self, SidrStatus::REJECT);
        };
        let Some(lid) = self.listener(ps, port, Some(hdst)) else { return answer(self, SidrStatus::REJECT) };
        let Some(l) = self.ids.get(&lid) else { return false };
        let backlog = l.backlog;
        if l.qp_type != QpType::Ud {
            return answer(self, SidrStatus::REJECT);
        }
        if l.untaken >= backlog || self.ids.len() >= self.config.max_ids {
            // ib_cm's answer when the listener refuses a SIDR_REQ (cm_destroy_id in
            // SIDR_REQ_RCVD).
            return answer(self, SidrStatus::REJECT);
        }
        let seq_num = self.rng.next_u32() & Psn::MAX.value();
        let mut i = Id::new(ps, QpType::Ud, seq_num, &self.config);
        i.state = State::SidrReqRcvd;
        i.passive = true;
        i.local = Some(self.config.socket_addr(hdst, port));
        i.peer = Some(self.config.socket_addr(hsrc, hdr.port));
        i.route = Some(Route {
            src: dst,
            dst: src,
            sgid_index: sgid_index as u8,
            flow_label: rdma_flow_label(hdr.port, port),
            hop_limit: self.config.hop_limit,
            traffic_class: self.config.traffic_class,
        });
        i.listener = Some(lid);
        i.remote_comm_id = sreq.request_id;
        i.tid = tid;
        i.service_id = sreq.service_id;
        let private_data = user_private_data(sreq.private_data).unwrap_or_default().to_vec();
        i.in_backlog = true;
        let Ok(id) = self.insert(i, "handle_mad") else { return answer(self, SidrStatus::NO_QP) };
        if let Some(l) = self.ids.get_mut(&lid) {
            l.untaken += 1;
        }
        self.out.event_with(CmEvent {
            id,
            kind: CmEventKind::ConnectRequest,
            status: CmStatus::Ok,
            private_data: private_data.clone(),
            param: Some(ConnParam { private_data, ..ConnParam::default() }),
            listen_id: Some(lid),
            ud: None,
        });
        true
    }

    fn on_sidr_rep(&mut self, src: IpAddr, srep: &SidrRepRepr<'_>) -> bool {
        let Some(id) = self.by_local(srep.request_id, src) else { return false };
        let Some(i) = self.ids.get_mut(&id) else { return false };
        if i.state != State::SidrReqSent {
            self.out.counters.duplicates += 1;
            return i.state == State::SidrDone;
        }
        i.pending = None;
        i.deadline = None;
        let (kind, status, ud) = if srep.status != SidrStatus::SUCCESS {
            i.state = State::Closed;
            (CmEventKind::Unreachable, CmStatus::Sidr(srep.status), None)
        } else if i.ps == PortSpace::UDP && srep.qkey != QKey::RDMA_CM_UDP {
            // cma.c: cma_set_qkey refuses another Q_Key for the UDP port space.
            i.state = State::Closed;
            (CmEventKind::Unreachable, CmStatus::InvalidQkey, None)
        } else {
            i.state = State::SidrDone;
            i.conn.remote_known = true;
            i.conn.remote_qpn = srep.qpn.value();
            let ah = i.route.as_ref().map(av);
            (
                CmEventKind::Established,
                CmStatus::Ok,
                ah.map(|ah| UdParam { remote_qpn: srep.qpn.value(), qkey: srep.qkey.0, ah }),
            )
        };
        self.out.event_with(CmEvent {
            id,
            kind,
            status,
            private_data: srep.private_data.to_vec(),
            param: None,
            listen_id: None,
            ud,
        });
        true
    }

    fn get(&self, op: &'static str, id: CmId) -> Result<&Id, CmError> {
        self.ids.get(&id).ok_or(CmError::NoSuchId { op, id })
    }

    fn get_mut(&mut self, op: &'static str, id: CmId) -> Result<&mut Id, CmError> {
        self.ids.get_mut(&id).ok_or(CmError::NoSuchId { op, id })
    }

    fn insert(&mut self, i: Id, op: &'static str) -> Result<CmId, CmError> {
        if self.ids.len() >= self.config.max_ids {
            return Err(CmError::TooManyIds { op, max: self.config.max_ids });
        }
        let mut handle = self.next_handle;
        while self.ids.contains_key(&CmId(handle)) || handle == 0 {
            handle = handle.wrapping_add(1);
        }
        self.next_handle = handle.wrapping_add(1);
        self.ids.insert(CmId(handle), i);
        Ok(CmId(handle))
    }

    /// The next free `prefix | counter`, counter in 1..2^21, cyclic from a random start.
    fn alloc_comm_id(&mut self, op: &'static str) -> Result<u32, CmError> {
        for _ in 0..COMM_ID_COUNTER_MASK {
            self.counter = if self.counter >= COMM_ID_COUNTER_MASK { 1 } else { self.counter + 1 };
            let comm_id = (self.config.comm_id_prefix & !COMM_ID_COUNTER_MASK) | self.counter;
            if !self.by_comm_id.contains_key(&comm_id) {
                debug_assert!(comm_id & COMM_ID_COUNTER_MASK != 0);
                return Ok(comm_id);
            }
        }
        Err(CmError::CommIdsExhausted { op })
    }

    /// `cm.c: cm_form_tid`: the MAD agent's high half, and the comm ID as the kernel's
    /// little-endian host order puts it.
    fn form_tid(&self, comm_id: u32) -> u64 {
        (u64::from(self.hi_tid) << 32) | u64::from(comm_id.swap_bytes())
    }

    fn port_taken(&self, ps: PortSpace, ip: IpAddr, port: u16) -> bool {
        self.ids
            .values()
            .any(|i| i.bound && i.ps == ps && i.local.is_some_and(|l| l.port() == port && ips_overlap(l.ip(), ip)))
    }

    fn ephemeral_port(&mut self, ps: PortSpace, ip: IpAddr) -> Option<u16> {
        let (lo, hi) = self.config.ephemeral_ports;
        let (lo, hi) = (lo.max(1), hi.max(lo.max(1)));
        let span = u32::from(hi - lo) + 1;
        let start = self.rng.next_u32() % span;
        (0..span).map(|k| lo + ((start + k) % span) as u16).find(|&p| !self.port_taken(ps, ip, p))
    }

    /// Our half of a new authenticated-mode exchange.
    fn new_exchange(&mut self) -> crate::auth::Exchange {
        let mut secret = [0; 32];
        self.key_rng.fill_bytes(&mut secret);
        crate::auth::Exchange::new(secret)
    }

    /// The offer to send after `mad`: an authenticated ID's REQ or REP carries its own.
    fn offer_for(&self, mad: &[u8; MAD_LEN]) -> Option<[u8; crate::auth::OFFER_LEN]> {
        Some(self.exchange_sending(mad, [AttributeId::REQ, AttributeId::REP])?.offer)
    }

    /// The seal to send after `mad`: an authenticated connection's DREQ or DREP carries one.
    fn seal_for(&self, mad: &[u8; MAD_LEN]) -> Option<[u8; crate::auth::SEAL_LEN]> {
        self.exchange_sending(mad, [AttributeId::DREQ, AttributeId::DREP])?.seal(mad)
    }

    /// The authenticated-mode exchange of the ID that sends `mad`, if it is a message of
    /// one of `kinds` (each begins with the sender's local comm ID).
    fn exchange_sending(&self, mad: &[u8; MAD_LEN], kinds: [AttributeId; 2]) -> Option<&crate::auth::Exchange> {
        let packet = MadPacket::new_unchecked(&mad[..]);
        if !kinds.contains(&packet.attribute_id()) {
            return None;
        }
        let data = packet.data();
        let local_comm_id = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
        let id = self.by_comm_id.get(&local_comm_id)?;
        self.ids.get(id)?.auth.as_ref()
    }

    /// Whether a DREQ or DREP for our comm ID `local` may be acted on: always for a
    /// connection that is not authenticated (or no connection: the handlers answer that),
    /// and with a valid seal for one that is. A forged one is dropped (counted).
    fn sealed_by_peer(&self, src: IpAddr, local: u32, mad: &[u8], seal: Option<&[u8; crate::auth::SEAL_LEN]>) -> bool {
        let Some(id) = self.by_local(local, src) else { return true };
        self.ids.get(&id).and_then(|i| i.auth.as_ref()).is_none_or(|ex| ex.verify(mad, seal))
    }

    /// Active side, a REP for `id` came with `offer` (or none): for an ID in authenticated
    /// mode, derives the keys, or rejects the REP and reports `REJECTED` with
    /// [`CmStatus::NotAuthenticated`] when the peer did not answer the offer. True when the
    /// REP may be handled further.
    fn complete_exchange(
        &mut self,
        id: CmId,
        passive_comm_id: u32,
        offer: Option<[u8; crate::auth::OFFER_LEN]>,
    ) -> bool {
        let Some(i) = self.ids.get(&id) else { return true };
        let psk = i.policy.psk;
        let (State::ReqSent, Some(exchange)) = (i.state, &i.auth) else { return true };
        let mut exchange = exchange.clone();
        let local = i.local_comm_id;
        if offer.is_some_and(|o| exchange.complete(&o, true, (local, passive_comm_id), psk.as_ref())) {
            if let Some(i) = self.ids.get_mut(&id) {
                i.auth = Some(exchange);
            }
            return true;
        }
        let mut answered = i.clone();
        answered.state = State::RepRcvd;
        answered.remote_comm_id = passive_comm_id;
        let mad = self.rej_mad(&answered, RejReason::CONSUMER_DEFINED, CmMsgResponse::REP, &[], &[]);
        let Some(i) = self.ids.get_mut(&id) else { return false };
        i.state = State::Closed;
        i.pending = None;
        i.deadline = None;
        if let Some(r) = i.route {
            self.out.send(r.src, r.dst, mad);
        }
        self.out.event(id, CmEventKind::Rejected, CmStatus::NotAuthenticated);
        false
    }

    /// Authenticated mode's packet keys for `id`'s QP, once both offers are known: after
    /// `CONNECT_REQUEST` (passive) or `CONNECT_RESPONSE` (active). The runtime gives them to
    /// the QP before it moves to RTR.
    pub fn packet_keys(&self, id: CmId) -> Option<softrdma_engine::PacketKeys> {
        self.ids.get(&id)?.auth.as_ref()?.keys.clone()
    }

    fn rej_mad(&self, i: &Id, reason: RejReason, msg: CmMsgResponse, ari: &[u8], private_data: &[u8]) -> [u8; MAD_LEN] {
        // A REJ for our own REQ that nobody answered carries no remote comm ID (the capture
        // `guest-to-host-rping-cm-req.pcap` shows it).
        let remote = if i.state == State::ReqSent { 0 } else { i.remote_comm_id };
        let rej = RejRepr {
            local_comm_id: i.local_comm_id,
            remote_comm_id: remote,
            message_rejected: msg,
            reject_info_length: ari.len() as u8,
            reason,
            additional_reject_info: ari,
            private_data,
        };
        emit_mad(&CmMessage::Rej(rej), i.tid)
    }

    fn dreq_mad(&self, i: &Id) -> [u8; MAD_LEN] {
        let dreq = DreqRepr {
            local_comm_id: i.local_comm_id,
            remote_comm_id: i.remote_comm_id,
            remote_qpn: Qpn::from_u24_truncating(i.conn.remote_qpn),
            private_data: &[],
        };
        // cm.c: ib_send_cm_dreq forms a TID from the sender's own comm ID.
        emit_mad(&CmMessage::Dreq(dreq), self.form_tid(i.local_comm_id))
    }

    fn drep_mad(i: &Id) -> [u8; MAD_LEN] {
        let drep = DrepRepr { local_comm_id: i.local_comm_id, remote_comm_id: i.remote_comm_id, private_data: &[] };
        emit_mad(&CmMessage::Drep(drep), i.dreq_tid)
    }

    fn sidr_rep_mad(&self, i: &Id, status: SidrStatus, qpn: u32, qkey: u32, private_data: &[u8]) -> [u8; MAD_LEN] {
        let rep = SidrRepRepr {
            request_id: i.remote_comm_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: Qpn::from_u24_truncating(qpn),
            service_id: i.service_id,
            qkey: QKey(qkey),
            additional_info: &[],
            private_data,
        };
        emit_mad(&CmMessage::SidrRep(rep), i.tid)
    }
}

/// The REQ rdma_cm sends for `i` on `route` (`cm.c: cm_format_req`, `cma.c: cma_connect_ib`).
fn self_req<'a>(config: &CmConfig, i: &Id, route: &Route, private_data: &'a [u8], param: &ConnParam) -> ReqRepr<'a> {
    let transport = match i.qp_type {
        QpType::Uc => TransportServiceType::UC,
        QpType::XrcIni => TransportServiceType::EXTENDED,
        _ => TransportServiceType::RC,
    };
    // cm.c: cm_format_req: an XRC INI QP's REQ carries no responder resources, retry counts
    // or SRQ bit, and says XRC in the extended transport type.
    let xrc = i.qp_type == QpType::XrcIni;
    ReqRepr {
        local_comm_id: i.local_comm_id,
        vendor_id: 0,
        service_id: i.service_id,
        local_ca_guid: config.node_guid,
        local_qkey: QKey(0),
        local_qpn: Qpn::from_u24_truncating(param.qp_num),
        responder_resources: if xrc { 0 } else { param.responder_resources },
        local_eecn: 0,
        initiator_depth: param.initiator_depth,
        remote_eecn: 0,
        remote_cm_response_timeout: config.response_timeout,
        transport_service_type: transport,
        end_to_end_flow_control: param.flow_control,
        starting_psn: Psn::from_u24_truncating(i.seq_num),
        local_cm_response_timeout: config.response_timeout,
        retry_count: if xrc { 0 } else { param.retry_count & 7 },
        pkey: PKey::DEFAULT,
        path_mtu: config.port_mtu as u8,
        rdc_exists: false,
        rnr_retry_count: if xrc { 0 } else { param.rnr_retry_count & 7 },
        max_cm_retries: config.max_retries.min(15),
        srq: !xrc && param.srq,
        extended_transport_type: u8::from(xrc),
        primary_path: CmPath {
            // IBA: LIDs are 0xffff when the path leaves the subnet (hop limit > 1).
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: Gid::from_ip(route.src).0,
            remote_gid: Gid::from_ip(route.dst).0,
            flow_label: route.flow_label,
            packet_rate: 0,
            traffic_class: route.traffic_class,
            hop_limit: route.hop_limit,
            sl: 0,
            subnet_local: route.hop_limit <= 1,
            local_ack_timeout: i.conn.ack_timeout,
        },
        alternate_path: CmPath::default(),
        sap_supported: false,
        private_data,
    }
}

fn av(route: &Route) -> AddressVector {
    AddressVector {
        dgid: Gid::from_ip(route.dst),
        sgid_index: route.sgid_index,
        hop_limit: route.hop_limit,
        traffic_class: route.traffic_class,
        flow_label: route.flow_label,
    }
}

fn enter_timewait(i: &mut Id, now: Instant, timewait: Duration, drep: [u8; MAD_LEN]) {
    i.state = State::Timewait;
    i.pending = None;
    i.deadline = Some(now + timewait);
    i.last_reply = Some(Box::new(drep));
}

fn invalid(op: &'static str, id: CmId, state: State, hint: &'static str) -> CmError {
    CmError::InvalidState { op, id, state: state.name(), hint }
}

fn check_len(op: &'static str, message: &'static str, data: &[u8], max: usize) -> Result<(), CmError> {
    if data.len() > max {
        return Err(CmError::PrivateDataTooLong { op, message, len: data.len(), max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter wraps from 2^21 - 1 to 1, never gives 0, and skips comm IDs still alive.
    #[test]
    fn comm_ids_wrap_and_skip_live_ones() {
        let prefix = 0x2a << crate::COMM_ID_COUNTER_BITS;
        let mut cm = Cm::new(CmConfig { comm_id_prefix: prefix, ..CmConfig::default() });
        cm.counter = COMM_ID_COUNTER_MASK - 1;
        cm.by_comm_id.insert(prefix | 1, CmId(99));
        assert_eq!(cm.alloc_comm_id("t"), Ok(prefix | COMM_ID_COUNTER_MASK));
        assert_eq!(cm.alloc_comm_id("t"), Ok(prefix | 2), "0 is never used, 1 is alive");
        // Every ID taken: exhausted, not an endless loop.
        for c in 1..=COMM_ID_COUNTER_MASK {
            cm.by_comm_id.insert(prefix | c, CmId(99));
        }
        assert_eq!(cm.alloc_comm_id("t"), Err(CmError::CommIdsExhausted { op: "t" }));
    }

    #[test]
    fn ack_timeout_as_the_kernel() {
        assert_eq!(cm_ack_timeout(15, 18), 19);
        assert_eq!(cm_ack_timeout(15, 16), 17);
        assert_eq!(cm_ack_timeout(15, 13), 16);
        assert_eq!(cm_ack_timeout(20, 10), 20);
        assert_eq!(cm_ack_timeout(31, 31), 31);
        assert_eq!(rdma_flow_label(0xa9b0, 7174), 0x4a856, "the rping capture's flow label");
    }
}
