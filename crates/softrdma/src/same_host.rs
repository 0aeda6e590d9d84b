//! The same-host path: packets to another process of this host on the same device go
//! through that process's shared-memory inbox ([`softrdma_udp::local`]) instead of a socket.
//!
//! The engine sees no difference: each packet is the one the socket would have carried, in
//! the envelope the receiver would have read, so every check, PSN, ACK, retry and error is
//! the engine's as on the wire. A destination is on this host when its address is one of
//! the device's and its port the device's; its process is the owner of its QPN's slot
//! (`softrdma_udp::host`). Where the inbox cannot be opened (no such process or none made,
//! another user's, every lane taken) the packets take the socket, and the inbox is tried
//! again a second later.
//!
//! Long SENDs, WRITEs and READs between two processes that can each copy from the other's
//! memory travel by reference: the receiver copies their data once, from the sender, after
//! its engine's checks (`softrdma_engine::reference`). [`SameHost::send`] says when a QP's
//! peer is such a process; the driver then allows the QP, and never under a capture.
//!
//! An RC QP that answers a request at once carries the request's ACK beside its answer
//! (`softrdma_engine::Engine::allow_acks_beside`), in the inbox entry, where its inbox
//! takes them (not while its process captures, as a capture must show every packet):
//! [`SameHost::send`] says so too.
//!
//! An atomic's answer carries the grant its engine gave (`softrdma_engine::direct`) beside
//! it, where the region is a memfd of this process ([`crate::memory::shared_region`]) and
//! the requester's inbox takes grants: the requester maps the region
//! ([`softrdma_udp::peer_region`]) and applies the QP's next atomics to it itself
//! ([`SameHost::direct_atomic`]), through this inbox's gate, which stands open at the
//! engine's grant epoch and is closed, and its senders waited for, whenever the epoch moves
//! or the application reaches its regions ([`SameHost::close_gate`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};
use std::time::Duration;

use softrdma_engine::{AckBeside, AtomicGrant, DirectAtomic, DirectOp, Instant, IpInfo, Transmit};
use softrdma_udp::IpInfo as UdpIpInfo;
use softrdma_udp::host::QPN_SLOT_BITS;
use softrdma_udp::local::{self, Arrived, Beside, Grant, Inbox, Outbox, Sleepers, inbox_name};
use softrdma_udp::peer_region::PeerRegion;
use softrdma_wire::{AethRepr, BthPacket, Envelope, Msn, Opcode, Psn, RocePacket, Syndrome};

/// How long a destination whose inbox could not be opened stays on the socket.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// `SOFTRDMA_SAME_HOST=0` keeps every packet on the sockets (`ContextOptions::same_host`).
pub const SAME_HOST_ENV: &str = "SOFTRDMA_SAME_HOST";
/// IP hop limit reported for a packet that came through shared memory: what a loopback
/// datagram from a default socket arrives with.
const HOP_LIMIT: u8 = 64;
/// How long closing the gate waits for a requester inside it, which takes nanoseconds
/// unless its thread was descheduled there ([`Inbox::close_gate`]). One still inside then
/// (stopped there: `SIGSTOP`, a debugger) is left behind, as a NIC never waits for another
/// host's CPU, and waited for again at each later close until it left
/// ([`SameHost::close_gate`]).
const GATE_PATIENCE: Duration = Duration::from_millis(100);

/// How often the grants held are checked against their responders' gates, so that a
/// mapping of a region its responder deregistered (or of a process that went away) is
/// not kept for a grant that will never be used again ([`SameHost::prune`]).
const PRUNE_EVERY: Duration = Duration::from_secs(1);

/// A grant this process holds: the responder's region mapped here, and what it was
/// granted for.
struct Held {
    region: Arc<PeerRegion>,
    /// The responder's QP, and the slot of its inbox (whose gate the grant goes through).
    qp: u32,
    slot: u32,
    /// The responder's process.
    pid: u32,
    va: u64,
    len: u64,
    offset: u64,
    epoch: u64,
}

enum Route {
    /// Through its inbox; `true` once each process copies from the other; what this process
    /// saw of the receiver's taking ([`SameHost::nudge_stalled`]).
    Inbox(Outbox, bool, Watch),
    /// On the socket until then.
    Socket(Instant),
}

/// What a sender last saw of a receiver's taking of its lane ([`SameHost::nudge_stalled`]).
#[derive(Clone, Copy, Debug, Default)]
struct Watch {
    /// The lane's tail as last read.
    tail: u64,
    /// Entries published were left untaken at that read.
    pending: bool,
    /// Since when the tail has not moved with entries pending (or since the last nudge).
    since: Instant,
}

/// How often a polling application's empty polls look whether the receivers take what
/// this process published ([`SameHost::nudge_stalled`]): a read of each pending lane's
/// tail, a line the receiver writes, at most this often.
const NUDGE_LOOK_EVERY: Duration = Duration::from_micros(25);
/// How long a receiver may leave published entries untaken, taking none, before its bell
/// is rung for them: far longer than a polling receiver leaves them (a microsecond or
/// two) or a sleeping one rung at publication takes to wake (15–30 µs here), so that
/// nudges are rare where the receiver polls. A receiver's polling thread descheduled for
/// longer gets one all the same: in a polled 8 B WRITE ping-pong (`softrdma perf write
/// lat --loopback -D 3`, both sides polling, two cores for four threads) 32 µs rang
/// 1 300–2 100 nudges in 2.5 s, 100 µs 150–190, 250 µs 60–90 (2026-12-03).
const NUDGE_AFTER: Duration = Duration::from_micros(100);

/// How a packet came through the inbox, beside what a socket would have told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FromInbox {
    /// Its data is carried by reference: the process to copy it from.
    pub(crate) origin: Option<u32>,
    /// An ACK to take before it.
    pub(crate) ack: Option<AckBeside>,
}

/// What [`SameHost::send`] learnt of the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Receiver {
    /// It and this process each copy from the other: RC QPs to it may send by reference.
    pub(crate) mutual: bool,
    /// Its inbox takes ACKs beside packets.
    pub(crate) acks_beside: bool,
}

/// The device's inbox and its routes to other processes' inboxes.
pub(crate) struct SameHost {
    inbox: Inbox,
    device: String,
    port: u16,
    addresses: Vec<IpAddr>,
    /// By destination slot: a few processes, mostly one (a `HashMap`'s SipHash of the
    /// slot was a tenth of a same-host SEND's instructions).
    routes: BTreeMap<u32, Route>,
    /// The batch's first packet was published as it was sent ([`send`](Self::send)); the
    /// rest are at [`flush`](Self::flush).
    published_early: bool,
    /// Packets sent and received through shared memory (an ACK beside a packet counts as one).
    pub(crate) sent: u64,
    pub(crate) received: u64,
    /// Receivers' bells rung because they left this process's packets untaken
    /// ([`nudge_stalled`](Self::nudge_stalled)).
    pub(crate) nudges: u64,
    /// Nudges this process's progress thread took the inbox on while its application
    /// polled (its application had stopped polling, to wait in its memory).
    pub(crate) nudged: u64,
    /// When [`nudge_stalled`](Self::nudge_stalled) next looks.
    next_look: Instant,
    /// The grants this process holds, by its QP and the region's R_Key (a few: a tree's
    /// compares cost less than SipHash on each atomic).
    grants: BTreeMap<(u32, u32), Held>,
    /// Other processes' regions mapped here, by process and inode (shared by the grants
    /// that name them; gone with the last).
    regions: HashMap<(u32, u64), Weak<PeerRegion>>,
    /// How many times the gate closed: a requester whose grant met it closed dropped it.
    closings: u64,
    /// The grants sent, by this process's QP and R_Key: the epoch and closings they were
    /// sent at. One that still holds is not sent again (a requester that holds it applies
    /// its atomics itself; one that goes by packet, behind unacknowledged work, has it).
    granted: BTreeMap<(u32, u32), (u64, u64)>,
    /// When the grants held are next checked ([`prune`](Self::prune)).
    next_prune: Instant,
    /// Grants this process could not map (by its QP and the R_Key): it asks for them no
    /// more ([`asks_grant`](Self::asks_grant)).
    unmappable: BTreeSet<(u32, u32)>,
}

impl SameHost {
    /// Makes this process's inbox for `slot` of `device`; with `pulls`, senders may send it
    /// data by reference, with `acks_beside` ACKs beside packets ([`Inbox::create`]).
    /// `None` where shared memory is not available (no writable `/dev/shm`).
    pub(crate) fn open(
        device: &str,
        port: u16,
        slot: u32,
        addresses: &[IpAddr],
        pulls: bool,
        acks_beside: bool,
    ) -> Option<SameHost> {
        let inbox = inbox_name(device, port, slot).and_then(|name| Inbox::create(&name, pulls, acks_beside)).ok()?;
        Some(SameHost {
            inbox,
            device: device.to_string(),
            port,
            addresses: addresses.to_vec(),
            routes: BTreeMap::new(),
            published_early: false,
            sent: 0,
            received: 0,
            nudges: 0,
            nudged: 0,
            next_look: Instant::ZERO,
            grants: BTreeMap::new(),
            regions: HashMap::new(),
            closings: 0,
            granted: BTreeMap::new(),
            next_prune: Instant::ZERO,
            unmappable: BTreeSet::new(),
        })
    }

    /// Sends `datagram` (what the engine wrote for `t`, the ACK beside it, and the `grant` its
    /// engine gives beside an atomic's answer) through
    /// shared memory if its destination is a process of this host. `None`: send it on the
    /// socket; `Some`: sent, and what the receiver takes: whether its process and this one
    /// each copy from the other (the receiver from this one, [`Outbox::pulls`], for SENDs
    /// and WRITEs, this one from it, [`Inbox::pulls_from`], for READs' answers), and
    /// whether it takes ACKs beside packets ([`Outbox::acks_beside`]).
    pub(crate) fn send(
        &mut self,
        now: Instant,
        t: &Transmit,
        grant: Option<AtomicGrant>,
        ecn: u8,
        datagram: &[u8],
    ) -> Option<Receiver> {
        if !self.takes(&t.envelope) {
            return None;
        }
        let slot = BthPacket::new_unchecked(datagram).dest_qp().value() >> QPN_SLOT_BITS;
        if slot == 0 {
            return None; // QP0/QP1: the CM's MADs, steered by the host's program
        }
        let route = self.routes.entry(slot).or_insert(Route::Socket(Instant::ZERO));
        if let Route::Inbox(out, ..) = route
            && out.is_closed()
        {
            *route = Route::Socket(Instant::ZERO);
            // Its process is gone: so are its grants, and the mappings of its regions.
            self.grants.retain(|_, h| h.slot != slot);
        }
        if let Route::Socket(until) = *route {
            if now < until {
                return None;
            }
            *route = match inbox_name(&self.device, self.port, slot).and_then(|name| Outbox::open(&name)) {
                Ok(out) => Route::Inbox(out, false, Watch::default()),
                Err(_) => Route::Socket(now.saturating_add(RETRY_AFTER)),
            };
        }
        let Route::Inbox(out, mutual, _) = route else { return None };
        // The QP's DSCP with the device's ECN bits, as `send_units` gives a datagram.
        let ip = UdpIpInfo { hop_limit: HOP_LIMIT, traffic_class: t.traffic_class & !0b11 | ecn, flow_label: 0 };
        // An ACK beside goes only to an inbox that takes it (the engine carries one only for
        // a QP the driver allowed so, from an earlier answer of this method).
        let acks_beside = out.acks_beside();
        let ack = t.ack_beside.filter(|_| acks_beside).map(|a| local::AckBeside {
            psn: a.psn.value(),
            syndrome: a.aeth.syndrome.to_u8(),
            msn: a.aeth.msn.value(),
        });
        // A grant goes only to an inbox that takes it, for a region other processes can map;
        // the gate opens at its epoch before the requester can see it.
        let closings = self.closings;
        let granted = &mut self.granted;
        let grant = grant.filter(|_| out.takes_grants()).and_then(|g| {
            let sent = granted.entry((t.local_qp.value(), g.rkey.0)).or_insert((u64::MAX, 0));
            if *sent == (g.epoch, closings) {
                return None;
            }
            let region = crate::memory::shared_region(g.local, g.len)?;
            *sent = (g.epoch, closings);
            Some(Grant {
                qp: t.local_qp.value(),
                rkey: g.rkey.0,
                va: g.va,
                len: g.len,
                fd: u32::try_from(region.fd).ok()?,
                ino: region.ino,
                offset: region.offset,
                epoch: g.epoch,
            })
        });
        if let Some(g) = grant
            && let open = self.inbox.gate()
            && open != Some(g.epoch)
        {
            if open.is_some() {
                close_gate(&mut self.inbox);
                self.closings += 1;
            }
            self.inbox.open_gate(g.epoch);
            // Grants sent at earlier epochs hold no more: what they were sent at is of no use.
            self.granted.retain(|_, (epoch, _)| *epoch == g.epoch);
        }
        // (Only into an inbox that takes grants: `Outbox::send` keeps the flag to those.)
        let asks_grant = asks_grant(&self.grants, &self.unmappable, t.local_qp.value(), datagram);
        out.send(&t.envelope, ip, datagram, Beside { by_reference: t.by_reference, ack, grant, asks_grant }).ok()?;
        self.sent += 1 + u64::from(ack.is_some());
        if !self.published_early {
            // The batch's first packet is published at once: a one-WR post (a ping-pong's
            // answer) is seen while this process finishes its pass, not after it.
            self.published_early = true;
            out.wake();
        }
        if !*mutual {
            *mutual = out.pulls() && self.inbox.pulls_from(out.receiver());
        }
        Some(Receiver { mutual: *mutual, acks_beside })
    }

    /// Whether a packet in `envelope` goes to this host's device, whose process may take it
    /// through its inbox ([`send`](Self::send) says).
    pub(crate) fn takes(&self, envelope: &Envelope) -> bool {
        envelope.dst_port() == self.port && self.addresses.contains(&envelope.dst_ip())
    }

    /// After a batch of sends: wakes the receivers that sleep, and moves what waits for
    /// room in a lane. Returns whether anything still waits.
    pub(crate) fn flush(&mut self) -> bool {
        self.published_early = false;
        let mut waiting = false;
        for route in self.routes.values_mut() {
            if let Route::Inbox(out, ..) = route {
                waiting |= !out.flush();
                out.wake();
            }
        }
        waiting
    }

    /// Rings the bell of each receiver that has left packets of this process untaken, and
    /// taken none, for [`NUDGE_AFTER`]. Called by an application's empty polls (an
    /// application that waits for its peer's answer), it looks at most every
    /// [`NUDGE_LOOK_EVERY`], and reads a lane's tail only while entries of it may be
    /// pending.
    ///
    /// A receiver whose application polled of late leaves its inbox to that application's
    /// next poll (its progress thread only keeps the timers, for up to `APP_POLL_WINDOW`).
    /// But a C program may poll its CQ and then wait in its own memory for the peer's
    /// WRITE, calling no verb (`ib_write_lat` does, each side polling its send CQ for its
    /// own WRITE's ACK in between): a WRITE that comes then waited in the inbox until the
    /// progress thread's next look, up to a millisecond, while the peer polled for the ACK
    /// that the WRITE's taking would send. The nudge wakes the receiver's progress thread,
    /// which watches the bell for it, and takes the inbox.
    pub(crate) fn nudge_stalled(&mut self, now: Instant) {
        if now < self.next_look {
            return;
        }
        self.next_look = now.saturating_add(NUDGE_LOOK_EVERY);
        for route in self.routes.values_mut() {
            let Route::Inbox(out, _, watch) = route else { continue };
            let published = out.published();
            if !watch.pending && published == watch.tail {
                continue; // all it published was taken at the last look
            }
            let tail = out.taken();
            let pending = tail != published;
            if !pending || !watch.pending || tail != watch.tail {
                // Taken, or taking, or newly pending: (re)start the clock.
                *watch = Watch { tail, pending, since: now };
            } else if now - watch.since >= NUDGE_AFTER {
                out.nudge();
                self.nudges += 1;
                watch.since = now;
            }
        }
    }

    /// Hands up to `max` packets from other processes to `deliver`, each with the process
    /// its data is to be copied from if it is carried by reference and the ACK to take
    /// before it, if one came beside it. Returns how many.
    pub(crate) fn receive(
        &mut self,
        max: usize,
        mut deliver: impl FnMut(&Envelope, IpInfo, &[u8], FromInbox),
    ) -> usize {
        let mut acks = 0;
        let SameHost { inbox, grants, regions, routes, granted, unmappable, .. } = self;
        let n = inbox.receive(max, |envelope, ip, datagram, Arrived { origin, ack, grant, asks_grant }| {
            acks += u64::from(ack.is_some());
            if let Some((pid, grant)) = grant {
                let qpn = BthPacket::new_unchecked(datagram).dest_qp().value();
                if !take_grant(grants, regions, routes, qpn, pid, grant) {
                    unmappable.insert((qpn, grant.rkey));
                }
            }
            if asks_grant && let Some(rkey) = atomic_rkey(datagram) {
                // Its answer carries the grant, if the engine gives one, sent before or not.
                granted.remove(&(BthPacket::new_unchecked(datagram).dest_qp().value(), rkey));
            }
            let ip = IpInfo { hop_limit: ip.hop_limit, traffic_class: ip.traffic_class, flow_label: ip.flow_label };
            let ack = ack.map(|a| AckBeside {
                psn: Psn::from_u24_truncating(a.psn),
                aeth: AethRepr { syndrome: Syndrome::from_u8(a.syndrome), msn: Msn::from_u24_truncating(a.msn) },
            });
            deliver(envelope, ip, datagram, FromInbox { origin, ack });
        });
        self.received += n as u64 + acks;
        n
    }

    /// Applies `d`, an atomic of local QP `qpn`, to the responder's memory, if this
    /// process holds a grant for it that still holds (its epoch is the responder's gate's):
    /// the value found. `None`: it goes as a packet (and a grant that no longer holds is
    /// dropped).
    pub(crate) fn direct_atomic(&mut self, qpn: u32, d: &DirectAtomic) -> Option<u64> {
        let key = (qpn, d.rkey.0);
        let held = self.grants.get(&key)?;
        let offset = d.va.checked_sub(held.va).filter(|o| o.checked_add(8).is_some_and(|end| end <= held.len));
        let (Some(offset), true) = (offset, held.qp == d.dest_qp.value()) else { return None };
        let at = held.offset + offset;
        let out = match self.routes.get(&held.slot) {
            Some(Route::Inbox(out, ..)) if out.receiver() == held.pid => out,
            _ => {
                self.grants.remove(&key);
                return None;
            }
        };
        if !out.enter_gate(held.epoch) {
            self.grants.remove(&key);
            return None;
        }
        let found = match d.op {
            DirectOp::FetchAdd { add } => held.region.fetch_add(at, add),
            DirectOp::CompareSwap { compare, swap } => held.region.compare_swap(at, compare, swap),
        };
        out.leave_gate();
        found
    }

    /// Drops the grants held for local QP `qpn`, which is destroyed, and what this process
    /// granted its peer: its QPN may name another QP next.
    pub(crate) fn forget_qp(&mut self, qpn: u32) {
        self.grants.retain(|&(q, _), _| q != qpn);
        self.granted.retain(|&(q, _), _| q != qpn);
        self.unmappable.retain(|&(q, _)| q != qpn);
        self.regions.retain(|_, r| r.strong_count() > 0);
    }

    /// Now and then ([`PRUNE_EVERY`]): drops the grants held that no longer hold (their
    /// responder's gate moved on, or its inbox closed), and with the last of a region's,
    /// its mapping. A grant is otherwise dropped only when an atomic tries it.
    pub(crate) fn prune(&mut self, now: Instant) {
        if self.grants.is_empty() || now < self.next_prune {
            return;
        }
        self.next_prune = now.saturating_add(PRUNE_EVERY);
        let routes = &self.routes;
        self.grants.retain(|_, h| match routes.get(&h.slot) {
            Some(Route::Inbox(out, ..)) => out.receiver() == h.pid && !out.is_closed() && out.gate() == Some(h.epoch),
            _ => false,
        });
        self.regions.retain(|_, r| r.strong_count() > 0);
    }

    /// When [`prune`](Self::prune) next has work, if it may: while grants are held.
    pub(crate) fn next_prune(&self) -> Option<Instant> {
        (!self.grants.is_empty()).then_some(self.next_prune)
    }

    /// Whether this process holds any grant (a post then asks [`direct_atomic`](Self::direct_atomic)).
    pub(crate) fn holds_grants(&self) -> bool {
        !self.grants.is_empty()
    }

    /// The epoch the inbox's gate stands open at, if it is (only this process writes it).
    #[inline]
    pub(crate) fn gate(&self) -> Option<u64> {
        self.inbox.gate()
    }

    /// Whether a [`close_gate`](Self::close_gate) has anything to do: the gate is open, or a
    /// requester was left inside it.
    pub(crate) fn gate_to_close(&self) -> bool {
        self.gate().is_some() || self.inbox.undrained()
    }

    /// Closes the inbox's gate and waits for the requesters inside (and for any an earlier
    /// close left inside): no other process applies an atomic to this process's regions
    /// until a grant opens it again ([`send`](Self::send)). Returns the epoch it stood
    /// open at.
    pub(crate) fn close_gate(&mut self) -> Option<u64> {
        let was = self.gate();
        if was.is_some() || self.inbox.undrained() {
            close_gate(&mut self.inbox);
        }
        self.closings += u64::from(was.is_some());
        was
    }

    /// Opens the gate again at `epoch` after [`close_gate`](Self::close_gate), if the
    /// engine's grants are still of it.
    pub(crate) fn reopen_gate(&mut self, was: Option<u64>, epoch: u64) {
        if was == Some(epoch) {
            self.inbox.open_gate(epoch);
        }
    }

    /// The inbox's count of threads asleep on its bell, for threads that do not hold the
    /// device lock.
    pub(crate) fn sleepers(&self) -> Sleepers {
        self.inbox.sleepers()
    }

    /// The inbox's bell, for threads that do not hold the device lock.
    pub(crate) fn bell(&self) -> std::io::Result<OwnedFd> {
        self.inbox.bell().try_clone_to_owned()
    }
}

/// Closes `inbox`'s gate, and says so where a requester stays inside it.
fn close_gate(inbox: &mut Inbox) {
    if !inbox.close_gate(GATE_PATIENCE) {
        tracing::warn!(
            target: "softrdma::same_host",
            "a process applying an atomic to this one's memory stayed inside the gate for {GATE_PATIENCE:?} \
             (stopped?): going on without it; its atomic may land after the memory was reached"
        );
    }
}

/// Keeps a grant that came from process `pid` for local QP `qpn`, mapping its region if
/// this process has not yet: only from the process whose inbox the responder's QP is in
/// (the one this process sent the atomic to), for a region that maps
/// ([`PeerRegion::open`] checks the file). Grants of that process whose epoch its gate
/// left behind are dropped on the way, so that a region nobody holds a grant for is
/// unmapped.
fn take_grant(
    grants: &mut BTreeMap<(u32, u32), Held>,
    regions: &mut HashMap<(u32, u64), Weak<PeerRegion>>,
    routes: &BTreeMap<u32, Route>,
    qpn: u32,
    pid: u32,
    g: Grant,
) -> bool {
    let slot = g.qp >> QPN_SLOT_BITS;
    if grants
        .get(&(qpn, g.rkey))
        .is_some_and(|h| (h.pid, h.qp, h.epoch, h.va, h.len, h.offset) == (pid, g.qp, g.epoch, g.va, g.len, g.offset))
    {
        return true; // held already: each atomic by packet brings it again
    }
    let Some(Route::Inbox(out, ..)) = routes.get(&slot) else { return true };
    if out.receiver() != pid || !out.takes_grants() {
        return true;
    }
    // Those of the same inbox left behind by its gate (not those of the process's other
    // inboxes, each with a gate and epochs of its own).
    grants.retain(|_, h| h.slot != slot || h.epoch == g.epoch);
    regions.retain(|_, r| r.strong_count() > 0);
    let Some(need) = g.offset.checked_add(g.len) else { return false };
    let region = match regions.get(&(pid, g.ino)).and_then(Weak::upgrade) {
        Some(region) => region,
        None => {
            let Ok(region) = PeerRegion::open(pid, g.fd, g.ino, need) else { return false };
            let region = Arc::new(region);
            regions.insert((pid, g.ino), Arc::downgrade(&region));
            region
        }
    };
    if need > region.len() as u64 {
        return false;
    }
    let held = Held { region, qp: g.qp, slot, pid, va: g.va, len: g.len, offset: g.offset, epoch: g.epoch };
    grants.insert((qpn, g.rkey), held);
    true
}

/// The R_Key of `datagram` if it is an RC atomic's request.
fn atomic_rkey(datagram: &[u8]) -> Option<u32> {
    let op = *datagram.first()?;
    if op != Opcode::RC_FETCH_ADD.0 && op != Opcode::RC_COMPARE_SWAP.0 || datagram.len() < ATOMIC_REQUEST_LEN {
        return None;
    }
    Some(RocePacket::new_unchecked(datagram).atomic_eth()?.rkey().0)
}

/// An atomic's request, BTH and AtomicETH (its ICRC is not needed here).
const ATOMIC_REQUEST_LEN: usize = softrdma_wire::bth::HEADER_LEN + softrdma_wire::ext::atomic_eth::HEADER_LEN;

/// Whether `datagram`, sent by local QP `qpn`, is an atomic's request for a region this
/// process holds no grant for, and could map: it asks for one with the answer
/// ([`Beside::asks_grant`]). A responder sends a grant once per epoch and gate closing,
/// and a requester may have let it go meanwhile (its QP destroyed, the route it came by
/// not open yet), or be a new process under the same QP number.
fn asks_grant(
    grants: &BTreeMap<(u32, u32), Held>,
    unmappable: &BTreeSet<(u32, u32)>,
    qpn: u32,
    datagram: &[u8],
) -> bool {
    atomic_rkey(datagram).is_some_and(|rkey| !grants.contains_key(&(qpn, rkey)) && !unmappable.contains(&(qpn, rkey)))
}
