//! A [`Nic`] (engine and CM together) as a node of the simulated fabric, and the calls a
//! librdmacm program makes, for scenario and swarm tests on a virtual clock.
#![allow(dead_code, unreachable_pub)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use softrdma_cm::{Cm, CmConfig, CmEvent, CmEventKind, CmId, ConnParam, Nic, NicEvent};
use softrdma_engine::{
    Access, AsyncEvent, CqId, DeviceConfig, Engine, Event, Instant, IpInfo, MrKeys, PdId, QpCap, QpInitAttr, QpState,
    QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, VecMemory, Wc,
};
use softrdma_sim::{Datagram, Fabric, Node, NodeId, Time};
use softrdma_wire::cm::CmMessage;
use softrdma_wire::cma::PortSpace;
use softrdma_wire::mad::{MadPacket, MadRepr};
use softrdma_wire::{Envelope, Qpn, RocePacket, RoceRepr};

pub const IP_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
pub const IP_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
pub const PORT: u16 = 7174;
pub const BASE: u64 = 0x1000_0000;
pub const MEM: usize = 1 << 20;
/// The CM resends after 4.096 µs · 2^10 ≈ 4.2 ms, three times.
pub const RESPONSE_TIMEOUT: u8 = 10;
pub const MAX_RETRIES: u8 = 3;
pub const TIMEWAIT: Duration = Duration::from_millis(50);

/// A NIC, its memory and one PD, CQ and whole-memory MR, on the fabric at `ip`. It
/// collects every event the NIC reports.
pub struct NicNode {
    pub nic: Nic,
    pub mem: VecMemory,
    pub ip: IpAddr,
    pub pd: PdId,
    pub cq: CqId,
    pub mr: MrKeys,
    /// Every CM event, in order.
    pub events: Vec<CmEvent>,
    /// Every asynchronous event of the engine, in order.
    pub async_events: Vec<AsyncEvent>,
}

impl Node for NicNode {
    fn addresses(&self) -> Vec<IpAddr> {
        vec![self.ip]
    }
    fn handle_datagram(&mut self, now: Time, envelope: &Envelope, payload: &[u8]) {
        self.nic.handle_datagram(now, envelope, IpInfo::default(), payload, &mut self.mem);
        self.drain();
    }
    fn handle_timeout(&mut self, now: Time) {
        self.nic.handle_timeout(now);
        self.drain();
    }
    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(Envelope, usize)> {
        self.nic.poll_transmit(now, &mut self.mem, buf).map(|t| (t.envelope, t.len))
    }
    fn poll_timeout(&self) -> Option<Time> {
        self.nic.poll_timeout()
    }
}

/// The configuration of the tests' CMs: short timeouts, and a path whose local ACK timeout
/// is 4.096 µs · 2^9 ≈ 2 ms (ACK delay 2^4, packet lifetime 2^8).
pub fn cm_config(seed: u64, ip: IpAddr, prefix: u32) -> CmConfig {
    CmConfig {
        seed,
        comm_id_prefix: prefix,
        addresses: vec![ip],
        response_timeout: RESPONSE_TIMEOUT,
        max_retries: MAX_RETRIES,
        timewait: TIMEWAIT,
        node_guid: 0x5054_00ff_fe00_0000 | seed,
        ca_ack_delay: 4,
        packet_life_time: 8,
        ..CmConfig::default()
    }
}

impl NicNode {
    pub fn new(ip: IpAddr, seed: u64, prefix: u32) -> Self {
        let mut engine = Engine::new(DeviceConfig { addresses: vec![ip], seed, ..DeviceConfig::default() });
        let pd = engine.alloc_pd();
        let cq = engine.create_cq(4096).unwrap();
        let mr = engine.reg_mr(pd, BASE, MEM as u64, Access::ALL).unwrap();
        let nic = Nic::new(engine, Cm::new(cm_config(seed, ip, prefix)));
        Self { nic, mem: VecMemory::new(BASE, MEM), ip, pd, cq, mr, events: Vec::new(), async_events: Vec::new() }
    }

    /// Takes every event the NIC has (as a runtime does after each input and command).
    pub fn drain(&mut self) {
        while let Some(e) = self.nic.poll_event() {
            match e {
                NicEvent::Cm(e) => self.events.push(e),
                NicEvent::Engine(Event::Async(e)) => self.async_events.push(e),
                NicEvent::Engine(Event::Completion(_)) => {}
            }
        }
    }

    /// A new RC QP on the node's CQ.
    pub fn create_qp(&mut self) -> Qpn {
        let cap = QpCap { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 };
        let init = QpInitAttr {
            pd: self.pd,
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: None,
            qp_type: QpType::Rc,
            cap,
            sq_sig_all: false,
        };
        self.nic.engine_mut().create_qp(&init).unwrap()
    }

    /// `rdma_create_id`, `rdma_bind_addr` on every address, `rdma_listen`.
    pub fn listen(&mut self, port: u16) -> CmId {
        let cm = self.nic.cm_mut();
        let l = cm.create_id(PortSpace::TCP, QpType::Rc).unwrap();
        cm.bind_addr(l, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port)).unwrap();
        cm.listen(l, 64).unwrap();
        l
    }

    /// An RC connect to `dst`:`port` as librdmacm's programs make it: an ID resolved and
    /// routed, a QP created and attached (INIT), then `rdma_connect` with `private`.
    pub fn connect(&mut self, now: Instant, dst: IpAddr, port: u16, private: &[u8]) -> (CmId, Qpn) {
        let ip = self.ip;
        let cm = self.nic.cm_mut();
        let id = cm.create_id(PortSpace::TCP, QpType::Rc).unwrap();
        cm.resolve_addr(now, id, Some(SocketAddr::new(ip, 0)), SocketAddr::new(dst, port)).unwrap();
        cm.resolve_route(now, id).unwrap();
        let qpn = self.create_qp();
        self.nic.attach_qp(id, qpn).unwrap();
        let param = ConnParam { qp_num: qpn.value(), private_data: private.to_vec(), ..ConnParam::default() };
        self.nic.cm_mut().connect(now, id, &param).unwrap();
        self.drain();
        (id, qpn)
    }

    /// The connection requests reported so far: (the request's ID, its private data).
    pub fn requests(&self) -> Vec<(CmId, Vec<u8>)> {
        self.events
            .iter()
            .filter(|e| e.kind == CmEventKind::ConnectRequest)
            .map(|e| (e.id, e.private_data.clone()))
            .collect()
    }

    /// `rdma_create_qp` on the request's ID, then `rdma_accept`.
    pub fn accept(&mut self, now: Instant, id: CmId) -> Qpn {
        let qpn = self.create_qp();
        self.nic.attach_qp(id, qpn).unwrap();
        self.nic.accept(now, id, &ConnParam { qp_num: qpn.value(), ..ConnParam::default() }).unwrap();
        self.drain();
        qpn
    }

    /// `rdma_reject`.
    pub fn reject(&mut self, now: Instant, id: CmId) {
        self.nic.cm_mut().reject(now, id, b"no").unwrap();
        self.drain();
    }

    /// `rdma_disconnect`.
    pub fn disconnect(&mut self, now: Instant, id: CmId) -> Result<(), softrdma_cm::NicError> {
        let r = self.nic.disconnect(now, id);
        self.drain();
        r
    }

    /// `rdma_destroy_qp` (if any) and `rdma_destroy_id`.
    pub fn destroy(&mut self, now: Instant, id: CmId) {
        if let Some(qpn) = self.nic.attached_qp(id) {
            self.nic.destroy_qp(qpn).unwrap();
        }
        self.nic.destroy_id(now, id).unwrap();
        self.drain();
    }

    /// The kinds of the events of `id`, in order.
    pub fn kinds(&self, id: CmId) -> Vec<CmEventKind> {
        self.events.iter().filter(|e| e.id == id).map(|e| e.kind).collect()
    }

    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.nic.engine().qp_state(qpn)
    }

    pub fn fill(&mut self, offset: u64, data: &[u8]) {
        self.mem.slice_mut(BASE + offset, data.len()).copy_from_slice(data);
    }

    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        self.mem.slice(BASE + offset, len).to_vec()
    }

    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge { addr: BASE + offset, length: len, lkey: self.mr.lkey }
    }

    pub fn post_recv(&mut self, qpn: Qpn, wr_id: u64, offset: u64, len: u32) {
        let sge = self.sge(offset, len);
        self.nic.engine_mut().post_recv(qpn, &[RecvWr { wr_id, sg_list: &[sge] }]).unwrap();
    }

    /// A signaled SEND of `len` bytes at `offset`.
    pub fn post_send(&mut self, qpn: Qpn, wr_id: u64, offset: u64, len: u32) {
        let sge = self.sge(offset, len);
        let wr =
            SendWr { wr_id, op: SendOp::Send, sg_list: &[sge], flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None };
        self.nic.engine_mut().post_send(qpn, &[wr], &self.mem).unwrap();
    }

    /// A signaled RDMA WRITE of `len` bytes at `offset` to `remote_offset` of `peer`'s MR.
    pub fn post_write(&mut self, qpn: Qpn, wr_id: u64, offset: u64, len: u32, peer: &MrKeys, remote_offset: u64) {
        let sge = self.sge(offset, len);
        let op = SendOp::RdmaWrite { remote_addr: BASE + remote_offset, rkey: peer.rkey };
        let wr = SendWr { wr_id, op, sg_list: &[sge], flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None };
        self.nic.engine_mut().post_send(qpn, &[wr], &self.mem).unwrap();
    }

    /// Every completion waiting in the CQ.
    pub fn poll_cq(&mut self) -> Vec<Wc> {
        let cq = self.cq;
        std::iter::from_fn(|| self.nic.engine_mut().poll_cq(cq)).collect()
    }
}

/// The name of the CM message a datagram carries ("REQ", "REP", ...), if it is a MAD.
pub fn mad_name(d: &Datagram) -> Option<&'static str> {
    let packet = RocePacket::new_checked(d.payload()).ok()?;
    if packet.bth().dest_qp() != Qpn::GSI {
        return None;
    }
    let repr = RoceRepr::parse_ignoring_icrc(&packet).ok()?;
    let mad = repr.payload.get(..softrdma_wire::mad::MAD_LEN)?;
    let repr = MadRepr::parse(&MadPacket::new_checked(mad).ok()?).ok()?;
    Some(CmMessage::parse(&repr).ok()?.name())
}

/// Two NICs, A at 10.0.0.1 and B at 10.0.0.2, on a fabric with 5 µs of latency.
pub struct Net {
    pub sim: Fabric,
    pub a: NodeId,
    pub b: NodeId,
}

impl Net {
    pub fn new(seed: u64) -> Self {
        let mut sim = Fabric::new(seed);
        let a = sim.add_node(NicNode::new(IP_A, seed ^ 0xa, 3 << 21));
        let b = sim.add_node(NicNode::new(IP_B, seed ^ 0xb, 5 << 21));
        Self { sim, a, b }
    }

    pub fn a(&mut self) -> &mut NicNode {
        self.sim.node_mut(self.a)
    }

    pub fn b(&mut self) -> &mut NicNode {
        self.sim.node_mut(self.b)
    }

    /// Both nodes, to read.
    pub fn nodes(&self) -> [&NicNode; 2] {
        [self.sim.node(self.a), self.sim.node(self.b)]
    }

    pub fn now(&self) -> Instant {
        self.sim.now()
    }

    pub fn run_for(&mut self, d: Duration) {
        self.sim.run_for(d).unwrap();
    }

    /// Runs until nothing is in flight and no timer is armed, within a minute of virtual
    /// time (a timer armed beyond it fails the test).
    pub fn settle(&mut self) {
        self.sim.run_until_idle(Duration::from_secs(60)).unwrap();
        assert_eq!(self.sim.next_event(), None, "a timer is still armed at {:?}", self.now());
    }

    /// B listens; A connects with `private`; runs until the request reaches B.
    pub fn request(&mut self, private: &[u8]) -> (CmId, Qpn, CmId) {
        self.b().listen(PORT);
        let now = self.now();
        let (id, qpn) = self.a().connect(now, IP_B, PORT, private);
        let b = self.b;
        self.sim.run_until_cond(Duration::from_secs(1), |s| !s.node::<NicNode>(b).requests().is_empty()).unwrap();
        let req = self.b().requests()[0].0;
        (id, qpn, req)
    }
}

/// What the swarms of this crate (`swarm.rs`, `swarm_ud.rs`) share: a bad network drawn
/// from a seed, the loop that runs the fabric and the applications' reactions in turn,
/// payloads that name their message, and the check that nothing is left.
pub mod swarm {
    use std::time::Duration;

    use softrdma_engine::Instant;
    use softrdma_sim::{FaultConfig, RuleId, SimRng, Verdict};

    use super::Net;

    /// A bad network for `net` from `seed`: its faults (loss, duplication, reordering,
    /// corruption), and, drawn from `rng` three times in ten, a stretch within the first
    /// `faulty` of the run in which the two nodes cannot reach each other at all. Returns
    /// the faults and the rules that make them, for the heal to remove.
    pub fn bad_network(net: &mut Net, seed: u64, rng: &mut SimRng, faulty: Duration) -> (FaultConfig, Vec<RuleId>) {
        let faults = FaultConfig::random(&mut SimRng::with_stream(seed, 1));
        let mut rules = net.sim.add_faults(&faults);
        if rng.chance(0.3) {
            let from = Instant::ZERO + Duration::from_micros(rng.below(faulty.as_micros() as u64));
            let to = from + Duration::from_micros(1000 + rng.below(30_000));
            let cut = move |d: &softrdma_sim::Datagram| {
                if d.sent_at() >= from && d.sent_at() < to { Verdict::Drop } else { Verdict::Deliver }
            };
            rules.push(net.sim.add_rule(cut));
        }
        (faults, rules)
    }

    /// A swarm run: the fabric and the applications on it.
    pub trait Run {
        fn net(&mut self) -> &mut Net;
        /// The applications' reactions to what happened since the last call.
        fn react(&mut self);
        /// The next instant after `now` at which an application acts on its own (starts,
        /// exits), if any.
        fn planned_after(&self, now: Instant) -> Option<Instant>;

        /// Runs and reacts until `until`, or (with `quiet`) until nothing is left to happen.
        fn drive(&mut self, until: Instant, quiet: bool) -> Result<(), String> {
            loop {
                self.react();
                let now = self.net().now();
                let next = [self.net().sim.next_event(), self.planned_after(now)].into_iter().flatten().min();
                match next {
                    None if quiet => return Ok(()),
                    Some(t) if t <= until => self.net().sim.run_until(t).map_err(|e| e.to_string())?,
                    _ if quiet => return Err(format!("not quiet by {until:?}: next event at {next:?}")),
                    _ => {
                        self.net().sim.run_until(until).map_err(|e| e.to_string())?;
                        self.react();
                        return Ok(());
                    }
                }
            }
        }
    }

    /// `len` bytes that identify message `k` of connection `i` (with `salt`, the swarm's);
    /// never 0.
    pub fn payload(i: usize, k: u64, len: u32, salt: u64) -> Vec<u8> {
        let mut x = (i as u64) << 32 | k | salt;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8 | 1
            })
            .collect()
    }

    /// Destroys every CM ID B still holds (requests no application took), lets the network
    /// go quiet, and checks that neither node has a CM ID or a QP left.
    pub fn nothing_left(net: &mut Net) -> Result<(), String> {
        let now = net.now();
        for id in net.b().nic.cm().ids() {
            net.b().destroy(now, id);
        }
        net.sim.run_until_idle(Duration::from_secs(5)).map_err(|e| format!("after destroying: {e}"))?;
        for (side, node) in ["A", "B"].iter().zip(net.nodes()) {
            let (ids, qps) = (node.nic.cm().id_count(), node.nic.engine().qp_count());
            if ids != 0 || qps != 0 {
                return Err(format!("{side}: {ids} CM IDs and {qps} QPs left after destroying all"));
            }
        }
        Ok(())
    }
}
