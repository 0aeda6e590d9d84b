//! A queue pair's state: its queues, and what its requester, completer and responder are
//! in the middle of.
//!
//! The three parts hand each other values (a PSN to retry from, a WQE index to complete),
//! never flags in each other's state: that is where kernel rxe keeps finding races.

use std::collections::VecDeque;

use softrdma_wire::{Envelope, Psn, Qpn};

use crate::Instant;
use crate::verbs::{AddressVector, CqId, PdId, QpAttr, QpCap, QpState, QpType, SendOp, Sge, SrqId, UdDest, XrcdId};

/// A fixed-capacity ring whose slots are reused, so that posting a WR never allocates.
/// Positions are ever-increasing `u64` counters. The slots are a power of two, at least
/// the capacity, so a position's slot is a mask, not a division: a queue's ring is indexed
/// a dozen times per message, and a 64-bit `div` takes tens of cycles.
#[derive(Debug)]
pub(crate) struct Ring<T> {
    slots: Vec<T>,
    capacity: u32,
    head: u64,
    tail: u64,
}

impl<T: Default> Ring<T> {
    pub(crate) fn new(capacity: u32, mut make: impl FnMut() -> T) -> Self {
        let capacity = capacity.max(1);
        let slots = (0..capacity.next_power_of_two()).map(|_| make()).collect();
        Self { slots, capacity, head: 0, tail: 0 }
    }
}

impl<T> Ring<T> {
    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }
    pub(crate) fn len(&self) -> u32 {
        (self.tail - self.head) as u32
    }
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.capacity()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.tail
    }
    pub(crate) fn head(&self) -> u64 {
        self.head
    }
    pub(crate) fn tail(&self) -> u64 {
        self.tail
    }
    fn slot(&self, position: u64) -> usize {
        (position & (self.slots.len() as u64 - 1)) as usize
    }
    /// The slot at `position` (head ≤ position < tail).
    pub(crate) fn get(&self, position: u64) -> &T {
        debug_assert!(position >= self.head && position < self.tail, "ring position out of range");
        &self.slots[self.slot(position)]
    }
    pub(crate) fn get_mut(&mut self, position: u64) -> &mut T {
        debug_assert!(position >= self.head && position < self.tail, "ring position out of range");
        let i = self.slot(position);
        &mut self.slots[i]
    }
    /// The next free slot, to fill before [`commit`](Self::commit). The caller checked
    /// `!is_full()`.
    pub(crate) fn next_free(&mut self) -> &mut T {
        debug_assert!(!self.is_full());
        let i = self.slot(self.tail);
        &mut self.slots[i]
    }
    pub(crate) fn commit(&mut self) {
        self.tail += 1;
    }
    pub(crate) fn pop(&mut self) {
        debug_assert!(!self.is_empty());
        self.head += 1;
    }
    pub(crate) fn clear(&mut self) {
        self.head = self.tail;
    }
    /// Puts `value` back at the head, undoing the last [`pop`](Self::pop).
    pub(crate) fn unpop(&mut self, value: T) {
        debug_assert!(!self.is_full());
        self.head -= 1;
        let i = self.slot(self.head);
        self.slots[i] = value;
    }
}

/// A posted send WR, with the requester's progress on it.
#[derive(Debug, Default)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: Option<SendOp>,
    /// The gather list (capacity `max_send_sge`, reused).
    pub(crate) sges: Vec<Sge>,
    /// Inline data copied at post time (capacity `max_inline_data`, reused).
    pub(crate) inline: Vec<u8>,
    pub(crate) is_inline: bool,
    /// Total bytes: of the gather list, or 8 for an atomic's result.
    pub(crate) length: u32,
    pub(crate) signaled: bool,
    pub(crate) solicited: bool,
    pub(crate) fence: bool,
    pub(crate) ud: Option<UdDest>,
    /// XRC INI: the XRC SRQ at the target that takes it (every packet's XRCETH).
    pub(crate) xrc_srqn: u32,
    /// Set when its first packet is built: the PSNs it occupies.
    pub(crate) started: bool,
    /// How its data travels, decided when its first packet is built and kept when it is
    /// sent again from scratch, so that its PSNs stay the ones the peer counted.
    pub(crate) carriage: Carriage,
    pub(crate) first_psn: Psn,
    pub(crate) npkts: u32,
    /// Bytes of READ response data placed so far.
    pub(crate) read_done: u32,
    /// Its outcome, once known (completions are reported in order).
    pub(crate) status: Option<crate::verbs::WcStatus>,
}

impl SendWqe {
    pub(crate) fn op(&self) -> SendOp {
        self.op.unwrap_or(SendOp::Send)
    }
    /// Bytes each of its packets carries, or stands for (all but the last).
    pub(crate) fn unit(&self, mtu: u32) -> u32 {
        crate::reference::unit(self.carriage == Carriage::Reference, mtu)
    }
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.wrapping_add(self.npkts.saturating_sub(1))
    }
}

/// How a send WQE's data travels ([`crate::reference`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Carriage {
    /// Not sent yet.
    #[default]
    Undecided,
    /// In its packets, an MTU each.
    Bytes,
    /// By reference, a segment per packet.
    Reference,
}

/// A posted receive WR.
#[derive(Debug, Default, Clone)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: Vec<Sge>,
    pub(crate) length: u32,
}

/// The requester: turns send WQEs into packets.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// Next PSN to send.
    pub(crate) psn: Psn,
    /// The PSN after the furthest one ever sent: a packet before it is a retransmission
    /// (go-back-N moves `psn` back, never this).
    pub(crate) sent_end: Psn,
    /// Ring position of the WQE being sent.
    pub(crate) next: u64,
    /// Bytes of that WQE already sent.
    pub(crate) offset: u32,
    /// Packets since the last AckReq (rxe asks at least every 64).
    pub(crate) since_ack_req: u32,
    /// READs and atomics sent but not completed.
    pub(crate) rd_atomic_outstanding: u32,
}

impl Requester {
    /// Goes back to send the WQE at ring position `pos` again from byte `offset`, whose
    /// packet carries `psn` (go-back-N). The completer decides where; only the requester
    /// moves its cursor.
    pub(crate) fn rewind(&mut self, pos: u64, offset: u32, psn: Psn) {
        debug_assert!(pos <= self.next, "a rewind never moves the requester forward");
        debug_assert!(psn.distance_to(self.sent_end) >= 0, "a rewind stays inside the PSNs already sent");
        self.next = pos;
        self.offset = offset;
        self.psn = psn;
        self.since_ack_req = 0;
    }

    /// A READ or atomic it had sent is over (completed, or to be sent again from scratch).
    pub(crate) fn read_atomic_done(&mut self) {
        self.rd_atomic_outstanding = self.rd_atomic_outstanding.saturating_sub(1);
    }

    /// The WQEs before ring position `head` are gone: the cursor moves up to it if it was
    /// behind.
    pub(crate) fn skip_to(&mut self, head: u64) {
        if self.next < head {
            self.next = head;
            self.offset = 0;
        }
    }

    /// The send queue was emptied (flushed): nothing is left to send or outstanding.
    pub(crate) fn flushed(&mut self, tail: u64) {
        self.next = tail;
        self.offset = 0;
        self.rd_atomic_outstanding = 0;
    }
}

/// The completer: the oldest PSN not yet acknowledged, and the retry state it owns (the
/// requester only learns of a retry as a rewind, `Requester::rewind`).
#[derive(Debug, Default)]
pub(crate) struct Completer {
    pub(crate) psn: Psn,
    /// Retries left after timeouts and sequence errors.
    pub(crate) retry_left: u8,
    /// RNR retries left (7 = forever).
    pub(crate) rnr_retry_left: u8,
    /// Don't send before this instant (RNR back-off).
    pub(crate) rnr_wait_until: Option<Instant>,
    /// The local ACK timer.
    pub(crate) retransmit_at: Option<Instant>,
    /// A retry sequence (go-back-N after a NAK or an implied NAK) is under way: further
    /// NAKs and implied NAKs start no other until progress is made or the timer fires
    /// (rxe's `comp.started_retry`). Without it every duplicate's ACK would rewind again.
    pub(crate) retry_started: bool,
}

/// A response the responder owes, in the order it must go out.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RespJob {
    /// ACK or NAK for `psn`.
    Ack { psn: Psn, syndrome: softrdma_wire::Syndrome },
    /// READ response packets from `psn` on: `remaining` bytes from `va`, through `rkey` of
    /// PD `pd`, which is checked again for every packet (the MR may be deregistered
    /// meanwhile). The PD is the QP's, or for an XRC TGT QP the SRQ's that the READ named.
    Read { psn: Psn, va: u64, remaining: u32, first: bool, rkey: u32, pd: PdId, by_reference: bool },
    /// The answer to an atomic.
    /// `rkey`: the key it executed with, for a grant beside the answer ([`crate::direct`]);
    /// `None` for a duplicate answered from memory.
    AtomicAck { psn: Psn, original: u64, rkey: Option<softrdma_wire::RKey> },
}

/// A READ or atomic the responder remembers, to answer duplicates (IBA 9.7.5.1.2).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RdAtomicResource {
    pub(crate) first_psn: Psn,
    pub(crate) npkts: u32,
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    /// The PD its R_Key was checked in (an XRC TGT QP's changes with each request).
    pub(crate) pd: PdId,
    pub(crate) length: u32,
    /// For an atomic: the value it returned.
    pub(crate) atomic_original: Option<u64>,
    /// A READ asked for by reference, answered by reference ([`crate::reference`]).
    pub(crate) by_reference: bool,
}

/// The message the responder is in the middle of.
#[derive(Debug, Default)]
pub(crate) enum InMessage {
    /// Waiting for a FIRST or ONLY.
    #[default]
    None,
    /// A SEND into `wqe` (taken from the SRQ if `from_srq`), `offset` bytes placed so far.
    Send { wqe: RecvWqe, from_srq: bool, offset: u32 },
    /// An RDMA WRITE to `va` through `rkey`, `remaining` bytes to come of the `length` its
    /// RETH (in the FIRST or ONLY packet alone) announced.
    Write { va: u64, remaining: u32, length: u32, rkey: u32 },
    /// UC: a packet was lost; drop until the next FIRST or ONLY.
    Dropping,
}

/// The responder: executes incoming requests.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub(crate) psn: Psn,
    /// Message sequence number: requests completed.
    pub(crate) msn: u32,
    /// A sequence-error NAK was sent for `psn`; don't repeat it.
    pub(crate) nak_sent: bool,
    pub(crate) current: InMessage,
    pub(crate) out: VecDeque<RespJob>,
    pub(crate) resources: VecDeque<RdAtomicResource>,
    /// A packet arrived since RTR (for `IBV_EVENT_COMM_EST`).
    pub(crate) established: bool,
}

impl Responder {
    /// In the middle of a SEND or WRITE.
    pub(crate) fn in_message(&self) -> bool {
        matches!(self.current, InMessage::Send { .. } | InMessage::Write { .. })
    }
}

/// A queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub(crate) qpn: Qpn,
    pub(crate) qp_type: QpType,
    pub(crate) state: QpState,
    pub(crate) pd: PdId,
    pub(crate) send_cq: CqId,
    pub(crate) recv_cq: CqId,
    /// The SRQ it receives from; an XRC TGT QP's is the one its latest request named, whose
    /// PD and CQ are then `pd` and `recv_cq`.
    pub(crate) srq: Option<SrqId>,
    /// An XRC TGT QP's domain: the SRQs its requests may name.
    pub(crate) xrcd: Option<XrcdId>,
    pub(crate) sq_sig_all: bool,
    pub(crate) cap: QpCap,
    pub(crate) attr: QpAttr,
    /// The peer's address (RC/UC), once the AV is set ([`set_av`](Self::set_av)).
    av: Option<AddressVector>,
    /// The AV's GID as an IP address, kept beside it: read for every packet sent.
    peer_ip: Option<core::net::IpAddr>,
    /// The envelope of outgoing packets, computed from the AV.
    pub(crate) envelope: Option<Envelope>,
    /// RC/UC: the UDP source port the peer sends from, learnt from its first packet that
    /// proves it is the peer (`responder::proves_peer`); packets from any other port are
    /// dropped. rxe and RoCE NICs keep one source port per QP (rxe: `qp->src_port`, set
    /// with the AV; mlx5: per QP, changed only by `mlx5dv_modify_qp_udp_sport`); softrdma
    /// sends every packet from its device's port.
    pub(crate) peer_port: Option<u16>,
    /// RC/UC in authenticated mode: the keys its packets are tagged and checked with.
    pub(crate) keys: Option<Box<crate::auth::Sealer>>,
    /// Its long SENDs and WRITEs may go by reference (the runtime found its peer in a
    /// process of the host that copies from this one: [`crate::reference`]).
    pub(crate) by_reference: bool,
    /// It may carry the plain ACK it owes beside its next request
    /// ([`Engine::allow_acks_beside`](crate::Engine::allow_acks_beside)).
    pub(crate) acks_beside: bool,
    /// The last grant its answers carried ([`crate::direct`]): the same again while the
    /// R_Key and the epoch are.
    pub(crate) last_grant: Option<crate::direct::AtomicGrant>,
    /// Congestion control's state, from the first congestion signal on (the engine's
    /// `DeviceConfig::congestion` on).
    pub(crate) cc: Option<Box<crate::congestion::QpCongestion>>,
    pub(crate) sq: Ring<SendWqe>,
    pub(crate) rq: Ring<RecvWqe>,
    pub(crate) req: Requester,
    pub(crate) comp: Completer,
    pub(crate) resp: Responder,
    /// Queued in the engine's transmit round-robin.
    pub(crate) in_ready: bool,
    /// Its part in its peer's window (RC).
    pub(crate) window: crate::window::Share,
    /// `IBV_EVENT_SQ_DRAINED` was raised for the current stay in SQD.
    pub(crate) sq_drained_reported: bool,
    /// The deadline registered in the engine's timer set.
    pub(crate) timer: Option<Instant>,
    /// Its share of the device's retry and NAK counters (`softrdma res`).
    pub(crate) counters: crate::inspect::QpCounters,
}

impl Qp {
    pub(crate) fn new(qpn: Qpn, pd: PdId, init: &crate::verbs::QpInitAttr) -> Self {
        let cap = init.cap;
        let sq = Ring::new(cap.max_send_wr, || SendWqe {
            sges: Vec::with_capacity(cap.max_send_sge as usize),
            inline: Vec::with_capacity(cap.max_inline_data as usize),
            ..SendWqe::default()
        });
        let rq_depth = if init.srq.is_some() { 1 } else { cap.max_recv_wr };
        let rq = Ring::new(rq_depth, || RecvWqe {
            sges: Vec::with_capacity(cap.max_recv_sge as usize),
            ..RecvWqe::default()
        });
        Self {
            qpn,
            qp_type: init.qp_type,
            state: QpState::Reset,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            xrcd: None,
            sq_sig_all: init.sq_sig_all,
            cap,
            attr: QpAttr::default(),
            av: None,
            peer_ip: None,
            envelope: None,
            peer_port: None,
            keys: None,
            by_reference: false,
            acks_beside: false,
            last_grant: None,
            cc: None,
            sq,
            rq,
            req: Requester::default(),
            comp: Completer::default(),
            resp: Responder { out: VecDeque::with_capacity(64), ..Responder::default() },
            in_ready: false,
            window: crate::window::Share::default(),
            sq_drained_reported: false,
            timer: None,
            counters: crate::inspect::QpCounters::default(),
        }
    }

    /// The peer's address vector (RC/UC, from RTR on).
    pub(crate) fn av(&self) -> Option<AddressVector> {
        self.av
    }

    /// Sets (or clears) the peer's address vector.
    pub(crate) fn set_av(&mut self, av: Option<AddressVector>) {
        self.av = av;
        self.peer_ip = av.map(|av| av.dgid.to_ip());
    }

    /// The connected peer's address (RC/UC, from RTR on).
    pub(crate) fn peer_ip(&self) -> Option<core::net::IpAddr> {
        self.peer_ip
    }

    /// Path MTU in bytes (UD: the device's port MTU, set at creation in `attr.path_mtu`).
    pub(crate) fn mtu(&self) -> u32 {
        self.attr.path_mtu.bytes()
    }

    /// The earliest instant this QP wants to be woken.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let cc = self.cc.as_deref().and_then(crate::congestion::QpCongestion::deadline);
        Instant::earliest(Instant::earliest(self.comp.retransmit_at, self.comp.rnr_wait_until), cc)
    }
}
