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

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::time::Duration;

use softrdma_engine::{AckBeside, Instant, IpInfo, Transmit};
use softrdma_udp::IpInfo as UdpIpInfo;
use softrdma_udp::host::QPN_SLOT_BITS;
use softrdma_udp::local::{self, Arrived, Beside, Inbox, Outbox, Sleepers, inbox_name};
use softrdma_wire::{AethRepr, BthPacket, Envelope, Msn, Psn, Syndrome};

/// How long a destination whose inbox could not be opened stays on the socket.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// `SOFTRDMA_SAME_HOST=0` keeps every packet on the sockets (`ContextOptions::same_host`).
pub const SAME_HOST_ENV: &str = "SOFTRDMA_SAME_HOST";
/// IP hop limit reported for a packet that came through shared memory: what a loopback
/// datagram from a default socket arrives with.
const HOP_LIMIT: u8 = 64;

enum Route {
    /// Through its inbox; `true` once each process copies from the other.
    Inbox(Outbox, bool),
    /// On the socket until then.
    Socket(Instant),
}

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
        })
    }

    /// Sends `datagram` (what the engine wrote for `t`, and the ACK beside it) through
    /// shared memory if its destination is a process of this host. `None`: send it on the
    /// socket; `Some`: sent, and what the receiver takes: whether its process and this one
    /// each copy from the other (the receiver from this one, [`Outbox::pulls`], for SENDs
    /// and WRITEs, this one from it, [`Inbox::pulls_from`], for READs' answers), and
    /// whether it takes ACKs beside packets ([`Outbox::acks_beside`]).
    pub(crate) fn send(&mut self, now: Instant, t: &Transmit, ecn: u8, datagram: &[u8]) -> Option<Receiver> {
        if !self.takes(&t.envelope) {
            return None;
        }
        let slot = BthPacket::new_unchecked(datagram).dest_qp().value() >> QPN_SLOT_BITS;
        if slot == 0 {
            return None; // QP0/QP1: the CM's MADs, steered by the host's program
        }
        let route = self.routes.entry(slot).or_insert(Route::Socket(Instant::ZERO));
        if let Route::Inbox(out, _) = route
            && out.is_closed()
        {
            *route = Route::Socket(Instant::ZERO);
        }
        if let Route::Socket(until) = *route {
            if now < until {
                return None;
            }
            *route = match inbox_name(&self.device, self.port, slot).and_then(|name| Outbox::open(&name)) {
                Ok(out) => Route::Inbox(out, false),
                Err(_) => Route::Socket(now.saturating_add(RETRY_AFTER)),
            };
        }
        let Route::Inbox(out, mutual) = route else { return None };
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
        out.send(&t.envelope, ip, datagram, Beside { by_reference: t.by_reference, ack }).ok()?;
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
            if let Route::Inbox(out, _) = route {
                waiting |= !out.flush();
                out.wake();
            }
        }
        waiting
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
        let n = self.inbox.receive(max, |envelope, ip, datagram, Arrived { origin, ack }| {
            acks += u64::from(ack.is_some());
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
