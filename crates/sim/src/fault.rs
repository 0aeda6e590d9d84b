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
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use softrdma_wire::{BthPacket, Envelope, Opcode, Operation, Psn, Qpn, RocePacket};

use crate::fabric::NodeId;
use crate::rng::SimRng;
use crate::time::Time;
use crate::trace::Corruption;

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

    /// Makes this datagram another one, sent at `sent_at`, reusing its buffer (a runtime
    /// that judges every datagram it receives allocates nothing per datagram).
    pub fn refill(&mut self, envelope: Envelope, payload: &[u8], sent_at: Time) {
        self.envelope = envelope;
        self.payload.clear();
        self.payload.extend_from_slice(payload);
        self.sent_at = sent_at;
        self.ce = false;
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

/// The kind of operation a datagram belongs to, for rules that target one ("lose READ
/// responses", "delay the ACKs").
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum OpClass {
    /// SEND, with immediate or invalidate, on any transport.
    Send,
    /// RDMA WRITE, with or without immediate.
    Write,
    /// RDMA READ requests and their responses.
    Read,
    /// Atomics (compare-and-swap, fetch-and-add, ATOMIC_WRITE) and their acknowledgements.
    Atomic,
    /// ACKs and NAKs.
    Ack,
    /// FLUSH.
    Flush,
    /// Congestion notification packets.
    Cnp,
    /// Connection-manager MADs (destination QP 1).
    Cm,
}

impl OpClass {
    /// Every class, in the order of their names in [`OpClass::NAMES`].
    pub const ALL: [OpClass; 8] = [
        OpClass::Send,
        OpClass::Write,
        OpClass::Read,
        OpClass::Atomic,
        OpClass::Ack,
        OpClass::Flush,
        OpClass::Cnp,
        OpClass::Cm,
    ];
    /// The name of each class of [`OpClass::ALL`], as fault specifications write it.
    pub const NAMES: [&'static str; 8] = ["send", "write", "read", "atomic", "ack", "flush", "cnp", "cm"];

    /// Its name (`"read"`).
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// The class of the packet a datagram carries: `None` for one too short for a BTH or of
    /// an opcode softrdma does not know.
    pub fn of(datagram: &Datagram) -> Option<OpClass> {
        let bth = datagram.bth()?;
        if bth.dest_qp() == Qpn::GSI {
            return Some(OpClass::Cm);
        }
        Some(match bth.opcode().info()?.operation {
            Operation::Send | Operation::SendWithImm | Operation::SendWithInvalidate => OpClass::Send,
            Operation::RdmaWrite | Operation::RdmaWriteWithImm => OpClass::Write,
            Operation::RdmaReadRequest | Operation::RdmaReadResponse => OpClass::Read,
            Operation::CompareSwap | Operation::FetchAdd | Operation::AtomicAcknowledge | Operation::AtomicWrite => {
                OpClass::Atomic
            }
            Operation::Acknowledge => OpClass::Ack,
            Operation::Flush => OpClass::Flush,
            Operation::Cnp => OpClass::Cnp,
        })
    }
}

impl std::str::FromStr for OpClass {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(s))
            .map(|i| Self::ALL[i])
            .ok_or_else(|| format!("unknown operation class {s:?}: one of {}", Self::NAMES.join(", ")))
    }
}

/// Which datagrams a rule applies to: by source and destination address, destination QP
/// and [operation class](OpClass). Each part left unset admits everything.
///
/// ```
/// # use softrdma_sim::{OpClass, Scope};
/// # use softrdma_wire::Qpn;
/// let a = "10.0.0.1".parse().unwrap();
/// let b = "10.0.0.2".parse().unwrap();
/// let a_to_b = Scope::all().src([a]).dst([b]);
/// assert!(a_to_b.matches(a, b) && !a_to_b.matches(b, a));
/// assert!(a_to_b.both_ways().matches(b, a));
/// // The READ responses and ACKs that QP 0x11 receives, from anyone.
/// let _ = Scope::all().qp([Qpn::new(0x11).unwrap()]).class([OpClass::Read, OpClass::Ack]);
/// ```
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Scope {
    src: Option<BTreeSet<IpAddr>>,
    dst: Option<BTreeSet<IpAddr>>,
    both_ways: bool,
    qps: Option<BTreeSet<Qpn>>,
    classes: Option<BTreeSet<OpClass>>,
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

    /// Only datagrams whose BTH names one of `qps` as destination QP.
    #[must_use]
    pub fn qp(mut self, qps: impl IntoIterator<Item = Qpn>) -> Self {
        self.qps = Some(qps.into_iter().collect());
        self
    }

    /// Only datagrams of one of `classes`.
    #[must_use]
    pub fn class(mut self, classes: impl IntoIterator<Item = OpClass>) -> Self {
        self.classes = Some(classes.into_iter().collect());
        self
    }

    /// Whether a datagram from `src` to `dst` is in scope as far as addresses go.
    pub fn matches(&self, src: IpAddr, dst: IpAddr) -> bool {
        let within = |set: &Option<BTreeSet<IpAddr>>, ip: IpAddr| set.as_ref().is_none_or(|s| s.contains(&ip));
        (within(&self.src, src) && within(&self.dst, dst))
            || (self.both_ways && within(&self.src, dst) && within(&self.dst, src))
    }

    /// Whether `datagram` is in scope: addresses, destination QP and class.
    pub fn admits(&self, datagram: &Datagram) -> bool {
        self.matches(datagram.src(), datagram.dst())
            && self.qps.as_ref().is_none_or(|q| datagram.dest_qp().is_some_and(|n| q.contains(&n)))
            && self.classes.as_ref().is_none_or(|c| OpClass::of(datagram).is_some_and(|k| c.contains(&k)))
    }

    /// Whether every datagram is in scope.
    pub fn is_all(&self) -> bool {
        self.src.is_none() && self.dst.is_none() && self.qps.is_none() && self.classes.is_none()
    }
}

impl fmt::Display for Scope {
    /// The scope in fault-specification words (`from 10.0.0.1 qp 0x11 op read,ack`); empty
    /// for [`Scope::all`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T>(
            f: &mut fmt::Formatter<'_>,
            sep: &str,
            word: &str,
            set: &BTreeSet<T>,
            show: impl Fn(&T) -> String,
        ) -> fmt::Result {
            let items: Vec<String> = set.iter().map(show).collect();
            write!(f, "{sep}{word} {}", items.join(","))
        }
        let mut sep = "";
        if let Some(s) = &self.src {
            list(f, sep, "from", s, ToString::to_string)?;
            sep = " ";
        }
        if let Some(d) = &self.dst {
            list(f, sep, "to", d, ToString::to_string)?;
            sep = " ";
        }
        if self.both_ways && (self.src.is_some() || self.dst.is_some()) {
            write!(f, "{sep}both-ways")?;
            sep = " ";
        }
        if let Some(q) = &self.qps {
            list(f, sep, "qp", q, |n| format!("{:#x}", n.value()))?;
            sep = " ";
        }
        if let Some(c) = &self.classes {
            list(f, sep, "op", c, |k| k.name().to_string())?;
        }
        Ok(())
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
        if self.scope.admits(datagram) { self.rule.verdict(datagram, rng) } else { Verdict::Deliver }
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

/// Holds every datagram back by `delay`, plus a uniformly random `[0, jitter]` (named
/// `"delay"`): a long link. With jitter, later datagrams overtake earlier ones, as netem's
/// `delay 10ms 2ms` does.
#[derive(Clone, Debug)]
pub struct Delay {
    delay: Duration,
    jitter: Duration,
}

impl Delay {
    /// `delay`, plus up to `jitter` more.
    pub fn new(delay: Duration, jitter: Duration) -> Self {
        Self { delay, jitter }
    }
}

impl Rule for Delay {
    fn verdict(&mut self, _: &Datagram, rng: &mut SimRng) -> Verdict {
        let extra = if self.jitter.is_zero() { Duration::ZERO } else { rng.duration_up_to(self.jitter) };
        Verdict::Delay(self.delay + extra)
    }

    fn name(&self) -> &'static str {
        "delay"
    }
}

/// A bottleneck of `bits_per_sec` with a drop-tail queue (named `"rate"`): each datagram
/// waits until the ones before it have left at that rate (counting its Ethernet, IP and UDP
/// headers); one that would wait longer than `queue` is dropped, as a router's full buffer
/// drops it. The queue lives in the rule: the datagrams it sees are the ones that share the
/// bottleneck.
#[derive(Clone, Debug)]
pub struct RateLimit {
    bits_per_sec: u64,
    queue: Duration,
    free_at: Option<Time>,
}

impl RateLimit {
    /// A `bits_per_sec` bottleneck whose queue holds `queue` worth of traffic; panics if
    /// `bits_per_sec` is 0.
    pub fn new(bits_per_sec: u64, queue: Duration) -> Self {
        assert!(bits_per_sec > 0, "a rate limit of 0 bit/s would hold every datagram forever");
        Self { bits_per_sec, queue, free_at: None }
    }
}

impl Rule for RateLimit {
    fn verdict(&mut self, datagram: &Datagram, _: &mut SimRng) -> Verdict {
        let now = datagram.sent_at;
        let start = self.free_at.map_or(now, |f| f.max(now));
        let wait = start - now;
        if wait > self.queue {
            return Verdict::Drop;
        }
        let headers = match datagram.envelope {
            Envelope::V4(_) => 18 + 20 + 8,
            Envelope::V6(_) => 18 + 40 + 8,
        };
        let bits = (datagram.payload.len() as u128 + headers) * 8;
        let nanos = (bits * 1_000_000_000).div_ceil(u128::from(self.bits_per_sec));
        self.free_at = Some(start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)));
        if wait.is_zero() { Verdict::Deliver } else { Verdict::Delay(wait) }
    }

    fn name(&self) -> &'static str {
        "rate"
    }
}

/// A link that goes down for `down` at the end of every `period` (named `"partition"`):
/// everything in scope is lost from `period - down` to `period`, from `2 period - down` to
/// `2 period`, and so on, counted from the first datagram the rule sees (so a connection
/// has `period - down` to come up before the first cut). [`Partition`] is the one-off,
/// under the test's control.
#[derive(Clone, Debug)]
pub struct Flap {
    period: Duration,
    down: Duration,
    origin: Option<Time>,
}

impl Flap {
    /// Down for `down` of every `period`; panics unless `0 < down <= period`.
    pub fn new(period: Duration, down: Duration) -> Self {
        assert!(!down.is_zero() && down <= period, "a link down {down:?} of every {period:?}: 0 < down <= period");
        Self { period, down, origin: None }
    }
}

impl Rule for Flap {
    fn verdict(&mut self, datagram: &Datagram, _: &mut SimRng) -> Verdict {
        let origin = *self.origin.get_or_insert(datagram.sent_at);
        let into = (datagram.sent_at - origin).as_nanos() % self.period.as_nanos();
        if into >= (self.period - self.down).as_nanos() { Verdict::Drop } else { Verdict::Deliver }
    }

    fn name(&self) -> &'static str {
        "partition"
    }
}

/// What a [`Chain`] decided for a datagram it did not drop.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Plan {
    /// How many copies arrive (1 unless a rule said [`Verdict::Duplicate`]; at most
    /// [`MAX_COPIES`]).
    pub copies: usize,
    /// How much later than the link would deliver them.
    pub delay: Duration,
    /// Bytes to flip in every copy, in the order the rules asked.
    pub corruptions: Vec<Corruption>,
}

impl Plan {
    /// Applies the corruptions to `payload`.
    pub fn corrupt(&self, payload: &mut [u8]) {
        for c in &self.corruptions {
            payload[c.index] ^= c.xor;
        }
    }
}

/// A chain of rules, each with its own random stream of one seed, asked in order about
/// every datagram (the [module](self) documentation says how their answers combine). The
/// [`Fabric`](crate::Fabric) asks one about every datagram that enters it; softrdma's
/// runtime asks one about every datagram a device receives (`SOFTRDMA_FAULTS`).
///
/// `R` is `dyn Rule` for the simulator's closures, `dyn Rule + Send` for a chain that moves
/// between threads.
pub struct Chain<R: ?Sized = dyn Rule> {
    seed: u64,
    next_stream: u64,
    slots: Vec<(u64, Box<R>, SimRng)>,
}

impl<R: ?Sized + Rule> Chain<R> {
    /// An empty chain whose rules draw from `seed`; rule `n` added gets stream `first_stream
    /// + n`.
    pub fn new(seed: u64, first_stream: u64) -> Self {
        Self { seed, next_stream: first_stream, slots: Vec::new() }
    }

    /// Appends `rule`, asked after every rule already there. Returns its key for
    /// [`remove`](Self::remove).
    pub fn push(&mut self, rule: Box<R>) -> u64 {
        let key = self.next_stream;
        self.next_stream += 1;
        self.slots.push((key, rule, SimRng::with_stream(self.seed, key)));
        key
    }

    /// Removes the rule `key`; whether it was there.
    pub fn remove(&mut self, key: u64) -> bool {
        let before = self.slots.len();
        self.slots.retain(|(k, _, _)| *k != key);
        self.slots.len() != before
    }

    /// Removes every rule.
    pub fn clear(&mut self) {
        self.slots.clear();
    }

    /// How many rules it holds.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether it holds no rule.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Asks every rule about `datagram`, in order: `Err(name)` of the rule that dropped it,
    /// or what happens to it.
    pub fn judge(&mut self, datagram: &Datagram) -> Result<Plan, &'static str> {
        let mut plan = Plan { copies: 1, delay: Duration::ZERO, corruptions: Vec::new() };
        for (_, rule, rng) in &mut self.slots {
            match rule.verdict(datagram, rng) {
                Verdict::Deliver => {}
                Verdict::Drop => return Err(rule.name()),
                Verdict::Duplicate => plan.copies = (plan.copies + 1).min(MAX_COPIES),
                Verdict::Delay(d) => plan.delay = plan.delay.saturating_add(d),
                Verdict::Corrupt { index, xor } => {
                    if index < datagram.payload.len() && xor != 0 {
                        plan.corruptions.push(Corruption { index, xor });
                    }
                }
            }
        }
        Ok(plan)
    }
}

impl<R: ?Sized> fmt::Debug for Chain<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain").field("seed", &self.seed).field("rules", &self.slots.len()).finish()
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

    fn at(micros: u64, len: usize) -> Datagram {
        let mut d = dgram([1, 1, 1, 1], [2, 2, 2, 2], &vec![0; len]);
        d.sent_at = Time::from_micros(micros);
        d
    }

    #[test]
    fn a_rate_limit_queues_at_its_rate_and_drops_beyond_its_queue() {
        // 8 Mbit/s: a 1000-byte payload plus 46 bytes of headers takes 1046 us.
        let mut rule = RateLimit::new(8_000_000, Duration::from_micros(2000));
        let mut rng = SimRng::new(0);
        let mut v = |us| rule.verdict(&at(us, 1000), &mut rng);
        assert_eq!(v(0), Verdict::Deliver);
        assert_eq!(v(0), Verdict::Delay(Duration::from_micros(1046)));
        assert_eq!(v(100), Verdict::Delay(Duration::from_micros(1992)));
        assert_eq!(v(100), Verdict::Drop, "would wait 3038 us, the queue holds 2000");
        assert_eq!(v(5000), Verdict::Deliver, "the queue drained");
    }

    #[test]
    fn a_flapping_link_is_down_at_the_end_of_each_period_from_the_first_datagram() {
        let mut rule = Flap::new(Duration::from_millis(10), Duration::from_millis(3));
        let mut rng = SimRng::new(0);
        let mut v = |us| rule.verdict(&at(us, 1), &mut rng);
        let got: Vec<Verdict> = [1000, 7999, 8000, 10999, 11000, 18500, 21001].into_iter().map(&mut v).collect();
        use Verdict::{Deliver as D, Drop as X};
        assert_eq!(got, [D, D, X, X, D, X, D], "origin 1 ms: down 8-11 ms, 18-21 ms");
    }

    #[test]
    fn delay_adds_jitter_within_bounds() {
        let mut rule = Delay::new(Duration::from_millis(2), Duration::from_micros(500));
        let mut rng = SimRng::new(3);
        let delays: Vec<Duration> = (0..500)
            .map(|_| match rule.verdict(&at(0, 1), &mut rng) {
                Verdict::Delay(d) => d,
                v => panic!("{v:?}"),
            })
            .collect();
        assert!(delays.iter().all(|d| (Duration::from_millis(2)..=Duration::from_micros(2500)).contains(d)));
        assert!(
            delays.iter().any(|d| *d > Duration::from_micros(2400))
                && delays.iter().any(|d| *d < Duration::from_micros(2100))
        );
    }

    #[test]
    fn a_scope_picks_by_destination_qp_and_operation_class() {
        // RC RDMA READ request (0x0c) to QP 0x11, an ACK (0x11) to QP 0x11, a MAD to QP 1.
        let packet = |opcode: u8, qpn: u32| {
            let mut bth = [0u8; 12];
            bth[0] = opcode;
            bth[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            dgram([1, 1, 1, 1], [2, 2, 2, 2], &bth)
        };
        let (read, ack, mad, other_qp) = (packet(0x0c, 0x11), packet(0x11, 0x11), packet(0x64, 1), packet(0x0c, 0x12));
        assert_eq!(OpClass::of(&read), Some(OpClass::Read));
        assert_eq!(OpClass::of(&ack), Some(OpClass::Ack));
        assert_eq!(OpClass::of(&mad), Some(OpClass::Cm));
        let scope = Scope::all().qp([Qpn::new(0x11).unwrap()]).class([OpClass::Read]);
        assert!(scope.admits(&read));
        assert!(!scope.admits(&ack) && !scope.admits(&mad) && !scope.admits(&other_qp));
        assert!(Scope::all().admits(&mad) && Scope::all().is_all() && !scope.is_all());
        let mut rule = Loss::new(1.0).scoped(Scope::all().class([OpClass::Cm]));
        let mut rng = SimRng::new(0);
        assert_eq!(rule.verdict(&mad, &mut rng), Verdict::Drop);
        assert_eq!(rule.verdict(&read, &mut rng), Verdict::Deliver);
    }

    #[test]
    fn a_chain_stops_at_a_drop_and_adds_up_the_rest() {
        let mut chain: Chain = Chain::new(1, 1);
        chain.push(Box::new(Delay::new(Duration::from_micros(5), Duration::ZERO)));
        chain.push(Box::new(|_: &Datagram| Verdict::Duplicate));
        chain.push(Box::new(|_: &Datagram| Verdict::Corrupt { index: 2, xor: 0x80 }));
        chain.push(Box::new(Delay::new(Duration::from_micros(7), Duration::ZERO)));
        let plan = chain.judge(&at(0, 4)).unwrap();
        assert_eq!((plan.copies, plan.delay), (2, Duration::from_micros(12)));
        let mut bytes = [0u8; 4];
        plan.corrupt(&mut bytes);
        assert_eq!(bytes, [0, 0, 0x80, 0]);
        let drop = chain.push(Box::new(Loss::new(1.0)));
        assert_eq!(chain.judge(&at(0, 4)), Err("loss"));
        assert!(chain.remove(drop) && !chain.remove(drop));
        assert_eq!(chain.len(), 4);
    }

    #[test]
    #[should_panic(expected = "within [0, 1]")]
    fn probabilities_outside_the_unit_interval_are_refused() {
        let _ = Loss::new(1.5);
    }
}
