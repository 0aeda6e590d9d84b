//! Swarm simulation of rdma_cm's UD side (SIDR) and its QPs together, as `swarm.rs` is of
//! RC connections: for each seed, a bad network drawn from the seed (loss, duplication,
//! reordering, corruption, and sometimes a stretch in which nothing gets through), up to
//! six UD IDs on A that resolve a service on B (SIDR_REQ), which B's application accepts
//! with a UD QP of its own or rejects, then two UD SENDs to it, and now and then an
//! application on either side that destroys its ID and QP whatever their state; then the
//! network heals, and the run must converge. Checked here, outside the code under test (an
//! application that destroyed its ID is held only to what it saw before):
//!
//! - every resolve ends with exactly one outcome, ESTABLISHED (with the service's QPN and
//!   Q_Key) or UNREACHABLE, and B's application sees one request for it at most, however
//!   often the SIDR_REQ is resent (a repeat after B answered gets the answer again);
//! - the sides agree: ESTABLISHED only for a request B accepted, naming the QP B accepted
//!   it with, with rdma_cm's UDP Q_Key; UNREACHABLE with a SIDR REJECT status only for one
//!   B turned down;
//! - every SEND completes once, successfully (UD does not wait for the peer); every
//!   receive B completes holds one of that resolve's SENDs after its 40-byte GRH (UD may
//!   lose or duplicate them; it never makes one up);
//! - after every ID and QP is destroyed, no CM ID and no QP is left, and the network goes
//!   quiet.
//!
//! `SOFTRDMA_SEEDS=20000 cargo test -p softrdma-cm --release --test swarm_ud` runs more
//! seeds; `SOFTRDMA_SEED=0x...` replays one.

mod nic_common;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use nic_common::swarm::{Run as _, bad_network, nothing_left};
use nic_common::*;
use softrdma_cm::CmEventKind::{self, *};
use softrdma_cm::{CmId, CmStatus, ConnParam};
use softrdma_engine::{
    AhId, Instant, QpCap, QpInitAttr, QpType, RecvWr, SendFlags, SendOp, SendWr, UdDest, Wc, WcOpcode, WcStatus,
};
use softrdma_sim::{SimRng, swarm};
use softrdma_wire::Qpn;
use softrdma_wire::cm::SidrStatus;
use softrdma_wire::cma::PortSpace;
use softrdma_wire::types::QKey;

/// How long the network is bad.
const FAULTY: Duration = Duration::from_millis(30);
/// Bytes of each SEND.
const LEN: u32 = 200;
/// The GRH a UD receive starts with.
const GRH: u32 = 40;

/// What the harness's applications do with one resolve.
#[derive(Clone, Debug)]
struct Plan {
    accept: bool,
    start: Instant,
    /// A's application destroys its ID and QP at this instant (it exits).
    vanish: Option<Instant>,
    /// B's application destroys the request's ID and QP at this instant (or when the
    /// request comes, if later).
    b_vanish: Option<Instant>,
}

#[derive(Default, Debug)]
struct Conn {
    a_id: Option<CmId>,
    a_qp: Option<Qpn>,
    a_ah: Option<AhId>,
    b_id: Option<CmId>,
    b_qp: Option<Qpn>,
    /// B's application accepted (`Some(true)`) or rejected (`Some(false)`) the request.
    answered: Option<bool>,
    requests: u32,
    /// Requests that came after B's application destroyed the first one's ID: it turned
    /// them down.
    late_requests: u32,
    a_gone: bool,
    b_gone: bool,
    a_wcs: Vec<Wc>,
    b_wcs: Vec<Wc>,
}

/// Where resolve `i`'s bytes are: its SENDs on A at `src(i)` and `src(i) + LEN`, B's two
/// receives at `recv(i, 0)` and `recv(i, 1)`.
fn src(i: usize) -> u64 {
    0x1_0000 + i as u64 * 0x1000
}
fn recv(i: usize, k: u64) -> u64 {
    0x4_0000 + i as u64 * 0x1000 + k * 0x400
}

/// Bytes that identify SEND `k` of resolve `i`; never 0.
fn payload(i: usize, k: u64) -> Vec<u8> {
    nic_common::swarm::payload(i, k, LEN, 0x3c00_0000_0000_0000)
}

/// A UD QP on `n`'s CQ, moved by the NIC when it is attached to an ID.
fn create_ud_qp(n: &mut NicNode) -> Qpn {
    let cap = QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init =
        QpInitAttr { pd: n.pd, send_cq: n.cq, recv_cq: n.cq, srq: None, qp_type: QpType::Ud, cap, sq_sig_all: false };
    n.nic.engine_mut().create_qp(&init).unwrap()
}

struct Run {
    net: Net,
    plans: Vec<Plan>,
    conns: Vec<Conn>,
    a_seen: usize,
    b_seen: usize,
}

impl nic_common::swarm::Run for Run {
    fn net(&mut self) -> &mut Net {
        &mut self.net
    }

    fn planned_after(&self, now: Instant) -> Option<Instant> {
        self.plans.iter().flat_map(|p| [Some(p.start), p.vanish, p.b_vanish]).flatten().filter(|&s| s > now).min()
    }

    /// The applications' reactions to what happened since the last call, at `now`.
    fn react(&mut self) {
        let now = self.net.now();
        // Resolves whose time has come: as udaddy's client, an ID resolved and routed, a UD
        // QP created (INIT to RTS at once), then `rdma_connect`.
        for (i, plan) in self.plans.iter().enumerate() {
            if plan.start <= now && self.conns[i].a_id.is_none() {
                let a = self.net.a();
                let cm = a.nic.cm_mut();
                let id = cm.create_id(PortSpace::UDP, QpType::Ud).unwrap();
                let (from, to) = (SocketAddr::new(IP_A, 0), SocketAddr::new(IP_B, PORT));
                cm.resolve_addr(now, id, Some(from), to).unwrap();
                cm.resolve_route(now, id).unwrap();
                let qpn = create_ud_qp(a);
                a.nic.attach_qp(id, qpn).unwrap();
                let param = ConnParam { qp_num: qpn.value(), private_data: vec![0xc0, i as u8], ..Default::default() };
                a.nic.cm_mut().connect(now, id, &param).unwrap();
                a.drain();
                self.conns[i].a_id = Some(id);
                self.conns[i].a_qp = Some(qpn);
            }
        }
        // Applications that exit.
        for i in 0..self.plans.len() {
            let c = &self.conns[i];
            if self.plans[i].vanish.is_some_and(|t| t <= now) && !c.a_gone && c.a_id.is_some() {
                self.vanish_a(i, now);
            }
            let c = &self.conns[i];
            if self.plans[i].b_vanish.is_some_and(|t| t <= now) && !c.b_gone {
                if let Some(id) = c.b_id {
                    self.conns[i].b_gone = true;
                    self.net.b().destroy(now, id);
                }
            }
        }
        // B: requests, answered as the plan says.
        let events: Vec<_> = self.net.b().events[self.b_seen..].to_vec();
        self.b_seen += events.len();
        for e in events.into_iter().filter(|e| e.kind == ConnectRequest) {
            let i = e.private_data[1] as usize;
            let c = &mut self.conns[i];
            if c.b_gone || c.b_id.is_some() {
                // A request after the application destroyed the first one's ID is a new
                // one to it, and turned down; a second while the first lives is a fault
                // the checker reports.
                if c.b_gone {
                    c.late_requests += 1;
                } else {
                    c.requests += 1;
                }
                let b = self.net.b();
                let _ = b.nic.cm_mut().reject(now, e.id, b"again");
                b.drain();
                continue;
            }
            c.requests += 1;
            c.b_id = Some(e.id);
            let b = self.net.b();
            if self.plans[i].accept {
                let qpn = create_ud_qp(b);
                b.nic.attach_qp(e.id, qpn).unwrap();
                for k in 0..2 {
                    let sge = b.sge(recv(i, k), LEN + GRH);
                    b.nic
                        .engine_mut()
                        .post_recv(qpn, &[RecvWr { wr_id: 100 * i as u64 + k, sg_list: &[sge] }])
                        .unwrap();
                }
                b.nic.accept(now, e.id, &ConnParam { qp_num: qpn.value(), ..Default::default() }).unwrap();
                b.drain();
                self.conns[i].b_qp = Some(qpn);
                self.conns[i].answered = Some(true);
            } else {
                b.nic.cm_mut().reject(now, e.id, b"no").unwrap();
                b.drain();
                self.conns[i].answered = Some(false);
            }
        }
        // A: two SENDs to the service once it is resolved.
        let events: Vec<_> = self.net.a().events[self.a_seen..].to_vec();
        self.a_seen += events.len();
        for e in events {
            let Some(i) = self.conns.iter().position(|c| c.a_id == Some(e.id)) else { continue };
            if e.kind != Established || self.conns[i].a_gone {
                continue;
            }
            let ud = e.ud.expect("a UD ESTABLISHED names the service");
            let qpn = self.conns[i].a_qp.unwrap();
            let a = self.net.a();
            let ah = a.nic.engine_mut().create_ah(a.pd, ud.ah).unwrap();
            let dest = UdDest { ah, remote_qpn: Qpn::from_u24_truncating(ud.remote_qpn), remote_qkey: QKey(ud.qkey) };
            for k in 0..2 {
                let at = src(i) + k * u64::from(LEN);
                a.fill(at, &payload(i, k));
                let sge = a.sge(at, LEN);
                let wr = SendWr {
                    wr_id: 2 * i as u64 + k,
                    op: SendOp::Send,
                    sg_list: &[sge],
                    flags: SendFlags::SIGNALED,
                    ud: Some(dest),
                    xrc_srqn: None,
                };
                a.nic.engine_mut().post_send(qpn, &[wr], &a.mem).unwrap();
            }
            self.conns[i].a_ah = Some(ah);
        }
        // Completions.
        for wc in self.net.a().poll_cq() {
            if let Some(c) = self.conns.iter_mut().find(|c| c.a_qp == Some(wc.qp_num)) {
                c.a_wcs.push(wc);
            }
        }
        for wc in self.net.b().poll_cq() {
            if let Some(c) = self.conns.iter_mut().find(|c| c.b_qp == Some(wc.qp_num)) {
                c.b_wcs.push(wc);
            }
        }
        // What the reactions queued goes in flight now.
        self.net.sim.run_until(now).unwrap();
    }
}

impl Run {
    /// A's application `i` destroys its ID, QP and AH.
    fn vanish_a(&mut self, i: usize, now: Instant) {
        let c = &mut self.conns[i];
        c.a_gone = true;
        let (id, ah) = (c.a_id.unwrap(), c.a_ah.take());
        let a = self.net.a();
        a.destroy(now, id);
        if let Some(ah) = ah {
            a.nic.engine_mut().destroy_ah(ah).unwrap();
        }
    }
}

/// What the runs did, to show the swarm explores.
#[derive(Default, Debug)]
struct Tally {
    resolves: u32,
    established: u32,
    unreachable: u32,
    refused: u32,
    /// Accepted by B, unreachable for A: every SIDR_REP lost, or every SIDR_REQ after the
    /// first (B answers each repeat again).
    accepted_unreachable: u32,
    late_requests: u32,
    received: u32,
}

fn run(seed: u64, tally: &mut Tally) -> Result<(), String> {
    let mut rng = SimRng::with_stream(seed, 7);
    let mut net = Net::new(seed);
    let (faults, rules) = bad_network(&mut net, seed, &mut rng, FAULTY);
    {
        let b = net.b();
        let cm = b.nic.cm_mut();
        let l = cm.create_id(PortSpace::UDP, QpType::Ud).unwrap();
        cm.bind_addr(l, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT)).unwrap();
        cm.listen(l, 64).unwrap();
    }
    let n = 1 + rng.below(6) as usize;
    let plans: Vec<Plan> = (0..n)
        .map(|_| {
            let start = Instant::ZERO + Duration::from_micros(rng.below(10_000));
            Plan {
                accept: !rng.chance(0.25),
                start,
                vanish: rng.chance(0.1).then(|| start + Duration::from_micros(rng.below(20_000))),
                b_vanish: rng.chance(0.1).then(|| start + Duration::from_micros(rng.below(20_000))),
            }
        })
        .collect();
    let conns = (0..n).map(|_| Conn::default()).collect();
    let mut run = Run { net, plans, conns, a_seen: 0, b_seen: 0 };
    run.drive(Instant::ZERO + FAULTY, false)?;
    for r in rules {
        run.net.sim.remove_rule(r);
    }
    let healed = run.net.now();
    let ctx = |run: &Run, msg: String| {
        let mut s = format!("{msg}\n  faults: {faults:?}\n  plans: {:?}", run.plans);
        for (i, c) in run.conns.iter().enumerate() {
            let [a, b] = run.net.nodes();
            let ka = c.a_id.map(|id| a.kinds(id));
            let kb = c.b_id.map(|id| b.kinds(id));
            let wa: Vec<_> = c.a_wcs.iter().map(|w| (w.wr_id, w.status)).collect();
            let wb: Vec<_> = c.b_wcs.iter().map(|w| (w.wr_id, w.status, w.byte_len)).collect();
            let _ = write!(
                s,
                "\n  conn {i}: a {ka:?} b {kb:?} answered {:?} requests {} (+{} late) a_wcs {wa:?} b_wcs {wb:?}",
                c.answered, c.requests, c.late_requests
            );
        }
        let _ = write!(s, "\n  fabric: {:?}", run.net.sim.counters());
        s
    };
    run.drive(healed + Duration::from_secs(120), true).map_err(|e| ctx(&run, format!("after the heal: {e}")))?;
    check(&run).map_err(|e| ctx(&run, e))?;
    for c in &run.conns {
        let ka = c.a_id.map(|id| run.net.nodes()[0].kinds(id)).unwrap_or_default();
        tally.resolves += 1;
        tally.established += u32::from(ka.contains(&Established));
        tally.unreachable += u32::from(ka.contains(&Unreachable));
        tally.refused += u32::from(c.answered == Some(false));
        tally.accepted_unreachable += u32::from(c.answered == Some(true) && ka.contains(&Unreachable));
        tally.late_requests += c.late_requests;
        tally.received += c.b_wcs.iter().filter(|w| w.status == WcStatus::Success).count() as u32;
    }

    // Destroy everything, as a program's exit does; nothing may be left.
    let now = run.net.now();
    for i in 0..run.conns.len() {
        if run.conns[i].a_id.is_some() && !run.conns[i].a_gone {
            run.vanish_a(i, now);
        }
        let c = &run.conns[i];
        if let Some(id) = c.b_id.filter(|_| !c.b_gone) {
            run.net.b().destroy(now, id);
        }
    }
    nothing_left(&mut run.net).map_err(|e| ctx(&run, e))
}

/// The invariants of the module documentation.
fn check(run: &Run) -> Result<(), String> {
    let [a, b] = run.net.nodes();
    let counters = b.nic.engine().counters();
    // As in swarm.rs: wrong bytes may land only through a corrupted packet that B's engine
    // took on an ICRC path that is not exact, which its counters show.
    let forged = counters.rcvd_icrc_solved + counters.rcvd_icrc_predicted > 0;
    for (i, (c, plan)) in run.conns.iter().zip(&run.plans).enumerate() {
        let Some(a_id) = c.a_id else { return Err(format!("conn {i}: never started")) };
        let ka = a.kinds(a_id);
        if ka.get(..2) != Some(&[AddrResolved, RouteResolved][..]) {
            return Err(format!("conn {i}: A's events {ka:?}"));
        }
        let rest = &ka[2..];
        let ended = matches!(rest, [Established] | [Unreachable]);
        if !(ended || (c.a_gone && rest.is_empty())) {
            return Err(format!("conn {i}: A's resolve ended {rest:?}, not with exactly one outcome"));
        }
        if c.requests > 1 {
            return Err(format!("conn {i}: {} CONNECT_REQUESTs for one resolve", c.requests));
        }
        let kb: Vec<CmEventKind> = c.b_id.map(|id| b.kinds(id)).unwrap_or_default();
        if c.b_id.is_some() && !c.b_gone && kb != [ConnectRequest] {
            return Err(format!("conn {i}: B's events {kb:?}: a SIDR service gets its request only"));
        }
        let event = a.events.iter().find(|e| e.id == a_id && matches!(e.kind, Established | Unreachable));
        match event.map(|e| (e.kind, e.status, e.ud)) {
            Some((Established, _, ud)) => {
                let ud = ud.ok_or_else(|| format!("conn {i}: ESTABLISHED without the service"))?;
                if !plan.accept || c.answered != Some(true) {
                    return Err(format!("conn {i}: established, but B's application did not accept"));
                }
                if Some(ud.remote_qpn) != c.b_qp.map(|q| q.value()) || ud.qkey != QKey::RDMA_CM_UDP.0 {
                    return Err(format!("conn {i}: established with {ud:?}, B accepted with QP {:?}", c.b_qp));
                }
            }
            Some((Unreachable, CmStatus::Sidr(SidrStatus::REJECT), _))
                if c.answered != Some(false) && c.late_requests == 0 =>
            {
                return Err(format!("conn {i}: REJECT, but B's application turned nothing down"));
            }
            _ => {}
        }
        if c.a_gone {
            continue;
        }
        // A's SENDs: once each, successfully, if it was established.
        let mut ids: Vec<u64> = c.a_wcs.iter().map(|w| w.wr_id).collect();
        ids.sort_unstable();
        let expected: &[u64] = if rest == [Established] { &[2 * i as u64, 2 * i as u64 + 1] } else { &[] };
        if ids != expected || c.a_wcs.iter().any(|w| w.status != WcStatus::Success) {
            return Err(format!("conn {i}: A's completions {:?}, expected {expected:?}", c.a_wcs));
        }
        // B's receives: each one of this resolve's SENDs, after its GRH.
        for w in c.b_wcs.iter().filter(|w| w.status == WcStatus::Success) {
            let k = w.wr_id - 100 * i as u64;
            if w.opcode != WcOpcode::Recv || w.byte_len != LEN + GRH || k > 1 {
                return Err(format!("conn {i}: B's receive {w:?}"));
            }
            let got = b.read(recv(i, k) + u64::from(GRH), LEN as usize);
            if got != payload(i, 0) && got != payload(i, 1) && !forged {
                return Err(format!("conn {i}: B's receive {k} holds bytes no SEND of this resolve sent"));
            }
        }
    }
    Ok(())
}

#[test]
fn swarm_of_seeds_resolves_agrees_and_cleans_up() {
    let mut tally = Tally::default();
    let ran = swarm(500, |seed| run(seed, &mut tally));
    assert!(ran >= 1);
    eprintln!("{ran} seeds: {tally:?}");
    if ran >= 100 {
        // The faults are drawn from the seeds: every kind of ending shows up.
        let t = &tally;
        let all = [t.established, t.unreachable, t.refused, t.received];
        assert!(all.iter().all(|&n| n > 0), "{tally:?}");
    }
}
