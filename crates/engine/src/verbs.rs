//! The values verbs take and return: keys, access flags, work requests, work completions,
//! QP attributes, events, and the errors a call can fail with.
//!
//! Names follow libibverbs (`ibv_send_wr` is [`SendWr`], `IBV_WC_REM_ACCESS_ERR` is
//! [`WcStatus::RemAccessErr`]) so that the C layer is a table, not a translation.

use crate::Instant;
use core::fmt;
use core::time::Duration;

use softrdma_wire::{Gid, QKey, Qpn, RKey};

pub use crate::qp_state::{AttrMask, QpState, QpType};

/// A protection domain.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct PdId(pub u32);

/// A completion queue.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct CqId(pub u32);

/// A shared receive queue. An XRC SRQ's number on the wire (the XRCETH's, what
/// `ibv_get_srq_num` returns) is this value.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SrqId(pub u32);

/// An XRC domain (`ibv_xrcd`): the XRC SRQs and XRC TGT QPs that may serve each other.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct XrcdId(pub u32);

/// A memory window (`ibv_mw`): the upper 24 bits of its R_Key, which stay while the low 8
/// (the key a bind chooses) change.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct MwId(pub u32);

/// An address handle (UD destinations).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct AhId(pub u32);

/// A local key: names a memory region to this device's own work requests.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LKey(pub u32);

impl fmt::Debug for LKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LKey({:#010x})", self.0)
    }
}

/// A registered memory region: its keys.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MrKeys {
    /// For local access (SGEs).
    pub lkey: LKey,
    /// For remote access (RETH / AtomicETH). Random, never sequential.
    pub rkey: RKey,
}

/// `ibv_access_flags`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u32);

impl Access {
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write (receives, READ responses, atomics).
    pub const LOCAL_WRITE: Self = Self(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE.
    pub const REMOTE_WRITE: Self = Self(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ.
    pub const REMOTE_READ: Self = Self(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics.
    pub const REMOTE_ATOMIC: Self = Self(1 << 3);
    /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region (a region's right;
    /// IBA C10-73).
    pub const MW_BIND: Self = Self(1 << 4);
    /// `IBV_ACCESS_ZERO_BASED`: a type 2 window's remote addresses are offsets from its
    /// start, not virtual addresses (a window's right, given when it is bound).
    pub const ZERO_BASED: Self = Self(1 << 5);
    /// Every right over data: local write and the three remote ones (not
    /// [`MW_BIND`](Self::MW_BIND)).
    pub const ALL: Self = Self(0xf);
    /// `IBV_ACCESS_ON_DEMAND`: the region's pages need not be mapped when it is registered
    /// or when the device reaches them (an access they do not allow is a [`MemoryFault`]
    /// of the runtime's [`Memory`], which the engine reports as it reports any). The engine
    /// checks keys, bounds and rights alike for such regions; what the flag changes is the
    /// runtime's.
    ///
    /// [`MemoryFault`]: crate::MemoryFault
    /// [`Memory`]: crate::Memory
    pub const ON_DEMAND: Self = Self(1 << 6);
    /// `IBV_ACCESS_FLUSH_GLOBAL`: peers may FLUSH the region to global visibility.
    pub const FLUSH_GLOBAL: Self = Self(1 << 8);
    /// `IBV_ACCESS_FLUSH_PERSISTENT`: peers may FLUSH the region to persistence.
    pub const FLUSH_PERSISTENT: Self = Self(1 << 9);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = ["LOCAL_WRITE", "REMOTE_WRITE", "REMOTE_READ", "REMOTE_ATOMIC", "MW_BIND", "ZERO_BASED"];
        let set: Vec<&str> =
            names.iter().enumerate().filter(|(i, _)| self.0 & (1 << i) != 0).map(|(_, n)| *n).collect();
        if set.is_empty() { f.write_str("Access(0)") } else { write!(f, "Access({})", set.join("|")) }
    }
}

/// A scatter/gather element (`ibv_sge`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// The local key of the memory region that holds it.
    pub lkey: LKey,
}

/// `ibv_send_flags`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// `IBV_SEND_FENCE`: wait for earlier READs and atomics to complete first.
    pub const FENCE: Self = Self(1);
    /// `IBV_SEND_SIGNALED`: generate a completion on success.
    pub const SIGNALED: Self = Self(1 << 1);
    /// `IBV_SEND_SOLICITED`: raise a solicited event at the receiver.
    pub const SOLICITED: Self = Self(1 << 2);
    /// `IBV_SEND_INLINE`: copy the data at post time; the SGEs need no lkey.
    pub const INLINE: Self = Self(1 << 3);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for SendFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SendFlags({:#x})", self.0)
    }
}

/// Where a UD send goes (`wr.ud`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct UdDest {
    /// The address handle.
    pub ah: AhId,
    /// The destination QP.
    pub remote_qpn: Qpn,
    /// The destination's Q_Key.
    pub remote_qkey: QKey,
}

/// The type of a memory window (`ibv_mw_type`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum MwType {
    /// `IBV_MW_TYPE_1`: bound by the bind verb (`ibv_bind_mw`, which posts a BIND_MW work
    /// request as rxe does), unbound by binding it again with length 0; never invalidated.
    Type1,
    /// `IBV_MW_TYPE_2` (type 2B): bound by a BIND_MW work request to the QP that posts it,
    /// reachable only through that QP, freed by a local or remote invalidation.
    Type2,
}

/// What a BIND_MW work request binds a window to (`ibv_mw_bind_info`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MwBind {
    /// The region, by its local key (ignored when `length` is 0).
    pub mr: LKey,
    /// First byte of the window, inside the region.
    pub addr: u64,
    /// Bytes; 0 unbinds a type 1 window (and is an error for type 2).
    pub length: u64,
    /// What peers may do through the window (remote rights, and
    /// [`Access::ZERO_BASED`] for a type 2 window).
    pub access: Access,
}

/// A memory window as the device holds it ([`Engine::query_mw`](crate::Engine::query_mw)).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MwInfo {
    /// Its protection domain.
    pub pd: PdId,
    /// Its type.
    pub mw_type: MwType,
    /// Its R_Key now (the low 8 bits change with each bind).
    pub rkey: RKey,
    /// What it is bound to; `None` for a type 1 window bound with length 0 (or never
    /// bound) and for a type 2 window that is free (never bound, or invalidated).
    pub binding: Option<MwBinding>,
}

/// What a bound memory window gives access to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MwBinding {
    /// The region, by its local key.
    pub mr: LKey,
    /// First byte, in the region.
    pub addr: u64,
    /// Bytes (never 0).
    pub length: u64,
    /// What peers may do through it.
    pub access: Access,
    /// Type 2: the QP that bound it, the only one peers reach it through.
    pub qp: Option<Qpn>,
}

/// What a send work request does (`ibv_wr_opcode` with its operands).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm {
        /// Immediate data, in network order.
        imm: [u8; 4],
    },
    /// `IBV_WR_RDMA_WRITE`.
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: consumes a receive at the target.
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Immediate data, in network order.
        imm: [u8; 4],
    },
    /// `IBV_WR_RDMA_READ`.
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: 8 bytes at an 8-byte aligned remote address.
    CompareSwap {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Compared with the remote value.
        compare: u64,
        /// Stored if they are equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Added to the remote value.
        add: u64,
    },
    /// `IBV_WR_ATOMIC_WRITE` (RC, IBA 1.5): the 8 bytes of `value` stored at the 8-byte
    /// aligned remote address as one atomic write. It needs the target's REMOTE_WRITE and a
    /// responder resource, as a READ does, and is answered as one: by a zero-length RDMA
    /// READ response (rxe's `send_read_response_ack`). It takes no SGEs.
    AtomicWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// The bytes stored, as they are in the work request.
        value: [u8; 8],
    },
    /// `IBV_WR_FLUSH` (RC, IBA 1.5; `ibv_wr_flush`): makes what earlier WRITEs placed at the
    /// target visible to all (`placement` [`FLUSH_GLOBAL`](Self::FLUSH_GLOBAL)) or durable
    /// ([`FLUSH_PERSISTENT`](Self::FLUSH_PERSISTENT)), for `length` bytes at `remote_addr`
    /// (`level` [`FLUSH_RANGE`](Self::FLUSH_RANGE)) or the whole region `rkey` names
    /// ([`FLUSH_MR`](Self::FLUSH_MR)). The region and the target QP must allow each
    /// placement asked for (`IBV_ACCESS_FLUSH_GLOBAL`, `_PERSISTENT`); it takes a responder
    /// resource and is answered by a zero-length RDMA READ response, as rxe's. It takes no
    /// SGEs.
    Flush {
        /// Remote address (range level).
        remote_addr: u64,
        /// Remote key.
        rkey: RKey,
        /// Bytes (range level).
        length: u32,
        /// [`FLUSH_GLOBAL`](Self::FLUSH_GLOBAL), [`FLUSH_PERSISTENT`](Self::FLUSH_PERSISTENT)
        /// or both: the FETH's placement type.
        placement: u8,
        /// [`FLUSH_RANGE`](Self::FLUSH_RANGE) or [`FLUSH_MR`](Self::FLUSH_MR): the FETH's
        /// selectivity level.
        level: u8,
    },
    /// `IBV_WR_SEND_WITH_INV` (RC): a SEND whose last packet carries an IETH; the
    /// responder invalidates the type 2 window `rkey` names once the message is placed.
    SendWithInv {
        /// The R_Key the responder invalidates.
        rkey: RKey,
    },
    /// `IBV_WR_LOCAL_INV` (RC, UC): invalidates the type 2 window `rkey` names, once every
    /// earlier work request of the queue has completed (IBA 10.6.5.1's local invalidate
    /// fence, which rxe always applies). Sends nothing.
    LocalInv {
        /// The R_Key to invalidate.
        rkey: RKey,
    },
    /// `IBV_WR_BIND_MW` (RC, UC): binds window `mw` when the requester reaches the work
    /// request. Sends nothing.
    BindMw {
        /// The window, by its handle (the IBA verb's; rxe names it by its current R_Key and
        /// refuses one that is not current, where mlx5 takes the index alone, as here).
        mw: MwId,
        /// The window's R_Key once bound: its upper 24 bits are the window's, its low 8 are
        /// taken from here (`ibv_inc_rkey`).
        rkey: RKey,
        /// The region, range and rights.
        bind: MwBind,
    },
}

impl SendOp {
    /// `IBV_FLUSH_GLOBAL`: a FLUSH to global visibility.
    pub const FLUSH_GLOBAL: u8 = 1;
    /// `IBV_FLUSH_PERSISTENT`: a FLUSH to persistence.
    pub const FLUSH_PERSISTENT: u8 = 2;
    /// `IBV_FLUSH_RANGE`: a FLUSH of a range of the region.
    pub const FLUSH_RANGE: u8 = 0;
    /// `IBV_FLUSH_MR`: a FLUSH of the whole region.
    pub const FLUSH_MR: u8 = 1;

    /// Whether a FLUSH's placement type is one IBA defines: global visibility, persistence
    /// or both.
    pub const fn flush_placement_is_defined(placement: u8) -> bool {
        placement != 0 && placement & !(Self::FLUSH_GLOBAL | Self::FLUSH_PERSISTENT) == 0
    }

    /// A SEND or WRITE: its gather list's bytes go to the peer in its request packets.
    pub const fn carries_data(&self) -> bool {
        matches!(
            self,
            SendOp::Send
                | SendOp::SendWithImm { .. }
                | SendOp::SendWithInv { .. }
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaWriteWithImm { .. }
        )
    }

    /// READ or atomic (ATOMIC_WRITE and FLUSH too): needs responder resources and a response.
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. }
                | SendOp::Flush { .. }
        )
    }

    /// An atomic.
    pub const fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// A local operation (BIND_MW, LOCAL_INV): done by the device itself, no packet.
    pub const fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
    }

    /// The completion opcode this operation reports.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::Flush { .. } => WcOpcode::Flush,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }
}

/// A send work request (`ibv_send_wr`). A list of them is a slice.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// The local buffers.
    pub sg_list: &'a [Sge],
    /// Flags.
    pub flags: SendFlags,
    /// Destination, for UD QPs.
    pub ud: Option<UdDest>,
    /// For XRC INI QPs: the number of the XRC SRQ at the target that takes the message
    /// (`wr.qp_type.xrc.remote_srqn`).
    pub xrc_srqn: Option<u32>,
}

/// A SEND of nothing, unsignaled, to the connected peer: the base of a struct update
/// (`SendWr { op, sg_list, ..SendWr::default() }`).
impl Default for SendWr<'_> {
    fn default() -> Self {
        Self { wr_id: 0, op: SendOp::Send, sg_list: &[], flags: SendFlags::default(), ud: None, xrc_srqn: None }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming data goes.
    pub sg_list: &'a [Sge],
}

/// `ibv_wc_status`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a message did not fit the buffers.
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: an internal consistency error of the QP.
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_PROT_ERR`: an SGE's lkey, bounds or access rights are wrong.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: the QP went to the error state before this WR completed.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`: a BIND_MW work request could not bind its window.
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: an unexpected response.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`.
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: the responder found the request invalid.
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: the responder refused the R_Key, bounds or rights.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: the responder could not complete the operation.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: no response within `retry_cnt` local ACK timeouts.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: receiver not ready more than `rnr_retry` times.
    RnrRetryExcErr = 13,
    /// `IBV_WC_FATAL_ERR`.
    FatalErr = 19,
    /// `IBV_WC_GENERAL_ERR`.
    GeneralErr = 21,
}

/// `ibv_wc_opcode`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`.
    Send,
    /// `IBV_WC_RDMA_WRITE`.
    RdmaWrite,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd,
    /// `IBV_WC_BIND_MW`.
    BindMw,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv,
    /// `IBV_WC_ATOMIC_WRITE`.
    AtomicWrite,
    /// `IBV_WC_FLUSH`.
    Flush,
    /// `IBV_WC_RECV`.
    Recv,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`.
    RecvRdmaWithImm,
}

/// The network header a RoCE v2 UD receive arrived with, which its GRH area holds (the
/// kernel's `enum rdma_network_type`: `RDMA_NETWORK_IPV4`, `RDMA_NETWORK_IPV6`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum NetworkHdr {
    /// An IPv4 header, in the last 20 of the 40 bytes.
    Ipv4,
    /// An IPv6 header, all 40 bytes.
    Ipv6,
}

/// A work completion (`ibv_wc`). For a flushed WR only `wr_id`, `status`, `opcode` and
/// `qp_num` are meaningful.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Wc {
    /// The WR's `wr_id`.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Bytes received (receives: payload, plus 40 for the GRH on UD) or transferred.
    pub byte_len: u32,
    /// Immediate data, in network order (`IBV_WC_WITH_IMM`).
    pub imm_data: Option<[u8; 4]>,
    /// The R_Key a SEND_WITH_INV invalidated at this receiver (`IBV_WC_WITH_INV`,
    /// `invalidated_rkey`).
    pub invalidated_rkey: Option<RKey>,
    /// The local QP.
    pub qp_num: Qpn,
    /// The sending QP (UD receives).
    pub src_qp: Qpn,
    /// A GRH fills the first 40 bytes of the buffer (`IBV_WC_GRH`; every UD receive), and
    /// which IP header stands in for it (the kernel's `ib_wc.network_hdr_type`).
    pub grh: Option<NetworkHdr>,
    /// The sender asked for a solicited event.
    pub solicited: bool,
    /// When the engine made it: the `now` of the call that did, or, for a completion made
    /// by a call that takes no `now` (a flush by [`Engine::modify_qp`](crate::Engine::modify_qp),
    /// a receive posted to a QP in error), the latest `now` given before; `None` before the
    /// engine was given any. The runtime reports it as the completion timestamp
    /// (`ibv_wc_read_completion_ts`).
    pub completed_at: Option<Instant>,
}

/// Path MTU (`ibv_mtu`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    #[default]
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Bytes of payload per packet.
    pub const fn bytes(self) -> u32 {
        256 << (self as u32 - 1)
    }

    /// From the `ibv_mtu` value 1..=5.
    pub const fn from_ibv(v: u8) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// Where packets of a connected QP (or a UD address handle) go (`ibv_ah_attr` with its
/// GRH: on RoCE every address is global).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct AddressVector {
    /// Destination GID: the peer's IP address.
    pub dgid: Gid,
    /// Index of the local GID (source address) in the device's GID table.
    pub sgid_index: u8,
    /// IP hop limit / TTL.
    pub hop_limit: u8,
    /// IP traffic class / TOS.
    pub traffic_class: u8,
    /// IPv6 flow label; also seeds the UDP source port (Linux `rdma_get_udp_sport`).
    pub flow_label: u32,
}

/// `ibv_qp_cap`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (0 with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Bytes a send WR may carry inline.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        Self { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 }
    }
}

/// `ibv_qp_init_attr`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct QpInitAttr {
    /// Protection domain.
    pub pd: PdId,
    /// Completion queue for sends.
    pub send_cq: CqId,
    /// Completion queue for receives.
    pub recv_cq: CqId,
    /// Shared receive queue, if any.
    pub srq: Option<SrqId>,
    /// Transport.
    pub qp_type: QpType,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send WR generates a completion, whatever its flags.
    pub sq_sig_all: bool,
}

/// `ibv_qp_attr`: which fields count is said by the [`AttrMask`] given with it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct QpAttr {
    /// `IBV_QP_STATE`.
    pub qp_state: QpState,
    /// `IBV_QP_CUR_STATE`.
    pub cur_qp_state: QpState,
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
    pub en_sqd_async_notify: bool,
    /// `IBV_QP_ACCESS_FLAGS`: what remote peers may do through this QP.
    pub qp_access_flags: Access,
    /// `IBV_QP_PKEY_INDEX`.
    pub pkey_index: u16,
    /// `IBV_QP_PORT`.
    pub port_num: u8,
    /// `IBV_QP_QKEY`.
    pub qkey: QKey,
    /// `IBV_QP_AV`.
    pub ah_attr: Option<AddressVector>,
    /// `IBV_QP_PATH_MTU`.
    pub path_mtu: Mtu,
    /// `IBV_QP_TIMEOUT`: local ACK timeout 4.096 µs × 2^timeout; 0 waits forever.
    pub timeout: u8,
    /// `IBV_QP_RETRY_CNT`: retries after a timeout or sequence error (0..=7).
    pub retry_cnt: u8,
    /// `IBV_QP_RNR_RETRY`: retries after RNR NAKs (0..=6; 7 = retry forever).
    pub rnr_retry: u8,
    /// `IBV_QP_RQ_PSN`: first PSN expected from the peer.
    pub rq_psn: u32,
    /// `IBV_QP_MAX_QP_RD_ATOMIC`: READs/atomics this QP may have outstanding.
    pub max_rd_atomic: u8,
    /// `IBV_QP_MIN_RNR_TIMER`: the RNR timer code sent in RNR NAKs.
    pub min_rnr_timer: u8,
    /// `IBV_QP_SQ_PSN`: first PSN this QP sends.
    pub sq_psn: u32,
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`: READs/atomics the peer may have outstanding here.
    pub max_dest_rd_atomic: u8,
    /// `IBV_QP_DEST_QPN`.
    pub dest_qp_num: u32,
}

impl Default for QpAttr {
    fn default() -> Self {
        Self {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            en_sqd_async_notify: false,
            qp_access_flags: Access::default(),
            pkey_index: 0,
            port_num: 1,
            qkey: QKey(0),
            ah_attr: None,
            path_mtu: Mtu::default(),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            rq_psn: 0,
            max_rd_atomic: 1,
            min_rnr_timer: 12,
            sq_psn: 0,
            max_dest_rd_atomic: 1,
            dest_qp_num: 0,
        }
    }
}

/// An asynchronous event (`ibv_event_type`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AsyncEvent {
    /// `IBV_EVENT_QP_FATAL`: the QP went to the error state on an error it detected.
    QpFatal(Qpn),
    /// `IBV_EVENT_QP_REQ_ERR`: the peer sent an invalid request.
    QpRequestError(Qpn),
    /// `IBV_EVENT_QP_ACCESS_ERR`: the peer violated an access right.
    QpAccessError(Qpn),
    /// `IBV_EVENT_COMM_EST`: first packet received in RTR.
    CommEstablished(Qpn),
    /// `IBV_EVENT_SQ_DRAINED`: the send queue drained in SQD.
    SqDrained(Qpn),
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP with an SRQ went to the error state.
    QpLastWqeReached(Qpn),
    /// `IBV_EVENT_CQ_ERR`: the CQ overflowed.
    CqError(CqId),
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`.
    SrqLimitReached(SrqId),
}

impl AsyncEvent {
    /// The QP the event is about, if a QP.
    pub fn qpn(&self) -> Option<Qpn> {
        match *self {
            AsyncEvent::QpFatal(n)
            | AsyncEvent::QpRequestError(n)
            | AsyncEvent::QpAccessError(n)
            | AsyncEvent::CommEstablished(n)
            | AsyncEvent::SqDrained(n)
            | AsyncEvent::QpLastWqeReached(n) => Some(n),
            AsyncEvent::CqError(_) | AsyncEvent::SrqLimitReached(_) => None,
        }
    }
}

/// What [`Engine::poll_event`](crate::Engine::poll_event) reports.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Event {
    /// An armed CQ got a completion (completion channel).
    Completion(CqId),
    /// An asynchronous event.
    Async(AsyncEvent),
}

/// The local ACK timeout a 5-bit `timeout` exponent stands for: 4.096 µs × 2^timeout
/// (IBA 9.7.6.1.3); `None` for 0, which disables the timer.
pub fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    Some(Duration::from_nanos(4096u64 << timeout.min(31)))
}

/// Why a verb failed. The C layer maps each to an errno (`EINVAL`, `ENOMEM`, ...), in a
/// match with no catch-all: not `#[non_exhaustive]`, so that a new kind cannot be added
/// without its errno.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum VerbsError {
    /// The handle does not name a live object.
    #[error("no such {kind} {id}")]
    NotFound {
        /// "QP", "CQ", "PD", ...
        kind: &'static str,
        /// The handle's value.
        id: u32,
    },
    /// A value is out of range or inconsistent; the message says which.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A device limit would be exceeded; the message says which.
    #[error("out of resources: {0}")]
    NoResources(String),
    /// The object is still used by others (a PD with MRs, a CQ with QPs).
    #[error("busy: {0}")]
    Busy(String),
    /// `modify_qp` refused the transition or the attribute mask.
    #[error(transparent)]
    ModifyQp(#[from] crate::qp_state::ModifyQpError),
}

/// Why posting stopped: the index of the first WR not posted (`*bad_wr`) and why.
/// Every WR before `index` was posted; none from `index` on.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("work request {index} was not posted: {kind}")]
pub struct PostError {
    /// Position in the list of the bad WR.
    pub index: usize,
    /// What was wrong with it.
    pub kind: PostErrorKind,
}

/// What was wrong with a work request (not `#[non_exhaustive]`, as [`VerbsError`]: the C
/// layer gives each its errno).
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum PostErrorKind {
    /// The queue is full (`ENOMEM`).
    #[error("the queue is full ({depth} WRs outstanding); poll completions first")]
    QueueFull {
        /// Its depth.
        depth: u32,
    },
    /// A value is wrong (`EINVAL`); the message says which.
    #[error("{0}")]
    Invalid(String),
}
