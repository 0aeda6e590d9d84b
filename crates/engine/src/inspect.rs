//! A look inside: read-only snapshots of the device's objects, for tools such as
//! `softrdma res` (what `rdma res show qp|cq|mr|pd|srq` shows of a kernel device).
//!
//! Every accessor here only reads; none changes the engine or allocates beyond the value it
//! returns. The snapshot of a QP is what its requester, completer and responder hold at the
//! call, so a caller that wants one consistent picture of the device takes them all under
//! one borrow of the engine.

use core::net::IpAddr;
use std::collections::BTreeMap;

use softrdma_wire::{Gid, Psn, Qpn, RKey};

use crate::engine::Engine;
use crate::verbs::{Access, CqId, LKey, Mtu, PdId, QpState, QpType, SrqId, XrcdId};

/// A QP's share of the device's retry and NAK counters ([`crate::Counters`]), counted at the
/// same places.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct QpCounters {
    /// Local ACK timeouts of its requester (each one a retry, or the last one
    /// `RETRY_EXC_ERR`).
    pub ack_timeouts: u64,
    /// Packets its requester sent again (go-back-N after a NAK, an implied NAK or a
    /// timeout).
    pub retransmitted_packets: u64,
    /// RNR NAKs its requester received (the peer had no receive posted).
    pub rnr_naks_rcvd: u64,
    /// RNR NAKs its responder sent.
    pub rnr_naks_sent: u64,
    /// NAKs (not RNR) its requester received.
    pub naks_rcvd: u64,
    /// NAKs (not RNR) its responder sent.
    pub naks_sent: u64,
}

/// Where a connected QP's packets go, and what it accepts packets from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QpPeer {
    /// The peer's GID (its IP address).
    pub gid: Gid,
    /// The peer's QP (`dest_qp_num`).
    pub qpn: Qpn,
    /// This side's address (the source GID of the QP's address vector), once the engine
    /// built the QP's envelope.
    pub local_ip: Option<IpAddr>,
    /// The UDP port the QP's packets go to (4791).
    pub udp_port: Option<u16>,
    /// The UDP source port the peer sends from, once its first packet proved it is the
    /// peer; packets from any other port are dropped.
    pub source_port: Option<u16>,
}

/// One QP as [`Engine::qps`] sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QpInfo {
    /// Its number.
    pub qpn: Qpn,
    /// RC, UC, UD, XRC INI or XRC TGT.
    pub qp_type: QpType,
    /// Its state.
    pub state: QpState,
    /// Its PD (an XRC TGT QP's: that of the SRQ its latest request named).
    pub pd: PdId,
    /// The CQ its send completions go to.
    pub send_cq: CqId,
    /// The CQ its receive completions go to.
    pub recv_cq: CqId,
    /// The SRQ it takes receives from, if any.
    pub srq: Option<SrqId>,
    /// An XRC TGT QP's domain.
    pub xrcd: Option<XrcdId>,
    /// The path MTU.
    pub path_mtu: Mtu,
    /// The next PSN its requester sends (`sq-psn`).
    pub sq_psn: Psn,
    /// The oldest PSN its requester has sent and not seen acknowledged (RC; equal to
    /// `sq_psn` when nothing is outstanding).
    pub unacked_psn: Psn,
    /// The next PSN its responder expects (`rq-psn`).
    pub rq_psn: Psn,
    /// Send work requests posted and not completed.
    pub send_queued: u32,
    /// The send queue's depth.
    pub send_depth: u32,
    /// Receive work requests posted and not consumed (0 with an SRQ).
    pub recv_queued: u32,
    /// The receive queue's depth.
    pub recv_depth: u32,
    /// Send work requests whose packets have (at least in part) left and which are not
    /// complete: for RC, waiting for their ACK or answer.
    pub messages_in_flight: u32,
    /// RC: packets sent and not acknowledged.
    pub packets_in_flight: u32,
    /// READs and atomics sent and not answered.
    pub rd_atomic_outstanding: u32,
    /// `retry_cnt`, as set.
    pub retry_cnt: u8,
    /// Retries left for the message at the head of the send queue.
    pub retries_left: u8,
    /// `rnr_retry`, as set (7 = forever).
    pub rnr_retry: u8,
    /// RNR retries left for the message at the head (7 = forever).
    pub rnr_retries_left: u8,
    /// The local ACK timeout exponent (4.096 µs × 2^timeout; 0 waits forever).
    pub timeout: u8,
    /// The requester is waiting out an RNR NAK's timer.
    pub rnr_waiting: bool,
    /// The peer, for a connected QP that has its address vector (RTR on).
    pub peer: Option<QpPeer>,
    /// Its Q_Key (UD).
    pub qkey: u32,
    /// Its packets are authenticated (softrdma's authenticated mode).
    pub authenticated: bool,
    /// Its retry and NAK counters.
    pub counters: QpCounters,
}

/// One CQ as [`Engine::cqs`] sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CqInfo {
    /// Its number.
    pub cq: CqId,
    /// How many completions it holds at most (`cqe`).
    pub depth: u32,
    /// Completions queued, not polled yet.
    pub queued: u32,
    /// Armed for a completion event (`ibv_req_notify_cq`).
    pub armed: bool,
    /// It overflowed (a completion found it full): its QPs went to the error state.
    pub overflowed: bool,
    /// QPs whose send or receive completions go to it.
    pub users: u32,
}

/// One memory region as [`Engine::mrs`] sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MrInfo {
    /// Its index in the device's table (`mrn`).
    pub index: u32,
    /// Its PD.
    pub pd: PdId,
    /// Its local key.
    pub lkey: LKey,
    /// Its remote key.
    pub rkey: RKey,
    /// The address work requests and peers name its first byte by.
    pub iova: u64,
    /// Its length in bytes.
    pub length: u64,
    /// What it allows.
    pub access: Access,
    /// Memory windows bound to it.
    pub windows: u32,
}

/// One shared receive queue as [`Engine::srqs`] sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SrqInfo {
    /// Its number (an XRC SRQ's on the wire).
    pub srq: SrqId,
    /// Its PD.
    pub pd: PdId,
    /// Receives it holds at most.
    pub depth: u32,
    /// Receives posted and not consumed.
    pub queued: u32,
    /// SGEs per receive.
    pub max_sge: u32,
    /// The armed limit (0: not armed).
    pub limit: u32,
    /// An XRC SRQ's domain and the CQ its receives complete to.
    pub xrc: Option<(XrcdId, CqId)>,
}

impl Engine {
    /// Every QP, by number.
    pub fn qps(&self) -> impl Iterator<Item = QpInfo> + '_ {
        self.qps.values().map(|qp| {
            let reliable = matches!(qp.qp_type, QpType::Rc | QpType::XrcIni);
            let sq = &qp.sq;
            let started = u32::from(qp.req.next < sq.tail() && qp.req.offset > 0);
            let messages_in_flight = (qp.req.next.saturating_sub(sq.head()) as u32).saturating_add(started);
            let packets_in_flight =
                if reliable { qp.comp.psn.distance_to(qp.req.psn).max(0).unsigned_abs() } else { 0 };
            let peer = match (qp.qp_type.is_connected(), qp.av()) {
                (true, Some(av)) => Some(QpPeer {
                    gid: av.dgid,
                    qpn: Qpn::from_u24_truncating(qp.attr.dest_qp_num),
                    local_ip: qp.envelope.map(|e| e.src_ip()),
                    udp_port: qp.envelope.map(|e| e.dst_port()),
                    source_port: qp.peer_port,
                }),
                _ => None,
            };
            QpInfo {
                qpn: qp.qpn,
                qp_type: qp.qp_type,
                state: qp.state,
                pd: qp.pd,
                send_cq: qp.send_cq,
                recv_cq: qp.recv_cq,
                srq: qp.srq,
                xrcd: qp.xrcd,
                path_mtu: qp.attr.path_mtu,
                sq_psn: qp.req.psn,
                unacked_psn: if reliable { qp.comp.psn } else { qp.req.psn },
                rq_psn: qp.resp.psn,
                send_queued: sq.len(),
                send_depth: qp.cap.max_send_wr,
                recv_queued: if qp.srq.is_some() { 0 } else { qp.rq.len() },
                recv_depth: qp.cap.max_recv_wr,
                messages_in_flight: if reliable { messages_in_flight } else { 0 },
                packets_in_flight,
                rd_atomic_outstanding: qp.req.rd_atomic_outstanding,
                retry_cnt: qp.attr.retry_cnt,
                retries_left: qp.comp.retry_left,
                rnr_retry: qp.attr.rnr_retry,
                rnr_retries_left: qp.comp.rnr_retry_left,
                timeout: qp.attr.timeout,
                rnr_waiting: qp.comp.rnr_wait_until.is_some(),
                peer,
                qkey: qp.attr.qkey.0,
                authenticated: qp.keys.is_some(),
                counters: qp.counters,
            }
        })
    }

    /// Every CQ, by number.
    pub fn cqs(&self) -> impl Iterator<Item = CqInfo> + '_ {
        // Users counted in one pass over the QPs, not one per CQ: a program with a CQ per
        // QP has thousands of each.
        let mut users: BTreeMap<u32, u32> = BTreeMap::new();
        for q in self.qps.values() {
            *users.entry(q.send_cq.0).or_default() += 1;
            if q.recv_cq != q.send_cq {
                *users.entry(q.recv_cq.0).or_default() += 1;
            }
        }
        self.shared.cqs.iter().map(move |(i, c)| CqInfo {
            cq: CqId(i as u32),
            depth: c.capacity,
            queued: c.entries.len() as u32,
            armed: c.notify.is_some(),
            overflowed: c.overflowed,
            users: users.get(&(i as u32)).copied().unwrap_or(0),
        })
    }

    /// Every memory region, by index.
    pub fn mrs(&self) -> impl Iterator<Item = MrInfo> + '_ {
        self.shared.mrs.iter().map(|(i, m)| MrInfo {
            index: i as u32,
            pd: m.pd,
            lkey: m.keys.lkey,
            rkey: m.keys.rkey,
            iova: m.iova,
            length: m.length,
            access: m.access,
            windows: m.windows,
        })
    }

    /// Every shared receive queue, by number.
    pub fn srqs(&self) -> impl Iterator<Item = SrqInfo> + '_ {
        self.shared.srqs.iter().map(|(i, s)| SrqInfo {
            srq: SrqId(i as u32),
            pd: s.pd,
            depth: s.ring.capacity(),
            queued: s.ring.len(),
            max_sge: s.max_sge,
            limit: s.limit,
            xrc: s.xrc,
        })
    }

    /// Every protection domain with its number of users (MRs, MWs, QPs, SRQs and AHs).
    pub fn pds(&self) -> impl Iterator<Item = (PdId, u32)> + '_ {
        self.shared.pds.iter().map(|(i, &users)| (PdId(i as u32), users))
    }
}
