//! Many processes, one host: every process that uses a RoCEv2 device (an interface and its
//! addresses) binds its own UDP socket on each `address:4791` with `SO_REUSEPORT`, and a
//! classic-BPF program on the reuseport group makes the kernel deliver each datagram
//! straight to the process that owns its destination.
//!
//! - Each [`Member`] owns a **slot** `s` in `1..`[`MAX_SLOTS`]: the QPNs
//!   `s << 13 .. (s + 1) << 13` ([`Member::qpn_range`]) and the CM comm IDs and SIDR request
//!   IDs `s << 21 | counter` ([`Member::comm_id_prefix`]).
//! - The program steers by destination QPN (slot = QPN >> 13); CM MADs to QP1 by service ID
//!   (REQ, SIDR_REQ: to the member that [`listen`](Member::listen)s), by request ID
//!   (SIDR_REP) or by remote comm ID (every other CM message). Anything it cannot place
//!   goes to the kernel's hash, and the member that gets it drops it.
//! - The members of a device elect a **coordinator** through an abstract Unix socket name
//!   (per network namespace). It holds a duplicate of every member's sockets, and gives
//!   a few members (*holders*) copies of all of them, so the order of a group changes only
//!   when it closes one, even when its process dies; after each change it learns each socket's
//!   index by sending **probes** (datagrams with a magic no BTH has, routed by the index
//!   they carry: a group gets a program with that rule before its first probe) which
//!   members report back, then installs the new program once every index is placed on a
//!   distinct member. When it dies, the members race for the name and re-register with
//!   the winner.
//!
//! The data sockets ([`Member::sockets`]) belong to the caller's progress loop, which must
//! pass datagrams for which [`Member::is_probe`] holds to [`Member::answer_probe`] (cheap,
//! never blocks); until it does, membership changes are not steered. Everything else runs
//! in one background thread per member that sleeps in `poll` when nothing changes.
//!
//! See docs/architecture.md, "Many processes, one host", for the design and its limits.

mod coord;
mod proto;
mod refound;
mod steer;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::BuildHasher;
use std::io;
use std::net::IpAddr;
use std::ops::Range;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use crate::fork::ParentOnly;
use crate::{Config, ROCEV2_PORT, RecvBatch, RoceSocket};
use proto::{Envelope, Speaks, ToCoord, ToMember};

/// QPN bits below the slot: a slot owns `1 << 13` QPNs.
pub const QPN_SLOT_BITS: u32 = 13;
/// Comm ID / SIDR request ID bits below the slot.
pub const COMM_ID_COUNTER_BITS: u32 = 21;
/// Slots are `1..MAX_SLOTS` (2047 members per device at most; the steering program's size
/// limits it further, see [`Member::listen`]).
pub const MAX_SLOTS: u32 = 2048;

/// How long [`Member::join`], [`Member::listen`] and [`Member::unlisten`] wait.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a joining member waits for the coordinator to answer its hello (it answers at
/// once, or after the failover grace period of 300 ms) before it gives up and names it.
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// How long it waits before it looks whether an unanswering coordinator is stopped.
const STOPPED_AFTER: Duration = Duration::from_millis(100);
/// How long a guest finds no coordinator of the group's user before it takes their
/// processes for gone and founds the group again with the other guests ([`refound`]).
/// Short: from the death of the last process of the group's user, the kernel has moved
/// sockets into the closed ones' places (no holder of theirs is left), so the guests are
/// misrouted until the new group is steered; a guess too early costs nothing (the other
/// processes of that user hold sockets on the port, and the leader calls it off).
const ORPHANED_AFTER: Duration = Duration::from_millis(50);
/// How long one coordinator must keep hanging up on every hello this member can say before
/// the member takes it for a build of an older host protocol: a coordinator of this one
/// hangs up unanswered only while its process ends: the kernel closes an ending process's
/// descriptors in their numeric order, so accepted connections can close before the
/// listener, and the process is no zombie yet. That takes milliseconds.
const OLDER_AFTER: Duration = Duration::from_millis(300);

/// The host protocol this build speaks: members of builds that speak another (and no
/// version in common) cannot share a port; a join fails at once and says which process
/// speaks which. See docs/architecture.md, "Versions".
pub const PROTOCOL_VERSION: u32 = proto::VERSION;

/// Which device to join and how to set up its sockets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// The device (network interface) name: members of the same device, port and user
    /// share the sockets' groups and elect one coordinator.
    pub device: String,
    /// The UDP port, [`ROCEV2_PORT`] by default. Not 0: the group is one port.
    pub port: u16,
    /// Socket options; its `port` is ignored and `reuse_port` forced on.
    pub socket: Config,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self { device: "lo".into(), port: ROCEV2_PORT, socket: Config { reuse_port: true, ..Config::default() } }
    }
}

#[derive(Default)]
struct State {
    steered: bool,
    error: Option<(io::ErrorKind, String)>,
    listeners: BTreeSet<u64>,
    queue: VecDeque<ToCoord>,
    in_flight: HashMap<u64, ToCoord>,
    results: HashMap<u64, i32>,
    next_id: u64,
    stop: bool,
}

struct Shared {
    /// Declared before `conn`, so dropped first: when a member goes, its sockets close
    /// while the coordinator still counts them as its own (it keeps them in place as
    /// tombstones when the connection hangs up).
    sockets: Vec<RoceSocket>,
    /// The addresses of `sockets`, and how they are set up: a group founded again binds
    /// them anew ([`refound`]).
    addresses: Vec<IpAddr>,
    socket_config: Config,
    /// The coordinator's name (its user's): this process's own user's, or the group's
    /// user's for a guest.
    name: Mutex<Vec<u8>>,
    device: String,
    port: u16,
    /// The versions this member speaks.
    speaks: Speaks,
    /// The connection to the coordinator, for [`Member::answer_probe`].
    conn: Mutex<Option<Arc<ParentOnly>>>,
    state: Mutex<State>,
    cond: Condvar,
    wake_tx: UnixDatagram,
    wake_rx: UnixDatagram,
    slot: AtomicU32,
    coordinator: AtomicBool,
    /// The process of the coordinator this member is connected to (0: none yet, or one in
    /// a PID namespace this process cannot see).
    coordinator_pid: AtomicU32,
    /// Datagrams the background thread read and dropped while joining.
    dropped: AtomicU64,
    /// The user whose processes own the port's groups, when that is another user than this
    /// process's: this member is their coordinator's *guest* (its sockets were made by
    /// it), and never coordinates.
    guest_of: Mutex<Option<u32>>,
    /// A guest's first connection to the coordinator, on which it got its sockets: its
    /// hello goes there (the coordinator holds the slot for that connection).
    bootstrap: Mutex<Option<ParentOnly>>,
    /// Sockets the coordinator gave this member to hold ([`ToMember::Hold`]), so that
    /// the death of its process moves no socket in a group; handed to the next
    /// coordinator, and held until it sends the set to hold instead.
    held: Mutex<Held>,
    /// Called once this member's sockets were put in new ones' places ([`refound`]).
    replaced: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

/// The sockets a member holds for the coordinator ([`ToMember::Hold`]).
#[derive(Default)]
struct Held {
    set: Vec<ParentOnly>,
    /// The records of the generation being received.
    pending: Vec<ParentOnly>,
    generation: u64,
}

impl Shared {
    /// "device lo port 4791", for messages.
    fn port_name(&self) -> String {
        format!("device {} port {}", self.device, self.port)
    }
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn name(&self) -> Vec<u8> {
        self.name.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn guest_of(&self) -> Option<u32> {
        *self.guest_of.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// This member is now `owner`'s guest (`None`: a member of its own user's group).
    fn set_owner(&self, owner: Option<u32>) {
        let uid = owner.unwrap_or_else(|| rustix::process::getuid().as_raw());
        *self.name.lock().unwrap_or_else(|e| e.into_inner()) = coordinator_name(uid, &self.device, self.port);
        *self.guest_of.lock().unwrap_or_else(|e| e.into_inner()) = owner;
    }
    fn wake(&self) {
        let _ = self.wake_tx.send(&[0]);
    }
    /// The inodes of this member's sockets.
    fn inodes(&self) -> Vec<Ino> {
        self.sockets.iter().filter_map(|s| inode(s.as_fd())).collect()
    }
    /// Tells the runtime that the sockets were replaced ([`Member::on_sockets_replaced`]).
    fn sockets_replaced(&self) {
        let wake = self.replaced.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(wake) = wake {
            wake();
        }
    }
}

/// One process's membership of a device. See the [module documentation](self).
pub struct Member {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("slot", &self.slot()).field("coordinator", &self.is_coordinator()).finish()
    }
}

/// A random 64-bit value (nonces): the standard library's per-process random keys,
/// hashed with a counter.
pub(crate) fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

impl Member {
    /// Binds `addresses` (each `address:port` with `SO_REUSEPORT`), registers with the
    /// device's coordinator (becoming it if there is none) and returns once this member's
    /// slot is steered to its sockets; `TimedOut` after 5 s, or after 1 s when the
    /// coordinator does not answer (at once when it is stopped); `ConnectionRefused` at
    /// once when the coordinator is a process of a softrdma build that speaks another
    /// [host protocol](PROTOCOL_VERSION). Each error names the coordinator's process.
    pub fn join(addresses: &[IpAddr], config: &HostConfig) -> io::Result<Member> {
        Self::join_as(addresses, config, PROTOCOL_VERSION)
    }

    /// [`join`](Self::join) as a process of host protocol `version` would, for tests of
    /// processes of other builds beside this one: 2 is a build from before versions (its
    /// hello in protocol 2's layout; as coordinator it hangs up on a versioned one), any
    /// other a build that speaks that version only.
    #[doc(hidden)]
    pub fn join_as(addresses: &[IpAddr], config: &HostConfig, version: u32) -> io::Result<Member> {
        if addresses.is_empty() || addresses.len() > proto::MAX_FDS {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "1 to 16 addresses"));
        }
        if addresses.iter().enumerate().any(|(i, a)| addresses[..i].contains(a)) {
            // Two sockets of one member in a group would be two indices for one slot.
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an address given twice"));
        }
        if config.port == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "port 0 makes no group"));
        }
        let socket_config = Config { port: config.port, reuse_port: true, ..config.socket.clone() };
        let uid = rustix::process::getuid().as_raw();
        let port_name = format!("device {} port {}", config.device, config.port);
        let (sockets, guest_of, bootstrap, slot) = take_port(addresses, &config.device, &socket_config, &port_name)?;
        let name = coordinator_name(guest_of.unwrap_or(uid), &config.device, config.port);
        let (wake_tx, wake_rx) = UnixDatagram::pair()?;
        wake_rx.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            sockets,
            addresses: addresses.to_vec(),
            socket_config,
            name: Mutex::new(name),
            device: config.device.clone(),
            port: config.port,
            speaks: Speaks(version),
            conn: Mutex::new(None),
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
            wake_tx,
            wake_rx,
            slot: AtomicU32::new(slot),
            guest_of: Mutex::new(guest_of),
            bootstrap: Mutex::new(bootstrap),
            coordinator: AtomicBool::new(false),
            coordinator_pid: AtomicU32::new(0),
            dropped: AtomicU64::new(0),
            held: Mutex::new(Held::default()),
            replaced: Mutex::new(None),
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new().name("softrdma-host".into()).spawn(move || run(&shared))?
        };
        let member = Member { shared, thread: Some(thread) };
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut state = member.shared.state();
        loop {
            if let Some((kind, msg)) = &state.error {
                tracing::warn!(target: "softrdma::host", "joining {}: {msg}", member.shared.port_name());
                return Err(io::Error::new(*kind, msg.clone()));
            }
            if state.steered {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let coordinator = member.shared.coordinator_pid.load(Ordering::Relaxed);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "not steered within 5 s: the coordinator of {} ({}) registered this process but its \
                         probes did not reach its sockets (they count every socket of its user on the port, \
                         registered or not); `ss -uapn 'sport = :{}'` lists the processes on the port",
                        member.shared.port_name(),
                        process(coordinator),
                        member.shared.port,
                    ),
                ));
            }
            state = member.shared.cond.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        drop(state);
        let coordinator = member.shared.coordinator_pid.load(Ordering::Relaxed);
        tracing::info!(
            target: "softrdma::host",
            slot = member.slot(),
            "joined {} as slot {}; coordinator {}",
            member.shared.port_name(),
            member.slot(),
            process(coordinator),
        );
        Ok(member)
    }

    /// This member's slot, in `1..MAX_SLOTS`.
    pub fn slot(&self) -> u32 {
        self.shared.slot.load(Ordering::Relaxed)
    }

    /// The QPNs steered to this member: `slot << 13 .. (slot + 1) << 13`.
    pub fn qpn_range(&self) -> Range<u32> {
        self.slot() << QPN_SLOT_BITS..(self.slot() + 1) << QPN_SLOT_BITS
    }

    /// The high bits of this member's CM comm IDs and SIDR request IDs: use
    /// `comm_id_prefix() | counter` with a counter below `1 << 21`.
    pub fn comm_id_prefix(&self) -> u32 {
        self.slot() << COMM_ID_COUNTER_BITS
    }

    /// The data sockets, in the order of the `addresses` given to [`join`](Self::join).
    pub fn sockets(&self) -> &[RoceSocket] {
        &self.shared.sockets
    }

    fn request(&self, make: impl FnOnce(u64) -> ToCoord) -> io::Result<()> {
        let mut state = self.shared.state();
        let id = state.next_id;
        state.next_id += 1;
        state.queue.push_back(make(id));
        self.shared.wake();
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if let Some(errno) = state.results.remove(&id) {
                return if errno == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(errno)) };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the coordinator did not answer within 5 s"));
            }
            state = self.shared.cond.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Steers CM REQs and SIDR_REQs for `service_id` to this member; returns once the
    /// program doing so is installed. `AddrInUse` when another live member listens to it;
    /// `StorageFull`-like `ENOSPC` when the program would pass the kernel's 4096
    /// instructions (about 33 + 2 per member + 5 per listened service).
    pub fn listen(&self, service_id: u64) -> io::Result<()> {
        self.request(|id| ToCoord::Listen { id, service: service_id })
    }

    /// Stops steering `service_id` here.
    pub fn unlisten(&self, service_id: u64) -> io::Result<()> {
        self.shared.state().listeners.remove(&service_id);
        self.request(|id| ToCoord::Unlisten { id, service: service_id })
    }

    /// Has `wake` called whenever this member's sockets are put in new ones' places,
    /// behind the same descriptors (the group founded again when its user's processes are
    /// gone, [`refound`]). A thread asleep in `poll` on them since before then returns only
    /// when something it polled from the start wakes it with one of them readable: `poll`
    /// looks at a woken descriptor's current socket, but waits only on the ones it first
    /// found (measured on 6.18: a datagram to the new socket wakes nobody). `wake` should
    /// ring something such a thread polls, as a runtime's doorbell.
    pub fn on_sockets_replaced(&self, wake: impl Fn() + Send + Sync + 'static) {
        *self.shared.replaced.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(wake));
    }

    /// Whether a datagram is a coordinator's probe (to pass to
    /// [`answer_probe`](Self::answer_probe), not to the protocol engine).
    pub fn is_probe(payload: &[u8]) -> bool {
        steer::parse_probe(payload).is_some()
    }

    /// Reports a probe to the coordinator. Cheap and non-blocking: one `send` on a Unix
    /// socket, dropped if the coordinator is away (it probes again).
    pub fn answer_probe(&self, payload: &[u8]) {
        let Some((index, nonce)) = steer::parse_probe(payload) else { return };
        let conn = self.shared.conn.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(conn) = conn {
            let _ = proto::send(&*conn, &ToCoord::ProbeAnswer { index, nonce }.encode(), &[]);
        }
    }

    /// Whether this member's background thread is the device's coordinator.
    pub fn is_coordinator(&self) -> bool {
        self.shared.coordinator.load(Ordering::Relaxed)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        tracing::debug!(target: "softrdma::host", "slot {} leaves {}", self.slot(), self.shared.port_name());
        self.shared.state().stop = true;
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The connection to the coordinator: a child of `fork` must not hold it, or the
/// coordinator would not see this member leave.
fn connect(name: &[u8]) -> io::Result<ParentOnly> {
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    rustix::net::connect(&fd, &SocketAddrUnix::new_abstract_name(name)?)?;
    Ok(ParentOnly::new(fd))
}

fn fail(shared: &Shared, kind: io::ErrorKind, msg: String) {
    shared.state().error = Some((kind, msg));
    shared.cond.notify_all();
}

/// Registers on a fresh connection: the sockets, the slot held (0 at first) and the
/// listeners, with the sockets a previous coordinator gave this member to hold, which the
/// new coordinator adopts (this member holds them too until the new coordinator says what
/// to hold: if the new one dies at once as well, they still stay in their groups); then
/// the requests that were not answered.
///
/// In `layout`: a [`Join`](ToCoord::Join) of this member's version, or protocol 2's
/// [`Hello`](ToCoord::Hello) (to a coordinator that hung up on a `Join`).
fn hello(shared: &Shared, conn: &ParentOnly, layout: Layout) -> io::Result<()> {
    let listeners: Vec<u64> = shared.state().listeners.iter().copied().collect();
    let mut held = shared.held.lock().unwrap_or_else(|e| e.into_inner());
    let (slot, sockets) = (shared.slot.load(Ordering::Relaxed), shared.sockets.len() as u32);
    let m = match (layout, shared.speaks.join_version()) {
        (Layout::Join, Some(version)) => ToCoord::join(Envelope::me(version), slot, sockets, &listeners),
        _ => ToCoord::Hello { pid: std::process::id(), slot, sockets, listeners },
    };
    // A set the previous coordinator was sending is incomplete: the current one stands.
    held.pending.clear();
    // What it holds goes along as far as it fits (as the version before holders did, so
    // that a coordinator of that version adopts them too); the rest follows.
    let fit = proto::MAX_FDS - shared.sockets.len();
    let (first, rest) = held.set.split_at(fit.min(held.set.len()));
    let fds: Vec<BorrowedFd<'_>> =
        shared.sockets.iter().map(|s| s.as_fd()).chain(first.iter().map(|k| k.as_fd())).collect();
    proto::send(conn, &m.encode(), &fds)?;
    for chunk in rest.chunks(proto::MAX_FDS) {
        let fds: Vec<BorrowedFd<'_>> = chunk.iter().map(|k| k.as_fd()).collect();
        // Failing (a full queue) leaves them with this member only, for now.
        let _ = proto::send(conn, &ToCoord::Adopt.encode(), &fds);
    }
    drop(held);
    let mut state = shared.state();
    let resend: Vec<ToCoord> = state.in_flight.drain().map(|(_, m)| m).collect();
    for m in resend.into_iter().rev() {
        state.queue.push_front(m);
    }
    Ok(())
}

/// The background thread: election, registration, requests, and the coordinator's work
/// when this member holds the name.
fn run(shared: &Shared) {
    let mut server: Option<coord::Server> = None;
    let mut conn: Option<Arc<ParentOnly>> = None;
    let mut link: Option<Link> = None;
    // The coordinator that hung up on this member's hello without answering it, that
    // hello's layout, and when it first hung up: a coordinator of protocol 1 or 2 (which
    // cannot decode a `Join`), or one whose process is ending.
    let mut hung_up: Option<(u32, Layout, Instant)> = None;
    let mut failover = false;
    // Since when a guest has found no coordinator of the group's user.
    let mut orphaned: Option<Instant> = None;
    // The slots of the guests that founded the group again with this member as leader.
    let mut reserved: Vec<u32> = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut batch = RecvBatch::new(8, 2048);
    loop {
        if shared.state().stop {
            break;
        }
        if conn.is_none() {
            // A guest never coordinates: the groups are another user's, whose sockets it
            // cannot make (and must not hold).
            if server.is_none() && shared.guest_of().is_none() {
                // Sockets of this user on the port that are not this member's: a group its
                // user's last process left with guests in it, who re-register as after a
                // failover (within milliseconds, once a coordinator answers). Fresh members
                // wait for them as after a failover too, if not as long: steered first,
                // this member's own slot alone would send their datagrams to it until they
                // had.
                let grace = if failover {
                    Some(coord::FAILOVER_GRACE)
                } else {
                    others_of_my_user(shared).then_some(coord::INHERITED_GRACE)
                };
                match coord::Server::bind(&shared.name(), shared.port, grace, shared.speaks) {
                    Ok(Some(mut s)) => {
                        s.reserve(std::mem::take(&mut reserved));
                        server = Some(s);
                        shared.coordinator.store(true, Ordering::Relaxed);
                    }
                    Ok(None) => {}
                    Err(e) => return fail(shared, e.kind(), format!("coordinator socket: {e}")),
                }
            }
            let bootstrap = shared.bootstrap.lock().unwrap_or_else(|e| e.into_inner()).take();
            let c = match bootstrap.map_or_else(|| connect(&shared.name()), Ok) {
                Ok(c) => {
                    orphaned = None;
                    c
                }
                Err(_) if shared.guest_of().is_some() && orphaned.is_some_and(|t| t.elapsed() >= ORPHANED_AFTER) => {
                    // Nobody of the group's user coordinates it (a failover among them
                    // takes milliseconds): its processes are gone, and no other user's can
                    // join it. The guests found it again, among themselves.
                    match refound::refound(shared) {
                        Ok(slots) => {
                            // Not a failover: the members of the new group re-claim their
                            // slots at once, and fresh ones cannot take them (reserved),
                            // so its first round need not wait for a grace period, while
                            // everybody's datagrams are steered nowhere.
                            orphaned = None;
                            reserved = slots;
                        }
                        Err(e) => {
                            tracing::debug!(target: "softrdma::host", "founding {} again: {e}", shared.port_name());
                            // Again soon, at a random moment: guests whose tries alternate
                            // (each leading alone) drift into one another's window.
                            let retry = Duration::from_millis(50 + random_u64() % 450);
                            orphaned = Instant::now().checked_sub(ORPHANED_AFTER).map(|t| t + retry);
                        }
                    }
                    continue;
                }
                Err(_) if server.is_none() => {
                    // The name's holder is not listening yet, or just died: try again.
                    orphaned.get_or_insert_with(Instant::now);
                    std::thread::sleep(Duration::from_millis(5 + random_u64() % 20));
                    continue;
                }
                Err(e) => return fail(shared, e.kind(), format!("connecting to our own coordinator: {e}")),
            };
            let (coordinator, coordinator_uid) = crate::sys::peer_cred(c.as_fd()).unwrap_or((0, u32::MAX));
            let owner = shared.guest_of().unwrap_or_else(|| rustix::process::getuid().as_raw());
            if coordinator_uid != owner {
                // Anyone can bind an abstract name: a process of another user holds the
                // one of this user's coordinator. This member's sockets (and the ones it
                // holds) must not go there.
                let msg = impostor(shared, coordinator, coordinator_uid, owner);
                if !shared.state().steered {
                    return fail(shared, io::ErrorKind::PermissionDenied, msg);
                }
                tracing::warn!(target: "softrdma::host", "{msg}");
                std::thread::sleep(Duration::from_millis(100 + random_u64() % 100));
                continue;
            }
            shared.coordinator_pid.store(coordinator, Ordering::Relaxed);
            // The same process hung up on the last hello, alive (it still holds the name):
            // it does not speak that layout.
            let layout = match hung_up {
                Some((pid, ..)) if pid == coordinator && process_gone(pid) => {
                    // It hung up because it is going: its name will be free in a moment.
                    hung_up = None;
                    std::thread::sleep(Duration::from_millis(5 + random_u64() % 20));
                    continue;
                }
                Some((pid, Layout::Join, _)) if pid == coordinator && shared.speaks.legacy() => Layout::Legacy,
                Some((pid, layout, since)) if pid == coordinator && since.elapsed() >= OLDER_AFTER => {
                    return fail(shared, io::ErrorKind::ConnectionRefused, hung_up_on(shared, pid, layout));
                }
                Some((pid, ..)) if pid == coordinator => {
                    // Every layout met a hang-up, but not for long: an ending process's
                    // coordinator does that too. Say hello again from the start.
                    std::thread::sleep(Duration::from_millis(5 + random_u64() % 20));
                    if shared.speaks.join_version().is_some() { Layout::Join } else { Layout::Legacy }
                }
                _ if shared.speaks.join_version().is_some() => Layout::Join,
                _ => Layout::Legacy,
            };
            match hello(shared, &c, layout) {
                Ok(()) => {
                    let c = Arc::new(c);
                    *shared.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
                    conn = Some(c);
                    link = Some(Link { coordinator, layout, since: Instant::now(), welcomed: false });
                }
                Err(_) if server.is_none() => {
                    std::thread::sleep(Duration::from_millis(5 + random_u64() % 20));
                    continue;
                }
                Err(e) => return fail(shared, e.kind(), format!("registering with our own coordinator: {e}")),
            }
        }
        let Some(c) = conn.clone() else { continue };
        // A coordinator that does not answer a joining member's hello (stopped, or stuck)
        // holds the name, so no other process can coordinate: say so instead of waiting.
        if let Some(l) = link.as_ref().filter(|l| !l.welcomed && !shared.state().steered) {
            let waited = l.since.elapsed();
            let stopped = waited >= STOPPED_AFTER && process_stopped(l.coordinator);
            if stopped || waited >= HELLO_TIMEOUT {
                return fail(shared, io::ErrorKind::TimedOut, unanswered(shared, l.coordinator, waited, stopped));
            }
        }
        // Requests from the API.
        {
            let mut state = shared.state();
            while let Some(m) = state.queue.pop_front() {
                let id = match &m {
                    ToCoord::Listen { id, .. } | ToCoord::Unlisten { id, .. } => *id,
                    _ => continue,
                };
                let _ = proto::send(&*c, &m.encode(), &[]);
                state.in_flight.insert(id, m);
            }
        }
        let joining = !shared.state().steered;
        let server_fds = server.as_ref().map(|s| s.fds()).unwrap_or_default();
        let mut fds: Vec<PollFd<'_>> = Vec::new();
        fds.push(PollFd::new(&shared.wake_rx, PollFlags::IN));
        fds.push(PollFd::new(&*c, PollFlags::IN));
        let data = if joining { shared.sockets.len() } else { 0 };
        for s in &shared.sockets[..data] {
            fds.push(PollFd::from_borrowed_fd(s.as_fd(), PollFlags::IN));
        }
        for fd in &server_fds {
            fds.push(PollFd::from_borrowed_fd(*fd, PollFlags::IN));
        }
        let mut timeout = server
            .as_ref()
            .and_then(|s| s.deadline())
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(1));
        if link.as_ref().is_some_and(|l| !l.welcomed) {
            // Look again soon whether the coordinator answers.
            timeout = timeout.min(STOPPED_AFTER / 2);
        }
        let ts = Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: i64::from(timeout.subsec_nanos()) };
        if let Err(e) = rustix::event::poll(&mut fds, Some(&ts)) {
            if e != rustix::io::Errno::INTR {
                return fail(shared, io::ErrorKind::Other, format!("poll: {e}"));
            }
            continue;
        }
        let revents: Vec<PollFlags> = fds.iter().map(|f| f.revents()).collect();
        drop(fds);
        drop(server_fds);
        if !revents[0].is_empty() {
            while shared.wake_rx.recv(&mut buf).is_ok() {}
        }
        if !revents[1].is_empty() {
            loop {
                match proto::recv(&*c, &mut buf) {
                    Ok(Some((len, fds))) => match ToMember::decode(&buf[..len]) {
                        Some(ToMember::Hold { generation, done }) => {
                            let mut held = shared.held.lock().unwrap_or_else(|e| e.into_inner());
                            if held.generation != generation {
                                held.pending.clear();
                                held.generation = generation;
                            }
                            held.pending.extend(fds.into_iter().map(ParentOnly::new));
                            if done {
                                // The new set is held before the old one closes: a socket
                                // in both never leaves its group.
                                held.set = std::mem::take(&mut held.pending);
                                drop(held);
                                let _ = proto::send(&*c, &ToCoord::Held { generation }.encode(), &[]);
                            }
                        }
                        Some(ToMember::Keep) => {
                            shared.held.lock().unwrap_or_else(|e| e.into_inner()).set =
                                fds.into_iter().map(ParentOnly::new).collect();
                        }
                        Some(ToMember::Refused { oldest, envelope }) => {
                            fail(shared, io::ErrorKind::ConnectionRefused, refused(shared, oldest, &envelope));
                        }
                        Some(m) => {
                            if let (ToMember::Welcome { .. }, Some(l)) = (&m, link.as_mut()) {
                                l.welcomed = true;
                                hung_up = None;
                            }
                            if let Err((kind, msg)) = on_message(shared, m) {
                                fail(shared, kind, msg);
                            }
                        }
                        // A record of a later version: ignored.
                        None => {}
                    },
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Ok(None) | Err(_) => {
                        // The coordinator is gone, or hung up on this member's hello: elect
                        // a new one and re-register, or say hello in another layout.
                        *shared.conn.lock().unwrap_or_else(|e| e.into_inner()) = None;
                        if let Some(l) = link.take().filter(|l| !l.welcomed) {
                            let since = match hung_up {
                                Some((pid, _, since)) if pid == l.coordinator => since,
                                _ => Instant::now(),
                            };
                            hung_up = Some((l.coordinator, l.layout, since));
                        }
                        conn = None;
                        failover = true;
                        break;
                    }
                }
            }
        }
        for (s, r) in shared.sockets.iter().zip(&revents[2..2 + data]) {
            if r.is_empty() {
                continue;
            }
            while let Ok(n) = s.recv(&mut batch) {
                if n == 0 {
                    break;
                }
                for d in batch.iter() {
                    match (steer::parse_probe(d.payload), &conn) {
                        (Some((index, nonce)), Some(c)) => {
                            let _ = proto::send(&**c, &ToCoord::ProbeAnswer { index, nonce }.encode(), &[]);
                        }
                        _ => {
                            shared.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        if let Some(s) = server.as_mut() {
            s.handle(&revents[2 + data..]);
        }
    }
    // The connection stays in `shared.conn` until the member's sockets have closed.
}

/// The layout of a member's hello.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    /// A [`ToCoord::Join`] of the member's version.
    Join,
    /// Protocol 2's [`ToCoord::Hello`].
    Legacy,
}

/// The connection to the coordinator, as far as the hello goes.
struct Link {
    /// The coordinator's process (0: unknown).
    coordinator: u32,
    layout: Layout,
    since: Instant,
    welcomed: bool,
}

/// "process 1234 (/usr/bin/prog)", from `/proc` (the same user's processes are readable).
fn process(pid: u32) -> String {
    if pid == 0 {
        return "a process in another PID namespace".into();
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .or_else(|_| std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|c| c.trim_end().to_string()));
    match exe {
        Ok(exe) => format!("process {pid} ({exe})"),
        Err(_) => format!("process {pid}"),
    }
}

/// Process `pid`'s state letter in `/proc/PID/stat`; `None` when there is no such process.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (in parentheses) may hold spaces; the state follows it.
    stat.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next())
}

/// Whether process `pid` is stopped (SIGSTOP, or a debugger holds it): state `T` or `t`.
fn process_stopped(pid: u32) -> bool {
    matches!(process_state(pid), Some('T' | 't'))
}

/// Whether process `pid` is gone or exiting (a zombie, or dead): a coordinator's name can
/// outlive it for a moment, in its last instants or in a child of `fork` that inherited its
/// listening socket (and answers nothing).
fn process_gone(pid: u32) -> bool {
    matches!(process_state(pid), None | Some('Z' | 'X' | 'x'))
}

/// "host protocol 3", "host protocols 2 to 3", for messages.
fn versions(oldest: u32, newest: u32) -> String {
    if oldest == newest { format!("host protocol {newest}") } else { format!("host protocols {oldest} to {newest}") }
}

/// The join error when the coordinator refused this member's version.
fn refused(shared: &Shared, oldest: u32, coordinator: &Envelope) -> String {
    format!(
        "{} is coordinated by process {} ({}, {}), which speaks {}; this process ({}) speaks {}: \
         processes of softrdma builds with no host protocol in common cannot share a port. \
         Stop process {}, or run both from builds of one version, or give one of them another port",
        shared.port_name(),
        coordinator.pid,
        coordinator.program,
        coordinator.build,
        versions(oldest, coordinator.version),
        proto::BUILD,
        versions(shared.speaks.oldest(), shared.speaks.newest()),
        coordinator.pid,
    )
}

/// The join error when the coordinator hung up on every hello this member can say.
fn hung_up_on(shared: &Shared, pid: u32, last: Layout) -> String {
    let tried = match (shared.speaks.join_version(), last) {
        (Some(v), Layout::Legacy) => format!("in host protocol {v} and in protocol 2's layout"),
        (Some(v), Layout::Join) => format!("in host protocol {v}"),
        (None, _) => "in host protocol 2".to_string(),
    };
    format!(
        "{} is coordinated by {}, which hung up on this process's hello {tried}: it is a softrdma build of an \
         older host protocol (this one speaks {}), and processes of builds with no host protocol in common \
         cannot share a port. Stop process {pid} (or rebuild it from this version), or give one of them another port",
        shared.port_name(),
        process(pid),
        versions(shared.speaks.oldest(), shared.speaks.newest()),
    )
}

/// The join error when the coordinator does not answer this member's hello.
fn unanswered(shared: &Shared, pid: u32, waited: Duration, stopped: bool) -> String {
    let why = if stopped {
        format!("it is stopped (SIGSTOP, or a debugger holds it); resume it (kill -CONT {pid}) or stop it")
    } else {
        format!("it runs but does not answer (stuck, or not a softrdma process); stop it (kill {pid})")
    };
    format!(
        "{} is coordinated by {}, which has not answered this process's hello in {} ms, and no other process \
         can coordinate the port while it holds the coordinator's name: {why}",
        shared.port_name(),
        process(pid),
        waited.as_millis(),
    )
}

/// The error when a process of another user holds the coordinator's name.
fn impostor(shared: &Shared, pid: u32, uid: u32, owner: u32) -> String {
    format!(
        "the coordinator's name of {} (user {owner}'s) is held by {} of user {uid}: this process gives its \
         sockets only to a coordinator of user {owner}. That process must end before softrdma can use the port",
        shared.port_name(),
        process(pid),
    )
}

/// A socket's identity: device and inode, the same for every descriptor of one socket.
type Ino = (u64, u64);

/// `fd`'s identity.
fn inode(fd: BorrowedFd<'_>) -> Option<Ino> {
    let st = rustix::fs::fstat(fd).ok()?;
    Some((st.st_dev, st.st_ino))
}

/// The guest filter of `slot`, as the kernel takes it and hands it back.
fn guest_filter(slot: u32) -> Vec<(u16, u8, u8, u32)> {
    steer::guest_filter(slot).iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect()
}

/// Whether `fd` is a socket a coordinator of user `uid` made for the guest of `slot`:
/// `uid`'s (its creator's, whom the kernel's reuseport groups go by), carrying that slot's
/// guest filter, locked.
fn is_guest_socket(fd: BorrowedFd<'_>, slot: u32, uid: u32) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| st.st_uid == uid)
        && crate::sys::filter_locked(fd).unwrap_or(false)
        && crate::sys::filter_of(fd).is_ok_and(|f| f == guest_filter(slot))
}

/// An unconnected UDP socket on a port, from `/proc/net/udp` or `udp6`.
struct PortSocket {
    local: IpAddr,
    uid: u32,
    inode: u64,
}

/// Whether the port holds unconnected sockets of this process's user that are not this
/// member's own.
fn others_of_my_user(shared: &Shared) -> bool {
    let uid = rustix::process::getuid().as_raw();
    let mine: BTreeSet<u64> = shared.inodes().into_iter().map(|(_, i)| i).collect();
    port_sockets(&shared.addresses, shared.port).iter().any(|s| s.uid == uid && !mine.contains(&s.inode))
}

/// The unconnected UDP sockets on `port` bound to one of `addresses` or to the wildcard,
/// from `/proc/net/udp` and `udp6`, which every user may read.
fn port_sockets(addresses: &[IpAddr], port: u16) -> Vec<PortSocket> {
    ["/proc/net/udp", "/proc/net/udp6"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f).unwrap_or_default().lines().skip(1).map(str::to_owned).collect::<Vec<_>>()
        })
        .filter_map(|line| proc_net_udp_row(&line))
        .filter(|(s, p, connected)| {
            *p == port && !connected && (addresses.contains(&s.local) || s.local.is_unspecified())
        })
        .map(|(s, ..)| s)
        .collect()
}

/// The one user whose unconnected UDP sockets hold `port` on every one of
/// `addresses` (bound to it, or to the wildcard), from `/proc/net/udp` and `udp6`, which
/// every user may read; `None` when they are several users, or none.
pub fn port_owner(addresses: &[IpAddr], port: u16) -> Option<u32> {
    let sockets = port_sockets(addresses, port);
    let held = |a: &IpAddr| sockets.iter().any(|s| s.local == *a || s.local.is_unspecified());
    if !addresses.iter().all(held) {
        return None;
    }
    let owners: BTreeSet<u32> = sockets.iter().map(|s| s.uid).collect();
    let mut it = owners.into_iter();
    match (it.next(), it.next()) {
        (Some(uid), None) => Some(uid),
        _ => None,
    }
}

/// One row of `/proc/net/udp(6)`: the socket, its local port, and whether it is
/// connected. Addresses are the kernel's words in hex, each in this host's byte order.
fn proc_net_udp_row(line: &str) -> Option<(PortSocket, u16, bool)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let (local, remote, uid, inode) = (f.get(1)?, f.get(2)?, f.get(7)?, f.get(9)?);
    let (ip, port) = local.split_once(':')?;
    let words: Option<Vec<[u8; 4]>> = ip
        .as_bytes()
        .chunks(8)
        .map(|w| Some(u32::from_str_radix(std::str::from_utf8(w).ok()?, 16).ok()?.to_ne_bytes()))
        .collect();
    let bytes: Vec<u8> = words?.concat();
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes.as_slice()).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes.as_slice()).ok()?),
        _ => return None,
    };
    let connected =
        remote.split_once(':').is_some_and(|(a, p)| !a.trim_matches('0').is_empty() || !p.trim_matches('0').is_empty());
    let socket = PortSocket { local: ip, uid: uid.parse().ok()?, inode: inode.parse().ok()? };
    Some((socket, u16::from_str_radix(port, 16).ok()?, connected))
}

/// How long a join tries to take the port while it changes hands: the processes of its
/// user ending (their sockets close one by one), a group being founded again.
const TAKE_PORT_FOR: Duration = Duration::from_secs(3);

/// This process's sockets on `addresses`: bound by itself (its user's group, new or
/// joined), or, when another user's processes hold the port, made by their coordinator
/// (this process their guest). Returns the sockets, the group's user if another, the
/// connection to its coordinator and the slot it gave. While the port changes hands (no
/// one user holds it, or its user's coordinator is not there) it tries again, for
/// [`TAKE_PORT_FOR`] at most.
#[allow(clippy::type_complexity)]
fn take_port(
    addresses: &[IpAddr],
    device: &str,
    config: &Config,
    port_name: &str,
) -> io::Result<(Vec<RoceSocket>, Option<u32>, Option<ParentOnly>, u32)> {
    let uid = rustix::process::getuid().as_raw();
    let deadline = Instant::now() + TAKE_PORT_FOR;
    loop {
        let err = match addresses.iter().map(|&a| RoceSocket::bind_with(a, config)).collect::<io::Result<Vec<_>>>() {
            Ok(sockets) => return Ok((sockets, None, None, 0)),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => match port_owner(addresses, config.port) {
                // A socket of this user that is in no group: another program's.
                Some(owner) if owner == uid => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "{port_name}: a socket of this user (uid {uid}) holds UDP port {} outside softrdma's \
                             group ({e}): another program, or one bound without SO_REUSEPORT; \
                             `ss -uapn 'sport = :{}'` lists it",
                            config.port, config.port,
                        ),
                    ));
                }
                // Another user's processes hold the port: join their group as a guest.
                Some(owner) => {
                    let name = coordinator_name(owner, device, config.port);
                    match guest_fds(&name, owner, addresses, 0, config, port_name) {
                        Ok((conn, slot, fds)) => {
                            let sockets =
                                fds.into_iter().map(|fd| RoceSocket::adopt(fd, config)).collect::<io::Result<_>>()?;
                            return Ok((sockets, Some(owner), Some(conn), slot));
                        }
                        // Nobody of that user coordinates, or its coordinator hung up:
                        // their processes may be ending, or the guests founding the group
                        // again (a build of protocol 1 or 2 hangs up too, for good: the
                        // error says so at the end).
                        Err(e) if matches!(e.kind(), io::ErrorKind::AddrInUse | io::ErrorKind::ConnectionAborted) => e,
                        Err(e) => return Err(e),
                    }
                }
                // Several users' sockets, or none left: the port changes hands.
                None => e,
            },
            Err(e) => return Err(e),
        };
        if Instant::now() >= deadline {
            if err.kind() != io::ErrorKind::AddrInUse || err.get_ref().is_some() {
                return Err(err);
            }
            // The bind's own error, which names nothing.
            return Err(io::Error::new(
                err.kind(),
                format!(
                    "{port_name}: UDP port {} stayed held for {TAKE_PORT_FOR:?} by sockets that are not one user's \
                     softrdma group on every address ({err}): another program holds it on some of them, or \
                     programs of several users do; `ss -uapn 'sport = :{}'` lists them",
                    config.port, config.port,
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(10 + random_u64() % 20));
    }
}

/// The datagram that wakes a thread polling a socket that left its group
/// ([`RoceSocket::replace_with`](crate::RoceSocket::replace_with)): a probe, which every
/// socket keeps, a guest's too, whose locked filter drops anything else (a byte of
/// nothing, as sent before, left such a poller asleep for good, and its socket in the
/// group). Nobody reads it: the socket it reaches is no member's any more.
pub(crate) fn wake_datagram() -> [u8; steer::PROBE_LEN] {
    steer::probe(u32::MAX, 0)
}

/// The abstract name of `uid`'s coordinator of `device` and `port`.
fn coordinator_name(uid: u32, device: &str, port: u16) -> Vec<u8> {
    format!("softrdma.{uid}.{device}.{port}").into_bytes()
}

/// A guest's start: asks the coordinator of `owner`'s groups (at `name`) for sockets on
/// `addresses` (for slot `want`, or any for 0) and checks what it got: sockets of
/// `owner`, bound there, with the locked filter of the slot given. Returns the connection
/// (the hello goes there), the slot and the sockets, to set up with `config`.
fn guest_fds(
    name: &[u8],
    owner: u32,
    addresses: &[IpAddr],
    want: u32,
    config: &Config,
    port_name: &str,
) -> io::Result<(ParentOnly, u32, Vec<OwnedFd>)> {
    let deadline = Instant::now() + HELLO_TIMEOUT;
    let conn = loop {
        match connect(name) {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5 + random_u64() % 20)),
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{port_name}: user {owner}'s processes hold the port and none of them coordinates it ({e}): \
                         it is a program other than softrdma, or a softrdma build without guests, or every \
                         process of user {owner} that used softrdma here has ended and the processes of other \
                         users that hold sockets it made for them are founding the group again (or one of them \
                         is stopped); `ss -uapn 'sport = :{}'` lists them",
                        config.port,
                    ),
                ));
            }
        }
    };
    let (pid, uid) = crate::sys::peer_cred(conn.as_fd())?;
    if uid != owner {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{port_name}: the coordinator's name of user {owner}'s groups is held by {} of user {uid}; \
                 this process asks only a coordinator of user {owner} for its sockets",
                process(pid)
            ),
        ));
    }
    let asked: Vec<std::net::SocketAddr> = addresses
        .iter()
        .map(|&a| match a {
            IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                std::net::SocketAddr::V6(std::net::SocketAddrV6::new(v6, config.port, 0, config.scope_id.unwrap_or(0)))
            }
            _ => std::net::SocketAddr::new(a, config.port),
        })
        .collect();
    let envelope = Envelope::me(proto::VERSION);
    proto::send(&conn, &ToCoord::Guest { envelope, slot: want, addresses: asked.clone() }.encode(), &[])?;
    let mut buf = vec![0u8; proto::MAX_RECORD];
    // The coordinator answers at once, or after a failover's grace period.
    let deadline = Instant::now() + HELLO_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{port_name}: {} (user {owner}'s coordinator) made no sockets for this process within {} ms",
                    process(pid),
                    HELLO_TIMEOUT.as_millis()
                ),
            ));
        }
        crate::sys::poll(conn.as_fd(), libc::POLLIN, Some(left))?;
        let (len, fds) = match proto::recv(&conn, &mut buf) {
            Ok(Some(r)) => r,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
            Ok(None) | Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!(
                        "{port_name}: {} (user {owner}'s coordinator) hung up on this process's request for sockets: a softrdma build without guests (processes of other users)",
                        process(pid)
                    ),
                ));
            }
        };
        match ToMember::decode(&buf[..len]) {
            Some(ToMember::Sockets { slot, errno: 0 }) => {
                if fds.len() != asked.len() {
                    return Err(io::Error::other(format!(
                        "{port_name}: the coordinator sent {} sockets for {} addresses",
                        fds.len(),
                        asked.len()
                    )));
                }
                let mut sockets = Vec::with_capacity(fds.len());
                for (fd, asked) in fds.into_iter().zip(&asked) {
                    let bound = socket2::SockRef::from(&fd).local_addr().ok().and_then(|a| a.as_socket());
                    if !(is_guest_socket(fd.as_fd(), slot, owner)
                        && bound.is_some_and(|b| b.ip() == asked.ip() && b.port() == asked.port()))
                    {
                        return Err(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            format!(
                                "{port_name}: {} sent a socket for {asked} that is not one made for slot {slot} of user {owner}'s group",
                                process(pid)
                            ),
                        ));
                    }
                    sockets.push(fd);
                }
                return Ok((conn, slot, sockets));
            }
            Some(ToMember::Sockets { errno, .. }) => {
                let e = io::Error::from_raw_os_error(errno);
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{port_name}: user {owner}'s coordinator ({}) could not make this process's sockets: {e}",
                        process(pid)
                    ),
                ));
            }
            Some(ToMember::Refused { oldest, envelope }) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!(
                        "{port_name} belongs to user {owner}'s processes, coordinated by process {} ({}, {}), which speaks {} \
                         without guests: processes of other users can join only a group coordinated by a build that \
                         takes them ({} or later)",
                        envelope.pid,
                        envelope.program,
                        envelope.build,
                        versions(oldest, envelope.version),
                        proto::BUILD,
                    ),
                ));
            }
            _ => {}
        }
    }
}

fn on_message(shared: &Shared, m: ToMember) -> Result<(), (io::ErrorKind, String)> {
    match m {
        ToMember::Welcome { slot: 0, errno } => {
            let e = io::Error::from_raw_os_error(errno);
            return Err((e.kind(), format!("the coordinator refused this member: {e}")));
        }
        ToMember::Welcome { slot, .. } => {
            let old = shared.slot.swap(slot, Ordering::Relaxed);
            if old != 0 && old != slot {
                return Err((io::ErrorKind::Other, format!("slot {old} lost in a failover (now {slot})")));
            }
        }
        ToMember::Steered => {
            shared.state().steered = true;
            shared.cond.notify_all();
        }
        ToMember::Hold { .. } | ToMember::Keep | ToMember::Refused { .. } | ToMember::Sockets { .. } => {}
        ToMember::Reply { id, errno } => {
            let mut state = shared.state();
            if let Some(ToCoord::Listen { service, .. }) = state.in_flight.remove(&id) {
                if errno == 0 {
                    state.listeners.insert(service);
                }
            }
            state.results.insert(id, errno);
            drop(state);
            shared.cond.notify_all();
        }
    }
    Ok(())
}
