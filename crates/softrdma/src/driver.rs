//! The driver: what turns the sans-IO engine into a device that runs by itself.
//!
//! One [`Driver`] per open device context owns the engine (behind one mutex, the *device
//! lock*), the UDP sockets of the device's addresses, a clock, and a progress thread.
//!
//! # Who makes progress
//!
//! - **The progress thread** receives, fires timers and transmits whenever the application
//!   does not: RDMA WRITE, READ and atomics aimed at this process complete while the
//!   application sleeps or computes. After work it spins for [`ContextOptions::spin`]
//!   (low latency when busy), then blocks in `poll(2)` on the sockets and a doorbell
//!   eventfd until a datagram arrives or the engine's next timer is due: ~0 CPU when idle.
//! - **The application's own calls** do the work on their path, without a thread hop:
//!   posting a send transmits its packets at once from the posting thread, and polling an
//!   empty CQ receives and processes what the sockets hold. While the application polls,
//!   the progress thread stops watching the sockets (it would only be woken to find the
//!   work done) and keeps only the timers, until the application has not polled for
//!   [`APP_POLL_WINDOW`]; except while the application polls the same-host inbox with
//!   every socket idle: then the progress thread's sleep watches the sockets for it, and
//!   tells it of a readable one ([`Shared::sockets_idle`]).
//! - **The doorbell**: a verb that arms a timer earlier than the one the sleeping progress
//!   thread waits for rings it (the thread publishes its deadline under the device lock, so
//!   no wake-up is lost).

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use smallvec::SmallVec;
use softrdma_cm::{Cm, CmConfig, CmEvent, CmId, Nic, NicEvent};
use softrdma_engine::{AsyncEvent, CqId, DeviceConfig, Engine, Event, Instant, IpInfo, Transmit};
use softrdma_udp::host::{HostConfig, Member, QPN_SLOT_BITS};
use softrdma_udp::local::{Sleepers, drain_bell};
use softrdma_udp::{Outgoing, RecvBatch, RoceSocket, RxPosition};
use softrdma_wire::RocePacket;
use softrdma_wire::icrc::{IcrcPrefixCache, Ipv4IdentificationCache};
use softrdma_wire::opcode::{Operation, Transport};
use softrdma_wire::{BthPacket, Envelope, Gid, Opcode, Qpn};

use crate::capture::Capture;
use crate::device::Device;
use crate::faults::Faults;
use crate::memory::ProcessMemory;
use crate::same_host::{FromInbox, SameHost};
use crate::stats::{Counters, Publisher};
use crate::{ContextOptions, Error};

/// The most asynchronous events a device keeps for the application to read.
const ASYNC_EVENTS_MAX: usize = 4096;

/// How long after the application's last poll the progress thread leaves the sockets to it.
pub const APP_POLL_WINDOW: Duration = Duration::from_millis(1);

/// Reads of regions' bytes in a row, with no other taking of the device lock between them
/// (a CQ poll, a post, a progress pass), after which each receives first
/// ([`Shared::lock_polled`]): more than a program's reads between its posts and polls make
/// (rsockets: one or two), few enough that a loop polling memory for a peer's WRITE starts
/// receiving within a fraction of a microsecond.
const MEMORY_POLL_AFTER: u32 = 8;

/// How long after an empty poll of one CQ received (a `recvmmsg` per socket, about a
/// microsecond) an empty poll of another CQ of the device skips receiving. A program that
/// polls several CQs in turn (UCX: the send and receive CQs of its RC and UD transports)
/// then makes one receive per round instead of one per CQ, and a datagram waits at most
/// a short round; a program that polls one CQ receives on every poll.
const APP_RX_SHARED: Duration = Duration::from_micros(2);

/// Receive batches taken from one socket per progress pass, so one busy socket cannot
/// starve the timers and the other sockets.
const RX_ROUNDS: usize = 4;
/// Datagrams per receive batch.
const RX_BATCH: usize = 32;
/// Bytes a pass takes from the sockets, about, before it answers what it took. With GRO a
/// message is up to 64 KiB, and four receives of 32 could take 8 MiB, four times a peer's
/// window (512 packets), before a single ACK left. Measured (64 KiB WRITE over the
/// sockets, `perf write bw --wire -D 2 --loopback`, alternating runs): no limit 4.40–4.72
/// GB/s, 512 KiB 4.44–4.64, 256 KiB 5.21–5.46, 128 KiB 4.55–5.28; what counts is the pass's
/// volume, not a receive's (four receives of one message or one of four: 5.1–5.5; sixteen
/// either way: 4.2–4.9).
const RX_PASS_BYTES: usize = 256 * 1024;
/// A socket that found nothing this many receives in a row is *idle*: while another socket
/// of the device, or its same-host inbox, is not, it is asked only once per
/// [`IDLE_SOCKET_INTERVAL`]. A busy poll then makes one `recvmmsg` per pass, not one per
/// address (`softrdma_lo` has 127.0.0.1 and ::1), and almost none while all traffic comes
/// through shared memory, at the cost of up to that interval for the first datagram to
/// reach an idle socket while another source is busy. Every 16th pass, the rule until
/// 2026-11-28, still made two empty `recvmmsg` calls per message of a same-host ping-pong
/// (86 000 in 20 000 round trips: half a microsecond each, on the answer's path) and
/// several per 64 KiB of a same-host WRITE stream (empty `recvmmsg` calls had taken 30 %
/// of a same-host requester's time with none of this). When every source is idle (a poll
/// waiting long for its answer), the socket that brought the last datagrams is asked on
/// every pass and the others once per interval.
const IDLE_SOCKET_AFTER: u32 = 64;
/// How often idle sockets are asked while another source is busy, or while all are idle
/// and another brought the last datagrams: an empty `recvmmsg` costs 0.3-0.5 us here, so
/// two sockets asked every 20 us cost a few percent of a core.
const IDLE_SOCKET_INTERVAL: Duration = Duration::from_micros(20);
/// How often an application thread asks idle sockets while the progress thread watches
/// them for it ([`Shared::sockets_idle`]): a net under that watch, which tells of a
/// datagram within a wake-up.
const WATCHED_SOCKET_INTERVAL: Duration = APP_POLL_WINDOW;
/// The inbox counts as busy this long after its last packet: a same-host ping-pong waits
/// far more than 64 passes for each answer, and asking both idle sockets on every one of
/// those passes (two `recvmmsg` calls, over a microsecond) delayed seeing the answer.
const INBOX_ACTIVE: Duration = Duration::from_millis(1);
/// Bytes per datagram buffer: a 4096-byte payload with the largest headers and the ICRC.
const DATAGRAM_MAX: usize = 4352;
/// The ECN field's ECT(0) code point: "this transport reacts to congestion marks".
const ECT0: u8 = 0b10;
/// Socket buffer sizes asked for (each direction).
const SOCKET_BUFFER: usize = 8 << 20;
/// Packets the device's RC QPs together may have unacknowledged to one peer
/// (`DeviceConfig::peer_window`): what half a receive buffer like ours holds, at the
/// kernel's accounting of about 8 KiB per 4 KiB datagram.
const PEER_WINDOW: u32 = (SOCKET_BUFFER / 2 / 8192) as u32;
/// How soon a progress thread with packets waiting for room in another process's inbox
/// looks again, when nothing else wakes it.
const BACKLOG_RETRY: Duration = Duration::from_micros(100);
/// How long a progress thread that took the inbox on a sender's nudge, or the sockets an
/// application left ([`SocketGuard`]), leaves what that queued (the ACKs the packets
/// earned) for the application's answer to carry, before its next pass sends it on its
/// own (the progress thread's loop).
const NUDGED_ANSWER_WAIT: Duration = Duration::from_micros(20);

/// The progress thread's watch over the sockets while the application polls them: an
/// application that polled a CQ and then waits in its memory for a datagram's WRITE,
/// calling no verb, would leave it in the socket until the thread's next look, up to
/// `APP_POLL_WINDOW` (on the same-host path its sender rings instead:
/// [`SameHost::nudge_stalled`]). So the thread, asleep while the application polls, watches
/// the sockets too; woken by a readable one, it looks whether the application polls
/// still (a poll since it woke, within [`SocketGuard::CHECK`]), and takes the sockets if
/// not. Each wake-up that finds the application polling doubles the time until the
/// thread watches again, up to `APP_POLL_WINDOW`, so that an application that polls pays
/// about one wake-up a millisecond; one that finds it stopped watches at once again.
struct SocketGuard {
    /// When the thread next watches the sockets.
    next: Instant,
    /// The wait after a wake-up that found the application polling.
    backoff: Duration,
    /// The application left a readable socket: the next pass takes the sockets.
    take: bool,
}

impl SocketGuard {
    /// The first wait after a wake-up that found the application polling.
    const BACKOFF: Duration = Duration::from_micros(50);
    /// How long a woken thread waits for a poll of the application's before it takes the
    /// sockets: a polling application polls every microsecond or two.
    const CHECK: Duration = Duration::from_micros(10);

    fn new() -> SocketGuard {
        SocketGuard { next: Instant::ZERO, backoff: Self::BACKOFF, take: false }
    }

    /// Whether the next sleep watches the sockets.
    fn watches(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// A socket the sleep watched became readable: does the application poll still?
    fn rang(&mut self, shared: &Shared) {
        let woke = shared.now();
        if shared.app_polls_since(woke, Self::CHECK) {
            self.backoff = (self.backoff * 2).min(APP_POLL_WINDOW);
            self.next = woke.saturating_add(self.backoff);
        } else {
            self.take = true;
            self.backoff = Self::BACKOFF;
            self.next = woke;
        }
    }
}
/// A thread that polls and finds nothing this many times in a row yields the CPU once: an
/// application polling an empty CQ, and the progress thread spinning after work. On a host
/// with more busy threads than cores, the peer process whose work it waits for (the "NIC"
/// is software) then runs. Four process pairs on two cores: see README.
pub(crate) const YIELD_AFTER_IDLE_TURNS: u32 = 64;
/// A yield of the progress thread's spin that came back this late gave the CPU to another
/// thread: the host has more runnable threads than cores.
const CONTENDED_YIELD: Duration = Duration::from_micros(20);
/// How long the progress thread then sleeps at once after its work instead of spinning.
const NO_SPIN_AFTER_CONTENTION: Duration = Duration::from_millis(50);
/// How often a wait that polls ([`Shared::wait_channel`]) yields the CPU: by time, not by
/// turns, as a turn that asks the sockets costs 2-3 us (64 turns held a CPU 150-200 us on
/// the wire, where the peer process that had to answer might be waiting for it).
const WAIT_YIELD_EVERY: Duration = Duration::from_micros(20);
/// Datagrams per transmit batch (one `sendmmsg`).
const TX_BATCH: usize = 32;

/// The device's sockets and the QPN range it owns on this host: its membership in the
/// host's port-sharing group ([`softrdma_udp::host`]), so that any number of processes (and
/// contexts) use one address and port at once, each steered its own packets by the kernel.
pub(crate) struct Port {
    pub(crate) member: Member,
    pub(crate) addresses: Vec<IpAddr>,
    /// The device's interface: where its multicast groups are joined and sent.
    interface_index: u32,
    /// The UDP port (4791 but in tests), and the socket options, for the group sockets.
    udp_port: u16,
}

impl Port {
    /// Joins the host's group for `device`; with `options.gso`, asks for UDP GRO on the
    /// sockets and falls back to plain sockets where the kernel has none. Returns whether
    /// GRO is on.
    fn open(device: &Device, options: &ContextOptions) -> Result<(Port, bool), Error> {
        let join = |gro: bool| {
            let config = HostConfig {
                device: device.interface().to_string(),
                port: options.port,
                socket: softrdma_udp::Config {
                    reuse_port: true,
                    // Room for bursts: many QPs' 64 KiB messages arrive back to back, and a
                    // datagram the buffer cannot take costs an RC retry. The kernel caps
                    // these at net.core.rmem_max / wmem_max unless the process may exceed them.
                    recv_buffer_size: Some(SOCKET_BUFFER),
                    send_buffer_size: Some(SOCKET_BUFFER),
                    gro,
                    // The scope of the link-local GIDs: the device is one interface.
                    scope_id: Some(device.interface_index()),
                    // Multicast leaves by the device's interface, TTL 1, looped back to
                    // the host's own members of the group.
                    multicast_interface: Some(device.interface_index()),
                    // ECN-capable transport (ECT(0)) with congestion control, so that a
                    // congested router marks our packets instead of dropping them.
                    traffic_class: congestion_control(options).then_some(ECT0),
                    ..softrdma_udp::Config::default()
                },
            };
            Member::join(device.addresses(), &config)
        };
        let (member, gro) = match join(options.gso) {
            Ok(m) => (m, options.gso),
            // Not when the port's coordinator refused or did not answer: it would again.
            Err(e)
                if options.gso && !matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::ConnectionRefused) =>
            {
                (join(false).map_err(|e| open_error(device, options, e))?, false)
            }
            Err(e) => return Err(open_error(device, options, e)),
        };
        let port = Port {
            member,
            addresses: device.addresses().to_vec(),
            interface_index: device.interface_index(),
            udp_port: options.port,
        };
        Ok((port, gro))
    }

    /// One socket per GID, in GID order.
    pub(crate) fn sockets(&self) -> &[RoceSocket] {
        self.member.sockets()
    }

    pub(crate) fn socket_for(&self, ip: IpAddr) -> Option<&RoceSocket> {
        self.addresses.iter().position(|a| *a == ip).map(|i| &self.sockets()[i])
    }
}

fn open_error(device: &Device, options: &ContextOptions, e: io::Error) -> Error {
    Error::io(format!("joining {} on UDP port {} (addresses {:?})", device.name(), options.port, device.addresses()), e)
}

/// Where the engine's packets wait for one `sendmmsg`.
///
/// The packets of a batch lie back to back in one arena, so that a run of equal-sized
/// packets to one QP is already the buffer a UDP GSO send wants.
struct TxQueue {
    arena: Box<[u8]>,
    /// Each packet: where it is in the arena, and the engine's transmit.
    meta: Vec<(usize, Transmit)>,
    /// ICRC corrections for IPv4 GSO segments, by covered length (a few lengths recur).
    deltas: Ipv4IdentificationCache,
    /// The ICRC's envelope part, by envelope and length (a flow's packets share one).
    prefixes: IcrcPrefixCache,
    /// Send runs of equal packets as one GSO buffer.
    gso: bool,
}

impl TxQueue {
    fn new(gso: bool) -> Self {
        Self {
            arena: vec![0u8; TX_BATCH * DATAGRAM_MAX].into_boxed_slice(),
            meta: Vec::new(),
            deltas: Ipv4IdentificationCache::default(),
            prefixes: IcrcPrefixCache::default(),
            gso,
        }
    }

    /// The destination QP of the packet at `off` in the arena.
    fn dest_qp(&self, off: usize) -> Qpn {
        BthPacket::new_unchecked(&self.arena[off..]).dest_qp()
    }

    /// Whether the packet at `off` in the arena is a response (an ACK, atomic ACK or READ
    /// response), by the opcode table.
    fn is_response(&self, off: usize) -> bool {
        let opcode = BthPacket::new_unchecked(&self.arena[off..]).opcode();
        opcode.info().is_some_and(|i| i.is_response())
    }

    /// An ACK (any response) queued just before a request of the same QP to the same
    /// destination trades places with it in the arena, so that the two leave as
    /// one GSO datagram (the request first, the ACK, no longer, last) and arrive together.
    /// That is a ping-pong's answer and the ACK it owes: sent one after the other, the
    /// peer, which waits for both (its signaled send's completion, then the answer), was
    /// woken by the first and waited again for the second: 2.5 µs more per message here,
    /// in every program that signals its sends (`ib_send_lat`, `ib_write_lat`,
    /// `ibv_rc_pingpong`), against 0.15 µs that the GSO path costs one that does not.
    fn pair_answers(&mut self) {
        if !self.gso {
            return;
        }
        let mut i = 0;
        while i + 1 < self.meta.len() {
            // Only a response moves: a stream of requests is looked at by offset alone.
            if !self.is_response(self.meta[i].0) {
                i += 1;
                continue;
            }
            let ((oa, a), (ob, b)) = (self.meta[i], self.meta[i + 1]);
            let qpn = self.dest_qp(oa);
            // The pair leaves with the requests (send_units sends requests first): only
            // the QP's first response of the batch may, or its responses would reorder.
            let first_response = || {
                self.meta[..i]
                    .iter()
                    .all(|&(o, t)| !(self.is_response(o) && t.envelope == a.envelope && self.dest_qp(o) == qpn))
            };
            let pair = !self.is_response(ob)
                && ob == oa + a.len
                && b.len >= a.len
                && a.envelope == b.envelope
                && self.dest_qp(ob) == qpn
                && first_response();
            if pair {
                self.arena[oa..ob + b.len].rotate_left(a.len);
                self.meta[i] = (oa, b);
                self.meta[i + 1] = (oa + b.len, a);
                i += 2;
            } else {
                i += 1;
            }
        }
    }

    /// Whether the packet at `off` may join a GSO run led by the packet at `lead` (to QP
    /// `qpn`): to the same QP, or to another QP of the same process (the receiving host
    /// steers a GSO datagram by its first segment's QPN, and a process owns one slot of
    /// QPNs: `softrdma_udp::host`) if both are requests or both responses, so that
    /// `send_units`, which sends requests before responses, moves no response of a QP
    /// ahead of an earlier one. The engine takes its QPs in turn, packet by packet: runs of
    /// one QP alone were a packet long as soon as two QPs sent at once.
    fn same_unit(&self, off: usize, lead: usize, qpn: Qpn) -> bool {
        let dest = self.dest_qp(off);
        dest == qpn
            || (dest.value() >> QPN_SLOT_BITS == qpn.value() >> QPN_SLOT_BITS
                && self.is_response(off) == self.is_response(lead))
    }

    /// Splits the batch into send units: single packets, or GSO runs (equal-sized packets,
    /// the last possibly shorter, consecutive in the arena, to one process on this host), each
    /// `(first, count, segment)`. IPv4 segments after the first get their ICRC corrected
    /// for the identification the kernel will give them.
    fn gso_runs(&mut self) -> [(usize, usize, usize); TX_BATCH] {
        let mut units = [(0usize, 0usize, 0usize); TX_BATCH];
        let n = self.meta.len();
        let mut u = 0;
        let mut i = 0;
        while i < n {
            let (off, first) = self.meta[i];
            let qpn = self.dest_qp(off);
            let mut count = 1;
            let mut total = first.len;
            // QP1's MADs leave one datagram each, IPv4 identification 0, as they always did;
            // so does multicast, which every member's socket receives alike.
            if self.gso && qpn != Qpn::GSI && qpn != Qpn::MULTICAST {
                while i + count < n && count < GSO_MAX_SEGMENTS {
                    let (o, t) = self.meta[i + count];
                    let previous_full = self.meta[i + count - 1].1.len == first.len;
                    if t.envelope != first.envelope
                        || t.traffic_class != first.traffic_class
                        || t.len > first.len
                        || !previous_full
                        || total + t.len > 65_000
                        || !self.same_unit(o, off, qpn)
                    {
                        break;
                    }
                    total += t.len;
                    count += 1;
                }
            }
            if count > 1 && matches!(first.envelope, Envelope::V4(_)) {
                for k in 1..count {
                    let (o, t) = self.meta[i + k];
                    let d = self.deltas.get(t.len - 4).delta(k as u16);
                    let icrc = &mut self.arena[o + t.len - 4..o + t.len];
                    let v = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]) ^ d;
                    icrc.copy_from_slice(&v.to_le_bytes());
                }
            }
            units[u] = (i, count, if count > 1 { first.len } else { 0 });
            u += 1;
            i += count;
        }
        units[u..].iter_mut().for_each(|x| *x = (0, 0, 0));
        units
    }
}

/// Most segments in one GSO send (the kernel's UDP_MAX_SEGMENTS on every kernel with GSO).
const GSO_MAX_SEGMENTS: usize = softrdma_udp::MAX_GSO_SEGMENTS;

/// Where an armed CQ's completion events go: its completion channel. The channel belongs to
/// the API layer above the driver, which registers one per CQ in [`State::cq_channels`].
pub(crate) trait CompletionChannel: Send + Sync {
    /// The CQ got a completion while armed.
    fn fire(&self);
}

/// Where CM events go: the API layer's CM IDs. It sits above the driver, which knows it
/// only through this; the API layer sets it in [`State::cm_delivery`] with its first ID.
pub(crate) trait CmDelivery: Send + Sync {
    /// Delivers `event` (its QP transitions done by the NIC) to its ID's channel. Called with
    /// the device lock held: references whose drop may take the lock go into `later`.
    fn deliver(&self, event: CmEvent, later: &mut Vec<Box<dyn std::any::Any + Send>>);
    /// The NIC destroyed `id`: forget its object.
    fn forget(&self, id: CmId);
    /// The implementation, for the API layer that made it.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What the device lock protects.
pub(crate) struct State {
    /// The engine, the connection manager and QP1 between them.
    pub(crate) nic: Nic,
    rx: RecvBatch,
    tx: TxQueue,
    /// Completion channels by CQ.
    pub(crate) cq_channels: BTreeMap<u32, Box<dyn CompletionChannel>>,
    /// Where CM events go, once the API layer made a CM ID on this device.
    pub(crate) cm_delivery: Option<Arc<dyn CmDelivery>>,
    /// The packet capture, if on.
    capture: Option<Capture>,
    /// Injected faults on what the device receives (`SOFTRDMA_FAULTS`), if any.
    faults: Option<Faults>,
    /// Datagrams that could not be sent (full socket buffer, no route); RC resends them.
    pub(crate) send_errors: u64,
    /// How the waits on the device's completion channels ended.
    channel_waits: ChannelWaits,
    /// References to drop once the lock is released ([`Locked`]).
    pub(crate) drop_later: Vec<Box<dyn std::any::Any + Send>>,
    /// The same-host inbox's gate may stand open ([`SameHost::gate`]): the lock's release
    /// then checks that the engine's grants still hold ([`State::close_stale_gate`]).
    gate_open: bool,
    /// Per socket, receives in a row that found nothing.
    rx_empty: Vec<u32>,
    /// The longest message the recent socket receives took (0: none yet), by which a
    /// pass's receives keep to [`RX_PASS_BYTES`].
    rx_longest: usize,
    /// Each socket's count of datagrams the kernel dropped for a full receive buffer, as
    /// last seen (`RecvBatch::drops`): a rise is congestion control's overrun signal.
    rx_drops: Vec<u32>,
    /// How many times the device lock was taken ([`Shared::lock`]).
    locks: u64,
    /// The [`locks`](Self::locks) count of the last empty poll whose pass had nothing to
    /// send or deliver ([`Shared::app_flush_after_empty_poll`]).
    quiet_at: Option<u64>,
    /// When idle sockets were last asked ([`IDLE_SOCKET_INTERVAL`]).
    idle_asked: Instant,
    /// The socket that last brought datagrams: while nothing arrives anywhere, the one
    /// asked on every pass.
    rx_last_socket: Option<usize>,
    /// When the same-host inbox last held a packet.
    inbox_last: Option<Instant>,
    /// What this device last published as [`Shared::sockets_idle`].
    sockets_idle: bool,
    /// The CQ whose empty poll last received in the application's thread (`None`: a read
    /// of a region's bytes, [`Shared::lock_polled`]), and when.
    app_rx_last: Option<(Option<CqId>, Instant)>,
    /// The [`locks`](Self::locks) count at the last read of a region's bytes, and how many
    /// such reads came in a row, with no other taking of the lock between them
    /// ([`Shared::lock_polled`]).
    memory_reads: (u64, u32),
    /// Empty application polls in a row (nothing received, nothing completed).
    pub(crate) app_empty_polls: u32,
    /// Receive batches that held datagrams, since the device opened.
    rx_batches: u64,
    /// Where the datagrams of [`rx`](Self::rx) that a poll left begin: the poll's CQ had
    /// its completion, and the rest (the ACK that came with the answer, mostly) waits for
    /// the next pass, which takes it before it receives anything new
    /// ([`Shared::app_receive`]).
    rx_rest: Option<RxPosition>,
    /// While a poll of this CQ receives: the CQ whose first completion ends the receive.
    rx_stop_at: Option<CqId>,
    /// An ACK that came beside a packet through the inbox, left for the next pass by the
    /// poll that returned the packet's completion ([`LeftAck`]).
    ack_left: Option<LeftAck>,
    /// Receives a poll ended early so ([`rx_rest`](Self::rx_rest)).
    acks_left: u64,
    /// Passes of the progress thread that took the sockets its polling application left
    /// readable ([`SocketGuard`]).
    sockets_left: u64,
    /// The counters published for `softrdma stats`.
    stats: Publisher,
    /// The same-host path: this process's inbox and its routes to others'.
    pub(crate) same_host: Option<SameHost>,
    /// Packets wait in the same-host path's backlogs for room in an inbox.
    same_host_backlog: bool,
    /// The multicast groups the engine's QPs are attached to, each with the socket that
    /// receives it ([`State::sync_groups`]).
    groups: Vec<(Gid, Arc<RoceSocket>)>,
}

/// The device lock held: the engine, the CM and their tables.
///
/// Objects whose destruction takes the lock (a QP, a CQ, a CM ID that owns them) must never
/// be dropped while it is held, and the progress thread may hold the last reference to one
/// (an ID whose application let go while its event was being delivered). Such references
/// go into [`State::drop_later`], which this guard empties *after* unlocking.
pub(crate) struct Locked<'a> {
    guard: Option<MutexGuard<'a, State>>,
}

impl<'a> Locked<'a> {
    /// The state, its lock taken once more ([`State::locks`]).
    fn counted(mut guard: MutexGuard<'a, State>) -> Self {
        guard.locks = guard.locks.wrapping_add(1);
        Locked { guard: Some(guard) }
    }
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    #[inline]
    fn drop(&mut self) {
        // Mostly there is nothing to do but unlock: no empty list is taken and dropped then
        // (every poll takes the lock, and that was a call of its own, 1.8 % of a ping-pong's
        // time), and the rest is out of line.
        if self.guard.as_ref().is_some_and(|g| g.gate_open || !g.drop_later.is_empty()) {
            self.release_with_work();
        }
        self.guard = None;
    }
}

impl Locked<'_> {
    /// The release when there is more to do: the gate to close if the engine's grants were
    /// voided under the lock ([`State::close_stale_gate`]), references to drop after it.
    #[cold]
    #[inline(never)]
    fn release_with_work(&mut self) {
        let Some(g) = self.guard.as_mut() else { return };
        if g.gate_open {
            g.close_stale_gate();
        }
        let later = (!g.drop_later.is_empty()).then(|| std::mem::take(&mut g.drop_later));
        self.guard = None; // unlock first
        drop(later);
    }
}

/// The part of a driver that the progress thread shares.
pub(crate) struct Shared {
    state: Mutex<State>,
    pub(crate) port: Port,
    doorbell: OwnedFd,
    /// The same-host inbox's bell (a FIFO other processes ring once they put packets in an
    /// inbox whose readers sleep): watched with the sockets, by whichever thread watches
    /// them. Declared after `state`, so it outlives the inbox that names it.
    inbox_bell: Option<OwnedFd>,
    /// The inbox's count of threads asleep on the bell.
    inbox_sleepers: Option<Sleepers>,
    /// Asynchronous events (`ibv_get_async_event`), at most [`ASYNC_EVENTS_MAX`] queued.
    pub(crate) async_events: EventQueue<AsyncEvent>,
    stop: AtomicBool,
    /// The engine's clock (read on every poll, post and pass: the TSC where it is
    /// invariant, a third of `clock_gettime`'s cost here).
    clock: quanta::Clock,
    /// The engine's clock's zero: when the context opened ([`clock`](Self::clock)'s raw
    /// count).
    epoch: u64,
    /// The wall-clock time at `epoch`.
    epoch_wall: std::time::SystemTime,
    /// When the application last polled a CQ (ns since `epoch`).
    app_polled: AtomicU64,
    /// Application threads blocked in [`Shared::wait_channel`], which watch the sockets.
    app_waiting: std::sync::atomic::AtomicU32,
    /// The progress thread sleeps watching the sockets (a thread that starts to wait on a
    /// channel then rings the doorbell, so that only one of them wakes per datagram).
    watching: AtomicBool,
    /// An application thread polls the same-host inbox while every socket is idle, and
    /// leaves the sockets to the progress thread's `poll(2)` rather than ask them itself
    /// every [`IDLE_SOCKET_INTERVAL`]: the progress thread watches them in its sleeps and
    /// says when one is readable ([`sockets_news`](Self::sockets_news)).
    sockets_idle: AtomicBool,
    /// A socket was readable while [`sockets_idle`](Self::sockets_idle): the polling
    /// application's next pass asks the sockets.
    sockets_news: AtomicBool,
    /// Receive batches the progress thread took from the sockets itself.
    thread_receives: AtomicU64,
    /// Bytes of device memory ([`crate::DeviceMemory`]) the context holds.
    pub(crate) dm_bytes: AtomicU64,
    /// The deadline the progress thread sleeps until (ns since `epoch`); 0 while awake.
    sleeping_until: AtomicU64,
    spin: Duration,
    /// The most a wait on a completion channel polls before it sleeps
    /// ([`crate::wait_spin`]).
    pub(crate) wait_spin: Duration,
    /// CM IDs dropped by the application, for the next pass to destroy.
    cm_graveyard: Mutex<Vec<CmId>>,
    /// Whether the graveyard may hold an ID: a pass looks at this, not the mutex.
    cm_buried: AtomicBool,
    pub(crate) thread_id: OnceLock<std::thread::ThreadId>,
    /// The process that opened the device (a child of `fork` is another).
    pid: u32,
    /// The group sockets ([`State::groups`]), for the threads that poll the sockets
    /// without the device lock; `has_groups` says whether there are any, without this lock.
    group_sockets: Mutex<Vec<Arc<RoceSocket>>>,
    has_groups: AtomicBool,
}

/// How the waits on a device's completion channels ended ([`Shared::wait_channel`]).
#[derive(Clone, Copy, Debug, Default)]
struct ChannelWaits {
    /// The event came while the thread polled.
    polled: u64,
    /// The thread slept (and the event came, or the wait timed out).
    slept: u64,
}

/// What [`Shared::watch_bell`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Bell {
    /// No inbox, or this thread does not watch it.
    Unwatched,
    /// The thread counts among the inbox's sleepers and polls the bell.
    Watched,
    /// A packet waits in the inbox: do not sleep.
    Pending,
    /// The application polls: the thread polls the bell without counting among the
    /// sleepers, so that only a sender's nudge rings it ([`SameHost::nudge_stalled`]).
    Nudges,
}

impl Bell {
    /// Whether a sleep that watched the bell (the last of `fds`, as [`Shared::watch_bell`]
    /// and [`Shared::watch_nudges`] add it) was rung.
    fn rang(self, fds: &[PollFd<'_>]) -> bool {
        matches!(self, Bell::Watched | Bell::Nudges) && fds.last().is_some_and(|f| !f.revents().is_empty())
    }
}

/// An open device: the engine, its sockets and its progress thread.
pub(crate) struct Driver {
    /// The `softrdma res` answer thread ([`crate::res`]), stopped first when the device closes.
    res: Option<crate::res::Server>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) device: Device,
    thread: Option<JoinHandle<()>>,
}

fn eventfd() -> Result<OwnedFd, Error> {
    rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
        .map_err(|e| Error::io("creating an eventfd", e.into()))
}

/// Adds one to an eventfd (wakes whoever polls it).
pub(crate) fn ring(fd: &OwnedFd) {
    // An eventfd write fails only when the counter would overflow, and then it is readable.
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Empties an eventfd; returns whether it was set.
pub(crate) fn drain(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 8];
    rustix::io::read(fd, &mut b).is_ok()
}

/// A channel's queue of events and its file descriptor: one end of a Unix stream socket
/// pair, readable exactly while the queue holds an event (as the kernel's `rdma_cm` and
/// completion-channel files are), the other end written when the queue stops being empty.
/// Blocking, as rdma-core's channel descriptors are, so an application may make it
/// non-blocking (`fcntl(fd, F_SETFL, O_NONBLOCK)`) for its event loop and the C libraries
/// see that it did; softrdma itself never blocks on it (`MSG_DONTWAIT` both ways, `poll`
/// to wait). The queue's lock orders every push and pop with the descriptor's state.
#[derive(Debug)]
pub(crate) struct EventQueue<T> {
    queue: Mutex<VecDeque<T>>,
    rx: OwnedFd,
    tx: OwnedFd,
}

impl<T> EventQueue<T> {
    pub(crate) fn new(what: &str) -> Result<EventQueue<T>, Error> {
        use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
        let (rx, tx) = socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
            .map_err(|e| Error::io(format!("creating {what}"), e.into()))?;
        Ok(EventQueue { queue: Mutex::new(VecDeque::new()), rx, tx })
    }

    /// The descriptor the application polls.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.rx
    }

    /// Queues an event; the descriptor turns readable, with a new edge for each event as
    /// the kernel's wake-ups give an edge-triggered `epoll` loop.
    pub(crate) fn push(&self, event: T) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.push_back(event);
        // A full socket buffer would mean it is readable already.
        let _ = rustix::net::send(&self.tx, &[1], rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL);
    }

    /// How many events are queued.
    pub(crate) fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Drops the queued events `keep` refuses (those of an object being destroyed, whose
    /// handle may soon name another).
    pub(crate) fn retain(&self, keep: impl FnMut(&T) -> bool) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.retain(keep);
        if q.is_empty() {
            self.drain();
        }
    }

    /// Empties the descriptor (with the queue's lock held, the queue empty). A read short of
    /// the buffer took all there was, as every push holds the queue's lock too: one
    /// `recv` per event, not a second one to find the socket empty.
    fn drain(&self) {
        let mut buf = [0u8; 64];
        while matches!(rustix::net::recv(&self.rx, &mut buf, rustix::net::RecvFlags::DONTWAIT), Ok((n, _)) if n == buf.len())
        {
        }
    }

    /// The next event; the descriptor stops being readable when it was the last.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let event = q.pop_front()?;
        if q.is_empty() {
            self.drain();
        }
        Some(event)
    }
}

/// Waits until `fd` is readable or `timeout` passes (`None`: forever).
pub(crate) fn wait_readable(fd: &OwnedFd, timeout: Option<Duration>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    poll(&mut fds, timeout) > 0
}

fn poll(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> usize {
    let ts = timeout.map(|t| rustix::event::Timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    rustix::event::poll(fds, ts.as_ref()).unwrap_or(0)
}

impl Driver {
    /// Opens `device`: binds its sockets, builds the engine, starts the progress thread.
    pub(crate) fn start(device: Device, options: &ContextOptions) -> Result<Driver, Error> {
        if device.addresses().is_empty() {
            return Err(Error::NoDevice { name: device.name().to_string(), available: "(it has no address)".into() });
        }
        let (port, gro) = Port::open(&device, options)?;
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| Error::io("seeding the R_Key generator", io::Error::other(e)))?;
        let qpns = port.member.qpn_range();
        let config = DeviceConfig {
            addresses: device.addresses().to_vec(),
            qpn_base: qpns.start,
            max_qp: qpns.end - qpns.start,
            seed: u64::from_ne_bytes(seed),
            port_mtu: device.active_mtu(),
            udp_source_port: Some(options.port),
            udp_port: options.port,
            congestion: congestion_control(options).then(softrdma_engine::congestion::DcqcnConfig::default),
            peer_window: Some(PEER_WINDOW),
            // flush_packets computes it for what goes by a socket or into a capture.
            defer_icrc: true,
            ..DeviceConfig::default()
        };
        let capture = match &options.capture {
            Some(c) => Some(Capture::create(c)?),
            None => Capture::from_env()?,
        };
        let faults = crate::faults::spec(options.faults.as_ref())?.map(|spec| {
            let faults = Faults::new(spec, crate::faults::next_device());
            announce_faults(&device, faults.spec());
            faults
        });
        let mut cm_seed = [0u8; 8];
        getrandom::fill(&mut cm_seed).map_err(|e| Error::io("seeding the CM", io::Error::other(e)))?;
        let mut auth_seed = [0u8; 32];
        getrandom::fill(&mut auth_seed).map_err(|e| Error::io("seeding the CM's key exchange", io::Error::other(e)))?;
        let cm = Cm::new(CmConfig {
            auth_seed,
            seed: u64::from_ne_bytes(cm_seed),
            comm_id_prefix: port.member.comm_id_prefix(),
            addresses: device.addresses().to_vec(),
            scope_id: device.interface_index(),
            port_mtu: device.active_mtu(),
            response_timeout: options.cm_response_timeout,
            max_retries: options.cm_max_retries,
            node_guid: device.node_guid(),
            // Listens on this host may lose a same-moment race with a connect (see the
            // field): a REQ to this device is retried for up to 63 ms.
            same_host_rej_retries: 6,
            ..CmConfig::default()
        });
        let doorbell = eventfd()?;
        // Sockets put in new ones' places (the group founded again) are watched only once
        // the progress thread's `poll` returns: the doorbell makes it.
        let bell = doorbell.try_clone().map_err(|e| Error::io("duplicating the doorbell", e))?;
        port.member.on_sockets_replaced(move || ring(&bell));
        let mut same_host = same_host(options)
            // A capture must show every packet's data: senders then send it in the packets;
            // and where copying from other processes would reach further than the user's
            // own processes can, no copies (softrdma_udp::local::copying_adds_no_reach).
            .then(|| {
                let pulls = capture.is_none() && softrdma_udp::local::copying_adds_no_reach();
                // An ACK beside a packet is no packet in a capture: none while capturing.
                let acks_beside = capture.is_none();
                let (interface, slot) = (device.interface(), port.member.slot());
                SameHost::open(interface, options.port, slot, device.addresses(), pulls, acks_beside)
            })
            .flatten();
        let inbox_bell = match same_host.as_ref().map(SameHost::bell) {
            Some(Ok(bell)) => Some(bell),
            _ => {
                same_host = None; // no descriptor left: the sockets alone
                None
            }
        };
        let inbox_sleepers = same_host.as_ref().map(SameHost::sleepers);
        let stats = Publisher::open(&device, options.port);
        let res_socket = stats.path().map(crate::res::socket_path);
        let state = State {
            nic: Nic::new(Engine::new(config), cm),
            // With GRO a message holds up to 64 KiB of coalesced datagrams.
            rx: RecvBatch::new(RX_BATCH, if gro { 65_536 } else { DATAGRAM_MAX }),
            tx: TxQueue::new(gro),
            cq_channels: BTreeMap::new(),
            cm_delivery: None,
            capture,
            faults,
            send_errors: 0,
            channel_waits: ChannelWaits::default(),
            drop_later: Vec::new(),
            gate_open: false,
            rx_empty: vec![0; port.sockets().len()],
            rx_longest: 0,
            rx_drops: vec![0; port.sockets().len()],
            locks: 0,
            quiet_at: None,
            idle_asked: Instant::ZERO,
            rx_last_socket: None,
            inbox_last: None,
            sockets_idle: false,
            app_rx_last: None,
            memory_reads: (0, 0),
            app_empty_polls: 0,
            rx_batches: 0,
            rx_rest: None,
            rx_stop_at: None,
            ack_left: None,
            acks_left: 0,
            sockets_left: 0,
            stats,
            same_host,
            same_host_backlog: false,
            groups: Vec::new(),
        };
        let clock = quanta::Clock::new();
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            port,
            doorbell,
            inbox_bell,
            inbox_sleepers,
            async_events: EventQueue::new("the asynchronous event queue")?,
            stop: AtomicBool::new(false),
            epoch: clock.raw(),
            clock,
            epoch_wall: std::time::SystemTime::now(),
            app_polled: AtomicU64::new(0),
            app_waiting: std::sync::atomic::AtomicU32::new(0),
            watching: AtomicBool::new(false),
            sockets_idle: AtomicBool::new(false),
            sockets_news: AtomicBool::new(false),
            thread_receives: AtomicU64::new(0),
            dm_bytes: AtomicU64::new(0),
            sleeping_until: AtomicU64::new(0),
            spin: options.spin,
            wait_spin: crate::wait_spin::cap(options.wait_spin),
            cm_graveyard: Mutex::new(Vec::new()),
            cm_buried: AtomicBool::new(false),
            thread_id: OnceLock::new(),
            pid: std::process::id(),
            group_sockets: Mutex::new(Vec::new()),
            has_groups: AtomicBool::new(false),
        });
        {
            let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&shared));
        }
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("softrdma-{}", device.interface()))
            .spawn(move || {
                // Woken while the application's threads spin on every core, it runs after
                // a slice of theirs, not of the default length (crate::slice).
                if let Err(e) = crate::slice::set_own_slice(crate::slice::PROGRESS_SLICE) {
                    tracing::debug!(error = %e, "the progress thread keeps the default scheduler slice");
                }
                for_thread.run()
            })
            .map_err(|e| Error::io("starting the progress thread", e))?;
        let _ = shared.thread_id.set(thread.thread().id());
        let res = res_socket.and_then(|path| {
            crate::res::Server::start(path, Arc::downgrade(&shared), device.name().to_string(), options.port)
        });
        Ok(Driver { res, shared, device, thread: Some(thread) })
    }
}

/// Every device this process has open (the ones gone do not upgrade).
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// Destroys every CM ID of every device this process has open, now: each sends what its
/// state needs (a DREQ for an established connection, a REJ for one half made, a DREP for
/// a DREQ received), as the kernel does for the `rdma_cm` file of a process that exits
/// without destroying its IDs. The IDs' handles stay valid and report the ID destroyed.
/// Returns how many IDs there were. It runs at the process's exit ([`disconnect_at_exit`]).
///
/// In a child of `fork` it does nothing to the parent's devices (their IDs are the
/// parent's, as the kernel's `rdma_cm` file stays open in the parent), and it never waits
/// for a lock another thread held when the process forked or exits.
pub fn disconnect_all() -> usize {
    let me = std::process::id();
    let live: Vec<Arc<Shared>> = {
        let mut all = match LIVE.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return 0,
        };
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).filter(|sh| sh.pid == me).collect()
    };
    let mut n = 0;
    for shared in live {
        // `exit` from a signal handler may interrupt a thread inside a verb, holding the
        // device: wait a little for it, then leave that device alone rather than hang.
        let deadline = std::time::Instant::now() + Duration::from_millis(100);
        let locked = loop {
            match shared.try_lock() {
                Some(st) => break Some(st),
                None if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                None => break None,
            }
        };
        let Some(mut st) = locked else { continue };
        let now = shared.now();
        for id in st.nic.cm().ids() {
            n += 1;
            st.destroy_cm_id(now, id);
        }
        st.flush(&shared, now);
    }
    n
}

/// Makes [`disconnect_all`] run when the process exits (`exit`, or returning from `main`),
/// as the kernel closes the `rdma_cm` file of an exiting process: a peer gets the DREQ of a
/// connection left open, or the DREP of one whose DREQ came in while the process was
/// leaving (an ID dropped in the last instants, whose burial the progress thread had no
/// pass left to do), rather than retrying into the void. Registered with the first CM ID.
pub(crate) fn disconnect_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn at_exit() {
        let _ = std::panic::catch_unwind(disconnect_all);
    }
    ONCE.call_once(|| {
        // SAFETY: at_exit is a C function of no arguments that never unwinds (a panic is
        // caught); atexit only records it.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(at_exit)
        };
    });
}

impl Drop for Driver {
    fn drop(&mut self) {
        drop(self.res.take());
        self.shared.stop.store(true, Ordering::Release);
        ring(&self.shared.doorbell);
        if let Some(t) = self.thread.take() {
            // The last reference can go in the progress thread itself (an object it was
            // delivering); it then ends on its own, having seen `stop`.
            if Some(&std::thread::current().id()) != self.shared.thread_id.get() {
                let _ = t.join();
            }
        }
        if let Some(c) = &mut self.shared.lock().capture {
            c.flush();
        }
    }
}

impl Shared {
    /// The device lock. A panic while it was held leaves the engine as it was at the
    /// panic; the device carries on rather than poison every later call.
    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked::counted(self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The device lock, if nobody holds it.
    pub(crate) fn try_lock(&self) -> Option<Locked<'_>> {
        match self.state.try_lock() {
            Ok(g) => Some(Locked::counted(g)),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(Locked::counted(p.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The engine's clock.
    pub(crate) fn now(&self) -> Instant {
        // Saturating at the epoch: a thread whose core's count lags another's by a few
        // cycles reads the epoch itself, never a time before it (the engine's clock never
        // goes back, and a difference of instants saturates at zero).
        Instant::from_nanos(self.clock.delta_as_nanos(self.epoch, self.clock.raw()))
    }

    /// `at`, on the engine's clock, as nanoseconds since the Unix epoch.
    pub(crate) fn wallclock_ns(&self, at: Instant) -> u64 {
        let since_unix = self.epoch_wall.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        u64::try_from(since_unix.as_nanos()).unwrap_or(u64::MAX).saturating_add(at.as_nanos())
    }

    /// Sends what the engine has queued and wakes the progress thread if the engine now
    /// wants to be called back before the thread would wake. Call after every verb that
    /// can queue packets or arm timers, with the lock held.
    pub(crate) fn after_verb(&self, st: &mut State) {
        let now = self.now();
        st.flush(self, now);
        st.dispatch_events(self, now);
        let sleeping = self.sleeping_until.load(Ordering::Acquire);
        if sleeping != 0 && st.deadline().is_some_and(|t| t.as_nanos() < sleeping) {
            ring(&self.doorbell);
        }
    }

    /// The application polled an empty CQ: receive in its thread. What the engine wants to
    /// send in answer (ACKs, mostly) waits for [`app_flush`](Self::app_flush), so that when
    /// the application answers a completion at once, its packet and the ACK leave in one
    /// `sendmmsg`; the next poll, post or progress pass sends them otherwise (within
    /// [`APP_POLL_WINDOW`]: [`app_received`](Self::app_received)).
    /// Returns when it received (the time the rest of the poll uses, one clock read for
    /// all: they took a fifth of a same-host ping-pong's time) and whether anything came
    /// (datagrams, timers), or `None` when an empty poll of another CQ did within
    /// [`APP_RX_SHARED`]. `cq`: the polled CQ, whose first completion ends the receive;
    /// `None` for no CQ (a read of a region's bytes: [`lock_polled`](Self::lock_polled)).
    pub(crate) fn app_receive(&self, st: &mut State, cq: Option<CqId>) -> Option<(Instant, bool)> {
        let now = self.now();
        self.app_polled.store(now.as_nanos().max(1), Ordering::Relaxed);
        if st.app_rx_last.is_some_and(|(other, at)| other != cq && now - at < APP_RX_SHARED) {
            return None;
        }
        st.app_rx_last = Some((cq, now));
        // The rest of a batch may wait for this thread's next call only as long as the
        // progress thread would take it anyway: it finishes one in every pass, and makes
        // one at least every APP_POLL_WINDOW unless it sleeps longer (it went to sleep
        // before this thread polled).
        let sleeping = self.sleeping_until.load(Ordering::Acquire);
        if sleeping == 0 || sleeping <= now.saturating_add(APP_POLL_WINDOW).as_nanos() {
            st.rx_stop_at = cq;
        }
        let worked = st.receive(self, now, true, true);
        st.rx_stop_at = None;
        if !worked && let Some(local) = &mut st.same_host {
            // Waiting for an answer: is a receiver leaving what this process sent untaken?
            local.nudge_stalled(now);
        }
        if st.same_host_backlog
            && let Some(local) = &mut st.same_host
        {
            // Packets wait for room in another process's inbox: a polling application
            // moves them on, as the progress thread would only every BACKLOG_RETRY.
            st.same_host_backlog = local.flush();
        }
        Some((now, worked))
    }

    /// The device lock for the application's reads of a region's bytes ([`Mr::read`],
    /// [`Mr::with`], and device memory's `ibv_memcpy_from_dm`). Past [`MEMORY_POLL_AFTER`]
    /// such reads in a row, with no other taking of the device lock between them (a CQ
    /// poll, a post, any verb, a progress pass), the application is taken to poll its
    /// memory (a word that a peer's WRITE sets, `ib_write_lat`'s way of waiting), and each
    /// read receives first, as an empty CQ poll does, sending what that queued if it
    /// received anything.
    ///
    /// Such a loop takes the lock back the moment it let it go; the lock does not hand
    /// itself over in turn, and the progress thread, woken at each release to find it taken
    /// again, left the peers' packets unanswered meanwhile (a WRITE landed after
    /// milliseconds; under a loop of `Mr::with` a requester's retries ran out). An
    /// application's reads between its posts and polls (rsockets' `rsend` and `rrecv`)
    /// stay plain: a receive before each of them made a 64 B rsocket ping-pong (`rstream
    /// -S 64`) two to three times as slow. Writes are not counted: a loop of them fills
    /// buffers (a receive before each, a `recvmmsg` where the inbox is idle, would cost it
    /// more than its copies), it does not wait for a peer.
    ///
    /// [`Mr::read`]: crate::Mr::read
    /// [`Mr::with`]: crate::Mr::with
    pub(crate) fn lock_polled(&self) -> Locked<'_> {
        let mut st = self.lock();
        // In a row: nobody took the lock since the last read (no verb, no CQ poll, no
        // progress pass), as `locks` tells, the way an empty poll's quiet check reads it.
        let (at, run) = st.memory_reads;
        let run = if at == st.locks.wrapping_sub(1) { run.saturating_add(1) } else { 1 };
        st.memory_reads = (st.locks, run);
        if run > MEMORY_POLL_AFTER
            && let Some((now, received)) = self.app_receive(&mut st, None)
            && received
        {
            self.app_flush_at(&mut st, now);
        }
        st
    }

    /// The rest of the pass of a poll that found its CQ empty after receiving
    /// ([`app_flush_at`](Self::app_flush_at)), unless there can be nothing to do: the
    /// receive took nothing (no datagram, no timer due), no packet waits for room in
    /// another process's inbox, and nobody but this poll has taken the device lock since a
    /// pass that sent and delivered nothing (a verb, a progress pass or another thread's
    /// poll may have queued packets or events; the lock tells, as it counts every taking:
    /// [`State::locks`]). A send that only time would let go (a pacer's, an RNR wait's)
    /// has a timer, which the receive fires; and the progress thread takes the lock at
    /// least every [`APP_POLL_WINDOW`] anyway. The rest of a pass (the engine's and the
    /// CM's `poll_transmit`, the events) was 10-15 % of an empty poll that asks one socket
    /// (`perf record` of `cargo bench -p softrdma --bench loopback -- --empty-poll-only`).
    pub(crate) fn app_flush_after_empty_poll(&self, st: &mut State, now: Instant, received: bool) {
        if !received && !st.same_host_backlog && st.quiet_at == Some(st.locks.wrapping_sub(1)) {
            st.quiet_at = Some(st.locks);
            return;
        }
        let worked = self.app_flush_at(st, now);
        st.quiet_at = (!worked && !st.same_host_backlog).then_some(st.locks);
    }

    /// A poll that received in the application's thread returns a completion. What that
    /// receive queued (ACKs) may wait for the application's next call, to leave with its
    /// answer, only while the progress thread sends it within [`APP_POLL_WINDOW`] anyway:
    /// awake (its pass sends it) or asleep until then at most. Asleep for longer (it went to
    /// sleep before the application polled, watching sockets whose datagram the application
    /// took meanwhile), nothing sent it until the next datagram came: the peer's SEND
    /// completed on its retransmission, 2 s later with rdma_cm's timeouts, when the
    /// receiver went on to wait for a CM event (`rdma_get_recv_comp`, then
    /// `rdma_get_cm_event`).
    pub(crate) fn app_received(&self, st: &mut State, now: Instant) {
        let sleeping = self.sleeping_until.load(Ordering::Acquire);
        if sleeping != 0 && sleeping > now.saturating_add(APP_POLL_WINDOW).as_nanos() {
            st.take_left_ack(now);
            self.app_flush_at(st, now);
        }
    }

    /// Sends what the engine queued and delivers events: the rest of a progress pass.
    pub(crate) fn app_flush(&self, st: &mut State) {
        self.app_flush_at(st, self.now());
    }

    /// [`app_flush`](Self::app_flush) at `now`, read by the caller. Returns whether it sent
    /// or delivered anything.
    pub(crate) fn app_flush_at(&self, st: &mut State, now: Instant) -> bool {
        let sent = st.flush(self, now);
        let delivered = st.dispatch_events(self, now);
        sent || delivered
    }

    /// Blocks until `fd` (a completion channel) is readable or `timeout` passes, doing the
    /// device's receive work in this thread when a datagram arrives first: an application
    /// waiting for a completion then wakes once per message (on the datagram), not twice
    /// (the progress thread, then the channel). For up to `spin` first, it polls instead,
    /// until `ready` (an event is on the channel): a wake-up through the kernel costs
    /// 10-20 us, and an answer that comes within the spin is seen in a polled one's time
    /// ([`crate::wait_spin`]).
    pub(crate) fn wait_channel(
        &self,
        fd: &OwnedFd,
        timeout: Option<Duration>,
        spin: Duration,
        ready: impl Fn() -> bool,
    ) {
        // While this thread watches the sockets, the progress thread keeps to the timers
        // (or both would wake for every datagram and fight over the lock).
        // SeqCst with the progress thread's store of `watching` and load of `app_waiting`:
        // either it sees this thread waiting, or this thread sees it watching and wakes it.
        self.app_waiting.fetch_add(1, Ordering::SeqCst);
        if self.watching.load(Ordering::SeqCst) {
            ring(&self.doorbell);
        }
        // What a poll left for its next call (the ACKs after an answer, `rx_rest`,
        // `ack_left`) is this wait's to take first: it may hold what the wait is for (a
        // send's completion), and no socket says it is there: a wait that may not spin
        // slept until the progress thread's next look (up to APP_POLL_WINDOW) for an event
        // that was already here. Such a wait polled (the device's work done in this
        // thread), and no more.
        let found_in_left = {
            let mut st = self.lock();
            let left = st.rx_rest.is_some() || st.ack_left.is_some();
            if left {
                let now = self.now();
                // As `poll_until`: the progress thread takes this thread for a polling one.
                self.app_polled.store(now.as_nanos().max(1), Ordering::Relaxed);
                st.receive(self, now, false, false);
                self.app_flush_at(&mut st, now);
            }
            left
        } && ready();
        let spin = timeout.map_or(spin, |t| spin.min(t));
        let slept = !(found_in_left || self.poll_until(spin, &ready));
        if slept {
            self.wait_channel_inner(fd, timeout.map(|t| t - spin));
        }
        let mut st = self.lock();
        if slept {
            st.channel_waits.slept += 1;
        } else {
            st.channel_waits.polled += 1;
        }
        drop(st);
        // Now nobody may be watching: hand the sockets back at once. Not after a wait that
        // polled to its end: the progress thread takes this thread for a polling
        // application (APP_POLL_WINDOW), and waking it only had it find so, two context
        // switches per message that each took a CPU from a polling thread.
        if self.app_waiting.fetch_sub(1, Ordering::SeqCst) == 1 && slept {
            ring(&self.doorbell);
        }
    }

    /// The progress thread found the lock taken while the application polls (which does
    /// its work meanwhile): it sleeps until the doorbell rings or APP_POLL_WINDOW passes,
    /// published as the instant it wakes, as any sleep of it (`sleeping_until`).
    /// Meanwhile it watches the sockets for the application if it leaves them to this
    /// thread ([`watch_for_app`](Self::watch_for_app)).
    /// Returns whether a sender's nudge rang the inbox's bell meanwhile.
    fn sleep_while_app_polls(&self, now: Instant) -> bool {
        self.sleeping_until.store(now.saturating_add(APP_POLL_WINDOW).as_nanos().max(1), Ordering::Release);
        let mut fds = vec![PollFd::new(&self.doorbell, PollFlags::IN)];
        let for_app = self.watch_for_app(&mut fds);
        let bell = self.watch_nudges(&mut fds);
        poll(&mut fds, Some(APP_POLL_WINDOW));
        if for_app {
            self.tell_app_of_sockets(&fds[1..]);
        }
        let rang = bell.rang(&fds);
        drop(fds);
        self.sleeping_until.store(0, Ordering::Release);
        drain(&self.doorbell);
        self.drain_watched_bell(bell);
        rang
    }

    /// Adds the sockets to `fds` (after the doorbell) if this thread's next sleep watches
    /// them for a polling application, and returns whether it does: the application leaves
    /// them to this thread ([`Shared::sockets_idle`]), this thread has not told of a
    /// readable one yet, and no thread waits on a channel (which watches them itself).
    /// Once told, this thread sleeps without them until the application has asked them:
    /// a readable socket would wake it at once, again and again.
    fn watch_for_app<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> bool {
        let watch = self.sockets_idle.load(Ordering::SeqCst)
            && !self.sockets_news.load(Ordering::Acquire)
            && self.app_waiting.load(Ordering::SeqCst) == 0;
        if watch {
            fds.extend(self.socket_fds());
        }
        watch
    }

    /// The port's sockets, as entries of a `poll(2)` set watching them for datagrams.
    fn socket_fds(&self) -> impl Iterator<Item = PollFd<'_>> {
        self.port.sockets().iter().map(|s| PollFd::from_borrowed_fd(s.as_fd(), PollFlags::IN))
    }

    /// After a sleep that watched the sockets for the application (`watched`: their
    /// descriptors, first in the sleep's set): tells it of any that became readable.
    fn tell_app_of_sockets(&self, watched: &[PollFd<'_>]) {
        let sockets = self.port.sockets().len();
        if watched.iter().take(sockets).any(|f| !f.revents().is_empty()) {
            self.sockets_news.store(true, Ordering::Release);
        }
    }

    /// Receives, sends and delivers events in this thread, as a polling application does,
    /// until `ready` or for `budget`. Returns whether `ready`.
    fn poll_until(&self, budget: Duration, ready: impl Fn() -> bool) -> bool {
        if budget.is_zero() {
            return false;
        }
        let start = self.now();
        let mut yielded = start;
        loop {
            let now = self.now();
            // The progress thread leaves the sockets and the inbox to this one meanwhile.
            self.app_polled.store(now.as_nanos().max(1), Ordering::Relaxed);
            let mut st = self.lock();
            st.receive(self, now, true, true);
            st.dispatch_events(self, now);
            if ready() {
                // As a poll that returns a completion: what the receive queued (the ACK,
                // mostly) may leave with the application's answer, in one send, rather
                // than in a send of its own before the application sees its event (on the
                // wire, a `sendmmsg` on every message's path: an event-driven ping-pong
                // 14.5-17.9 us one way, against 6 polled).
                self.app_received(&mut st, now);
                return true;
            }
            self.app_flush_at(&mut st, now);
            drop(st);
            if ready() {
                return true;
            }
            if now - start >= budget {
                return false;
            }
            if now - yielded >= WAIT_YIELD_EVERY {
                std::thread::yield_now();
                yielded = now;
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn wait_channel_inner(&self, fd: &OwnedFd, timeout: Option<Duration>) {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let groups = self.group_sockets();
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2 + self.port.sockets().len() + groups.len());
            fds.push(PollFd::new(fd, PollFlags::IN));
            fds.extend(self.socket_fds());
            fds.extend(groups.iter().map(|s| PollFd::from_borrowed_fd(s.as_fd(), PollFlags::IN)));
            // Rung by another process of the host: this thread takes the packet, as from a
            // socket.
            let bell = self.watch_bell(&mut fds);
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            let ready = if bell == Bell::Pending { 1 } else { poll(&mut fds, left) };
            self.unwatch_bell(bell);
            if ready == 0 {
                return; // timed out
            }
            if !fds[0].revents().is_empty() {
                return;
            }
            drop(fds);
            drop(groups);
            self.drain_watched_bell(bell);
            let now = self.now();
            self.lock().progress(self, now, true, true);
            // The channel fired if that delivered our completion; otherwise wait again.
            if wait_readable(fd, Some(Duration::ZERO)) {
                return;
            }
        }
    }

    /// Before a thread sleeps watching the sockets: counts it among the inbox's sleepers and
    /// adds the bell to `fds`, unless a packet came through shared memory meanwhile.
    fn watch_bell<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> Bell {
        let (Some(fd), Some(sleepers)) = (&self.inbox_bell, &self.inbox_sleepers) else { return Bell::Unwatched };
        if !sleepers.sleep_if_empty() {
            return Bell::Pending;
        }
        fds.push(PollFd::new(fd, PollFlags::IN));
        Bell::Watched
    }

    /// Before the progress thread sleeps while the application polls and no thread waits on
    /// a channel: adds the inbox's bell to `fds`, last, without counting the thread among
    /// its sleepers, so that senders do not ring it for every packet, but a sender's nudge
    /// for packets left untaken wakes it ([`SameHost::nudge_stalled`]): the application
    /// may have stopped polling to wait in its memory.
    fn watch_nudges<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> Bell {
        match &self.inbox_bell {
            Some(fd) if self.app_waiting.load(Ordering::SeqCst) == 0 => {
                fds.push(PollFd::new(fd, PollFlags::IN));
                Bell::Nudges
            }
            _ => Bell::Unwatched,
        }
    }

    /// Awake again after [`watch_bell`](Self::watch_bell).
    /// Empties the inbox's bell if this thread slept on it ([`Bell::Watched`]), and only
    /// then: a bell that a thread waiting on a channel sleeps on is that thread's, and
    /// emptying it under that thread's poll took its wake-up (the poll found the FIFO empty
    /// again and slept on), so a packet that had rung it sat in the inbox until the progress
    /// thread's next timer, up to APP_POLL_WINDOW (an event-driven ping-pong's p99 was
    /// 600 us, and one run in three had a median of 550 us).
    fn drain_watched_bell(&self, bell: Bell) {
        if matches!(bell, Bell::Watched | Bell::Nudges)
            && let Some(fd) = &self.inbox_bell
        {
            drain_bell(fd.as_fd());
        }
    }

    fn unwatch_bell(&self, bell: Bell) {
        if let (Bell::Watched, Some(sleepers)) = (bell, &self.inbox_sleepers) {
            sleepers.awake();
        }
    }

    /// Queues a dropped CM ID for destruction by the next pass (which holds the lock).
    pub(crate) fn bury_cm_id(&self, id: softrdma_cm::CmId) {
        self.cm_graveyard.lock().unwrap_or_else(PoisonError::into_inner).push(id);
        self.cm_buried.store(true, Ordering::Release);
        ring(&self.doorbell);
    }

    /// Whether the application polls after `since`, within `budget` of it (spinning, reading
    /// its last poll's instant).
    fn app_polls_since(&self, since: Instant, budget: Duration) -> bool {
        loop {
            if self.app_polled.load(Ordering::Relaxed) > since.as_nanos() {
                return true;
            }
            if self.now() - since >= budget {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// The application is about to block (on a completion channel, in a sleeping wait):
    /// give the sockets back to the progress thread at once, or a packet could wait for
    /// the rest of [`APP_POLL_WINDOW`].
    pub(crate) fn app_sleeps(&self) {
        if self.app_polled.swap(0, Ordering::Relaxed) != 0 {
            ring(&self.doorbell);
        }
    }

    /// The sockets of the device's multicast groups, to poll beside the port's (none, at
    /// the cost of one atomic load, while no QP is attached to a group).
    fn group_sockets(&self) -> Vec<Arc<RoceSocket>> {
        if !self.has_groups.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.group_sockets.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn run(self: Arc<Self>) {
        let mut last_work = self.now();
        // This thread emptied the inbox's bell after a sender rang it: the packet is its to
        // take, whoever else slept on the bell (their poll found it empty again).
        let mut took_bell = false;
        let mut guard = SocketGuard::new();
        let mut spins = 0u32;
        // Until when the thread does not spin after its work: its last spin's yield found
        // the CPU wanted by another thread.
        let mut no_spin_until = Instant::ZERO;
        while !self.stop.load(Ordering::Acquire) {
            let now = self.now();
            let polled = self.app_polled.load(Ordering::Relaxed);
            let app_polled = polled != 0 && now.as_nanos().saturating_sub(polled) < APP_POLL_WINDOW.as_nanos() as u64;
            // An application that polls or waits on a completion channel receives itself.
            let app_polling = app_polled || self.app_waiting.load(Ordering::SeqCst) > 0;
            // While the application polls it holds the lock for most of each pass, and does
            // this thread's work too: this thread takes the lock only if it is free then.
            // Waiting for it left the application a futex wake-up for each of this thread's
            // looks (a 64 KiB WRITE stream's requester: 2.6 % of its samples in futex
            // calls, and 3.5 % of this thread's time spent in the contended lock).
            let Some(mut st) = (if app_polled { self.try_lock() } else { Some(self.lock()) }) else {
                took_bell |= self.sleep_while_app_polls(now);
                continue;
            };
            let timeout = {
                // While the application polls, it receives: this thread keeps to the timers
                // and sends what is queued. Receiving here as well only fought the
                // application for the device lock and split its work across two threads
                // (64 KiB WRITE requester: ~20 % of a second core, futex wake-ups). The
                // inbox is this thread's too while the application only waits on a
                // channel (the waiting thread takes what rings its bell; this one what
                // arrives while it is awake).
                let received = st.rx_batches;
                let rang = std::mem::take(&mut took_bell);
                let left = std::mem::take(&mut guard.take);
                let nudged = (rang || left) && app_polled;
                let worked = if nudged {
                    // A sender's nudge, or a socket the application left readable: it polls
                    // no more, and waits in its memory, maybe for what waits in the inbox
                    // or the sockets. Take them and deliver the events, but leave what that
                    // queued (the ACKs the packets earned) to go with the application's
                    // answer, as its own poll would, and sleep: sent now, on its own, an
                    // ACK let the peer's poll return before the answer came, and the peer
                    // waited in its memory in turn (a chain of nudged rounds in
                    // `ib_write_lat`). This thread's next pass, after NUDGED_ANSWER_WAIT,
                    // sends it if the application has not answered.
                    if rang && let Some(local) = &mut st.same_host {
                        local.nudged += 1;
                    }
                    st.sockets_left += u64::from(left);
                    st.receive(&self, now, left, true);
                    st.dispatch_events(&self, now);
                    false
                } else {
                    st.progress(&self, now, !app_polling, !app_polled || rang)
                };
                self.thread_receives.fetch_add(st.rx_batches - received, Ordering::Relaxed);
                if worked {
                    last_work = now;
                    continue;
                }
                // Not on a host whose cores are all wanted: there the spin took a core from
                // the threads this one works for, and every wake-up of this thread then
                // waited for their slices (the scheduler's lag: a thread that ran more than
                // its share runs last). Two processes that each wait for the other's WRITE
                // by reading their memory, on two cores: a round trip of 1.1 ms at the
                // median with the spin, 29-56 us without (`crate::slice`). A yield that
                // comes back at once says a core is free again, and the spin resumes after
                // the pause.
                if !app_polling && now - last_work < self.spin && now >= no_spin_until {
                    None // spin: stay awake, publish nothing
                } else {
                    // While the application polls, it does the receiving; this thread
                    // only keeps the timers, waking at least every APP_POLL_WINDOW to see
                    // whether it still polls. A waiting thread rings when it stops.
                    let mut timeout = st.deadline().map(|d| d - now);
                    if app_polled {
                        timeout = Some(timeout.map_or(APP_POLL_WINDOW, |t| t.min(APP_POLL_WINDOW)));
                    }
                    if nudged {
                        timeout = Some(timeout.map_or(NUDGED_ANSWER_WAIT, |t| t.min(NUDGED_ANSWER_WAIT)));
                    }
                    if st.same_host_backlog {
                        // Packets wait for room in another process's inbox: look again soon.
                        timeout = Some(timeout.map_or(BACKLOG_RETRY, |t| t.min(BACKLOG_RETRY)));
                    }
                    // Published under the lock, as the instant this thread will wake by
                    // itself: a verb that arms an earlier timer after this sees it and
                    // rings the doorbell (`after_verb`); a later one needs no wake-up.
                    let until = timeout.map_or(u64::MAX, |t| now.saturating_add(t).as_nanos().max(1));
                    self.sleeping_until.store(until, Ordering::Release);
                    if let Some(c) = &mut st.capture {
                        c.flush();
                    }
                    Some(timeout)
                }
            };
            drop(st);
            let Some(timeout) = timeout else {
                // A spin yields the CPU now and then, as a polling application does: on a
                // host with more busy threads than cores, the process whose packets this
                // thread waits for may be the one that needs it.
                spins = spins.wrapping_add(1);
                if spins % YIELD_AFTER_IDLE_TURNS == 0 {
                    let before = self.now();
                    std::thread::yield_now();
                    let after = self.now();
                    if after - before > CONTENDED_YIELD {
                        no_spin_until = after + NO_SPIN_AFTER_CONTENTION;
                    }
                } else {
                    std::hint::spin_loop();
                }
                continue;
            };
            // The group sockets as they are now: a detach meanwhile closes none under the poll.
            let groups = if app_polling { Vec::new() } else { self.group_sockets() };
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(2 + self.port.sockets().len() + groups.len());
            fds.push(PollFd::new(&self.doorbell, PollFlags::IN));
            let mut bell = Bell::Unwatched;
            let for_app = app_polled && self.watch_for_app(&mut fds);
            // The sockets the application left to itself, watched for it (`SocketGuard`),
            // between the doorbell and the bell.
            let guarding = app_polled
                && !for_app
                && self.app_waiting.load(Ordering::SeqCst) == 0
                && !self.port.sockets().is_empty()
                && guard.watches(now);
            if guarding {
                fds.extend(self.socket_fds());
            }
            if app_polled {
                bell = self.watch_nudges(&mut fds);
            } else if !app_polling {
                self.watching.store(true, Ordering::SeqCst);
                if self.app_waiting.load(Ordering::SeqCst) == 0 {
                    fds.extend(self.socket_fds());
                    fds.extend(groups.iter().map(|s| PollFd::from_borrowed_fd(s.as_fd(), PollFlags::IN)));
                    bell = self.watch_bell(&mut fds);
                } else {
                    // A thread began to wait on a channel meanwhile: it watches the sockets.
                    self.watching.store(false, Ordering::SeqCst);
                }
            }
            if bell != Bell::Pending {
                poll(&mut fds, timeout);
            }
            if for_app {
                self.tell_app_of_sockets(&fds[1..]);
            }
            if guarding && fds[1..].iter().take(self.port.sockets().len()).any(|f| !f.revents().is_empty()) {
                guard.rang(&self);
            }
            took_bell = bell.rang(&fds);
            drop(fds);
            self.unwatch_bell(bell);
            self.watching.store(false, Ordering::SeqCst);
            self.sleeping_until.store(0, Ordering::Release);
            drain(&self.doorbell);
            self.drain_watched_bell(bell);
        }
        // CM IDs dropped just before the device (a process returning from `main`, say) had
        // no pass left to send their DREQ or DREP: send them now, or the peer waits out its
        // DREQ retries. Here, not in `Driver::drop`: the device's last reference may go in
        // this thread (an object it was delivering), and then nobody joins it.
        let mut st = self.lock();
        if st.bury_dead_cm_ids(&self, self.now()) {
            self.after_verb(&mut st);
        }
    }
}

impl State {
    /// `ibv_post_send` to the engine: a lone atomic of an RC QP with nothing unacknowledged
    /// may be applied by this process itself, on the responder's memory, if it holds the
    /// responder's grant (`softrdma_engine::direct`); not while packets are captured, as a
    /// capture must show every operation.
    #[inline]
    pub(crate) fn post_send(
        &mut self,
        qpn: Qpn,
        wrs: &[softrdma_engine::SendWr<'_>],
    ) -> std::result::Result<(), softrdma_engine::PostError> {
        let State { nic, same_host, capture, .. } = self;
        if let [wr] = wrs
            && wr.op.is_atomic()
            && let Some(local) = same_host.as_mut().filter(|l| l.holds_grants() && capture.is_none())
        {
            return nic
                .engine_mut()
                .post_send_direct(qpn, wr, &mut ProcessMemory, |d| local.direct_atomic(qpn.value(), d));
        }
        nic.engine_mut().post_send(qpn, wrs, &ProcessMemory)
    }

    /// Runs `f`, which reaches registered memory outside the engine, with no other process
    /// applying an atomic to this process's regions on its own meanwhile (the inbox's gate
    /// closed, and open again after at the same epoch).
    pub(crate) fn paused<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let Some(local) = self.same_host.as_mut().filter(|l| l.gate_to_close()) else { return f() };
        let was = local.close_gate();
        let r = f();
        let epoch = self.nic.engine().grant_epoch();
        if let Some(local) = self.same_host.as_mut() {
            local.reopen_gate(was, epoch);
            self.gate_open = local.gate().is_some();
        }
        r
    }

    /// Before the lock is released: if the engine's grants were voided under it (a region
    /// deregistered, a QP modified or failed), closes the gate the requesters holding them
    /// go through, and waits for those inside, so that none applies an atomic the engine
    /// would now refuse once the verb returns.
    #[cold]
    #[inline(never)]
    fn close_stale_gate(&mut self) {
        let Some(local) = self.same_host.as_mut() else { return };
        if local.gate().is_some_and(|at| at != self.nic.engine().grant_epoch()) {
            local.close_gate();
        }
        self.gate_open = local.gate().is_some();
    }

    /// One pass: receive what the sockets and the inbox hold (with `sockets`, `inbox`), fire
    /// due timers, transmit,
    /// deliver events. Returns whether there was anything to do.
    fn progress(&mut self, shared: &Shared, now: Instant, sockets: bool, inbox: bool) -> bool {
        let mut worked = self.receive(shared, now, sockets, inbox);
        worked |= self.flush(shared, now);
        worked |= self.dispatch_events(shared, now);
        worked
    }

    /// Receives what the sockets hold (with `sockets`) and the inbox holds (with `inbox`),
    /// and fires due timers; sends nothing.
    fn receive(&mut self, shared: &Shared, now: Instant, sockets: bool, inbox: bool) -> bool {
        let mut worked = self.take_left_ack(now);
        worked |= self.bury_dead_cm_ids(shared, now);
        if inbox {
            let got = self.inbox_ingress(now);
            if got {
                self.inbox_last = Some(now);
            }
            worked |= got;
        }
        // What a poll left of the last batch goes before anything new, whoever receives
        // (the progress thread too, while the application polls: so it is taken within
        // APP_POLL_WINDOW even if the application makes no further call); and it is this
        // pass's receive: the sockets wait for the next (a `recvmmsg` that would find
        // nothing, mostly, made `ibv_rc_pingpong` 1 us slower one way).
        let mut resumed = false;
        if let Some(at) = self.rx_rest.take() {
            (worked, resumed) = (true, true);
            self.ingress_from(shared, now, None, at);
        }
        let all_idle = self.rx_empty.iter().all(|&e| e >= IDLE_SOCKET_AFTER);
        let inbox_busy = self.inbox_last.is_some_and(|t| now - t < INBOX_ACTIVE);
        if sockets {
            // An application thread that polls the inbox while every socket is idle (a
            // same-host ping-pong or stream) leaves the sockets to the progress thread's
            // sleep, which watches them in `poll(2)` and says when one is readable: asking
            // two idle sockets every IDLE_SOCKET_INTERVAL was two `recvmmsg` calls per 20
            // us in the polling thread, and cost a same-host ping-pong 3 % of its latency
            // (alternating runs). A net under the watch asks them every
            // WATCHED_SOCKET_INTERVAL still. Not while a thread waits on a channel: the
            // progress thread leaves the sockets to it, and it watches them only asleep.
            let idle = all_idle
                && inbox_busy
                && shared.app_waiting.load(Ordering::SeqCst) == 0
                && !crate::stats::is_progress_thread(shared.thread_id.get().copied());
            self.publish_sockets_idle(shared, idle);
        }
        let sockets = if sockets && !resumed { shared.port.sockets() } else { &[] };
        let news = !sockets.is_empty()
            && self.sockets_idle
            && shared.sockets_news.load(Ordering::Relaxed)
            && shared.sockets_news.swap(false, Ordering::Acquire);
        let interval = if self.sockets_idle { WATCHED_SOCKET_INTERVAL } else { IDLE_SOCKET_INTERVAL };
        let sweep = news || now - self.idle_asked >= interval;
        if sweep && !sockets.is_empty() {
            self.idle_asked = now;
        }
        // Nothing arrived anywhere for 64 passes and more: a poll waiting for an answer
        // that takes tens of microseconds (a ping-pong's answer comes within fewer, and its
        // socket counts as busy). The socket that brought the last datagrams is asked on
        // every pass, the others with the sweep (all of them while none has brought any):
        // asking an IPv4 flow's idle IPv6 socket too made each of those passes two
        // `recvmmsg` calls (an empty poll 0.9-1.1 us against 0.71-0.75 with one socket),
        // and an answer that came during the second waited for the next pass.
        let mut taken = 0;
        let quiet = all_idle && !inbox_busy;
        for (i, socket) in sockets.iter().enumerate() {
            if RX_PASS_BYTES.saturating_sub(taken) < self.rx_longest {
                break; // the pass took its fill: the other sockets wait for the next
            }
            let busy = self.rx_empty[i] < IDLE_SOCKET_AFTER;
            let awaited = quiet && self.rx_last_socket.is_none_or(|last| last == i);
            if !(sweep || busy || awaited) {
                continue;
            }
            let mut got = false;
            for _ in 0..RX_ROUNDS {
                // As many messages as the pass has room for, were each as long as the
                // longest of late (the first round has room: checked above).
                let room = RX_PASS_BYTES.saturating_sub(taken);
                if room < self.rx_longest {
                    break;
                }
                self.rx.set_limit(room.checked_div(self.rx_longest).unwrap_or(RX_BATCH));
                match socket.recv(&mut self.rx) {
                    Ok(0) => break,
                    Ok(n) => {
                        got = true;
                        self.rx_batches += 1;
                        taken += self.rx.bytes();
                        // A train's 64 KiB and its short tail alternate: the longest of late
                        // forgets slowly, an eighth a batch.
                        self.rx_longest = self.rx.longest().max(self.rx_longest - self.rx_longest / 8);
                        if let Some(drops) = self.rx.drops().filter(|&d| d != self.rx_drops[i]) {
                            // The kernel dropped datagrams for this socket: the receiver is
                            // overrun; the recent senders get CNPs.
                            self.rx_drops[i] = drops;
                            self.nic.engine_mut().handle_receive_drops(now);
                        }
                        let asked = self.rx.limit();
                        self.ingress(shared, now);
                        if n < asked || self.rx_rest.is_some() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            worked |= got;
            self.rx_empty[i] = if got { 0 } else { self.rx_empty[i].saturating_add(1) };
            if got {
                self.rx_last_socket = Some(i);
            }
            if self.rx_rest.is_some() {
                break; // the batch holds datagrams still: nothing new may overwrite them
            }
        }
        if !sockets.is_empty() && self.rx_rest.is_none() {
            worked |= self.receive_groups(shared, now);
        }
        if let State { faults: Some(f), nic, capture, .. } = self {
            worked |= f.release(now, |e, ip, d, arrival| to_nic(nic, capture, now, e, ip, d, arrival));
        }
        if self.nic.poll_timeout().is_some_and(|t| t <= now) {
            self.nic.handle_timeout(now);
            worked = true;
        }
        let progress_thread = shared.thread_id.get().copied();
        let State { stats, nic, send_errors, channel_waits, acks_left, sockets_left, same_host, faults, .. } = self;
        stats.after_receive(now, worked, progress_thread, || {
            counters(nic, *send_errors, *channel_waits, *acks_left, *sockets_left, same_host.as_ref(), faults.as_ref())
        });
        worked
    }

    /// Publishes whether an application thread leaves the idle sockets to the progress
    /// thread's watch ([`Shared::sockets_idle`]); when it starts to, rings the doorbell, so
    /// that the progress thread, asleep without the sockets, sleeps again watching them.
    fn publish_sockets_idle(&mut self, shared: &Shared, idle: bool) {
        if idle != self.sockets_idle {
            self.sockets_idle = idle;
            shared.sockets_idle.store(idle, Ordering::SeqCst);
            if idle {
                ring(&shared.doorbell);
            }
        }
    }

    /// Receives what the multicast groups' sockets hold: the datagrams that came in by the
    /// device's interface (a group socket takes the group's datagrams from every
    /// interface the group is joined on, by any device of the process).
    fn receive_groups(&mut self, shared: &Shared, now: Instant) -> bool {
        let mut worked = false;
        for g in 0..self.groups.len() {
            let socket = Arc::clone(&self.groups[g].1);
            self.rx.set_limit(RX_BATCH);
            for _ in 0..RX_ROUNDS {
                match socket.recv(&mut self.rx) {
                    Ok(n) if n > 0 => {
                        worked = true;
                        self.rx_batches += 1;
                        self.ingress_from(shared, now, Some(shared.port.interface_index), RxPosition::default());
                        if n < RX_BATCH {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        }
        worked
    }

    /// Makes the group sockets what the engine's multicast table asks for: joins each group
    /// a QP is attached to (binding its socket on the device's interface), leaves those no
    /// QP is. Call after every attach, detach and QP destruction. Fails with the first group
    /// that could not be joined (the others are joined still).
    pub(crate) fn sync_groups(&mut self, shared: &Shared) -> Result<(), (Gid, io::Error)> {
        let wanted: Vec<Gid> = self.nic.engine().mcast_groups().collect();
        if wanted.len() == self.groups.len() && self.groups.iter().all(|(g, _)| wanted.contains(g)) {
            return Ok(()); // (most calls: a QP destroyed that was in no group)
        }
        let mut result = Ok(());
        self.groups.retain(|(g, _)| wanted.contains(g));
        for gid in wanted {
            if self.groups.iter().any(|(g, _)| *g == gid) {
                continue;
            }
            let config = softrdma_udp::Config {
                port: shared.port.udp_port,
                recv_buffer_size: Some(SOCKET_BUFFER),
                ..softrdma_udp::Config::default()
            };
            match RoceSocket::bind_group(gid.to_ip(), shared.port.interface_index, &config) {
                Ok(socket) => self.groups.push((gid, Arc::new(socket))),
                Err(e) => {
                    if result.is_ok() {
                        result = Err((gid, e));
                    }
                }
            }
        }
        let sockets: Vec<Arc<RoceSocket>> = self.groups.iter().map(|(_, s)| Arc::clone(s)).collect();
        shared.has_groups.store(!sockets.is_empty(), Ordering::Release);
        *shared.group_sockets.lock().unwrap_or_else(PoisonError::into_inner) = sockets;
        // A sleeping progress thread polls the sockets it had: wake it to take the new set.
        ring(&shared.doorbell);
        result
    }

    /// When the engine or the CM next wants to be called.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let held = self.faults.as_ref().and_then(Faults::next_release);
        let prune = self.same_host.as_ref().and_then(SameHost::next_prune);
        Instant::earliest(Instant::earliest(self.nic.poll_timeout(), held), prune)
    }

    /// The device's counters.
    pub(crate) fn counters(&self) -> Counters {
        counters(
            &self.nic,
            self.send_errors,
            self.channel_waits,
            self.acks_left,
            self.sockets_left,
            self.same_host.as_ref(),
            self.faults.as_ref(),
        )
    }

    /// Hands the received batch to the NIC.
    fn ingress(&mut self, shared: &Shared, now: Instant) {
        self.ingress_from(shared, now, None, RxPosition::default());
    }

    /// [`ingress`](Self::ingress) of the datagrams from `from` on that came in by interface
    /// `interface` (`None`: all). A poll's receive ([`rx_stop_at`](Self::rx_stop_at)) stops
    /// once its CQ has a completion, and leaves the rest in [`rx_rest`](Self::rx_rest).
    fn ingress_from(&mut self, shared: &Shared, now: Instant, interface: Option<u32>, from: RxPosition) {
        let State { nic, rx, capture, same_host, faults, rx_rest, rx_stop_at, acks_left, .. } = self;
        let mut datagrams = rx.iter_from(from);
        while let Some(d) = datagrams.next() {
            if interface.is_some_and(|i| d.ifindex != 0 && d.ifindex != i) {
                continue;
            }
            if Member::is_probe(d.payload) {
                shared.port.member.answer_probe(d.payload);
                continue;
            }
            // A CM MAD comes by the socket, the same peer's QP packets through the inbox: what
            // it put in the inbox before it sent the MAD is there now, and goes first (an ACK
            // before the DREQ that follows it, or the DREQ would flush the send it acknowledges).
            if let Some(local) = same_host.as_mut().filter(|_| is_gsi(d.payload)) {
                while local.receive(RX_BATCH, |e, ip, d, how| {
                    deliver(nic, capture, faults, now, e, ip, d, Arrival::Inbox(how));
                }) > 0
                {}
            }
            // The IPv4 identification is not shown by the socket: the first guess is 0
            // (what softrdma sends), or for a GSO train from this host (a loopback
            // source) segment i's index, which the kernel gave it. The engine recovers any
            // other from the ICRC.
            let guess = match u16::try_from(d.segment_index) {
                Ok(i) if i > 0 && d.envelope().src_ip().is_loopback() => d.envelope_with_id(i),
                _ => d.envelope(),
            };
            let ip = d.ip();
            let info = IpInfo { hop_limit: ip.hop_limit, traffic_class: ip.traffic_class, flow_label: ip.flow_label };
            deliver(nic, capture, faults, now, &guess, info, d.payload, Arrival::Socket);
            // The answer a poll waits for came with the ACK of the poller's own message
            // (one GSO datagram: `TxQueue::pair_answers`): the completion goes back now,
            // and the ACK waits for the next pass. Only after an answer (a request: an
            // ACK's completion is followed by more of them in a stream, as wanted as it),
            // and only ACKs wait: whatever else the rest holds may change memory that the
            // application watches without a verb.
            if let Some(cq) = *rx_stop_at
                && interface.is_none()
                && !only_acknowledges(d.payload)
                && nic.engine().cq_ready(cq)
                && let Some(at) = datagrams.rest()
                && rx.iter_from(at).all(|d| only_acknowledges(d.payload))
            {
                *rx_rest = Some(at);
                *acks_left += 1;
                break;
            }
        }
    }

    /// Hands what other processes of the host put in this device's inbox to the NIC.
    fn inbox_ingress(&mut self, now: Instant) -> bool {
        let State { nic, capture, same_host, faults, rx_stop_at, ack_left, acks_left, .. } = self;
        let Some(local) = same_host else { return false };
        // A pass takes one batch, and its ACKs leave before the next: taking a whole window
        // (4 batches) before answering made the two processes take turns, each idle while
        // the other worked (64 KiB WRITE: 1.1 GB/s, against 1.7-1.8 so).
        let max = RX_BATCH;
        local.receive(max, |envelope, ip, datagram, mut how| {
            // ACKs in the order they came.
            if let Some(left) = ack_left.take() {
                left.take(nic, now);
            }
            // In a poll, an ACK beside a packet that only frees room in the send queue is
            // taken after it, and after the poll returns, if the packet's completion is
            // what the poll waits for (LeftAck).
            let quiet = match (*rx_stop_at, how.ack, &*faults, &*capture) {
                (Some(_), Some(ack), None, None) if nic.engine().ack_beside_is_quiet(datagram, ack) => {
                    LeftAck::new(envelope, datagram, ack)
                }
                _ => None,
            };
            if quiet.is_some() {
                how.ack = None; // taken below, after the packet
            }
            deliver(nic, capture, faults, now, envelope, ip, datagram, Arrival::Inbox(how));
            if let Some(left) = quiet {
                if rx_stop_at.is_some_and(|cq| nic.engine().cq_ready(cq)) {
                    *ack_left = Some(left);
                    *acks_left += 1;
                } else {
                    left.take(nic, now);
                }
            }
        }) > 0
    }

    /// Takes the ACK a poll left ([`LeftAck`]), if any. Returns whether there was one.
    fn take_left_ack(&mut self, now: Instant) -> bool {
        let Some(left) = self.ack_left.take() else { return false };
        left.take(&mut self.nic, now);
        true
    }

    /// Sends everything the NIC has to send (the CM's MADs first, then the engine's
    /// packets). Returns whether it sent anything.
    pub(crate) fn flush(&mut self, shared: &Shared, now: Instant) -> bool {
        let any = self.flush_packets(shared, now);
        if let Some(local) = &mut self.same_host {
            self.same_host_backlog = local.flush();
            local.prune(now);
        }
        any
    }

    fn flush_packets(&mut self, shared: &Shared, now: Instant) -> bool {
        let port = &shared.port;
        let mut any = false;
        // The ECN bits of every datagram: ECT(0) where congestion control runs.
        let ecn = if self.nic.engine().config().congestion.is_some() { ECT0 } else { 0 };
        loop {
            self.tx.meta.clear();
            let mut at = 0;
            while self.tx.meta.len() < TX_BATCH {
                let State { nic, tx, same_host, capture, send_errors, gate_open, .. } = self;
                let out = &mut tx.arena[at..at + DATAGRAM_MAX];
                // Payloads are copied into the packet, which then leaves as one piece of
                // its GSO buffer: gathered by the kernel from where the application has
                // them instead, they cost the kernel as much as the copy saved (docs/architecture.md,
                // "The data path", "Payloads copied, not gathered").
                match nic.poll_transmit(now, &mut ProcessMemory, out) {
                    Some(mut t) => {
                        // A capture must show every atomic: no grant while it runs.
                        let grant = if t.grant && capture.is_none() { nic.engine().grant(t.local_qp) } else { None };
                        *gate_open |= grant.is_some(); // the send may open it
                        let datagram = &mut tx.arena[at..at + t.len];
                        // The ICRC is computed last, as a NIC does, and only for what leaves
                        // by a socket or is captured: the same-host path needs none.
                        if capture.is_some() {
                            complete_icrc(&mut t, datagram, &mut tx.prefixes);
                        }
                        match same_host.as_mut().and_then(|l| l.send(now, &t, grant, ecn, datagram)) {
                            Some(receiver) => {
                                if let Some(c) = capture {
                                    c.write_sent(t.local_qp, &t.envelope, datagram);
                                }
                                // The receiver copies from this process or not: an RC QP's
                                // long messages go by reference or not; and it takes ACKs
                                // beside packets or not (neither under a capture, which must
                                // show the data, and every packet).
                                let opcode = BthPacket::new_unchecked(&*datagram).opcode();
                                let rc = opcode.info().is_some_and(|i| i.transport == Transport::Rc);
                                if capture.is_none() && rc {
                                    if receiver.mutual != t.qp_by_reference {
                                        nic.engine_mut().allow_by_reference(t.local_qp, receiver.mutual);
                                    }
                                    if receiver.acks_beside != t.qp_acks_beside {
                                        nic.engine_mut().allow_acks_beside(t.local_qp, receiver.acks_beside);
                                    }
                                }
                                any = true;
                                continue;
                            }
                            None if t.by_reference => {
                                // Only a process that copies from this one can take it (on
                                // a socket it would be a SEND or WRITE with a list of
                                // addresses for data). Its receiver is gone, its inbox
                                // closed: RC's retries end the QP.
                                *send_errors += 1;
                                continue;
                            }
                            None => {
                                if t.qp_acks_beside {
                                    // Its peer is not (or no longer) a process that takes
                                    // them: its ACKs go as packets from now on. One that
                                    // rode this packet is lost, as a dropped ACK is: the
                                    // peer's retry brings it again.
                                    nic.engine_mut().allow_acks_beside(t.local_qp, false);
                                }
                            }
                        }
                        let end = at + t.len;
                        complete_icrc(&mut t, &mut tx.arena[at..end], &mut tx.prefixes);
                        tx.meta.push((at, t));
                        at += t.len;
                    }
                    None => break,
                }
            }
            if self.tx.meta.is_empty() {
                return any;
            }
            any = true;
            let full = self.tx.meta.len() == TX_BATCH;
            self.tx.pair_answers();
            let units = self.tx.gso_runs();
            self.send_units(port, &units, ecn);
            if !full {
                return any;
            }
        }
    }

    /// Sends the units: requests before responses (a QP that answers a message at once
    /// sends its new request and the ACK it owes in one batch, and the peer, which waits
    /// for the request, should not first be woken by the ACK; each stream keeps its own
    /// order, which is all RC asks), units from one source address in one sendmmsg.
    /// `ecn`: the ECN bits of every datagram.
    fn send_units(&mut self, port: &Port, units: &[(usize, usize, usize); TX_BATCH], ecn: u8) {
        let State { tx, capture, send_errors, .. } = self;
        let live: usize = units.iter().take_while(|x| x.1 > 0).count();
        let mut order = [0usize; TX_BATCH];
        let mut k = 0;
        for response in [false, true] {
            for (j, &(first, _, _)) in units[..live].iter().enumerate() {
                let off = tx.meta[first].0;
                if tx.is_response(off) == response {
                    order[k] = j;
                    k += 1;
                }
            }
        }
        let mut done = [false; TX_BATCH];
        for lead in 0..live {
            let lead_unit = order[lead];
            if done[lead_unit] {
                continue;
            }
            let src = tx.meta[units[lead_unit].0].1.envelope.src_ip();
            // Only the datagrams in use are written (a whole array of TX_BATCH, each with
            // its envelope, was 2.5 KiB to copy for every send).
            let mut out: SmallVec<[Outgoing<'_>; TX_BATCH]> = SmallVec::new();
            for &j in &order[lead..live] {
                let (first, count, segment) = units[j];
                let (off, t) = tx.meta[first];
                if done[j] || t.envelope.src_ip() != src {
                    continue;
                }
                done[j] = true;
                let (last_off, last) = tx.meta[first + count - 1];
                let bytes = &tx.arena[off..last_off + last.len];
                let mut o = Outgoing::new(t.envelope, bytes);
                if t.traffic_class != 0 {
                    // The QP's DSCP; the ECN bits stay ECT(0) where congestion control runs.
                    o.traffic_class = Some(t.traffic_class & !0b11 | ecn);
                }
                if count > 1 {
                    o.segment_size = u16::try_from(segment).ok();
                }
                if let Some(c) = capture {
                    for s in 0..count {
                        let (so, st) = tx.meta[first + s];
                        c.write_sent(
                            st.local_qp,
                            &with_identification(st.envelope, s as u16),
                            &tx.arena[so..so + st.len],
                        );
                    }
                }
                out.push(o);
            }
            let sent = match port.socket_for(src) {
                Some(socket) => send_all(socket, &out),
                None => 0,
            };
            *send_errors += (out.len() - sent) as u64;
        }
    }

    /// Delivers completion events to their channels, asynchronous events to the queue and
    /// CM events to their IDs' channels.
    fn dispatch_events(&mut self, shared: &Shared, now: Instant) -> bool {
        let mut any = false;
        let mut moved = false;
        while let Some(event) = self.nic.poll_event() {
            any = true;
            match event {
                NicEvent::Engine(Event::Completion(CqId(cq))) => {
                    if let Some(ch) = self.cq_channels.get(&cq) {
                        ch.fire();
                    }
                }
                NicEvent::Engine(Event::Async(e)) => {
                    // An event the engine queued for a QP destroyed since has no one to
                    // go to (QpInner's drop forgot those already dispatched).
                    let gone = e.qpn().is_some_and(|n| self.nic.engine().qp_state(n).is_none());
                    if !gone && shared.async_events.len() < ASYNC_EVENTS_MAX {
                        shared.async_events.push(e);
                    }
                }
                NicEvent::Cm(e) => {
                    moved = true;
                    // Without a delivery no ID was made on this device: nobody to tell.
                    if let Some(d) = &self.cm_delivery {
                        d.deliver(e, &mut self.drop_later);
                    }
                }
            }
        }
        if moved {
            // The NIC may have moved attached QPs, queuing packets and MADs.
            self.flush(shared, now);
        }
        any
    }

    /// Destroys the CM IDs the application dropped ([`Shared::bury_cm_id`]). Returns
    /// whether there were any.
    pub(crate) fn bury_dead_cm_ids(&mut self, shared: &Shared, now: Instant) -> bool {
        if !shared.cm_buried.load(Ordering::Acquire) || !shared.cm_buried.swap(false, Ordering::Acquire) {
            return false;
        }
        let dead = std::mem::take(&mut *shared.cm_graveyard.lock().unwrap_or_else(PoisonError::into_inner));
        let any = !dead.is_empty();
        for id in dead {
            self.destroy_cm_id(now, id);
        }
        any
    }

    /// Destroys a CM ID and forgets the API layer's object of it.
    fn destroy_cm_id(&mut self, now: Instant, id: CmId) {
        if let Some(d) = &self.cm_delivery {
            d.forget(id);
        }
        let _ = self.nic.destroy_id(now, id);
    }
}

/// Whether `datagram` is for QP1, the CM's (its BTH's destination QP).
fn is_gsi(datagram: &[u8]) -> bool {
    softrdma_wire::BthPacket::new_checked(datagram).is_ok_and(|b| b.dest_qp().value() == 1)
}

/// How a received datagram came, which decides how the NIC takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// By a socket: its ICRC is checked ([`deliver_now`]).
    Socket,
    /// Through the same-host inbox, unchecked ([`deliver_from_inbox`]); with its data
    /// carried by reference, the process to copy it from, and an ACK to take before it.
    Inbox(FromInbox),
}

impl Arrival {
    /// Whether the receiver checks its ICRC.
    pub(crate) fn icrc_checked(self) -> bool {
        self == Arrival::Socket
    }
}

/// Whether `datagram` is an RC or XRC ACK (or NAK): what a poll that has its completion
/// may leave for its next call, as taking it later changes nothing the application sees
/// without a verb (its send completions, its send queue's room). Everything else is taken
/// at once: a request writes memory that the application may be watching (`ib_write_lat`
/// spins on its buffer and calls no verb), a READ response or an atomic's ACK writes the
/// requester's, and a CM MAD moves a connection on.
fn only_acknowledges(datagram: &[u8]) -> bool {
    datagram.first().and_then(|&op| Opcode(op).info()).is_some_and(|i| i.operation == Operation::Acknowledge)
}

/// An ACK that came beside a packet through the inbox, taken after the packet and after
/// the poll that returned the packet's completion, by the next pass (a poll, a wait, the
/// progress thread's, which comes within `APP_POLL_WINDOW`): only one that frees room in
/// the send queue and nothing more (`Engine::ack_beside_is_quiet`), so that the
/// application sees the same completions in the same order, a moment sooner. A
/// ping-pong of unsignaled WRITEs (`softrdma perf write lat`) was 0.48–0.49 µs one way with
/// the ACK taken first, 0.43–0.44 so: its 500 instructions came between the answer and the
/// application. (On a socket, an answer and the ACK paired with it wait the same way:
/// `rx_rest`.)
struct LeftAck {
    envelope: Envelope,
    /// The packet's base transport header, which names the QP.
    bth: [u8; softrdma_wire::bth::HEADER_LEN],
    ack: softrdma_engine::AckBeside,
}

impl LeftAck {
    fn new(envelope: &Envelope, packet: &[u8], ack: softrdma_engine::AckBeside) -> Option<LeftAck> {
        let bth = packet.get(..softrdma_wire::bth::HEADER_LEN)?.try_into().ok()?;
        Some(LeftAck { envelope: *envelope, bth, ack })
    }

    fn take(self, nic: &mut Nic, now: Instant) {
        nic.engine_mut().handle_ack_beside(now, &self.envelope, &self.bth, self.ack);
    }
}

/// One received datagram to the NIC, through the injected faults if any.
#[allow(clippy::too_many_arguments)]
fn deliver(
    nic: &mut Nic,
    capture: &mut Option<Capture>,
    faults: &mut Option<Faults>,
    now: Instant,
    guess: &Envelope,
    ip: IpInfo,
    datagram: &[u8],
    arrival: Arrival,
) {
    match faults {
        None => to_nic(nic, capture, now, guess, ip, datagram, arrival),
        Some(f) => f.admit(now, guess, ip, datagram, arrival, |e, ip, d, arrival| {
            to_nic(nic, capture, now, e, ip, d, arrival);
        }),
    }
}

/// [`deliver_now`] what came by a socket, [`deliver_from_inbox`] what did not.
fn to_nic(
    nic: &mut Nic,
    capture: &mut Option<Capture>,
    now: Instant,
    guess: &Envelope,
    ip: IpInfo,
    datagram: &[u8],
    arrival: Arrival,
) {
    match arrival {
        Arrival::Socket => deliver_now(nic, capture, now, guess, ip, datagram),
        Arrival::Inbox(how) => deliver_from_inbox(nic, capture, now, guess, ip, datagram, how),
    }
}

/// Says on stderr which faults a device runs, with the seed that repeats their decisions:
/// a user who set them must see them, and a failing run must be repeatable.
#[allow(clippy::print_stderr)]
fn announce_faults(device: &Device, spec: &softrdma_sim::FaultSpec) {
    eprintln!(
        "softrdma: {}: injecting faults on what it receives: {spec} (to repeat: {}='{spec}')",
        device.name(),
        crate::faults::FAULTS_ENV
    );
    tracing::info!(device = device.name(), %spec, "injecting faults");
}

/// A packet from another process's engine on this host, through the shared-memory inbox:
/// made by an engine, through memory only this user's processes can write, and sent without
/// its ICRC (it crosses no wire: `Transmit::icrc_pending`), so there is nothing to check. A
/// capture gets it with its ICRC. An ACK beside it is taken first, where its packet would
/// have come (a process that captures takes none: its inbox says so).
fn deliver_from_inbox(
    nic: &mut Nic,
    capture: &mut Option<Capture>,
    now: Instant,
    envelope: &Envelope,
    ip: IpInfo,
    datagram: &[u8],
    FromInbox { origin, ack }: FromInbox,
) {
    if let Some(ack) = ack {
        nic.engine_mut().handle_ack_beside(now, envelope, datagram, ack);
    }
    if let Some(c) = capture {
        let mut complete = datagram.to_vec();
        RocePacket::new_unchecked(&mut complete[..]).fill_icrc(envelope);
        c.write(envelope, &complete);
    }
    match origin {
        None => nic.handle_checked_datagram(now, envelope, ip, datagram, &mut ProcessMemory),
        Some(origin) => nic.handle_referenced_datagram(now, envelope, ip, datagram, origin, &mut ProcessMemory),
    }
}

/// One received datagram to the NIC, after its ICRC check (and to the capture).
fn deliver_now(
    nic: &mut Nic,
    capture: &mut Option<Capture>,
    now: Instant,
    guess: &Envelope,
    ip: IpInfo,
    datagram: &[u8],
) {
    let checked = nic.engine_mut().check_icrc(now, guess, datagram);
    if let Some(c) = capture {
        c.write(&checked.unwrap_or(*guess), datagram);
    }
    if let Some(envelope) = checked {
        nic.handle_checked_datagram(now, &envelope, ip, datagram, &mut ProcessMemory);
    }
}

/// Computes `datagram`'s ICRC if the engine left it to the runtime
/// ([`Transmit::icrc_pending`]).
fn complete_icrc(t: &mut Transmit, datagram: &mut [u8], prefixes: &mut IcrcPrefixCache) {
    if std::mem::take(&mut t.icrc_pending) {
        RocePacket::new_unchecked(datagram).fill_icrc_with(&t.envelope, prefixes);
    }
}

/// The counters of a device: the NIC's and the sockets'.
fn counters(
    nic: &Nic,
    send_errors: u64,
    waits: ChannelWaits,
    acks_left: u64,
    sockets_left: u64,
    same_host: Option<&SameHost>,
    faults: Option<&Faults>,
) -> Counters {
    let gsi = nic.counters();
    Counters {
        engine: nic.engine().counters(),
        send_errors: send_errors + gsi.gsi_unsendable,
        gsi_dropped: gsi.gsi_dropped,
        same_host_sent: same_host.map_or(0, |l| l.sent),
        same_host_rcvd: same_host.map_or(0, |l| l.received),
        same_host_nudges_sent: same_host.map_or(0, |l| l.nudges),
        same_host_nudges_taken: same_host.map_or(0, |l| l.nudged),
        channel_waits_polled: waits.polled,
        channel_waits_slept: waits.slept,
        acks_left_for_next_poll: acks_left,
        sockets_left_by_app: sockets_left,
        faults: faults.map(Faults::counters).unwrap_or_default(),
        cm: nic.cm().counters(),
    }
}

/// A switch any program can be given in the environment: `0` or `1` in `name` if set,
/// else `option`.
fn switch(name: &str, option: bool) -> bool {
    match std::env::var(name).as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => option,
    }
}

/// Whether the device takes the same-host path: [`crate::SAME_HOST_ENV`], else
/// [`ContextOptions::same_host`].
fn same_host(options: &ContextOptions) -> bool {
    switch(crate::SAME_HOST_ENV, options.same_host)
}

/// Whether the device runs congestion control: [`crate::CONGESTION_CONTROL_ENV`], else
/// [`ContextOptions::congestion_control`].
fn congestion_control(options: &ContextOptions) -> bool {
    switch(crate::CONGESTION_CONTROL_ENV, options.congestion_control)
}

/// `envelope` with IPv4 identification `id` (what the kernel gives GSO segment `id`).
fn with_identification(mut envelope: Envelope, id: u16) -> Envelope {
    if let Envelope::V4(e) = &mut envelope {
        e.identification = id;
    }
    envelope
}

/// Sends a batch, retrying once after the socket drains if its buffer was full. Returns how
/// many went out; the rest are lost as on a congested link (RC retransmits them).
fn send_all(socket: &RoceSocket, out: &[Outgoing<'_>]) -> usize {
    let (mut next, mut sent) = (0, 0);
    let mut retried = false;
    while next < out.len() {
        match socket.send_batch(&out[next..]) {
            Ok(n) if n > 0 => {
                next += n;
                sent += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !retried => {
                retried = true;
                let _ = socket.wait_writable(Some(Duration::from_millis(1)));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return sent,
            // A datagram the kernel refuses (no route, too big) is skipped.
            Ok(_) | Err(_) => next += 1,
        }
    }
    sent
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use softrdma_engine::Transmit;
    use softrdma_wire::Envelope;

    use crate::*;

    /// A queue holding `packets` (first byte the opcode, bytes 5..8 the destination QPN,
    /// the rest a fill byte naming the packet), all from 127.0.0.1 to `dst`.
    fn queue(gso: bool, dst: [u8; 4], packets: &[(u8, u8, usize)]) -> super::TxQueue {
        let mut q = super::TxQueue::new(gso);
        let envelope = Envelope::rocev2([127, 0, 0, 1].into(), 4791, dst.into()).unwrap();
        let mut at = 0;
        for (i, &(opcode, qpn, len)) in packets.iter().enumerate() {
            let p = &mut q.arena[at..at + len];
            p.fill(b'a' + i as u8);
            p[0] = opcode;
            p[5..8].copy_from_slice(&[0, qpn, 0]);
            q.meta.push((at, Transmit::new(envelope, len, softrdma_wire::Qpn::default(), false)));
            at += len;
        }
        q
    }

    /// The packets of a queue in send order: (opcode, fill byte, length, contiguous).
    fn order(q: &super::TxQueue) -> Vec<(u8, u8, usize)> {
        q.meta.iter().map(|&(o, t)| (q.arena[o], q.arena[o + 8], t.len)).collect()
    }

    #[test]
    fn an_ack_before_a_request_of_the_same_qp_trades_places_with_it() {
        const ACK: u8 = 0x11;
        const SEND: u8 = 0x04;
        // [ACK, SEND] to QP 0x40 on this host: the SEND first, then the ACK, bytes moved.
        let mut q = queue(true, [127, 0, 0, 1], &[(ACK, 0x40, 20), (SEND, 0x40, 28), (ACK, 0x40, 20)]);
        q.pair_answers();
        assert_eq!(order(&q), [(SEND, b'b', 28), (ACK, b'a', 20), (ACK, b'c', 20)]);
        assert_eq!(q.meta.iter().map(|m| m.0).collect::<Vec<_>>(), [0, 28, 48], "still back to back");
        // Then they form one GSO run: the request full, the ACK the shorter last segment.
        let units = q.gso_runs();
        assert_eq!(units[0], (0, 2, 28));

        // A peer on another host too: its receiver recovers the segment's identification.
        let mut q = queue(true, [192, 0, 2, 9], &[(ACK, 0x40, 20), (SEND, 0x40, 28)]);
        q.pair_answers();
        assert_eq!(order(&q), [(SEND, b'b', 28), (ACK, b'a', 20)]);
        assert_eq!(q.gso_runs()[0], (0, 2, 28));

        // Left alone: another QP, a response longer than the request, no GSO, and an ACK
        // after another response of its QP (paired, it would leave before it).
        const READ_RESP: u8 = 0x10;
        let mut q = queue(true, [127, 0, 0, 1], &[(READ_RESP, 0x40, 84), (ACK, 0x40, 20), (SEND, 0x40, 200)]);
        let before = order(&q);
        q.pair_answers();
        assert_eq!(order(&q), before, "the READ response stays ahead of the later ACK");
        for (gso, dst, packets) in [
            (true, [127, 0, 0, 1], [(ACK, 0x40, 20), (SEND, 0x41, 28)]),
            (true, [127, 0, 0, 1], [(ACK, 0x40, 40), (SEND, 0x40, 28)]),
            (false, [127, 0, 0, 1], [(ACK, 0x40, 20), (SEND, 0x40, 28)]),
        ] {
            let mut q = queue(gso, dst, &packets);
            let before = order(&q);
            q.pair_answers();
            assert_eq!(order(&q), before, "{gso} {dst:?} {packets:?}");
        }
    }

    #[test]
    fn packets_of_two_qps_of_one_process_form_one_gso_run() {
        const WRITE: u8 = 0x0a; // RC RDMA WRITE ONLY
        const READ_RESP: u8 = 0x10;
        // QPs 0x4000 and 0x4100 lie in one slot (one process); 0x6000 in another.
        let q = |packets: &[(u8, u8, usize)]| queue(true, [127, 0, 0, 1], packets).gso_runs();
        // The engine's turn-taking: one packet of each QP in turn, all one run.
        let units = q(&[(WRITE, 0x40, 100), (WRITE, 0x41, 100), (WRITE, 0x40, 100), (WRITE, 0x41, 60)]);
        assert_eq!(units[..2], [(0, 4, 100), (0, 0, 0)]);
        // Another process's QP, or a response among requests: a new unit.
        let units = q(&[(WRITE, 0x40, 100), (WRITE, 0x60, 100), (WRITE, 0x40, 100)]);
        assert_eq!(units[..3], [(0, 1, 0), (1, 1, 0), (2, 1, 0)]);
        let units = q(&[(WRITE, 0x40, 100), (READ_RESP, 0x41, 100), (WRITE, 0x40, 100)]);
        assert_eq!(units[..3], [(0, 1, 0), (1, 1, 0), (2, 1, 0)]);
    }

    /// A pass takes about `RX_PASS_BYTES` from the sockets once it has seen trains of 64 KiB
    /// (and then answers what it took), but small datagrams still 32 to a receive.
    #[test]
    fn a_pass_takes_about_its_fill_of_trains_and_small_datagrams_by_the_batch() {
        use softrdma_udp::{Config, Outgoing, RoceSocket};
        let (_ctx, shared) = lo_context(56_000 + (std::process::id() % 4000) as u16);
        // Held throughout: the progress thread receives nothing meanwhile.
        let mut st = shared.lock();
        let to = ipv4_socket_addr(&shared);
        let tx = RoceSocket::bind_with(to.ip(), &Config { port: 0, ..Config::default() }).unwrap();
        let envelope = tx.envelope_to(to).unwrap();
        let queued = |st: &super::State| st.rx_batches;
        let settle = || std::thread::sleep(Duration::from_millis(30));

        // 64 small datagrams: two receives of 32, the budget far off.
        let small = vec![0u8; 100];
        let out: Vec<Outgoing<'_>> = (0..64).map(|_| Outgoing::new(envelope, &small)).collect();
        assert_eq!(tx.send_batch(&out).unwrap(), 64);
        settle();
        let before = queued(&st);
        st.receive(&shared, shared.now(), true, false);
        assert_eq!(queued(&st) - before, 2, "64 small datagrams in two receives of 32");
        assert_eq!(st.rx_longest, 100, "the longest of late");

        // Trains of 14 segments of 4 112 bytes (57 568, a 64 KiB WRITE's bulk).
        let train = vec![0u8; 14 * 4112];
        let gso = Outgoing { segment_size: Some(4112), ..Outgoing::new(envelope, &train) };
        if let Err(e) = tx.send_batch(&[gso]) {
            eprintln!("skipped: the kernel refuses UDP GSO here ({e})");
            return;
        }
        settle();
        st.receive(&shared, shared.now(), true, false);
        assert_eq!(st.rx_longest, train.len(), "GRO kept the train whole, and the longest of late is it");
        // Eight trains (460 KiB): the next pass takes four (230 KiB), the one after the rest.
        let out: Vec<Outgoing<'_>> = (0..8).map(|_| gso).collect();
        assert_eq!(tx.send_batch(&out).unwrap(), 8);
        settle();
        let before = queued(&st);
        st.receive(&shared, shared.now(), true, false);
        assert_eq!((queued(&st) - before, st.rx.len()), (1, 4), "one receive of four trains");
        st.receive(&shared, shared.now(), true, false);
        assert_eq!(st.rx.len(), 4, "the next pass took the other four");
    }

    /// An application thread that polls the same-host inbox while every socket is idle
    /// leaves the sockets to the progress thread, which watches them in its sleep and says
    /// when one is readable: the application's next pass then takes the datagram, though
    /// no sweep of the idle sockets is due. Without the word it does not ask them.
    #[test]
    fn a_polling_application_is_told_of_a_datagram_on_an_idle_socket() {
        use softrdma_udp::{Config, Outgoing, RoceSocket};
        let (_ctx, shared) = lo_context(52_000 + (std::process::id() % 4000) as u16);
        // The application polls (so the progress thread leaves receiving to it), the inbox
        // had a packet just now, every socket is idle and was asked just now.
        let polls = || shared.app_polled.store(shared.now().as_nanos().max(1), Ordering::Relaxed);
        let to = ipv4_socket_addr(&shared);
        let tx = RoceSocket::bind_with(to.ip(), &Config { port: 0, ..Config::default() }).unwrap();
        let envelope = tx.envelope_to(to).unwrap();
        let (mut now, mut before) = (shared.now(), 0);
        let mut told = false;
        for _ in 0..20 {
            polls();
            now = shared.now();
            before = {
                let mut st = shared.lock();
                st.inbox_last = Some(now);
                st.rx_empty.iter_mut().for_each(|e| *e = super::IDLE_SOCKET_AFTER);
                st.idle_asked = now;
                st.receive(&shared, now, true, false);
                st.rx_batches
            };
            assert!(shared.sockets_idle.load(Ordering::SeqCst), "the idle sockets are left to the progress thread");
            let taken_by_thread = shared.thread_receives.load(Ordering::Relaxed);
            assert_eq!(tx.send_batch(&[Outgoing::new(envelope, &[0u8; 100])]).unwrap(), 1);
            // The progress thread says so (the application polling all along).
            let start = std::time::Instant::now();
            while !told && shared.thread_receives.load(Ordering::Relaxed) == taken_by_thread {
                assert!(start.elapsed() < Duration::from_secs(10), "the progress thread never told of the datagram");
                polls();
                std::thread::sleep(Duration::from_micros(100));
                told = shared.sockets_news.load(Ordering::Acquire);
            }
            if told {
                break;
            }
            // This thread stalled past APP_POLL_WINDOW (a loaded machine), so the progress
            // thread took it for one that no longer polls and received the datagram itself.
        }
        assert!(told, "the progress thread told of a datagram in one of 20 tries");
        let mut st = shared.lock();
        // A pass at the same instant (no sweep due) asks the sockets, told so, and takes it.
        st.receive(&shared, now, true, false);
        assert_eq!(st.rx_batches, before + 1, "the datagram taken on the pass after the word");
        // (The word may be set again meanwhile: the progress thread, seeing it taken, may
        // watch the socket before that pass's `recvmmsg` empties it. A word left so costs
        // one early sweep.)
        // Nothing told, nothing asked: a second datagram waits for the word or the sweep.
        assert_eq!(tx.send_batch(&[Outgoing::new(envelope, &[0u8; 100])]).unwrap(), 1);
        std::thread::sleep(Duration::from_millis(30));
        shared.sockets_news.store(false, Ordering::Release);
        st.rx_empty.iter_mut().for_each(|e| *e = super::IDLE_SOCKET_AFTER);
        st.receive(&shared, now, true, false);
        assert_eq!(st.rx_batches, before + 1, "idle sockets not asked without the word");
        st.receive(&shared, now + super::WATCHED_SOCKET_INTERVAL, true, false);
        assert_eq!(st.rx_batches, before + 2, "the sweep under the watch takes it");
    }

    /// A device on 127.0.0.1 opened on `port`, and its driver's shared state.
    fn lo_context(port: u16) -> (crate::Context, std::sync::Arc<super::Shared>) {
        let device = Device::with_addresses("lo", vec![std::net::IpAddr::from([127, 0, 0, 1])]);
        let ctx = device.open_with(&ContextOptions { port, ..ContextOptions::default() }).unwrap();
        let shared = std::sync::Arc::clone(&ctx.drv.shared);
        (ctx, shared)
    }

    /// The address the device's IPv4 socket is bound to.
    fn ipv4_socket_addr(shared: &super::Shared) -> std::net::SocketAddr {
        let socket = shared.port.sockets().iter().find(|s| s.local_addr().is_ipv4()).expect("an IPv4 socket");
        socket.local_addr()
    }

    /// A thread blocked on a completion channel receives the device's datagrams itself;
    /// meanwhile the progress thread keeps off the sockets (both waking for every datagram
    /// would fight over the lock).
    #[test]
    fn a_thread_waiting_on_a_channel_keeps_the_progress_thread_off_the_sockets() {
        let port = 60_000 + (std::process::id() % 4000) as u16;
        let open = || {
            let device = Device::with_addresses("lo", vec![std::net::IpAddr::from([127, 0, 0, 1])]);
            device.open_with(&ContextOptions { port, ..ContextOptions::default() }).unwrap()
        };
        let (a, b) = (open(), open());
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let channel = b.create_comp_channel().unwrap();
        let (cqa, cqb) = (a.create_cq(64, None).unwrap(), b.create_cq(64, Some(&channel)).unwrap());
        let qpa = pa.create_qp(&QpInit::new(QpType::Rc, &cqa)).unwrap();
        let qpb = pb.create_qp(&QpInit::new(QpType::Rc, &cqb)).unwrap();
        let (ma, mb) = (pa.reg_mr(64 * 1024, Access::ALL).unwrap(), pb.reg_mr(64 * 1024, Access::ALL).unwrap());
        let opts = ConnectOptions { timeout: 10, ..ConnectOptions::default() };
        qpa.connect(1, &qpb.endpoint(0, 2).unwrap(), &opts).unwrap();
        qpb.connect(2, &qpa.endpoint(0, 1).unwrap(), &opts).unwrap();
        let rsge = [mb.sge(0..8).unwrap()];
        qpb.post_recv(&[RecvWr { wr_id: 1, sg_list: &rsge }]).unwrap();
        cqb.req_notify(false).unwrap();

        let shared = std::sync::Arc::clone(&b.drv.shared);
        let waiter = std::thread::spawn(move || channel.get_cq_event(Some(Duration::from_secs(20))).unwrap().is_some());
        // Until the thread waits, and the progress thread has let go of the sockets (or 2 s).
        let start = std::time::Instant::now();
        while shared.app_waiting.load(Ordering::SeqCst) == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "the thread never waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        while shared.watching.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let before = shared.thread_receives.load(Ordering::Relaxed);
        let target = mb.remote(0..64 * 1024).unwrap();
        let sge = [ma.sge(0..64 * 1024).unwrap()];
        for i in 0..20 {
            let op = SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey };
            qpa.post_send(&[SendWr {
                wr_id: i,
                op,
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
                ud: None,
                xrc_srqn: None,
            }])
            .unwrap();
            assert_eq!(cqa.wait(Duration::from_secs(10)).unwrap().status, WcStatus::Success);
        }
        let during = shared.thread_receives.load(Ordering::Relaxed) - before;
        let op = SendOp::RdmaWriteWithImm { remote_addr: target.addr, rkey: target.rkey, imm: [0; 4] };
        qpa.post_send(&[SendWr {
            wr_id: 99,
            op,
            sg_list: &sge[..0],
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: None,
        }])
        .unwrap();
        assert!(waiter.join().unwrap(), "the WRITE with immediate fires the channel");
        assert_eq!(during, 0, "receive batches the progress thread took while a thread waited on the channel");
    }
}
