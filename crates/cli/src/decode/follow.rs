//! `softrdma decode --follow QPN`: a capture read as the conversation of one QP and its
//! peer, the way Wireshark's "Follow stream" reads a TCP connection.
//!
//! The followed QP is side A, its peer side B. The peer is found from the CM's REQ and REP
//! that name the QP, if the capture holds them (which also brings the connection's MADs
//! into the conversation); else from the traffic: of the QPs that A's host sends to on the
//! host that sends to A, the one whose PSNs answer A's (a request's PSN comes back in its
//! ACK or response) is the peer. Each requester's PSNs are one space: the requests it sends
//! and the responses it gets. In it:
//!
//! - a request PSN at or before the highest one the requester sent already (a READ counts
//!   its responses' PSNs) is a retransmission, tagged with the message it first belonged to;
//! - messages are numbered per requester (`A1`, `A2`, ...; `B1`, ... for the peer's) from
//!   their FIRST or ONLY packet, and every packet of a message, its responses included,
//!   carries the number;
//! - an ACK (or READ response, or atomic ACK) of PSN p acknowledges every message ending at
//!   or before p (IBA 9.7.5.1.1: ACKs are cumulative); a NAK of PSN p acknowledges those
//!   before p, and names the message it refuses. A READ ends with its last response. A
//!   message sent again after its answer (which the requester then did not get: the
//!   capture saw it before it was lost) waits for a later one.
//!
//! Three passes over the file, so that memory holds the conversation, not the capture.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::{self, Write as _};
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use softrdma_pcap::{CaptureReader, Frame};
use softrdma_wire::cm::CmMessage;
use softrdma_wire::datagram::UdpDatagram;
use softrdma_wire::mad::{MAD_LEN, MadPacket, MadRepr};
use softrdma_wire::opcode::{Operation, Position};
use softrdma_wire::{NakCode, Opcode, Psn, RocePacket, RoceRepr, Syndrome};

use super::{DecodeError, Format};

/// What `--follow` names: a QPN, and optionally the address of its host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) host: Option<IpAddr>,
    pub(crate) qpn: u32,
}

impl std::str::FromStr for Target {
    type Err = String;
    /// `0x11`, `17`, or `198.18.0.3/0x11` when the QPN exists on both hosts.
    fn from_str(s: &str) -> Result<Self, String> {
        let (host, qpn) = match s.rsplit_once('/') {
            Some((h, q)) => {
                let host = h.parse::<IpAddr>().map_err(|_| {
                    format!("{h:?} is not an IP address (write ADDR/QPN, e.g. 198.18.0.3/0x11, or just the QPN)")
                })?;
                (Some(host), q)
            }
            None => (None, s),
        };
        let n = match qpn.strip_prefix("0x").or_else(|| qpn.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => qpn.parse(),
        };
        match n {
            Ok(n) if n <= 0xff_ffff => Ok(Target { host, qpn: n }),
            _ => Err(format!("{qpn:?} is not a QP number (0 to 0xffffff: hex with 0x, or decimal; e.g. 0x11)")),
        }
    }
}

/// One RoCEv2 packet, as much as the conversation needs.
struct Pkt {
    frame: usize,
    timestamp: Duration,
    src: IpAddr,
    dst: IpAddr,
    opcode: Opcode,
    dest_qp: u32,
    psn: Psn,
    ack_req: bool,
    dma_length: Option<u32>,
    syndrome: Option<Syndrome>,
    src_qp: Option<u32>,
    original_data: Option<u64>,
    payload_len: usize,
    /// A hash of the whole UDP payload (ICRC included): the same packet captured twice has
    /// the same.
    digest: u64,
    cm: Option<CmInfo>,
}

/// A CM MAD's identity.
#[derive(Clone, Copy)]
struct CmInfo {
    message: &'static str,
    local_comm_id: Option<u32>,
    remote_comm_id: Option<u32>,
    /// The sender's QP (REQ, REP).
    qpn: Option<u32>,
    starting_psn: Option<u32>,
}

/// Reads every frame of `path`, handing each RoCEv2 packet to `each`; returns the first
/// frame's time (the decoder's time origin).
fn scan(path: &Path, mut each: impl FnMut(Pkt)) -> Result<Option<Duration>, DecodeError> {
    let reader = CaptureReader::open(path).map_err(DecodeError::Capture)?;
    let mut first = None;
    for (index, frame) in reader.enumerate() {
        let frame = frame.map_err(DecodeError::Capture)?;
        first.get_or_insert(frame.timestamp);
        if let Some(p) = packet(index + 1, &frame) {
            each(p);
        }
    }
    Ok(first)
}

fn packet(number: usize, frame: &Frame) -> Option<Pkt> {
    let dgram = UdpDatagram::parse(frame.ip_packet().ok()?).ok().filter(UdpDatagram::is_roce)?;
    let packet = RocePacket::new_checked(dgram.payload).ok()?;
    let repr = RoceRepr::parse_ignoring_icrc(&packet).ok()?;
    let envelope = dgram.envelope();
    let cm = (repr.bth.dest_qp.value() == 1 && repr.payload.len() == MAD_LEN)
        .then(|| MadRepr::parse(&MadPacket::new_unchecked(repr.payload)).ok())
        .flatten()
        .and_then(|mad| {
            let m = CmMessage::parse(&mad).ok()?;
            let (qpn, starting_psn) = match &m {
                CmMessage::Req(r) => (Some(r.local_qpn.value()), Some(r.starting_psn.value())),
                CmMessage::Rep(r) => (Some(r.local_qpn.value()), Some(r.starting_psn.value())),
                _ => (None, None),
            };
            Some(CmInfo {
                message: m.name(),
                local_comm_id: m.local_comm_id(),
                remote_comm_id: m.remote_comm_id(),
                qpn,
                starting_psn,
            })
        });
    Some(Pkt {
        frame: number,
        timestamp: frame.timestamp,
        src: envelope.src_ip(),
        dst: envelope.dst_ip(),
        opcode: repr.bth.opcode,
        dest_qp: repr.bth.dest_qp.value(),
        psn: repr.bth.psn,
        ack_req: repr.bth.ack_req,
        dma_length: repr.ext.reth.map(|r| r.dma_length),
        syndrome: repr.ext.aeth.map(|a| a.syndrome),
        src_qp: repr.ext.deth.map(|d| d.src_qp.value()),
        original_data: repr.ext.atomic_ack_eth.map(|a| a.original_data),
        payload_len: repr.payload.len(),
        digest: {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            dgram.payload.hash(&mut h);
            h.finish()
        },
        cm,
    })
}

/// A set of 24-bit PSNs: 2 MiB, whatever the capture's size.
struct PsnSet(Vec<u64>);

impl PsnSet {
    fn new() -> Self {
        PsnSet(vec![0; (Psn::MODULUS / 64) as usize])
    }
    fn insert(&mut self, p: Psn) {
        self.0[(p.value() / 64) as usize] |= 1 << (p.value() % 64);
    }
    fn contains(&self, p: Psn) -> bool {
        self.0[(p.value() / 64) as usize] & (1 << (p.value() % 64)) != 0
    }
}

/// The two ends of the conversation, and how the peer was found.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Conversation {
    a_host: IpAddr,
    a_qpn: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    b_host: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    b_qpn: Option<u32>,
    /// "cm" (the REQ and REP), "psn" (PSNs answered), "only" (the one QP A's host sends to
    /// there), "deth" (UD: the DETH's source QP), or "none" (nothing goes back).
    peer_found_by: &'static str,
    /// The connection's CM comm IDs (from the REQ and REP).
    #[serde(skip)]
    comm_ids: Vec<u32>,
    /// Other hosts where a QP of this number receives packets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    also_at: Vec<IpAddr>,
}

impl Conversation {
    /// Which side sent `p`, if it belongs to the conversation.
    fn side_of(&self, p: &Pkt) -> Option<Side> {
        if let Some(cm) = &p.cm {
            let ours = [cm.local_comm_id, cm.remote_comm_id].iter().flatten().any(|id| self.comm_ids.contains(id));
            return match ours {
                true if p.src == self.a_host => Some(Side::A),
                true if Some(p.src) == self.b_host => Some(Side::B),
                _ => None,
            };
        }
        if p.dest_qp == self.a_qpn && p.dst == self.a_host && self.b_host.is_none_or(|h| h == p.src) {
            return Some(Side::B);
        }
        if Some(p.dest_qp) == self.b_qpn && p.src == self.a_host && Some(p.dst) == self.b_host {
            return Some(Side::A);
        }
        None
    }
}

/// An end of the conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
enum Side {
    A,
    B,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// The packets to a QP of the followed number on one host.
struct Arrivals {
    packets: usize,
    /// Packets per sending host.
    sources: BTreeMap<IpAddr, usize>,
    psns: PsnSet,
}

impl Arrivals {
    fn new() -> Self {
        Arrivals { packets: 0, sources: BTreeMap::new(), psns: PsnSet::new() }
    }
}

/// Finds the followed QP's host and its peer (passes one and two).
fn find_conversation(path: &Path, target: Target) -> Result<Conversation, DecodeError> {
    // Pass one: where packets to the QP go and come from, the PSNs they carry, the CM.
    let mut to_qp: BTreeMap<IpAddr, Arrivals> = BTreeMap::new();
    let mut reqs: Vec<(IpAddr, CmInfo)> = Vec::new();
    let mut reps: Vec<(IpAddr, CmInfo)> = Vec::new();
    let mut seen_qps: BTreeMap<u32, usize> = BTreeMap::new();
    scan(path, |p| {
        if let Some(cm) = p.cm {
            match cm.message {
                "REQ" => reqs.push((p.src, cm)),
                "REP" => reps.push((p.src, cm)),
                _ => {}
            }
            return;
        }
        *seen_qps.entry(p.dest_qp).or_default() += 1;
        if p.dest_qp == target.qpn {
            // At most a few hosts hold a QP of one number: one PSN set each.
            let e = to_qp.entry(p.dst).or_insert_with(Arrivals::new);
            e.packets += 1;
            *e.sources.entry(p.src).or_default() += 1;
            e.psns.insert(p.psn);
        }
    })?;
    // The CM names both QPs, when the capture holds the REQ and its REP.
    let by_cm = reqs.iter().find_map(|(req_host, req)| {
        let rep = reps.iter().find(|(_, rep)| rep.remote_comm_id == req.local_comm_id)?;
        let (rep_host, rep) = rep;
        let ids = [req.local_comm_id, rep.local_comm_id].into_iter().flatten().collect::<Vec<u32>>();
        let at = |host: &IpAddr| target.host.is_none_or(|h| h == *host);
        if req.qpn == Some(target.qpn) && at(req_host) {
            Some((*req_host, *rep_host, rep.qpn?, ids))
        } else if rep.qpn == Some(target.qpn) && at(rep_host) {
            Some((*rep_host, *req_host, req.qpn?, ids))
        } else {
            None
        }
    });
    let hosts: Vec<IpAddr> = to_qp.keys().copied().collect();
    if let Some((a_host, b_host, b_qpn, comm_ids)) = by_cm {
        return Ok(Conversation {
            a_host,
            a_qpn: target.qpn,
            b_host: Some(b_host),
            b_qpn: Some(b_qpn),
            peer_found_by: "cm",
            comm_ids,
            also_at: hosts.into_iter().filter(|h| *h != a_host).collect(),
        });
    }
    let here = to_qp.iter().filter(|(h, _)| target.host.is_none_or(|t| t == **h));
    let Some((a_host, Arrivals { sources, psns, .. })) = here.max_by_key(|(_, e)| e.packets) else {
        let mut qps = String::new();
        for (qpn, n) in seen_qps.iter().take(32) {
            let _ = write!(qps, " {qpn:#08x} ({n})");
        }
        let at = target.host.map(|h| format!(" at {h}")).unwrap_or_default();
        return Err(DecodeError::Follow(format!(
            "no packet goes to QP {:#08x}{at} in {}; the destination QPs in it (packets):{}",
            target.qpn,
            path.display(),
            if qps.is_empty() { " none".to_string() } else { qps }
        )));
    };
    let a_host = *a_host;
    let b_host = sources.iter().max_by_key(|(_, n)| **n).map(|(h, _)| *h);
    // Pass two: of the QPs A's host sends to on B's, the one whose PSNs answer A's.
    let mut score: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    let mut deth_peer = None;
    scan(path, |p| {
        if p.dest_qp == target.qpn && p.dst == a_host && Some(p.src) == b_host {
            deth_peer = deth_peer.or(p.src_qp.filter(|&q| q != 1));
        }
        // Both ends on one host (two processes, or one holding both): what goes to A goes
        // from A's host to B's too, and B's QP has another number than A's (on different
        // hosts it may have the same).
        let to_a = p.dest_qp == target.qpn && b_host == Some(a_host);
        if p.cm.is_some() || p.dest_qp == 1 || to_a || p.src != a_host || Some(p.dst) != b_host {
            return;
        }
        let s = score.entry(p.dest_qp).or_default();
        s.1 += 1;
        if psns.contains(p.psn) {
            s.0 += 1;
        }
    })?;
    let best = score.iter().max_by_key(|(_, s)| **s).map(|(q, s)| (*q, *s));
    let (b_qpn, how) = match (deth_peer, best) {
        (Some(q), _) => (Some(q), "deth"),
        (None, Some((q, (hits, _)))) if hits > 0 => (Some(q), "psn"),
        (None, Some((q, _))) if score.len() == 1 => (Some(q), "only"),
        _ => (None, "none"),
    };
    Ok(Conversation {
        a_host,
        a_qpn: target.qpn,
        b_host,
        b_qpn,
        peer_found_by: how,
        comm_ids: Vec::new(),
        also_at: hosts.into_iter().filter(|h| *h != a_host).collect(),
    })
}

/// A message: one work request's packets (a READ's responses too).
struct Message {
    number: u32,
    op: &'static str,
    /// The first PSN, unwrapped (see [`Space`]).
    start: i64,
    /// The last PSN, once known (the LAST packet seen, or a READ's span from the path MTU).
    end: Option<i64>,
    /// Whether the message is a READ (its responses carry its data).
    read: bool,
    /// The frame of the ACK or response that completed it.
    acked_by: Option<usize>,
    /// The frame of a NAK that refused it, and the NAK.
    naked_by: Option<(usize, String)>,
    retransmitted: u32,
}

/// A requester's PSN space: its requests and the responses to them. PSNs are unwrapped
/// into a line (each one the nearest to the last seen), so that ranges compare across the
/// 24-bit wrap.
#[derive(Default)]
struct Space {
    last: Option<(Psn, i64)>,
    /// The highest PSN the requester has used, its READs' spans included.
    high: Option<i64>,
    /// Messages by first PSN.
    messages: BTreeMap<i64, usize>,
    all: Vec<Message>,
    /// The message still waiting for its LAST packet.
    open: Option<usize>,
    /// The highest PSN acknowledged.
    acked: Option<i64>,
    /// Response packets seen, by (unwrapped PSN, opcode): one seen again is a retransmission.
    responses: HashMap<(i64, u8), u32>,
}

impl Space {
    fn unwrap(&mut self, p: Psn) -> i64 {
        let u = match self.last {
            Some((last, u)) => u + i64::from(last.distance_to(p)),
            None => i64::from(p.value()),
        };
        self.last = Some((p, u));
        u
    }

    /// The message holding PSN `u`.
    fn message_at(&self, u: i64) -> Option<usize> {
        let (_, &i) = self.messages.range(..=u).next_back()?;
        let m = &self.all[i];
        (m.end.is_none_or(|e| u <= e) || m.start == u).then_some(i)
    }

    /// Marks every message ending at or before `upto` acknowledged by `frame`; returns
    /// their numbers.
    fn ack_through(&mut self, upto: i64, frame: usize, reads_too: bool) -> Vec<u32> {
        let mut acked = Vec::new();
        for (_, &i) in self.messages.range(..=upto) {
            let m = &mut self.all[i];
            if m.acked_by.is_some() || m.end.is_none_or(|e| e > upto) || (m.read && !reads_too) {
                continue;
            }
            m.acked_by = Some(frame);
            acked.push(m.number);
        }
        if self.acked.is_none_or(|a| a < upto) {
            self.acked = Some(upto);
        }
        acked
    }
}

/// One line of the conversation.
#[derive(Serialize, Debug)]
pub(crate) struct FollowLine {
    frame: usize,
    /// Seconds since the first frame of the capture (as `softrdma decode` shows).
    time: f64,
    /// `A>B` or `B>A`.
    dir: &'static str,
    opcode: String,
    psn: u32,
    dest_qp: u32,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ack_req: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    len: Option<usize>,
    /// The message: `A3` (A's third), with its operation and this packet's place in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<MessageTag>,
    /// A request PSN sent before (or a response sent again).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    retransmission: bool,
    /// An ACK that acknowledges nothing new.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    duplicate: bool,
    /// The same packet captured a second time (a capture of both ends): not analysed again.
    #[serde(skip_serializing_if = "Option::is_none")]
    copy_of: Option<usize>,
    /// The messages this ACK, response or NAK completes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    acks: Vec<String>,
    /// On the packet that ends a message: the frame of the ACK or response that completed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    acked_by: Option<usize>,
    /// On the packet that ends a message: the frame of the NAK that refused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    naked_by: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nak: Option<NakInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    original_data: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cm: Option<CmLine>,
    /// Where the message index and side are, to fill `acked_by` in afterwards.
    #[serde(skip)]
    ends: Option<(Side, usize)>,
}

#[derive(Serialize, Debug)]
struct MessageTag {
    /// `A3`.
    id: String,
    side: Side,
    number: u32,
    /// SEND, SEND_IMM, SEND_INV, WRITE, WRITE_IMM, READ, CMP_SWAP, FETCH_ADD, FLUSH,
    /// ATOMIC_WRITE.
    op: &'static str,
    /// first, middle, last, only; for a READ: request, response first/middle/last/only;
    /// for an atomic: request, response; for an ACK or NAK: the message it names.
    part: &'static str,
}

#[derive(Serialize, Debug)]
struct NakInfo {
    /// PSN_SEQUENCE_ERROR, INVALID_REQUEST, REMOTE_ACCESS_ERROR, REMOTE_OPERATIONAL_ERROR,
    /// RNR, ...
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    rnr_timer: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rnr_delay_us: Option<u32>,
}

#[derive(Serialize, Debug)]
struct CmLine {
    message: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    qpn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    starting_psn: Option<u32>,
}

/// What the conversation held.
#[derive(Serialize, Debug, Default)]
pub(crate) struct FollowSummary {
    packets: usize,
    a_to_b: usize,
    b_to_a: usize,
    /// Messages per side, by operation.
    messages_a: BTreeMap<&'static str, u32>,
    messages_b: BTreeMap<&'static str, u32>,
    /// Messages never acknowledged within the capture.
    unacked_a: u32,
    unacked_b: u32,
    /// Retransmitted request packets per side.
    retransmissions_a: u32,
    retransmissions_b: u32,
    /// NAKs by kind (sent by either side).
    naks: BTreeMap<String, u32>,
    cm_messages: u32,
    /// Packets captured a second time (a capture of both ends), shown but not analysed.
    copies: u32,
    /// Seconds from the first packet of the conversation to its last.
    duration: f64,
}

/// How close a second capture of a packet follows the first.
const COPY_WINDOW: Duration = Duration::from_millis(1);
/// How many of a side's packets are kept to find copies among.
const COPY_RECENT: usize = 256;

/// The operation a request opcode starts, as `ibv_wr_opcode` names it (shorter).
fn op_name(op: Operation) -> &'static str {
    match op {
        Operation::Send => "SEND",
        Operation::SendWithImm => "SEND_IMM",
        Operation::SendWithInvalidate => "SEND_INV",
        Operation::RdmaWrite => "WRITE",
        Operation::RdmaWriteWithImm => "WRITE_IMM",
        Operation::RdmaReadRequest | Operation::RdmaReadResponse => "READ",
        Operation::CompareSwap => "CMP_SWAP",
        Operation::FetchAdd => "FETCH_ADD",
        Operation::Flush => "FLUSH",
        Operation::AtomicWrite => "ATOMIC_WRITE",
        Operation::Acknowledge | Operation::AtomicAcknowledge => "ACK",
        Operation::Cnp => "CNP",
    }
}

fn part_name(pos: Position) -> &'static str {
    match pos {
        Position::First => "first",
        Position::Middle => "middle",
        Position::Last => "last",
        Position::Only => "only",
    }
}

/// Reads `path` as the conversation of `target` and writes it to `out`, a line per packet
/// and a summary.
pub(crate) fn run(path: &Path, target: Target, format: Format, out: &mut impl Write) -> Result<(), DecodeError> {
    let conv = find_conversation(path, target)?;
    // Pass three: the conversation's packets, in order.
    let mut pkts = Vec::new();
    let origin = scan(path, |p| {
        if let Some(side) = conv.side_of(&p) {
            pkts.push((side, p));
        }
    })?
    .unwrap_or_default();
    // The path MTU: the payload of any FIRST or MIDDLE packet (requests or READ responses).
    let pmtu = pkts
        .iter()
        .filter(|(_, p)| p.opcode.info().is_some_and(|i| matches!(i.position, Position::First | Position::Middle)))
        .map(|(_, p)| p.payload_len)
        .max()
        .filter(|&m| m > 0);
    let (lines, summary) = analyse(&pkts, origin, pmtu);
    write_out(&conv, &lines, &summary, format, out)
}

fn analyse(pkts: &[(Side, Pkt)], origin: Duration, pmtu: Option<usize>) -> (Vec<FollowLine>, FollowSummary) {
    let mut spaces = [Space::default(), Space::default()];
    // Per side: its last packets (digest, time, frame), the frame of its last NAK and of
    // its last retransmitted request.
    let mut recent: [VecDeque<(u64, Duration, usize)>; 2] = Default::default();
    let mut last_nak = [0usize; 2];
    let mut last_retransmission = [0usize; 2];
    let mut lines: Vec<FollowLine> = Vec::with_capacity(pkts.len());
    let mut summary = FollowSummary::default();
    for (side, p) in pkts {
        let side = *side;
        summary.packets += 1;
        match side {
            Side::A => summary.a_to_b += 1,
            Side::B => summary.b_to_a += 1,
        }
        let mut line = FollowLine {
            frame: p.frame,
            time: p.timestamp.saturating_sub(origin).as_secs_f64(),
            dir: if side == Side::A { "A>B" } else { "B>A" },
            opcode: p.opcode.to_string(),
            psn: p.psn.value(),
            dest_qp: p.dest_qp,
            ack_req: p.ack_req,
            len: (p.payload_len > 0 && p.cm.is_none()).then_some(p.payload_len),
            message: None,
            retransmission: false,
            duplicate: false,
            copy_of: None,
            acks: Vec::new(),
            acked_by: None,
            naked_by: None,
            nak: None,
            original_data: p.original_data,
            cm: None,
            ends: None,
        };
        // A capture of both ends (a process whose two devices share SOFTRDMA_PCAP, or two
        // captures merged) holds each packet twice: as sent, then as received. The second
        // is the same bytes from the same side within 1 ms; but so is a request resent at
        // once after a NAK (a NAK from the other side came between), or an answer repeated
        // for a request sent again (a retransmission from the other side came between).
        let mine = &recent[side.index()];
        let earlier =
            mine.iter().rev().find(|(d, t, _)| *d == p.digest && p.timestamp.saturating_sub(*t) < COPY_WINDOW);
        let other = side.other().index();
        let copy = earlier.map(|e| e.2).filter(|&f| match p.opcode.info() {
            Some(i) if i.is_request() => last_nak[other] < f,
            Some(i) if i.is_response() => last_retransmission[other] < f,
            _ => true,
        });
        let mine = &mut recent[side.index()];
        if let Some(f) = copy {
            summary.copies += 1;
            line.copy_of = Some(f);
            lines.push(line);
            continue;
        }
        if mine.len() == COPY_RECENT {
            mine.pop_front();
        }
        mine.push_back((p.digest, p.timestamp, p.frame));
        if let Some(cm) = &p.cm {
            summary.cm_messages += 1;
            line.cm = Some(CmLine { message: cm.message, qpn: cm.qpn, starting_psn: cm.starting_psn });
            lines.push(line);
            continue;
        }
        let Some(info) = p.opcode.info() else {
            lines.push(line);
            continue;
        };
        if info.operation == Operation::Cnp {
            lines.push(line);
            continue;
        }
        if matches!(p.syndrome, Some(Syndrome::Nak(_) | Syndrome::RnrNak(_))) && info.is_response() {
            last_nak[side.index()] = p.frame;
        }
        if info.is_request() {
            request(&mut spaces[side.index()], side, p, info, pmtu, &mut line, &mut summary);
            if line.retransmission {
                last_retransmission[side.index()] = p.frame;
            }
        } else {
            // A response travels in the requester's space: the other side's.
            let requester = side.other();
            response(&mut spaces[requester.index()], requester, p, info, &mut line, &mut summary);
        }
        lines.push(line);
    }
    // Pair each message's closing packet with its answer.
    for line in &mut lines {
        if let Some((s, i)) = line.ends {
            let m = &spaces[s.index()].all[i];
            line.acked_by = m.acked_by;
            line.naked_by = m.naked_by.as_ref().map(|n| n.0);
        }
    }
    for (s, space) in spaces.iter().enumerate() {
        let (ops, unacked) = if s == 0 {
            (&mut summary.messages_a, &mut summary.unacked_a)
        } else {
            (&mut summary.messages_b, &mut summary.unacked_b)
        };
        for m in &space.all {
            *ops.entry(m.op).or_default() += 1;
            if m.acked_by.is_none() {
                *unacked += 1;
            }
        }
    }
    if let (Some(first), Some(last)) = (pkts.first(), pkts.last()) {
        summary.duration = last.1.timestamp.saturating_sub(first.1.timestamp).as_secs_f64();
    }
    (lines, summary)
}

fn tag(side: Side, m: &Message, part: &'static str) -> MessageTag {
    MessageTag { id: format!("{side:?}{}", m.number), side, number: m.number, op: m.op, part }
}

fn request(
    sp: &mut Space,
    side: Side,
    p: &Pkt,
    info: &softrdma_wire::opcode::OpcodeInfo,
    pmtu: Option<usize>,
    line: &mut FollowLine,
    summary: &mut FollowSummary,
) {
    let u = sp.unwrap(p.psn);
    let read = info.operation == Operation::RdmaReadRequest;
    let single = read || matches!(info.operation, Operation::CompareSwap | Operation::FetchAdd);
    let part = if single { "request" } else { part_name(info.position) };
    let ends = single || info.position.ends_message();
    if sp.high.is_some_and(|h| u <= h) {
        line.retransmission = true;
        match side {
            Side::A => summary.retransmissions_a += 1,
            Side::B => summary.retransmissions_b += 1,
        }
        if let Some(i) = sp.message_at(u) {
            let m = &mut sp.all[i];
            m.retransmitted += 1;
            // Sent again, so its requester did not take it as done (an answer lost after the
            // capture point): the answer that counts is a later one.
            m.acked_by = None;
            line.message = Some(tag(side, m, part));
            if ends {
                line.ends = Some((side, i));
            }
            return;
        }
    }
    // A READ's responses use the PSNs after its own: one per path MTU of data.
    let span = match (read, pmtu, p.dma_length) {
        (true, Some(mtu), Some(len)) => i64::from(len.div_ceil(mtu as u32)).max(1),
        _ => 1,
    };
    sp.high = Some(sp.high.map_or(u + span - 1, |h| h.max(u + span - 1)));
    let i = match (info.position.starts_message(), sp.open) {
        (false, Some(i)) => i,
        _ => {
            // A new message (or the rest of one whose start the capture missed).
            let number = sp.all.len() as u32 + 1;
            sp.all.push(Message {
                number,
                op: op_name(info.operation),
                start: u,
                end: None,
                read,
                acked_by: None,
                naked_by: None,
                retransmitted: 0,
            });
            sp.messages.insert(u, sp.all.len() - 1);
            sp.all.len() - 1
        }
    };
    let m = &mut sp.all[i];
    if ends {
        sp.open = None;
        // A READ whose span is unknown ends with its last response.
        if !read || span > 1 || pmtu.is_some() {
            m.end = Some(u + span - 1);
        }
        line.ends = Some((side, i));
    } else {
        sp.open = Some(i);
    }
    line.message = Some(tag(side, m, part));
}

fn response(
    sp: &mut Space,
    requester: Side,
    p: &Pkt,
    info: &softrdma_wire::opcode::OpcodeInfo,
    line: &mut FollowLine,
    summary: &mut FollowSummary,
) {
    let u = sp.unwrap(p.psn);
    let at = sp.message_at(u);
    let seen = sp.responses.entry((u, p.opcode.0)).or_default();
    let seen_before = *seen > 0;
    *seen += 1;
    let ids = |acked: Vec<u32>| acked.into_iter().map(|n| format!("{requester:?}{n}")).collect::<Vec<_>>();
    match info.operation {
        Operation::RdmaReadResponse => {
            line.retransmission = seen_before;
            let part = match info.position {
                Position::First => "response first",
                Position::Middle => "response middle",
                Position::Last => "response last",
                Position::Only => "response only",
            };
            if let Some(i) = at {
                let m = &mut sp.all[i];
                if info.position.ends_message() && m.read && m.end.is_none() {
                    m.end = Some(u);
                }
                line.message = Some(tag(requester, &sp.all[i], part));
            }
            // Any READ response acknowledges the requests before it; the last one its READ.
            let upto = if info.position.ends_message() { u } else { u - 1 };
            line.acks = ids(sp.ack_through(upto, p.frame, info.position.ends_message()));
        }
        Operation::AtomicAcknowledge => {
            if let Some(i) = at {
                line.message = Some(tag(requester, &sp.all[i], "response"));
            }
            line.acks = ids(sp.ack_through(u, p.frame, false));
        }
        _ => {
            let named = |part| at.map(|i| tag(requester, &sp.all[i], part));
            match p.syndrome {
                Some(Syndrome::Ack { .. }) | None => {
                    let before = sp.acked;
                    line.message = named("ack");
                    line.acks = ids(sp.ack_through(u, p.frame, false));
                    line.duplicate = line.acks.is_empty() && before.is_some_and(|a| u <= a);
                }
                Some(Syndrome::RnrNak(t)) => {
                    line.message = named("rnr nak");
                    line.acks = ids(sp.ack_through(u - 1, p.frame, true));
                    line.nak = Some(NakInfo {
                        kind: "RNR".to_string(),
                        rnr_timer: Some(t.code()),
                        rnr_delay_us: Some(t.delay_us()),
                    });
                }
                Some(Syndrome::Nak(code)) => {
                    line.message = named("nak");
                    line.acks = ids(sp.ack_through(u - 1, p.frame, true));
                    if code != NakCode::PsnSequenceError
                        && let Some(i) = at
                    {
                        sp.all[i].naked_by = Some((p.frame, code.to_string()));
                    }
                    line.nak = Some(NakInfo { kind: code.to_string(), rnr_timer: None, rnr_delay_us: None });
                }
                Some(Syndrome::Reserved(b)) => {
                    line.nak =
                        Some(NakInfo { kind: format!("RESERVED({b:#04x})"), rnr_timer: None, rnr_delay_us: None });
                }
            }
            if let Some(n) = &line.nak {
                *summary.naks.entry(n.kind.clone()).or_default() += 1;
            }
        }
    }
}

/// The JSON lines: the conversation, a line per packet, the summary.
#[derive(Serialize)]
struct JsonHead<'a> {
    conversation: &'a Conversation,
}

#[derive(Serialize)]
struct JsonTail<'a> {
    summary: &'a FollowSummary,
}

fn write_out(
    conv: &Conversation,
    lines: &[FollowLine],
    summary: &FollowSummary,
    format: Format,
    out: &mut impl Write,
) -> Result<(), DecodeError> {
    if format == Format::Json {
        serde_json::to_writer(&mut *out, &JsonHead { conversation: conv }).map_err(io::Error::from)?;
        out.write_all(b"\n")?;
        for l in lines {
            serde_json::to_writer(&mut *out, l).map_err(io::Error::from)?;
            out.write_all(b"\n")?;
        }
        serde_json::to_writer(&mut *out, &JsonTail { summary }).map_err(io::Error::from)?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    let mut s = String::new();
    write_head(&mut s, conv).expect("writing to a String cannot fail");
    out.write_all(s.as_bytes())?;
    for l in lines {
        s.clear();
        write_line(&mut s, l).expect("writing to a String cannot fail");
        out.write_all(s.as_bytes())?;
    }
    s.clear();
    write_summary(&mut s, summary).expect("writing to a String cannot fail");
    out.write_all(s.as_bytes())?;
    Ok(())
}

fn write_head(s: &mut String, c: &Conversation) -> fmt::Result {
    write!(s, "A {} QP {:#08x}", c.a_host, c.a_qpn)?;
    match (c.b_host, c.b_qpn) {
        (Some(h), Some(q)) => {
            let how = match c.peer_found_by {
                "cm" => "the CM's REQ and REP",
                "psn" => "PSNs answered",
                "deth" => "the DETH",
                _ => "the one QP it sends to there",
            };
            write!(s, " <-> B {h} QP {q:#08x} (peer from {how})")?;
        }
        (Some(h), None) => write!(s, " <- B {h} (nothing goes back to a QP of {h}: one direction only)")?,
        _ => {}
    }
    writeln!(s)?;
    if !c.also_at.is_empty() {
        let hosts: Vec<String> = c.also_at.iter().map(ToString::to_string).collect();
        writeln!(s, "(QP {:#08x} also receives at {}: name one as --follow ADDR/QPN)", c.a_qpn, hosts.join(", "))?;
    }
    Ok(())
}

fn write_line(s: &mut String, l: &FollowLine) -> fmt::Result {
    write!(s, "{:>6} {:>11.6} {} psn={:<8} {:<34}", l.frame, l.time, l.dir, l.psn, l.opcode)?;
    if let Some(cm) = &l.cm {
        write!(s, " CM {}", cm.message)?;
        if let Some(q) = cm.qpn {
            write!(s, " qpn={q:#08x}")?;
        }
        if let Some(p) = cm.starting_psn {
            write!(s, " start_psn={p}")?;
        }
        return writeln!(s);
    }
    if let Some(f) = l.copy_of {
        return writeln!(s, " (copy of {f})");
    }
    if l.retransmission {
        write!(s, " RETRANSMISSION")?;
    }
    if let Some(n) = &l.nak {
        match (n.rnr_timer, n.rnr_delay_us) {
            (Some(t), Some(us)) => write!(s, " RNR_NAK timer={t} ({us}us)")?,
            _ => write!(s, " NAK {}", n.kind)?,
        }
    }
    match &l.message {
        // An ACK that acknowledges messages says which; the message it names is the last.
        Some(m) if m.part == "ack" && !l.acks.is_empty() => {}
        Some(m) => write!(s, " {} {} {}", m.id, m.op, m.part)?,
        None if l.acks.is_empty() && l.nak.is_none() && l.opcode.contains("ACK") => {
            write!(s, " (answers what the capture began after)")?;
        }
        None => {}
    }
    if l.duplicate {
        write!(s, " duplicate")?;
    }
    if let Some(len) = l.len {
        write!(s, " len={len}")?;
    }
    if let Some(o) = l.original_data {
        write!(s, " orig={o:#x}")?;
    }
    if !l.acks.is_empty() {
        write!(s, " acks {}", ranges(&l.acks))?;
    }
    if let Some(f) = l.acked_by {
        write!(s, " -> acked in {f}")?;
    }
    if let Some(f) = l.naked_by {
        write!(s, " -> NAKed in {f}")?;
    }
    writeln!(s)
}

/// `A1 A2 A3 A5` as `A1-A3,A5`.
fn ranges(ids: &[String]) -> String {
    let parsed: Vec<(char, u32)> =
        ids.iter().filter_map(|id| Some((id.chars().next()?, id[1..].parse().ok()?))).collect();
    let mut out = String::new();
    let mut i = 0;
    while i < parsed.len() {
        let mut j = i;
        while j + 1 < parsed.len() && parsed[j + 1].0 == parsed[i].0 && parsed[j + 1].1 == parsed[j].1 + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        let (side, first) = parsed[i];
        let _ = if j > i { write!(out, "{side}{first}-{side}{}", parsed[j].1) } else { write!(out, "{side}{first}") };
        i = j + 1;
    }
    out
}

fn write_summary(s: &mut String, m: &FollowSummary) -> fmt::Result {
    let ops = |o: &BTreeMap<&str, u32>| {
        let total: u32 = o.values().sum();
        let each: Vec<String> = o.iter().map(|(k, v)| format!("{v} {k}")).collect();
        if each.is_empty() { "0".to_string() } else { format!("{total} ({})", each.join(", ")) }
    };
    writeln!(
        s,
        "{} packets ({} A>B, {} B>A{}{}) in {:.6} s",
        m.packets,
        m.a_to_b,
        m.b_to_a,
        if m.cm_messages > 0 { format!(", {} CM", m.cm_messages) } else { String::new() },
        if m.copies > 0 { format!(", {} captured twice", m.copies) } else { String::new() },
        m.duration
    )?;
    writeln!(
        s,
        "messages: A {}, {} unacknowledged; B {}, {} unacknowledged",
        ops(&m.messages_a),
        m.unacked_a,
        ops(&m.messages_b),
        m.unacked_b
    )?;
    let naks: Vec<String> = m.naks.iter().map(|(k, v)| format!("{v} {k}")).collect();
    writeln!(
        s,
        "retransmissions: A {}, B {}; NAKs: {}",
        m.retransmissions_a,
        m.retransmissions_b,
        if naks.is_empty() { "none".to_string() } else { naks.join(", ") }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_and_without_a_host() {
        assert_eq!("0x11".parse(), Ok(Target { host: None, qpn: 0x11 }));
        assert_eq!("17".parse(), Ok(Target { host: None, qpn: 17 }));
        let t: Target = "198.18.0.3/0x5b".parse().unwrap();
        assert_eq!(t, Target { host: Some("198.18.0.3".parse().unwrap()), qpn: 0x5b });
        let t: Target = "fe80::1/0x5b".parse().unwrap();
        assert_eq!(t.host, Some("fe80::1".parse().unwrap()));
        for bad in ["", "zz", "0x1000000", "nohost/0x11", "1.2.3.4/"] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn message_ranges_are_compact() {
        let ids: Vec<String> = ["A1", "A2", "A3", "A5", "B2"].iter().map(ToString::to_string).collect();
        assert_eq!(ranges(&ids), "A1-A3,A5,B2");
    }
}
