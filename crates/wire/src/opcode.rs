//! The one opcode table: for every BTH opcode, which extended headers follow the BTH, whether
//! the packet carries a payload and how large it may be, and where the packet sits in its
//! message (first / middle / last / only).
//!
//! Layout everywhere in the crate is driven by this table, as rxe's `rxe_opcode.c` drives
//! rxe. Sources: IBA 9.2 and Table 35 ("opcodes"), Linux `include/rdma/ib_pack.h`, and IBA 1.5
//! for FLUSH and ATOMIC_WRITE. The reliable datagram (RD, base 0x40) opcodes are left out: no
//! RoCE implementation speaks RD.

use core::fmt;

/// A BTH opcode. Open: every byte is representable, and unknown values round-trip.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Opcode(pub u8);

/// The transport service an opcode belongs to (its top three bits).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Transport {
    /// Reliable connected, base 0x00.
    Rc,
    /// Unreliable connected, base 0x20.
    Uc,
    /// Unreliable datagram, base 0x60.
    Ud,
    /// RoCEv2 congestion notification packet, 0x81.
    Cnp,
    /// Extended reliable connected, base 0xA0: RC's operations, each request naming the
    /// target's shared receive queue in an XRCETH.
    Xrc,
}

/// What a packet asks for or answers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Operation {
    /// SEND, delivered into a receive WQE.
    Send,
    /// SEND whose last packet carries immediate data.
    SendWithImm,
    /// SEND whose last packet names an R_Key to invalidate.
    SendWithInvalidate,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE whose last packet carries immediate data and consumes a receive WQE.
    RdmaWriteWithImm,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response data.
    RdmaReadResponse,
    /// ACK or NAK.
    Acknowledge,
    /// Response to an atomic, with the original remote value.
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// IBA 1.5 FLUSH to a persistence domain.
    Flush,
    /// IBA 1.5 atomic 8-byte write.
    AtomicWrite,
    /// Congestion notification.
    Cnp,
}

/// Where a packet sits in its message.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

impl Position {
    /// The packet starts a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// The packet ends a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// How much payload a packet of this opcode may carry (IBA 9.7.7, rxe `check_length`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PayloadRule {
    /// No payload at all (requests for READ/atomics, ACKs).
    None,
    /// Exactly one path MTU: FIRST and MIDDLE packets.
    PathMtu,
    /// 1 byte up to one path MTU: LAST packets.
    UpToPathMtuNonEmpty,
    /// 0 bytes up to one path MTU: ONLY packets.
    UpToPathMtu,
    /// Exactly this many bytes (ATOMIC_WRITE's 8, the CNP's 16 reserved bytes).
    Exactly(u16),
}

/// The largest payload any packet may carry: the largest IB path MTU.
pub const MAX_PAYLOAD_LEN: usize = 4096;

impl PayloadRule {
    /// Whether `len` payload bytes fit this rule for *some* path MTU (256 … 4096).
    ///
    /// The exact path MTU is a property of the QP, so the responder checks it; the wire can
    /// still reject what no MTU allows.
    pub const fn allows(self, len: usize) -> bool {
        match self {
            PayloadRule::None => len == 0,
            PayloadRule::PathMtu => matches!(len, 256 | 512 | 1024 | 2048 | 4096),
            PayloadRule::UpToPathMtuNonEmpty => len >= 1 && len <= MAX_PAYLOAD_LEN,
            PayloadRule::UpToPathMtu => len <= MAX_PAYLOAD_LEN,
            PayloadRule::Exactly(n) => len == n as usize,
        }
    }
}

/// A set of extended transport headers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Headers(u16);

impl Headers {
    /// No extended header.
    pub const NONE: Self = Self(0);
    /// FLUSH extended transport header (4 bytes).
    pub const FETH: Self = Self(1 << 0);
    /// RDMA extended transport header (16 bytes).
    pub const RETH: Self = Self(1 << 1);
    /// ACK extended transport header (4 bytes).
    pub const AETH: Self = Self(1 << 2);
    /// Datagram extended transport header (8 bytes).
    pub const DETH: Self = Self(1 << 3);
    /// Atomic extended transport header (28 bytes).
    pub const ATOMIC_ETH: Self = Self(1 << 4);
    /// Atomic acknowledge extended transport header (8 bytes).
    pub const ATOMIC_ACK_ETH: Self = Self(1 << 5);
    /// Immediate data (4 bytes).
    pub const IMM_DT: Self = Self(1 << 6);
    /// Invalidate extended transport header (4 bytes).
    pub const IETH: Self = Self(1 << 7);
    /// XRC extended transport header: the target's XRC SRQ number (4 bytes). It follows
    /// the BTH, before any other.
    pub const XRCETH: Self = Self(1 << 8);

    /// Every header in wire order with its length. A packet carries its headers in exactly
    /// this order after the BTH; no opcode needs another order.
    pub const ORDER: [(Headers, usize); 9] = [
        (Self::XRCETH, 4),
        (Self::FETH, 4),
        (Self::RETH, 16),
        (Self::AETH, 4),
        (Self::DETH, 8),
        (Self::ATOMIC_ETH, 28),
        (Self::ATOMIC_ACK_ETH, 8),
        (Self::IMM_DT, 4),
        (Self::IETH, 4),
    ];

    /// The union of two sets.
    pub const fn with(self, other: Headers) -> Headers {
        Headers(self.0 | other.0)
    }

    /// Whether every header of `other` is in `self`.
    pub const fn contains(self, other: Headers) -> bool {
        self.0 & other.0 == other.0
    }

    /// Total length in bytes of the headers in the set: one look in a table of every set
    /// (512 bytes). Every packet sent and received asks it several times; a step per
    /// header present was still an eighth of what parsing a packet cost.
    pub const fn len(self) -> usize {
        Self::LEN_OF_SET[self.0 as usize & (Self::SETS - 1)] as usize
    }

    /// How many sets there are: one bit per header.
    const SETS: usize = 1 << Self::ORDER.len();

    /// Each set's length: the sum of its headers' (the longest set, all nine, is 80 bytes).
    const LEN_OF_SET: [u8; Self::SETS] = {
        let mut lens = [0u8; Self::SETS];
        let mut set = 0;
        while set < Self::SETS {
            let mut i = 0;
            while i < Self::ORDER.len() {
                if set as u16 & Self::ORDER[i].0.0 != 0 {
                    lens[set] += Self::ORDER[i].1 as u8;
                }
                i += 1;
            }
            set += 1;
        }
        lens
    };

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Offset of `header` from the end of the BTH, if the set contains it.
    pub const fn offset_of(self, header: Headers) -> Option<usize> {
        if !self.contains(header) || header.is_empty() {
            return None;
        }
        let mut offset = 0;
        let mut i = 0;
        while i < Self::ORDER.len() {
            if Self::ORDER[i].0.0 == header.0 {
                return Some(offset);
            }
            if self.contains(Self::ORDER[i].0) {
                offset += Self::ORDER[i].1;
            }
            i += 1;
        }
        None
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 9] =
            ["FETH", "RETH", "AETH", "DETH", "AtomicETH", "AtomicAckETH", "ImmDt", "IETH", "XRCETH"];
        let mut set = f.debug_set();
        for (i, name) in NAMES.iter().enumerate() {
            if self.0 & (1 << i) != 0 {
                set.entry(&format_args!("{name}"));
            }
        }
        set.finish()
    }
}

/// Everything the table knows about one opcode.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OpcodeInfo {
    /// The opcode.
    pub opcode: Opcode,
    /// Its name as Linux writes it (`IB_OPCODE_<name>`), e.g. `RC_SEND_FIRST`.
    pub name: &'static str,
    /// The transport service.
    pub transport: Transport,
    /// What it does.
    pub operation: Operation,
    /// Its place in the message.
    pub position: Position,
    /// The extended headers after the BTH.
    pub headers: Headers,
    /// The payload it may carry.
    pub payload: PayloadRule,
}

impl OpcodeInfo {
    /// Bytes of BTH plus extended headers.
    pub const fn header_len(&self) -> usize {
        crate::bth::HEADER_LEN + self.headers.len()
    }

    /// Sent by a requester (as opposed to a responder's ACK or READ/atomic response).
    pub const fn is_request(&self) -> bool {
        !self.is_response() && !matches!(self.operation, Operation::Cnp)
    }

    /// Sent by a responder.
    pub const fn is_response(&self) -> bool {
        matches!(self.operation, Operation::RdmaReadResponse | Operation::Acknowledge | Operation::AtomicAcknowledge)
    }
}

use Operation as O;
use PayloadRule as P;
use Position as Pos;
use Transport as T;

const RETH_IMM: Headers = Headers::RETH.with(Headers::IMM_DT);
const AETH_ATOMIC_ACK: Headers = Headers::AETH.with(Headers::ATOMIC_ACK_ETH);
const DETH_IMM: Headers = Headers::DETH.with(Headers::IMM_DT);
const FETH_RETH: Headers = Headers::FETH.with(Headers::RETH);
const X: Headers = Headers::XRCETH;
const X_IMM: Headers = X.with(Headers::IMM_DT);
const X_RETH: Headers = X.with(Headers::RETH);
const X_RETH_IMM: Headers = X_RETH.with(Headers::IMM_DT);
const X_ATOMIC: Headers = X.with(Headers::ATOMIC_ETH);
const X_IETH: Headers = X.with(Headers::IETH);

const fn row(
    code: u8,
    name: &'static str,
    transport: Transport,
    operation: Operation,
    position: Position,
    headers: Headers,
    payload: PayloadRule,
) -> OpcodeInfo {
    OpcodeInfo { opcode: Opcode(code), name, transport, operation, position, headers, payload }
}

/// Every opcode softrdma knows, in numeric order.
pub static OPCODES: [OpcodeInfo; 63] = [
    row(0x00, "RC_SEND_FIRST", T::Rc, O::Send, Pos::First, Headers::NONE, P::PathMtu),
    row(0x01, "RC_SEND_MIDDLE", T::Rc, O::Send, Pos::Middle, Headers::NONE, P::PathMtu),
    row(0x02, "RC_SEND_LAST", T::Rc, O::Send, Pos::Last, Headers::NONE, P::UpToPathMtuNonEmpty),
    row(0x03, "RC_SEND_LAST_WITH_IMMEDIATE", T::Rc, O::SendWithImm, Pos::Last, Headers::IMM_DT, P::UpToPathMtuNonEmpty),
    row(0x04, "RC_SEND_ONLY", T::Rc, O::Send, Pos::Only, Headers::NONE, P::UpToPathMtu),
    row(0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", T::Rc, O::SendWithImm, Pos::Only, Headers::IMM_DT, P::UpToPathMtu),
    row(0x06, "RC_RDMA_WRITE_FIRST", T::Rc, O::RdmaWrite, Pos::First, Headers::RETH, P::PathMtu),
    row(0x07, "RC_RDMA_WRITE_MIDDLE", T::Rc, O::RdmaWrite, Pos::Middle, Headers::NONE, P::PathMtu),
    row(0x08, "RC_RDMA_WRITE_LAST", T::Rc, O::RdmaWrite, Pos::Last, Headers::NONE, P::UpToPathMtuNonEmpty),
    row(
        0x09,
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Rc,
        O::RdmaWriteWithImm,
        Pos::Last,
        Headers::IMM_DT,
        P::UpToPathMtuNonEmpty,
    ),
    row(0x0a, "RC_RDMA_WRITE_ONLY", T::Rc, O::RdmaWrite, Pos::Only, Headers::RETH, P::UpToPathMtu),
    row(0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::Rc, O::RdmaWriteWithImm, Pos::Only, RETH_IMM, P::UpToPathMtu),
    row(0x0c, "RC_RDMA_READ_REQUEST", T::Rc, O::RdmaReadRequest, Pos::Only, Headers::RETH, P::None),
    row(0x0d, "RC_RDMA_READ_RESPONSE_FIRST", T::Rc, O::RdmaReadResponse, Pos::First, Headers::AETH, P::PathMtu),
    row(0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", T::Rc, O::RdmaReadResponse, Pos::Middle, Headers::NONE, P::PathMtu),
    row(
        0x0f,
        "RC_RDMA_READ_RESPONSE_LAST",
        T::Rc,
        O::RdmaReadResponse,
        Pos::Last,
        Headers::AETH,
        P::UpToPathMtuNonEmpty,
    ),
    row(0x10, "RC_RDMA_READ_RESPONSE_ONLY", T::Rc, O::RdmaReadResponse, Pos::Only, Headers::AETH, P::UpToPathMtu),
    row(0x11, "RC_ACKNOWLEDGE", T::Rc, O::Acknowledge, Pos::Only, Headers::AETH, P::None),
    row(0x12, "RC_ATOMIC_ACKNOWLEDGE", T::Rc, O::AtomicAcknowledge, Pos::Only, AETH_ATOMIC_ACK, P::None),
    row(0x13, "RC_COMPARE_SWAP", T::Rc, O::CompareSwap, Pos::Only, Headers::ATOMIC_ETH, P::None),
    row(0x14, "RC_FETCH_ADD", T::Rc, O::FetchAdd, Pos::Only, Headers::ATOMIC_ETH, P::None),
    row(
        0x16,
        "RC_SEND_LAST_WITH_INVALIDATE",
        T::Rc,
        O::SendWithInvalidate,
        Pos::Last,
        Headers::IETH,
        P::UpToPathMtuNonEmpty,
    ),
    row(0x17, "RC_SEND_ONLY_WITH_INVALIDATE", T::Rc, O::SendWithInvalidate, Pos::Only, Headers::IETH, P::UpToPathMtu),
    row(0x1c, "RC_FLUSH", T::Rc, O::Flush, Pos::Only, FETH_RETH, P::None),
    row(0x1d, "RC_ATOMIC_WRITE", T::Rc, O::AtomicWrite, Pos::Only, Headers::RETH, P::Exactly(8)),
    row(0x20, "UC_SEND_FIRST", T::Uc, O::Send, Pos::First, Headers::NONE, P::PathMtu),
    row(0x21, "UC_SEND_MIDDLE", T::Uc, O::Send, Pos::Middle, Headers::NONE, P::PathMtu),
    row(0x22, "UC_SEND_LAST", T::Uc, O::Send, Pos::Last, Headers::NONE, P::UpToPathMtuNonEmpty),
    row(0x23, "UC_SEND_LAST_WITH_IMMEDIATE", T::Uc, O::SendWithImm, Pos::Last, Headers::IMM_DT, P::UpToPathMtuNonEmpty),
    row(0x24, "UC_SEND_ONLY", T::Uc, O::Send, Pos::Only, Headers::NONE, P::UpToPathMtu),
    row(0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", T::Uc, O::SendWithImm, Pos::Only, Headers::IMM_DT, P::UpToPathMtu),
    row(0x26, "UC_RDMA_WRITE_FIRST", T::Uc, O::RdmaWrite, Pos::First, Headers::RETH, P::PathMtu),
    row(0x27, "UC_RDMA_WRITE_MIDDLE", T::Uc, O::RdmaWrite, Pos::Middle, Headers::NONE, P::PathMtu),
    row(0x28, "UC_RDMA_WRITE_LAST", T::Uc, O::RdmaWrite, Pos::Last, Headers::NONE, P::UpToPathMtuNonEmpty),
    row(
        0x29,
        "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Uc,
        O::RdmaWriteWithImm,
        Pos::Last,
        Headers::IMM_DT,
        P::UpToPathMtuNonEmpty,
    ),
    row(0x2a, "UC_RDMA_WRITE_ONLY", T::Uc, O::RdmaWrite, Pos::Only, Headers::RETH, P::UpToPathMtu),
    row(0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::Uc, O::RdmaWriteWithImm, Pos::Only, RETH_IMM, P::UpToPathMtu),
    row(0x64, "UD_SEND_ONLY", T::Ud, O::Send, Pos::Only, Headers::DETH, P::UpToPathMtu),
    row(0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", T::Ud, O::SendWithImm, Pos::Only, DETH_IMM, P::UpToPathMtu),
    // RoCEv2 CNP (Annex A17.9.2): BTH with BECN set, then 16 reserved bytes.
    row(0x81, "CNP", T::Cnp, O::Cnp, Pos::Only, Headers::NONE, P::Exactly(16)),
    // XRC (IBA 1.2 annex A14): RC's opcodes at base 0xA0, an XRCETH in every request;
    // responses as RC's.
    row(0xa0, "XRC_SEND_FIRST", T::Xrc, O::Send, Pos::First, X, P::PathMtu),
    row(0xa1, "XRC_SEND_MIDDLE", T::Xrc, O::Send, Pos::Middle, X, P::PathMtu),
    row(0xa2, "XRC_SEND_LAST", T::Xrc, O::Send, Pos::Last, X, P::UpToPathMtuNonEmpty),
    row(0xa3, "XRC_SEND_LAST_WITH_IMMEDIATE", T::Xrc, O::SendWithImm, Pos::Last, X_IMM, P::UpToPathMtuNonEmpty),
    row(0xa4, "XRC_SEND_ONLY", T::Xrc, O::Send, Pos::Only, X, P::UpToPathMtu),
    row(0xa5, "XRC_SEND_ONLY_WITH_IMMEDIATE", T::Xrc, O::SendWithImm, Pos::Only, X_IMM, P::UpToPathMtu),
    row(0xa6, "XRC_RDMA_WRITE_FIRST", T::Xrc, O::RdmaWrite, Pos::First, X_RETH, P::PathMtu),
    row(0xa7, "XRC_RDMA_WRITE_MIDDLE", T::Xrc, O::RdmaWrite, Pos::Middle, X, P::PathMtu),
    row(0xa8, "XRC_RDMA_WRITE_LAST", T::Xrc, O::RdmaWrite, Pos::Last, X, P::UpToPathMtuNonEmpty),
    row(
        0xa9,
        "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Xrc,
        O::RdmaWriteWithImm,
        Pos::Last,
        X_IMM,
        P::UpToPathMtuNonEmpty,
    ),
    row(0xaa, "XRC_RDMA_WRITE_ONLY", T::Xrc, O::RdmaWrite, Pos::Only, X_RETH, P::UpToPathMtu),
    row(0xab, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", T::Xrc, O::RdmaWriteWithImm, Pos::Only, X_RETH_IMM, P::UpToPathMtu),
    row(0xac, "XRC_RDMA_READ_REQUEST", T::Xrc, O::RdmaReadRequest, Pos::Only, X_RETH, P::None),
    row(0xad, "XRC_RDMA_READ_RESPONSE_FIRST", T::Xrc, O::RdmaReadResponse, Pos::First, Headers::AETH, P::PathMtu),
    row(0xae, "XRC_RDMA_READ_RESPONSE_MIDDLE", T::Xrc, O::RdmaReadResponse, Pos::Middle, Headers::NONE, P::PathMtu),
    row(
        0xaf,
        "XRC_RDMA_READ_RESPONSE_LAST",
        T::Xrc,
        O::RdmaReadResponse,
        Pos::Last,
        Headers::AETH,
        P::UpToPathMtuNonEmpty,
    ),
    row(0xb0, "XRC_RDMA_READ_RESPONSE_ONLY", T::Xrc, O::RdmaReadResponse, Pos::Only, Headers::AETH, P::UpToPathMtu),
    row(0xb1, "XRC_ACKNOWLEDGE", T::Xrc, O::Acknowledge, Pos::Only, Headers::AETH, P::None),
    row(0xb2, "XRC_ATOMIC_ACKNOWLEDGE", T::Xrc, O::AtomicAcknowledge, Pos::Only, AETH_ATOMIC_ACK, P::None),
    row(0xb3, "XRC_COMPARE_SWAP", T::Xrc, O::CompareSwap, Pos::Only, X_ATOMIC, P::None),
    row(0xb4, "XRC_FETCH_ADD", T::Xrc, O::FetchAdd, Pos::Only, X_ATOMIC, P::None),
    row(
        0xb6,
        "XRC_SEND_LAST_WITH_INVALIDATE",
        T::Xrc,
        O::SendWithInvalidate,
        Pos::Last,
        X_IETH,
        P::UpToPathMtuNonEmpty,
    ),
    row(0xb7, "XRC_SEND_ONLY_WITH_INVALIDATE", T::Xrc, O::SendWithInvalidate, Pos::Only, X_IETH, P::UpToPathMtu),
];

const ROWS: usize = OPCODES.len();

/// `INDEX[opcode] = row + 1`, or 0 for an opcode softrdma does not know.
static INDEX: [u8; 256] = {
    let mut index = [0u8; 256];
    let mut i = 0;
    while i < ROWS {
        index[OPCODES[i].opcode.0 as usize] = (i + 1) as u8;
        i += 1;
    }
    index
};

impl Opcode {
    /// What the table says about this opcode, or `None` for reserved and RD opcodes.
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        match INDEX[self.0 as usize] {
            0 => None,
            n => Some(&OPCODES[n as usize - 1]),
        }
    }

    /// The Linux name of the opcode (`RC_SEND_ONLY`), or `UNKNOWN` when it is not in the table.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }

    /// The transport service, read from the table.
    pub fn transport(self) -> Option<Transport> {
        self.info().map(|i| i.transport)
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(info) => write!(f, "{}({:#04x})", info.name, self.0),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(info) => f.write_str(info.name),
            None => write!(f, "UNKNOWN({:#04x})", self.0),
        }
    }
}

macro_rules! opcode_consts {
    ($($name:ident = $code:literal),* $(,)?) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Opcode = Opcode($code);
            )*
        }
    };
}

opcode_consts! {
    RC_SEND_FIRST = 0x00, RC_SEND_MIDDLE = 0x01, RC_SEND_LAST = 0x02,
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, RC_SEND_ONLY = 0x04, RC_SEND_ONLY_WITH_IMMEDIATE = 0x05,
    RC_RDMA_WRITE_FIRST = 0x06, RC_RDMA_WRITE_MIDDLE = 0x07, RC_RDMA_WRITE_LAST = 0x08,
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, RC_RDMA_WRITE_ONLY = 0x0a,
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, RC_RDMA_READ_REQUEST = 0x0c,
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e,
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, RC_RDMA_READ_RESPONSE_ONLY = 0x10,
    RC_ACKNOWLEDGE = 0x11, RC_ATOMIC_ACKNOWLEDGE = 0x12, RC_COMPARE_SWAP = 0x13,
    RC_FETCH_ADD = 0x14, RC_SEND_LAST_WITH_INVALIDATE = 0x16, RC_SEND_ONLY_WITH_INVALIDATE = 0x17,
    RC_FLUSH = 0x1c, RC_ATOMIC_WRITE = 0x1d,
    UC_SEND_FIRST = 0x20, UC_SEND_MIDDLE = 0x21, UC_SEND_LAST = 0x22,
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, UC_SEND_ONLY = 0x24, UC_SEND_ONLY_WITH_IMMEDIATE = 0x25,
    UC_RDMA_WRITE_FIRST = 0x26, UC_RDMA_WRITE_MIDDLE = 0x27, UC_RDMA_WRITE_LAST = 0x28,
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, UC_RDMA_WRITE_ONLY = 0x2a,
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b,
    UD_SEND_ONLY = 0x64, UD_SEND_ONLY_WITH_IMMEDIATE = 0x65,
    CNP = 0x81,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_indexed() {
        for pair in OPCODES[..ROWS].windows(2) {
            assert!(pair[0].opcode < pair[1].opcode, "{:?} out of order", pair[1].opcode);
        }
        for info in &OPCODES[..ROWS] {
            assert_eq!(info.opcode.info(), Some(info));
        }
        let known = (0..=255u8).filter(|&b| Opcode(b).info().is_some()).count();
        assert_eq!(known, ROWS);
    }

    #[test]
    fn transport_matches_opcode_base() {
        for info in &OPCODES[..ROWS] {
            let expected = match info.opcode.0 {
                0x00..=0x1f => Transport::Rc,
                0x20..=0x3f => Transport::Uc,
                0x60..=0x7f => Transport::Ud,
                0xa0..=0xbf => Transport::Xrc,
                _ => Transport::Cnp,
            };
            assert_eq!(info.transport, expected, "{}", info.name);
            let prefix = match expected {
                Transport::Rc => "RC_",
                Transport::Uc => "UC_",
                Transport::Ud => "UD_",
                Transport::Cnp => "CNP",
                Transport::Xrc => "XRC_",
            };
            assert!(info.name.starts_with(prefix), "{}", info.name);
        }
    }

    #[test]
    fn uc_mirrors_rc_for_sends_and_writes() {
        for rc in 0x00..=0x0bu8 {
            let rc = Opcode(rc).info().unwrap();
            let uc = Opcode(rc.opcode.0 | 0x20).info().unwrap();
            assert_eq!(&rc.name[3..], &uc.name[3..]);
            assert_eq!(
                (rc.operation, rc.position, rc.headers, rc.payload),
                (uc.operation, uc.position, uc.headers, uc.payload)
            );
        }
        // UC has no READ, atomics or ACKs.
        for op in 0x2c..=0x3fu8 {
            assert_eq!(Opcode(op).info(), None);
        }
    }

    #[test]
    fn header_lengths_match_ib_pack() {
        // Byte counts including the BTH, from the RoCE wire reference (IBA Table 35).
        let expected: [(Opcode, usize); 12] = [
            (Opcode::RC_SEND_ONLY, 12),
            (Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 16),
            (Opcode::RC_RDMA_WRITE_FIRST, 28),
            (Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 32),
            (Opcode::RC_RDMA_READ_REQUEST, 28),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 12),
            (Opcode::RC_ACKNOWLEDGE, 16),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, 24),
            (Opcode::RC_COMPARE_SWAP, 40),
            (Opcode::RC_FLUSH, 32),
            (Opcode::UD_SEND_ONLY, 20),
            (Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 24),
        ];
        for (op, len) in expected {
            assert_eq!(op.info().unwrap().header_len(), len, "{op}");
        }
    }

    #[test]
    fn a_set_of_headers_is_as_long_as_its_headers_together() {
        for bits in 0..1u16 << Headers::ORDER.len() {
            let set = Headers(bits);
            let sum: usize = Headers::ORDER.iter().filter(|(h, _)| set.contains(*h)).map(|&(_, len)| len).sum();
            assert_eq!(set.len(), sum, "{set:?}");
        }
    }

    #[test]
    fn header_offsets_follow_wire_order() {
        let h = FETH_RETH;
        assert_eq!(h.offset_of(Headers::FETH), Some(0));
        assert_eq!(h.offset_of(Headers::RETH), Some(4));
        assert_eq!(DETH_IMM.offset_of(Headers::IMM_DT), Some(8));
        assert_eq!(AETH_ATOMIC_ACK.offset_of(Headers::ATOMIC_ACK_ETH), Some(4));
        assert_eq!(RETH_IMM.offset_of(Headers::AETH), None);
    }

    #[test]
    fn payload_rules() {
        assert!(PayloadRule::PathMtu.allows(1024));
        assert!(!PayloadRule::PathMtu.allows(1000));
        assert!(!PayloadRule::UpToPathMtuNonEmpty.allows(0));
        assert!(PayloadRule::UpToPathMtu.allows(0));
        assert!(!PayloadRule::UpToPathMtu.allows(4097));
        assert!(PayloadRule::None.allows(0) && !PayloadRule::None.allows(4));
        assert!(Position::Only.starts_message() && Position::Only.ends_message());
        assert!(!Position::Middle.starts_message() && !Position::Middle.ends_message());
    }

    #[test]
    fn names_and_unknowns() {
        assert_eq!(Opcode(0x64).to_string(), "UD_SEND_ONLY");
        assert_eq!(Opcode(0x15).to_string(), "UNKNOWN(0x15)");
        assert_eq!(Opcode(0x44).name(), "UNKNOWN", "RD is not supported");
        assert_eq!(format!("{:?}", Opcode::RC_ACKNOWLEDGE), "RC_ACKNOWLEDGE(0x11)");
    }
}
