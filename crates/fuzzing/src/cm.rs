//! The connection manager, with the network and both applications played by the fuzzer.
//!
//! Two CMs, A (10.0.0.1) and B (10.0.0.2), each listening for RC (TCP port space) and UD
//! (UDP port space, SIDR) on port 7174. The input is a sequence of steps: the network's
//! (deliver any MAD in flight, in any order; drop it; duplicate it; deliver a copy with
//! bytes changed; replay any MAD ever sent, changed, to either side; inject arbitrary
//! bytes; let time pass) and the applications' (connect, with or without authenticated
//! mode; accept, reject, establish, disconnect or destroy any ID). Every MAD a CM sends
//! joins the flight and the history, so the fuzzer forges with live comm IDs and
//! transaction IDs by mutating real messages.
//!
//! Checked, outside the CM:
//!
//! - nothing panics, whatever the order of commands and MADs;
//! - every MAD sent is 256 bytes (plus an offer or seal), from the CM's own address;
//! - every event names a live ID; a `CONNECT_REQUEST` is an ID's first event, names a
//!   listener, and comes only for IDs the CM made; per ID, at most one `ESTABLISHED`, one
//!   `DISCONNECTED`, one `TIMEWAIT_EXIT` (its last event) and one failure (`REJECTED`,
//!   `UNREACHABLE`, `CONNECT_ERROR`);
//! - the CM stays bounded (`MAX_IDS`) and answers a flood with at most a bounded queue;
//! - in the end, after every application destroys every ID and the network delivers what
//!   is left, neither CM holds an ID or a timer: nothing leaks.

use core::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use softrdma_cm::auth::AuthPolicy;
use softrdma_cm::{Cm, CmConfig, CmEvent, CmEventKind, CmId, ConnParam};
use softrdma_engine::{Instant, QpType};
use softrdma_wire::cma::PortSpace;
use softrdma_wire::mad::MAD_LEN;

use crate::flight;

const IPS: [IpAddr; 2] = [IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))];
const PORT: u16 = 7174;
/// IDs a CM may hold: the fuzzer's floods of REQs must meet this bound.
const MAX_IDS: usize = 48;
/// Steps taken from one input, at most.
const MAX_STEPS: usize = 400;

/// One thing the network or an application does.
#[derive(Arbitrary, Debug)]
enum Step {
    /// Delivers the MAD at `index` of those in flight (any order).
    Deliver { index: u8 },
    /// Loses it.
    Drop { index: u8 },
    /// Delivers it and keeps it in flight.
    Duplicate { index: u8 },
    /// Delivers a copy of it with bytes changed, and keeps it in flight.
    Mutate { index: u8, edits: Vec<(u16, u8)> },
    /// Sends any MAD ever sent, changed, to either side (a forger who sniffed them).
    Replay { index: u16, to_b: bool, edits: Vec<(u16, u8)> },
    /// Sends arbitrary bytes to either side.
    Inject { to_b: bool, bytes: Vec<u8> },
    /// Lets time pass, firing both CMs' timers.
    Advance { micros: u32 },
    /// An application connects to the other side (RC, or UD through SIDR).
    Connect { on_b: bool, ud: bool, authenticate: bool, private: u8 },
    /// Accepts the ID at `index` of the side's live IDs (a request, usually).
    Accept { on_b: bool, index: u8 },
    /// Rejects it.
    Reject { on_b: bool, index: u8 },
    /// `rdma_establish` on it.
    Establish { on_b: bool, index: u8 },
    /// `rdma_disconnect` on it.
    Disconnect { on_b: bool, index: u8 },
    /// `rdma_destroy_id` on it.
    Destroy { on_b: bool, index: u8 },
}

/// A MAD on the way.
#[derive(Clone, Debug)]
struct Flight {
    to_b: bool,
    src: IpAddr,
    dst: IpAddr,
    payload: Vec<u8>,
}

/// What the oracle knows of one ID from its events.
#[derive(Default, Debug)]
struct Seen {
    events: Vec<CmEventKind>,
}

struct Side {
    cm: Cm,
    /// IDs the application made (`create_id`); the others came with a `CONNECT_REQUEST`.
    made: BTreeSet<CmId>,
    listeners: BTreeSet<CmId>,
    seen: BTreeMap<CmId, Seen>,
}

/// The run: both sides, the flight, the history, the clock.
struct World {
    sides: [Side; 2],
    flight: Vec<Flight>,
    history: Vec<Flight>,
    now: Instant,
}

fn side(k: usize) -> Side {
    let config = CmConfig {
        seed: 7 + k as u64,
        comm_id_prefix: (k as u32 + 1) << 21,
        addresses: vec![IPS[k]],
        response_timeout: 8,
        max_retries: 3,
        timewait: Duration::from_millis(20),
        max_ids: MAX_IDS,
        auth_seed: [k as u8 + 1; 32],
        ..CmConfig::default()
    };
    let mut cm = Cm::new(config);
    let mut made = BTreeSet::new();
    for (ps, qp_type) in [(PortSpace::TCP, QpType::Rc), (PortSpace::UDP, QpType::Ud)] {
        let l = cm.create_id(ps, qp_type).expect("a listener");
        cm.bind_addr(l, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT)).expect("bind");
        cm.listen(l, 8).expect("listen");
        made.insert(l);
    }
    let listeners = made.clone();
    Side { cm, made, listeners, seen: BTreeMap::new() }
}

/// `payload` with each `(offset, xor)` edit applied.
pub(crate) fn mutate(payload: &[u8], edits: &[(u16, u8)]) -> Vec<u8> {
    let mut p = payload.to_vec();
    if !p.is_empty() {
        for &(at, x) in edits {
            let i = usize::from(at) % p.len();
            p[i] ^= x;
        }
    }
    p
}

impl World {
    fn new() -> Self {
        Self { sides: [side(0), side(1)], flight: Vec::new(), history: Vec::new(), now: Instant::ZERO }
    }

    /// Takes every MAD and event both CMs have, checking each.
    fn drain(&mut self) {
        for (k, &ip) in IPS.iter().enumerate() {
            while let Some(t) = self.sides[k].cm.poll_transmit() {
                assert_eq!(t.src, ip, "a MAD from an address that is not the CM's: {t:?}");
                let payload = t.payload();
                assert!(payload.len() >= MAD_LEN, "a MAD of {} bytes", payload.len());
                let f = Flight { to_b: k == 0, src: t.src, dst: t.dst, payload };
                if self.history.len() < 256 {
                    self.history.push(f.clone());
                }
                if self.flight.len() < 256 {
                    self.flight.push(f);
                }
            }
            while let Some(e) = self.sides[k].cm.poll_event() {
                self.sides[k].check(&e);
            }
            let s = &self.sides[k];
            assert!(s.cm.id_count() <= MAX_IDS + 8, "{} IDs held, bound {MAX_IDS}", s.cm.id_count());
        }
    }

    fn deliver(&mut self, f: &Flight) {
        let k = usize::from(f.to_b);
        self.sides[k].cm.handle_mad(self.now, f.src, f.dst, &f.payload);
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        for s in &mut self.sides {
            s.cm.handle_timeout(self.now);
        }
    }

    /// The live ID at `index` on a side, if it has any.
    fn pick(&self, on_b: bool, index: u8) -> Option<CmId> {
        let ids = self.sides[usize::from(on_b)].cm.ids();
        (!ids.is_empty()).then(|| ids[usize::from(index) % ids.len()])
    }

    fn step(&mut self, step: Step) {
        let now = self.now;
        match step {
            Step::Deliver { index } => {
                if let Some(f) = flight::take(&mut self.flight, index.into()) {
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
            Step::Mutate { index, edits } => {
                if let Some(mut f) = flight::copy(&self.flight, index.into()) {
                    f.payload = mutate(&f.payload, &edits);
                    self.deliver(&f);
                }
            }
            Step::Replay { index, to_b, edits } => {
                if let Some(mut f) = flight::copy(&self.history, index.into()) {
                    f.payload = mutate(&f.payload, &edits);
                    f.to_b = to_b;
                    (f.src, f.dst) = (IPS[usize::from(!to_b)], IPS[usize::from(to_b)]);
                    self.deliver(&f);
                }
            }
            Step::Inject { to_b, bytes } => {
                let f = Flight { to_b, src: IPS[usize::from(!to_b)], dst: IPS[usize::from(to_b)], payload: bytes };
                self.deliver(&f);
            }
            Step::Advance { micros } => self.advance(Duration::from_micros(u64::from(micros % 2_000_000))),
            Step::Connect { on_b, ud, authenticate, private } => {
                let k = usize::from(on_b);
                let s = &mut self.sides[k];
                let (ps, qp_type) = if ud { (PortSpace::UDP, QpType::Ud) } else { (PortSpace::TCP, QpType::Rc) };
                let Ok(id) = s.cm.create_id(ps, qp_type) else { return };
                s.made.insert(id);
                if authenticate {
                    let _ = s.cm.set_auth_policy(id, AuthPolicy { required: true, psk: None });
                }
                let dst = SocketAddr::new(IPS[1 - k], PORT);
                let _ = s.cm.resolve_addr(now, id, Some(SocketAddr::new(IPS[k], 0)), dst);
                let _ = s.cm.resolve_route(now, id);
                let param = ConnParam {
                    qp_num: 0x100 + u32::from(private),
                    private_data: vec![private; 8],
                    ..ConnParam::default()
                };
                let _ = s.cm.connect(now, id, &param);
            }
            Step::Accept { on_b, index } => {
                if let Some(id) = self.pick(on_b, index) {
                    let param = ConnParam { qp_num: 0x200 + u32::from(index), ..ConnParam::default() };
                    let _ = self.sides[usize::from(on_b)].cm.accept(now, id, &param);
                }
            }
            Step::Reject { on_b, index } => {
                if let Some(id) = self.pick(on_b, index) {
                    let _ = self.sides[usize::from(on_b)].cm.reject(now, id, b"no");
                }
            }
            Step::Establish { on_b, index } => {
                if let Some(id) = self.pick(on_b, index) {
                    let _ = self.sides[usize::from(on_b)].cm.establish(now, id);
                }
            }
            Step::Disconnect { on_b, index } => {
                if let Some(id) = self.pick(on_b, index) {
                    let _ = self.sides[usize::from(on_b)].cm.disconnect(now, id);
                }
            }
            Step::Destroy { on_b, index } => {
                if let Some(id) = self.pick(on_b, index) {
                    let s = &mut self.sides[usize::from(on_b)];
                    s.cm.destroy_id(now, id).expect("destroying a live ID");
                    s.listeners.remove(&id);
                }
            }
        }
        self.drain();
    }

    /// Every application destroys every ID; the network delivers what is in flight, then
    /// everything goes quiet. Nothing may be left.
    fn finish(&mut self) {
        for s in &mut self.sides {
            for id in s.cm.ids() {
                s.cm.destroy_id(self.now, id).expect("destroying a live ID");
            }
            s.listeners.clear();
        }
        self.drain();
        for _ in 0..64 {
            let flight = std::mem::take(&mut self.flight);
            if flight.is_empty() {
                break;
            }
            for f in &flight {
                self.deliver(f);
            }
            self.drain();
        }
        for (k, s) in self.sides.iter().enumerate() {
            assert_eq!(s.cm.id_count(), 0, "side {k}: IDs left after destroying all: {:?}", s.cm.ids());
            assert_eq!(s.cm.poll_timeout(), None, "side {k}: a timer armed with no ID");
        }
    }
}

impl Side {
    fn check(&mut self, e: &CmEvent) {
        use CmEventKind::*;
        let live = self.cm.ids();
        assert!(live.contains(&e.id), "an event for an ID that is gone: {e:?}");
        let seen = self.seen.entry(e.id).or_default();
        if e.kind == ConnectRequest {
            assert!(seen.events.is_empty(), "CONNECT_REQUEST after {:?}", seen.events);
            assert!(!self.made.contains(&e.id), "CONNECT_REQUEST for an ID the application made");
            let l = e.listen_id.expect("CONNECT_REQUEST names its listener");
            assert!(self.listeners.contains(&l), "CONNECT_REQUEST on {l:?}, not a listener");
        }
        assert_ne!(seen.events.last(), Some(&TimewaitExit), "{:?} after TIMEWAIT_EXIT", e.kind);
        seen.events.push(e.kind);
        let count = |k: &[CmEventKind]| seen.events.iter().filter(|x| k.contains(x)).count();
        assert!(count(&[Established]) <= 1, "ESTABLISHED twice: {:?}", seen.events);
        assert!(count(&[Disconnected]) <= 1, "DISCONNECTED twice: {:?}", seen.events);
        assert!(count(&[Rejected, Unreachable, ConnectError]) <= 1, "two failures: {:?}", seen.events);
        assert!(e.private_data.len() <= MAD_LEN, "{} bytes of private data", e.private_data.len());
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
    w.finish();
}
