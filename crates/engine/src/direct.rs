//! Atomics a requester applies itself, on a mapping of the responder's memory.
//!
//! Between two processes of one host an atomic's round trip (request, execution by the
//! responder's engine, answer) is most of its time. Where the responder's region is memory
//! the requester can map, the requester can do what the responder's engine would have done:
//! the CPU's atomic on the same physical word, which is atomic with the responder's own
//! threads and with every other requester, by packet or not. What only the responder's
//! engine can say is whether it *would* have executed it: the key, the PD, the QP's access,
//! the region's bounds and rights. So it says so after the fact, beside an atomic it did
//! execute: a *grant* ([`AtomicGrant`], in [`Transmit::grant`](crate::Transmit::grant)),
//! for the region the R_Key names, valid while the engine's [`grant_epoch`](Engine::grant_epoch)
//! stays where it was. The epoch moves on everything that could make the engine refuse the
//! next atomic on that key or QP: a region deregistered or reregistered, a QP modified,
//! destroyed or failed. The runtime publishes the epoch where requesters read it, and makes
//! and checks the mappings; the engine says when and what (this module), and the requester's
//! engine keeps RC's order ([`Engine::post_send_direct`]): an atomic is applied so only
//! when nothing its QP sent before is unacknowledged, completes at once, and takes no PSN
//! on either side. Anything unsure goes as a packet, as before, so every error is the
//! responder's engine's.

use crate::Engine;
use crate::completer;
use crate::engine::Shared;
use crate::memory::Memory;
use crate::qp::Qp;
use crate::reference::Payload;
use crate::verbs::{Access, PostError, QpState, QpType, SendOp, SendWr, WcStatus};
use softrdma_wire::{Qpn, RKey};

/// What a responder's engine vouches for beside an atomic it executed: its QP would execute
/// any atomic with `rkey` in `va .. va + len` (the whole region the key names), whose bytes
/// are at `local ..` in its process, until its [`grant_epoch`](Engine::grant_epoch) moves
/// from `epoch`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AtomicGrant {
    /// The region's R_Key.
    pub rkey: RKey,
    /// The address peers name the region's first byte by.
    pub va: u64,
    /// Its length.
    pub len: u64,
    /// Where that first byte is in the responder's process.
    pub local: u64,
    /// The responder's epoch when it vouched.
    pub epoch: u64,
}

impl AtomicGrant {
    /// The offset into the region of the 8 bytes at `va`, if they lie in it.
    pub fn offset_of(&self, va: u64) -> Option<u64> {
        let offset = va.checked_sub(self.va)?;
        (offset.checked_add(8)? <= self.len).then_some(offset)
    }
}

/// An atomic the requester may apply itself ([`Engine::post_send_direct`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DirectAtomic {
    /// The responder's QP (the requester QP's `dest_qp_num`).
    pub dest_qp: Qpn,
    /// The remote key and address (8-byte aligned).
    pub rkey: RKey,
    /// The remote address.
    pub va: u64,
    /// What to do there.
    pub op: DirectOp,
}

/// The two atomics of the verbs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DirectOp {
    /// If the 8 bytes equal `compare`, store `swap`.
    CompareSwap {
        /// Compared with the remote value.
        compare: u64,
        /// Stored if equal.
        swap: u64,
    },
    /// Add `add`, wrapping.
    FetchAdd {
        /// Added.
        add: u64,
    },
}

impl Shared {
    /// The grant for `rkey` that QP `qp` may give now: only a region's key (a window can
    /// be rebound or invalidated under a grant), of the QP's PD, with remote atomic access
    /// in both the region and the QP.
    pub(crate) fn grant_for(&self, qp: &mut Qp, rkey: RKey) -> Option<AtomicGrant> {
        // Whatever a grant depends on moves the epoch: the last one holds while it does.
        if let Some(g) = qp.last_grant.filter(|g| g.rkey == rkey && g.epoch == self.grant_epoch) {
            return Some(g);
        }
        if qp.qp_type != QpType::Rc
            || qp.state != QpState::Rts
            || !qp.attr.qp_access_flags.contains(Access::REMOTE_ATOMIC)
        {
            return None;
        }
        let mr =
            self.region_by_rkey(rkey.0).filter(|mr| mr.pd == qp.pd && mr.access.contains(Access::REMOTE_ATOMIC))?;
        let grant = AtomicGrant { rkey, va: mr.iova, len: mr.length, local: mr.addr, epoch: self.grant_epoch };
        qp.last_grant = Some(grant);
        Some(grant)
    }

    /// Something a grant stood for may have changed: every grant given so far is void.
    pub(crate) fn void_grants(&mut self) {
        self.grant_epoch += 1;
    }
}

impl Engine {
    /// The epoch of this engine's grants ([`AtomicGrant::epoch`]): a grant holds while this
    /// is its epoch. The runtime publishes it to requesters before it returns from a verb
    /// that moved it, and after each pass over received packets.
    pub fn grant_epoch(&self) -> u64 {
        self.shared.grant_epoch
    }

    /// The grant QP `qpn`'s last atomic answer carried ([`Transmit::grant`](crate::Transmit::grant)),
    /// while it holds.
    pub fn grant(&self, qpn: Qpn) -> Option<AtomicGrant> {
        self.qps.get(&qpn.value())?.last_grant.filter(|g| g.epoch == self.shared.grant_epoch)
    }

    /// `ibv_post_send` of one WR, which, if it is an atomic of an RC QP with nothing
    /// unacknowledged, `apply` may do itself on a mapping of the responder's memory (the
    /// runtime checks its grant): `Some(original)` is the value found, and the WR completes
    /// at once as if the responder's answer had come. `apply` returning `None`, or a WR it
    /// is not asked about, posts as [`post_send`](Self::post_send) does. A local buffer
    /// that cannot take the answer fails the QP as the answer would have
    /// (`IBV_WC_LOC_PROT_ERR`), after the remote atomic, as by packet.
    pub fn post_send_direct<M: Memory + ?Sized>(
        &mut self,
        qpn: Qpn,
        wr: &SendWr<'_>,
        mem: &mut M,
        apply: impl FnOnce(&DirectAtomic) -> Option<u64>,
    ) -> Result<(), PostError> {
        let Some(qp) = crate::engine::sending_qp(&mut self.qps, qpn) else {
            return Err(crate::engine::not_sending(&self.qps, qpn));
        };
        let sh = &mut self.shared;
        let direct = direct_atomic(qp, wr);
        let posted = crate::engine::post_sends(qp, core::slice::from_ref(wr), &*mem, sh);
        // Posted, at the head, nothing sent yet: the runtime may apply it.
        let pos = qp.sq.head();
        let applied = match direct {
            Some(d) if posted.is_ok() && qp.sq.len() == 1 && !qp.sq.get(pos).started => apply(&d),
            _ => None,
        };
        let Some(original) = applied else {
            sh.schedule(qp);
            return posted;
        };
        sh.counters.direct_atomics += 1;
        let sges = core::mem::take(&mut qp.sq.get_mut(pos).sges);
        let scattered = crate::sgl::scatter(sh, qp.pd, mem, &sges, 0, Payload::Bytes(&original.to_ne_bytes()));
        qp.sq.get_mut(pos).sges = sges;
        match scattered {
            Ok(()) => completer::complete_head(qp, sh, WcStatus::Success),
            Err(status) => completer::fail(qp, sh, status),
        }
        Ok(())
    }
}

/// The atomic `wr` asks of `qp`, if it may be applied directly: an RC QP in RTS that allows
/// atomics, with nothing posted, unacknowledged or unanswered, and an aligned address (an
/// unaligned one goes as a packet, for the responder to refuse).
fn direct_atomic(qp: &Qp, wr: &SendWr<'_>) -> Option<DirectAtomic> {
    let (rkey, va, op) = match wr.op {
        SendOp::CompareSwap { remote_addr, rkey, compare, swap } => {
            (rkey, remote_addr, DirectOp::CompareSwap { compare, swap })
        }
        SendOp::FetchAdd { remote_addr, rkey, add } => (rkey, remote_addr, DirectOp::FetchAdd { add }),
        _ => return None,
    };
    let idle = qp.sq.is_empty() && qp.comp.psn == qp.req.psn && qp.req.rd_atomic_outstanding == 0;
    let allowed = qp.qp_type == QpType::Rc && qp.state == QpState::Rts && qp.attr.max_rd_atomic > 0;
    (idle && allowed && va % 8 == 0 && qp.keys.is_none()).then_some(DirectAtomic {
        dest_qp: Qpn::from_u24_truncating(qp.attr.dest_qp_num),
        rkey,
        va,
        op,
    })
}
