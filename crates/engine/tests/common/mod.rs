//! A `Pair` of engines on a virtual clock, wired back to back through a filter, for
//! scenario tests that read like the protocol.
#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::time::Duration;

use softrdma_engine::*;
use softrdma_wire::{Envelope, Gid, Opcode, Psn, QKey, Qpn, RocePacket, Syndrome};

pub const BASE: u64 = 0x1000_0000;
/// 4 MiB: room for messages by reference of several segments (`reference::SEGMENT`).
pub const MEM_LEN: usize = 4 << 20;

/// One side: a device with one PD, CQ, whole-memory MR and QP.
pub struct Node {
    pub engine: Engine,
    pub mem: VecMemory,
    pub pd: PdId,
    pub cq: CqId,
    pub mr: MrKeys,
    pub qp: Qpn,
    pub addr: std::net::IpAddr,
}

/// A packet that crossed the wire.
#[derive(Clone, Debug)]
pub struct Pkt {
    pub from_a: bool,
    pub at: Instant,
    pub envelope: Envelope,
    pub bytes: Vec<u8>,
    pub delivered: bool,
    /// Carried by reference: its receiver copies the data from its sender's memory
    /// (`softrdma_engine::reference`).
    pub by_reference: bool,
    /// An ACK carried beside it, taken just before it (`Engine::allow_acks_beside`).
    pub ack_beside: Option<AckBeside>,
    /// A grant beside an atomic's answer (`softrdma_engine::direct`).
    pub grant: Option<AtomicGrant>,
}

/// A node's memory that copies from its peer's, as a process of the host pulls from
/// another: the peer is origin 1 (node a) or 2 (node b).
pub struct Pulling<'a> {
    pub mine: &'a mut VecMemory,
    pub theirs: &'a VecMemory,
}

impl Memory for Pulling<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        self.mine.read(addr, buf)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        self.mine.write(addr, data)
    }
    fn pull(&mut self, addr: u64, _origin: u32, from: u64, len: usize) -> Result<(), MemoryFault> {
        let mut buf = vec![0; len];
        self.theirs.read(from, &mut buf)?;
        self.mine.write(addr, &buf)
    }
}

impl Pkt {
    pub fn opcode(&self) -> Opcode {
        RocePacket::new_checked(&self.bytes[..]).unwrap().bth().opcode()
    }
    pub fn psn(&self) -> Psn {
        RocePacket::new_checked(&self.bytes[..]).unwrap().bth().psn()
    }
    pub fn syndrome(&self) -> Option<Syndrome> {
        RocePacket::new_checked(&self.bytes[..]).unwrap().aeth().map(|a| a.syndrome())
    }
}

/// Decides a packet's fate: `true` delivers it.
pub type Filter = Box<dyn FnMut(&Pkt) -> bool>;

/// Gives each delivered packet the IP header fields it arrives with.
pub type IpInfoFn = Box<dyn FnMut(&Pkt) -> IpInfo>;

pub struct Pair {
    pub a: Node,
    pub b: Node,
    pub now: Instant,
    pub latency: Duration,
    wire: VecDeque<Pkt>,
    pub log: Vec<Pkt>,
    pub filter: Option<Filter>,
    /// The IP header fields each delivered packet arrives with (ECN marks, say); default
    /// [`IpInfo::default`].
    pub ip_info: Option<IpInfoFn>,
}

pub fn node(ip: [u8; 4], seed: u64, qp_type: QpType, cap: QpCap) -> Node {
    node_configured(ip, seed, qp_type, cap, &|_| {})
}

/// [`node`] with `tweak` applied to its device's configuration.
pub fn node_configured(ip: [u8; 4], seed: u64, qp_type: QpType, cap: QpCap, tweak: &dyn Fn(&mut DeviceConfig)) -> Node {
    let addr = std::net::IpAddr::from(ip);
    let mut config = DeviceConfig { addresses: vec![addr], seed, ..DeviceConfig::default() };
    tweak(&mut config);
    let mut engine = Engine::new(config);
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(1024).unwrap();
    let mr = engine.reg_mr(pd, BASE, MEM_LEN as u64, Access::ALL).unwrap();
    let qp = engine
        .create_qp(&QpInitAttr { pd, send_cq: cq, recv_cq: cq, srq: None, qp_type, cap, sq_sig_all: false })
        .unwrap();
    Node { engine, mem: VecMemory::new(BASE, MEM_LEN), pd, cq, mr, qp, addr }
}

pub fn connect(
    n: &mut Node,
    peer_qp: Qpn,
    peer_addr: std::net::IpAddr,
    qp_type: QpType,
    mtu: Mtu,
    tweak: &dyn Fn(&mut QpAttr),
) {
    connect_qp(&mut n.engine, n.qp, peer_qp, peer_addr, qp_type, mtu, tweak);
}

/// [`connect`] for QP `qp` of any engine, whatever memory it runs over.
pub fn connect_qp(
    engine: &mut Engine,
    qp: Qpn,
    peer_qp: Qpn,
    peer_addr: std::net::IpAddr,
    qp_type: QpType,
    mtu: Mtu,
    tweak: &dyn Fn(&mut QpAttr),
) {
    let init =
        QpAttr { qp_state: QpState::Init, qp_access_flags: Access::ALL, qkey: QKey(0x1111_1111), ..QpAttr::default() };
    let init_mask = match qp_type {
        QpType::Ud => AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        _ => AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    };
    engine.modify_qp(qp, &init, init_mask).unwrap();
    if qp_type == QpType::Ud {
        engine.modify_qp(qp, &QpAttr { qp_state: QpState::Rtr, ..QpAttr::default() }, AttrMask::STATE).unwrap();
        let rts = QpAttr { qp_state: QpState::Rts, sq_psn: 1, ..QpAttr::default() };
        engine.modify_qp(qp, &rts, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
        return;
    }
    let av =
        AddressVector { dgid: Gid::from_ip(peer_addr), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let mut rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(av),
        path_mtu: mtu,
        dest_qp_num: peer_qp.value(),
        rq_psn: 0xfffffe, // start near the wrap, to exercise 24-bit PSN arithmetic
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1, // 10 µs
        ..QpAttr::default()
    };
    let mut rtr_mask = AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    let mut rts = QpAttr { qp_state: QpState::Rts, sq_psn: 0xfffffe, ..QpAttr::default() };
    let mut rts_mask = AttrMask::STATE | AttrMask::SQ_PSN;
    // The responders (RC, XRC TGT) take responder resources and an RNR timer on RTR; the
    // requesters (RC, XRC INI) their retry parameters on RTS; an XRC TGT only a timeout.
    if matches!(qp_type, QpType::Rc | QpType::XrcTgt) {
        rtr_mask = rtr_mask | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
    } else {
        rtr.max_dest_rd_atomic = 0;
    }
    if matches!(qp_type, QpType::Rc | QpType::XrcIni) {
        rts = QpAttr { timeout: 10, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 4, ..rts }; // ~4 ms ACK timeout
        rts_mask =
            rts_mask | AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY | AttrMask::MAX_QP_RD_ATOMIC;
        tweak(&mut rts);
    } else if qp_type == QpType::XrcTgt {
        rts.timeout = 10;
        rts_mask |= AttrMask::TIMEOUT;
    }
    engine.modify_qp(qp, &rtr, rtr_mask).unwrap();
    engine.modify_qp(qp, &rts, rts_mask).unwrap();
}

impl Pair {
    /// Two connected QPs of `qp_type` with path MTU `mtu`.
    pub fn connected(qp_type: QpType, mtu: Mtu) -> Pair {
        Self::connected_with(qp_type, mtu, QpCap::default())
    }

    pub fn connected_with(qp_type: QpType, mtu: Mtu, cap: QpCap) -> Pair {
        Self::connected_tweaked(qp_type, mtu, cap, &|_| {})
    }

    /// Connected, with `tweak` applied to the RTR→RTS attributes of both sides (RC).
    pub fn connected_tweaked(qp_type: QpType, mtu: Mtu, cap: QpCap, tweak: &dyn Fn(&mut QpAttr)) -> Pair {
        let mut a = node([10, 0, 0, 1], 1, qp_type, cap);
        let mut b = node([10, 0, 0, 2], 2, qp_type, cap);
        let (aq, bq, aa, ba) = (a.qp, b.qp, a.addr, b.addr);
        connect(&mut a, bq, ba, qp_type, mtu, tweak);
        connect(&mut b, aq, aa, qp_type, mtu, tweak);
        Pair {
            a,
            b,
            now: Instant::ZERO,
            latency: Duration::from_micros(2),
            wire: VecDeque::new(),
            log: Vec::new(),
            filter: None,
            ip_info: None,
        }
    }

    /// Drops the packets for which `keep` returns false.
    pub fn set_filter(&mut self, keep: impl FnMut(&Pkt) -> bool + 'static) {
        self.filter = Some(Box::new(keep));
    }

    fn transmit(&mut self) {
        let mut buf = vec![0u8; 4200];
        for from_a in [true, false] {
            loop {
                let n = if from_a { &mut self.a } else { &mut self.b };
                let Some(t) = n.engine.poll_transmit(self.now, &mut n.mem, &mut buf) else { break };
                let mut pkt = Pkt {
                    from_a,
                    at: self.now,
                    envelope: t.envelope,
                    bytes: buf[..t.len].to_vec(),
                    delivered: true,
                    by_reference: t.by_reference,
                    ack_beside: t.ack_beside,
                    grant: if t.grant { n.engine.grant(t.local_qp) } else { None },
                };
                if let Some(f) = &mut self.filter {
                    pkt.delivered = f(&pkt);
                }
                self.log.push(pkt.clone());
                if pkt.delivered {
                    pkt.at = self.now + self.latency;
                    self.wire.push_back(pkt);
                }
                assert!(self.log.len() < 1_000_000, "runaway transmit loop");
            }
        }
    }

    /// Runs the clock until nothing is in flight and no timer is due before `limit` from now.
    pub fn drive_for(&mut self, limit: Duration) {
        let deadline = self.now + limit;
        for _ in 0..1_000_000 {
            self.transmit();
            let timers = [self.a.engine.poll_timeout(), self.b.engine.poll_timeout()];
            let next = self.wire.front().map(|p| p.at).into_iter().chain(timers.into_iter().flatten()).min();
            let Some(next) = next.filter(|&t| t <= deadline) else {
                self.now = deadline;
                return;
            };
            self.now = self.now.max(next);
            while self.wire.front().is_some_and(|p| p.at <= self.now) {
                let p = self.wire.pop_front().unwrap();
                let ip = self.ip_info.as_mut().map_or_else(IpInfo::default, |f| f(&p));
                let (n, from) = if p.from_a { (&mut self.b, &self.a) } else { (&mut self.a, &self.b) };
                if let Some(ack) = p.ack_beside {
                    n.engine.handle_ack_beside(self.now, &p.envelope, &p.bytes, ack);
                }
                if p.by_reference {
                    let origin = if p.from_a { 1 } else { 2 };
                    let mut mem = Pulling { mine: &mut n.mem, theirs: &from.mem };
                    n.engine.handle_referenced_datagram(self.now, &p.envelope, ip, &p.bytes, origin, &mut mem);
                } else {
                    n.engine.handle_datagram_with(self.now, &p.envelope, ip, &p.bytes, &mut n.mem);
                }
            }
            for n in [&mut self.a, &mut self.b] {
                if n.engine.poll_timeout().is_some_and(|t| t <= self.now) {
                    n.engine.handle_timeout(self.now);
                }
            }
        }
        panic!("drive_for did not settle");
    }

    /// Drives for up to ten virtual seconds.
    pub fn drive(&mut self) {
        self.drive_for(Duration::from_secs(10));
    }

    pub fn opcodes(&self, from_a: bool) -> Vec<Opcode> {
        self.log.iter().filter(|p| p.from_a == from_a).map(Pkt::opcode).collect()
    }
}

impl Node {
    pub fn addr_of(&self, offset: u64) -> u64 {
        BASE + offset
    }
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge { addr: BASE + offset, length: len, lkey: self.mr.lkey }
    }
    pub fn fill(&mut self, offset: u64, data: &[u8]) {
        self.mem.slice_mut(BASE + offset, data.len()).copy_from_slice(data);
    }
    pub fn read(&self, offset: u64, len: usize) -> &[u8] {
        self.mem.slice(BASE + offset, len)
    }
    pub fn post_send(&mut self, wr: SendWr<'_>) {
        self.engine.post_send(self.qp, &[wr], &self.mem).unwrap();
    }
    pub fn post_recv(&mut self, wr_id: u64, offset: u64, len: u32) {
        let sge = self.sge(offset, len);
        self.engine.post_recv(self.qp, &[RecvWr { wr_id, sg_list: &[sge] }]).unwrap();
    }
    pub fn poll(&mut self) -> Option<Wc> {
        self.engine.poll_cq(self.cq)
    }
    pub fn poll_all(&mut self) -> Vec<Wc> {
        std::iter::from_fn(|| self.engine.poll_cq(self.cq)).collect()
    }
}

/// A signaled WR.
pub fn wr(wr_id: u64, op: SendOp, sg_list: &[Sge]) -> SendWr<'_> {
    SendWr { wr_id, op, sg_list, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

// ---- Helpers for uc_ud.rs, verbs.rs and found_bugs.rs (appended; the items above are shared) ----

/// The attributes [`node`] creates its QP with, on `n`'s PD and CQ.
pub fn init_attr(n: &Node, qp_type: QpType) -> QpInitAttr {
    QpInitAttr { pd: n.pd, send_cq: n.cq, recv_cq: n.cq, srq: None, qp_type, cap: QpCap::default(), sq_sig_all: false }
}

/// Two sides before they are connected: `setup` runs on each (a first) and may give it another QP or CQ;
/// whatever QP is left in [`Node::qp`] is the one connected.
pub fn connected_after_setup(qp_type: QpType, mtu: Mtu, setup: &dyn Fn(&mut Node)) -> Pair {
    let mut a = node([10, 0, 0, 1], 1, qp_type, QpCap::default());
    let mut b = node([10, 0, 0, 2], 2, qp_type, QpCap::default());
    setup(&mut a);
    setup(&mut b);
    pair_of(a, b, qp_type, mtu)
}

/// A side at any address, IPv6 included, built like [`node`].
pub fn node_at(addr: std::net::IpAddr, seed: u64, qp_type: QpType) -> Node {
    let mut engine = Engine::new(DeviceConfig { addresses: vec![addr], seed, ..DeviceConfig::default() });
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(1024).unwrap();
    let mr = engine.reg_mr(pd, BASE, MEM_LEN as u64, Access::ALL).unwrap();
    let qp = engine
        .create_qp(&QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            qp_type,
            cap: QpCap::default(),
            sq_sig_all: false,
        })
        .unwrap();
    Node { engine, mem: VecMemory::new(BASE, MEM_LEN), pd, cq, mr, qp, addr }
}

/// `a` and `b` wired back to back, their QPs connected as [`Pair::connected`] connects them.
pub fn pair_of(mut a: Node, mut b: Node, qp_type: QpType, mtu: Mtu) -> Pair {
    let (aq, bq, aa, ba) = (a.qp, b.qp, a.addr, b.addr);
    connect(&mut a, bq, ba, qp_type, mtu, &|_| {});
    connect(&mut b, aq, aa, qp_type, mtu, &|_| {});
    wire(a, b)
}

/// `a` and `b` wired back to back as they are: whatever connecting their QPs need is done.
pub fn wire(a: Node, b: Node) -> Pair {
    Pair {
        a,
        b,
        now: Instant::ZERO,
        latency: Duration::from_micros(2),
        wire: VecDeque::new(),
        log: Vec::new(),
        filter: None,
        ip_info: None,
    }
}

impl Pair {
    /// One more QP on each side, created from `a_init` / `b_init` and connected to each other the way the
    /// pair's own QPs are. The pair's own QPs stay what they were.
    pub fn add_connected(&mut self, a_init: &QpInitAttr, b_init: &QpInitAttr, mtu: Mtu) -> (Qpn, Qpn) {
        let aq = self.a.engine.create_qp(a_init).unwrap();
        let bq = self.b.engine.create_qp(b_init).unwrap();
        let (aa, ba) = (self.a.addr, self.b.addr);
        for (n, own, peer, peer_addr, qp_type) in
            [(&mut self.a, aq, bq, ba, a_init.qp_type), (&mut self.b, bq, aq, aa, b_init.qp_type)]
        {
            let saved = std::mem::replace(&mut n.qp, own);
            connect(n, peer, peer_addr, qp_type, mtu, &|_| {});
            n.qp = saved;
        }
        (aq, bq)
    }

    /// The packets one side sent, in order.
    pub fn sent(&self, from_a: bool) -> Vec<&Pkt> {
        self.log.iter().filter(|p| p.from_a == from_a).collect()
    }
}

impl Node {
    /// Every event the device has raised since the last call.
    pub fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.engine.poll_event()).collect()
    }

    /// An address handle to `peer` (UD).
    pub fn ah_to(&mut self, peer: std::net::IpAddr) -> AhId {
        let av =
            AddressVector { dgid: Gid::from_ip(peer), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
        self.engine.create_ah(self.pd, av).unwrap()
    }

    /// `ibv_post_send` of a list, returning the error instead of unwrapping it.
    pub fn try_post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.engine.post_send(self.qp, wrs, &self.mem)
    }
}

/// A WR with `flags` (no UD destination).
pub fn wr_with(wr_id: u64, op: SendOp, sg_list: &[Sge], flags: SendFlags) -> SendWr<'_> {
    SendWr { wr_id, op, sg_list, flags, ud: None, xrc_srqn: None }
}

/// A signaled UD SEND of `sg_list` to `dest`.
pub fn ud_send(wr_id: u64, op: SendOp, sg_list: &[Sge], dest: UdDest) -> SendWr<'_> {
    SendWr { wr_id, op, sg_list, flags: SendFlags::SIGNALED, ud: Some(dest), xrc_srqn: None }
}

/// The (wr_id, status) of each completion, for compact assertions.
pub fn outcomes(wcs: &[Wc]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|w| (w.wr_id, w.status)).collect()
}

/// A side as a node of the simulator's fabric (switch ports, link rates, faults).
impl softrdma_sim::Node for Node {
    fn addresses(&self) -> Vec<std::net::IpAddr> {
        vec![self.addr]
    }
    fn handle_datagram(&mut self, now: softrdma_sim::Time, envelope: &Envelope, payload: &[u8]) {
        self.engine.handle_datagram(now, envelope, payload, &mut self.mem);
    }
    fn handle_datagram_marked(&mut self, now: softrdma_sim::Time, envelope: &Envelope, payload: &[u8], ce: bool) {
        let ip = IpInfo { traffic_class: if ce { 0b11 } else { 0 }, ..IpInfo::default() };
        self.engine.handle_datagram_with(now, envelope, ip, payload, &mut self.mem);
    }
    fn handle_timeout(&mut self, now: softrdma_sim::Time) {
        self.engine.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: softrdma_sim::Time, buf: &mut [u8]) -> Option<(Envelope, usize)> {
        self.engine.poll_transmit(now, &mut self.mem, buf).map(|t| (t.envelope, t.len))
    }
    fn poll_timeout(&self) -> Option<softrdma_sim::Time> {
        self.engine.poll_timeout()
    }
}

/// An engine and its memory (any [`Memory`]: a `VecMemory`, or one that faults), as a
/// node of the simulator's fabric: what the swarms drive.
pub struct SimNode<M> {
    pub engine: Engine,
    pub mem: M,
    pub ip: std::net::IpAddr,
}

impl<M: Memory> softrdma_sim::Node for SimNode<M> {
    fn addresses(&self) -> Vec<std::net::IpAddr> {
        vec![self.ip]
    }
    fn handle_datagram(&mut self, now: softrdma_sim::Time, envelope: &Envelope, payload: &[u8]) {
        self.engine.handle_datagram(now, envelope, payload, &mut self.mem);
    }
    fn handle_timeout(&mut self, now: softrdma_sim::Time) {
        self.engine.handle_timeout(now);
    }
    fn poll_transmit(&mut self, now: softrdma_sim::Time, buf: &mut [u8]) -> Option<(Envelope, usize)> {
        self.engine.poll_transmit(now, &mut self.mem, buf).map(|t| (t.envelope, t.len))
    }
    fn poll_timeout(&self) -> Option<softrdma_sim::Time> {
        self.engine.poll_timeout()
    }
}

/// Creates QP `init` on `n` and connects it to `peer` (QPN and address) as [`connect`] does;
/// [`Node::qp`] stays what it was.
pub fn connect_another(n: &mut Node, init: &QpInitAttr, peer: (Qpn, std::net::IpAddr), mtu: Mtu) -> Qpn {
    let qp = n.engine.create_qp(init).unwrap();
    let saved = std::mem::replace(&mut n.qp, qp);
    connect(n, peer.0, peer.1, init.qp_type, mtu, &|_| {});
    n.qp = saved;
    qp
}
