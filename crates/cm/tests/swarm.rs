//! Swarm simulation of rdma_cm connections and their QPs together (a `Nic` on each side):
//! for each seed, a bad network drawn from the seed (loss, duplication, reordering,
//! corruption, and sometimes a stretch in which nothing gets through), up to six
//! connections that are accepted or rejected, carry a SEND and a WRITE and are disconnected
//! from either side, both or neither, as a librdmacm program would (answering a
//! DISCONNECTED with its own `rdma_disconnect`), and now and then an application on either
//! side that destroys its ID and QP whatever their state; then the network heals, and the
//! run must converge. Checked here, outside the code under test (an application that
//! destroyed its ID is held only to what it saw before):
//!
//! - every connect ends with exactly one outcome (ESTABLISHED, REJECTED, UNREACHABLE or
//!   CONNECT_ERROR), then at most DISCONNECTED and TIMEWAIT_EXIT; every accepted request
//!   likewise (ESTABLISHED, UNREACHABLE, REJECTED, or DISCONNECTED first when a DREQ
//!   overtook the RTU), and a REQ makes one request, however often it is resent;
//! - the sides agree: the passive side is established only if the active side is; a
//!   rejected connect was rejected; an active side established alone means the passive
//!   side gave up on its REP (UNREACHABLE, as `cm.c` does) or heard the DREQ first;
//! - every WR completes exactly once; one that succeeded landed (the WRITE's bytes, the
//!   SEND's receive; the bytes themselves unless the receiver took a corrupted packet on
//!   an ICRC path that is not exact, which its counters show); on a connection established
//!   on both sides every WR succeeds unless it failed while the network was bad;
//! - after every ID and QP is destroyed, no CM ID and no QP is left, and the network
//!   goes quiet.
//!
//! `SOFTRDMA_SEEDS=20000 cargo test -p softrdma-cm --release --test swarm` runs more
//! seeds; `SOFTRDMA_SEED=0x...` replays one.

mod nic_common;

use std::fmt::Write as _;
use std::time::Duration;

use nic_common::swarm::{Run as _, bad_network, nothing_left};
use nic_common::*;
use softrdma_cm::CmEventKind::{self, *};
use softrdma_cm::CmId;
use softrdma_engine::{Instant, QpState, Wc, WcOpcode, WcStatus};
use softrdma_sim::{SimRng, swarm};
use softrdma_wire::Qpn;

/// How long the network is bad.
const FAULTY: Duration = Duration::from_millis(30);
/// A WR may still fail this long after the heal: its QP's retries (8 × 2 ms) began before.
const RETRY_BUDGET: Duration = Duration::from_millis(25);
/// Bytes of each SEND and WRITE.
const LEN: u32 = 300;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    Nobody,
    Active,
    Passive,
    Both,
}

/// What the harness's application does with one connection.
#[derive(Clone, Debug)]
struct Plan {
    accept: bool,
    start: Instant,
    disconnect: Who,
    /// The active application destroys its ID and QP at this instant, whatever their
    /// state (it exits).
    vanish: Option<Instant>,
    /// The passive application destroys the request's ID and QP at this instant (or when
    /// the request comes, if later).
    b_vanish: Option<Instant>,
}

#[derive(Default, Debug)]
struct Conn {
    a_id: Option<CmId>,
    a_qp: Option<Qpn>,
    b_id: Option<CmId>,
    b_qp: Option<Qpn>,
    requests: u32,
    data_posted: bool,
    a_disconnected: bool,
    b_disconnected: bool,
    /// The active side's ID and QP were destroyed (the plan's `vanish`).
    a_gone: bool,
    /// The passive side's ID and QP were destroyed (the plan's `b_vanish`).
    b_gone: bool,
    /// Completions with the instant they were polled.
    a_wcs: Vec<(Instant, Wc)>,
    b_wcs: Vec<(Instant, Wc)>,
}

/// Where conn `i`'s bytes go: its SEND from A at `src`, into B's receive at `recv`, its
/// WRITE from A at `src + LEN` to B's `target`.
fn src(i: usize) -> u64 {
    0x1_0000 + i as u64 * 0x1000
}
fn recv(i: usize) -> u64 {
    0x4_0000 + i as u64 * 0x1000
}
fn target(i: usize) -> u64 {
    0x8_0000 + i as u64 * 0x1000
}

/// Bytes that identify message `k` of connection `i`; never 0.
fn payload(i: usize, k: u64) -> Vec<u8> {
    nic_common::swarm::payload(i, k, LEN, 0x5a00_0000_0000_0000)
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

    /// The application's reactions to what happened since the last call, at `now`.
    fn react(&mut self) {
        let now = self.net.now();
        // Connects whose time has come.
        for (i, plan) in self.plans.iter().enumerate() {
            if plan.start <= now && self.conns[i].a_id.is_none() {
                let (id, qpn) = self.net.a().connect(now, IP_B, PORT, &[0xc0, i as u8]);
                self.conns[i].a_id = Some(id);
                self.conns[i].a_qp = Some(qpn);
            }
        }
        // Active applications that exit.
        for i in 0..self.plans.len() {
            let c = &self.conns[i];
            if self.plans[i].vanish.is_some_and(|t| t <= now) && !c.a_gone {
                if let Some(id) = c.a_id {
                    self.conns[i].a_gone = true;
                    self.net.a().destroy(now, id);
                }
            }
        }
        for i in 0..self.plans.len() {
            let c = &self.conns[i];
            if self.plans[i].b_vanish.is_some_and(|t| t <= now) && !c.b_gone {
                if let Some(id) = c.b_id {
                    self.conns[i].b_gone = true;
                    self.net.b().destroy(now, id);
                }
            }
        }
        // The passive side: requests, and DISCONNECTED answered with rdma_disconnect.
        let events: Vec<_> = self.net.b().events[self.b_seen..].to_vec();
        self.b_seen += events.len();
        for e in events {
            if e.kind == ConnectRequest {
                let i = e.private_data[1] as usize;
                let c = &mut self.conns[i];
                if c.b_gone {
                    // The REQ, repeated after the application destroyed the request's ID,
                    // is a new request (as in cm.c): the application turns it down.
                    let b = self.net.b();
                    let _ = b.nic.cm_mut().reject(now, e.id, b"gone");
                    b.drain();
                    continue;
                }
                c.requests += 1;
                if c.b_id.is_some() {
                    continue; // a second request: the checker reports it
                }
                c.b_id = Some(e.id);
                if self.plans[i].accept {
                    let b = self.net.b();
                    let qpn = b.create_qp();
                    b.nic.attach_qp(e.id, qpn).unwrap();
                    b.post_recv(qpn, i as u64, recv(i), LEN);
                    let param = softrdma_cm::ConnParam { qp_num: qpn.value(), ..Default::default() };
                    // It fails when the request was withdrawn meanwhile (a REJ from an
                    // active side that gave up): its REJECTED is among the events.
                    let _ = b.nic.accept(now, e.id, &param);
                    b.drain();
                    self.conns[i].b_qp = Some(qpn);
                } else {
                    let b = self.net.b();
                    let _ = b.nic.cm_mut().reject(now, e.id, b"no");
                    b.drain();
                }
            } else if e.kind == Disconnected {
                if let Some(i) = self.conns.iter().position(|c| c.b_id == Some(e.id)) {
                    if !std::mem::replace(&mut self.conns[i].b_disconnected, true) {
                        let _ = self.net.b().disconnect(now, e.id);
                    }
                }
            }
        }
        // The active side: data once established, DISCONNECTED answered.
        let events: Vec<_> = self.net.a().events[self.a_seen..].to_vec();
        self.a_seen += events.len();
        for e in events {
            let Some(i) = self.conns.iter().position(|c| c.a_id == Some(e.id)) else { continue };
            match e.kind {
                // Not if the application destroyed the QP meanwhile.
                Established if !self.conns[i].a_gone => {
                    let qpn = self.conns[i].a_qp.unwrap();
                    let kb = self.net.b().mr;
                    let a = self.net.a();
                    a.fill(src(i), &payload(i, 0));
                    a.fill(src(i) + u64::from(LEN), &payload(i, 1));
                    a.post_send(qpn, 2 * i as u64, src(i), LEN);
                    a.post_write(qpn, 2 * i as u64 + 1, src(i) + u64::from(LEN), LEN, &kb, target(i));
                    self.conns[i].data_posted = true;
                }
                Disconnected if !std::mem::replace(&mut self.conns[i].a_disconnected, true) => {
                    let _ = self.net.a().disconnect(now, e.id);
                }
                _ => {}
            }
        }
        // Completions.
        for wc in self.net.a().poll_cq() {
            if let Some(c) = self.conns.iter_mut().find(|c| c.a_qp == Some(wc.qp_num)) {
                c.a_wcs.push((now, wc));
            }
        }
        for wc in self.net.b().poll_cq() {
            if let Some(c) = self.conns.iter_mut().find(|c| c.b_qp == Some(wc.qp_num)) {
                c.b_wcs.push((now, wc));
            }
        }
        // Planned disconnects, once the data is done.
        for i in 0..self.conns.len() {
            let c = &self.conns[i];
            let (Some(a_id), who) = (c.a_id, self.plans[i].disconnect) else { continue };
            if !c.data_posted || c.a_wcs.len() < 2 || c.a_gone || c.b_gone {
                continue;
            }
            let b_established = c.b_id.is_some_and(|b| {
                let k = self.net.nodes()[1].kinds(b);
                k.contains(&Established) && !k.contains(&Disconnected)
            });
            if matches!(who, Who::Active | Who::Both) && !c.a_disconnected {
                self.conns[i].a_disconnected = true;
                let _ = self.net.a().disconnect(now, a_id);
            }
            let c = &self.conns[i];
            if matches!(who, Who::Passive | Who::Both) && !c.b_disconnected && b_established {
                let b_id = c.b_id.unwrap();
                self.conns[i].b_disconnected = true;
                let _ = self.net.b().disconnect(now, b_id);
            }
        }
        // What the reactions queued goes in flight now.
        self.net.sim.run_until(now).unwrap();
    }
}

fn pick<T: Copy>(rng: &mut SimRng, items: &[T]) -> T {
    items[rng.below(items.len() as u64) as usize]
}

/// What the runs did, to show the swarm explores.
#[derive(Default, Debug)]
struct Tally {
    connects: u32,
    established_both: u32,
    half_open: u32,
    rejected: u32,
    unreachable: u32,
    data_ok: u32,
    data_failed: u32,
    disconnected_both: u32,
}

fn run(seed: u64, tally: &mut Tally) -> Result<(), String> {
    let mut rng = SimRng::with_stream(seed, 7);
    let mut net = Net::new(seed);
    let (faults, rules) = bad_network(&mut net, seed, &mut rng, FAULTY);
    net.b().listen(PORT);
    let n = 1 + rng.below(6) as usize;
    let plans: Vec<Plan> = (0..n)
        .map(|_| {
            let start = Instant::ZERO + Duration::from_micros(rng.below(10_000));
            Plan {
                accept: !rng.chance(0.25),
                start,
                disconnect: pick(&mut rng, &[Who::Nobody, Who::Active, Who::Passive, Who::Both]),
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
            let wa: Vec<_> = c.a_wcs.iter().map(|(t, w)| (t.as_nanos() / 1000, w.wr_id, w.status)).collect();
            let _ = write!(s, "\n  conn {i}: a {ka:?} b {kb:?} requests {} a_wcs(us) {wa:?}", c.requests);
        }
        let [a, b] = run.net.nodes();
        let _ = write!(s, "\n  a: {:?}\n  b: {:?}", a.nic.engine().counters(), b.nic.engine().counters());
        let _ = write!(s, "\n  fabric: {:?}", run.net.sim.counters());
        s
    };
    run.drive(healed + Duration::from_secs(120), true).map_err(|e| ctx(&run, format!("after the heal: {e}")))?;
    check(&run, healed).map_err(|e| ctx(&run, e))?;
    for c in &run.conns {
        let [a, b] = run.net.nodes();
        let ka = c.a_id.map(|id| a.kinds(id)).unwrap_or_default();
        let kb = c.b_id.map(|id| b.kinds(id)).unwrap_or_default();
        tally.connects += 1;
        match (ka.contains(&Established), kb.contains(&Established)) {
            (true, true) => tally.established_both += 1,
            (true, false) => tally.half_open += 1,
            _ => {}
        }
        tally.rejected += u32::from(ka.contains(&Rejected));
        tally.unreachable += u32::from(ka.contains(&Unreachable) || kb.contains(&Unreachable));
        tally.disconnected_both += u32::from(ka.contains(&Disconnected) && kb.contains(&Disconnected));
        for (_, w) in &c.a_wcs {
            if w.status == WcStatus::Success {
                tally.data_ok += 1;
            } else {
                tally.data_failed += 1;
            }
        }
    }

    // Destroy everything, as a program's exit does; nothing may be left.
    let now = run.net.now();
    for c in &run.conns {
        if let Some(id) = c.a_id.filter(|_| !c.a_gone) {
            run.net.a().destroy(now, id);
        }
        if let Some(id) = c.b_id.filter(|_| !c.b_gone) {
            run.net.b().destroy(now, id);
        }
    }
    nothing_left(&mut run.net).map_err(|e| ctx(&run, e))
}

/// The invariants of the module documentation.
fn check(run: &Run, healed: Instant) -> Result<(), String> {
    let [a, b] = run.net.nodes();
    // The one way wrong bytes may land: the fabric corrupted a packet and B's engine took
    // it on a path that is not exact (engine/src/identification.rs: 2^-16 before B heard
    // A's first exact packet, about 2^-26 after). Every honest packet here is exact, so
    // the counters show it.
    let counters = b.nic.engine().counters();
    let forged = counters.rcvd_icrc_solved + counters.rcvd_icrc_predicted > 0;
    let outcome = |k: &CmEventKind| matches!(k, Established | Rejected | Unreachable | ConnectError);
    for (i, (c, plan)) in run.conns.iter().zip(&run.plans).enumerate() {
        let Some(a_id) = c.a_id else { return Err(format!("conn {i}: never started")) };
        let ka = a.kinds(a_id);
        if ka.get(..2) != Some(&[AddrResolved, RouteResolved][..]) {
            return Err(format!("conn {i}: A's events {ka:?}"));
        }
        let rest = &ka[2..];
        let outcomes: Vec<_> = rest.iter().filter(|k| outcome(k)).collect();
        let a_est = rest.first() == Some(&Established);
        // A REJ may end a connection A had established: from a B that gave up on it before
        // its own side was (cm.c takes it, cma.c reports REJECTED after ESTABLISHED).
        let rejected_after = a_est && rest.get(1) == Some(&Rejected);
        // An application that exited may have had no outcome yet.
        let gone = c.a_gone;
        let expected = 1 + usize::from(rejected_after);
        if outcomes.len() > expected
            || (!gone && outcomes.len() != expected)
            || rest.first().is_some_and(|k| !outcome(k))
        {
            return Err(format!("conn {i}: A's connect ended {rest:?}, not with exactly one outcome"));
        }
        if rest.len() > 1
            && (!a_est || !matches!(&rest[1..], [Disconnected] | [Disconnected, TimewaitExit] | [Rejected]))
        {
            return Err(format!("conn {i}: A's events after its outcome: {rest:?}"));
        }
        // librdmacm's QP transitions, done by the NIC.
        let a_state = c.a_qp.and_then(|q| a.qp_state(q));
        if !gone && rest.iter().any(|k| matches!(k, Disconnected | Rejected)) && a_state != Some(QpState::Err) {
            return Err(format!("conn {i}: A's QP in {a_state:?} after {rest:?}"));
        }
        if c.requests > 1 {
            return Err(format!("conn {i}: {} CONNECT_REQUESTs for one connect", c.requests));
        }
        let kb = c.b_id.map(|id| b.kinds(id)).unwrap_or_default();
        let b_est = kb.contains(&Established);
        if rejected_after && b_est {
            return Err(format!("conn {i}: A rejected after establishing, B established: A {ka:?} B {kb:?}"));
        }
        let b_state = c.b_qp.and_then(|q| b.qp_state(q));
        if !c.b_gone && kb.contains(&Disconnected) && b_state != Some(QpState::Err) {
            return Err(format!("conn {i}: B's QP in {b_state:?} after {kb:?}"));
        }
        if gone {
            // Only the passive side is left to check: one outcome, and established only if
            // the active side was.
            let n = kb.iter().filter(|k| matches!(k, Established | Rejected | Unreachable)).count();
            if n > 1 || (b_est && !a_est) || (plan.accept && c.b_id.is_some() && !c.b_gone && kb.len() < 2) {
                return Err(format!("conn {i}: the active side exited; A {ka:?} B {kb:?}"));
            }
            continue;
        }
        if c.b_gone {
            // The active side had its one outcome (checked above); what it sent completed
            // once each, and established on B means established on A.
            let mut ids: Vec<u64> = c.a_wcs.iter().map(|(_, w)| w.wr_id).collect();
            ids.sort_unstable();
            if (b_est && !a_est) || (c.data_posted && ids != [2 * i as u64, 2 * i as u64 + 1]) {
                return Err(format!("conn {i}: the passive side exited; A {ka:?} B {kb:?} A's WRs {ids:?}"));
            }
            continue;
        }
        if !plan.accept {
            if a_est || b_est {
                return Err(format!("conn {i}: rejected, yet established: A {ka:?} B {kb:?}"));
            }
            if !matches!(rest[0], Rejected | Unreachable) {
                return Err(format!("conn {i}: rejected, A reports {:?}", rest[0]));
            }
        } else if c.b_id.is_some() {
            // Accepted: one outcome (DISCONNECTED first if a DREQ overtook the RTU).
            let first = kb.iter().skip(1).find(|k| matches!(k, Established | Rejected | Unreachable | Disconnected));
            let n = kb.iter().filter(|k| matches!(k, Established | Rejected | Unreachable)).count();
            if first.is_none() || n > 1 || (first == Some(&Disconnected) && n > 0) {
                return Err(format!("conn {i}: B's request ended {kb:?}"));
            }
            if rest[0] == Rejected {
                return Err(format!("conn {i}: accepted, yet A was rejected"));
            }
        } else if a_est {
            return Err(format!("conn {i}: A established, B never heard a request"));
        }
        if b_est && !a_est {
            return Err(format!("conn {i}: B established, A not: A {ka:?} B {kb:?}"));
        }
        if a_est && !b_est && !kb.iter().any(|k| matches!(k, Unreachable | Disconnected)) {
            return Err(format!("conn {i}: A established, B neither established nor gave up: {kb:?}"));
        }
        // The data.
        if !a_est {
            if c.data_posted || !c.a_wcs.is_empty() {
                return Err(format!("conn {i}: data on a connection never established"));
            }
            continue;
        }
        let mut ids: Vec<u64> = c.a_wcs.iter().map(|(_, w)| w.wr_id).collect();
        ids.sort_unstable();
        if ids != [2 * i as u64, 2 * i as u64 + 1] {
            return Err(format!("conn {i}: A's completions {ids:?}, one each of the SEND and the WRITE expected"));
        }
        for (at, w) in &c.a_wcs {
            let ok = w.status == WcStatus::Success;
            let late = *at > healed + RETRY_BUDGET;
            if !ok && b_est && late {
                return Err(format!("conn {i}: WR {} failed {:?} at {at:?}, long after the heal", w.wr_id, w.status));
            }
            if !matches!(w.status, WcStatus::Success | WcStatus::RetryExcErr | WcStatus::WrFlushErr) {
                return Err(format!("conn {i}: WR {} completed {:?}", w.wr_id, w.status));
            }
            if ok && w.wr_id % 2 == 1 && b.read(target(i), LEN as usize) != payload(i, 1) && !forged {
                return Err(format!("conn {i}: the WRITE succeeded but its bytes are not there"));
            }
            if ok && w.wr_id % 2 == 0 {
                let r = c.b_wcs.iter().find(|(_, r)| r.wr_id == i as u64 && r.opcode == WcOpcode::Recv);
                match r {
                    Some((_, r)) if r.status == WcStatus::Success && r.byte_len == LEN => {}
                    other => return Err(format!("conn {i}: the SEND succeeded, its receive: {other:?}")),
                }
                if b.read(recv(i), LEN as usize) != payload(i, 0) && !forged {
                    return Err(format!("conn {i}: the SEND succeeded but its bytes are not there"));
                }
            }
        }
        if c.b_wcs.iter().filter(|(_, r)| r.status == WcStatus::Success).count() > 1 {
            return Err(format!("conn {i}: B's receive completed more than once: {:?}", c.b_wcs));
        }
    }
    Ok(())
}

#[test]
fn swarm_of_seeds_connects_agrees_and_cleans_up() {
    let mut tally = Tally::default();
    let ran = swarm(500, |seed| run(seed, &mut tally));
    assert!(ran >= 1);
    eprintln!("{ran} seeds: {tally:?}");
    if ran >= 100 {
        // The faults are drawn from the seeds: every kind of ending shows up.
        let t = &tally;
        let all = [t.established_both, t.rejected, t.unreachable, t.data_ok, t.disconnected_both];
        assert!(all.iter().all(|&n| n > 0), "{tally:?}");
    }
}
