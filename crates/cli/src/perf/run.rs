//! The measurement itself: one side's verbs objects ([`Side`]) and the loops that post,
//! poll and time work requests, perftest's way.
//!
//! - **bw**: the requester keeps `depth` operations in flight on each QP, every
//!   `signal_every`-th signaled, and times from its first post to its last completion. The
//!   responder is passive for WRITE, READ and atomics (its progress thread does the work)
//!   and keeps its receive queues full for SEND.
//! - **lat**: one operation at a time. WRITE and SEND are a ping-pong (WRITE with immediate,
//!   so that each side learns of the other's write by a completion); the figure is half the
//!   round trip, as perftest reports it. READ and atomics are round trips by nature, and
//!   their figure is the whole round trip, as perftest's.

use std::cell::Cell;

use smallvec::SmallVec;
use std::time::{Duration, Instant};

use softrdma::{
    Access, AddressVector, Ah, CmId, CompChannel, ConnectOptions, Context, Cq, EMPTY_WC, Endpoint, Gid, Mr, Mtu, Pd,
    QKey, Qp, QpCap, QpInit, QpType, Qpn, RKey, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, Wc, WcStatus,
};

use super::PerfError;
use super::control::{Control, QpInfo, SideInfo, SideStats};
use super::progress::Progress;
use super::spec::{Conn, Mode, Op, Spec};

/// The Q_Key of perf's UD QPs (perftest's default).
const QKEY: u32 = 0x1111_1111;
/// Bytes of GRH in front of every UD receive.
const GRH: u64 = 40;
/// A side's buffers, all QPs together, take at most this much memory (but one slot per
/// QP), as perftest's few buffers per QP do: 128 QPs of 128 slots of 64 KiB each touched
/// 1 GiB per process, and the run measured page faults and cache misses as much as RDMA.
/// The same for any number of QPs, and the size of the buffer `perf baseline` writes into
/// with `process_vm_writev`: at 64 MiB, 16 QPs wrote over 64 MiB where one QP wrote over
/// 8 MiB, and `-q 16` measured the larger working set as much as the QPs (64 KiB WRITEs,
/// alternating runs: 16 QPs 0.75x one QP's bandwidth with 64 MiB, 0.87x with 8 MiB).
const REGION: u64 = 8 << 20;
/// perftest's cycle buffer (its default, a page): messages up to half of it go round the
/// buffer, larger ones are each posted from its start.
const SOURCE_CYCLE: u64 = 4096;
/// Receives kept posted on each QP.
const RECV_DEPTH_BW: u32 = 512;
const RECV_DEPTH_LAT: u32 = 64;
/// Latency pings signal one send in this many (the send queue is this deep, twice).
const LAT_SIGNAL_EVERY: u64 = 64;
/// Work requests posted in one call.
const BATCH: usize = 16;
/// Receive work requests carry this bit in their `wr_id`.
const RECV_BIT: u64 = 1 << 63;

fn wr_id(qp: usize, seq: u64) -> u64 {
    ((qp as u64) << 40) | (seq & ((1 << 40) - 1))
}

fn wr_qp(id: u64) -> usize {
    ((id & !RECV_BIT) >> 40) as usize
}

fn wr_seq(id: u64) -> u64 {
    id & ((1 << 40) - 1)
}

fn rdma(what: &'static str) -> impl Fn(softrdma::Error) -> PerfError {
    move |e| PerfError::Rdma(format!("{what}: {e}"))
}

/// A number no one can predict, for first PSNs.
fn random_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as u32
}

/// A side's packet counters at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Packets {
    sent: u64,
    received: u64,
    retransmitted: u64,
    /// Sent through the same-host path's shared memory (also counted in `sent`).
    same_host: u64,
    /// Received by reference: their data copied once from the other side's memory.
    by_reference: u64,
    /// Waits on the completion channel that ended while polling, and that slept.
    waits_polled: u64,
    waits_slept: u64,
    /// Events this side took from its completion channel (counted here, not by the device).
    events: u64,
}

/// One side's verbs objects for a whole test.
pub(crate) struct Side {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    /// The CQ's completion channel, with `-e`: completions are waited for on it.
    channel: Option<CompChannel>,
    qps: Vec<Qp>,
    psns: Vec<u32>,
    mr: Mr,
    ah: Option<Ah>,
    /// The Q_Key of this side's UD QPs: [`QKEY`], or what rdma_cm gave them.
    qkey: u32,
    /// The packet counters when the current run began.
    mark: Cell<Packets>,
    /// Events taken from `channel` so far.
    events: Cell<u64>,
    gid_index: u8,
    stride: u64,
    slots: u64,
    spec: Spec,
    recv_depth: u32,
}

impl Side {
    /// Creates the PD, CQ, QPs and memory region that `spec` needs on `ctx`, sending from
    /// GID `gid_index`. With `--rdma-cm` the QPs come later, one per CM ID
    /// ([`add_cm_qp`](Side::add_cm_qp)).
    pub(crate) fn new(ctx: Context, gid_index: u8, spec: &Spec) -> Result<Side, PerfError> {
        let pd = ctx.alloc_pd().map_err(rdma("ibv_alloc_pd"))?;
        let stride = (spec.max_size() + GRH).next_multiple_of(64);
        let want_slots = u64::from(spec.depth.max(RECV_DEPTH_LAT));
        let slots = (REGION / (u64::from(spec.qps) * stride)).clamp(1, want_slots);
        let recv_depth = if spec.mode == Mode::Bw { RECV_DEPTH_BW.max(spec.depth) } else { RECV_DEPTH_LAT };
        let cqe = spec.qps * (Self::send_depth(spec) + recv_depth) + 64;
        let channel =
            if spec.events { Some(ctx.create_comp_channel().map_err(rdma("ibv_create_comp_channel"))?) } else { None };
        let cq = ctx.create_cq(cqe, channel.as_ref()).map_err(rdma("ibv_create_cq"))?;
        if channel.is_some() {
            cq.req_notify(false).map_err(rdma("ibv_req_notify_cq"))?;
        }
        let len = usize::try_from(u64::from(spec.qps) * slots * stride)
            .map_err(|_| PerfError::Usage("the buffers do not fit this machine's address space".into()))?;
        let mut mr = pd.reg_mr(len, Access::ALL).map_err(rdma("ibv_reg_mr"))?;
        // Every page written before the run, as perftest writes its buffers when it makes
        // them (and as a NIC's registration pins them): softrdma's regions take memory only
        // where they are touched, and first touches inside the run are page faults, not
        // RDMA (500 64 KiB WRITEs made 1.3-1.7 GB/s so, against 8 and more for 5000; the
        // baseline's process_vm_writev target is touched before its clock starts too).
        mr.with(|bytes| bytes.fill(0));
        let mut side = Side {
            ctx,
            _pd: pd,
            cq,
            channel,
            qps: Vec::new(),
            psns: Vec::new(),
            mr,
            ah: None,
            qkey: QKEY,
            mark: Cell::new(Packets::default()),
            events: Cell::new(0),
            gid_index,
            stride,
            slots,
            spec: spec.clone(),
            recv_depth,
        };
        if !spec.rdma_cm {
            for _ in 0..spec.qps {
                let qp = side._pd.create_qp(&side.qp_init()).map_err(rdma("ibv_create_qp"))?;
                side.qps.push(qp);
                side.psns.push(random_u32() & 0xff_ffff);
            }
        }
        Ok(side)
    }

    fn send_depth(spec: &Spec) -> u32 {
        if spec.mode == Mode::Bw { spec.depth } else { 2 * LAT_SIGNAL_EVERY as u32 }
    }

    fn qp_type(&self) -> QpType {
        match self.spec.conn {
            Conn::Rc => QpType::Rc,
            Conn::Uc => QpType::Uc,
            Conn::Ud => QpType::Ud,
        }
    }

    /// What every QP of the test is created with.
    fn qp_init(&self) -> QpInit<'_> {
        let mut init = QpInit::new(self.qp_type(), &self.cq);
        init.cap = QpCap {
            max_send_wr: Self::send_depth(&self.spec),
            max_recv_wr: self.recv_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: self.spec.inline,
        };
        init
    }

    /// `--rdma-cm`: creates the next QP on `id` (`rdma_create_qp` with this side's CQ), in
    /// INIT with the attributes rdma_cm dictates (UD: in RTS). Its first PSN is rdma_cm's.
    pub(crate) fn add_cm_qp(&mut self, id: &CmId) -> Result<(), PerfError> {
        let qp = id.create_qp_with(&self._pd, &self.qp_init()).map_err(rdma("rdma_create_qp"))?;
        let (attr, _) = qp.query().map_err(rdma("ibv_query_qp"))?;
        if self.spec.conn == Conn::Ud {
            // rdma_create_qp took the UD QP to RTS (it needs no peer).
            self.qkey = attr.qkey.0;
        }
        self.psns.push(attr.sq_psn);
        self.qps.push(qp);
        Ok(())
    }

    /// The first PSN QP `i` expects from its peer (its `rq_psn`): what the peer starts at.
    pub(crate) fn expected_psn(&self, i: usize) -> Result<u32, PerfError> {
        let qp = self.qps.get(i).ok_or_else(|| PerfError::Rdma(format!("no QP {i}")))?;
        Ok(qp.query().map_err(rdma("ibv_query_qp"))?.0.rq_psn)
    }

    /// What the peer needs to know.
    pub(crate) fn info(&self) -> Result<SideInfo, PerfError> {
        let ip = self
            .ctx
            .device()
            .addresses()
            .get(usize::from(self.gid_index))
            .copied()
            .ok_or_else(|| PerfError::Usage(format!("the device has no GID {}", self.gid_index)))?;
        let remote = self.mr.remote(0..self.mr.len()).map_err(rdma("the memory region"))?;
        Ok(SideInfo {
            device: self.ctx.device().name().to_string(),
            ip,
            qps: self.qps.iter().zip(&self.psns).map(|(q, &psn)| QpInfo { qpn: q.qpn(), psn }).collect(),
            qkey: self.qkey,
            addr: remote.addr,
            len: remote.len,
            rkey: remote.rkey.0,
            stride: self.stride,
            slots: self.slots,
        })
    }

    /// Connects the QPs to the peer's (RC, UC) or readies them (UD), then
    /// [`prepare`](Side::prepare)s the run.
    pub(crate) fn connect(&mut self, peer: &SideInfo) -> Result<(), PerfError> {
        if peer.qps.len() != self.qps.len() {
            return Err(PerfError::Peer(format!("the peer has {} QPs, this side {}", peer.qps.len(), self.qps.len())));
        }
        let mtu = match self.spec.mtu {
            0 => None,
            256 => Some(Mtu::Mtu256),
            512 => Some(Mtu::Mtu512),
            1024 => Some(Mtu::Mtu1024),
            2048 => Some(Mtu::Mtu2048),
            4096 => Some(Mtu::Mtu4096),
            m => return Err(PerfError::Usage(format!("--mtu {m}: one of 256, 512, 1024, 2048, 4096"))),
        };
        for (i, qp) in self.qps.iter().enumerate() {
            match self.spec.conn {
                Conn::Rc | Conn::Uc => {
                    let remote = Endpoint { qpn: peer.qps[i].qpn, gid: Gid::from_ip(peer.ip), psn: peer.qps[i].psn };
                    let options = ConnectOptions { sgid_index: self.gid_index, mtu, ..ConnectOptions::default() };
                    qp.connect(self.psns[i], &remote, &options).map_err(rdma("connecting the QP (ibv_modify_qp)"))?;
                }
                Conn::Ud => qp.ready_ud(QKEY, self.psns[i]).map_err(rdma("readying the UD QP (ibv_modify_qp)"))?,
            }
        }
        self.prepare(peer)
    }

    /// Once the QPs are connected (by [`connect`](Side::connect) or rdma_cm): the address
    /// handle of the peer (UD) and full receive queues.
    pub(crate) fn prepare(&mut self, peer: &SideInfo) -> Result<(), PerfError> {
        if peer.qps.len() != self.qps.len() {
            return Err(PerfError::Peer(format!("the peer has {} QPs, this side {}", peer.qps.len(), self.qps.len())));
        }
        if self.spec.conn == Conn::Ud {
            let av = AddressVector {
                dgid: Gid::from_ip(peer.ip),
                sgid_index: self.gid_index,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            };
            self.ah = Some(self._pd.create_ah(av).map_err(rdma("ibv_create_ah"))?);
        }
        if self.uses_receives() {
            for q in 0..self.qps.len() {
                for k in 0..u64::from(self.recv_depth) {
                    self.post_recv(q, k)?;
                }
            }
        }
        Ok(())
    }

    /// Whether receives are consumed in this test (SEND, and WRITE with immediate).
    fn uses_receives(&self) -> bool {
        self.spec.op == Op::Send || (self.spec.op == Op::Write && self.spec.mode == Mode::Lat)
    }

    /// Where buffer `slot` of QP `qp` starts in the region, and a work request's SGE of
    /// `len` bytes there.
    fn sge(&self, qp: usize, slot: u64, len: u64) -> Result<Sge, PerfError> {
        let off = ((qp as u64 * self.slots + slot % self.slots) * self.stride) as usize;
        self.mr.sge(off..off + len as usize).map_err(rdma("a buffer"))
    }

    fn post_recv(&self, qp: usize, k: u64) -> Result<(), PerfError> {
        let sge = [self.sge(qp, k, self.stride)?];
        self.qps[qp]
            .post_recv(&[RecvWr { wr_id: RECV_BIT | wr_id(qp, k), sg_list: &sge }])
            .map_err(rdma("ibv_post_recv"))
    }

    /// An operation aimed at `remote_addr` in the peer's region; a numbered one (latency
    /// pings) carries `number` as its immediate data.
    fn op(&self, peer: &SideInfo, remote_addr: u64, number: u64) -> SendOp {
        let rkey = RKey(peer.rkey);
        match (self.spec.op, self.spec.mode) {
            (Op::Send, Mode::Lat) if self.spec.conn != Conn::Rc => SendOp::SendWithImm { imm: ping_number(number) },
            (Op::Send, _) => SendOp::Send,
            (Op::Write, Mode::Bw) => SendOp::RdmaWrite { remote_addr, rkey },
            (Op::Write, Mode::Lat) => SendOp::RdmaWriteWithImm { remote_addr, rkey, imm: ping_number(number) },
            (Op::Read, _) => SendOp::RdmaRead { remote_addr, rkey },
            (Op::Atomic, _) => SendOp::FetchAdd { remote_addr, rkey, add: 1 },
        }
    }

    /// Posts latency answer `seq` (which picks its buffer and whether it is signaled) with
    /// the ping's `number` as its immediate data.
    fn post_numbered(&self, peer: &SideInfo, size: u64, seq: u64, number: u64) -> Result<(), PerfError> {
        self.post_with(peer, 0, seq..seq + 1, size, |s| s % LAT_SIGNAL_EVERY == LAT_SIGNAL_EVERY - 1, |_| number)
    }

    /// Posts operations `seqs` on QP `qp` in one call; `signal(seq)` says which complete.
    fn post(
        &self,
        peer: &SideInfo,
        qp: usize,
        seqs: std::ops::Range<u64>,
        size: u64,
        signal: impl Fn(u64) -> bool,
    ) -> Result<(), PerfError> {
        self.post_with(peer, qp, seqs, size, signal, |seq| seq)
    }

    /// [`post`](Side::post), with `number(seq)` the number a numbered operation carries.
    fn post_with(
        &self,
        peer: &SideInfo,
        qp: usize,
        seqs: std::ops::Range<u64>,
        size: u64,
        signal: impl Fn(u64) -> bool,
        number: impl Fn(u64) -> u64,
    ) -> Result<(), PerfError> {
        let n = (seqs.end - seqs.start) as usize;
        debug_assert!(n <= BATCH);
        let first = self.sge(qp, 0, size)?;
        // Each side's slot of each request: the first by division, the next by a step that
        // wraps, rather than two 64-bit divisions for each of the 16 requests built (no
        // change measurable end to end on this machine, but no work done for nothing).
        let (mut mine, mut theirs) = (seqs.start % self.slots, seqs.start % peer.slots);
        // Where the data comes from is one buffer per QP for messages over half perftest's
        // cycle buffer (perftest posts each such message from the same address), hot as
        // the sources of the baselines it is compared with; where it lands goes round the
        // slots, as the baselines' destinations do (8 MiB).
        let one_source = size > SOURCE_CYCLE / 2;
        let (local_fixed, remote_fixed) =
            if self.spec.op == Op::Read { (false, one_source) } else { (one_source, false) };
        // Only the `n` requests posted are built (a latency loop posts one: building all
        // 16 was 300 instructions of `softrdma perf`'s own per message).
        let sges: SmallVec<[(Sge, u64); BATCH]> = (0..n)
            .map(|_| {
                let addr = first.addr + if local_fixed { 0 } else { mine * self.stride };
                let remote = peer.buffer(qp, if remote_fixed { 0 } else { theirs });
                mine = if mine + 1 == self.slots { 0 } else { mine + 1 };
                theirs = if theirs + 1 == peer.slots { 0 } else { theirs + 1 };
                (Sge { addr, ..first }, remote)
            })
            .collect();
        let inline = size <= u64::from(self.spec.inline) && matches!(self.spec.op, Op::Send | Op::Write);
        let ud = self.ah.as_ref().map(|ah| UdDest {
            ah: ah.id(),
            remote_qpn: Qpn::from_u24_truncating(self.peer_qpn(peer, qp)),
            remote_qkey: QKey(peer.qkey),
        });
        let wrs: SmallVec<[SendWr<'_>; BATCH]> = (seqs.start..)
            .zip(&sges)
            .map(|(seq, (sge, remote))| {
                let mut flags = if inline { SendFlags::INLINE } else { SendFlags::default() };
                if signal(seq) {
                    flags = flags | SendFlags::SIGNALED;
                }
                SendWr {
                    wr_id: wr_id(qp, seq),
                    op: self.op(peer, *remote, number(seq)),
                    sg_list: std::slice::from_ref(sge),
                    flags,
                    ud,
                    xrc_srqn: None,
                }
            })
            .collect();
        self.qps[qp].post_send(&wrs).map_err(rdma("ibv_post_send"))
    }

    fn peer_qpn(&self, peer: &SideInfo, qp: usize) -> u32 {
        peer.qps[qp].qpn
    }

    /// The completions ready, up to `wcs.len()`. With `-e`, as perftest's: waits for the
    /// CQ's event ([`EVENT_WAIT`] at most, so that the caller's loop still sees its
    /// deadlines), re-arms the CQ, then polls (the CQ is armed once when it is made). Each
    /// wait takes one event, so none piles up: arming, polling and waiting only when the
    /// poll found nothing (`rdma_get_recv_comp`'s way) leaves an event behind for every
    /// completion the second poll finds, and the next wait returns at once.
    fn poll_cq(&self, wcs: &mut [Wc]) -> Result<usize, PerfError> {
        if let Some(channel) = &self.channel {
            // The event names this side's one CQ; what matters is that it came.
            if channel.get_cq_event(Some(EVENT_WAIT)).map_err(rdma("ibv_get_cq_event"))?.is_some() {
                self.events.set(self.events.get() + 1);
                self.cq.req_notify(false).map_err(rdma("ibv_req_notify_cq"))?;
            }
        }
        Ok(self.cq.poll(wcs))
    }

    fn check(wc: &Wc) -> Result<(), PerfError> {
        if wc.status == WcStatus::Success {
            return Ok(());
        }
        Err(PerfError::Rdma(format!(
            "work completion with status {:?} (QP {:#x}, {:?}, operation {} of QP {})",
            wc.status,
            wc.qp_num.value(),
            wc.opcode,
            wr_seq(wc.wr_id),
            wr_qp(wc.wr_id)
        )))
    }

    fn counters(&self) -> Packets {
        let c = self.ctx.counters();
        Packets {
            sent: c.engine.sent_packets,
            received: c.engine.rcvd_packets,
            retransmitted: c.engine.retransmitted_packets,
            same_host: c.same_host_sent,
            by_reference: c.engine.rcvd_by_reference,
            waits_polled: c.channel_waits_polled,
            waits_slept: c.channel_waits_slept,
            events: self.events.get(),
        }
    }

    /// One bandwidth run of `size`-byte operations. `sending`: this side posts them (the
    /// client, and both sides when bidirectional); otherwise it only keeps its receive
    /// queues full, or, for one-sided operations, waits while its device answers. Ends when
    /// both sides said `Finished`.
    pub(crate) fn bw(
        &self,
        ctl: &Control,
        peer: &SideInfo,
        size: u64,
        sending: bool,
        progress: &mut Progress,
    ) -> Result<(SideStats, Vec<(f64, u64)>), PerfError> {
        let spec = &self.spec;
        let deadline = Instant::now() + spec.run_deadline(size);
        let nqp = self.qps.len();
        let depth = u64::from(spec.depth);
        let signal_every = (depth / 2).clamp(1, 64);
        let per_qp = spec.iters;
        let duration = spec.duration_ms.map(Duration::from_millis);
        let mut posted = vec![0u64; nqp];
        let mut completed = vec![0u64; nqp];
        let mut last = vec![u64::MAX; nqp]; // the last operation, once known
        let mut received = 0u64;
        let mut samples: Vec<(f64, u64)> = vec![(0.0, 0)];
        let mut wcs = [EMPTY_WC; 64];
        let start = Instant::now();
        let mut end = start;
        let mut sent_finished = false;
        let mut stopped = false; // duration reached: post no more
        let passive = !sending && !self.uses_receives();
        if passive {
            ctl.send(&super::control::Msg::Finished)?;
            sent_finished = true;
            while !ctl.peer_finished()? {
                if Instant::now() > deadline {
                    return Err(PerfError::Peer("the peer did not finish its run in time".into()));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut total_done = 0u64;
        let mut last_sample = start;
        let mut turns = 0u32;
        loop {
            if passive {
                break; // it waited for the peer's run above
            }
            // The clock is read for the stall deadline every 256 turns (a turn takes under a
            // microsecond), and for a sender's duration every 16 (it ends the run a few
            // microseconds late at most): a read on every turn was a twentieth of a 64 B SEND
            // receiver's time, and as much of its sender's (`perf record`), the harness's and
            // not softrdma's.
            turns = turns.wrapping_add(1);
            let timed = sending && duration.is_some() && turns % 16 == 0;
            let now = if timed || turns % 256 == 0 { Instant::now() } else { start };
            if sending && !stopped {
                if let Some(d) = duration {
                    if now - start >= d {
                        stopped = true;
                        for q in 0..nqp {
                            // The last operation posted must complete: ask for it.
                            last[q] = posted[q].saturating_sub(1);
                        }
                    }
                }
                for q in 0..nqp {
                    if stopped {
                        break;
                    }
                    let limit = match duration {
                        Some(_) => u64::MAX,
                        None => per_qp,
                    };
                    while posted[q] < limit && posted[q] - completed[q] < depth {
                        let n = (limit - posted[q]).min(depth - (posted[q] - completed[q])).min(BATCH as u64);
                        let range = posted[q]..posted[q] + n;
                        let end_seq = limit.saturating_sub(1);
                        self.post(peer, q, range, size, |s| s % signal_every == signal_every - 1 || s == end_seq)?;
                        posted[q] += n;
                    }
                    if duration.is_none() {
                        last[q] = per_qp - 1;
                    }
                }
            }
            let n = self.poll_cq(&mut wcs)?;
            for wc in &wcs[..n] {
                Self::check(wc)?;
                if wc.wr_id & RECV_BIT != 0 {
                    received += 1;
                    self.post_recv(wr_qp(wc.wr_id), wr_seq(wc.wr_id))?;
                } else {
                    let q = wr_qp(wc.wr_id);
                    let done = wr_seq(wc.wr_id) + 1;
                    total_done += done - completed[q];
                    completed[q] = done;
                    end = Instant::now();
                }
            }
            if sending && n > 0 && end - last_sample >= Duration::from_millis(1) {
                samples.push(((end - start).as_secs_f64(), total_done));
                last_sample = end;
                progress.set_run(total_done, end - start);
            }
            if !sent_finished {
                let all_done = !sending || (0..nqp).all(|q| last[q] != u64::MAX && completed[q] > last[q]);
                let all_done = all_done && (!sending || stopped || duration.is_none());
                if all_done {
                    ctl.send(&super::control::Msg::Finished)?;
                    sent_finished = true;
                }
            }
            if sent_finished && ctl.peer_finished()? {
                // Whatever the peer sent has landed (RC) or is lost (UC, UD): take what is
                // queued, then stop.
                let quiet = Instant::now();
                while quiet.elapsed() < Duration::from_millis(if spec.conn == Conn::Rc { 1 } else { 20 }) {
                    let n = self.cq.poll(&mut wcs);
                    for wc in &wcs[..n] {
                        Self::check(wc)?;
                        if wc.wr_id & RECV_BIT != 0 {
                            received += 1;
                            self.post_recv(wr_qp(wc.wr_id), wr_seq(wc.wr_id))?;
                        }
                    }
                }
                break;
            }
            if now > deadline {
                return Err(PerfError::Stalled(format!(
                    "{} of {} operations completed after {:.1} s",
                    total_done,
                    per_qp * nqp as u64,
                    (now - start).as_secs_f64()
                )));
            }
        }
        if sending {
            samples.push(((end - start).as_secs_f64(), total_done));
        }
        let stats = if sending {
            self.stats_since_mark(total_done, (end - start).as_secs_f64(), received)
        } else {
            self.stats_since_mark(0, 0.0, received)
        };
        Ok((stats, samples))
    }

    /// The client's side of a latency run: `warmup` untimed operations, then the timed
    /// ones; returns each one's latency.
    ///
    /// Over UC and UD a ping or its answer may be lost: each ping carries its number (the
    /// immediate data), the client waits [`LOSS_TIMEOUT`] for the answer with that number,
    /// then counts the ping lost and sends the next; a late answer is recognised by its
    /// number and ignored. Over RC nothing is lost, and a missing answer is a stall.
    pub(crate) fn lat_client(
        &self,
        ctl: &Control,
        peer: &SideInfo,
        size: u64,
        progress: &mut Progress,
    ) -> Result<(SideStats, Vec<Duration>), PerfError> {
        let spec = &self.spec;
        let deadline = Instant::now() + spec.run_deadline(size);
        let warmup = (spec.iters / 10).clamp(1, 1000);
        let duration = spec.duration_ms.map(Duration::from_millis);
        let pingpong = matches!(spec.op, Op::Send | Op::Write);
        let lossy = spec.conn != Conn::Rc;
        let mut samples = Vec::with_capacity(if duration.is_some() { 1 << 16 } else { spec.iters as usize });
        let mut wcs = [EMPTY_WC; 16];
        let mut seq = 0u64;
        let mut received = 0u64;
        let mut lost = 0u64;
        let mut timed_start = None;
        loop {
            let timed = seq >= warmup;
            if timed && timed_start.is_none() {
                timed_start = Some(Instant::now());
            }
            if let (Some(d), Some(t0)) = (duration, timed_start) {
                if t0.elapsed() >= d {
                    break;
                }
            } else if duration.is_none() && seq >= warmup + spec.iters {
                break;
            }
            let t = Instant::now();
            // Ping-pong sends are signaled one in LAT_SIGNAL_EVERY, to free the send queue;
            // READ and atomics always, as their completion is the answer.
            self.post(peer, 0, seq..seq + 1, size, |s| !pingpong || s % LAT_SIGNAL_EVERY == LAT_SIGNAL_EVERY - 1)?;
            let answered = 'wait: loop {
                let n = self.poll_cq(&mut wcs)?;
                for wc in &wcs[..n] {
                    Self::check(wc)?;
                    let answered = if wc.wr_id & RECV_BIT != 0 {
                        received += 1;
                        self.post_recv(0, wr_seq(wc.wr_id))?;
                        // Over RC answers come in order; elsewhere a late one is stale.
                        pingpong && (!lossy || wc.imm_data == Some(ping_number(seq)))
                    } else {
                        !pingpong
                    };
                    if answered {
                        break 'wait true;
                    }
                }
                if n == 0 {
                    // One clock read per empty poll serves both bounds.
                    let now = Instant::now();
                    if lossy && now - t > LOSS_TIMEOUT {
                        break 'wait false;
                    }
                    if now > deadline {
                        return Err(PerfError::Stalled(format!("operation {seq} got no answer")));
                    }
                }
            };
            if !answered {
                lost += 1;
            } else if timed {
                samples.push(t.elapsed());
                if samples.len() % 256 == 0 {
                    progress.set_run(samples.len() as u64, timed_start.map_or(Duration::ZERO, |t| t.elapsed()));
                }
            }
            seq += 1;
        }
        let seconds = timed_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
        ctl.send(&super::control::Msg::Finished)?;
        while !ctl.peer_finished()? {
            if Instant::now() > deadline {
                return Err(PerfError::Peer("the peer did not finish its run in time".into()));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let mut stats = self.stats_since_mark(samples.len() as u64, seconds, received);
        stats.lost = lost;
        Ok((stats, samples))
    }

    /// The server's side of a latency run: answers each ping (SEND, WRITE) with the same
    /// operation and the ping's number, or waits while its device answers READs and
    /// atomics, until the client says `Finished`.
    pub(crate) fn lat_server(&self, ctl: &Control, peer: &SideInfo, size: u64) -> Result<SideStats, PerfError> {
        let deadline = Instant::now() + self.spec.run_deadline(size);
        ctl.send(&super::control::Msg::Finished)?;
        let pingpong = matches!(self.spec.op, Op::Send | Op::Write);
        let mut wcs = [EMPTY_WC; 16];
        let mut seq = 0u64;
        let mut received = 0u64;
        let mut idle_polls = 0u32;
        while !ctl.peer_finished()? {
            if !pingpong {
                std::thread::sleep(Duration::from_millis(1));
            } else {
                let n = self.poll_cq(&mut wcs)?;
                for wc in &wcs[..n] {
                    Self::check(wc)?;
                    if wc.wr_id & RECV_BIT != 0 {
                        received += 1;
                        self.post_recv(0, wr_seq(wc.wr_id))?;
                        // The answer carries the ping's number (a ping lost over UC or UD
                        // leaves a gap the client skips).
                        let number = wc.imm_data.map_or(seq, |imm| u64::from(u32::from_be_bytes(imm)));
                        self.post_numbered(peer, size, seq, number)?;
                        seq += 1;
                    }
                }
                idle_polls = if n == 0 { idle_polls + 1 } else { 0 };
            }
            if idle_polls % 4096 == 4095 && Instant::now() > deadline {
                return Err(PerfError::Peer("the client did not finish its run in time".into()));
            }
        }
        Ok(self.stats_since_mark(seq, 0.0, received))
    }

    /// Takes the counters a run's figures start from: before the peer may start sending.
    pub(crate) fn mark(&self) {
        self.mark.set(self.counters());
    }

    /// A run's stats: `ops` operations in `seconds`, `received` messages, and the packet
    /// counters since [`mark`](Side::mark).
    fn stats_since_mark(&self, ops: u64, seconds: f64, received: u64) -> SideStats {
        let (m0, m1) = (self.mark.get(), self.counters());
        SideStats {
            ops,
            seconds,
            received,
            lost: 0,
            retransmitted: m1.retransmitted - m0.retransmitted,
            packets_sent: m1.sent - m0.sent,
            packets_received: m1.received - m0.received,
            packets_same_host: m1.same_host - m0.same_host,
            packets_by_reference: m1.by_reference - m0.by_reference,
            channel_waits_polled: m1.waits_polled - m0.waits_polled,
            channel_waits_slept: m1.waits_slept - m0.waits_slept,
            channel_events: m1.events - m0.events,
        }
    }
}

/// The longest `-e` sleeps on the completion channel before its loop looks at the clock.
const EVENT_WAIT: Duration = Duration::from_millis(10);

/// How long a latency ping over UC or UD waits for its answer before it counts as lost.
const LOSS_TIMEOUT: Duration = Duration::from_millis(20);

/// The immediate data that numbers latency ping `seq`.
fn ping_number(seq: u64) -> [u8; 4] {
    (seq as u32).to_be_bytes()
}

/// Whether the peer's memory region can take `spec`'s operations as this side will aim
/// them: a check before the first operation rather than a remote access error after it.
pub(crate) fn check_peer(spec: &Spec, peer: &SideInfo) -> Result<(), PerfError> {
    if peer.qps.len() != spec.qps as usize {
        return Err(PerfError::Peer(format!("the peer made {} QPs, not {}", peer.qps.len(), spec.qps)));
    }
    if peer.stride < spec.max_size() || peer.len < peer.stride * peer.slots * u64::from(spec.qps) {
        return Err(PerfError::Peer("the peer's memory region is smaller than the test needs".into()));
    }
    Ok(())
}
