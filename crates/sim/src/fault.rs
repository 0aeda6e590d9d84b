//! Fault injection: a chain of rules, each giving a [`Verdict`] on every datagram that enters
//! the network (turmoil's shape; smoltcp's `FaultInjector` for the kinds of fault).
//!
//! The fabric asks every rule, in the order they were added, about each datagram a node
//! sends, and combines the answers:
//!
//! - [`Verdict::Deliver`]: no opinion; the next rule is asked.
//! - [`Verdict::Drop`]: the datagram is lost; no later rule is asked. The drop is counted
//!   under the rule's [`name`](Rule::name).
//! - [`Verdict::Duplicate`]: one more copy is delivered (at most [`MAX_COPIES`] in all).
//! - [`Verdict::Delay`]: the datagram arrives that much later (delays add up). A random
//!   delay is how packets get reordered.
//! - [`Verdict::Corrupt`]: one byte of the UDP payload is XORed with a mask on the way.
//!
//! Every rule sees the datagram as it was sent: corruption is applied after the whole chain
//! has spoken, and to every copy. Rules with randomness draw from their own stream of the
//! fabric's seed ([`SimRng`]), so a run is a function of the seed and the rules alone.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use softrdma_wire::{BthPacket, Envelope, Opcode, Psn, Qpn, RocePacket};

use crate::fabric::NodeId;
use crate::rng::SimRng;
use crate::time::Time;

/// Most copies of one datagram the fabric delivers, however many rules say
/// [`Verdict::Duplicate`].
pub const MAX_COPIES: usize = 4;

/// A datagram in the network, as fault rules see it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Datagram {
    pub(crate) id: u64,
    pub(crate) sent_at: Time,
    pub(crate) src_node: Option<NodeId>,
    pub(crate) envelope: Envelope,
    pub(crate) payload: Vec<u8>,
    /// A switch port marked it Congestion Experienced.
    pub(crate) ce: bool,
}

impl Datagram {
    /// A datagram outside any fabric (id 0, sent at [`Time::ZERO`] by no node), for testing
    /// a rule on its own.
    pub fn new(envelope: Envelope, payload: Vec<u8>) -> Self {
        Self { id: 0, sent_at: Time::ZERO, src_node: None, envelope, payload, ce: false }
    }

    /// Its number: datagrams are numbered from 0 in the order they entered the network.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// When it entered the network.
    pub fn sent_at(&self) -> Time {
        self.sent_at
    }

    /// The node that sent it, `None` for one [injected](crate::Fabric::inject) by the test.
    pub fn src_node(&self) -> Option<NodeId> {
        self.src_node
    }

    /// Its IP and UDP fields.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Its UDP payload (for RoCEv2: BTH through ICRC).
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Source IP address.
    pub fn src(&self) -> IpAddr {
        self.envelope.src_ip()
    }

    /// Destination IP address.
    pub fn dst(&self) -> IpAddr {
        self.envelope.dst_ip()
    }

    /// The payload as a RoCE packet, if it is long enough for the headers its opcode
    /// announces ([`RocePacket::new_checked`]). The ICRC is not checked.
    pub fn roce(&self) -> Option<RocePacket<&[u8]>> {
        RocePacket::new_checked(&self.payload[..]).ok()
    }

    /// The BTH, if the payload is at least 12 bytes long.
    pub fn bth(&self) -> Option<BthPacket<&[u8]>> {
        BthPacket::new_checked(&self.payload[..]).ok()
    }

    /// The BTH opcode, for rules that target one kind of packet ("drop the first READ
    /// response").
    pub fn opcode(&self) -> Option<Opcode> {
        self.bth().map(|b| b.opcode())
    }

    /// The BTH packet sequence number.
    pub fn psn(&self) -> Option<Psn> {
        self.bth().map(|b| b.psn())
    }

    /// The BTH destination QP.
    pub fn dest_qp(&self) -> Option<Qpn> {
        self.bth().map(|b| b.dest_qp())
    }
}

/// What one rule says about one datagram.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Verdict {
    /// Let it through unchanged, as far as this rule is concerned.
    Deliver,
    /// Lose it.
    Drop,
    /// Deliver one more copy.
    Duplicate,
    /// Deliver it this much later than the link would.
    Delay(Duration),
    /// XOR byte `index` of the UDP payload with `xor`. An index past the end, or a zero mask,
    /// changes nothing and is not counted.
    Corrupt {
        /// Offset in the UDP payload.
        index: usize,
        /// Bits to flip.
        xor: u8,
    },
}

/// A fault rule: looks at each datagram entering the network and says what happens to it.
///
/// Any `FnMut(&Datagram) -> Verdict` closure is a rule (named `"custom"`; rename it with
/// [`RuleExt::named`]).
pub trait Rule {
    /// The verdict on `datagram`. `rng` is this rule's own stream of the fabric's seed.
    fn verdict(&mut self, datagram: &Datagram, rng: &mut SimRng) -> Verdict;

    /// The name drops are counted under ([`DropReason::Rule`](crate::DropReason::Rule)).
    fn name(&self) -> &'static str {
        "custom"
    }
}

impl<F: FnMut(&Datagram) -> Verdict> Rule for F {
    fn verdict(&mut self, datagram: &Datagram, _rng: &mut SimRng) -> Verdict {
        self(datagram)
    }
}

/// Combinators on every rule.
pub trait RuleExt: Rule + Sized {
    /// This rule, asked only about datagrams that `scope` matches; others are delivered.
    fn scoped(self, scope: Scope) -> Scoped<Self> {
        Scoped { scope, rule: self }
    }

    /// This rule, counting its drops under `name`.
    fn named(self, name: &'static str) -> Named<Self> {
        Named { name, rule: self }
    }
}

impl<R: Rule> RuleExt for R {}

/// Which datagrams a rule applies to, by source and destination address.
///
/// ```
/// # use softrdma_sim::Scope;
/// let a = "10.0.0.1".parse().unwrap();
/// let b = "10.0.0.2".parse().unwrap();
/// let a_to_b = Scope::all().src([a]).dst([b]);
/// assert!(a_to_b.matches(a, b) && !a_to_b.matches(b, a));
/// assert!(a_to_b.both_ways().matches(b, a));
/// ```
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Scope {
    src: Option<BTreeSet<IpAddr>>,
    dst: Option<BTreeSet<IpAddr>>,
    both_ways: bool,
}

impl Scope {
    /// Every datagram.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only datagrams from one of `addrs`.
    #[must_use]
    pub fn src(mut self, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.src = Some(addrs.into_iter().collect());
        self
    }

    /// Only datagrams to one of `addrs`.
    #[must_use]
    pub fn dst(mut self, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.dst = Some(addrs.into_iter().collect());
        self
    }

    /// Also the reverse direction: from a destination address to a source address.
    #[must_use]
    pub fn both_ways(mut self) -> Self {
        self.both_ways = true;
        self
    }

    /// Whether a datagram from `src` to `dst` is in scope.
    pub fn matches(&self, src: IpAddr, dst: IpAddr) -> bool {
        let within = |set: &Option<BTreeSet<IpAddr>>, ip: IpAddr| set.as_ref().is_none_or(|s| s.contains(&ip));
        (within(&self.src, src) && within(&self.dst, dst))
            || (self.both_ways && within(&self.src, dst) && within(&self.dst, src))
    }
}

/// A rule restricted to a [`Scope`]; see [`RuleExt::scoped`].
#[derive(Clone, Debug)]
pub struct Scoped<R> {
    scope: Scope,
    rule: R,
}

impl<R: Rule> Rule for Scoped<R> {
    fn verdict(&mut self, datagram: &Datagram, rng: &mut SimRng) -> Verdict {
        if self.scope.matches(datagram.src(), datagram.dst()) {
            self.rule.verdict(datagram, rng)
        } else {
            Verdict::Deliver
        }
    }

    fn name(&self) -> &'static str {
        self.rule.name()
    }
}

/// A rule with another name; see [`RuleExt::named`].
#[derive(Clone, Debug)]
pub struct Named<R> {
    name: &'static str,
    rule: R,
}

impl<R: Rule> Rule for Named<R> {
    fn verdict(&mut self, datagram: &Datagram, rng: &mut SimRng) -> Verdict {
        self.rule.verdict(datagram, rng)
    }

    fn name(&self) -> &'static str {
        self.name
    }
}

fn check_probability(p: f64) -> f64 {
    assert!((0.0..=1.0).contains(&p), "a probability is within [0, 1], got {p}");
    p
}

/// Drops each datagram with probability `p` (named `"loss"`).
#[derive(Clone, Debug)]
pub struct Loss {
    p: f64,
}

impl Loss {
    /// Loss with probability `p`; panics unless `0 <= p <= 1`.
    pub fn new(p: f64) -> Self {
        Self { p: check_probability(p) }
    }
}

impl Rule for Loss {
    fn verdict(&mut self, _: &Datagram, rng: &mut SimRng) -> Verdict {
        if rng.chance(self.p) { Verdict::Drop } else { Verdict::Deliver }
    }

    fn name(&self) -> &'static str {
        "loss"
    }
}

/// Delivers each datagram twice with probability `p`.
#[derive(Clone, Debug)]
pub struct Duplicate {
    p: f64,
}

impl Duplicate {
    /// Duplication with probability `p`; panics unless `0 <= p <= 1`.
    pub fn new(p: f64) -> Self {
        Self { p: check_probability(p) }
    }
}

impl Rule for Duplicate {
    fn verdict(&mut self, _: &Datagram, rng: &mut SimRng) -> Verdict {
        if rng.chance(self.p) { Verdict::Duplicate } else { Verdict::Deliver }
    }

    fn name(&self) -> &'static str {
        "duplicate"
    }
}

/// With probability `p`, holds a datagram back by a uniformly random extra delay in
/// `[0, max_delay]`, so that later datagrams overtake it.
#[derive(Clone, Debug)]
pub struct Reorder {
    p: f64,
    max_delay: Duration,
}

impl Reorder {
    /// Reordering with probability `p`, by up to `max_delay`; panics unless `0 <= p <= 1`.
    pub fn new(p: f64, max_delay: Duration) -> Self {
        Self { p: check_probability(p), max_delay }
    }
}

impl Rule for Reorder {
    fn verdict(&mut self, _: &Datagram, rng: &mut SimRng) -> Verdict {
        if rng.chance(self.p) { Verdict::Delay(rng.duration_up_to(self.max_delay)) } else { Verdict::Deliver }
    }

    fn name(&self) -> &'static str {
        "reorder"
    }
}

/// With probability `p`, flips a random non-empty set of bits in one uniformly random byte of
/// the UDP payload.
///
/// Any byte may be hit, so a receiver's ICRC check catches all of them but one: BTH byte 4
/// (FECN, BECN, reserved) is variant, outside the ICRC, exactly as a router's ECN mark is.
#[derive(Clone, Debug)]
pub struct Corrupt {
    p: f64,
}

impl Corrupt {
    /// Corruption with probability `p`; panics unless `0 <= p <= 1`.
    pub fn new(p: f64) -> Self {
        Self { p: check_probability(p) }
    }
}

impl Rule for Corrupt {
    fn verdict(&mut self, datagram: &Datagram, rng: &mut SimRng) -> Verdict {
        if !rng.chance(self.p) || datagram.payload.is_empty() {
            return Verdict::Deliver;
        }
        let index = rng.below(datagram.payload.len() as u64) as usize;
        let xor = 1 + rng.below(255) as u8;
        Verdict::Corrupt { index, xor }
    }

    fn name(&self) -> &'static str {
        "corrupt"
    }
}

/// Drops everything between two sets of addresses, both ways (named `"partition"`). Traffic
/// within each side flows. Add it with [`Fabric::partition`](crate::Fabric::partition) and
/// remove it with [`Fabric::heal`](crate::Fabric::heal).
#[derive(Clone, Debug)]
pub struct Partition {
    scope: Scope,
}

impl Partition {
    /// A partition between `a` and `b`.
    pub fn new(a: impl IntoIterator<Item = IpAddr>, b: impl IntoIterator<Item = IpAddr>) -> Self {
        Self { scope: Scope::all().src(a).dst(b).both_ways() }
    }
}

impl Rule for Partition {
    fn verdict(&mut self, datagram: &Datagram, _: &mut SimRng) -> Verdict {
        if self.scope.matches(datagram.src(), datagram.dst()) { Verdict::Drop } else { Verdict::Deliver }
    }

    fn name(&self) -> &'static str {
        "partition"
    }
}

/// Gives `verdict` to datagrams that `predicate` picks, the first `n` of them or all
/// (named `"match"`).
///
/// ```
/// # use softrdma_sim::{Match, Verdict};
/// # use softrdma_wire::Opcode;
/// // Lose the first READ response, whatever else happens.
/// let rule = Match::new(|d| d.opcode() == Some(Opcode::RC_RDMA_READ_RESPONSE_ONLY), Verdict::Drop).times(1);
/// ```
pub struct Match<P> {
    predicate: P,
    verdict: Verdict,
    remaining: Option<u64>,
}

impl<P: FnMut(&Datagram) -> bool> Match<P> {
    /// `verdict` for every datagram `predicate` picks.
    pub fn new(predicate: P, verdict: Verdict) -> Self {
        Self { predicate, verdict, remaining: None }
    }

    /// Only for the first `n` picked; after that the rule delivers everything.
    #[must_use]
    pub fn times(mut self, n: u64) -> Self {
        self.remaining = Some(n);
        self
    }
}

impl<P: FnMut(&Datagram) -> bool> Rule for Match<P> {
    fn verdict(&mut self, datagram: &Datagram, _: &mut SimRng) -> Verdict {
        if self.remaining == Some(0) || !(self.predicate)(datagram) {
            return Verdict::Deliver;
        }
        if let Some(n) = &mut self.remaining {
            *n -= 1;
        }
        self.verdict
    }

    fn name(&self) -> &'static str {
        "match"
    }
}

/// The fault parameters of one run, for swarm testing: [`random`](Self::random) draws them
/// from the seed, so that each seed explores a different kind of bad network.
#[derive(Clone, Copy, PartialEq, Debug, Default)]
pub struct FaultConfig {
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Probability that a datagram is delivered twice.
    pub duplicate: f64,
    /// Probability that a datagram is held back by up to `reorder_delay_max`.
    pub reorder: f64,
    /// Longest extra delay of a reordered datagram.
    pub reorder_delay_max: Duration,
    /// Probability that one byte of a datagram is corrupted.
    pub corrupt: f64,
}

impl FaultConfig {
    /// Upper bound of the loss probability [`random`](Self::random) picks.
    pub const LOSS_MAX: f64 = 0.30;
    /// Upper bound of the duplication probability [`random`](Self::random) picks.
    pub const DUPLICATE_MAX: f64 = 0.10;
    /// Upper bound of the reordering probability [`random`](Self::random) picks.
    pub const REORDER_MAX: f64 = 0.20;
    /// Upper bound of the corruption probability [`random`](Self::random) picks.
    pub const CORRUPT_MAX: f64 = 0.05;
    /// Upper bound of the reordering delay [`random`](Self::random) picks.
    pub const REORDER_DELAY_MAX: Duration = Duration::from_micros(200);

    /// A perfect network.
    pub const NONE: Self =
        Self { loss: 0.0, duplicate: 0.0, reorder: 0.0, reorder_delay_max: Duration::ZERO, corrupt: 0.0 };

    /// Parameters drawn from `rng`: each kind of fault is absent with probability 1/2, and
    /// otherwise uniform in `(0, MAX]` (loss up to 30 %, duplication 10 %, reordering 20 % by
    /// up to 200 µs, corruption 5 %).
    ///
    /// Switching whole kinds of fault off is swarm testing (Groce et al., ISSTA 2012): a bug
    /// that needs many retransmissions in a row hides when every run also duplicates and
    /// reorders.
    pub fn random(rng: &mut SimRng) -> Self {
        let mut pick = |max: f64| if rng.chance(0.5) { 0.0 } else { max * (1.0 - rng.unit_f64()) };
        let loss = pick(Self::LOSS_MAX);
        let duplicate = pick(Self::DUPLICATE_MAX);
        let reorder = pick(Self::REORDER_MAX);
        let corrupt = pick(Self::CORRUPT_MAX);
        let reorder_delay_max =
            Duration::from_nanos(1 + rng.below(crate::time::duration_nanos(Self::REORDER_DELAY_MAX)));
        Self { loss, duplicate, reorder, reorder_delay_max, corrupt }
    }

    /// Whether every probability is zero.
    pub fn is_none(&self) -> bool {
        self.loss == 0.0 && self.duplicate == 0.0 && self.reorder == 0.0 && self.corrupt == 0.0
    }

    /// The rules that make this network, in the order the fabric asks them: loss, duplicate,
    /// reorder, corrupt. Kinds with probability zero are left out.
    pub fn rules(&self) -> Vec<Box<dyn Rule>> {
        let mut rules: Vec<Box<dyn Rule>> = Vec::new();
        if self.loss > 0.0 {
            rules.push(Box::new(Loss::new(self.loss)));
        }
        if self.duplicate > 0.0 {
            rules.push(Box::new(Duplicate::new(self.duplicate)));
        }
        if self.reorder > 0.0 {
            rules.push(Box::new(Reorder::new(self.reorder, self.reorder_delay_max)));
        }
        if self.corrupt > 0.0 {
            rules.push(Box::new(Corrupt::new(self.corrupt)));
        }
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgram(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Datagram {
        Datagram::new(Envelope::rocev2(src.into(), 0xc000, dst.into()).unwrap(), payload.to_vec())
    }

    #[test]
    fn scope_matches_directions() {
        let (a, b, c) = ([10, 0, 0, 1], [10, 0, 0, 2], [10, 0, 0, 3]);
        let ip = |x: [u8; 4]| IpAddr::from(x);
        let one_way = Scope::all().src([ip(a)]).dst([ip(b)]);
        assert!(one_way.matches(ip(a), ip(b)));
        assert!(!one_way.matches(ip(b), ip(a)));
        assert!(!one_way.matches(ip(a), ip(c)));
        assert!(Scope::all().matches(ip(c), ip(a)));
        assert!(Scope::all().dst([ip(c)]).matches(ip(a), ip(c)));
        let mut rng = SimRng::new(0);
        let mut rule = Loss::new(1.0).scoped(one_way);
        assert_eq!(rule.verdict(&dgram(a, b, b"x"), &mut rng), Verdict::Drop);
        assert_eq!(rule.verdict(&dgram(b, a, b"x"), &mut rng), Verdict::Deliver);
        assert_eq!(rule.name(), "loss");
        assert_eq!(rule.named("a->b").name(), "a->b");
    }

    #[test]
    fn partition_cuts_both_ways_but_not_within_a_side() {
        let ip = |x: u8| IpAddr::from([10, 0, 0, x]);
        let mut p = Partition::new([ip(1), ip(2)], [ip(3)]);
        let mut rng = SimRng::new(0);
        let mut v = |s: u8, d: u8| p.verdict(&dgram([10, 0, 0, s], [10, 0, 0, d], b"x"), &mut rng);
        assert_eq!(v(1, 3), Verdict::Drop);
        assert_eq!(v(3, 2), Verdict::Drop);
        assert_eq!(v(1, 2), Verdict::Deliver);
    }

    #[test]
    fn match_counts_down_and_peeks_at_the_bth() {
        // A BTH of opcode 0x10 (READ_RESPONSE_ONLY), PSN 5.
        let mut bth = [0u8; 12];
        bth[0] = 0x10;
        bth[11] = 5;
        let d = dgram([1, 1, 1, 1], [2, 2, 2, 2], &bth);
        assert_eq!(d.opcode(), Some(Opcode::RC_RDMA_READ_RESPONSE_ONLY));
        assert_eq!(d.psn(), Psn::new(5));
        assert!(d.roce().is_none(), "no AETH or ICRC: too short for the whole packet");
        assert_eq!(dgram([1, 1, 1, 1], [2, 2, 2, 2], &bth[..11]).opcode(), None);
        let mut rule =
            Match::new(|d: &Datagram| d.opcode() == Some(Opcode::RC_RDMA_READ_RESPONSE_ONLY), Verdict::Drop).times(2);
        let mut rng = SimRng::new(0);
        let verdicts: Vec<Verdict> = (0..3).map(|_| rule.verdict(&d, &mut rng)).collect();
        assert_eq!(verdicts, [Verdict::Drop, Verdict::Drop, Verdict::Deliver]);
    }

    #[test]
    fn corrupt_picks_a_byte_inside_and_a_nonzero_mask() {
        let mut rule = Corrupt::new(1.0);
        let mut rng = SimRng::new(9);
        let d = dgram([1, 1, 1, 1], [2, 2, 2, 2], &[0; 7]);
        for _ in 0..1000 {
            let Verdict::Corrupt { index, xor } = rule.verdict(&d, &mut rng) else { panic!("p = 1") };
            assert!(index < 7 && xor != 0);
        }
        assert_eq!(rule.verdict(&dgram([1, 1, 1, 1], [2, 2, 2, 2], &[]), &mut rng), Verdict::Deliver);
    }

    #[test]
    fn random_fault_config_stays_in_range_and_sometimes_switches_kinds_off() {
        let mut rng = SimRng::new(42);
        let configs: Vec<FaultConfig> = (0..200).map(|_| FaultConfig::random(&mut rng)).collect();
        for c in &configs {
            assert!((0.0..=FaultConfig::LOSS_MAX).contains(&c.loss), "{c:?}");
            assert!((0.0..=FaultConfig::DUPLICATE_MAX).contains(&c.duplicate), "{c:?}");
            assert!((0.0..=FaultConfig::REORDER_MAX).contains(&c.reorder), "{c:?}");
            assert!((0.0..=FaultConfig::CORRUPT_MAX).contains(&c.corrupt), "{c:?}");
            assert!(c.reorder_delay_max <= FaultConfig::REORDER_DELAY_MAX);
            assert_eq!(
                c.rules().len(),
                [c.loss, c.duplicate, c.reorder, c.corrupt].iter().filter(|&&p| p > 0.0).count()
            );
        }
        assert!(configs.iter().any(|c| c.loss == 0.0) && configs.iter().any(|c| c.loss > 0.2));
        assert!(configs.iter().any(FaultConfig::is_none), "all four kinds off: 1 in 16");
        assert!(configs.iter().any(|c| c.rules().len() == 4), "all four kinds on: 1 in 16");
        assert_eq!(FaultConfig::random(&mut SimRng::new(5)), FaultConfig::random(&mut SimRng::new(5)));
    }

    #[test]
    #[should_panic(expected = "within [0, 1]")]
    fn probabilities_outside_the_unit_interval_are_refused() {
        let _ = Loss::new(1.5);
    }
}
