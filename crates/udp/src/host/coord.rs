//! The coordinator: holds every member's sockets, hands out slots, learns each socket's
//! index by probing, and installs the steering program of each group.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::fork::ParentOnly;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use super::proto::{self, Envelope, MAX_RECORD, Speaks, ToCoord, ToMember};
use super::steer::{self, Table};
use super::{Ino, MAX_SLOTS, guest_filter, inode, is_guest_socket, random_u64};

/// When process `pid` started (clock ticks since boot, `/proc/PID/stat`); unknown ones
/// (another PID namespace) count as the youngest.
fn started(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (in parentheses) may hold spaces; start time is field 22.
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    after.split_whitespace().nth(19).and_then(|t| t.parse().ok()).unwrap_or(u64::MAX)
}

/// How long the coordinator waits for the answers to one round of probes.
const ROUND_TIMEOUT: Duration = Duration::from_millis(300);
/// After a failover, how long new members (asking for a fresh slot) wait, so that the
/// survivors re-claim their slots first.
pub(crate) const FAILOVER_GRACE: Duration = Duration::from_millis(300);
/// How long new members wait when a fresh coordinator found sockets of its user on the
/// port that are not its own (`host::others_of_my_user`): guests a group's last process of
/// its user left, which re-register within milliseconds once a coordinator answers, or
/// only the sockets of a process that is ending, which nobody re-registers. The failover's
/// 300 ms there made every process that came to an idle port just after another left
/// wait that long to be steered: rdma_cm servers started one after another (the rsocket
/// tests') were not yet steered when their client connected, half the runs of
/// `crates/ibverbs/tests/rsocket.rs` on 2026-12-03, none with this.
pub(crate) const INHERITED_GRACE: Duration = Duration::from_millis(50);
/// Incomplete rounds retried before waiting for the next change.
const MAX_RETRIES: u32 = 3;
/// How many processes (other than the coordinator's) hold a copy of every socket the
/// coordinator holds: the oldest and the youngest ones, so that one job that ends (its
/// processes, of about one age, die together) rarely takes them all. The others hold the
/// coordinator's process's sockets only.
const HOLDERS_OLDEST: usize = 2;
const HOLDERS_YOUNGEST: usize = 2;
/// After closing tombstones, how long the probes wait for the holders to close their
/// copies (the sockets leave their groups, and the last ones move, only then).
const HOLD_TIMEOUT: Duration = Duration::from_millis(100);

/// Where a tombstone comes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tomb {
    /// A gone member of this coordinator's process.
    Own,
    /// A gone member of another process.
    Other,
    /// Handed over by a member after a failover: the previous coordinator held it, so it
    /// may be the socket of a survivor that has not registered again yet. Not drained
    /// before the grace period ends (it would take that survivor's datagrams).
    Adopted,
}

/// How often the programs are attached again while guests are members: the kernel lets any
/// member take its group's program off (`SO_DETACH_REUSEPORT_BPF` does not heed a locked
/// socket), and the group then hashes datagrams among its sockets, where the guests'
/// filters drop what is not theirs. This bounds what one such call costs the others.
const REINSTALL_EVERY: Duration = Duration::from_secs(1);

/// How soon a set of sockets to hold that could not be sent is sent again.
const HOLD_RETRY: Duration = Duration::from_millis(10);

/// A socket the coordinator holds.
struct Sock {
    addr: SocketAddr,
    fd: ParentOnly,
    ino: Ino,
    /// A guest's: its filters are locked, so the group's program cannot be attached
    /// through it.
    locked: bool,
}

impl Sock {
    fn new(fd: OwnedFd, port: u16) -> Option<Sock> {
        let addr = socket2::SockRef::from(&fd).local_addr().ok().and_then(|a| a.as_socket())?;
        let ino = inode(fd.as_fd())?;
        let locked = crate::sys::filter_locked(fd.as_fd()).unwrap_or(true);
        (addr.port() == port).then_some(Sock { addr, fd: ParentOnly::new(fd), ino, locked })
    }
}

/// A socket for a guest of `slot` on `addr`: bound into the group there, with the guest
/// filter of `slot`, locked.
fn make_guest_socket(addr: SocketAddr, slot: u32) -> io::Result<OwnedFd> {
    let fd = crate::RoceSocket::bare(addr)?;
    crate::sys::attach_filter(fd.as_fd(), &guest_filter(slot))?;
    crate::sys::set_int(fd.as_fd(), libc::SOL_SOCKET, libc::SO_LOCK_FILTER, 1)?;
    Ok(fd)
}

struct Conn {
    id: u64,
    fd: ParentOnly,
    /// The member's process (from its hello).
    pid: u32,
    /// A process of another user (`SO_PEERCRED`): it gets sockets made here
    /// ([`ToCoord::Guest`]), never holds any other's, and never coordinates.
    guest: bool,
    /// The slot made for a guest ([`ToCoord::Guest`]) that has not registered yet: taken.
    issued: u32,
    /// Re-claimed its slot after a failover: it may be steered by the previous
    /// coordinator's program at an index this one has not learned yet.
    reclaimed: bool,
    /// 0 until registered.
    slot: u32,
    /// When the member's process started ([`started`]): the oldest and the youngest hold
    /// every socket.
    joined: u64,
    sockets: Vec<Sock>,
    listeners: BTreeSet<u64>,
    /// The sockets it was last told to hold ([`ToMember::Hold`]) and that generation;
    /// `None`: it may hold sockets nobody told it to here (a previous coordinator's).
    hold_sent: Option<(u64, Vec<Ino>)>,
    /// The last generation it said it holds.
    hold_acked: u64,
    /// Registered, waiting to hear that its slot is steered.
    awaiting: bool,
    /// A steered member that did not answer the probes of a round that timed out (its
    /// process is stopped, or stuck): the rounds after it complete without its answers,
    /// keeping its last known index, so that it does not hold up every change by a round
    /// timeout, until it says anything again.
    silent: bool,
    /// A hello waiting for the failover grace period to end.
    deferred: Option<(ToCoord, Vec<OwnedFd>)>,
    /// Refused (a process of a version this coordinator does not speak): what it sends
    /// next is ignored.
    refused: bool,
    /// The sockets a refused process sent: in their groups as long as it lives, each at
    /// an index the probes must count; tombstones once it hangs up.
    foreign: Vec<Sock>,
}

struct Round {
    nonces: HashMap<u64, (SocketAddr, u32)>,
    /// Per group: the sockets held (members' and tombstones), so the indices probed.
    expected: BTreeMap<SocketAddr, usize>,
    /// Per group: the slots of the members registered when the round started.
    members: BTreeMap<SocketAddr, BTreeSet<u32>>,
    /// Per group: index → the slot that answered its probe, each slot at most once.
    found: BTreeMap<SocketAddr, BTreeMap<u32, u32>>,
    /// Slots that answered the probes of two indices of one group: the probes were not
    /// steered by index (the kernel hashed them), so the round proves nothing about them.
    conflicts: BTreeSet<(SocketAddr, u32)>,
    deadline: Instant,
}

impl Round {
    /// Every member's socket in every group is placed (tombstones never answer), and no
    /// answer contradicted another.
    fn complete(&self) -> bool {
        self.conflicts.is_empty()
            && self.members.iter().all(|(a, slots)| {
                let found = self.found.get(a);
                slots.iter().all(|s| found.is_some_and(|f| f.values().any(|v| v == s)))
            })
    }
}

/// The coordinator's state, driven by the member's background thread.
pub(crate) struct Server {
    listener: ParentOnly,
    port: u16,
    /// This process's user: the owner of every socket in the groups.
    uid: u32,
    /// The versions it speaks, and what it tells a process it refuses.
    speaks: Speaks,
    me: Envelope,
    conns: Vec<Conn>,
    next_conn: u64,
    next_fresh: u32,
    free: VecDeque<u32>,
    round: Option<Round>,
    dirty: bool,
    retries: u32,
    grace_until: Option<Instant>,
    /// Per group: slot → index, as last learned.
    index_of: BTreeMap<SocketAddr, BTreeMap<u32, u32>>,
    /// Listen requests answered when the current round's program is installed.
    pending_replies: Vec<(u64, u64)>,
    /// Sockets of members that are gone, held so that no other socket moves in their
    /// group (the kernel moves the last socket into a closed one's place): closed only
    /// while the last socket of the group is not steered ([`compact`](Self::compact)).
    tombstones: Vec<(Sock, Tomb)>,
    /// What members hold changed: [`sync_holders`](Self::sync_holders) tells them.
    holders_dirty: bool,
    /// Generation of the sets sent to holders.
    hold_gen: u64,
    /// Tombstones were closed: the round's probes wait until every holder closed its
    /// copies too, or until this deadline.
    settling: Option<Instant>,
    probe_v4: Option<UdpSocket>,
    probe_v6: Option<UdpSocket>,
    /// Programs the kernel refused (a test asserts none).
    pub(crate) attach_errors: u64,
    /// When the programs were last attached: with guests, they are attached again every
    /// [`REINSTALL_EVERY`], since any member may take a group's program off.
    installed_at: Instant,
    buf: Vec<u8>,
}

impl Server {
    /// Keeps `slots` from members asking for a fresh one: the slots of guests that found
    /// the group again with this coordinator's member, which they re-claim.
    pub(crate) fn reserve(&mut self, slots: Vec<u32>) {
        for s in slots.into_iter().filter(|&s| s < MAX_SLOTS) {
            self.next_fresh = self.next_fresh.max(s + 1);
        }
    }

    /// Binds the coordinator's name; `Ok(None)` when another process holds it. For `grace`
    /// new members (asking for a fresh slot) wait, while the members of a group it takes
    /// over re-claim their slots ([`FAILOVER_GRACE`], [`INHERITED_GRACE`]).
    pub(crate) fn bind(name: &[u8], port: u16, grace: Option<Duration>, speaks: Speaks) -> io::Result<Option<Self>> {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        match rustix::net::bind(&fd, &SocketAddrUnix::new_abstract_name(name)?) {
            Ok(()) => {}
            Err(rustix::io::Errno::ADDRINUSE) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        rustix::net::listen(&fd, 1024)?;
        Ok(Some(Self {
            listener: ParentOnly::new(fd),
            port,
            uid: rustix::process::getuid().as_raw(),
            speaks,
            me: Envelope::me(speaks.newest()),
            conns: Vec::new(),
            next_conn: 1,
            next_fresh: 1,
            free: VecDeque::new(),
            round: None,
            dirty: false,
            retries: 0,
            grace_until: grace.map(|g| Instant::now() + g),
            index_of: BTreeMap::new(),
            pending_replies: Vec::new(),
            tombstones: Vec::new(),
            holders_dirty: false,
            hold_gen: 0,
            settling: None,
            probe_v4: None,
            probe_v6: None,
            attach_errors: 0,
            installed_at: Instant::now(),
            buf: vec![0; MAX_RECORD],
        }))
    }

    /// The descriptors to poll for reading: the listener, each connection, then each
    /// tombstone to drain (the hash may put datagrams there).
    pub(crate) fn fds(&self) -> Vec<BorrowedFd<'_>> {
        std::iter::once(self.listener.as_fd())
            .chain(self.conns.iter().map(|c| c.fd.as_fd()))
            .chain(self.drained().map(|t| t.fd.as_fd()))
            .collect()
    }

    /// The tombstones to drain: those known to be gone members' sockets.
    fn drained(&self) -> impl Iterator<Item = &Sock> {
        let adopted_too = self.grace_until.is_none();
        self.tombstones.iter().filter(move |t| t.1 != Tomb::Adopted || adopted_too).map(|t| &t.0)
    }

    /// When [`tick`](Self::tick) must run next.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let grace = self
            .grace_until
            .filter(|_| self.dirty || self.holders_dirty || self.conns.iter().any(|c| c.deferred.is_some()));
        // A set that did not go (a member's queue was full) is sent again soon.
        let retry = (self.holders_dirty && self.grace_until.is_none()).then(|| Instant::now() + HOLD_RETRY);
        let reinstall = self.guests().then(|| self.installed_at + REINSTALL_EVERY);
        [self.round.as_ref().map(|r| r.deadline), grace, self.settling, retry, reinstall].into_iter().flatten().min()
    }

    /// Handles poll results for [`fds`](Self::fds), then timers.
    pub(crate) fn handle(&mut self, revents: &[PollFlags]) {
        let n = self.conns.len();
        if revents.first().is_some_and(|r| !r.is_empty()) {
            self.accept();
        }
        for (t, r) in self.drained().zip(revents.iter().skip(1 + n)) {
            if !r.is_empty() {
                let mut buf = [0u8; 64];
                let mut left = 256;
                while left > 0 && rustix::net::recv(&t.fd, &mut buf, rustix::net::RecvFlags::DONTWAIT).is_ok() {
                    left -= 1;
                }
            }
        }
        let ids: Vec<(u64, PollFlags)> =
            self.conns.iter().zip(revents.iter().skip(1).take(n)).map(|(c, &r)| (c.id, r)).collect();
        for (id, r) in ids {
            if !r.is_empty() {
                self.read(id);
            }
        }
        self.tick();
    }

    /// Timers: failover grace, round deadline; then starts a round if something changed.
    pub(crate) fn tick(&mut self) {
        let now = Instant::now();
        if self.grace_until.is_some_and(|g| now >= g) {
            self.grace_until = None;
            let deferred: Vec<(u64, ToCoord, Vec<OwnedFd>)> =
                self.conns.iter_mut().filter_map(|c| c.deferred.take().map(|(m, fds)| (c.id, m, fds))).collect();
            for (id, m, fds) in deferred {
                self.message(id, m, fds);
            }
        }
        if self.round.as_ref().is_some_and(|r| now >= r.deadline) {
            self.finish_round(false);
        }
        if self.settling.is_some_and(|t| now >= t || self.holders_settled()) {
            self.settling = None;
            self.probe();
        }
        // After a failover, the previous coordinator's program keeps steering the
        // survivors while they re-claim their slots: no round (which would install a
        // program without the ones not back yet) until the grace period ends.
        if self.dirty && self.round.is_none() && self.settling.is_none() && self.grace_until.is_none() {
            self.start_round();
        }
        // During the grace period the members keep holding what the previous coordinator
        // gave them (this one may not hold it all yet: a member's adopted sockets may be
        // in flight); a new set replaces theirs once the survivors are back.
        if self.holders_dirty && self.grace_until.is_none() {
            self.sync_holders();
        }
        if self.guests()
            && self.round.is_none()
            && self.grace_until.is_none()
            && now >= self.installed_at + REINSTALL_EVERY
        {
            self.install();
        }
    }

    /// Whether a process of another user is a member.
    fn guests(&self) -> bool {
        self.conns.iter().any(|c| c.guest && c.slot != 0)
    }

    fn accept(&mut self) {
        loop {
            match rustix::net::accept_with(&self.listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) {
                Ok(fd) => {
                    // Who connects: a process of this user, or a guest. Nothing else
                    // tells (a name is anyone's to connect to).
                    let Ok((_, uid)) = crate::sys::peer_cred(fd.as_fd()) else { continue };
                    let guest = uid != self.uid;
                    let id = self.next_conn;
                    self.next_conn += 1;
                    self.conns.push(Conn {
                        id,
                        fd: ParentOnly::new(fd),
                        pid: 0,
                        guest,
                        issued: 0,
                        reclaimed: false,
                        slot: 0,
                        joined: 0,
                        sockets: Vec::new(),
                        listeners: BTreeSet::new(),
                        hold_sent: Some((0, Vec::new())),
                        hold_acked: 0,
                        awaiting: false,
                        silent: false,
                        deferred: None,
                        refused: false,
                        foreign: Vec::new(),
                    });
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    }

    fn read(&mut self, id: u64) {
        loop {
            let Some(conn) = self.conns.iter().find(|c| c.id == id) else { return };
            match proto::recv(&conn.fd, &mut self.buf) {
                Ok(Some((len, fds))) => match ToCoord::decode(&self.buf[..len]) {
                    // Protocol 2's hello, to a coordinator (a test's) that does not speak it.
                    Some(ToCoord::Hello { .. }) if !self.speaks.legacy() => self.refuse(id, fds, false),
                    Some(m) => self.message(id, m, fds),
                    // A first record this build cannot read comes from a process of another
                    // version, which may have joined a group: refused, its sockets held.
                    None if conn.slot == 0 && !conn.refused => self.refuse(id, fds, true),
                    // A registered member's record of a later version: ignored.
                    None => {}
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(None) | Err(_) => return self.remove(id),
            }
        }
    }

    fn send(&self, id: u64, m: &ToMember) {
        if let Some(c) = self.conns.iter().find(|c| c.id == id) {
            // A failure means the member is gone; its hang-up removes it.
            let _ = proto::send(&c.fd, &m.encode(), &[]);
        }
    }

    /// A member's connection hung up (its process is gone, or it left): free its slot
    /// and keep its sockets as tombstones, in place (closing them would move the last
    /// socket of each group into their place, away from the index the program steers it
    /// to). The program steers the slot nowhere from the next round on; until then its
    /// datagrams reach its tombstone, which drains them.
    fn remove(&mut self, id: u64) {
        let Some(pos) = self.conns.iter().position(|c| c.id == id) else { return };
        let conn = self.conns.swap_remove(pos);
        if !conn.foreign.is_empty() {
            // Its process closed them, or is gone: they stay in place until compacted.
            self.tombstones.extend(conn.foreign.into_iter().map(|s| (s, Tomb::Other)));
            self.dirty = true;
            self.holders_dirty = true;
        }
        if conn.slot == 0 && conn.issued != 0 {
            // A guest gone between its sockets and its hello: they are in the groups.
            self.free.push_back(conn.issued);
            self.tombstones.extend(conn.sockets.into_iter().map(|s| (s, Tomb::Other)));
            self.dirty = true;
            self.holders_dirty = true;
        } else if conn.slot != 0 {
            self.free.push_back(conn.slot);
            for map in self.index_of.values_mut() {
                map.remove(&conn.slot);
            }
            let own = conn.pid == std::process::id();
            let tomb = if own { Tomb::Own } else { Tomb::Other };
            self.tombstones.extend(conn.sockets.into_iter().map(|s| (s, tomb)));
            self.dirty = true;
            // Its sockets are tombstones now; if it held them all, others must.
            self.holders_dirty = true;
        }
        self.pending_replies.retain(|&(c, _)| c != id);
    }

    /// Closes the tombstones that can go without moving a steered socket: while a group
    /// holds more sockets than its highest steered index + 1, its last socket is not
    /// steered (a tombstone, a member not steered yet, or one not registered), and the
    /// kernel moves that one into the closed socket's place. Only before a round's probes:
    /// a member that moved is probed in that round (once the holders closed their copies
    /// too: [`settling`](Self::settling)). Not for a group whose indices are not all known
    /// (after a failover, before the first round). Returns whether it closed any.
    fn compact(&mut self) -> bool {
        let mut closed = false;
        let groups: BTreeSet<SocketAddr> = self.tombstones.iter().map(|t| t.0.addr).collect();
        for addr in groups {
            let Some(map) = self.index_of.get(&addr) else { continue };
            let unknown = self.conns.iter().any(|c| {
                c.slot != 0
                    && (!c.awaiting || c.reclaimed)
                    && c.sockets.iter().any(|s| s.addr == addr)
                    && !map.contains_key(&c.slot)
            });
            if unknown {
                continue;
            }
            let top = map.values().map(|&i| i as usize + 1).max().unwrap_or(0);
            let mut held =
                self.conns.iter().flat_map(|c| c.sockets.iter().chain(&c.foreign)).filter(|s| s.addr == addr).count()
                    + self.tombstones.iter().filter(|t| t.0.addr == addr).count();
            while held > top {
                let Some(pos) = self.tombstones.iter().position(|t| t.0.addr == addr) else { break };
                drop(self.tombstones.swap_remove(pos));
                held -= 1;
                closed = true;
            }
        }
        if closed {
            self.holders_dirty = true;
        }
        closed
    }

    /// The processes (one member each) that hold every socket: of the processes other
    /// than this one, the `HOLDERS_OLDEST` oldest and the `HOLDERS_YOUNGEST` youngest.
    fn holders(&self) -> Vec<u64> {
        let me = std::process::id();
        let mut by_age: Vec<&Conn> = self.conns.iter().filter(|c| c.slot != 0 && c.pid != me && !c.guest).collect();
        by_age.sort_by_key(|c| (c.joined, c.id));
        let mut pids = BTreeSet::new();
        let one_each: Vec<u64> = by_age.into_iter().filter(|c| pids.insert(c.pid)).map(|c| c.id).collect();
        if one_each.len() <= HOLDERS_OLDEST + HOLDERS_YOUNGEST {
            return one_each;
        }
        let young = &one_each[one_each.len() - HOLDERS_YOUNGEST..];
        one_each[..HOLDERS_OLDEST].iter().chain(young).copied().collect()
    }

    /// Tells each registered member which sockets to hold, where that changed: the
    /// holders ([`holders`](Self::holders)) every socket this coordinator holds (members'
    /// and tombstones), the other members of other processes this process's own, the
    /// members of this process none. So if this process dies, every socket stays in its
    /// group, in place, as long as one holder lives; they hand them to the next
    /// coordinator. This coordinator holds each socket it sends, so a member dropping
    /// what it held before closes none.
    fn sync_holders(&mut self) {
        self.holders_dirty = false;
        let me = std::process::id();
        let holders = self.holders();
        let all: Vec<&Sock> =
            self.conns.iter().flat_map(|c| &c.sockets).chain(self.tombstones.iter().map(|t| &t.0)).collect();
        let own: Vec<&Sock> = self
            .conns
            .iter()
            .filter(|c| c.pid == me)
            .flat_map(|c| &c.sockets)
            .chain(self.tombstones.iter().filter(|t| t.1 == Tomb::Own).map(|t| &t.0))
            .collect();
        let mut sends = Vec::new();
        for c in self.conns.iter().filter(|c| c.slot != 0) {
            // A guest holds nothing: a copy of another's socket would be a way to its
            // datagrams.
            let set: &[&Sock] = if c.pid == me || c.guest {
                &[]
            } else if holders.contains(&c.id) {
                &all
            } else {
                &own
            };
            let inos: Vec<Ino> = set.iter().map(|s| s.ino).collect();
            if c.hold_sent.as_ref().is_some_and(|(_, sent)| *sent == inos) {
                continue;
            }
            self.hold_gen += 1;
            let generation = self.hold_gen;
            let mut ok = true;
            let mut chunks = set.chunks(proto::MAX_FDS).peekable();
            if chunks.peek().is_none() {
                ok &= proto::send(&c.fd, &ToMember::Hold { generation, done: true }.encode(), &[]).is_ok();
            }
            while let Some(chunk) = chunks.next() {
                let fds: Vec<BorrowedFd<'_>> = chunk.iter().map(|s| s.fd.as_fd()).collect();
                let done = chunks.peek().is_none();
                ok &= proto::send(&c.fd, &ToMember::Hold { generation, done }.encode(), &fds).is_ok();
            }
            // A record that did not go (a full queue): send the set again later.
            sends.push((c.id, generation, ok.then_some(inos)));
        }
        for (id, generation, inos) in sends {
            if let Some(c) = self.conns.iter_mut().find(|c| c.id == id) {
                match inos {
                    Some(inos) => c.hold_sent = Some((generation, inos)),
                    None => {
                        c.hold_sent = None;
                        self.holders_dirty = true;
                    }
                }
            }
        }
    }

    /// Whether every registered member holds what it was last told to (or may hold a
    /// previous coordinator's set: then not).
    fn holders_settled(&self) -> bool {
        self.conns.iter().filter(|c| c.slot != 0).all(|c| c.hold_sent.as_ref().is_some_and(|(g, _)| c.hold_acked >= *g))
    }

    /// Whether this coordinator holds the socket `ino` already (a member's or a
    /// tombstone).
    fn holds(&self, ino: Ino) -> bool {
        self.conns.iter().flat_map(|c| c.sockets.iter().chain(&c.foreign)).any(|s| s.ino == ino)
            || self.tombstones.iter().any(|t| t.0.ino == ino)
    }

    /// Sockets a previous coordinator gave a member to hold: tombstones here, unless held
    /// already (a live member's sockets become its own again when it registers).
    fn adopt(&mut self, fds: Vec<OwnedFd>) {
        for fd in fds {
            if let Some(sock) = Sock::new(fd, self.port) {
                if !self.holds(sock.ino) {
                    self.tombstones.push((sock, Tomb::Adopted));
                    self.holders_dirty = true;
                }
            }
        }
    }

    /// Whether a member other than connection `by` has `slot` (or it was made for one).
    fn slot_taken(&self, slot: u32, by: u64) -> bool {
        self.conns.iter().any(|c| c.id != by && (c.slot == slot || c.issued == slot))
    }

    /// Takes `slot`, which a member re-claims: out of the free ones, and no fresh slot is
    /// handed out below it.
    fn claim(&mut self, slot: u32) -> u32 {
        self.free.retain(|&s| s != slot);
        self.next_fresh = self.next_fresh.max(slot + 1);
        slot
    }

    /// A free slot (never-used ones first, then the least recently freed), taken.
    fn fresh_slot(&mut self) -> Option<u32> {
        if self.next_fresh < MAX_SLOTS {
            self.next_fresh += 1;
            Some(self.next_fresh - 1)
        } else {
            self.free.pop_front()
        }
    }

    /// A guest asks for its sockets: a slot, and one socket per address bound into the
    /// group there with the slot's locked guest filter. This coordinator keeps its copies
    /// (the guest's sockets are in the groups from now on, as a member's are once bound).
    fn make_guest(&mut self, id: u64, want: u32, addresses: Vec<SocketAddr>) {
        let Some(pos) = self.conns.iter().position(|c| c.id == id) else { return };
        let c = &self.conns[pos];
        if !c.guest || c.slot != 0 || c.issued != 0 {
            // A process of this user binds its own; a guest asks once.
            return self.send(id, &ToMember::Sockets { slot: 0, errno: libc::EINVAL });
        }
        if addresses.is_empty() || addresses.len() > proto::MAX_FDS {
            return self.send(id, &ToMember::Sockets { slot: 0, errno: libc::EINVAL });
        }
        let slot = if want != 0 && want < MAX_SLOTS && !self.slot_taken(want, id) {
            // Its slot in the group before this one (its QPs live on): the same QPNs.
            self.claim(want)
        } else if let Some(s) = self.fresh_slot() {
            s
        } else {
            return self.send(id, &ToMember::Sockets { slot: 0, errno: libc::ENOSPC });
        };
        let mut fds = Vec::with_capacity(addresses.len());
        for a in addresses {
            let mut a = a;
            a.set_port(self.port);
            match make_guest_socket(a, slot) {
                Ok(fd) => fds.push(fd),
                Err(e) => {
                    self.free.push_front(slot);
                    let errno = e.raw_os_error().unwrap_or(libc::EIO);
                    return self.send(id, &ToMember::Sockets { slot: 0, errno });
                }
            }
        }
        let sent = {
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            proto::send(&self.conns[pos].fd, &ToMember::Sockets { slot, errno: 0 }.encode(), &borrowed)
        };
        let socks: Vec<Sock> = fds.into_iter().filter_map(|fd| Sock::new(fd, self.port)).collect();
        let c = &mut self.conns[pos];
        c.issued = slot;
        c.sockets = socks;
        if sent.is_err() {
            // Gone: its hang-up makes them tombstones.
            tracing::debug!(target: "softrdma::host", "sockets for a guest not sent: {sent:?}");
        }
        // New sockets join the end of their groups, moving no other: no round until its
        // hello. The holders hold them at once, in case this process dies before.
        self.holders_dirty = true;
    }

    fn service_owner(&self, service: u64) -> Option<u64> {
        self.conns.iter().find(|c| c.listeners.contains(&service)).map(|c| c.id)
    }

    /// Refuses a process of a version this coordinator does not speak, in words its
    /// version reads (`versioned`: a [`ToMember::Refused`]; otherwise a `Welcome` without a
    /// slot, which protocols 1 and 2 report as an error at once), and holds the sockets it
    /// sent for as long as its connection is open: it joined their groups before its hello,
    /// so each takes an index there, which the probes must count (a member that joins after
    /// it would otherwise never be probed), and when it closes them, the held copies keep
    /// every other socket in place. The connection stays open: hanging up would not close
    /// its sockets, and a process of protocol 1 or 2 would only say hello again.
    fn refuse(&mut self, id: u64, fds: Vec<OwnedFd>, versioned: bool) {
        let Some(pos) = self.conns.iter().position(|c| c.id == id) else { return };
        for fd in fds {
            if let Some(sock) = Sock::new(fd, self.port) {
                if !self.holds(sock.ino) {
                    self.conns[pos].foreign.push(sock);
                    self.dirty = true;
                }
            }
        }
        self.conns[pos].refused = true;
        let answer = if versioned {
            ToMember::Refused { oldest: self.speaks.oldest(), envelope: self.me.clone() }
        } else {
            ToMember::Welcome { slot: 0, errno: libc::EPROTONOSUPPORT }
        };
        self.send(id, &answer);
    }

    fn message(&mut self, id: u64, m: ToCoord, fds: Vec<OwnedFd>) {
        let Some(pos) = self.conns.iter().position(|c| c.id == id) else { return };
        if self.conns[pos].refused {
            return;
        }
        if std::mem::take(&mut self.conns[pos].silent) {
            // It runs again: a round finds where its socket is now.
            self.dirty = true;
        }
        match m {
            ToCoord::Join { .. } if self.speaks.join_version().is_none() => {
                // A coordinator of protocol 2 (a test's) cannot decode it: it hangs up.
                self.remove(id);
            }
            ToCoord::Join { envelope, body } => {
                if self.conns[pos].slot != 0 {
                    return;
                }
                let hello = ToCoord::hello_of(envelope.pid, &body);
                match hello.filter(|_| Some(envelope.version) == self.speaks.join_version()) {
                    Some(hello) => self.message(id, hello, fds),
                    None => self.refuse(id, fds, true),
                }
            }
            ToCoord::HelloV1 { .. } => self.refuse(id, fds, false),
            ToCoord::Guest { .. } if self.grace_until.is_some() => {
                self.conns[pos].deferred = Some((m, fds));
            }
            ToCoord::Guest { slot, addresses, .. } => self.make_guest(id, slot, addresses),
            // A guest holds nothing of others, so it has nothing to hand over; and what
            // it would hand over is not to be trusted.
            ToCoord::Adopt | ToCoord::Held { .. } if self.conns[pos].guest => {}
            ToCoord::Hello { sockets: n, .. } if self.conns[pos].guest && fds.len() > n as usize => {
                let mut fds = fds;
                fds.truncate(n as usize);
                self.message(id, m, fds);
            }
            ToCoord::Hello { sockets: n, .. } if fds.len() > n as usize => {
                let mut fds = fds;
                let kept = fds.split_off(n as usize);
                // It holds a previous coordinator's sockets until told what to hold here.
                self.conns[pos].hold_sent = None;
                self.adopt(kept);
                self.message(id, m, fds);
            }
            ToCoord::Adopt => {
                // It holds a previous coordinator's sockets until told what to hold here.
                self.conns[pos].hold_sent = None;
                self.holders_dirty = true;
                self.adopt(fds);
            }
            ToCoord::Held { generation } => {
                let c = &mut self.conns[pos];
                c.hold_acked = c.hold_acked.max(generation);
            }
            ToCoord::Hello { slot: 0, .. } if self.grace_until.is_some() => {
                self.conns[pos].deferred = Some((m, fds));
            }
            ToCoord::Hello { pid, slot: want, sockets: _, listeners } => {
                if self.conns[pos].slot != 0 {
                    return;
                }
                let guest = self.conns[pos].guest;
                if guest {
                    // A guest's sockets are ones a coordinator of this user made for its
                    // slot: those made here, or (after a failover) any whose locked
                    // filter keeps that slot's datagrams only. Nothing else: another
                    // slot's, or a socket of the guest's own, is refused.
                    let issued = self.conns[pos].issued;
                    let made_here: BTreeSet<Ino> = self.conns[pos].sockets.iter().map(|s| s.ino).collect();
                    let ok = want != 0
                        && (issued == 0 || issued == want)
                        && !fds.is_empty()
                        && fds.iter().all(|fd| {
                            if issued != 0 {
                                inode(fd.as_fd()).is_some_and(|i| made_here.contains(&i))
                            } else {
                                is_guest_socket(fd.as_fd(), want, self.uid)
                            }
                        });
                    if !ok {
                        tracing::warn!(
                            target: "softrdma::host",
                            "refused process {pid} of another user: its hello claims slot {want} with sockets not made for it"
                        );
                        return self.send(id, &ToMember::Welcome { slot: 0, errno: libc::EPERM });
                    }
                }
                let mut sockets = Vec::with_capacity(fds.len());
                for fd in fds {
                    match Sock::new(fd, self.port) {
                        Some(s) => sockets.push(s),
                        None => return self.send(id, &ToMember::Welcome { slot: 0, errno: libc::EINVAL }),
                    }
                }
                if guest && self.conns[pos].issued != 0 {
                    // The copies made here stand (the same sockets).
                    sockets = std::mem::take(&mut self.conns[pos].sockets);
                }
                let slot = if want != 0 {
                    if want >= MAX_SLOTS || self.slot_taken(want, id) {
                        return self.send(id, &ToMember::Welcome { slot: 0, errno: libc::EADDRINUSE });
                    }
                    self.claim(want)
                } else if let Some(s) = self.fresh_slot() {
                    s
                } else {
                    return self.send(id, &ToMember::Welcome { slot: 0, errno: libc::ENOSPC });
                };
                let listeners: BTreeSet<u64> =
                    listeners.into_iter().filter(|&s| self.service_owner(s).is_none()).collect();
                // Its sockets may be held as tombstones already (adopted from a holder
                // after a failover): they are its own again.
                self.tombstones.retain(|t| !sockets.iter().any(|s| s.ino == t.0.ino));
                let c = &mut self.conns[pos];
                c.slot = slot;
                c.issued = 0;
                c.pid = pid;
                c.joined = started(pid);
                c.reclaimed = want != 0;
                if c.reclaimed {
                    // It may hold the previous coordinator's set.
                    c.hold_sent = None;
                }
                c.sockets = sockets;
                c.listeners = listeners;
                c.awaiting = true;
                self.dirty = true;
                self.holders_dirty = true;
                self.send(id, &ToMember::Welcome { slot, errno: 0 });
            }
            ToCoord::Listen { id: req, service } => {
                let errno = match self.service_owner(service) {
                    Some(owner) if owner != id => libc::EADDRINUSE,
                    _ if self.conns[pos].slot == 0 => libc::ENOTCONN,
                    _ => {
                        self.conns[pos].listeners.insert(service);
                        if self.tables().values().any(|t| t.program_len() > steer::MAX_INSNS) {
                            self.conns[pos].listeners.remove(&service);
                            libc::ENOSPC
                        } else {
                            0
                        }
                    }
                };
                if errno != 0 {
                    return self.send(id, &ToMember::Reply { id: req, errno });
                }
                self.pending_replies.push((id, req));
                if self.round.is_none() {
                    self.install();
                    self.reply_pending();
                }
            }
            ToCoord::Unlisten { id: req, service } => {
                if self.conns[pos].listeners.remove(&service) && self.round.is_none() {
                    self.install();
                }
                self.send(id, &ToMember::Reply { id: req, errno: 0 });
            }
            ToCoord::ProbeAnswer { index, nonce } => {
                let slot = self.conns[pos].slot;
                let Some(round) = self.round.as_mut() else { return };
                if slot == 0 || round.nonces.get(&nonce).is_none_or(|&(_, i)| i != index) {
                    return;
                }
                let addr = round.nonces[&nonce].0;
                let found = round.found.entry(addr).or_default();
                if found.contains_key(&index) {
                    // A second answer for one probe (a duplicate): the first stands.
                    return;
                }
                if found.values().any(|&s| s == slot) {
                    // This member's socket got the probes of two indices: they were
                    // hashed, not steered. The round cannot complete; it times out and
                    // is retried.
                    round.conflicts.insert((addr, slot));
                    return;
                }
                found.insert(index, slot);
                if round.complete() {
                    self.finish_round(true);
                    if self.dirty {
                        self.start_round();
                    }
                }
            }
        }
    }

    fn probe_socket(&mut self, v4: bool) -> io::Result<&UdpSocket> {
        let slot = if v4 { &mut self.probe_v4 } else { &mut self.probe_v6 };
        if slot.is_none() {
            let any: IpAddr = if v4 { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
            *slot = Some(UdpSocket::bind((any, 0))?);
        }
        Ok(slot.as_ref().expect("just set"))
    }

    /// Sends one probe per index of every group; the members report which they received.
    fn start_round(&mut self) {
        self.dirty = false;
        if self.compact() {
            // The closed tombstones leave their groups (and the last sockets move) only
            // once every holder has closed its copies: probe after that.
            self.sync_holders();
            if !self.holders_settled() {
                self.settling = Some(Instant::now() + HOLD_TIMEOUT);
                return;
            }
        }
        self.probe();
    }

    /// The probes of a round (see [`start_round`](Self::start_round)).
    fn probe(&mut self) {
        let mut expected: BTreeMap<SocketAddr, usize> = BTreeMap::new();
        let mut members: BTreeMap<SocketAddr, BTreeSet<u32>> = BTreeMap::new();
        for c in self.conns.iter().filter(|c| c.slot != 0) {
            for s in &c.sockets {
                *expected.entry(s.addr).or_default() += 1;
                if !c.silent {
                    members.entry(s.addr).or_default().insert(c.slot);
                }
            }
        }
        // Tombstones and refused processes' sockets take indices too (never answered).
        for s in self.tombstones.iter().map(|t| &t.0).chain(self.conns.iter().flat_map(|c| &c.foreign)) {
            if let Some(n) = expected.get_mut(&s.addr) {
                *n += 1;
            }
        }
        // So do sockets of the group that nothing here accounts for: a guest's, made by a
        // coordinator of this user that is gone, whose guest has not registered here (it
        // may be founding the group again, which this process's sockets hold up). Unprobed,
        // such a socket could hold an index this coordinator's own probes needed: a
        // process that founded the group anew waited 5 s and failed to join, its probe for
        // index 0 taken by the guest's socket there (CI, 2026-12-01 and 12-02). The port's
        // sockets of this user, as the kernel lists them, are the group.
        let ips: Vec<IpAddr> = expected.keys().map(SocketAddr::ip).collect();
        let listed = super::port_sockets(&ips, self.port);
        for (addr, n) in &mut expected {
            let held = listed.iter().filter(|s| s.uid == self.uid && s.local == addr.ip()).count();
            *n = (*n).max(held);
        }
        // Probes reach the socket at the index they carry only through the probe rule of
        // the group's program. A group this coordinator has not programmed yet (new, or
        // found after a failover) may have no program: the kernel would hash every probe
        // (one source, one destination) to the same socket. Attach a program first: the
        // probe rule and nothing steered, until this round tells where each slot is.
        // After a failover, a group where a member re-claims its slot has the previous
        // coordinator's program: it routes probes and keeps steering meanwhile.
        let unprogrammed: BTreeSet<SocketAddr> =
            expected.keys().filter(|a| !self.index_of.contains_key(*a)).copied().collect();
        let reclaimed =
            |a: &SocketAddr| self.conns.iter().any(|c| c.reclaimed && c.sockets.iter().any(|s| s.addr == *a));
        let fresh: BTreeSet<SocketAddr> = unprogrammed.iter().filter(|a| !reclaimed(a)).copied().collect();
        for &addr in &fresh {
            self.index_of.insert(addr, BTreeMap::new());
        }
        self.install_groups(Some(&fresh));
        let mut round = Round {
            nonces: HashMap::new(),
            expected,
            members,
            found: BTreeMap::new(),
            conflicts: BTreeSet::new(),
            deadline: Instant::now() + ROUND_TIMEOUT,
        };
        let mut probes = Vec::new();
        for (&addr, &n) in &round.expected {
            for index in 0..n as u32 {
                let nonce = random_u64();
                round.nonces.insert(nonce, (addr, index));
                let ip = match addr.ip() {
                    IpAddr::V4(ip) if ip.is_unspecified() => Ipv4Addr::LOCALHOST.into(),
                    IpAddr::V6(ip) if ip.is_unspecified() => Ipv6Addr::LOCALHOST.into(),
                    ip => ip,
                };
                // set_ip keeps a link-local group's scope, without which it is unreachable.
                let mut dst = addr;
                dst.set_ip(ip);
                probes.push((dst, steer::probe(index, nonce)));
            }
        }
        self.round = Some(round);
        for (dst, p) in probes {
            if let Ok(s) = self.probe_socket(dst.is_ipv4()) {
                let _ = s.send_to(&p, dst);
            }
        }
        if self.round.as_ref().is_some_and(|r| r.expected.is_empty()) {
            self.finish_round(true);
        }
    }

    fn finish_round(&mut self, complete: bool) {
        let Some(round) = self.round.take() else { return };
        let live: BTreeSet<u32> = self.conns.iter().map(|c| c.slot).filter(|&s| s != 0).collect();
        let mut index_of = BTreeMap::new();
        for (&addr, &n) in &round.expected {
            let mut found = round.found.get(&addr).cloned().unwrap_or_default();
            found.retain(|_, s| !round.conflicts.contains(&(addr, *s)));
            let mut map: BTreeMap<u32, u32> = found.iter().map(|(&i, &s)| (s, i)).collect();
            // Keep the last known index of members that did not answer (a round that timed
            // out, or silent members), where no one else answered for it: the best guess
            // until they answer.
            let taken: BTreeSet<u32> = found.keys().copied().collect();
            if let Some(old) = self.index_of.get(&addr) {
                for (&s, &i) in old {
                    if live.contains(&s) && !map.contains_key(&s) && !taken.contains(&i) && (i as usize) < n {
                        map.insert(s, i);
                    }
                }
            }
            index_of.insert(addr, map);
        }
        if !complete {
            // Steered members that answered nothing are silent from now on; a joining one
            // keeps the rounds going instead (its probes may have been lost).
            let answered: BTreeSet<u32> = round.found.values().flat_map(|f| f.values().copied()).collect();
            for c in self.conns.iter_mut().filter(|c| c.slot != 0 && !c.awaiting && !answered.contains(&c.slot)) {
                c.silent = round.members.values().any(|m| m.contains(&c.slot)) || c.silent;
            }
        }
        self.index_of = index_of;
        self.install();
        if complete {
            self.retries = 0;
        } else if self.retries < MAX_RETRIES || self.conns.iter().any(|c| c.awaiting) {
            // A member still waiting to be steered (its `join` waits) keeps the rounds
            // going; the others get a few retries.
            self.retries += 1;
            self.dirty = true;
        }
        let steered: Vec<u64> = self
            .conns
            .iter()
            .filter(|c| {
                c.awaiting
                    && c.sockets.iter().all(|s| self.index_of.get(&s.addr).is_some_and(|m| m.contains_key(&c.slot)))
            })
            .map(|c| c.id)
            .collect();
        for id in steered {
            if let Some(c) = self.conns.iter_mut().find(|c| c.id == id) {
                c.awaiting = false;
            }
            self.send(id, &ToMember::Steered);
        }
        self.reply_pending();
    }

    fn reply_pending(&mut self) {
        for (id, req) in std::mem::take(&mut self.pending_replies) {
            self.send(id, &ToMember::Reply { id: req, errno: 0 });
        }
    }

    /// The table of every group, from the last learned indices and the listeners.
    fn tables(&self) -> BTreeMap<SocketAddr, Table> {
        let mut tables = BTreeMap::new();
        for (&addr, map) in &self.index_of {
            let mut t = Table { slots: map.clone(), ..Table::default() };
            for c in &self.conns {
                if let Some(&i) = map.get(&c.slot) {
                    for &s in &c.listeners {
                        t.services.insert(s, i);
                    }
                }
            }
            // REQs nobody listens for go to this process's own socket (it answers REJ 8 for
            // as long as it coordinates), or to another live member's.
            let me = std::process::id();
            let in_group = self
                .conns
                .iter()
                .filter_map(|c| Some((c.guest, c.pid != me, *map.get(&c.slot).filter(|_| c.slot != 0)?)));
            if let Some((.., i)) = in_group.min() {
                t.unlistened = i;
            }
            tables.insert(addr, t);
        }
        tables
    }

    /// Generates and attaches the program of every group.
    fn install(&mut self) {
        self.installed_at = Instant::now();
        self.install_groups(None);
    }

    /// Generates and attaches the program of the groups in `only` (all when `None`).
    fn install_groups(&mut self, only: Option<&BTreeSet<SocketAddr>>) {
        for (addr, table) in self.tables() {
            if only.is_some_and(|o| !o.contains(&addr)) {
                continue;
            }
            let Some(code) = steer::program(&table) else { continue };
            // A guest's socket is locked: the program goes through one of this user's.
            let ours = self.conns.iter().flat_map(|c| &c.sockets).chain(self.tombstones.iter().map(|t| &t.0));
            let Some(fd) = ours.filter(|s| s.addr == addr && !s.locked).map(|s| &s.fd).next() else {
                continue;
            };
            let code: Vec<(u16, u8, u8, u32)> = code.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect();
            // Failing leaves the previous program; the next change tries again.
            if crate::sys::attach_reuseport_cbpf(fd.as_fd(), &code).is_err() {
                self.attach_errors += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::{Duration, Instant};

    use super::*;

    /// A guest's socket leaves its place (the group founded again) while a thread polls it
    /// without a timeout, as an idle progress thread does: the thread wakes, and the socket
    /// closes once it has. The guest's locked filter dropped the byte that used to wake it,
    /// and the socket stayed in its group for good, connected to nobody's waker.
    #[test]
    fn a_thread_polling_a_guest_socket_wakes_when_the_socket_is_replaced() {
        let port = 20_000 + (super::super::random_u64() % 12_000) as u16;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let socket = std::sync::Arc::new(
            crate::RoceSocket::adopt(make_guest_socket(addr, 3).unwrap(), &crate::Config::default()).unwrap(),
        );
        let ino = super::super::inode(socket.as_fd()).unwrap().1;
        let poller = {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut fds = [rustix::event::PollFd::new(&*socket, rustix::event::PollFlags::IN)];
                rustix::event::poll(&mut fds, None).unwrap();
            })
        };
        // The thread is in `poll` by then (nothing but a readable socket ends it).
        std::thread::sleep(Duration::from_millis(50));
        socket.vacate().unwrap();
        let start = Instant::now();
        while !poller.is_finished() {
            assert!(start.elapsed() < Duration::from_secs(2), "the poller still sleeps on the guest socket");
            std::thread::sleep(Duration::from_millis(1));
        }
        poller.join().unwrap();
        // Connected or not (the wake connects it), it is gone from the kernel's list.
        let listed = std::fs::read_to_string("/proc/net/udp").unwrap();
        let inodes: Vec<&str> = listed.lines().skip(1).filter_map(|l| l.split_whitespace().nth(9)).collect();
        assert!(!inodes.contains(&ino.to_string().as_str()), "the replaced socket left the port");
    }
}
