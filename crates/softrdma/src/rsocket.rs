//! rsockets: stream sockets over RC queue pairs, speaking librdmacm's rsocket protocol
//! (`librdmacm/rsocket.c`), so that an [`RSocket`] talks to an rsocket of rdma-core on a
//! kernel rxe device or a NIC.
//!
//! The protocol, as rdma-core defines it:
//! - **Connection.** rdma_cm over port space TCP; the REQ's and REP's private data are
//!   [`ConnData`] (40 bytes: version 1, flags, receive credits, the iomap size, the
//!   *target SGL* and the first half of the receive buffer).
//! - **Data.** Each side has a receive buffer it hands out in halves. The sender RDMA WRITEs
//!   with immediate data into the half it was last given, the immediate (`op << 29 |
//!   length`, op [`OP_DATA`]) consuming one of the receiver's zero-length receives, which
//!   tells the receiver how much arrived. A write never crosses the end of a half.
//! - **Credits.** A message consumes one receive (credit) and part of a half. The receiver
//!   gives both back together: when half of its buffer is free again it RDMA WRITEs the next
//!   half's address, key and length into the sender's *target SGL* (two entries, used in
//!   turn) with immediate [`OP_SGL`] carrying the new receive-sequence limit; with only
//!   receives to give back, the same immediate on a zero-length write.
//! - **Control.** Immediate [`OP_CTRL`] on a zero-length write: disconnect (both
//!   directions closed), shutdown (the sender's direction closed), keepalive.
//! - **Direct I/O** (`riomap`/`riowrite`): a side may publish registered regions into the
//!   peer's *target iomap* (entries after the target SGL, [`OP_IOMAP_SGL`]); the peer then
//!   RDMA WRITEs into them without immediate data.
//!
//! Every rsocket has its own CM event channel, whose descriptor is the socket's number, as
//! in rdma-core ([`RSocket::fd`]): it never equals another open file's.

use std::collections::VecDeque;
use std::io;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;

mod keepalive;

use crate::{
    Access, CmEvent, CmEventKind, CmId, CmStatus, CompChannel, ConnParam, Cq, Error, EventChannel, Mr, Pd, PortSpace,
    Qp, QpCap, QpInit, QpType, RKey, RecvWr, Result, SendFlags, SendOp, SendWr, Sge, WcStatus,
};

/// Immediate data: data written into the receive buffer (bits 28..0: its length).
pub const OP_DATA: u32 = 0;
/// Not sent: a direct (iomap) write, as its send completion's tag.
pub const OP_WRITE: u32 = 2;
/// Immediate data: credits (bits 28..0: the new receive-sequence limit), and with a
/// payload, a new target SGL entry.
pub const OP_SGL: u32 = 4;
/// Immediate data: an iomap entry was written (bits 15..0: its index).
pub const OP_IOMAP_SGL: u32 = 6;
/// Immediate data: a control message ([`CTRL_DISCONNECT`], ...).
pub const OP_CTRL: u32 = 7;
/// Control: the peer closed both directions.
pub const CTRL_DISCONNECT: u32 = 0;
/// Control: keepalive (nothing to do for its receiver; see `keepalive`).
pub const CTRL_KEEPALIVE: u32 = 1;
/// Control: the peer will send no more.
pub const CTRL_SHUTDOWN: u32 = 2;

/// The protocol version of [`ConnData`].
pub const VERSION: u8 = 1;
/// [`ConnData::flags`]: the sender's host is big-endian.
pub const CONN_FLAG_NET: u8 = 1;
/// [`ConnData::flags`]: the sender has a target iomap after its target SGL.
pub const CONN_FLAG_IOMAP: u8 = 2;
/// Entries of the target SGL.
const SGL_SIZE: usize = 2;
/// Bytes of one `rs_sge` (address, key, length).
const SGE_BYTES: usize = 16;
/// Bytes of one `rs_iomap` (offset, then an `rs_sge`).
const IOMAP_BYTES: usize = 24;
/// A send waits for this much room in the send buffer (rdma-core's `RS_SNDLOWAT`).
const SNDLOWAT: u32 = 2048;
/// The first transfer of a send is this long, doubling up to [`MAX_TRANSFER`].
const OLAP_START: u32 = 2048;
const MAX_TRANSFER: u32 = 65536;
/// Send-queue entries kept for control messages (`RS_QP_CTRL_SIZE`).
const QP_CTRL_SIZE: u32 = 4;
const QP_MIN_SIZE: u32 = 16;
const QP_MAX_SIZE: u32 = 0xfffe;
/// Receive work requests carry this bit in `wr_id`.
const WR_RECV: u64 = 1 << 63;
/// How long a blocking call polls before it sleeps (rdma-core's `polling_time`, µs).
const POLLING_TIME: Duration = Duration::from_micros(10);

/// `op` and `data` as immediate data (host order).
pub const fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1fff_ffff)
}

/// rdma-core's 8-bit scale of sizes above 128 (`rs_value_to_scale`).
pub fn value_to_scale(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) { value } else { (1 << (bits - 1)) | (value >> bits) }
}

/// The inverse of [`value_to_scale`] (`rs_scale_to_value`).
pub fn scale_to_value(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) { value } else { (value & !(1 << (bits - 1))) << bits }
}

/// An `rs_sge`: where the peer may write, as address, key and length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RsSge {
    /// Virtual address.
    pub addr: u64,
    /// R_Key.
    pub key: u32,
    /// Bytes.
    pub length: u32,
}

impl RsSge {
    fn to_host_bytes(self, swap: bool) -> [u8; SGE_BYTES] {
        let mut b = [0u8; SGE_BYTES];
        if swap {
            b[0..8].copy_from_slice(&self.addr.to_be_bytes());
            b[8..12].copy_from_slice(&self.key.to_be_bytes());
            b[12..16].copy_from_slice(&self.length.to_be_bytes());
        } else {
            b[0..8].copy_from_slice(&self.addr.to_ne_bytes());
            b[8..12].copy_from_slice(&self.key.to_ne_bytes());
            b[12..16].copy_from_slice(&self.length.to_ne_bytes());
        }
        b
    }

    fn from_host_bytes(b: &[u8]) -> RsSge {
        RsSge {
            addr: u64::from_ne_bytes(b[0..8].try_into().expect("8 bytes")),
            key: u32::from_ne_bytes(b[8..12].try_into().expect("4 bytes")),
            length: u32::from_ne_bytes(b[12..16].try_into().expect("4 bytes")),
        }
    }
}

/// `struct rs_conn_data`, the private data of an rsocket's REQ and REP (big-endian on the
/// wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnData {
    /// [`VERSION`].
    pub version: u8,
    /// [`CONN_FLAG_NET`], [`CONN_FLAG_IOMAP`].
    pub flags: u8,
    /// Receives the sender posted: messages the peer may send before more credits.
    pub credits: u16,
    /// The sender's target iomap entries, scaled ([`value_to_scale`]).
    pub target_iomap_size: u8,
    /// The sender's target SGL: where the peer writes new receive-buffer halves.
    pub target_sgl: RsSge,
    /// The first half of the sender's receive buffer.
    pub data_buf: RsSge,
}

impl ConnData {
    /// Its 40 bytes.
    pub const LEN: usize = 40;

    /// The wire bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.target_iomap_size;
        for (at, s) in [(8, self.target_sgl), (24, self.data_buf)] {
            b[at..at + 8].copy_from_slice(&s.addr.to_be_bytes());
            b[at + 8..at + 12].copy_from_slice(&s.key.to_be_bytes());
            b[at + 12..at + 16].copy_from_slice(&s.length.to_be_bytes());
        }
        b
    }

    /// Parses the first 40 bytes of `b`; `None` if it is shorter.
    pub fn decode(b: &[u8]) -> Option<ConnData> {
        if b.len() < Self::LEN {
            return None;
        }
        let sge = |at: usize| RsSge {
            addr: u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes")),
            key: u32::from_be_bytes(b[at + 8..at + 12].try_into().expect("4 bytes")),
            length: u32::from_be_bytes(b[at + 12..at + 16].try_into().expect("4 bytes")),
        };
        Some(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: sge(8),
            data_buf: sge(24),
        })
    }
}

/// Flags of [`RSocket::send_with`] and [`RSocket::recv_with`] (`MSG_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgFlags {
    /// `MSG_DONTWAIT`: fail with `EAGAIN` rather than wait.
    pub dontwait: bool,
    /// `MSG_PEEK`: copy, but leave the data queued.
    pub peek: bool,
    /// `MSG_WAITALL`: wait for the whole buffer (or the end of the stream).
    pub waitall: bool,
}

/// Events of [`RSocket::poll_ready`] and [`poll`], as `poll(2)`'s bits.
pub mod events {
    /// Data to read, a connection to accept, or the end of the stream.
    pub const IN: i16 = 0x001;
    /// Room to send.
    pub const OUT: i16 = 0x004;
    /// A failed connection.
    pub const ERR: i16 = 0x008;
    /// The peer disconnected.
    pub const HUP: i16 = 0x010;
}

/// Sizes a socket is created with (`rsetsockopt` before the connection; rdma-core's
/// defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Send buffer bytes (`SO_SNDBUF` × 2).
    pub sbuf: u32,
    /// Receive buffer bytes (`SO_RCVBUF` × 2).
    pub rbuf: u32,
    /// Send queue depth (`RDMA_SQSIZE`).
    pub sq: u32,
    /// Receive queue depth: the credits given to the peer (`RDMA_RQSIZE`).
    pub rq: u32,
    /// Inline bytes (`RDMA_INLINE`).
    pub inline: u32,
    /// Target iomap entries offered to the peer (`RDMA_IOMAPSIZE`).
    pub iomap: u32,
}

impl Default for Sizes {
    /// rdma-core's defaults, except the buffers: 1 MiB each rather than 128 KiB. A credit
    /// (half the receive buffer) costs a round trip between two user-space devices, which
    /// is slower than between NICs: iperf3 through librspreload on 127.0.0.1 went from
    /// 1.9 to 4.0 Gb/s. The peer learns the sizes from the connection's data, so either
    /// side may use any.
    fn default() -> Self {
        Sizes { sbuf: 1 << 20, rbuf: 1 << 20, sq: 384, rq: 384, inline: 64, iomap: 0 }
    }
}

/// Where rdma-core's rsockets read their defaults (`RS_CONF_DIR`).
pub const CONF_DIR: &str = "/etc/rdma/rsocket";

impl Sizes {
    /// The defaults, with what `dir` (rdma-core's files: `mem_default`, `wmem_default`,
    /// `sqsize_default`, `rqsize_default`, `inline_default`, `iomap_size`) sets instead.
    pub fn from_config(dir: &std::path::Path) -> Sizes {
        let read = |name: &str| -> Option<u32> { std::fs::read_to_string(dir.join(name)).ok()?.trim().parse().ok() };
        let mut s = Sizes::default();
        if let Some(v) = read("mem_default") {
            s.rbuf = v.max(2 * 4096);
        }
        if let Some(v) = read("wmem_default") {
            s.sbuf = if v < SNDLOWAT { SNDLOWAT << 1 } else { v };
        }
        if let Some(v) = read("sqsize_default") {
            s.sq = v.clamp(QP_MIN_SIZE, QP_MAX_SIZE);
        }
        if let Some(v) = read("rqsize_default") {
            s.rq = v.clamp(QP_MIN_SIZE, QP_MAX_SIZE);
        }
        if let Some(v) = read("inline_default") {
            s.inline = v.min(256);
        }
        if let Some(v) = read("iomap_size") {
            s.iomap = scale_to_value(value_to_scale(v.min(0xffff), 8), 8);
        }
        s
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Init,
    Bound,
    Listening,
    ResolvingAddr,
    ResolvingRoute,
    Connecting,
    Connected,
    ConnectError,
    Disconnected,
    Error,
}

/// What a connected socket holds: its QP, buffers and the protocol's counters.
struct Conn {
    qp: Qp,
    cq: Cq,
    channel: CompChannel,
    pd: Pd,
    sbuf: Mr,
    rbuf: Mr,
    /// The target SGL (two entries) then the target iomap: the peer writes here.
    target: Mr,
    /// Entries of the target iomap.
    target_iomap_size: u32,
    /// The peer's byte order differs: SGEs written to it are byte-swapped.
    swap: bool,

    // send side
    sbuf_size: u32,
    /// Where the next send's bytes go in `sbuf` (a ring).
    sbuf_pos: u32,
    sbuf_bytes_avail: u32,
    sqe_avail: u32,
    sq_size: u32,
    sq_inline: u32,
    sseq_no: u16,
    sseq_comp: u16,
    /// The entry of the target SGL the next data write goes to.
    target_sge: usize,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,

    // receive side
    rbuf_size: u32,
    rq_size: u32,
    /// Lengths of the messages received and not yet read.
    rmsgs: VecDeque<u32>,
    rbuf_offset: u32,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rseq_no: u16,
    rseq_comp: u16,
    /// The peer's target SGL and the entry our next credit goes to.
    remote_sgl: RsSge,
    remote_sge: u32,
    /// The peer's target iomap.
    remote_iomap: RsSge,
    /// Regions published to the peer's iomap (index, region, offset), and those waiting
    /// to be sent.
    iomaps: Vec<IoMap>,
    cq_armed: bool,
}

struct IoMap {
    index: Option<u32>,
    mr: crate::RawMr,
    offset: u64,
    sent: bool,
}

struct State {
    phase: Phase,
    readable: bool,
    writable: bool,
    nonblocking: bool,
    sizes: Sizes,
    conn: Option<Conn>,
    /// Where `connect` goes.
    dst: Option<SocketAddr>,
    /// The error of a failed connection (`SO_ERROR`), taken once.
    err: i32,
    /// Options recorded for `getsockopt` (`SO_REUSEADDR`, `TCP_NODELAY`, ...).
    pub_opts: Vec<(i32, i32, i32)>,
    /// `SO_KEEPALIVE`: the keepalive thread sends this socket's ([`keepalive`]).
    keepalive: bool,
    /// `TCP_KEEPIDLE`, seconds between keepalives (0 until set or until keepalives are
    /// turned on, which takes the kernel's `tcp_keepalive_time`, as rdma-core does).
    keepalive_idle: u32,
}

/// An rsocket (`SOCK_STREAM`): an RC QP connected by rdma_cm, speaking rdma-core's
/// rsocket protocol. `Send + Sync`: `send` and `recv` may run in two threads at once.
pub struct RSocket {
    events: EventChannel,
    /// An accepted socket's first channel, the listener thread's (see `renumber`).
    early: Option<EventChannel>,
    id: CmId,
    st: Arc<Mutex<State>>,
    /// A listener's accepted connections.
    backlog: Mutex<Option<Arc<Backlog>>>,
    /// One thread at a time sleeps on the completion channel.
    wait_lock: Mutex<()>,
}

impl std::fmt::Debug for RSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RSocket").field("fd", &self.fd()).finish()
    }
}

fn errno(e: Errno, what: impl Into<String>) -> Error {
    Error::io(what, io::Error::from(e))
}

/// The `errno` an error of this module stands for (`EAGAIN`, `ECONNRESET`, ...), if it is
/// a system error.
pub fn os_error(e: &Error) -> Option<i32> {
    match e {
        Error::Io { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

fn would_block(what: &str) -> Error {
    errno(Errno::AGAIN, format!("{what}: the rsocket is non-blocking and would wait"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Conn {
    fn target_entry(&self, i: usize) -> Result<RsSge> {
        let mut b = [0u8; SGE_BYTES];
        self.target.read(i * SGE_BYTES, &mut b)?;
        Ok(RsSge::from_host_bytes(&b))
    }

    fn set_target_entry(&self, i: usize, s: RsSge) -> Result<()> {
        self.target.write(i * SGE_BYTES, &s.to_host_bytes(false))
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT.min(self.sbuf_size)
            && self.sseq_no != self.sseq_comp
            && self.target_entry(self.target_sge).is_ok_and(|e| e.length != 0)
    }

    fn all_sends_done(&self) -> bool {
        self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno) + self.sqe_avail == self.sq_size
    }

    fn post(&self, wr_id: u64, op: SendOp, sgl: &[Sge], flags: SendFlags) -> Result<()> {
        self.qp.post_send(&[SendWr { wr_id, op, sg_list: sgl, flags, ud: None, xrc_srqn: None }])
    }

    /// A zero-length WRITE with immediate `m` (`rs_post_msg`).
    fn post_msg(&self, m: u32) -> Result<()> {
        let op = SendOp::RdmaWriteWithImm { remote_addr: 0, rkey: RKey(0), imm: m.to_be_bytes() };
        self.post(u64::from(m), op, &[], SendFlags(0))
    }

    fn post_recv(&self) -> Result<()> {
        self.qp.post_recv(&[RecvWr { wr_id: WR_RECV, sg_list: &[] }])
    }

    /// Sends credits, and the free half of the receive buffer when there is one
    /// (`rs_send_credits`).
    fn send_credits(&mut self) -> Result<()> {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add((self.rq_size >> 1) as u16);
        let limit = u32::from(self.rseq_no.wrapping_add(self.rq_size as u16));
        if self.rbuf_bytes_avail >= self.rbuf_size >> 1 {
            let half = self.rbuf_size >> 1;
            let sge = RsSge {
                addr: self.rbuf.addr() + u64::from(self.rbuf_free_offset),
                key: self.rbuf.rkey(),
                length: half,
            };
            let bytes = sge.to_host_bytes(self.swap);
            let m = msg(OP_SGL, limit);
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: self.remote_sgl.addr + u64::from(self.remote_sge) * SGE_BYTES as u64,
                rkey: RKey(self.remote_sgl.key),
                imm: m.to_be_bytes(),
            };
            let sgl =
                [Sge { addr: bytes.as_ptr() as usize as u64, length: SGE_BYTES as u32, lkey: Default::default() }];
            self.post(u64::from(m), op, &sgl, SendFlags::INLINE)?;
            self.rbuf_bytes_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge == self.remote_sgl.length {
                self.remote_sge = 0;
            }
            Ok(())
        } else {
            self.post_msg(msg(OP_SGL, limit))
        }
    }

    fn give_credits(&self, connected: bool) -> bool {
        (self.rbuf_bytes_avail >= self.rbuf_size >> 1 || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && connected
    }
}

impl State {
    fn connected(&self) -> bool {
        self.phase == Phase::Connected
    }

    fn update_credits(&mut self) {
        let connected = self.connected();
        if let Some(c) = self.conn.as_mut() {
            if c.give_credits(connected) && c.send_credits().is_err() {
                self.phase = Phase::Error;
                self.readable = false;
                self.writable = false;
            }
        }
    }

    fn disconnected(&mut self) {
        self.phase = Phase::Disconnected;
        self.readable = false;
        self.writable = false;
    }

    /// The connection failed: the error state, `SO_ERROR` `EIO`.
    fn failed(&mut self) {
        self.phase = Phase::Error;
        self.err = libc_eio();
        self.readable = false;
        self.writable = false;
    }

    /// A keepalive, if connected with a control slot free (`tcp_svc_send_keepalive`): a
    /// zero-length WRITE with immediate whose completion [`poll_cq`](State::poll_cq) takes
    /// as any control message's, an error one failing the connection.
    fn send_keepalive(&mut self) {
        // Turned off meanwhile (its entry goes with the call that turned it off).
        if !self.keepalive || !self.connected() {
            return;
        }
        let Some(c) = self.conn.as_mut() else { return };
        if !c.ctrl_avail() {
            return;
        }
        c.ctrl_seqno = c.ctrl_seqno.wrapping_add(1);
        if c.post_msg(msg(OP_CTRL, CTRL_KEEPALIVE)).is_err() {
            self.failed();
        }
    }

    /// Takes every completion (`rs_poll_cq`).
    fn poll_cq(&mut self) {
        let Some(c) = self.conn.as_mut() else { return };
        let mut rcnt = 0;
        let mut disconnect = false;
        let mut error = false;
        let mut wcs = [crate::EMPTY_WC; 16];
        loop {
            let n = c.cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                if wc.wr_id & WR_RECV != 0 {
                    if wc.status != WcStatus::Success {
                        continue;
                    }
                    rcnt += 1;
                    let m = u32::from_be_bytes(wc.imm_data.unwrap_or_default());
                    match m >> 29 {
                        OP_SGL => c.sseq_comp = (m & 0x1fff_ffff) as u16,
                        OP_IOMAP_SGL | OP_WRITE => {}
                        OP_CTRL => match m & 0x1fff_ffff {
                            CTRL_DISCONNECT => disconnect = true,
                            CTRL_SHUTDOWN => {
                                if self.writable {
                                    self.readable = false;
                                } else {
                                    disconnect = true;
                                }
                            }
                            _ => {}
                        },
                        _ => c.rmsgs.push_back(m & 0x1fff_ffff),
                    }
                } else {
                    let m = wc.wr_id as u32;
                    match m >> 29 {
                        OP_SGL => c.ctrl_max_seqno = c.ctrl_max_seqno.wrapping_add(1),
                        OP_CTRL => {
                            c.ctrl_max_seqno = c.ctrl_max_seqno.wrapping_add(1);
                            if m & 0x1fff_ffff == CTRL_DISCONNECT {
                                disconnect = true;
                            }
                        }
                        OP_IOMAP_SGL => {
                            c.sqe_avail += 1;
                            c.sbuf_bytes_avail += IOMAP_BYTES as u32;
                        }
                        _ => {
                            c.sqe_avail += 1;
                            c.sbuf_bytes_avail += m & 0x1fff_ffff;
                        }
                    }
                    if wc.status != WcStatus::Success {
                        error = true;
                    }
                }
            }
            // Until a poll finds nothing: a poll of an empty CQ receives in this thread and
            // returns one of the completions that made, leaving the others queued (a CQ then
            // armed over them would never fire: iperf3's select slept on both sides).
            if n == 0 {
                break;
            }
        }
        if self.phase == Phase::Connected {
            for _ in 0..rcnt {
                if c.post_recv().is_err() {
                    error = true;
                    break;
                }
            }
        }
        if disconnect {
            self.disconnected();
        } else if error && self.phase == Phase::Connected {
            self.failed();
        }
    }

    fn have_rdata(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.rmsgs.is_empty())
    }

    fn conn_have_rdata(&self) -> bool {
        self.have_rdata() || !self.readable
    }

    fn can_send(&self) -> bool {
        self.conn.as_ref().is_some_and(Conn::can_send)
    }

    fn conn_can_send(&self) -> bool {
        self.can_send() || !self.writable
    }
}

fn libc_eio() -> i32 {
    Errno::IO.raw_os_error()
}

/// What a blocking step waits for.
type Test = fn(&State) -> bool;

impl RSocket {
    /// `rsocket(AF_INET or AF_INET6, SOCK_STREAM, 0)`.
    pub fn new() -> Result<RSocket> {
        let events = EventChannel::new()?;
        let id = events.create_id(PortSpace::TCP, QpType::Rc)?;
        Ok(Self::from_parts(events, id, Sizes::from_config(std::path::Path::new(CONF_DIR)), Phase::Init))
    }

    fn from_parts(events: EventChannel, id: CmId, sizes: Sizes, phase: Phase) -> RSocket {
        RSocket {
            events,
            early: None,
            id,
            backlog: Mutex::new(None),
            st: Arc::new(Mutex::new(State {
                phase,
                readable: false,
                writable: false,
                nonblocking: false,
                sizes,
                conn: None,
                dst: None,
                err: 0,
                pub_opts: Vec::new(),
                keepalive: false,
                keepalive_idle: 0,
            })),
            wait_lock: Mutex::new(()),
        }
    }

    /// The socket's number: its CM event channel's descriptor, as rdma-core's.
    pub fn fd(&self) -> RawFd {
        self.events.as_fd().as_raw_fd()
    }

    /// The sizes it will connect with.
    pub fn sizes(&self) -> Sizes {
        lock(&self.st).sizes
    }

    /// Sets the sizes; only before the connection (`EINVAL` after).
    pub fn set_sizes(&self, sizes: Sizes) -> Result<()> {
        let mut st = lock(&self.st);
        if st.conn.is_some() {
            return Err(errno(Errno::INVAL, "rsetsockopt: buffer and queue sizes are fixed once connected"));
        }
        let mut s = sizes;
        s.sbuf = s.sbuf.max(SNDLOWAT * 2);
        s.rbuf = s.rbuf.max(2 * 4096);
        s.sq = s.sq.clamp(QP_MIN_SIZE, QP_MAX_SIZE);
        s.rq = s.rq.clamp(QP_MIN_SIZE, QP_MAX_SIZE);
        s.inline = s.inline.min(256);
        s.iomap = scale_to_value(value_to_scale(s.iomap.min(0xffff), 8), 8);
        st.sizes = s;
        Ok(())
    }

    /// `O_NONBLOCK` (`rfcntl(F_SETFL)`).
    pub fn set_nonblocking(&self, on: bool) {
        lock(&self.st).nonblocking = on;
    }

    /// Whether `O_NONBLOCK` is set.
    pub fn nonblocking(&self) -> bool {
        lock(&self.st).nonblocking
    }

    /// `SO_KEEPALIVE`: sends a keepalive every [`keepalive_idle`](Self::keepalive_idle)
    /// seconds from now on (the kernel's `tcp_keepalive_time` if none was set), while
    /// connected, so that a peer gone without a word fails the connection (`POLLERR`,
    /// `SO_ERROR` `EIO`) instead of leaving it waiting ([`keepalive`]). Fails only if the
    /// keepalive thread cannot start.
    pub fn set_keepalive(&self, on: bool) -> Result<()> {
        let idle = {
            let mut st = lock(&self.st);
            if st.keepalive == on {
                return Ok(());
            }
            if on && st.keepalive_idle == 0 {
                st.keepalive_idle = keepalive::default_idle();
            }
            st.keepalive = on;
            st.keepalive_idle
        };
        if !on {
            keepalive::cancel(&self.st);
            return Ok(());
        }
        keepalive::schedule(&self.st, Duration::from_secs(u64::from(idle))).inspect_err(|_| {
            lock(&self.st).keepalive = false;
        })
    }

    /// Whether keepalives are on (`SO_KEEPALIVE`).
    pub fn keepalive(&self) -> bool {
        lock(&self.st).keepalive
    }

    /// `TCP_KEEPIDLE`: seconds between keepalives, at least 1 (`EINVAL` otherwise); with
    /// keepalives on, the next comes that long from now.
    pub fn set_keepalive_idle(&self, seconds: i32) -> Result<()> {
        let Ok(idle @ 1..) = u32::try_from(seconds) else {
            return Err(errno(Errno::INVAL, format!("rsetsockopt TCP_KEEPIDLE: {seconds} s; it takes 1 s or more")));
        };
        let on = {
            let mut st = lock(&self.st);
            st.keepalive_idle = idle;
            st.keepalive
        };
        if on { keepalive::schedule(&self.st, Duration::from_secs(u64::from(idle))) } else { Ok(()) }
    }

    /// `TCP_KEEPIDLE` (0 if neither it nor `SO_KEEPALIVE` was ever set, as rdma-core's).
    pub fn keepalive_idle(&self) -> u32 {
        lock(&self.st).keepalive_idle
    }

    /// Records an option value for [`option`](Self::option) (options rsockets accept and
    /// need not act on: `SO_REUSEADDR`, `TCP_NODELAY`, ...).
    pub fn set_option(&self, level: i32, name: i32, value: i32) {
        let mut st = lock(&self.st);
        st.pub_opts.retain(|&(l, n, _)| (l, n) != (level, name));
        st.pub_opts.push((level, name, value));
    }

    /// A value recorded by [`set_option`](Self::set_option) (0 if never set).
    pub fn option(&self, level: i32, name: i32) -> i32 {
        lock(&self.st).pub_opts.iter().find(|&&(l, n, _)| (l, n) == (level, name)).map_or(0, |&(_, _, v)| v)
    }

    /// `SO_ERROR`: the error that ended the connection attempt, cleared.
    pub fn take_error(&self) -> i32 {
        std::mem::take(&mut lock(&self.st).err)
    }

    /// `rbind`.
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        self.id.bind_addr(addr)?;
        lock(&self.st).phase = Phase::Bound;
        Ok(())
    }

    /// `rlisten`. Connection requests are accepted at once, by a thread of the listener
    /// (as rdma-core's `cm_svc` does), so that a peer's `rconnect` completes before this
    /// side's [`accept`](Self::accept), as a TCP connect does with the kernel's backlog.
    pub fn listen(&self, backlog: u32) -> Result<()> {
        let mut st = lock(&self.st);
        if st.phase == Phase::Listening {
            return Ok(());
        }
        self.id.listen(backlog.max(1))?;
        let (reader, writer) = UnixStream::pair().map_err(|e| Error::io("rlisten: the accept queue", e))?;
        for end in [&reader, &writer] {
            end.set_nonblocking(true).map_err(|e| Error::io("rlisten: the accept queue", e))?;
        }
        let queue = Arc::new(Backlog { ready: Mutex::new(VecDeque::new()), reader, stop: AtomicBool::new(false) });
        let (events, shared, q) = (self.events.clone(), Arc::clone(&self.st), Arc::clone(&queue));
        std::thread::Builder::new()
            .name("softrdma-rlisten".into())
            .spawn(move || accept_loop(&events, &shared, &q, &writer))
            .map_err(|e| Error::io("rlisten: starting the accepting thread", e))?;
        *lock(&self.backlog) = Some(queue);
        st.phase = Phase::Listening;
        Ok(())
    }

    /// The local address (`rgetsockname`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// The peer's address (`rgetpeername`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.peer_addr()
    }

    /// `raccept`: the next connection (blocking unless non-blocking).
    pub fn accept(&self) -> Result<RSocket> {
        let queue = lock(&self.backlog).clone();
        let Some(queue) = queue else {
            return Err(errno(Errno::INVAL, "raccept: the rsocket is not listening (call rlisten)"));
        };
        loop {
            if let Some(rs) = queue.pop() {
                return rs.renumber();
            }
            if lock(&self.st).nonblocking {
                return Err(would_block("raccept"));
            }
            let mut fds = [PollFd::new(&queue.reader, PollFlags::IN)];
            let _ = rustix::event::poll(&mut fds, None);
        }
    }

    /// Gives an accepted socket its number now, in the thread of `raccept`: a descriptor
    /// opened after whatever the caller opened before (librspreload opens its own
    /// placeholder first, and its `select` maps numbers back assuming the rsocket's is the
    /// larger: one numbered by the listener's thread, earlier, was reported under its own
    /// number, which iperf3 never asked for). The first channel stays, for its events.
    fn renumber(mut self) -> Result<RSocket> {
        let fresh = EventChannel::new()?;
        self.id.migrate(&fresh);
        self.early = Some(std::mem::replace(&mut self.events, fresh));
        Ok(self)
    }

    /// Accepts a connection request for a listener with `sizes` (`rs_accept`).
    fn accept_request(event: CmEvent, sizes: Sizes) -> Result<RSocket> {
        let creq = ConnData::decode(&event.private_data);
        let Some(creq) = creq.filter(|c| c.version == VERSION) else {
            let _ = event.id.reject(&[]);
            return Err(errno(Errno::PROTO, "raccept: the connection request carries no rsocket version 1 data"));
        };
        let events = EventChannel::new()?;
        event.id.migrate(&events);
        let rs = RSocket::from_parts(events, event.id.clone(), sizes, Phase::Connected);
        {
            let mut st = lock(&rs.st);
            let mut conn = match rs.create_ep(&st.sizes) {
                Ok(c) => c,
                Err(e) => {
                    let _ = rs.id.reject(&[]);
                    return Err(e);
                }
            };
            save_conn_data(&mut conn, &creq)?;
            let cresp = format_conn_data(&conn);
            // A fresh parameter set: the request's own (its start PSN is the one the peer
            // expects from us) would be misread as ours.
            let param = conn_param(&cresp);
            if let Err(e) = rs.id.accept(&param) {
                let _ = rs.id.reject(&[]);
                return Err(e);
            }
            st.conn = Some(conn);
            st.readable = true;
            st.writable = true;
        }
        Ok(rs)
    }

    /// The QP, CQ and buffers of a connection (`rs_create_ep`), receives posted.
    fn create_ep(&self, sizes: &Sizes) -> Result<Conn> {
        let ctx = self.id.context().ok_or(Error::Unbound("rsocket: create the QP"))?;
        let max_wr = ctx.query_device().max_qp_wr.min(QP_MAX_SIZE);
        let sq = sizes.sq.clamp(QP_MIN_SIZE, max_wr);
        let rq = sizes.rq.clamp(QP_MIN_SIZE, max_wr);
        let pd = ctx.alloc_pd()?;
        let channel = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(sq + rq, Some(&channel))?;
        let cap = QpCap {
            max_send_wr: sq,
            max_recv_wr: rq,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: sizes.inline.max(IOMAP_BYTES as u32),
        };
        let init = QpInit { qp_type: QpType::Rc, send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: true };
        let qp = self.id.create_qp_with(&pd, &init)?;
        let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let sbuf = pd.reg_mr(sizes.sbuf as usize, Access::LOCAL_WRITE)?;
        let target = pd.reg_mr(SGE_BYTES * SGL_SIZE + IOMAP_BYTES * sizes.iomap as usize, remote)?;
        let rbuf = pd.reg_mr(sizes.rbuf as usize, remote)?;
        let conn = Conn {
            qp,
            cq,
            channel,
            pd,
            sbuf,
            rbuf,
            target,
            target_iomap_size: sizes.iomap,
            swap: false,
            sbuf_size: sizes.sbuf,
            sbuf_pos: 0,
            sbuf_bytes_avail: sizes.sbuf,
            sqe_avail: sq - QP_CTRL_SIZE,
            sq_size: sq,
            sq_inline: sizes.inline,
            sseq_no: 0,
            sseq_comp: 0,
            target_sge: 0,
            ctrl_seqno: 0,
            ctrl_max_seqno: QP_CTRL_SIZE,
            rbuf_size: sizes.rbuf,
            rq_size: rq,
            rmsgs: VecDeque::new(),
            rbuf_offset: 0,
            rbuf_bytes_avail: sizes.rbuf >> 1,
            rbuf_free_offset: sizes.rbuf >> 1,
            rseq_no: 0,
            rseq_comp: (rq >> 1) as u16,
            remote_sgl: RsSge::default(),
            remote_sge: 1,
            remote_iomap: RsSge::default(),
            iomaps: Vec::new(),
            cq_armed: false,
        };
        conn.cq.req_notify(false)?;
        for _ in 0..rq {
            conn.post_recv()?;
        }
        Ok(conn)
    }

    /// `rconnect`: blocking, or with `EINPROGRESS` when non-blocking (then poll for
    /// [`events::OUT`] and read [`take_error`](Self::take_error)).
    pub fn connect(&self, dst: SocketAddr) -> Result<()> {
        {
            let mut st = lock(&self.st);
            if matches!(st.phase, Phase::Init | Phase::Bound) {
                st.dst = Some(dst);
            }
        }
        if self.do_connect(None)? {
            Ok(())
        } else {
            Err(errno(Errno::INPROGRESS, "rconnect: the connection is in progress (non-blocking rsocket)"))
        }
    }

    /// Drives the connection as far as it goes (`rs_do_connect`): `Ok(true)` once
    /// connected, `Ok(false)` while it waits for the CM without blocking (`nonblock`, or
    /// the socket's `O_NONBLOCK`). A step that fails is an error, whatever its errno.
    fn do_connect(&self, nonblock: Option<bool>) -> Result<bool> {
        let mut st = lock(&self.st);
        let nonblock = nonblock.unwrap_or(st.nonblocking);
        loop {
            match st.phase {
                Phase::Init | Phase::Bound => {
                    let dst = st.dst.ok_or_else(|| errno(Errno::NOTCONN, "the rsocket is not connected"))?;
                    if let Err(e) = self.id.resolve_addr(None, dst) {
                        return Err(fail_connect(&mut st, e));
                    }
                    st.phase = Phase::ResolvingAddr;
                }
                Phase::ResolvingAddr | Phase::ResolvingRoute | Phase::Connecting => {
                    let wait = if nonblock { Some(Duration::ZERO) } else { None };
                    let Some(ev) = self.events.get_cm_event(wait)? else {
                        return Ok(false);
                    };
                    match (st.phase, ev.kind) {
                        (Phase::ResolvingAddr, CmEventKind::AddrResolved) => {
                            if let Err(e) = self.id.resolve_route() {
                                return Err(fail_connect(&mut st, e));
                            }
                            st.phase = Phase::ResolvingRoute;
                        }
                        (Phase::ResolvingRoute, CmEventKind::RouteResolved) => {
                            let conn = match self.create_ep(&st.sizes) {
                                Ok(c) => c,
                                Err(e) => return Err(fail_connect(&mut st, e)),
                            };
                            let creq = format_conn_data(&conn);
                            st.conn = Some(conn);
                            let param = conn_param(&creq);
                            if let Err(e) = self.id.connect(&param) {
                                return Err(fail_connect(&mut st, e));
                            }
                            st.phase = Phase::Connecting;
                        }
                        (Phase::Connecting, CmEventKind::Established) => {
                            let cresp = ConnData::decode(&ev.private_data).filter(|c| c.version == VERSION);
                            let Some(cresp) = cresp else {
                                let e =
                                    errno(Errno::NOTSUP, "rconnect: the peer answered without rsocket version 1 data");
                                return Err(fail_connect(&mut st, e));
                            };
                            let c = st.conn.as_mut().expect("created before the REQ");
                            if let Err(e) = save_conn_data(c, &cresp) {
                                return Err(fail_connect(&mut st, e));
                            }
                            st.phase = Phase::Connected;
                            st.readable = true;
                            st.writable = true;
                            return Ok(true);
                        }
                        (_, kind) => {
                            let n = match (kind, ev.status) {
                                (CmEventKind::Rejected, _) => Errno::CONNREFUSED,
                                (_, CmStatus::TimedOut) | (CmEventKind::Unreachable, _) => Errno::TIMEDOUT,
                                (CmEventKind::AddrError, _) => Errno::HOSTUNREACH,
                                (CmEventKind::RouteError, _) => Errno::NETUNREACH,
                                _ => Errno::CONNREFUSED,
                            };
                            let e = errno(n, format!("rconnect: {kind:?} ({:?})", ev.status));
                            return Err(fail_connect(&mut st, e));
                        }
                    }
                }
                Phase::Connected => return Ok(true),
                Phase::Listening => return Err(errno(Errno::INVAL, "rconnect on a listening rsocket")),
                Phase::ConnectError | Phase::Disconnected | Phase::Error => {
                    return Err(errno(Errno::NOTCONN, "the rsocket's connection failed or ended"));
                }
            }
        }
    }

    /// Makes sure a connection in progress has finished: `EAGAIN` (non-blocking) if not.
    fn ensure_connected(&self) -> Result<()> {
        let opening = matches!(
            lock(&self.st).phase,
            Phase::ResolvingAddr | Phase::ResolvingRoute | Phase::Connecting | Phase::Init | Phase::Bound
        );
        if !opening || self.do_connect(None)? {
            Ok(())
        } else {
            Err(would_block("the rsocket's connection is in progress"))
        }
    }

    /// Polls the CQ (and the CM) until `test` holds (`rs_get_comp`/`rs_process_cq`); with
    /// `nonblock`, `EAGAIN` if it does not at once.
    fn get_comp<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        nonblock: bool,
        test: Test,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        let start = Instant::now();
        loop {
            st.update_credits();
            // The CM first: a peer's DREQ comes after its last data, so every completion
            // before it is in the CQ by then; looked at after the CQ, a DREQ that came in
            // between hid that data (rstream -T a saw POLLHUP before its last bytes).
            self.check_cm(&mut st);
            st.poll_cq();
            if test(&st) {
                st.update_credits();
                return (st, Ok(()));
            }
            if st.conn.is_none() || matches!(st.phase, Phase::Error) {
                return (st, Err(errno(Errno::NOTCONN, "the rsocket is not connected")));
            }
            if nonblock {
                return (st, Err(would_block("rsocket")));
            }
            if start.elapsed() <= POLLING_TIME {
                continue;
            }
            let c = st.conn.as_mut().expect("checked above");
            if !c.cq_armed {
                if c.cq.req_notify(false).is_err() {
                    return (st, Err(errno(Errno::IO, "rsocket: arming the CQ failed")));
                }
                c.cq_armed = true;
                continue;
            }
            let channel = c.channel.clone();
            st.update_credits();
            drop(st);
            {
                let _w = lock(&self.wait_lock);
                let armed = lock(&self.st).conn.as_ref().is_some_and(|c| c.cq_armed);
                if armed {
                    // Bounded: a thread that lost the event to another waiter re-checks.
                    if let Ok(Some(_)) = channel.get_cq_event(Some(Duration::from_millis(100))) {
                        if let Some(c) = lock(&self.st).conn.as_mut() {
                            c.cq_armed = false;
                        }
                    }
                }
            }
            st = lock(&self.st);
        }
    }

    /// Takes the CM's events of a connected socket: the peer's disconnection.
    fn check_cm(&self, st: &mut State) {
        if st.phase != Phase::Connected {
            return;
        }
        for ch in std::iter::once(&self.events).chain(&self.early) {
            while let Ok(Some(e)) = ch.get_cm_event(Some(Duration::ZERO)) {
                if e.kind == CmEventKind::Disconnected {
                    st.disconnected();
                }
            }
        }
    }

    /// `rsend`/`rwrite`.
    pub fn send(&self, buf: &[u8]) -> Result<usize> {
        self.send_with(buf, MsgFlags::default())
    }

    /// `rsend` with flags (`MSG_DONTWAIT`).
    pub fn send_with(&self, buf: &[u8], flags: MsgFlags) -> Result<usize> {
        self.sendv(&[buf], flags)
    }

    /// `rsendv`/`rwritev`/`rsendmsg`: the buffers in order, as one stream.
    pub fn sendv(&self, bufs: &[&[u8]], flags: MsgFlags) -> Result<usize> {
        self.ensure_connected()?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut st = lock(&self.st);
        if !st.writable {
            return Err(errno(Errno::PIPE, "rsend: the rsocket was shut down for sending or its connection ended"));
        }
        let nonblock = st.nonblocking || flags.dontwait;
        let mut done = 0usize;
        let mut olen = OLAP_START;
        let (mut bi, mut boff) = (0usize, 0usize);
        let mut result = Ok(());
        if st.conn.as_ref().is_some_and(|c| c.iomaps.iter().any(|m| !m.sent)) {
            let (s, r) = self.send_iomaps(st, nonblock);
            st = s;
            r?;
        }
        while done < total {
            let (s, r) = self.wait_sendable(st, nonblock, "rsend");
            st = s;
            if let Err(e) = r {
                result = Err(e);
                break;
            }
            let left = (total - done) as u32;
            let c = st.conn.as_mut().expect("connected");
            let mut xfer = if olen < left {
                let x = olen;
                if olen < MAX_TRANSFER {
                    olen <<= 1;
                }
                x
            } else {
                left
            };
            xfer = xfer.min(c.sbuf_bytes_avail);
            let entry = match c.target_entry(c.target_sge) {
                Ok(e) => e,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            xfer = xfer.min(entry.length);
            // The next xfer bytes of the buffers, as pieces (copied once, into sbuf).
            let mut pieces: Vec<&[u8]> = Vec::with_capacity(2);
            let mut want = xfer as usize;
            while want > 0 {
                let b = bufs[bi];
                let take = (b.len() - boff).min(want);
                pieces.push(&b[boff..boff + take]);
                want -= take;
                boff += take;
                if boff == b.len() {
                    bi += 1;
                    boff = 0;
                }
            }
            if let Err(e) = write_data(c, &pieces, xfer, entry) {
                result = Err(e);
                break;
            }
            done += xfer as usize;
        }
        drop(st);
        match result {
            Err(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// `rrecv`/`rread`: up to `buf.len()` bytes; 0 at the end of the stream.
    pub fn recv(&self, buf: &mut [u8]) -> Result<usize> {
        self.recv_with(buf, MsgFlags::default())
    }

    /// `rrecv` with flags (`MSG_DONTWAIT`, `MSG_PEEK`, `MSG_WAITALL`). Data already
    /// received is returned even after the peer disconnected.
    pub fn recv_with(&self, buf: &mut [u8], flags: MsgFlags) -> Result<usize> {
        self.ensure_connected()?;
        let mut st = lock(&self.st);
        let nonblock = st.nonblocking || flags.dontwait;
        let mut got = 0usize;
        let mut result = Ok(());
        loop {
            if !st.have_rdata() {
                let (s, r) = self.get_comp(st, nonblock, State::conn_have_rdata);
                st = s;
                if let Err(e) = r {
                    result = Err(e);
                    break;
                }
            }
            let Some(c) = st.conn.as_mut() else { break };
            if flags.peek {
                got = peek(c, buf)?;
                break;
            }
            while got < buf.len() && !c.rmsgs.is_empty() {
                let head = c.rmsgs[0];
                let left = (buf.len() - got) as u32;
                let rsize = if left < head {
                    c.rmsgs[0] -= left;
                    left
                } else {
                    c.rseq_no = c.rseq_no.wrapping_add(1);
                    c.rmsgs.pop_front();
                    head
                };
                let mut off = c.rbuf_offset;
                let mut rem = rsize;
                while rem > 0 {
                    let n = rem.min(c.rbuf_size - off);
                    c.rbuf.read(off as usize, &mut buf[got..got + n as usize])?;
                    got += n as usize;
                    rem -= n;
                    off += n;
                    if off == c.rbuf_size {
                        off = 0;
                    }
                }
                c.rbuf_offset = off;
                c.rbuf_bytes_avail += rsize;
            }
            if !(flags.waitall && got < buf.len() && st.readable) {
                break;
            }
        }
        st.update_credits();
        drop(st);
        match result {
            Err(e) if got == 0 => {
                // The end of the stream reads as 0, not an error.
                if os_error(&e) == Some(Errno::NOTCONN.raw_os_error()) { Ok(0) } else { Err(e) }
            }
            _ => Ok(got),
        }
    }

    /// `rshutdown`: `read`, `write`, or both directions.
    pub fn shutdown(&self, read: bool, write: bool) -> Result<()> {
        let mut st = lock(&self.st);
        if st.phase == Phase::Connected && st.conn.is_some() {
            let ctrl = if read && write {
                st.readable = false;
                st.writable = false;
                Some(CTRL_DISCONNECT)
            } else if write {
                st.writable = false;
                Some(if st.readable { CTRL_SHUTDOWN } else { CTRL_DISCONNECT })
            } else {
                st.readable = false;
                if st.writable { None } else { Some(CTRL_DISCONNECT) }
            };
            if let Some(ctrl) = ctrl {
                if !st.conn.as_ref().is_some_and(Conn::ctrl_avail) {
                    let (s, _) =
                        self.get_comp(st, false, |s| s.conn.as_ref().is_some_and(Conn::ctrl_avail) || !s.connected());
                    st = s;
                }
                if st.connected() {
                    let c = st.conn.as_mut().expect("connected");
                    if c.ctrl_avail() {
                        c.ctrl_seqno = c.ctrl_seqno.wrapping_add(1);
                        c.post_msg(msg(OP_CTRL, ctrl))?;
                    }
                }
            }
            if st.connected() {
                let (s, _) =
                    self.get_comp(st, false, |s| s.conn.as_ref().is_none_or(Conn::all_sends_done) || !s.connected());
                st = s;
            }
        }
        if st.phase == Phase::Disconnected {
            let _ = self.id.disconnect();
        }
        Ok(())
    }

    /// What of `want` ([`events`]) holds now, processing completions first; with
    /// `arm`, a socket with nothing to report arms its CQ and returns 0 so that its
    /// completion channel wakes a sleeping [`poll`] (`rs_poll_rs`).
    pub fn poll_ready(&self, want: i16, arm: bool) -> i16 {
        let phase = lock(&self.st).phase;
        match phase {
            Phase::Listening => {
                let ready = lock(&self.backlog).as_ref().is_some_and(|q| q.is_ready());
                if ready { want & events::IN } else { 0 }
            }
            Phase::ResolvingAddr | Phase::ResolvingRoute | Phase::Connecting => {
                match self.do_connect(Some(true)) {
                    Ok(false) => 0,
                    // Connected, or failed (ConnectError): report that.
                    _ => self.poll_ready(want, arm),
                }
            }
            Phase::ConnectError => (want & (events::IN | events::OUT)) | events::ERR,
            Phase::Init | Phase::Bound => 0,
            Phase::Connected | Phase::Disconnected | Phase::Error => {
                let (mut st, _) = self.get_comp(lock(&self.st), true, |_| true);
                let mut rev = revents(&st, want);
                if rev == 0 && arm {
                    if let Some(c) = st.conn.as_mut() {
                        if !c.cq_armed && c.cq.req_notify(false).is_ok() {
                            c.cq_armed = true;
                        }
                    }
                    // Something may have come between the last poll and the arming.
                    let (s, _) = self.get_comp(st, true, |_| true);
                    st = s;
                    rev = revents(&st, want);
                    if rev == 0 {
                        if let Some(c) = st.conn.as_ref() {
                            // Armed already; this tells the device the application is
                            // about to sleep, so its progress thread takes the sockets
                            // back now (that poll made it leave them to us for 1 ms).
                            let _ = c.cq.req_notify(false);
                        }
                    }
                }
                rev
            }
        }
    }

    /// What a `poll(2)` waits on for this socket: the completion channel once connected,
    /// the CM event channel while listening or connecting.
    fn waiter(&self) -> Option<Waiter> {
        let st = lock(&self.st);
        match (st.phase, st.conn.as_ref()) {
            (Phase::Listening, _) => lock(&self.backlog).clone().map(Waiter::Backlog),
            (Phase::ResolvingAddr | Phase::ResolvingRoute | Phase::Connecting, _) => {
                Some(Waiter::Cm(self.events.clone()))
            }
            (_, Some(c)) => Some(Waiter::Comp(c.channel.clone())),
            (_, None) => None,
        }
    }

    /// After `poll(2)` found the socket's waiter readable: takes the completion
    /// event, so the next arming waits for a new one.
    fn take_wakeup(&self) {
        let _w = lock(&self.wait_lock);
        let mut st = lock(&self.st);
        if let Some(c) = st.conn.as_mut() {
            if c.cq_armed {
                if let Ok(Some(_)) = c.channel.get_cq_event(Some(Duration::ZERO)) {
                    c.cq_armed = false;
                }
            }
        }
    }

    /// The completion event of [`poll`]'s single socket was taken.
    fn event_taken(&self) {
        if let Some(c) = lock(&self.st).conn.as_mut() {
            c.cq_armed = false;
        }
    }

    /// The PD of the connection (for [`iomap`](Self::iomap)).
    fn pd(&self) -> Option<Pd> {
        lock(&self.st).conn.as_ref().map(|c| c.pd.clone())
    }

    /// `riomap` with `PROT_WRITE`: registers `len` bytes at `addr` and publishes them in
    /// the peer's target iomap at `offset` (`None`: the address), sent before the next
    /// data. Returns the offset.
    ///
    /// # Safety
    /// The memory must stay valid, and not be read or written by Rust references while the
    /// peer may write it, until [`iounmap`](Self::iounmap) or the socket's end.
    #[allow(unsafe_code)]
    pub unsafe fn iomap(&self, addr: *mut u8, len: usize, offset: Option<u64>) -> Result<u64> {
        let pd = self.pd().ok_or_else(|| errno(Errno::INVAL, "riomap: the rsocket is not connected"))?;
        let mut st = lock(&self.st);
        let c = st.conn.as_mut().ok_or_else(|| errno(Errno::INVAL, "riomap: the rsocket is not connected"))?;
        let used: Vec<u32> = c.iomaps.iter().filter_map(|m| m.index).collect();
        let index = (0..c.remote_iomap.length).find(|i| !used.contains(i));
        let Some(index) = index else {
            return Err(errno(Errno::NOMEM, "riomap: the peer's iomap is full (its RDMA_IOMAPSIZE)"));
        };
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: the caller's contract is reg_mr_raw's.
        let mr = unsafe { pd.reg_mr_raw(addr, len, access)? };
        let offset = offset.unwrap_or(addr as usize as u64);
        c.iomaps.push(IoMap { index: Some(index), mr, offset, sent: false });
        Ok(offset)
    }

    /// `riounmap`: forgets a region of [`iomap`](Self::iomap) (`EINVAL` if none matches).
    pub fn iounmap(&self, addr: *mut u8, len: usize) -> Result<()> {
        let mut st = lock(&self.st);
        let c = st.conn.as_mut().ok_or_else(|| errno(Errno::INVAL, "riounmap: the rsocket is not connected"))?;
        let before = c.iomaps.len();
        c.iomaps.retain(|m| !(m.mr.addr() == addr as usize as u64 && m.mr.len() == len));
        if c.iomaps.len() == before {
            return Err(errno(Errno::INVAL, "riounmap: no region mapped at that address and length"));
        }
        Ok(())
    }

    /// Waits (unless `nonblock`) until a send may go: a credit, buffer space and a send
    /// queue entry. Fails if the wait does, or with `ECONNRESET` once the connection can no
    /// longer send (`what` names the call).
    fn wait_sendable<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        nonblock: bool,
        what: &str,
    ) -> (MutexGuard<'a, State>, Result<()>) {
        if st.can_send() {
            return (st, Ok(()));
        }
        let (st, r) = self.get_comp(st, nonblock, State::conn_can_send);
        if r.is_ok() && !st.writable {
            return (st, Err(errno(Errno::CONNRESET, format!("{what}: the connection was closed"))));
        }
        (st, r)
    }

    fn send_iomaps<'a>(&'a self, mut st: MutexGuard<'a, State>, nonblock: bool) -> (MutexGuard<'a, State>, Result<()>) {
        loop {
            let pending = st.conn.as_ref().and_then(|c| c.iomaps.iter().position(|m| !m.sent));
            let Some(i) = pending else { return (st, Ok(())) };
            let (s, r) = self.wait_sendable(st, nonblock, "riomap");
            st = s;
            if let Err(e) = r {
                return (st, Err(e));
            }
            let c = st.conn.as_mut().expect("connected");
            let m = &c.iomaps[i];
            let index = m.index.expect("only writable maps are sent");
            let sge = RsSge { addr: m.mr.addr(), key: m.mr.rkey(), length: m.mr.len() as u32 };
            let mut bytes = [0u8; IOMAP_BYTES];
            if c.swap {
                bytes[0..8].copy_from_slice(&m.offset.to_be_bytes());
            } else {
                bytes[0..8].copy_from_slice(&m.offset.to_ne_bytes());
            }
            bytes[8..].copy_from_slice(&sge.to_host_bytes(c.swap));
            c.sseq_no = c.sseq_no.wrapping_add(1);
            c.sqe_avail -= 1;
            c.sbuf_bytes_avail -= IOMAP_BYTES as u32;
            let mm = msg(OP_IOMAP_SGL, index);
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: c.remote_iomap.addr + u64::from(index) * IOMAP_BYTES as u64,
                rkey: RKey(c.remote_iomap.key),
                imm: mm.to_be_bytes(),
            };
            let sgl =
                [Sge { addr: bytes.as_ptr() as usize as u64, length: IOMAP_BYTES as u32, lkey: Default::default() }];
            let r = c.post(u64::from(mm), op, &sgl, SendFlags::INLINE);
            c.iomaps[i].sent = true;
            if let Err(e) = r {
                return (st, Err(e));
            }
        }
    }

    /// `riowrite`: writes `buf` into the peer's mapped region at `offset` (one it
    /// published with `riomap`), without notifying it; returns the bytes written (fewer if
    /// the mapping ends).
    pub fn iowrite(&self, buf: &[u8], offset: u64, flags: MsgFlags) -> Result<usize> {
        let mut st = lock(&self.st);
        let nonblock = st.nonblocking || flags.dontwait;
        if st.conn.as_ref().is_some_and(|c| c.iomaps.iter().any(|m| !m.sent)) {
            let (s, r) = self.send_iomaps(st, nonblock);
            st = s;
            r?;
        }
        let mut done = 0usize;
        let mut olen = OLAP_START;
        let mut result = Ok(());
        while done < buf.len() {
            let off = offset + done as u64;
            let Some(iom) = st.conn.as_ref().and_then(|c| find_iomap(c, off)) else { break };
            let (s, r) = self.wait_sendable(st, nonblock, "riowrite");
            st = s;
            if let Err(e) = r {
                result = Err(e);
                break;
            }
            let c = st.conn.as_mut().expect("connected");
            let left = (buf.len() - done) as u32;
            let mut xfer = if olen < left {
                let x = olen;
                if olen < MAX_TRANSFER {
                    olen <<= 1;
                }
                x
            } else {
                left
            };
            xfer = xfer.min(c.sbuf_bytes_avail).min((iom.0 + u64::from(iom.1.length) - off) as u32);
            let data = &buf[done..done + xfer as usize];
            c.sqe_avail -= 1;
            c.sbuf_bytes_avail -= xfer;
            let op = SendOp::RdmaWrite { remote_addr: iom.1.addr + off - iom.0, rkey: RKey(iom.1.key) };
            if let Err(e) = post_from_sbuf(c, &[data], xfer, msg(OP_WRITE, xfer), op) {
                result = Err(e);
                break;
            }
            done += xfer as usize;
        }
        match result {
            Err(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }
}

/// A listener's accepted connections, and a descriptor readable while there are some
/// (`accept_queue`).
struct Backlog {
    ready: Mutex<VecDeque<RSocket>>,
    reader: UnixStream,
    /// The listener is gone: its thread ends.
    stop: AtomicBool,
}

impl Backlog {
    /// Drains the descriptor's bytes first, then looks at the queue: a connection queued
    /// after the drain has its byte still there, so a `poll(2)` on `reader` wakes for it.
    fn drain(&self) {
        let mut b = [0u8; 64];
        while matches!((&self.reader).read(&mut b), Ok(n) if n > 0) {}
    }

    fn is_ready(&self) -> bool {
        self.drain();
        !lock(&self.ready).is_empty()
    }

    fn pop(&self) -> Option<RSocket> {
        self.drain();
        lock(&self.ready).pop_front()
    }
}

/// A listener's thread: accepts each connection request as it comes and queues the
/// connection, until the listener is dropped.
fn accept_loop(events: &EventChannel, listener: &Mutex<State>, queue: &Backlog, mut writer: &UnixStream) {
    while !queue.stop.load(Ordering::Acquire) {
        let event = match events.get_cm_event(Some(Duration::from_millis(100))) {
            Ok(Some(e)) if e.kind == CmEventKind::ConnectRequest => e,
            Ok(_) => continue,
            Err(_) => return,
        };
        let sizes = lock(listener).sizes;
        // A request that cannot be accepted was rejected; the peer's rconnect fails.
        if let Ok(rs) = RSocket::accept_request(event, sizes) {
            lock(&queue.ready).push_back(rs);
            let _ = writer.write(&[1]);
        }
    }
}

impl Drop for RSocket {
    fn drop(&mut self) {
        if let Some(q) = lock(&self.backlog).as_ref() {
            q.stop.store(true, Ordering::Release);
        }
        if lock(&self.st).keepalive {
            keepalive::cancel(&self.st);
        }
    }
}

/// A descriptor an rsocket's waiter sleeps on.
enum Waiter {
    Comp(CompChannel),
    Cm(EventChannel),
    Backlog(Arc<Backlog>),
}

impl AsFd for Waiter {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Waiter::Comp(c) => c.as_fd(),
            Waiter::Cm(e) => e.as_fd(),
            Waiter::Backlog(b) => b.reader.as_fd(),
        }
    }
}

/// The target iomap entry holding `offset`: (its offset, its SGE).
fn find_iomap(c: &Conn, offset: u64) -> Option<(u64, RsSge)> {
    (0..c.target_iomap_size as usize).find_map(|i| {
        let mut b = [0u8; IOMAP_BYTES];
        c.target.read(SGE_BYTES * SGL_SIZE + i * IOMAP_BYTES, &mut b).ok()?;
        let off = u64::from_ne_bytes(b[0..8].try_into().expect("8 bytes"));
        let s = RsSge::from_host_bytes(&b[8..]);
        (s.length != 0 && offset >= off && offset < off + u64::from(s.length)).then_some((off, s))
    })
}

/// What of `want` holds for a connected (or disconnected) socket.
fn revents(st: &State, want: i16) -> i16 {
    let mut rev = 0;
    if want & events::IN != 0 && st.conn_have_rdata() {
        rev |= events::IN;
    }
    if want & events::OUT != 0 && st.can_send() {
        rev |= events::OUT;
    }
    match st.phase {
        // As TCP: the end of the stream reads as POLLIN; the hang-up shows once the data
        // before it is read (rstream's last poll, right after the peer's close, wants IN).
        Phase::Disconnected if !st.have_rdata() => rev |= events::HUP,
        Phase::Error => rev |= events::ERR,
        _ => {}
    }
    rev
}

/// A failed connection: the state and `SO_ERROR` say so.
fn fail_connect(st: &mut State, e: Error) -> Error {
    st.phase = Phase::ConnectError;
    st.err = os_error(&e).unwrap_or(Errno::CONNREFUSED.raw_os_error());
    e
}

/// The connection parameters of a REQ or REP carrying `data`: rdma-core's (flow control,
/// 7 retries and RNR retries), the rest the device's defaults.
fn conn_param(data: &ConnData) -> ConnParam {
    ConnParam {
        private_data: data.encode().to_vec(),
        flow_control: true,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    }
}

fn format_conn_data(c: &Conn) -> ConnData {
    ConnData {
        version: VERSION,
        flags: CONN_FLAG_IOMAP | if cfg!(target_endian = "big") { CONN_FLAG_NET } else { 0 },
        credits: c.rq_size as u16,
        target_iomap_size: value_to_scale(c.target_iomap_size, 8) as u8,
        target_sgl: RsSge { addr: c.target.addr(), key: c.target.rkey(), length: SGL_SIZE as u32 },
        data_buf: RsSge { addr: c.rbuf.addr(), key: c.rbuf.rkey(), length: c.rbuf_size >> 1 },
    }
}

fn save_conn_data(c: &mut Conn, d: &ConnData) -> Result<()> {
    c.remote_sgl = d.target_sgl;
    if c.remote_sgl.length == 0 {
        return Err(errno(Errno::PROTO, "rsocket: the peer's target SGL has no entries"));
    }
    c.remote_sge = 1 % c.remote_sgl.length;
    c.swap = (d.flags & CONN_FLAG_NET != 0) != cfg!(target_endian = "big");
    if d.flags & CONN_FLAG_IOMAP != 0 {
        c.remote_iomap = RsSge {
            addr: d.target_sgl.addr + SGE_BYTES as u64 * u64::from(d.target_sgl.length),
            key: d.target_sgl.key,
            length: scale_to_value(u32::from(d.target_iomap_size), 8),
        };
    }
    c.set_target_entry(0, d.data_buf)?;
    c.sseq_comp = d.credits;
    Ok(())
}

/// Posts `data` (copied into the send buffer, or inline) with `op`; the completion's tag
/// is `m`.
fn post_from_sbuf(c: &mut Conn, pieces: &[&[u8]], len: u32, m: u32, op: SendOp) -> Result<()> {
    if len <= c.sq_inline {
        let joined;
        let data: &[u8] = match pieces {
            [one] => one,
            _ => {
                joined = pieces.concat();
                &joined
            }
        };
        let sgl = [Sge { addr: data.as_ptr() as usize as u64, length: len, lkey: Default::default() }];
        return c.post(u64::from(m), op, &sgl, SendFlags::INLINE);
    }
    let start = c.sbuf_pos;
    let mut pos = start;
    for piece in pieces {
        let mut piece: &[u8] = piece;
        while !piece.is_empty() {
            let n = piece.len().min((c.sbuf_size - pos) as usize);
            c.sbuf.write(pos as usize, &piece[..n])?;
            piece = &piece[n..];
            pos = (pos + n as u32) % c.sbuf_size;
        }
    }
    c.sbuf_pos = pos;
    let first = len.min(c.sbuf_size - start);
    let head = c.sbuf.sge(start as usize..(start + first) as usize)?;
    if first < len {
        let sgl = [head, c.sbuf.sge(0..(len - first) as usize)?];
        c.post(u64::from(m), op, &sgl, SendFlags(0))
    } else {
        c.post(u64::from(m), op, &[head], SendFlags(0))
    }
}

/// One data message into the peer's current half (`rs_write_data`).
fn write_data(c: &mut Conn, pieces: &[&[u8]], len: u32, entry: RsSge) -> Result<()> {
    c.sseq_no = c.sseq_no.wrapping_add(1);
    c.sqe_avail -= 1;
    c.sbuf_bytes_avail -= len;
    let updated = RsSge { addr: entry.addr + u64::from(len), key: entry.key, length: entry.length - len };
    c.set_target_entry(c.target_sge, updated)?;
    if updated.length == 0 {
        c.target_sge = (c.target_sge + 1) % SGL_SIZE;
    }
    let m = msg(OP_DATA, len);
    let op = SendOp::RdmaWriteWithImm { remote_addr: entry.addr, rkey: RKey(entry.key), imm: m.to_be_bytes() };
    post_from_sbuf(c, pieces, len, m, op)
}

/// Copies queued data without consuming it (`rs_peek`).
fn peek(c: &Conn, buf: &mut [u8]) -> Result<usize> {
    let mut got = 0usize;
    let mut off = c.rbuf_offset;
    for &len in &c.rmsgs {
        if got == buf.len() {
            break;
        }
        let mut rem = len.min((buf.len() - got) as u32);
        while rem > 0 {
            let n = rem.min(c.rbuf_size - off);
            c.rbuf.read(off as usize, &mut buf[got..got + n as usize])?;
            got += n as usize;
            rem -= n;
            off = (off + n) % c.rbuf_size;
        }
    }
    Ok(got)
}

/// One entry of [`poll`]: an rsocket or another descriptor, what to wait for, what
/// happened.
pub struct PollItem<'a> {
    /// What to watch.
    pub target: PollTarget<'a>,
    /// `events::*` (or `poll(2)`'s bits for a descriptor).
    pub events: i16,
    /// What happened.
    pub revents: i16,
}

/// What a [`PollItem`] watches.
pub enum PollTarget<'a> {
    /// An rsocket.
    Socket(&'a RSocket),
    /// Any other descriptor (polled as `poll(2)` does).
    Fd(BorrowedFd<'a>),
    /// Nothing (a negative descriptor in `poll(2)`): never ready.
    None,
}

/// `rpoll`: waits up to `timeout` (`None`: forever) until an item is ready; returns how
/// many are. Spins briefly, then sleeps in `poll(2)` on the sockets' channels and the
/// other descriptors: it never busy-waits.
pub fn poll(items: &mut [PollItem<'_>], timeout: Option<Duration>) -> Result<usize> {
    let start = Instant::now();
    let check = |items: &mut [PollItem<'_>], arm: bool| -> usize {
        let mut n = 0;
        for it in items.iter_mut() {
            it.revents = match &it.target {
                PollTarget::Socket(s) => s.poll_ready(it.events, arm),
                PollTarget::Fd(fd) => {
                    let mut f = [PollFd::from_borrowed_fd(*fd, PollFlags::from_bits_truncate(it.events as u16))];
                    match rustix::event::poll(&mut f, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })) {
                        Ok(_) => f[0].revents().bits() as i16,
                        Err(_) => events::ERR,
                    }
                }
                PollTarget::None => 0,
            };
            if it.revents != 0 {
                n += 1;
            }
        }
        n
    };
    loop {
        let n = check(items, false);
        if n > 0 || timeout == Some(Duration::ZERO) {
            return Ok(n);
        }
        if start.elapsed() > POLLING_TIME {
            break;
        }
    }
    loop {
        let n = check(items, true);
        if n > 0 {
            return Ok(n);
        }
        let left = match timeout {
            Some(t) => {
                let spent = start.elapsed();
                if spent >= t {
                    return Ok(0);
                }
                Some(t - spent)
            }
            None => None,
        };
        // One connected socket alone: sleep on its completion channel the way
        // `get_cq_event` does, receiving in this thread when a datagram comes first (one
        // wake-up per message, not the progress thread's and then this one's).
        if let [PollItem { target: PollTarget::Socket(s), .. }] = items {
            if let Some(Waiter::Comp(ch)) = s.waiter() {
                if let Some(_cq) = ch.get_cq_event(left)? {
                    s.event_taken();
                }
                continue;
            }
        }
        let waiters: Vec<Option<Waiter>> = items
            .iter()
            .map(|it| match &it.target {
                PollTarget::Socket(s) => s.waiter(),
                _ => None,
            })
            .collect();
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(items.len());
        let mut slot = Vec::with_capacity(items.len());
        for (it, w) in items.iter().zip(&waiters) {
            let fd = match (&it.target, w) {
                (PollTarget::Fd(fd), _) => {
                    Some(PollFd::from_borrowed_fd(*fd, PollFlags::from_bits_truncate(it.events as u16)))
                }
                (PollTarget::Socket(_), Some(w)) => Some(PollFd::new(w, PollFlags::IN)),
                _ => None,
            };
            slot.push(fd.is_some().then_some(fds.len()));
            fds.extend(fd);
        }
        let ts = left.map(|t| rustix::event::Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(errno(e, "rpoll: poll(2)")),
        }
        let woke: Vec<bool> = slot.iter().map(|k| k.is_some_and(|k| !fds[k].revents().is_empty())).collect();
        drop(fds);
        for (it, w) in items.iter().zip(woke) {
            if let (PollTarget::Socket(s), true) = (&it.target, w) {
                s.take_wakeup();
            }
        }
    }
}
