//! A look inside every live context of the host: what `softrdma res` shows, as
//! `rdma res show qp|cq|mr|pd|srq|cm_id` does for a kernel device.
//!
//! A kernel device's objects live in the kernel, which any process may ask through netlink;
//! softrdma's live in each application. So each open [`Context`](crate::Context) answers
//! questions itself: it listens on a Unix socket beside its counters file
//! ([`crate::stats`]), `<pid>-<n>.sock` next to `<pid>-<n>.stats`, and a reader that
//! connects gets one JSON [`Answer`]: a [`Snapshot`] of the context's QPs, CQs, MRs, PDs,
//! SRQs and CM IDs, taken under the device lock, then the connection closes. [`scan`] asks
//! every live context of [`stats_dir()`](crate::stats::stats_dir) at once.
//!
//! # Who answers, and what it costs
//!
//! A thread of its own per context, blocked in `poll(2)` on the socket and a stop eventfd:
//! nothing on the data path changes, and a context nobody asks costs a sleeping thread
//! (and its stack, 256 KiB reserved, a few pages touched). The progress thread is not it:
//! it spins without polling any descriptor while busy, so it would have to look for
//! questions on a timer, and writing an answer to a slow reader would stall the device's
//! packets (docs/architecture.md, "A look inside").
//!
//! # Bounds
//!
//! - The answer thread waits at most [`LOCK_WAIT`] for the device lock (a wedged
//!   application that holds it gets an [`Answer::Error`]), and takes [`ANSWER_WRITE`] at
//!   most to write the answer (a reader that stops reading loses it).
//! - Each table holds at most [`MAX_ROWS`] rows; [`Snapshot::truncated`] says when one had
//!   more.
//! - A reader waits [`QUERY_TIMEOUT`] at most per context, and asks them all at once, so a
//!   stopped or wedged process delays it by that much and is reported, never hangs it; a
//!   dead process's socket refuses the connection at once.
//!
//! # Keys
//!
//! A context answers its own user and root only ([`may_see_keys`]): users of one host stay
//! apart (docs/architecture.md, "Many users, one host"), so another user learns nothing of
//! its registrations, queues or peers (the kernel shows other users' rows without their
//! keys; softrdma shows none). The answering context reads its reader's credentials
//! (`SO_PEERCRED`, given by the kernel, not by the reader); another user gets an error.
//! Its counters file, by which readers find the socket, is its user's alone (mode 0600).
//! The socket is mode 0666: who may look is decided per reader.
//!
//! A reader checks in turn that the answer came from the process that published the
//! counters file (`SO_PEERCRED` of the socket's listener): a socket that another process
//! made under that name (the directory is world-writable) is refused.

use std::fmt::Write as _;
use std::io::{self, Read as _};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use serde::{Deserialize, Serialize};
use softrdma_cm::Nic;
use softrdma_engine::{Access, QpType};

use crate::driver::Shared;
use crate::stats::{self, Published};

/// The version of [`Answer`]'s JSON. A reader skips answers of another version, naming it.
pub const ANSWER_VERSION: u32 = 1;
/// Rows of each table an answer holds at most.
pub const MAX_ROWS: usize = 4096;
/// How long the answer thread waits for the device lock.
pub const LOCK_WAIT: Duration = Duration::from_millis(500);
/// How long the answer thread writes an answer at most.
pub const ANSWER_WRITE: Duration = Duration::from_secs(1);
/// How long [`scan`] waits for one context's answer.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest answer a reader takes (far above [`MAX_ROWS`] rows of every table).
const ANSWER_MAX_BYTES: u64 = 32 << 20;
/// Contexts asked at once.
const PARALLEL_QUERIES: usize = 64;
/// The answer thread's stack (it serialises a snapshot; nothing recursive).
const THREAD_STACK: usize = 256 << 10;

/// What a context answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// What it holds.
    Snapshot(Snapshot),
    /// Why it could not say (its device lock stayed held, say).
    Error {
        /// The answer's format, [`ANSWER_VERSION`].
        version: u32,
        /// What went wrong.
        message: String,
    },
}

/// One context's objects at one instant (under its device lock).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The answer's format, [`ANSWER_VERSION`].
    pub version: u32,
    /// The process.
    pub pid: u32,
    /// Its effective user.
    pub uid: u32,
    /// Its command name (`/proc/<pid>/comm`).
    pub command: String,
    /// The device (`softrdma_lo`).
    pub device: String,
    /// The UDP port the context uses.
    pub port: u16,
    /// Whether MR keys and addresses are included ([`may_see_keys`]).
    pub keys_shown: bool,
    /// Some table had more than [`MAX_ROWS`] rows; the rest were left out.
    pub truncated: bool,
    /// Protection domains.
    pub pds: Vec<PdRow>,
    /// Completion queues.
    pub cqs: Vec<CqRow>,
    /// Queue pairs.
    pub qps: Vec<QpRow>,
    /// Memory regions.
    pub mrs: Vec<MrRow>,
    /// Shared receive queues.
    pub srqs: Vec<SrqRow>,
    /// rdma_cm IDs.
    pub cm_ids: Vec<CmIdRow>,
}

/// A protection domain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PdRow {
    /// Its number.
    pub pdn: u32,
    /// MRs, MWs, QPs, SRQs and AHs in it.
    pub users: u32,
}

/// A completion queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CqRow {
    /// Its number.
    pub cqn: u32,
    /// Its depth (`cqe`).
    pub cqe: u32,
    /// Completions queued, not polled yet.
    pub entries: u32,
    /// QPs whose completions go to it.
    pub users: u32,
    /// Armed for a completion event.
    pub armed: bool,
    /// It overflowed (its QPs went to the error state).
    pub overflowed: bool,
}

/// A queue pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpRow {
    /// Its number.
    pub lqpn: u32,
    /// `RC`, `UC`, `UD`, `XRC_INI`, `XRC_TGT`.
    #[serde(rename = "type")]
    pub qp_type: String,
    /// `RESET`, `INIT`, `RTR`, `RTS`, `SQD`, `SQE`, `ERR`.
    pub state: String,
    /// Its PD.
    pub pdn: u32,
    /// The CQ of its send completions.
    pub scqn: u32,
    /// The CQ of its receive completions.
    pub rcqn: u32,
    /// Its SRQ, if it has one.
    pub srqn: Option<u32>,
    /// The path MTU in bytes.
    pub path_mtu: u32,
    /// The next PSN it sends.
    pub sq_psn: u32,
    /// The oldest PSN it sent and has no ACK for (RC; `sq_psn` when none).
    pub unacked_psn: u32,
    /// The next PSN it expects.
    pub rq_psn: u32,
    /// Send WRs posted, not completed.
    pub sq_posted: u32,
    /// The send queue's depth.
    pub sq_depth: u32,
    /// Receive WRs posted, not consumed.
    pub rq_posted: u32,
    /// The receive queue's depth.
    pub rq_depth: u32,
    /// RC: messages sent (at least in part), not complete.
    pub msgs_in_flight: u32,
    /// RC: packets sent, not acknowledged.
    pub pkts_in_flight: u32,
    /// READs and atomics sent, not answered.
    pub rd_atomic_in_flight: u32,
    /// The local ACK timeout exponent (4.096 µs × 2^timeout; 0: none).
    pub timeout: u8,
    /// `retry_cnt`, and retries left for the head message.
    pub retry_cnt: u8,
    /// See `retry_cnt`.
    pub retries_left: u8,
    /// `rnr_retry` (7 = forever), and RNR retries left for the head message.
    pub rnr_retry: u8,
    /// See `rnr_retry`.
    pub rnr_retries_left: u8,
    /// Waiting out an RNR NAK's timer.
    pub rnr_waiting: bool,
    /// Local ACK timeouts.
    pub ack_timeouts: u64,
    /// Packets sent again.
    pub retransmitted_pkts: u64,
    /// RNR NAKs received.
    pub rnr_naks_rcvd: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// NAKs (not RNR) received.
    pub naks_rcvd: u64,
    /// NAKs (not RNR) sent.
    pub naks_sent: u64,
    /// The peer of a connected QP, once it has one.
    pub peer: Option<PeerRow>,
    /// Its Q_Key (UD).
    pub qkey: u32,
    /// Authenticated mode.
    pub authenticated: bool,
}

/// A connected QP's peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRow {
    /// The peer's GID (`::ffff:127.0.0.1`).
    pub gid: String,
    /// The peer's QPN.
    pub rqpn: u32,
    /// This side's address.
    pub local_ip: Option<String>,
    /// The UDP port its packets go to.
    pub udp_port: Option<u16>,
    /// The UDP source port the peer's packets come from, once seen.
    pub peer_udp_port: Option<u16>,
}

/// A memory region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MrRow {
    /// Its index in the device's table.
    pub mrn: u32,
    /// Its PD.
    pub pdn: u32,
    /// Its local key: `None` for a reader of another user ([`may_see_keys`]).
    pub lkey: Option<u32>,
    /// Its remote key: `None` likewise.
    pub rkey: Option<u32>,
    /// The address peers name it by: `None` likewise.
    pub iova: Option<u64>,
    /// Its length in bytes.
    pub mrlen: u64,
    /// Its access flags (`LOCAL_WRITE|REMOTE_READ`).
    pub access: String,
    /// Memory windows bound to it.
    pub windows: u32,
}

/// A shared receive queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SrqRow {
    /// Its number.
    pub srqn: u32,
    /// `BASIC` or `XRC`.
    #[serde(rename = "type")]
    pub srq_type: String,
    /// Its PD.
    pub pdn: u32,
    /// Its depth.
    pub wqe: u32,
    /// Receives posted, not consumed.
    pub posted: u32,
    /// SGEs per receive.
    pub max_sge: u32,
    /// The armed limit (0: none).
    pub limit: u32,
    /// An XRC SRQ's domain and completion queue.
    pub xrcd: Option<u32>,
    /// See `xrcd`.
    pub cqn: Option<u32>,
    /// The QPs that receive from it.
    pub lqpns: Vec<u32>,
}

/// An rdma_cm ID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmIdRow {
    /// Its number.
    pub cm_idn: u32,
    /// Its rdma_cm state, as the kernel names it (`LISTEN`, `CONNECT`, `DISCONNECT`).
    pub state: String,
    /// The IB CM exchange's state (`REQ_SENT`, `ESTABLISHED`, `TIMEWAIT`, `IDLE`).
    pub cm_state: String,
    /// Its port space (`TCP`, `UDP`, `IB`, `IPOIB`).
    pub ps: String,
    /// The type of QP it was made for.
    pub qp_type: String,
    /// Its QP, once it has one.
    pub lqpn: Option<u32>,
    /// The peer's QPN, once the exchange gave it.
    pub rqpn: Option<u32>,
    /// Its local address.
    pub src_addr: Option<String>,
    /// The peer's address.
    pub dst_addr: Option<String>,
    /// Made for an incoming request.
    pub passive: bool,
    /// The service ID (hexadecimal).
    pub service_id: String,
}

/// Whether a reader of user `reader_uid` may see the MR keys and addresses of a process of
/// user `owner_uid`: its own user, or root (module documentation, "Keys").
pub fn may_see_keys(reader_uid: u32, owner_uid: u32) -> bool {
    reader_uid == 0 || reader_uid == owner_uid
}

/// What a snapshot is made of, copied out of the NIC under the device lock: plain values
/// only, so that the lock is held for the copies alone, not for the formatting.
pub(crate) struct Raw {
    qps: Vec<softrdma_engine::QpInfo>,
    pds: Vec<(softrdma_engine::PdId, u32)>,
    cqs: Vec<softrdma_engine::CqInfo>,
    mrs: Vec<softrdma_engine::MrInfo>,
    srqs: Vec<softrdma_engine::SrqInfo>,
    cm_ids: Vec<(softrdma_cm::CmIdInfo, Option<softrdma_wire::Qpn>)>,
    truncated: bool,
}

impl Raw {
    /// Copies what `nic` holds, [`MAX_ROWS`] of each kind at most (the device lock held).
    pub(crate) fn take(nic: &Nic) -> Raw {
        let engine = nic.engine();
        let cm = nic.cm();
        let ids = cm.ids();
        let truncated = [engine.qp_count(), engine.pds().count(), engine.cqs().count(), engine.mrs().count()]
            .into_iter()
            .chain([engine.srqs().count(), ids.len()])
            .any(|n| n > MAX_ROWS);
        Raw {
            qps: engine.qps().take(MAX_ROWS).collect(),
            pds: engine.pds().take(MAX_ROWS).collect(),
            cqs: engine.cqs().take(MAX_ROWS).collect(),
            mrs: engine.mrs().take(MAX_ROWS).collect(),
            srqs: engine.srqs().take(MAX_ROWS).collect(),
            cm_ids: ids.iter().take(MAX_ROWS).filter_map(|&id| Some((cm.id_info(id)?, nic.attached_qp(id)))).collect(),
            truncated,
        }
    }

    /// The snapshot, with MR keys and addresses if `keys`.
    pub(crate) fn snapshot(self, keys: bool, device: &str, port: u16) -> Snapshot {
        let qps: Vec<QpRow> = self.qps.into_iter().map(qp_row).collect();
        let pds = self.pds.into_iter().map(|(pd, users)| PdRow { pdn: pd.0, users }).collect();
        let cqs = self
            .cqs
            .into_iter()
            .map(|c| CqRow {
                cqn: c.cq.0,
                cqe: c.depth,
                entries: c.queued,
                users: c.users,
                armed: c.armed,
                overflowed: c.overflowed,
            })
            .collect();
        let mrs = self
            .mrs
            .into_iter()
            .map(|m| MrRow {
                mrn: m.index,
                pdn: m.pd.0,
                lkey: keys.then_some(m.lkey.0),
                rkey: keys.then_some(m.rkey.0),
                iova: keys.then_some(m.iova),
                mrlen: m.length,
                access: access_names(m.access),
                windows: m.windows,
            })
            .collect();
        let srqs = self
            .srqs
            .into_iter()
            .map(|s| SrqRow {
                srqn: s.srq.0,
                srq_type: if s.xrc.is_some() { "XRC" } else { "BASIC" }.to_string(),
                pdn: s.pd.0,
                wqe: s.depth,
                posted: s.queued,
                max_sge: s.max_sge,
                limit: s.limit,
                xrcd: s.xrc.map(|(x, _)| x.0),
                cqn: s.xrc.map(|(_, c)| c.0),
                lqpns: qps.iter().filter(|q| q.srqn == Some(s.srq.0)).map(|q| q.lqpn).collect(),
            })
            .collect();
        let cm_ids = self
            .cm_ids
            .into_iter()
            .map(|(i, qp)| CmIdRow {
                cm_idn: i.id.0,
                state: i.state.rdma_cm_name().to_string(),
                cm_state: i.state.ib_cm_name().to_string(),
                ps: i.ps.to_string(),
                qp_type: i.qp_type.short_name().to_string(),
                lqpn: qp.map(|q| q.value()),
                rqpn: i.remote_qpn,
                src_addr: i.local.map(|a| a.to_string()),
                dst_addr: i.peer.map(|a| a.to_string()),
                passive: i.passive,
                service_id: format!("{:#018x}", i.service_id),
            })
            .collect();
        Snapshot {
            version: ANSWER_VERSION,
            pid: std::process::id(),
            uid: rustix::process::geteuid().as_raw(),
            command: std::fs::read_to_string("/proc/self/comm").unwrap_or_default().trim_end().to_string(),
            device: device.to_string(),
            port,
            keys_shown: keys,
            truncated: self.truncated,
            pds,
            cqs,
            qps,
            mrs,
            srqs,
            cm_ids,
        }
    }
}

fn qp_row(q: softrdma_engine::QpInfo) -> QpRow {
    QpRow {
        lqpn: q.qpn.value(),
        qp_type: q.qp_type.short_name().to_string(),
        state: q.state.short_name().to_string(),
        pdn: q.pd.0,
        scqn: q.send_cq.0,
        rcqn: q.recv_cq.0,
        srqn: q.srq.map(|s| s.0),
        path_mtu: q.path_mtu.bytes(),
        sq_psn: q.sq_psn.value(),
        unacked_psn: q.unacked_psn.value(),
        rq_psn: q.rq_psn.value(),
        sq_posted: q.send_queued,
        sq_depth: q.send_depth,
        rq_posted: q.recv_queued,
        rq_depth: q.recv_depth,
        msgs_in_flight: q.messages_in_flight,
        pkts_in_flight: q.packets_in_flight,
        rd_atomic_in_flight: q.rd_atomic_outstanding,
        timeout: q.timeout,
        retry_cnt: q.retry_cnt,
        retries_left: q.retries_left,
        rnr_retry: q.rnr_retry,
        rnr_retries_left: q.rnr_retries_left,
        rnr_waiting: q.rnr_waiting,
        ack_timeouts: q.counters.ack_timeouts,
        retransmitted_pkts: q.counters.retransmitted_packets,
        rnr_naks_rcvd: q.counters.rnr_naks_rcvd,
        rnr_naks_sent: q.counters.rnr_naks_sent,
        naks_rcvd: q.counters.naks_rcvd,
        naks_sent: q.counters.naks_sent,
        peer: q.peer.map(|p| PeerRow {
            gid: p.gid.to_string(),
            rqpn: p.qpn.value(),
            local_ip: p.local_ip.map(|ip| ip.to_string()),
            udp_port: p.udp_port,
            peer_udp_port: p.source_port,
        }),
        qkey: if q.qp_type == QpType::Ud { q.qkey } else { 0 },
        authenticated: q.authenticated,
    }
}

/// `LOCAL_WRITE|REMOTE_READ`, as `IBV_ACCESS_*` names them; `0` for none.
pub fn access_names(access: Access) -> String {
    const NAMES: [(Access, &str); 9] = [
        (Access::LOCAL_WRITE, "LOCAL_WRITE"),
        (Access::REMOTE_WRITE, "REMOTE_WRITE"),
        (Access::REMOTE_READ, "REMOTE_READ"),
        (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        (Access::MW_BIND, "MW_BIND"),
        (Access::ZERO_BASED, "ZERO_BASED"),
        (Access::ON_DEMAND, "ON_DEMAND"),
        (Access::FLUSH_GLOBAL, "FLUSH_GLOBAL"),
        (Access::FLUSH_PERSISTENT, "FLUSH_PERSISTENT"),
    ];
    let mut out = String::new();
    let mut rest = access.0;
    for (flag, name) in NAMES {
        if access.contains(flag) {
            if !out.is_empty() {
                out.push('|');
            }
            out.push_str(name);
            rest &= !flag.0;
        }
    }
    if rest != 0 {
        let _ = write!(out, "{}{rest:#x}", if out.is_empty() { "" } else { "|" });
    }
    if out.is_empty() { "0".to_string() } else { out }
}

// ---- the answering side ----------------------------------------------------------------------

/// A context's answer socket and the thread that serves it; removed when dropped.
pub(crate) struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    /// The process that made it (a child of `fork` has a copy of the handle, not the
    /// thread, and must neither join it nor remove the socket).
    pid: u32,
}

impl Server {
    /// Listens on `path` and starts the thread that answers for the device `shared` is of.
    /// `None` (and nothing to show for this context) if the socket cannot be made.
    pub(crate) fn start(path: PathBuf, shared: Weak<Shared>, device: String, port: u16) -> Option<Server> {
        let listener = bind(&path).ok()?;
        let stop = Arc::new(AtomicBool::new(false));
        let wake = match rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        ) {
            Ok(fd) => Arc::new(fd),
            Err(_) => {
                let _ = std::fs::remove_file(&path);
                return None;
            }
        };
        let (thread_stop, thread_wake) = (Arc::clone(&stop), Arc::clone(&wake));
        let thread = std::thread::Builder::new()
            .name("softrdma-res".into())
            .stack_size(THREAD_STACK)
            .spawn(move || serve(&listener, &thread_stop, &thread_wake, &shared, &device, port));
        match thread {
            Ok(t) => Some(Server { path, stop, wake, thread: Some(t), pid: std::process::id() }),
            Err(_) => {
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            return; // the parent's: its thread and socket stay the parent's
        }
        self.stop.store(true, Ordering::Release);
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds a listening socket at `path`, mode 0666 (who sees what is decided per reader). A
/// socket of this user left there (by a dead process with this pid) is replaced.
fn bind(path: &Path) -> io::Result<UnixListener> {
    let listener = match UnixListener::bind(path) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            std::fs::remove_file(path)?;
            UnixListener::bind(path)?
        }
        r => r?,
    };
    let made = (|| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
        listener.set_nonblocking(true)
    })();
    match made {
        Ok(()) => Ok(listener),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
}

/// The answer thread: one question at a time, until `stop`.
fn serve(listener: &UnixListener, stop: &AtomicBool, wake: &OwnedFd, shared: &Weak<Shared>, device: &str, port: u16) {
    while !stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(listener, PollFlags::IN), PollFd::new(wake, PollFlags::IN)];
        if rustix::event::poll(&mut fds, None).is_err() {
            continue; // EINTR
        }
        if !fds[1].revents().is_empty() {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(wake, &mut b);
            continue;
        }
        // Every connection queued, each bounded in time: a busy reader cannot keep the
        // thread from seeing `stop` for more than one answer.
        while let Ok((stream, _)) = listener.accept() {
            answer(&stream, shared, device, port);
            if stop.load(Ordering::Acquire) {
                return;
            }
        }
    }
}

/// Answers one reader: its credentials decide the keys; the snapshot is taken under the
/// device lock ([`LOCK_WAIT`] at most), then written ([`ANSWER_WRITE`] at most).
fn answer(stream: &UnixStream, shared: &Weak<Shared>, device: &str, port: u16) {
    let owner = rustix::process::geteuid().as_raw();
    // No credentials: a reader of unknown user sees nothing.
    let keys = rustix::net::sockopt::socket_peercred(stream).is_ok_and(|c| may_see_keys(c.uid.as_raw(), owner));
    let answer = match shared.upgrade() {
        _ if !keys => {
            Answer::Error { version: ANSWER_VERSION, message: "a context answers its own user and root only".into() }
        }
        None => Answer::Error { version: ANSWER_VERSION, message: "the context is closing".into() },
        Some(shared) => {
            let deadline = Instant::now() + LOCK_WAIT;
            let locked = loop {
                match shared.try_lock() {
                    Some(st) => break Some(st),
                    None if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(50)),
                    None => break None,
                }
            };
            // Only the copies under the lock; the rows are formatted after it.
            let raw = locked.map(|st| Raw::take(&st.nic));
            match raw {
                Some(raw) => Answer::Snapshot(raw.snapshot(keys, device, port)),
                None => Answer::Error {
                    version: ANSWER_VERSION,
                    message: format!("its device lock stayed taken for {LOCK_WAIT:?} (a thread stuck in a verb?)"),
                },
            }
        }
    };
    let Ok(bytes) = serde_json::to_vec(&answer) else { return };
    write_within(stream, &bytes, ANSWER_WRITE);
}

/// Writes `bytes` to the non-blocking `stream` within `limit`; gives up after it.
fn write_within(stream: &UnixStream, bytes: &[u8], limit: Duration) {
    use rustix::net::SendFlags;
    let deadline = Instant::now() + limit;
    let mut at = 0;
    // Each round writes something or waits for room; both are bounded by the deadline,
    // and a round count bounds a peer that takes one byte at a time.
    for _ in 0..100_000 {
        if at == bytes.len() {
            return;
        }
        match rustix::net::send(stream, &bytes[at..], SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(n) => at += n,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return;
                }
                let mut fds = [PollFd::new(stream, PollFlags::OUT)];
                let ts =
                    rustix::event::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
                let _ = rustix::event::poll(&mut fds, Some(&ts));
            }
            Err(_) => return, // the reader left
        }
    }
}

// ---- the asking side -------------------------------------------------------------------------

/// One live context, and what it answered.
#[derive(Clone, Debug)]
pub struct Reply {
    /// Its counters file's header: pid, command, device, port.
    pub published: Published,
    /// Its snapshot, or why there is none (no answer in time, no socket, an error).
    pub result: Result<Snapshot, String>,
}

/// What [`scan`] found.
#[derive(Clone, Debug, Default)]
pub struct ResScan {
    /// Every live context that `want` chose, in file-name order.
    pub contexts: Vec<Reply>,
    /// Files of processes that are gone, removed.
    pub stale: usize,
    /// Counters files that could not be read, and why.
    pub skipped: Vec<(PathBuf, String)>,
    /// Contexts of other users, which this reader may not look at.
    pub other_users: usize,
}

/// Asks every live context in [`stats_dir()`](crate::stats::stats_dir) that `want` chooses
/// (by its pid, device...) for its snapshot, all at once, [`QUERY_TIMEOUT`] at most each.
pub fn scan(want: impl Fn(&Published) -> bool) -> io::Result<ResScan> {
    scan_dir(&stats::stats_dir(), want, QUERY_TIMEOUT)
}

/// [`scan`] of `dir`, waiting `timeout` at most for each answer.
pub fn scan_dir(dir: &Path, want: impl Fn(&Published) -> bool, timeout: Duration) -> io::Result<ResScan> {
    let (found, paths) = stats::scan_dir_with_paths(dir)?;
    let chosen: Vec<(Published, PathBuf)> =
        found.live.into_iter().zip(paths).filter(|(p, _)| want(p)).map(|(p, path)| (p, socket_path(&path))).collect();
    let mut contexts = Vec::with_capacity(chosen.len());
    for batch in chosen.chunks(PARALLEL_QUERIES) {
        let results: Vec<Result<Snapshot, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = batch.iter().map(|(p, sock)| s.spawn(move || query(sock, p.pid, timeout))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("the query panicked".into()))).collect()
        });
        contexts.extend(batch.iter().zip(results).map(|((p, _), result)| Reply { published: p.clone(), result }));
    }
    Ok(ResScan { contexts, stale: found.stale, skipped: found.skipped, other_users: found.other_users })
}

/// The answer socket of the context whose counters file is `stats_file`.
pub fn socket_path(stats_file: &Path) -> PathBuf {
    stats_file.with_extension("sock")
}

/// Asks the context listening on `socket` for its snapshot, within `timeout`; `pid` is the
/// process that must be answering (the counters file's).
pub fn query(socket: &Path, pid: u32, timeout: Duration) -> Result<Snapshot, String> {
    let deadline = Instant::now() + timeout;
    let stream = connect(socket, timeout).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => "no answer socket (a softrdma older than `softrdma res`, or opened just now)".into(),
        io::ErrorKind::ConnectionRefused => "its answer socket refused (the process is exiting)".to_string(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("no answer within {timeout:?} (the process is stopped or its answer thread is stuck)")
        }
        _ => format!("connecting to {}: {e}", socket.display()),
    })?;
    let cred =
        rustix::net::sockopt::socket_peercred(&stream).map_err(|e| format!("reading the answer's sender: {e}"))?;
    let from = cred.pid.as_raw_nonzero().get() as u32;
    if from != pid {
        return Err(format!("{} belongs to pid {from}, not to pid {pid}: ignored", socket.display()));
    }
    let mut bytes = Vec::new();
    let mut reader = (&stream).take(ANSWER_MAX_BYTES + 1);
    let mut buf = [0u8; 64 << 10];
    // Each read waits until the deadline at most, and the answer is bounded in size.
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no answer within {timeout:?} (the process is stopped or busy)"));
        }
        stream.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(format!("no answer within {timeout:?} (the process is stopped or busy)"));
            }
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
    }
    if bytes.len() as u64 > ANSWER_MAX_BYTES {
        return Err(format!("an answer larger than {ANSWER_MAX_BYTES} bytes: ignored"));
    }
    if bytes.is_empty() {
        return Err("the process closed the connection without answering (exiting?)".into());
    }
    let version = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.as_object()?.values().next()?.get("version")?.as_u64());
    if version.is_some_and(|v| v != u64::from(ANSWER_VERSION)) {
        return Err(format!(
            "answer version {}; this softrdma reads version {ANSWER_VERSION} (use the softrdma of that process)",
            version.unwrap_or_default()
        ));
    }
    match serde_json::from_slice::<Answer>(&bytes) {
        Ok(Answer::Snapshot(s)) => Ok(s),
        Ok(Answer::Error { message, .. }) => Err(message),
        Err(e) => Err(format!("an answer that does not parse: {e}")),
    }
}

/// Connects to `path`, waiting `timeout` at most for room in its backlog (a stopped
/// process's fills up).
fn connect(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType, sockopt};
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    // A blocking Unix connect waits for backlog room up to the send timeout.
    sockopt::set_socket_timeout(&fd, sockopt::Timeout::Send, Some(timeout))?;
    let addr = SocketAddrUnix::new(path)?;
    rustix::net::connect(&fd, &addr)?;
    Ok(UnixStream::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_for_the_owner_and_root_only() {
        assert!(may_see_keys(1000, 1000));
        assert!(may_see_keys(0, 1000), "root sees every process's keys");
        assert!(!may_see_keys(1001, 1000), "another user does not");
        assert!(!may_see_keys(65534, 0), "nobody does not see root's");
    }

    #[test]
    fn access_flags_read_as_their_ibv_names() {
        assert_eq!(access_names(Access::ALL), "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC");
        assert_eq!(access_names(Access(0)), "0");
        assert_eq!(access_names(Access::REMOTE_READ | Access(1 << 20)), "REMOTE_READ|0x100000");
    }
}
