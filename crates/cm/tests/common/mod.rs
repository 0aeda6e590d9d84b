//! Test helpers: a `Pair` of CMs on a virtual clock, and the MADs of the kernel captures.
#![allow(dead_code, unreachable_pub)]

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use pcap_file::pcap::PcapReader;
use softrdma_cm::{Cm, CmConfig, CmEvent, CmEventKind, CmId, CmTransmit, ConnParam};
use softrdma_engine::{Instant, QpType};
use softrdma_wire::cm::CmMessage;
use softrdma_wire::cma::PortSpace;
use softrdma_wire::mad::{MAD_LEN, MadPacket, MadRepr};

pub const IP_A: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
pub const IP_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
pub const PORT: u16 = 7174;
/// A small response timeout for the tests: 4.096 µs · 2^10 ≈ 4.2 ms.
pub const RESPONSE_TIMEOUT: u8 = 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Side {
    A,
    B,
}

/// One MAD that went over the virtual wire.
#[derive(Clone, Debug)]
pub struct Sent {
    pub at: Instant,
    pub from: Side,
    pub name: &'static str,
    pub dropped: bool,
    pub mad: [u8; MAD_LEN],
    /// Authenticated mode's offer after the MAD, as it left (before `strip_offers`).
    pub offer: Option<[u8; softrdma_cm::auth::OFFER_LEN]>,
    /// Authenticated mode's seal after the MAD, as it left.
    pub seal: Option<[u8; softrdma_cm::auth::SEAL_LEN]>,
}

/// The name of a CM MAD ("REQ", "REP", ...).
pub fn name_of(mad: &[u8]) -> &'static str {
    let repr = MadRepr::parse(&MadPacket::new_checked(mad).unwrap()).unwrap();
    CmMessage::parse(&repr).unwrap().name()
}

pub fn config(seed: u64, ip: IpAddr, prefix: u32) -> CmConfig {
    CmConfig {
        seed,
        comm_id_prefix: prefix,
        addresses: vec![ip],
        response_timeout: RESPONSE_TIMEOUT,
        max_retries: 3,
        timewait: Duration::from_millis(50),
        node_guid: 0x5054_00ff_fe00_0000 | seed,
        ..CmConfig::default()
    }
}

/// Two CMs, A (active, 10.0.0.1) and B (passive, 10.0.0.2), joined by a virtual wire that
/// delivers instantly unless `drop` says otherwise.
pub struct Pair {
    pub now: Instant,
    pub a: Cm,
    pub b: Cm,
    pub log: Vec<Sent>,
    pub events_a: Vec<CmEvent>,
    pub events_b: Vec<CmEvent>,
    /// Decides the fate of each MAD: `true` drops it.
    pub drop: Box<dyn FnMut(Side, &'static str) -> bool>,
    /// Removes the offers this side sends, as a peer that is not softrdma never makes one.
    pub strip_offers: Option<Side>,
}

impl Pair {
    pub fn new() -> Self {
        Self::with_prefixes(3 << 21, 5 << 21)
    }

    pub fn with_prefixes(pa: u32, pb: u32) -> Self {
        Self::with_configs(config(1, IP_A, pa), config(2, IP_B, pb))
    }

    pub fn with_configs(ca: CmConfig, cb: CmConfig) -> Self {
        Self {
            now: Instant::from_nanos(1_000_000_000),
            a: Cm::new(ca),
            b: Cm::new(cb),
            log: Vec::new(),
            events_a: Vec::new(),
            events_b: Vec::new(),
            drop: Box::new(|_, _| false),
            strip_offers: None,
        }
    }

    /// Drops the first `n` MADs named `name` sent by `side`.
    pub fn drop_first(&mut self, side: Side, name: &'static str, n: usize) {
        let mut left = n;
        self.drop = Box::new(move |s, m| {
            if s == side && m == name && left > 0 {
                left -= 1;
                true
            } else {
                false
            }
        });
    }

    /// Delivers MADs until both sides are quiet, collecting events.
    pub fn drive(&mut self) {
        loop {
            let mut moved = false;
            while let Some(t) = self.a.poll_transmit() {
                moved = true;
                self.carry(Side::A, t);
            }
            while let Some(t) = self.b.poll_transmit() {
                moved = true;
                self.carry(Side::B, t);
            }
            while let Some(e) = self.a.poll_event() {
                self.events_a.push(e);
            }
            while let Some(e) = self.b.poll_event() {
                self.events_b.push(e);
            }
            if !moved {
                break;
            }
        }
    }

    fn carry(&mut self, from: Side, t: CmTransmit) {
        let name = name_of(&t.mad);
        let dropped = (self.drop)(from, name);
        self.log.push(Sent { at: self.now, from, name, dropped, mad: t.mad, offer: t.offer, seal: t.seal });
        if dropped {
            return;
        }
        let mut t = t;
        if self.strip_offers == Some(from) {
            t.offer = None;
        }
        let to = if from == Side::A { &mut self.b } else { &mut self.a };
        to.handle_mad(self.now, t.src, t.dst, &t.payload());
    }

    /// The next instant either side wants a timeout.
    pub fn next_timeout(&self) -> Option<Instant> {
        [self.a.poll_timeout(), self.b.poll_timeout()].into_iter().flatten().min()
    }

    /// Advances the clock to the next timeout (if it is before `until`), fires it, drives.
    pub fn step(&mut self, until: Instant) -> bool {
        let Some(t) = self.next_timeout().filter(|&t| t <= until) else { return false };
        assert!(t >= self.now, "time never goes backwards");
        self.now = t;
        self.a.handle_timeout(t);
        self.b.handle_timeout(t);
        self.drive();
        true
    }

    /// Runs timers for `d` of virtual time.
    pub fn drive_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.drive();
        while self.step(until) {}
        self.now = until;
    }

    /// Runs until no timer is left (bounded).
    pub fn settle(&mut self) {
        self.drive();
        for _ in 0..10_000 {
            if !self.step(Instant::MAX) {
                return;
            }
        }
        panic!("the pair never settled");
    }

    pub fn kinds_a(&self) -> Vec<CmEventKind> {
        self.events_a.iter().map(|e| e.kind).collect()
    }

    pub fn kinds_b(&self) -> Vec<CmEventKind> {
        self.events_b.iter().map(|e| e.kind).collect()
    }

    pub fn sent(&self, from: Side, name: &str) -> Vec<&Sent> {
        self.log.iter().filter(|s| s.from == from && s.name == name).collect()
    }

    /// B listens on TCP port 7174 of every address.
    pub fn listen(&mut self, ps: PortSpace, qp_type: QpType) -> CmId {
        let l = self.b.create_id(ps, qp_type).unwrap();
        self.b.bind_addr(l, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT)).unwrap();
        self.b.listen(l, 8).unwrap();
        l
    }

    /// A resolves B's port 7174 and has a route.
    pub fn resolve(&mut self, ps: PortSpace, qp_type: QpType) -> CmId {
        let id = self.a.create_id(ps, qp_type).unwrap();
        self.resolve_id(id);
        id
    }

    /// A's `id` resolved (address and route) to B's port, events cleared.
    pub fn resolve_id(&mut self, id: CmId) {
        self.a.resolve_addr(self.now, id, Some(SocketAddr::new(IP_A, 0)), SocketAddr::new(IP_B, PORT)).unwrap();
        self.a.resolve_route(self.now, id).unwrap();
        self.drive();
        assert_eq!(self.kinds_a(), [CmEventKind::AddrResolved, CmEventKind::RouteResolved]);
        self.events_a.clear();
    }

    /// A's resolved RC `a` connects, B accepts the request, A establishes: B's ID.
    pub fn connect_accept_establish(&mut self, a: CmId) -> CmId {
        self.a.connect(self.now, a, &active_param()).unwrap();
        self.drive();
        let b = self.take_request().id;
        self.b.accept(self.now, b, &passive_param()).unwrap();
        self.drive();
        self.a.establish(self.now, a).unwrap();
        self.drive();
        b
    }

    /// The last event of B, which must be a CONNECT_REQUEST: its new ID.
    pub fn take_request(&mut self) -> CmEvent {
        let e = self.events_b.pop().expect("B has an event");
        assert_eq!(e.kind, CmEventKind::ConnectRequest, "{e:?}");
        e
    }
}

pub fn active_param() -> ConnParam {
    ConnParam {
        private_data: b"from A".to_vec(),
        responder_resources: 1,
        initiator_depth: 2,
        qp_num: 0x11,
        start_psn: Some(0x00_1000),
        ..ConnParam::default()
    }
}

pub fn passive_param() -> ConnParam {
    ConnParam {
        private_data: b"from B".to_vec(),
        responder_resources: 2,
        initiator_depth: 1,
        rnr_retry_count: 6,
        qp_num: 0x22,
        start_psn: Some(0x00_2000),
        ..ConnParam::default()
    }
}

/// A connected RC pair: (A's ID, B's ID), events cleared.
pub fn connected() -> (Pair, CmId, CmId) {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    let b = p.connect_accept_establish(a);
    assert_eq!(p.kinds_a(), [CmEventKind::ConnectResponse, CmEventKind::Established]);
    assert_eq!(p.kinds_b(), [CmEventKind::Established]);
    p.events_a.clear();
    p.events_b.clear();
    (p, a, b)
}

// ------------------------------------------------------------------ captures

pub fn data_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data"))
}

/// One MAD sent in a capture (not those quoted in ICMP errors).
#[derive(Clone, Debug)]
pub struct CapturedMad {
    /// 1-based, as tshark numbers frames.
    pub frame: usize,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub bytes: Vec<u8>,
}

/// Every MAD sent in the capture `name`: UD SEND_ONLY packets to QP 1 in IPv4/UDP 4791.
/// Frames are cut at fixed offsets (Ethernet 14, IPv4 20, UDP 8, BTH 12, DETH 8).
pub fn mads_in(name: &str) -> Vec<CapturedMad> {
    let file = File::open(data_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut reader = PcapReader::new(file).unwrap();
    let mut mads = Vec::new();
    let mut frame = 0;
    while let Some(packet) = reader.next_packet() {
        frame += 1;
        let data = packet.unwrap().data.into_owned();
        if data.len() < 14 + 20 + 8 + 20 + MAD_LEN || data[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &data[14..];
        if ip[0] != 0x45 || ip[9] != 17 || u16::from_be_bytes([ip[22], ip[23]]) != 4791 {
            continue;
        }
        let roce = &ip[28..];
        if roce[0] != 0x64 || roce[5..8] != [0, 0, 1] {
            continue;
        }
        let src = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
        let dst = IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
        mads.push(CapturedMad { frame, src, dst, bytes: roce[20..20 + MAD_LEN].to_vec() });
    }
    mads
}

pub fn mad_at(mads: &[CapturedMad], frame: usize) -> &CapturedMad {
    mads.iter().find(|m| m.frame == frame).unwrap_or_else(|| panic!("no MAD in frame {frame}"))
}
