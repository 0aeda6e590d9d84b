//! Fault injection in the live runtime: `SOFTRDMA_FAULTS="loss 5%; reorder 10% 200us"` (or
//! [`ContextOptions::faults`](crate::ContextOptions::faults)) makes a device receive as if
//! the network between it and its peers lost, duplicated, reordered, corrupted, delayed,
//! rate-limited or partitioned its packets, for any program, C ones through the drop-in
//! libraries included, without root and without `tc`.
//!
//! The rules are the simulator's ([`softrdma_sim::FaultSpec`] parses the words into
//! [`softrdma_sim::Rule`]s, [`softrdma_sim::Chain`] asks them): one implementation, the
//! same vocabulary in a swarm test and on a live run.
//!
//! # Where
//!
//! On **receive**: every datagram a device takes from its sockets, multicast groups or
//! same-host inbox is judged before the NIC sees it. A dropped one never reaches the
//! engine; a corrupted one fails its ICRC there, as a real NIC's would (one from the
//! same-host inbox, which is taken without an ICRC check, is dropped here instead); a delayed one waits
//! here and is handed over when due (the progress thread wakes for it). Judging the
//! receive side makes every rule's scope mean what a user asks of it: `qp 0x2001` is every
//! packet that QP gets (requests as a responder, ACKs and READ responses as a requester),
//! `from 10.0.0.2` is one peer's traffic, and a process run with the variable sees faults
//! both ways even when its peer runs without it (its requests are lost on the peer's side
//! as its ACKs: the peer's answers never come). Packets a device sends are untouched, and
//! the capture (`SOFTRDMA_PCAP`) shows what arrived, after the faults.
//!
//! # Repeating a run
//!
//! Every decision comes from the spec's seed (one the device draws when the spec names
//! none), device `n` of the process (in the order they were opened) drawing from streams
//! of its own. The device prints the spec with its seed on stderr when it opens, so that a
//! failing run can be repeated with the same decisions for the same packets; the timing of
//! a live run is not repeatable, so neither are the packets that arrive.

use crate::driver::Arrival;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};

use softrdma_engine::{Instant, IpInfo};
use softrdma_sim::{Chain, Datagram, FaultSpec, Rule};
use softrdma_wire::Envelope;

use crate::Error;

/// The environment variable holding a fault specification (the syntax is
/// [`softrdma_sim::FaultSpec`]'s: `loss 5%; reorder 10% 200us; seed 42`). It replaces
/// [`ContextOptions::faults`](crate::ContextOptions::faults) for every device the process
/// opens.
pub const FAULTS_ENV: &str = "SOFTRDMA_FAULTS";

/// Most datagrams held back at once: beyond, a delayed one is dropped (and counted), as a
/// full router queue drops it, so that a long delay at a high rate cannot take the memory.
const MAX_HELD: usize = 16_384;

/// Devices opened with faults so far in this process.
static DEVICES: AtomicU64 = AtomicU64::new(0);

/// The number of the next device opened with faults in this process (0, 1, ...): device
/// `n` draws from streams `n << 32 ..` of the seed.
pub(crate) fn next_device() -> u64 {
    DEVICES.fetch_add(1, Ordering::Relaxed)
}

/// What injected faults did to a device's received datagrams.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct FaultCounters {
    /// Datagrams dropped by a rule (including delayed ones with no room to wait).
    pub dropped: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Datagrams held back (delay, reorder, rate limit).
    pub delayed: u64,
    /// Datagrams with a byte corrupted.
    pub corrupted: u64,
}

/// The spec a device runs: the environment's, else `option`'s; `None` for none (or an
/// empty one). A spec without a seed gets a random one.
pub(crate) fn spec(option: Option<&FaultSpec>) -> Result<Option<FaultSpec>, Error> {
    let spec = match std::env::var(FAULTS_ENV) {
        Ok(text) => Some(text.parse::<FaultSpec>().map_err(|e| {
            Error::io(
                format!("reading {FAULTS_ENV}={text:?}"),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            )
        })?),
        Err(_) => option.cloned(),
    };
    let Some(spec) = spec.filter(|s| !s.is_empty()) else { return Ok(None) };
    if spec.seed().is_some() {
        return Ok(Some(spec));
    }
    let mut seed = [0u8; 8];
    getrandom::fill(&mut seed).map_err(|e| Error::io("seeding the fault rules", std::io::Error::other(e)))?;
    Ok(Some(spec.with_seed(u64::from_ne_bytes(seed) >> 16)))
}

/// A datagram held back until `at`.
struct Held {
    at: Instant,
    seq: u64,
    envelope: Envelope,
    ip: IpInfo,
    arrival: Arrival,
    bytes: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A device's fault rules and the datagrams they hold back.
pub(crate) struct Faults {
    spec: FaultSpec,
    chain: Chain<dyn Rule + Send>,
    /// The datagram being judged: its buffer is reused.
    judged: Datagram,
    held: BinaryHeap<Reverse<Held>>,
    seq: u64,
    counters: FaultCounters,
}

impl Faults {
    /// The rules of `spec` (which has a seed: [`spec`]) for device `device` of the process
    /// ([`next_device`]).
    pub(crate) fn new(spec: FaultSpec, device: u64) -> Faults {
        let seed = spec.seed().unwrap_or_default();
        let mut chain = Chain::new(seed, (device << 32) + 1);
        for rule in spec.rules() {
            chain.push(rule.rule());
        }
        let judged = Datagram::new(Envelope::rocev2([0; 4].into(), 0, [0; 4].into()).expect("IPv4"), Vec::new());
        Faults { spec, chain, judged, held: BinaryHeap::new(), seq: 0, counters: FaultCounters::default() }
    }

    /// The spec, with its seed.
    pub(crate) fn spec(&self) -> &FaultSpec {
        &self.spec
    }

    pub(crate) fn counters(&self) -> FaultCounters {
        self.counters
    }

    /// Judges a received datagram: hands it to `deliver` now (once per copy, corrupted as
    /// decided), later ([`release`](Self::release)), or never, each with its `arrival`,
    /// which says whether the receiver checks its ICRC, as for what the sockets bring
    /// (same-host packets are taken unchecked, and may carry none): a corrupted one that
    /// would not be checked is dropped here, where the check would have dropped it.
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        ip: IpInfo,
        datagram: &[u8],
        arrival: Arrival,
        mut deliver: impl FnMut(&Envelope, IpInfo, &[u8], Arrival),
    ) {
        self.judged.refill(*envelope, datagram, now);
        let plan = match self.chain.judge(&self.judged) {
            Ok(plan) => plan,
            Err(rule) => {
                self.counters.dropped += 1;
                tracing::trace!(target: "softrdma::faults", rule, qp = ?self.judged.dest_qp(), psn = ?self.judged.psn(), "dropped");
                return;
            }
        };
        if plan.copies == 1 && plan.delay.is_zero() && plan.corruptions.is_empty() {
            deliver(envelope, ip, datagram, arrival);
            return;
        }
        let mut bytes = datagram.to_vec();
        if !plan.corruptions.is_empty() {
            self.counters.corrupted += 1;
            if !arrival.icrc_checked() {
                self.counters.dropped += 1;
                return;
            }
            plan.corrupt(&mut bytes);
        }
        self.counters.duplicated += plan.copies as u64 - 1;
        if plan.delay.is_zero() {
            for _ in 0..plan.copies {
                deliver(envelope, ip, &bytes, arrival);
            }
            return;
        }
        self.counters.delayed += 1;
        let at = now.saturating_add(plan.delay);
        for _ in 0..plan.copies {
            if self.held.len() >= MAX_HELD {
                self.counters.dropped += 1;
                continue;
            }
            self.seq += 1;
            let held = Held { at, seq: self.seq, envelope: *envelope, ip, arrival, bytes: bytes.clone() };
            self.held.push(Reverse(held));
        }
    }

    /// Hands every held datagram that is due by `now` to `deliver`, in the order they are
    /// due; whether there was one.
    pub(crate) fn release(&mut self, now: Instant, mut deliver: impl FnMut(&Envelope, IpInfo, &[u8], Arrival)) -> bool {
        let mut any = false;
        while self.held.peek().is_some_and(|h| h.0.at <= now) {
            let Reverse(h) = self.held.pop().expect("peeked");
            deliver(&h.envelope, h.ip, &h.bytes, h.arrival);
            any = true;
        }
        any
    }

    /// When the next held datagram is due.
    pub(crate) fn next_release(&self) -> Option<Instant> {
        self.held.peek().map(|h| h.0.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn packet(qpn: u8) -> Vec<u8> {
        let mut bth = vec![0u8; 40];
        bth[0] = 0x04; // RC SEND_ONLY
        bth[7] = qpn;
        bth
    }

    fn run(spec: &str, n: usize) -> (Faults, Vec<(u64, Vec<u8>)>) {
        let mut f = Faults::new(spec.parse().unwrap(), 0);
        let e = Envelope::rocev2([127, 0, 0, 1].into(), 0xc000, [127, 0, 0, 1].into()).unwrap();
        let mut got = Vec::new();
        // One datagram a microsecond, then 100 us more to let the held ones out.
        for i in 0..n + 100 {
            let now = Instant::from_micros(i as u64);
            if i < n {
                let mut p = packet(0x11);
                p[39] = i as u8;
                f.admit(now, &e, IpInfo::default(), &p, Arrival::Socket, |_, _, d, _| {
                    got.push((now.as_nanos(), d.to_vec()))
                });
            }
            f.release(now, |_, _, d, _| got.push((now.as_nanos(), d.to_vec())));
        }
        (f, got)
    }

    #[test]
    fn loss_drops_what_it_counts_and_nothing_else() {
        let (f, got) = run("loss 20%; seed 1", 1000);
        let c = f.counters();
        assert_eq!(got.len() as u64 + c.dropped, 1000);
        assert!((150..250).contains(&c.dropped), "{c:?}");
        assert_eq!((c.duplicated, c.delayed, c.corrupted), (0, 0, 0));
    }

    #[test]
    fn delayed_datagrams_come_out_when_due_and_reordered() {
        let (f, got) = run("reorder 50% 20us; duplicate 10%; corrupt 10%; seed 2", 200);
        let c = f.counters();
        assert_eq!(got.len() as u64, 200 + c.duplicated);
        assert!(c.delayed > 50 && c.corrupted > 5, "{c:?}");
        let order: Vec<u8> = got.iter().map(|(_, d)| d[39]).collect();
        assert!(order.windows(2).any(|w| w[0] > w[1]), "some overtaken");
        assert!(got.iter().all(|(at, _)| *at <= Duration::from_micros(220).as_nanos() as u64), "released when due");
        assert!(f.next_release().is_none());
    }

    #[test]
    fn a_scope_limits_the_rule_to_its_qp() {
        let mut f = Faults::new("loss 100% qp 0x12; seed 3".parse().unwrap(), 0);
        let e = Envelope::rocev2([127, 0, 0, 1].into(), 0xc000, [127, 0, 0, 1].into()).unwrap();
        let mut n = 0;
        for qpn in [0x11, 0x12, 0x11] {
            f.admit(Instant::from_nanos(0), &e, IpInfo::default(), &packet(qpn), Arrival::Socket, |_, _, _, _| n += 1);
        }
        assert_eq!((n, f.counters().dropped), (2, 1));
    }

    #[test]
    fn the_same_seed_makes_the_same_decisions() {
        let (_, a) = run("loss 30%; reorder 30% 10us; seed 9", 300);
        let (_, b) = run("loss 30%; reorder 30% 10us; seed 9", 300);
        let (_, c) = run("loss 30%; reorder 30% 10us; seed 10", 300);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
