//! The whole NIC's ingress (engine, CM and QP1 together) against live connections, with
//! the network, an attacker on it and both applications played by the fuzzer.
//!
//! Two `Nic`s, A (10.0.0.1) and B (10.0.0.2), whose RC QPs share a window of 24 packets
//! per peer (`softrdma_engine::window`). B listens; A connects an RC QP to it
//! through the CM, honestly, before the input starts. Each side's memory is laid out
//! `guard | local | guard | remote | guard`: SGEs (sources, receive buffers, READ
//! targets) lie in `local`, registered for local access only; the peer's RDMA WRITE, READ
//! and atomics aim at `remote`, registered with remote access. The input is a sequence of
//! steps: the network's (deliver any datagram in flight, in any order; drop,
//! duplicate, or corrupt it, with its ICRC fixed or not; replay any datagram ever sent,
//! changed, with its ICRC fixed; inject arbitrary bytes from the peer's address or a
//! stranger's, steered to a live QP or QP1; let time pass) and the applications' (post
//! WRITEs, READs, SENDs, atomics and receives on any QP; connect more; accept, reject,
//! disconnect, destroy).
//!
//! Checked, outside the NIC:
//!
//! - nothing panics;
//! - no byte of either side's guards changes: a peer, forged packets included, never
//!   makes the NIC touch memory outside a registration that allows it;
//! - every work request completes at most once;
//! - in the end, after both applications destroy every ID and QP and the network delivers
//!   what is left, neither side holds a CM ID, a QP or a timer.

use core::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::collections::BTreeSet;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use softrdma_cm::{Cm, CmConfig, CmEventKind, CmId, ConnParam, Nic, NicEvent};
use softrdma_engine::{
    Access, CqId, DeviceConfig, Engine, Event, Instant, IpInfo, MrKeys, PdId, QpCap, QpInitAttr, QpType, RecvWr,
    SendFlags, SendOp, SendWr, Sge, VecMemory,
};
use softrdma_wire::cma::PortSpace;
use softrdma_wire::{Envelope, Qpn, RKey, RocePacket};

use crate::cm::mutate;
use crate::flight;

const IPS: [IpAddr; 2] = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))];
const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
const PORT: u16 = 7174;
const BASE: u64 = 0x1000_0000;
const GUARD: u64 = 0x2000;
const LOCAL: u64 = BASE + GUARD;
const LOCAL_LEN: u64 = 0x8000;
const REMOTE: u64 = LOCAL + LOCAL_LEN + GUARD;
const REMOTE_LEN: u64 = 0x8000;
const MEM_LEN: u64 = REMOTE + REMOTE_LEN + GUARD - BASE;
const MAX_STEPS: usize = 300;
/// Datagrams kept in flight and in the history, at most.
const MAX_FLIGHT: usize = 512;

/// One thing the network, an attacker or an application does.
#[derive(Arbitrary, Debug)]
enum Step {
    /// Delivers the datagram at `index` of those in flight (any order).
    Deliver { index: u16 },
    /// Delivers every datagram in flight, in order.
    DeliverAll,
    /// Loses it.
    Drop { index: u16 },
    /// Delivers it and keeps it in flight.
    Duplicate { index: u16 },
    /// Delivers a corrupted copy, its ICRC fixed or not.
    Corrupt { index: u16, edits: Vec<(u16, u8)>, fix_icrc: bool },
    /// Sends any datagram ever sent, changed, to either side, from the address and port it
    /// was sent from (a forger who sniffed them), its ICRC fixed.
    Replay { index: u16, to_b: bool, edits: Vec<(u16, u8)> },
    /// Sends arbitrary bytes to either side, from the peer's address (and any port) or a
    /// stranger's, its ICRC fixed or not, its destination QP set to a live QP's or QP1's.
    Inject { to_b: bool, stranger: bool, src_port: u16, steer: Option<u8>, fix_icrc: bool, bytes: Vec<u8> },
    /// Lets time pass, firing both sides' timers.
    Advance { micros: u32 },
    /// Posts work on the QP at `qp` of a side.
    Post { on_b: bool, qp: u8, op: Op, offset: u16, len: u16, remote_offset: u16 },
    /// Posts a receive.
    PostRecv { on_b: bool, qp: u8, offset: u16, len: u16 },
    /// A's application connects another RC QP to B.
    Connect,
    /// Accepts (with a new QP), rejects, disconnects or destroys (with its QP) an ID.
    Cm { on_b: bool, index: u8, action: CmAction },
}

/// The work request of [`Step::Post`].
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    /// SEND.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate.
    WriteImm,
    /// RDMA READ.
    Read,
    /// Compare-and-swap.
    CompareSwap,
    /// Fetch-and-add.
    FetchAdd,
}

/// What an application does to an ID in [`Step::Cm`].
#[derive(Arbitrary, Debug, Clone, Copy)]
enum CmAction {
    /// `rdma_create_qp` and `rdma_accept`.
    Accept,
    /// `rdma_reject`.
    Reject,
    /// `rdma_disconnect`.
    Disconnect,
    /// `rdma_destroy_qp` and `rdma_destroy_id`.
    Destroy,
}

/// A datagram on the way.
#[derive(Clone, Debug)]
struct Flight {
    to_b: bool,
    envelope: Envelope,
    payload: Vec<u8>,
}

struct Side {
    nic: Nic,
    mem: VecMemory,
    pd: PdId,
    cq: CqId,
    local: MrKeys,
    remote: MrKeys,
    /// The peer's remote region's keys, as an application learns them out of band.
    peer_rkey: RKey,
    qps: Vec<Qpn>,
    /// Work requests posted and not yet completed.
    outstanding: BTreeSet<u64>,
    next_wr_id: u64,
}

/// Bytes of the guards, in a recognisable pattern.
fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(7) | 1
}

fn in_guard(addr: u64) -> bool {
    !((LOCAL..LOCAL + LOCAL_LEN).contains(&addr) || (REMOTE..REMOTE + REMOTE_LEN).contains(&addr))
}

impl Side {
    fn new(k: usize) -> Self {
        let ip = IPS[k];
        // A small window per peer, so that its waits and wake-ups are fuzzed too.
        let config =
            DeviceConfig { addresses: vec![ip], seed: 11 + k as u64, peer_window: Some(24), ..DeviceConfig::default() };
        let mut engine = Engine::new(config);
        let pd = engine.alloc_pd();
        let cq = engine.create_cq(1 << 12).expect("a CQ");
        let local = engine.reg_mr(pd, LOCAL, LOCAL_LEN, Access::LOCAL_WRITE).expect("the local MR");
        let remote = engine.reg_mr(pd, REMOTE, REMOTE_LEN, Access::ALL).expect("the remote MR");
        let config = CmConfig {
            seed: 21 + k as u64,
            comm_id_prefix: (k as u32 + 1) << 21,
            addresses: vec![ip],
            response_timeout: 8,
            max_retries: 3,
            timewait: Duration::from_millis(20),
            max_ids: 32,
            ..CmConfig::default()
        };
        let mut mem = VecMemory::new(BASE, MEM_LEN as usize);
        for (i, b) in mem.bytes_mut().iter_mut().enumerate() {
            *b = pattern(i);
        }
        Self {
            nic: Nic::new(engine, Cm::new(config)),
            mem,
            pd,
            cq,
            local,
            remote,
            peer_rkey: RKey(0),
            qps: Vec::new(),
            outstanding: BTreeSet::new(),
            next_wr_id: 1,
        }
    }

    fn create_qp(&mut self) -> Option<Qpn> {
        let cap = QpCap { max_send_wr: 32, max_recv_wr: 32, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
        let init = QpInitAttr {
            pd: self.pd,
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: None,
            qp_type: QpType::Rc,
            cap,
            sq_sig_all: true,
        };
        let q = self.nic.engine_mut().create_qp(&init).ok()?;
        self.qps.push(q);
        Some(q)
    }

    fn local_sge(&self, offset: u16, len: u16) -> Sge {
        let len = u64::from(len) % 0x2000;
        let at = u64::from(offset) % (LOCAL_LEN - len).max(1);
        Sge { addr: LOCAL + at, length: len as u32, lkey: self.local.lkey }
    }

    fn post(&mut self, qp: u8, op: Op, offset: u16, len: u16, remote_offset: u16) {
        let Some(&qpn) = self.qps.get(usize::from(qp) % self.qps.len().max(1)) else { return };
        let remote_addr = REMOTE + u64::from(remote_offset) % REMOTE_LEN;
        let rkey = self.peer_rkey;
        let (op, len) = match op {
            Op::Send => (SendOp::Send, len),
            Op::Write => (SendOp::RdmaWrite { remote_addr, rkey }, len),
            Op::WriteImm => (SendOp::RdmaWriteWithImm { remote_addr, rkey, imm: [0, 0, 0, 7] }, len),
            Op::Read => (SendOp::RdmaRead { remote_addr, rkey }, len),
            Op::CompareSwap => (SendOp::CompareSwap { remote_addr: remote_addr & !7, rkey, compare: 0, swap: 1 }, 8),
            Op::FetchAdd => (SendOp::FetchAdd { remote_addr: remote_addr & !7, rkey, add: 1 }, 8),
        };
        let sge = self.local_sge(offset & !7, len);
        let wr_id = self.next_wr_id;
        let wr = SendWr { wr_id, op, sg_list: &[sge], flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None };
        if self.nic.engine_mut().post_send(qpn, &[wr], &self.mem).is_ok() {
            self.next_wr_id += 1;
            self.outstanding.insert(wr_id);
        }
    }

    fn post_recv(&mut self, qp: u8, offset: u16, len: u16) {
        let Some(&qpn) = self.qps.get(usize::from(qp) % self.qps.len().max(1)) else { return };
        let sge = self.local_sge(offset, len);
        let wr_id = self.next_wr_id;
        if self.nic.engine_mut().post_recv(qpn, &[RecvWr { wr_id, sg_list: &[sge] }]).is_ok() {
            self.next_wr_id += 1;
            self.outstanding.insert(wr_id);
        }
    }

    /// Takes every event and completion, checking that each WR completes once.
    fn drain_events(&mut self) -> Vec<(CmId, CmEventKind)> {
        let mut cm = Vec::new();
        while let Some(e) = self.nic.poll_event() {
            match e {
                NicEvent::Cm(e) => cm.push((e.id, e.kind)),
                NicEvent::Engine(Event::Completion(_) | Event::Async(_)) => {}
            }
        }
        while let Some(wc) = self.nic.engine_mut().poll_cq(self.cq) {
            assert!(self.outstanding.remove(&wc.wr_id), "WR {} completed twice, or never posted: {wc:?}", wc.wr_id);
        }
        cm
    }

    fn check_guards(&self, k: usize) {
        for (i, b) in self.mem.bytes().iter().enumerate() {
            let addr = BASE + i as u64;
            if in_guard(addr) {
                assert_eq!(*b, pattern(i), "side {k}: byte at {addr:#x}, outside every registration, changed");
            }
        }
    }
}

struct World {
    sides: [Side; 2],
    flight: Vec<Flight>,
    history: Vec<Flight>,
    now: Instant,
    buf: Vec<u8>,
    /// `ESTABLISHED` events seen, both sides.
    established: usize,
}

impl World {
    fn new() -> Self {
        let mut w = Self {
            sides: [Side::new(0), Side::new(1)],
            flight: Vec::new(),
            history: Vec::new(),
            now: Instant::ZERO,
            buf: vec![0; 4096 + 128],
            established: 0,
        };
        let [a, b] = &mut w.sides;
        (a.peer_rkey, b.peer_rkey) = (b.remote.rkey, a.remote.rkey);
        let cm = b.nic.cm_mut();
        let l = cm.create_id(PortSpace::TCP, QpType::Rc).expect("a listener");
        cm.bind_addr(l, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT)).expect("bind");
        cm.listen(l, 16).expect("listen");
        w.connect();
        // Honest delivery until the connection is up (or a bounded number of rounds).
        for _ in 0..16 {
            w.pump();
            let f = std::mem::take(&mut w.flight);
            for d in &f {
                w.deliver(d);
            }
            if f.is_empty() {
                break;
            }
        }
        assert_eq!(w.established, 2, "the honest setup connects A and B");
        w.history.clear();
        w
    }

    fn connect(&mut self) {
        let now = self.now;
        let a = &mut self.sides[0];
        let Some(qpn) = a.create_qp() else { return };
        let cm = a.nic.cm_mut();
        let Ok(id) = cm.create_id(PortSpace::TCP, QpType::Rc) else { return };
        let dst = SocketAddr::new(IPS[1], PORT);
        let ok = cm.resolve_addr(now, id, Some(SocketAddr::new(IPS[0], 0)), dst).is_ok()
            && cm.resolve_route(now, id).is_ok()
            && a.nic.attach_qp(id, qpn).is_ok();
        if ok {
            let param =
                ConnParam { qp_num: qpn.value(), responder_resources: 4, initiator_depth: 4, ..ConnParam::default() };
            let _ = a.nic.cm_mut().connect(now, id, &param);
        }
    }

    /// Takes every datagram and event of both sides; B accepts every request.
    fn pump(&mut self) {
        for _ in 0..8 {
            let mut quiet = true;
            for k in 0..2 {
                let s = &mut self.sides[k];
                while let Some(t) = s.nic.poll_transmit(self.now, &mut s.mem, &mut self.buf) {
                    quiet = false;
                    let f = Flight { to_b: k == 0, envelope: t.envelope, payload: self.buf[..t.len].to_vec() };
                    if self.history.len() < MAX_FLIGHT {
                        self.history.push(f.clone());
                    }
                    if self.flight.len() < MAX_FLIGHT {
                        self.flight.push(f);
                    }
                }
                for (id, kind) in s.drain_events() {
                    quiet = false;
                    match kind {
                        CmEventKind::ConnectRequest => self.accept(k, id),
                        CmEventKind::Established => self.established += 1,
                        _ => {}
                    }
                }
            }
            if quiet {
                break;
            }
        }
    }

    fn accept(&mut self, k: usize, id: CmId) {
        let now = self.now;
        let s = &mut self.sides[k];
        let Some(qpn) = s.create_qp() else { return };
        if s.nic.attach_qp(id, qpn).is_ok() {
            let param =
                ConnParam { qp_num: qpn.value(), responder_resources: 4, initiator_depth: 4, ..ConnParam::default() };
            let _ = s.nic.accept(now, id, &param);
        }
    }

    fn deliver(&mut self, f: &Flight) {
        let s = &mut self.sides[usize::from(f.to_b)];
        s.nic.handle_datagram(self.now, &f.envelope, IpInfo::default(), &f.payload, &mut s.mem);
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        for s in &mut self.sides {
            s.nic.handle_timeout(self.now);
        }
    }

    fn fix_icrc(f: &mut Flight) {
        if f.payload.len() >= softrdma_wire::roce::MIN_LEN {
            RocePacket::new_unchecked(&mut f.payload[..]).fill_icrc(&f.envelope);
        }
    }

    fn step(&mut self, step: Step) {
        let now = self.now;
        match step {
            Step::Deliver { index } => {
                if let Some(f) = flight::take(&mut self.flight, index.into()) {
                    self.deliver(&f);
                }
            }
            Step::DeliverAll => {
                for f in std::mem::take(&mut self.flight) {
                    self.deliver(&f);
                }
            }
            Step::Drop { index } => {
                flight::take(&mut self.flight, index.into());
            }
            Step::Duplicate { index } => {
                if let Some(f) = flight::copy(&self.flight, index.into()) {
                    self.deliver(&f);
                }
            }
            Step::Corrupt { index, edits, fix_icrc } => {
                if let Some(mut f) = flight::copy(&self.flight, index.into()) {
                    f.payload = mutate(&f.payload, &edits);
                    if fix_icrc {
                        Self::fix_icrc(&mut f);
                    }
                    self.deliver(&f);
                }
            }
            Step::Replay { index, to_b, edits } => {
                if let Some(mut f) = flight::copy(&self.history, index.into()) {
                    f.payload = mutate(&f.payload, &edits);
                    if f.to_b != to_b {
                        // Sent the other way: from the other side, to the same port.
                        let (src, dst) = (IPS[usize::from(!to_b)], IPS[usize::from(to_b)]);
                        f.envelope = Envelope::rocev2(src, f.envelope.src_port(), dst).expect("IPv4 to IPv4");
                        f.to_b = to_b;
                    }
                    Self::fix_icrc(&mut f);
                    self.deliver(&f);
                }
            }
            Step::Inject { to_b, stranger, src_port, steer, fix_icrc, mut bytes } => {
                let k = usize::from(to_b);
                if let (Some(q), true) = (steer, bytes.len() >= 8) {
                    let qps = &self.sides[k].qps;
                    let qpn = if qps.is_empty() || q == 0 { Qpn::GSI } else { qps[usize::from(q) % qps.len()] };
                    bytes[5..8].copy_from_slice(&qpn.value().to_be_bytes()[1..]);
                }
                let src = if stranger { STRANGER } else { IPS[1 - k] };
                let envelope = Envelope::rocev2(src, src_port, IPS[k]).expect("IPv4 to IPv4");
                let mut f = Flight { to_b, envelope, payload: bytes };
                if fix_icrc {
                    Self::fix_icrc(&mut f);
                }
                self.deliver(&f);
            }
            Step::Advance { micros } => self.advance(Duration::from_micros(u64::from(micros % 5_000_000))),
            Step::Post { on_b, qp, op, offset, len, remote_offset } => {
                self.sides[usize::from(on_b)].post(qp, op, offset, len, remote_offset);
            }
            Step::PostRecv { on_b, qp, offset, len } => self.sides[usize::from(on_b)].post_recv(qp, offset, len),
            Step::Connect => self.connect(),
            Step::Cm { on_b, index, action } => {
                let k = usize::from(on_b);
                let ids = self.sides[k].nic.cm().ids();
                let Some(&id) = ids.get(usize::from(index) % ids.len().max(1)) else { return };
                let s = &mut self.sides[k];
                match action {
                    CmAction::Accept => self.accept(k, id),
                    CmAction::Reject => {
                        let _ = s.nic.cm_mut().reject(now, id, b"no");
                    }
                    CmAction::Disconnect => {
                        let _ = s.nic.disconnect(now, id);
                    }
                    CmAction::Destroy => {
                        if let Some(qpn) = s.nic.attached_qp(id) {
                            s.nic.destroy_qp(qpn).expect("destroying an attached QP");
                            s.qps.retain(|&q| q != qpn);
                        }
                        s.nic.destroy_id(now, id).expect("destroying a live ID");
                    }
                }
            }
        }
        self.pump();
    }

    /// Both applications destroy every ID and QP; the network delivers what is left;
    /// time passes. Nothing may be left.
    fn finish(&mut self) {
        let now = self.now;
        for s in &mut self.sides {
            for id in s.nic.cm().ids() {
                s.nic.destroy_id(now, id).expect("destroying a live ID");
            }
            for qpn in std::mem::take(&mut s.qps) {
                s.nic.destroy_qp(qpn).expect("destroying a live QP");
            }
        }
        for _ in 0..64 {
            self.pump();
            let flight = std::mem::take(&mut self.flight);
            if flight.is_empty() {
                break;
            }
            for f in &flight {
                self.deliver(f);
            }
        }
        self.advance(Duration::from_secs(600));
        self.pump();
        for (k, s) in self.sides.iter().enumerate() {
            s.check_guards(k);
            assert_eq!(s.nic.cm().id_count(), 0, "side {k}: CM IDs left: {:?}", s.nic.cm().ids());
            assert_eq!(s.nic.engine().qp_count(), 0, "side {k}: QPs left after destroying all");
            assert_eq!(s.nic.poll_timeout(), None, "side {k}: a timer armed with nothing left");
        }
    }
}

/// Runs the target on one input; panics when an oracle above does not hold.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let mut w = World::new();
    for _ in 0..MAX_STEPS {
        let Ok(step) = Step::arbitrary(&mut u) else { break };
        w.step(step);
        if u.is_empty() {
            break;
        }
    }
    for (k, s) in w.sides.iter().enumerate() {
        s.check_guards(k);
    }
    w.finish();
}
