//! The QP state machine's rule table: which `ibv_modify_qp` transitions are legal for a QP
//! type, and which `ibv_qp_attr_mask` bits each transition requires or accepts.
//!
//! The table is the one the Linux RDMA core enforces for every provider, transcribed from
//! `drivers/infiniband/core/verbs.c: qp_state_table` and checked the way
//! `ib_modify_qp_is_ok()` checks it (see also `roce-wire.md` §5). That table is the kernel's
//! transcription of the Modify QP transition properties in the InfiniBand Architecture
//! Specification Vol. 1 (chapter 11, Software Transport Verbs); where the two could differ,
//! the Linux table wins, because it decides what real `libibverbs` programs may do.
//!
//! The RC, UC, UD, GSI (QP1) and XRC (`IB_QPT_XRC_INI`, `IB_QPT_XRC_TGT`) columns are kept;
//! SMI, raw packet and driver-specific QP types are out of scope.
//!
//! # Choices
//!
//! - **RESET→ERR is rejected.** `roce-wire.md` §5 says "RESET→ERR is valid in newer kernels",
//!   but `qp_state_table` has no `[IB_QPS_RESET][IB_QPS_ERR]` entry, neither in old kernels
//!   nor in current mainline (checked against a 6.x `verbs.c`), so `ib_modify_qp_is_ok()`
//!   returns false and every provider that uses it (rxe, mlx5, ...) fails the call with
//!   `EINVAL`. Every other state may go to ERR, and every state (RESET included) may go to
//!   RESET.
//! - **`IBV_QP_CUR_STATE`.** In Linux, `attr.cur_qp_state` *replaces* the driver's idea of the
//!   current state (`cur = mask & IB_QP_CUR_STATE ? attr->cur_qp_state : qp->state`, as rxe
//!   and mlx5 do) before the table is consulted; the bit itself is accepted only where the
//!   table lists it (RTR→RTS, RTS→RTS, SQD→RTS and SQE→RTS, except RC SQE→RTS). A software
//!   device always knows the actual state, so a claim that differs from it cannot be right:
//!   [`check_modify`] rejects it with [`ModifyQpError::CurrentStateMismatch`]. That is what a
//!   hardware provider ends up doing too (mlx5 picks the firmware command from the claimed
//!   state, e.g. `SQERR2RTS`, and the firmware refuses it if the QP is elsewhere), whereas
//!   rxe would silently trust the claim. With a matching claim the bit is checked against the
//!   table exactly like Linux.
//! - **GSI (QP1)** uses Linux's `IB_QPT_GSI` column: RESET→INIT requires only
//!   `PKEY_INDEX | QKEY` (no `PORT`: QP1 is bound to its port when it is created), INIT→INIT
//!   accepts `PKEY_INDEX | QKEY`, and otherwise it behaves like UD.
//! - **`IBV_QP_RATE_LIMIT`** appears in the Linux table only in the raw-packet column
//!   (RTR→RTS, RTS→RTS), so it is never accepted for RC, UC, UD or GSI. Likewise `IBV_QP_CAP`
//!   is in no column at all, and unknown bits (1 << 21..24, 1 << 26.. ) are rejected.
//! - **RC SQE→RTS** is a valid entry in the Linux table (with nothing required or optional)
//!   although, per IBA, an RC QP never enters SQE (send errors move it to ERR). It is kept as
//!   Linux has it; it is unreachable in practice.
//! - A modify without `IBV_QP_STATE` is an attribute-only modify, which Linux checks as the
//!   current→current transition (RTS→RTS, INIT→INIT, ...). Without that bit the target state
//!   passed to [`check_modify`] is ignored, exactly as `attr.qp_state` is in C.

use core::fmt;
use core::iter::FusedIterator;
use core::ops::{BitAnd, BitAndAssign, BitOr, BitOrAssign, BitXor, BitXorAssign, Not, Sub, SubAssign};

/// `ibv_qp_state` values (`enum ibv_qp_state` in `<infiniband/verbs.h>`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum QpState {
    /// `IBV_QPS_RESET`: freshly created or reset; no work is processed.
    Reset = 0,
    /// `IBV_QPS_INIT`: receives may be posted, nothing is sent or received.
    Init = 1,
    /// `IBV_QPS_RTR`: ready to receive.
    Rtr = 2,
    /// `IBV_QPS_RTS`: ready to send.
    Rts = 3,
    /// `IBV_QPS_SQD`: send queue drain(ing/ed).
    Sqd = 4,
    /// `IBV_QPS_SQE`: send queue error (UC and UD only).
    Sqe = 5,
    /// `IBV_QPS_ERR`: error; every work request is flushed.
    Err = 6,
}

impl QpState {
    /// Every state, in `ibv_qp_state` order.
    pub const ALL: [QpState; 7] =
        [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Err];

    /// The state with `ibv_qp_state` value `raw`, if any (`IBV_QPS_UNKNOWN` (7) and above are
    /// not states).
    pub const fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            0 => Some(QpState::Reset),
            1 => Some(QpState::Init),
            2 => Some(QpState::Rtr),
            3 => Some(QpState::Rts),
            4 => Some(QpState::Sqd),
            5 => Some(QpState::Sqe),
            6 => Some(QpState::Err),
            _ => None,
        }
    }

    /// The `ibv_qp_state` value.
    pub const fn as_raw(self) -> u8 {
        self as u8
    }

    /// The C enumerator, e.g. `"IBV_QPS_RTR"`.
    pub const fn c_name(self) -> &'static str {
        match self {
            QpState::Reset => "IBV_QPS_RESET",
            QpState::Init => "IBV_QPS_INIT",
            QpState::Rtr => "IBV_QPS_RTR",
            QpState::Rts => "IBV_QPS_RTS",
            QpState::Sqd => "IBV_QPS_SQD",
            QpState::Sqe => "IBV_QPS_SQE",
            QpState::Err => "IBV_QPS_ERR",
        }
    }

    /// The short name used in the specs and in [`Display`](fmt::Display), e.g. `"RTR"`.
    pub const fn short_name(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

impl From<QpState> for u8 {
    fn from(state: QpState) -> u8 {
        state.as_raw()
    }
}

impl TryFrom<u8> for QpState {
    /// The value that is not an `ibv_qp_state`.
    type Error = u8;

    fn try_from(raw: u8) -> Result<Self, u8> {
        QpState::from_raw(raw).ok_or(raw)
    }
}

/// The QP types this table covers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum QpType {
    /// Reliable Connected (`IBV_QPT_RC`).
    Rc,
    /// Unreliable Connected (`IBV_QPT_UC`).
    Uc,
    /// Unreliable Datagram (`IBV_QPT_UD`).
    Ud,
    /// The General Services Interface QP, QP1 (`IB_QPT_GSI`, kernel only): UD-like, with its
    /// own column in the Linux table.
    Gsi,
    /// The sending half of XRC (`IBV_QPT_XRC_SEND`, the kernel's `IB_QPT_XRC_INI`): an RC
    /// requester whose every request names the XRC SRQ it goes to; it receives nothing.
    XrcIni,
    /// The receiving half of XRC (`IBV_QPT_XRC_RECV`, `IB_QPT_XRC_TGT`): an RC responder of
    /// an XRC domain that takes each message's receive from the XRC SRQ the request names.
    XrcTgt,
}

impl QpType {
    /// Every type.
    pub const ALL: [QpType; 6] = [QpType::Rc, QpType::Uc, QpType::Ud, QpType::Gsi, QpType::XrcIni, QpType::XrcTgt];

    /// Connected to one peer QP (RC, UC and both XRC halves): the AV and destination QPN
    /// are the QP's, not each WR's.
    pub const fn is_connected(self) -> bool {
        matches!(self, QpType::Rc | QpType::Uc | QpType::XrcIni | QpType::XrcTgt)
    }

    /// Reliable (RC and XRC): ACKs, retries, READs and atomics.
    pub const fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcIni | QpType::XrcTgt)
    }

    /// The C enumerator: `"IBV_QPT_RC"`, ..., and the kernel's `"IB_QPT_GSI"` for QP1, which
    /// user space cannot create.
    pub const fn c_name(self) -> &'static str {
        match self {
            QpType::Rc => "IBV_QPT_RC",
            QpType::Uc => "IBV_QPT_UC",
            QpType::Ud => "IBV_QPT_UD",
            QpType::Gsi => "IB_QPT_GSI",
            QpType::XrcIni => "IBV_QPT_XRC_SEND",
            QpType::XrcTgt => "IBV_QPT_XRC_RECV",
        }
    }

    /// The short name used in [`Display`](fmt::Display): `"RC"`, `"UC"`, `"UD"`, `"GSI"`,
    /// `"XRC_INI"`, `"XRC_TGT"`.
    pub const fn short_name(self) -> &'static str {
        match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::Gsi => "GSI",
            QpType::XrcIni => "XRC_INI",
            QpType::XrcTgt => "XRC_TGT",
        }
    }

    /// The indefinite article that goes before the short name when read aloud ("an RC QP",
    /// "a UD QP").
    const fn article(self) -> &'static str {
        match self {
            QpType::Rc => "an",
            QpType::Uc | QpType::Ud | QpType::Gsi => "a",
            QpType::XrcIni | QpType::XrcTgt => "an",
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// A set of `ibv_qp_attr_mask` bits, with the exact `libibverbs` values.
///
/// Any `u32` is representable, including bits `libibverbs` does not define; those print as
/// `BIT21` ([`Display`](fmt::Display)) or `(1 << 21)` ([`AttrMask::c_expr`]) and are never
/// accepted by [`check_modify`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AttrMask(pub u32);

/// Every bit `libibverbs` defines, with its name minus the `IBV_QP_` prefix.
const NAMED_BITS: [(AttrMask, &str); 22] = [
    (AttrMask::STATE, "STATE"),
    (AttrMask::CUR_STATE, "CUR_STATE"),
    (AttrMask::EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
    (AttrMask::ACCESS_FLAGS, "ACCESS_FLAGS"),
    (AttrMask::PKEY_INDEX, "PKEY_INDEX"),
    (AttrMask::PORT, "PORT"),
    (AttrMask::QKEY, "QKEY"),
    (AttrMask::AV, "AV"),
    (AttrMask::PATH_MTU, "PATH_MTU"),
    (AttrMask::TIMEOUT, "TIMEOUT"),
    (AttrMask::RETRY_CNT, "RETRY_CNT"),
    (AttrMask::RNR_RETRY, "RNR_RETRY"),
    (AttrMask::RQ_PSN, "RQ_PSN"),
    (AttrMask::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
    (AttrMask::ALT_PATH, "ALT_PATH"),
    (AttrMask::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
    (AttrMask::SQ_PSN, "SQ_PSN"),
    (AttrMask::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
    (AttrMask::PATH_MIG_STATE, "PATH_MIG_STATE"),
    (AttrMask::CAP, "CAP"),
    (AttrMask::DEST_QPN, "DEST_QPN"),
    (AttrMask::RATE_LIMIT, "RATE_LIMIT"),
];

impl AttrMask {
    /// No bits.
    pub const EMPTY: Self = Self(0);
    /// `IBV_QP_STATE`: move to `attr.qp_state`.
    pub const STATE: Self = Self(1 << 0);
    /// `IBV_QP_CUR_STATE`: `attr.cur_qp_state` is the state the caller assumes the QP is in.
    pub const CUR_STATE: Self = Self(1 << 1);
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: `attr.en_sqd_async_notify` (RTS→SQD).
    pub const EN_SQD_ASYNC_NOTIFY: Self = Self(1 << 2);
    /// `IBV_QP_ACCESS_FLAGS`: `attr.qp_access_flags`.
    pub const ACCESS_FLAGS: Self = Self(1 << 3);
    /// `IBV_QP_PKEY_INDEX`: `attr.pkey_index`.
    pub const PKEY_INDEX: Self = Self(1 << 4);
    /// `IBV_QP_PORT`: `attr.port_num`.
    pub const PORT: Self = Self(1 << 5);
    /// `IBV_QP_QKEY`: `attr.qkey`.
    pub const QKEY: Self = Self(1 << 6);
    /// `IBV_QP_AV`: `attr.ah_attr`, the primary path.
    pub const AV: Self = Self(1 << 7);
    /// `IBV_QP_PATH_MTU`: `attr.path_mtu`.
    pub const PATH_MTU: Self = Self(1 << 8);
    /// `IBV_QP_TIMEOUT`: `attr.timeout` (local ACK timeout).
    pub const TIMEOUT: Self = Self(1 << 9);
    /// `IBV_QP_RETRY_CNT`: `attr.retry_cnt`.
    pub const RETRY_CNT: Self = Self(1 << 10);
    /// `IBV_QP_RNR_RETRY`: `attr.rnr_retry`.
    pub const RNR_RETRY: Self = Self(1 << 11);
    /// `IBV_QP_RQ_PSN`: `attr.rq_psn`.
    pub const RQ_PSN: Self = Self(1 << 12);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`: `attr.max_rd_atomic` (outstanding reads/atomics as requester).
    pub const MAX_QP_RD_ATOMIC: Self = Self(1 << 13);
    /// `IBV_QP_ALT_PATH`: `attr.alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout`.
    pub const ALT_PATH: Self = Self(1 << 14);
    /// `IBV_QP_MIN_RNR_TIMER`: `attr.min_rnr_timer`.
    pub const MIN_RNR_TIMER: Self = Self(1 << 15);
    /// `IBV_QP_SQ_PSN`: `attr.sq_psn`.
    pub const SQ_PSN: Self = Self(1 << 16);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`: `attr.max_dest_rd_atomic` (responder resources).
    pub const MAX_DEST_RD_ATOMIC: Self = Self(1 << 17);
    /// `IBV_QP_PATH_MIG_STATE`: `attr.path_mig_state`.
    pub const PATH_MIG_STATE: Self = Self(1 << 18);
    /// `IBV_QP_CAP`: `attr.cap` (QP resize; accepted by no transition of the Linux table).
    pub const CAP: Self = Self(1 << 19);
    /// `IBV_QP_DEST_QPN`: `attr.dest_qp_num`.
    pub const DEST_QPN: Self = Self(1 << 20);
    /// `IBV_QP_RATE_LIMIT`: `attr.rate_limit` (raw packet QPs only in Linux).
    pub const RATE_LIMIT: Self = Self(1 << 25);
    /// Every bit `libibverbs` defines.
    pub const KNOWN: Self = {
        let mut bits = 0;
        let mut i = 0;
        while i < NAMED_BITS.len() {
            bits |= NAMED_BITS[i].0.0;
            i += 1;
        }
        Self(bits)
    };

    /// The mask with these raw bits.
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits)
    }

    /// The raw bits, as passed to `ibv_modify_qp`.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// No bit set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Every bit of `other` is set in `self` (`other ⊆ self`).
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` and `other` share at least one bit.
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// `self | other`, usable in `const` context.
    #[must_use]
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// `self & other`, usable in `const` context.
    #[must_use]
    pub const fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    /// The bits of `self` that are not in `other` (`self - other`), usable in `const` context.
    #[must_use]
    pub const fn difference(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    /// The number of bits set.
    pub const fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// The bits `libibverbs` does not define.
    #[must_use]
    pub const fn unknown(self) -> Self {
        self.difference(Self::KNOWN)
    }

    /// The set bits, lowest first, each as a one-bit mask.
    pub const fn iter(self) -> AttrMaskIter {
        AttrMaskIter { rest: self.0 }
    }

    /// The `libibverbs` name of a single known bit, e.g. `"IBV_QP_AV"`; for anything else
    /// (no bit, several bits, an undefined bit) `"<not a single ibv_qp_attr_mask bit>"`. Use
    /// [`AttrMask::c_expr`] to print any mask.
    pub const fn name(self) -> &'static str {
        match self {
            Self::STATE => "IBV_QP_STATE",
            Self::CUR_STATE => "IBV_QP_CUR_STATE",
            Self::EN_SQD_ASYNC_NOTIFY => "IBV_QP_EN_SQD_ASYNC_NOTIFY",
            Self::ACCESS_FLAGS => "IBV_QP_ACCESS_FLAGS",
            Self::PKEY_INDEX => "IBV_QP_PKEY_INDEX",
            Self::PORT => "IBV_QP_PORT",
            Self::QKEY => "IBV_QP_QKEY",
            Self::AV => "IBV_QP_AV",
            Self::PATH_MTU => "IBV_QP_PATH_MTU",
            Self::TIMEOUT => "IBV_QP_TIMEOUT",
            Self::RETRY_CNT => "IBV_QP_RETRY_CNT",
            Self::RNR_RETRY => "IBV_QP_RNR_RETRY",
            Self::RQ_PSN => "IBV_QP_RQ_PSN",
            Self::MAX_QP_RD_ATOMIC => "IBV_QP_MAX_QP_RD_ATOMIC",
            Self::ALT_PATH => "IBV_QP_ALT_PATH",
            Self::MIN_RNR_TIMER => "IBV_QP_MIN_RNR_TIMER",
            Self::SQ_PSN => "IBV_QP_SQ_PSN",
            Self::MAX_DEST_RD_ATOMIC => "IBV_QP_MAX_DEST_RD_ATOMIC",
            Self::PATH_MIG_STATE => "IBV_QP_PATH_MIG_STATE",
            Self::CAP => "IBV_QP_CAP",
            Self::DEST_QPN => "IBV_QP_DEST_QPN",
            Self::RATE_LIMIT => "IBV_QP_RATE_LIMIT",
            _ => "<not a single ibv_qp_attr_mask bit>",
        }
    }

    /// The name of a single known bit without the `IBV_QP_` prefix (`"AV"`), as
    /// [`Display`](fmt::Display) prints it; `None` for anything else.
    pub fn short_name(self) -> Option<&'static str> {
        NAMED_BITS.iter().find(|(bit, _)| *bit == self).map(|&(_, name)| name)
    }

    /// The mask written as a C programmer would: `IBV_QP_AV | IBV_QP_PATH_MTU`, with undefined
    /// bits as `(1 << 21)` and the empty mask as `0`.
    pub const fn c_expr(self) -> CExpr {
        CExpr(self)
    }
}

/// Iterator over the bits of an [`AttrMask`], from [`AttrMask::iter`].
#[derive(Clone, Debug)]
pub struct AttrMaskIter {
    rest: u32,
}

impl Iterator for AttrMaskIter {
    type Item = AttrMask;

    fn next(&mut self) -> Option<AttrMask> {
        if self.rest == 0 {
            return None;
        }
        let lowest = self.rest & self.rest.wrapping_neg();
        self.rest &= !lowest;
        Some(AttrMask(lowest))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.rest.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for AttrMaskIter {}
impl FusedIterator for AttrMaskIter {}

impl IntoIterator for AttrMask {
    type Item = AttrMask;
    type IntoIter = AttrMaskIter;

    fn into_iter(self) -> AttrMaskIter {
        self.iter()
    }
}

impl FromIterator<AttrMask> for AttrMask {
    fn from_iter<I: IntoIterator<Item = AttrMask>>(iter: I) -> Self {
        iter.into_iter().fold(AttrMask::EMPTY, |acc, m| acc | m)
    }
}

impl From<u32> for AttrMask {
    fn from(bits: u32) -> Self {
        Self(bits)
    }
}

impl From<AttrMask> for u32 {
    fn from(mask: AttrMask) -> u32 {
        mask.0
    }
}

impl BitOr for AttrMask {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.union(rhs)
    }
}

impl BitOrAssign for AttrMask {
    fn bitor_assign(&mut self, rhs: Self) {
        *self = *self | rhs;
    }
}

impl BitAnd for AttrMask {
    type Output = Self;
    fn bitand(self, rhs: Self) -> Self {
        self.intersection(rhs)
    }
}

impl BitAndAssign for AttrMask {
    fn bitand_assign(&mut self, rhs: Self) {
        *self = *self & rhs;
    }
}

impl BitXor for AttrMask {
    type Output = Self;
    fn bitxor(self, rhs: Self) -> Self {
        Self(self.0 ^ rhs.0)
    }
}

impl BitXorAssign for AttrMask {
    fn bitxor_assign(&mut self, rhs: Self) {
        *self = *self ^ rhs;
    }
}

/// Set difference: the bits of `self` not in `rhs`.
impl Sub for AttrMask {
    type Output = Self;
    fn sub(self, rhs: Self) -> Self {
        self.difference(rhs)
    }
}

impl SubAssign for AttrMask {
    fn sub_assign(&mut self, rhs: Self) {
        *self = *self - rhs;
    }
}

/// Complement over all 32 bits.
impl Not for AttrMask {
    type Output = Self;
    fn not(self) -> Self {
        Self(!self.0)
    }
}

/// `AV|PATH_MTU`; undefined bits as `BIT21`; the empty mask as `0`.
impl fmt::Display for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("0");
        }
        for (i, bit) in self.iter().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            match bit.short_name() {
                Some(name) => f.write_str(name)?,
                None => write!(f, "BIT{}", bit.0.trailing_zeros())?,
            }
        }
        Ok(())
    }
}

/// `AttrMask(AV|PATH_MTU)`.
impl fmt::Debug for AttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttrMask({self})")
    }
}

/// An [`AttrMask`] printed as a C expression, from [`AttrMask::c_expr`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CExpr(AttrMask);

impl fmt::Display for CExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("0");
        }
        for (i, bit) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            if bit.short_name().is_some() {
                f.write_str(bit.name())?;
            } else {
                write!(f, "(1 << {})", bit.0.trailing_zeros())?;
            }
        }
        Ok(())
    }
}

/// What the table says for one allowed transition.
///
/// `IBV_QP_STATE` is never listed: it is accepted by every transition (and needed by every
/// transition that changes the state). `IBV_QP_CUR_STATE` is listed in `optional` where the
/// table allows it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TransitionRule {
    /// Bits that must be set (`req_param`).
    pub required: AttrMask,
    /// Bits that may be set (`opt_param`).
    pub optional: AttrMask,
}

impl TransitionRule {
    /// Every bit the transition accepts: `required | optional | IBV_QP_STATE`.
    pub const fn allowed(self) -> AttrMask {
        self.required.union(self.optional).union(AttrMask::STATE)
    }

    /// `mask` passes the table's bit checks (`required ⊆ mask ⊆ allowed`), i.e. what
    /// `ib_modify_qp_is_ok()` checks once it has found a valid entry.
    pub const fn accepts(self, mask: AttrMask) -> bool {
        mask.contains(self.required) && self.allowed().contains(mask)
    }
}

/// The rule for `current → next` on a `qp_type` QP, or `None` if the transition is not
/// allowed.
///
/// Transcribed from Linux `drivers/infiniband/core/verbs.c: qp_state_table` (columns
/// `IB_QPT_RC`, `IB_QPT_UC`, `IB_QPT_UD`, `IB_QPT_GSI`, `IB_QPT_XRC_INI`, `IB_QPT_XRC_TGT`);
/// see the module docs for the choices.
pub const fn transition_rule(qp_type: QpType, current: QpState, next: QpState) -> Option<TransitionRule> {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    use QpType::{Gsi, Rc, Uc, Ud, XrcIni, XrcTgt};

    const NONE: AttrMask = AttrMask::EMPTY;
    const CUR_STATE: AttrMask = AttrMask::CUR_STATE;
    const EN_SQD_ASYNC_NOTIFY: AttrMask = AttrMask::EN_SQD_ASYNC_NOTIFY;
    const ACCESS_FLAGS: AttrMask = AttrMask::ACCESS_FLAGS;
    const PKEY_INDEX: AttrMask = AttrMask::PKEY_INDEX;
    const PORT: AttrMask = AttrMask::PORT;
    const QKEY: AttrMask = AttrMask::QKEY;
    const AV: AttrMask = AttrMask::AV;
    const PATH_MTU: AttrMask = AttrMask::PATH_MTU;
    const TIMEOUT: AttrMask = AttrMask::TIMEOUT;
    const RETRY_CNT: AttrMask = AttrMask::RETRY_CNT;
    const RNR_RETRY: AttrMask = AttrMask::RNR_RETRY;
    const RQ_PSN: AttrMask = AttrMask::RQ_PSN;
    const MAX_QP_RD_ATOMIC: AttrMask = AttrMask::MAX_QP_RD_ATOMIC;
    const ALT_PATH: AttrMask = AttrMask::ALT_PATH;
    const MIN_RNR_TIMER: AttrMask = AttrMask::MIN_RNR_TIMER;
    const SQ_PSN: AttrMask = AttrMask::SQ_PSN;
    const MAX_DEST_RD_ATOMIC: AttrMask = AttrMask::MAX_DEST_RD_ATOMIC;
    const PATH_MIG_STATE: AttrMask = AttrMask::PATH_MIG_STATE;
    const DEST_QPN: AttrMask = AttrMask::DEST_QPN;

    /// `|` of a list, in `const` context.
    const fn any(bits: &[AttrMask]) -> AttrMask {
        let mut acc = AttrMask::EMPTY;
        let mut i = 0;
        while i < bits.len() {
            acc = acc.union(bits[i]);
            i += 1;
        }
        acc
    }

    let (required, optional) = match (current, next) {
        // Any state → RESET (`[*][IB_QPS_RESET] = { .valid = 1 }`, RESET→RESET included),
        // nothing required or accepted but IBV_QP_STATE.
        (_, Reset) => (NONE, NONE),
        // Any state but RESET → ERR, likewise. There is no [IB_QPS_RESET][IB_QPS_ERR] entry.
        (Reset, Err) => return None,
        (_, Err) => (NONE, NONE),

        // RESET→INIT: every type must name its P_Key; UD and GSI their Q_Key, connected types
        // their access flags; all but GSI (bound to its port at creation) their port.
        (Reset, Init) => match qp_type {
            Rc | Uc | XrcIni | XrcTgt => (any(&[PKEY_INDEX, PORT, ACCESS_FLAGS]), NONE),
            Ud => (any(&[PKEY_INDEX, PORT, QKEY]), NONE),
            Gsi => (any(&[PKEY_INDEX, QKEY]), NONE),
        },

        // INIT→INIT: the RESET→INIT attributes become optional.
        (Init, Init) => match qp_type {
            Rc | Uc | XrcIni | XrcTgt => (NONE, any(&[PKEY_INDEX, PORT, ACCESS_FLAGS])),
            Ud => (NONE, any(&[PKEY_INDEX, PORT, QKEY])),
            Gsi => (NONE, any(&[PKEY_INDEX, QKEY])),
        },

        // INIT→RTR: connected types learn the remote end (AV, DEST_QPN), PMTU and the
        // expected PSN; RC and XRC TGT (the responders) also their responder resources and
        // RNR NAK timer.
        (Init, Rtr) => match qp_type {
            Rc | XrcTgt => (
                any(&[AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER]),
                any(&[ALT_PATH, ACCESS_FLAGS, PKEY_INDEX]),
            ),
            Uc | XrcIni => (any(&[AV, PATH_MTU, DEST_QPN, RQ_PSN]), any(&[ALT_PATH, ACCESS_FLAGS, PKEY_INDEX])),
            Ud | Gsi => (NONE, any(&[PKEY_INDEX, QKEY])),
        },

        // RTR→RTS: everybody sets its send PSN; RC and XRC INI (the requesters) also their
        // retransmission parameters and outstanding read/atomic depth; XRC TGT, which sends
        // nothing but responses, only a timeout.
        (Rtr, Rts) => match qp_type {
            Rc => (
                any(&[TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MAX_QP_RD_ATOMIC]),
                any(&[CUR_STATE, ALT_PATH, ACCESS_FLAGS, MIN_RNR_TIMER, PATH_MIG_STATE]),
            ),
            XrcIni => (
                any(&[TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MAX_QP_RD_ATOMIC]),
                any(&[CUR_STATE, ALT_PATH, ACCESS_FLAGS, PATH_MIG_STATE]),
            ),
            XrcTgt => {
                (any(&[TIMEOUT, SQ_PSN]), any(&[CUR_STATE, ALT_PATH, ACCESS_FLAGS, MIN_RNR_TIMER, PATH_MIG_STATE]))
            }
            Uc => (SQ_PSN, any(&[CUR_STATE, ALT_PATH, ACCESS_FLAGS, PATH_MIG_STATE])),
            Ud | Gsi => (SQ_PSN, any(&[CUR_STATE, QKEY])),
        },

        // RTS→RTS (attribute-only modify of a running QP) and SQD→RTS (resume) accept the
        // same bits.
        (Rts | Sqd, Rts) => match qp_type {
            Rc | XrcTgt => (NONE, any(&[CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE, MIN_RNR_TIMER])),
            Uc | XrcIni => (NONE, any(&[CUR_STATE, ACCESS_FLAGS, ALT_PATH, PATH_MIG_STATE])),
            Ud | Gsi => (NONE, any(&[CUR_STATE, QKEY])),
        },

        // RTS→SQD: drain the send queue, optionally with an SQ_DRAINED event.
        (Rts, Sqd) => (NONE, EN_SQD_ASYNC_NOTIFY),

        // SQD→SQD: while drained, the path and most connection parameters may change.
        (Sqd, Sqd) => match qp_type {
            Rc => (
                NONE,
                any(&[
                    PORT,
                    AV,
                    TIMEOUT,
                    RETRY_CNT,
                    RNR_RETRY,
                    MAX_QP_RD_ATOMIC,
                    MAX_DEST_RD_ATOMIC,
                    ALT_PATH,
                    ACCESS_FLAGS,
                    PKEY_INDEX,
                    MIN_RNR_TIMER,
                    PATH_MIG_STATE,
                ]),
            ),
            XrcIni => (
                NONE,
                any(&[
                    PORT,
                    AV,
                    TIMEOUT,
                    RETRY_CNT,
                    RNR_RETRY,
                    MAX_QP_RD_ATOMIC,
                    ALT_PATH,
                    ACCESS_FLAGS,
                    PKEY_INDEX,
                    PATH_MIG_STATE,
                ]),
            ),
            XrcTgt => (
                NONE,
                any(&[
                    PORT,
                    AV,
                    TIMEOUT,
                    MAX_DEST_RD_ATOMIC,
                    ALT_PATH,
                    ACCESS_FLAGS,
                    PKEY_INDEX,
                    MIN_RNR_TIMER,
                    PATH_MIG_STATE,
                ]),
            ),
            Uc => (NONE, any(&[AV, ALT_PATH, ACCESS_FLAGS, PKEY_INDEX, PATH_MIG_STATE])),
            Ud | Gsi => (NONE, any(&[PKEY_INDEX, QKEY])),
        },

        // SQE→RTS: recover from a send queue error (UC/UD). Linux has a valid entry for RC
        // and XRC too, with nothing required or optional, although they never enter SQE.
        (Sqe, Rts) => match qp_type {
            Rc | XrcIni | XrcTgt => (NONE, NONE),
            Uc => (NONE, any(&[CUR_STATE, ACCESS_FLAGS])),
            Ud | Gsi => (NONE, any(&[CUR_STATE, QKEY])),
        },

        _ => return None,
    };
    Some(TransitionRule { required, optional })
}

/// The states `current` may move to on a `qp_type` QP, in `ibv_qp_state` order.
pub fn valid_next_states(qp_type: QpType, current: QpState) -> impl Iterator<Item = QpState> + Clone {
    QpState::ALL.into_iter().filter(move |&next| transition_rule(qp_type, current, next).is_some())
}

/// Why [`check_modify`] refused a modify.
///
/// Every message says how to fix the call, naming bits and states as a C programmer writes
/// them (`IBV_QP_AV`, `IBV_QPS_RTS`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ModifyQpError {
    /// The table has no `current → next` entry for this QP type.
    #[error(
        "{current}→{next} is not a valid transition for {} {qp_type} QP{}: set IBV_QP_STATE in attr_mask and \
         attr.qp_state to one of {}",
        .qp_type.article(),
        InvalidHint(*.current, *.next),
        StateList(*.qp_type, *.current)
    )]
    InvalidTransition {
        /// The QP's type.
        qp_type: QpType,
        /// The state the QP is in.
        current: QpState,
        /// The state asked for (the current state when `IBV_QP_STATE` was not set).
        next: QpState,
    },
    /// Bits the transition requires are not set.
    #[error(
        "{} required for {}→{} on {} {qp_type} QP: add {} to attr_mask and fill in the matching struct ibv_qp_attr \
         field{}",
        .missing.c_expr(),
        .transition.0,
        .transition.1,
        .qp_type.article(),
        if .missing.count() == 1 { "it" } else { "them" },
        if .missing.count() == 1 { "" } else { "s" }
    )]
    MissingAttributes {
        /// The QP's type.
        qp_type: QpType,
        /// `(current, next)`.
        transition: (QpState, QpState),
        /// The required bits that were not set.
        missing: AttrMask,
    },
    /// Bits the transition does not accept are set.
    #[error(
        "{} not allowed for {}→{} on {} {qp_type} QP: remove {} from attr_mask (this transition accepts only {})",
        .unexpected.c_expr(),
        .transition.0,
        .transition.1,
        .qp_type.article(),
        if .unexpected.count() == 1 { "it" } else { "them" },
        Accepted(*.qp_type, .transition.0, .transition.1)
    )]
    UnexpectedAttributes {
        /// The QP's type.
        qp_type: QpType,
        /// `(current, next)`.
        transition: (QpState, QpState),
        /// The set bits the transition does not accept.
        unexpected: AttrMask,
    },
    /// `IBV_QP_CUR_STATE` was set and `attr.cur_qp_state` is not the state the QP is in.
    #[error(
        "IBV_QP_CUR_STATE claims attr.cur_qp_state = {} but the QP is in {}: set attr.cur_qp_state = {} or remove \
         IBV_QP_CUR_STATE from attr_mask",
        .claimed.c_name(),
        .actual.c_name(),
        .actual.c_name()
    )]
    CurrentStateMismatch {
        /// `attr.cur_qp_state`.
        claimed: QpState,
        /// The state the QP is in.
        actual: QpState,
    },
    /// `IBV_QP_STATE` was set but no target state was passed.
    #[error(
        "IBV_QP_STATE is set in attr_mask but no attr.qp_state was given: pass the target state, or remove \
         IBV_QP_STATE for an attribute-only modify"
    )]
    MissingNextState,
    /// `IBV_QP_CUR_STATE` was set but no claimed current state was passed.
    #[error(
        "IBV_QP_CUR_STATE is set in attr_mask but no attr.cur_qp_state was given: pass the state the QP is in, or \
         remove IBV_QP_CUR_STATE"
    )]
    MissingClaimedState,
}

/// Message helper: extra explanation after "... is not a valid transition for a X QP".
struct InvalidHint(QpState, QpState);

impl fmt::Display for InvalidHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0, self.1) {
            (QpState::Reset, QpState::Err) => f.write_str(" (a QP in RESET has nothing to flush; leave it in RESET)"),
            (cur, next) if cur == next => {
                f.write_str(" (which is also what an attr_mask without IBV_QP_STATE asks for)")
            }
            _ => Ok(()),
        }
    }
}

/// Message helper: the C names of the states `.1` may move to, `A, B or C`.
struct StateList(QpType, QpState);

impl fmt::Display for StateList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let states = valid_next_states(self.0, self.1);
        let n = states.clone().count();
        for (i, state) in states.enumerate() {
            match i {
                0 => {}
                i if i + 1 == n => f.write_str(" or ")?,
                _ => f.write_str(", ")?,
            }
            f.write_str(state.c_name())?;
        }
        Ok(())
    }
}

/// Message helper: what a valid transition accepts, as a C expression.
struct Accepted(QpType, QpState, QpState);

impl fmt::Display for Accepted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match transition_rule(self.0, self.1, self.2) {
            Some(rule) => {
                write!(f, "{}", rule.allowed().c_expr())?;
                if !rule.required.is_empty() {
                    let verb = if rule.required.count() == 1 { "is" } else { "are" };
                    write!(f, ", of which {} {verb} required", rule.required.c_expr())?;
                }
                Ok(())
            }
            None => f.write_str("nothing"),
        }
    }
}

/// Validates one `ibv_modify_qp` call on a QP of type `qp_type` that is in state `current`,
/// the way `ib_modify_qp_is_ok()` does, and returns the state the QP will be in.
///
/// - `mask` is `attr_mask` as the user gave it.
/// - `next` is `attr.qp_state`. It is read only when `mask` has `IBV_QP_STATE`; without that
///   bit the call is an attribute-only modify, checked as `current → current`, and `next` is
///   ignored (as C ignores `attr.qp_state`).
/// - `claimed_current` is `attr.cur_qp_state`, read only when `mask` has `IBV_QP_CUR_STATE`.
///   It must equal `current` (see the module docs), and the bit must be one the transition
///   accepts.
///
/// Checks run in this order, the first failure being returned: a flagged state value is
/// missing ([`ModifyQpError::MissingNextState`], [`ModifyQpError::MissingClaimedState`]), the
/// claimed state is wrong ([`ModifyQpError::CurrentStateMismatch`]), the transition does not
/// exist ([`ModifyQpError::InvalidTransition`]), required bits are missing
/// ([`ModifyQpError::MissingAttributes`]), bits are not accepted
/// ([`ModifyQpError::UnexpectedAttributes`]).
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    next: Option<QpState>,
    mask: AttrMask,
    claimed_current: Option<QpState>,
) -> Result<QpState, ModifyQpError> {
    let next = if mask.contains(AttrMask::STATE) { next.ok_or(ModifyQpError::MissingNextState)? } else { current };
    if mask.contains(AttrMask::CUR_STATE) {
        let claimed = claimed_current.ok_or(ModifyQpError::MissingClaimedState)?;
        if claimed != current {
            return Err(ModifyQpError::CurrentStateMismatch { claimed, actual: current });
        }
    }
    let rule =
        transition_rule(qp_type, current, next).ok_or(ModifyQpError::InvalidTransition { qp_type, current, next })?;
    let missing = rule.required - mask;
    if !missing.is_empty() {
        return Err(ModifyQpError::MissingAttributes { qp_type, transition: (current, next), missing });
    }
    let unexpected = mask - rule.allowed();
    if !unexpected.is_empty() {
        return Err(ModifyQpError::UnexpectedAttributes { qp_type, transition: (current, next), unexpected });
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    use QpType::{Gsi, Rc, Uc, Ud, XrcIni, XrcTgt};
    use proptest::prelude::*;

    // --- An independent transcription of the Linux table, in its own layout -----------------
    //
    // `qp_state_table[cur][next]` from drivers/infiniband/core/verbs.c (identical in v4.x and
    // 6.x for these columns), with the raw `IB_QP_*` values, and `ib_modify_qp_is_ok()`.

    const IB_QP_STATE: u32 = 1;
    const IB_QP_CUR_STATE: u32 = 1 << 1;
    const IB_QP_EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    const IB_QP_ACCESS_FLAGS: u32 = 1 << 3;
    const IB_QP_PKEY_INDEX: u32 = 1 << 4;
    const IB_QP_PORT: u32 = 1 << 5;
    const IB_QP_QKEY: u32 = 1 << 6;
    const IB_QP_AV: u32 = 1 << 7;
    const IB_QP_PATH_MTU: u32 = 1 << 8;
    const IB_QP_TIMEOUT: u32 = 1 << 9;
    const IB_QP_RETRY_CNT: u32 = 1 << 10;
    const IB_QP_RNR_RETRY: u32 = 1 << 11;
    const IB_QP_RQ_PSN: u32 = 1 << 12;
    const IB_QP_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    const IB_QP_ALT_PATH: u32 = 1 << 14;
    const IB_QP_MIN_RNR_TIMER: u32 = 1 << 15;
    const IB_QP_SQ_PSN: u32 = 1 << 16;
    const IB_QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    const IB_QP_PATH_MIG_STATE: u32 = 1 << 18;
    const IB_QP_DEST_QPN: u32 = 1 << 20;

    /// Column order of the per-type arrays below.
    const fn col(t: QpType) -> usize {
        match t {
            Ud => 0,
            Uc => 1,
            Rc => 2,
            Gsi => 3,
            XrcIni => 4,
            XrcTgt => 5,
        }
    }

    /// `(valid, req_param[UD, UC, RC, GSI, XRC_INI, XRC_TGT], opt_param[...])`.
    type Entry = (bool, [u32; 6], [u32; 6]);
    const INVALID: Entry = (false, [0; 6], [0; 6]);
    const VALID_EMPTY: Entry = (true, [0; 6], [0; 6]);

    fn linux_entry(cur: QpState, next: QpState) -> Entry {
        let mut table = [[INVALID; 7]; 7];
        let (reset, init, rtr, rts, sqd, sqe, err) = (0, 1, 2, 3, 4, 5, 6);
        table[reset][reset] = VALID_EMPTY;
        table[reset][init] = (
            true,
            [
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_QKEY,
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
                IB_QP_PKEY_INDEX | IB_QP_QKEY,
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
            ],
            [0; 6],
        );
        table[init][reset] = VALID_EMPTY;
        table[init][err] = VALID_EMPTY;
        table[init][init] = (
            true,
            [0; 6],
            [
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_QKEY,
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
                IB_QP_PKEY_INDEX | IB_QP_QKEY,
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
                IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS,
            ],
        );
        table[init][rtr] = (
            true,
            [
                0,
                IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN,
                IB_QP_AV
                    | IB_QP_PATH_MTU
                    | IB_QP_DEST_QPN
                    | IB_QP_RQ_PSN
                    | IB_QP_MAX_DEST_RD_ATOMIC
                    | IB_QP_MIN_RNR_TIMER,
                0,
                IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN,
                IB_QP_AV
                    | IB_QP_PATH_MTU
                    | IB_QP_DEST_QPN
                    | IB_QP_RQ_PSN
                    | IB_QP_MAX_DEST_RD_ATOMIC
                    | IB_QP_MIN_RNR_TIMER,
            ],
            [
                IB_QP_PKEY_INDEX | IB_QP_QKEY,
                IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
                IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
                IB_QP_PKEY_INDEX | IB_QP_QKEY,
                IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
                IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX,
            ],
        );
        table[rtr][reset] = VALID_EMPTY;
        table[rtr][err] = VALID_EMPTY;
        table[rtr][rts] = (
            true,
            [
                IB_QP_SQ_PSN,
                IB_QP_SQ_PSN,
                IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY | IB_QP_SQ_PSN | IB_QP_MAX_QP_RD_ATOMIC,
                IB_QP_SQ_PSN,
                IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY | IB_QP_SQ_PSN | IB_QP_MAX_QP_RD_ATOMIC,
                IB_QP_TIMEOUT | IB_QP_SQ_PSN,
            ],
            [
                IB_QP_CUR_STATE | IB_QP_QKEY,
                IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PATH_MIG_STATE,
                IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_MIN_RNR_TIMER | IB_QP_PATH_MIG_STATE,
                IB_QP_CUR_STATE | IB_QP_QKEY,
                IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PATH_MIG_STATE,
                IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_MIN_RNR_TIMER | IB_QP_PATH_MIG_STATE,
            ],
        );
        table[rts][reset] = VALID_EMPTY;
        table[rts][err] = VALID_EMPTY;
        table[rts][rts] = (
            true,
            [0; 6],
            [
                IB_QP_CUR_STATE | IB_QP_QKEY,
                IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS | IB_QP_ALT_PATH | IB_QP_PATH_MIG_STATE,
                IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS | IB_QP_ALT_PATH | IB_QP_PATH_MIG_STATE | IB_QP_MIN_RNR_TIMER,
                IB_QP_CUR_STATE | IB_QP_QKEY,
                IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS | IB_QP_ALT_PATH | IB_QP_PATH_MIG_STATE,
                IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS | IB_QP_ALT_PATH | IB_QP_PATH_MIG_STATE | IB_QP_MIN_RNR_TIMER,
            ],
        );
        table[rts][sqd] = (true, [0; 6], [IB_QP_EN_SQD_ASYNC_NOTIFY; 6]);
        table[sqd][reset] = VALID_EMPTY;
        table[sqd][err] = VALID_EMPTY;
        table[sqd][rts] = (
            true,
            [0; 6],
            [
                IB_QP_CUR_STATE | IB_QP_QKEY,
                IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PATH_MIG_STATE,
                IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_MIN_RNR_TIMER | IB_QP_PATH_MIG_STATE,
                IB_QP_CUR_STATE | IB_QP_QKEY,
                IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PATH_MIG_STATE,
                IB_QP_CUR_STATE | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_MIN_RNR_TIMER | IB_QP_PATH_MIG_STATE,
            ],
        );
        table[sqd][sqd] = (
            true,
            [0; 6],
            [
                IB_QP_PKEY_INDEX | IB_QP_QKEY,
                IB_QP_AV | IB_QP_ALT_PATH | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX | IB_QP_PATH_MIG_STATE,
                IB_QP_PORT
                    | IB_QP_AV
                    | IB_QP_TIMEOUT
                    | IB_QP_RETRY_CNT
                    | IB_QP_RNR_RETRY
                    | IB_QP_MAX_QP_RD_ATOMIC
                    | IB_QP_MAX_DEST_RD_ATOMIC
                    | IB_QP_ALT_PATH
                    | IB_QP_ACCESS_FLAGS
                    | IB_QP_PKEY_INDEX
                    | IB_QP_MIN_RNR_TIMER
                    | IB_QP_PATH_MIG_STATE,
                IB_QP_PKEY_INDEX | IB_QP_QKEY,
                IB_QP_PORT
                    | IB_QP_AV
                    | IB_QP_TIMEOUT
                    | IB_QP_RETRY_CNT
                    | IB_QP_RNR_RETRY
                    | IB_QP_MAX_QP_RD_ATOMIC
                    | IB_QP_ALT_PATH
                    | IB_QP_ACCESS_FLAGS
                    | IB_QP_PKEY_INDEX
                    | IB_QP_PATH_MIG_STATE,
                IB_QP_PORT
                    | IB_QP_AV
                    | IB_QP_TIMEOUT
                    | IB_QP_MAX_DEST_RD_ATOMIC
                    | IB_QP_ALT_PATH
                    | IB_QP_ACCESS_FLAGS
                    | IB_QP_PKEY_INDEX
                    | IB_QP_MIN_RNR_TIMER
                    | IB_QP_PATH_MIG_STATE,
            ],
        );
        table[sqe][reset] = VALID_EMPTY;
        table[sqe][err] = VALID_EMPTY;
        // No RC or XRC entry in Linux: req/opt for them stay 0 but the entry is valid.
        table[sqe][rts] = (
            true,
            [0; 6],
            [IB_QP_CUR_STATE | IB_QP_QKEY, IB_QP_CUR_STATE | IB_QP_ACCESS_FLAGS, 0, IB_QP_CUR_STATE | IB_QP_QKEY, 0, 0],
        );
        table[err][reset] = VALID_EMPTY;
        table[err][err] = VALID_EMPTY;
        table[cur as usize][next as usize]
    }

    /// `ib_modify_qp_is_ok(cur, next, type, mask)`.
    fn linux_is_ok(cur: QpState, next: QpState, t: QpType, mask: u32) -> bool {
        if mask & IB_QP_CUR_STATE != 0 && !matches!(cur, Rtr | Rts | Sqd | Sqe) {
            return false;
        }
        let (valid, req, opt) = linux_entry(cur, next);
        if !valid {
            return false;
        }
        let (req, opt) = (req[col(t)], opt[col(t)]);
        mask & req == req && mask & !(req | opt | IB_QP_STATE) == 0
    }

    /// What `check_modify` must answer: Linux's verdict with `cur = claimed` when
    /// IBV_QP_CUR_STATE is set (as rxe/mlx5 compute it), plus our rule that the claim must be
    /// the actual state.
    fn model(t: QpType, cur: QpState, next: Option<QpState>, mask: u32, claimed: Option<QpState>) -> Option<QpState> {
        let next = if mask & IB_QP_STATE != 0 { next? } else { cur };
        let linux_cur = if mask & IB_QP_CUR_STATE != 0 { claimed? } else { cur };
        (linux_cur == cur && linux_is_ok(linux_cur, next, t, mask)).then_some(next)
    }

    // --- The table --------------------------------------------------------------------------

    #[test]
    fn table_matches_linux_for_every_type_and_pair() {
        for t in QpType::ALL {
            for cur in QpState::ALL {
                for next in QpState::ALL {
                    let (valid, req, opt) = linux_entry(cur, next);
                    let expected = valid
                        .then_some(TransitionRule { required: AttrMask(req[col(t)]), optional: AttrMask(opt[col(t)]) });
                    assert_eq!(transition_rule(t, cur, next), expected, "{t} {cur}→{next}");
                }
            }
        }
    }

    #[test]
    fn golden_rows() {
        let rule = |t, c, n| transition_rule(t, c, n).expect("valid transition");
        type M = AttrMask;
        assert_eq!(
            rule(Rc, Init, Rtr).required,
            M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER
        );
        assert_eq!(rule(Rc, Init, Rtr).optional, M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX);
        assert_eq!(rule(Uc, Init, Rtr).required, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN);
        assert_eq!(rule(Ud, Init, Rtr).required, M::EMPTY);
        assert_eq!(rule(Ud, Init, Rtr).optional, M::PKEY_INDEX | M::QKEY);
        assert_eq!(
            rule(Rc, Rtr, Rts).required,
            M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
        );
        assert_eq!(
            rule(Rc, Rtr, Rts).optional,
            M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE
        );
        assert_eq!(rule(Uc, Rtr, Rts).required, M::SQ_PSN);
        assert_eq!(rule(Ud, Rtr, Rts).required, M::SQ_PSN);
        assert_eq!(rule(Ud, Reset, Init).required, M::PKEY_INDEX | M::PORT | M::QKEY);
        assert_eq!(rule(Rc, Reset, Init).required, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS);
        assert_eq!(rule(Uc, Reset, Init).required, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS);
        assert_eq!(rule(Gsi, Reset, Init).required, M::PKEY_INDEX | M::QKEY);
        assert_eq!(rule(Gsi, Init, Init).optional, M::PKEY_INDEX | M::QKEY);
        assert_eq!(rule(Ud, Init, Init).optional, M::PKEY_INDEX | M::PORT | M::QKEY);
        assert_eq!(rule(Rc, Rts, Sqd).optional, M::EN_SQD_ASYNC_NOTIFY);
        // XRC: the INI half is a requester (UC's RTR, RC's RTS), the TGT half a responder
        // (RC's RTR, a timeout and SQ_PSN only for RTS).
        assert_eq!(rule(XrcIni, Reset, Init).required, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS);
        assert_eq!(rule(XrcIni, Init, Rtr).required, M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN);
        assert_eq!(rule(XrcTgt, Init, Rtr).required, rule(Rc, Init, Rtr).required);
        assert_eq!(rule(XrcIni, Rtr, Rts).required, rule(Rc, Rtr, Rts).required);
        assert_eq!(rule(XrcIni, Rtr, Rts).optional, M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE);
        assert_eq!(rule(XrcTgt, Rtr, Rts).required, M::TIMEOUT | M::SQ_PSN);
        assert_eq!(rule(XrcTgt, Sqd, Sqd).optional - rule(Rc, Sqd, Sqd).optional, M::EMPTY);
        assert!(!rule(XrcTgt, Sqd, Sqd).optional.contains(M::RETRY_CNT), "a TGT QP never retries");
        assert_eq!(rule(Uc, Sqe, Rts).optional, M::CUR_STATE | M::ACCESS_FLAGS);
        assert_eq!(rule(Rc, Sqe, Rts), TransitionRule { required: M::EMPTY, optional: M::EMPTY });
        assert_eq!(rule(Rc, Sqd, Sqd).optional.count(), 12);
        for t in QpType::ALL {
            for s in QpState::ALL {
                assert_eq!(rule(t, s, Reset), TransitionRule { required: M::EMPTY, optional: M::EMPTY });
            }
        }
    }

    /// The allowed pairs listed in the brief (the same for every type).
    const ALLOWED: [(QpState, QpState); 22] = [
        (Reset, Reset),
        (Reset, Init),
        (Init, Reset),
        (Init, Err),
        (Init, Init),
        (Init, Rtr),
        (Rtr, Reset),
        (Rtr, Err),
        (Rtr, Rts),
        (Rts, Reset),
        (Rts, Err),
        (Rts, Rts),
        (Rts, Sqd),
        (Sqd, Reset),
        (Sqd, Err),
        (Sqd, Rts),
        (Sqd, Sqd),
        (Sqe, Reset),
        (Sqe, Err),
        (Sqe, Rts),
        (Err, Reset),
        (Err, Err),
    ];

    #[test]
    fn every_other_pair_is_rejected() {
        let mut rejected = 0;
        for t in QpType::ALL {
            for cur in QpState::ALL {
                for next in QpState::ALL {
                    let allowed = ALLOWED.contains(&(cur, next));
                    assert_eq!(transition_rule(t, cur, next).is_some(), allowed, "{t} {cur}→{next}");
                    if !allowed {
                        rejected += 1;
                        // Whatever bits come with it.
                        for mask in [AttrMask::STATE, AttrMask::STATE | AttrMask::KNOWN.difference(AttrMask::CUR_STATE)]
                        {
                            assert_eq!(
                                check_modify(t, cur, Some(next), mask, None),
                                Result::Err(ModifyQpError::InvalidTransition { qp_type: t, current: cur, next })
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(rejected, QpType::ALL.len() * (49 - 22));
        assert!(transition_rule(Rc, Reset, Err).is_none());
    }

    #[test]
    fn attribute_only_modify_is_current_to_current() {
        let m = AttrMask::ACCESS_FLAGS;
        // No IBV_QP_STATE: `next` is ignored, like attr.qp_state in C.
        assert_eq!(check_modify(Rc, Rts, None, m, None), Ok(Rts));
        assert_eq!(check_modify(Rc, Rts, Some(Reset), m, None), Ok(Rts));
        assert_eq!(check_modify(Rc, Init, None, AttrMask::PORT, None), Ok(Init));
        assert_eq!(check_modify(Rc, Reset, None, AttrMask::EMPTY, None), Ok(Reset));
        assert_eq!(
            check_modify(Rc, Rtr, None, m, None),
            Result::Err(ModifyQpError::InvalidTransition { qp_type: Rc, current: Rtr, next: Rtr })
        );
        assert_eq!(check_modify(Rc, Rts, None, AttrMask::STATE, None), Result::Err(ModifyQpError::MissingNextState));
    }

    #[test]
    fn cur_state_semantics() {
        let s = AttrMask::STATE | AttrMask::CUR_STATE;
        // Allowed where the table lists it, with a claim that matches.
        assert_eq!(check_modify(Ud, Sqe, Some(Rts), s, Some(Sqe)), Ok(Rts));
        assert_eq!(check_modify(Uc, Sqe, Some(Rts), s, Some(Sqe)), Ok(Rts));
        assert_eq!(check_modify(Rc, Sqd, Some(Rts), s, Some(Sqd)), Ok(Rts));
        assert_eq!(check_modify(Rc, Rts, None, AttrMask::CUR_STATE, Some(Rts)), Ok(Rts));
        // A claim that differs from the actual state.
        assert_eq!(
            check_modify(Ud, Rts, Some(Rts), s, Some(Sqe)),
            Result::Err(ModifyQpError::CurrentStateMismatch { claimed: Sqe, actual: Rts })
        );
        // The bit without a value.
        assert_eq!(check_modify(Ud, Sqe, Some(Rts), s, None), Result::Err(ModifyQpError::MissingClaimedState));
        // A value without the bit is ignored.
        assert_eq!(check_modify(Ud, Sqe, Some(Rts), AttrMask::STATE, Some(Init)), Ok(Rts));
        // Not allowed where the table does not list it, even with a true claim.
        for (t, cur, next) in [(Rc, Init, Rtr), (Rc, Rts, Err), (Rc, Rts, Sqd), (Rc, Sqe, Rts), (Ud, Reset, Init)] {
            let mask = s | transition_rule(t, cur, next).unwrap().required;
            assert_eq!(
                check_modify(t, cur, Some(next), mask, Some(cur)),
                Result::Err(ModifyQpError::UnexpectedAttributes {
                    qp_type: t,
                    transition: (cur, next),
                    unexpected: AttrMask::CUR_STATE
                }),
                "{t} {cur}→{next}"
            );
        }
    }

    #[test]
    fn rate_limit_cap_and_unknown_bits_are_never_accepted() {
        for t in QpType::ALL {
            for (cur, next) in ALLOWED {
                let rule = transition_rule(t, cur, next).unwrap();
                for extra in [AttrMask::RATE_LIMIT, AttrMask::CAP, AttrMask(1 << 21), AttrMask(1 << 31)] {
                    assert!(!rule.allowed().intersects(extra));
                    assert_eq!(
                        check_modify(t, cur, Some(next), AttrMask::STATE | rule.required | extra, None),
                        Result::Err(ModifyQpError::UnexpectedAttributes {
                            qp_type: t,
                            transition: (cur, next),
                            unexpected: extra
                        })
                    );
                }
            }
        }
    }

    /// For every type, every allowed transition and every mask built from the transition's
    /// own bits plus at most one foreign bit (all 32 positions tried), with and without
    /// IBV_QP_STATE where that makes sense: accepted iff
    /// `required ⊆ mask ⊆ required | optional | STATE` (CUR_STATE is in `optional` where
    /// allowed), and that agrees with `ib_modify_qp_is_ok()`.
    #[test]
    fn exhaustive_accepts_iff_required_subset_mask_subset_allowed() {
        let mut checked = 0u64;
        for t in QpType::ALL {
            for (cur, next) in ALLOWED {
                let rule = transition_rule(t, cur, next).unwrap();
                let own = rule.required | rule.optional;
                let own_bits: Vec<AttrMask> = own.iter().collect();
                let extras = (0..32).map(|i| AttrMask(1 << i)).filter(|b| !own.contains(*b) && *b != AttrMask::STATE);
                let extras: Vec<AttrMask> = core::iter::once(AttrMask::EMPTY).chain(extras).collect();
                let state_options: &[bool] = if cur == next { &[true, false] } else { &[true] };
                for subset in 0u32..(1 << own_bits.len()) {
                    let base: AttrMask =
                        own_bits.iter().enumerate().filter(|(i, _)| subset & (1 << i) != 0).map(|(_, b)| *b).collect();
                    for &extra in &extras {
                        for &with_state in state_options {
                            let mask = base | extra | if with_state { AttrMask::STATE } else { AttrMask::EMPTY };
                            let expect = mask.contains(rule.required)
                                && (rule.required | rule.optional | AttrMask::STATE).contains(mask);
                            let got = check_modify(t, cur, Some(next), mask, Some(cur));
                            assert_eq!(got.is_ok(), expect, "{t} {cur}→{next} mask {mask}: {got:?}");
                            assert_eq!(rule.accepts(mask), expect);
                            assert_eq!(linux_is_ok(cur, next, t, mask.0), expect, "{t} {cur}→{next} {mask}");
                            if let Ok(state) = got {
                                assert_eq!(state, next);
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    fn any_state() -> impl Strategy<Value = QpState> {
        (0u8..7).prop_map(|r| QpState::from_raw(r).unwrap())
    }

    fn any_type() -> impl Strategy<Value = QpType> {
        (0usize..QpType::ALL.len()).prop_map(|i| QpType::ALL[i])
    }

    /// Masks that are usually close to the interesting bits, sometimes anything.
    fn any_mask() -> impl Strategy<Value = u32> {
        prop_oneof![any::<u32>(), any::<u32>().prop_map(|m| m & AttrMask::KNOWN.0), (0u32..(1 << 21))]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Random calls agree with the transcribed `ib_modify_qp_is_ok()`; errors are of the
        /// kind the inputs call for.
        #[test]
        fn check_modify_agrees_with_linux(
            t in any_type(),
            cur in any_state(),
            next in proptest::option::of(any_state()),
            mask in any_mask(),
            claimed in proptest::option::weighted(0.9, any_state()),
            shape in 0u8..3,
        ) {
            // Two times out of three, make the mask fit the transition (add what it requires;
            // or that, and drop what it does not accept), so that the CUR_STATE, missing and
            // unexpected checks and acceptance are all reached often.
            let target = if mask & IB_QP_STATE != 0 { next.unwrap_or(cur) } else { cur };
            let mask = match (transition_rule(t, cur, target), shape) {
                (Some(rule), 1) => mask | rule.required.0,
                (Some(rule), 2) => (mask & (rule.allowed().0 | IB_QP_STATE)) | rule.required.0,
                _ => mask,
            };
            let got = check_modify(t, cur, next, AttrMask(mask), claimed);
            prop_assert_eq!(got.ok(), model(t, cur, next, mask, claimed));
            match got {
                Ok(_) => {}
                Result::Err(ModifyQpError::MissingAttributes { missing, qp_type, .. }) => {
                    prop_assert_eq!(qp_type, t);
                    prop_assert!(!missing.is_empty() && !missing.intersects(AttrMask(mask)));
                }
                Result::Err(ModifyQpError::UnexpectedAttributes { unexpected, .. }) => {
                    prop_assert!(!unexpected.is_empty() && AttrMask(mask).contains(unexpected));
                }
                Result::Err(ModifyQpError::CurrentStateMismatch { claimed: c, actual }) => {
                    prop_assert_eq!(Some(c), claimed);
                    prop_assert_eq!(actual, cur);
                    prop_assert_ne!(c, cur);
                }
                Result::Err(ModifyQpError::InvalidTransition { current, next: n, .. }) => {
                    prop_assert_eq!(current, cur);
                    prop_assert!(transition_rule(t, cur, n).is_none());
                }
                Result::Err(ModifyQpError::MissingNextState) => prop_assert!(next.is_none()),
                Result::Err(ModifyQpError::MissingClaimedState) => prop_assert!(claimed.is_none()),
            }
        }
    }

    // --- Messages ---------------------------------------------------------------------------

    #[test]
    fn missing_message_names_every_bit() {
        let err = check_modify(
            Rc,
            Init,
            Some(Rtr),
            AttrMask::STATE | AttrMask::DEST_QPN | AttrMask::RQ_PSN | AttrMask::MAX_DEST_RD_ATOMIC,
            None,
        )
        .unwrap_err();
        assert_eq!(
            err,
            ModifyQpError::MissingAttributes {
                qp_type: Rc,
                transition: (Init, Rtr),
                missing: AttrMask::AV | AttrMask::PATH_MTU | AttrMask::MIN_RNR_TIMER
            }
        );
        assert_eq!(
            err.to_string(),
            "IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER required for INIT→RTR on an RC QP: add them to \
             attr_mask and fill in the matching struct ibv_qp_attr fields"
        );
        let err = check_modify(Ud, Rtr, Some(Rts), AttrMask::STATE, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "IBV_QP_SQ_PSN required for RTR→RTS on a UD QP: add it to attr_mask and fill in the matching struct \
             ibv_qp_attr field"
        );
    }

    #[test]
    fn unexpected_message_names_the_bits_and_what_is_accepted() {
        let err =
            check_modify(Ud, Init, Some(Rtr), AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "IBV_QP_AV | IBV_QP_PATH_MTU not allowed for INIT→RTR on a UD QP: remove them from attr_mask (this \
             transition accepts only IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_QKEY)"
        );
        let err =
            check_modify(Uc, Rtr, Some(Rts), AttrMask::STATE | AttrMask::SQ_PSN | AttrMask(1 << 22), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "(1 << 22) not allowed for RTR→RTS on a UC QP: remove it from attr_mask (this transition accepts only \
             IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_SQ_PSN | \
             IBV_QP_PATH_MIG_STATE, of which IBV_QP_SQ_PSN is required)"
        );
    }

    #[test]
    fn invalid_and_state_messages_say_what_to_do() {
        let msg = |t, c, n| ModifyQpError::InvalidTransition { qp_type: t, current: c, next: n }.to_string();
        assert_eq!(
            msg(Rc, Reset, Rtr),
            "RESET→RTR is not a valid transition for an RC QP: set IBV_QP_STATE in attr_mask and attr.qp_state to \
             one of IBV_QPS_RESET or IBV_QPS_INIT"
        );
        assert_eq!(
            msg(Ud, Reset, Err),
            "RESET→ERR is not a valid transition for a UD QP (a QP in RESET has nothing to flush; leave it in \
             RESET): set IBV_QP_STATE in attr_mask and attr.qp_state to one of IBV_QPS_RESET or IBV_QPS_INIT"
        );
        assert_eq!(
            msg(Gsi, Rtr, Rtr),
            "RTR→RTR is not a valid transition for a GSI QP (which is also what an attr_mask without IBV_QP_STATE \
             asks for): set IBV_QP_STATE in attr_mask and attr.qp_state to one of IBV_QPS_RESET, IBV_QPS_RTS or \
             IBV_QPS_ERR"
        );
        assert_eq!(
            ModifyQpError::CurrentStateMismatch { claimed: Sqe, actual: Rts }.to_string(),
            "IBV_QP_CUR_STATE claims attr.cur_qp_state = IBV_QPS_SQE but the QP is in IBV_QPS_RTS: set \
             attr.cur_qp_state = IBV_QPS_RTS or remove IBV_QP_CUR_STATE from attr_mask"
        );
        assert!(ModifyQpError::MissingNextState.to_string().contains("remove IBV_QP_STATE"));
        assert!(ModifyQpError::MissingClaimedState.to_string().contains("remove IBV_QP_CUR_STATE"));
    }

    // --- AttrMask, QpState ------------------------------------------------------------------

    #[test]
    fn attr_mask_names_and_formatting() {
        assert_eq!(AttrMask::AV.name(), "IBV_QP_AV");
        assert_eq!(AttrMask::RATE_LIMIT.name(), "IBV_QP_RATE_LIMIT");
        assert_eq!(AttrMask::AV.short_name(), Some("AV"));
        assert_eq!((AttrMask::AV | AttrMask::QKEY).short_name(), None);
        assert!(!(AttrMask::AV | AttrMask::QKEY).name().starts_with("IBV_QP_"));
        assert!(!AttrMask(1 << 21).name().starts_with("IBV_QP_"));
        for (bit, short) in NAMED_BITS {
            assert_eq!(bit.count(), 1);
            assert_eq!(bit.name().strip_prefix("IBV_QP_"), Some(short));
        }
        assert_eq!(AttrMask::KNOWN.count(), 22);
        assert_eq!(AttrMask::KNOWN.0, 0x021f_ffff);

        let m = AttrMask::PATH_MTU | AttrMask::AV;
        assert_eq!(m.to_string(), "AV|PATH_MTU");
        assert_eq!(format!("{m:?}"), "AttrMask(AV|PATH_MTU)");
        assert_eq!(m.c_expr().to_string(), "IBV_QP_AV | IBV_QP_PATH_MTU");
        assert_eq!(AttrMask::EMPTY.to_string(), "0");
        assert_eq!(AttrMask::EMPTY.c_expr().to_string(), "0");
        assert_eq!((AttrMask::STATE | AttrMask(1 << 23)).to_string(), "STATE|BIT23");
        assert_eq!((AttrMask::STATE | AttrMask(1 << 23)).c_expr().to_string(), "IBV_QP_STATE | (1 << 23)");
        assert_eq!(AttrMask(1 << 23).unknown(), AttrMask(1 << 23));
        assert_eq!(AttrMask::KNOWN.unknown(), AttrMask::EMPTY);
    }

    #[test]
    fn attr_mask_set_operations() {
        let a = AttrMask::AV | AttrMask::QKEY | AttrMask::PORT;
        let b = AttrMask::QKEY | AttrMask::SQ_PSN;
        assert_eq!(a & b, AttrMask::QKEY);
        assert_eq!(a - b, AttrMask::AV | AttrMask::PORT);
        assert_eq!(a ^ b, AttrMask::AV | AttrMask::PORT | AttrMask::SQ_PSN);
        assert_eq!((!a).0, !a.0);
        assert!(a.contains(AttrMask::QKEY | AttrMask::PORT));
        assert!(a.contains(AttrMask::EMPTY));
        assert!(!a.contains(b));
        assert!(a.intersects(b));
        let mut c = a;
        c |= AttrMask::SQ_PSN;
        c &= !AttrMask::AV;
        c -= AttrMask::PORT;
        c ^= AttrMask::STATE;
        assert_eq!(c, AttrMask::STATE | AttrMask::QKEY | AttrMask::SQ_PSN);
        let bits: Vec<AttrMask> = a.iter().collect();
        assert_eq!(bits, [AttrMask::PORT, AttrMask::QKEY, AttrMask::AV]);
        assert_eq!(a.iter().len(), 3);
        assert_eq!(a.into_iter().collect::<AttrMask>(), a);
        assert_eq!(AttrMask(u32::MAX).iter().count(), 32);
        assert_eq!(u32::from(AttrMask::from(0x81)), 0x81);
        assert_eq!(AttrMask::from_bits(7).bits(), 7);
    }

    #[test]
    fn qp_state_raw_values_and_names() {
        for (i, s) in QpState::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(s.as_raw()), i);
            assert_eq!(QpState::try_from(s.as_raw()), Ok(s));
            assert_eq!(s.c_name().strip_prefix("IBV_QPS_"), Some(s.short_name()));
        }
        assert_eq!(QpState::try_from(7), Result::Err(7));
        assert_eq!(Rtr.to_string(), "RTR");
        assert_eq!(Gsi.to_string(), "GSI");
        assert_eq!((XrcIni.to_string(), XrcTgt.c_name()), ("XRC_INI".to_string(), "IBV_QPT_XRC_RECV"));
        assert_eq!(Rc.c_name(), "IBV_QPT_RC");
        assert_eq!(valid_next_states(Rc, Rts).collect::<Vec<_>>(), [Reset, Rts, Sqd, Err]);
    }
}
