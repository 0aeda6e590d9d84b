//! The fabric: nodes, a virtual clock, datagrams in flight, fault rules, and what was seen.

use std::any::{Any, type_name};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use softrdma_pcap::{CaptureError, CaptureWriter};
use softrdma_wire::Envelope;

use crate::fault::{Chain, Datagram, FaultConfig, Partition, Plan, Rule};
use crate::node::{MAX_UDP_PAYLOAD, Node};
use crate::rng::SimRng;
use crate::seed::{print_hint_if_panicking, reproduce_hint};
use crate::time::Time;
use crate::trace::{Counters, DropReason, Fate, Tap, TraceEntry};

/// A node's handle on the fabric: its index, in the order nodes were added.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct NodeId(usize);

impl NodeId {
    /// The index (0 for the first node added).
    pub const fn index(self) -> usize {
        self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

/// A fault rule's handle, to remove it later.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RuleId(u64);

/// The link model and the limits of a fabric.
#[derive(Clone, PartialEq, Debug)]
pub struct Config {
    /// One-way latency of every datagram (default 5 µs).
    pub latency: Duration,
    /// Extra latency, uniform in `[0, jitter]` and drawn for each copy (default zero). Any
    /// jitter reorders datagrams that are sent closer together than it.
    pub jitter: Duration,
    /// Each node's link rate, if limited (default `None`: infinitely fast). A node's
    /// datagrams then leave one after the other, each taking its length (UDP payload plus
    /// Ethernet, IP and UDP headers) over the rate; the fabric takes a node's next datagram
    /// only when its link is free, as a NIC's scheduler does, so that a node that paces
    /// its sending (congestion control) decides what leaves next.
    pub bandwidth_bits_per_sec: Option<u64>,
    /// Largest UDP payload the network carries; larger datagrams are dropped and counted as
    /// [`DropReason::Mtu`] (default 4096 + 80: a 4096-byte path MTU plus the largest RoCE
    /// headers and ICRC).
    pub max_udp_payload: usize,
    /// Most datagrams in flight at once; more are dropped as [`DropReason::QueueFull`]
    /// (default 2^20).
    pub max_in_flight: usize,
    /// Most datagrams taken from a node each time the fabric polls it (default 10 000): at
    /// the start of a step, and after it handled the step's datagram or timeout. A node that
    /// never stops sending thus cannot stop the clock; what it did not get to send waits for
    /// the next poll.
    pub max_transmits_per_step: usize,
    /// Most steps one `run_*` call takes before it fails with [`SimErrorKind::StepLimit`]
    /// (default 10 000 000).
    pub max_steps_per_run: u64,
    /// How many trace entries to keep, the most recent (default 0: no trace).
    pub trace_limit: usize,
    /// A switch between the nodes, if any (default `None`: datagrams go straight to their
    /// destination): its port toward each node has a rate, a buffer and an ECN marking
    /// threshold, so that many senders into one node queue, get marked, and overflow.
    pub switch: Option<SwitchPort>,
}

/// The port of a switch toward one node (every node has one, all alike). It sends the
/// datagrams it gets in the order they entered the network, each taking its length over
/// the rate; a datagram that finds the buffer full is dropped ([`DropReason::PortFull`]);
/// one that finds a queue is marked Congestion Experienced (delivered through
/// [`Node::handle_datagram_marked`]) with the probability [`Red`] gives, as the switches
/// DCQCN was designed for mark.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct SwitchPort {
    /// The port's rate.
    pub bits_per_sec: u64,
    /// Bytes the port's buffer holds.
    pub buffer_bytes: u64,
    /// How it marks; `None`: never.
    pub ecn: Option<Red>,
}

/// RED-style ECN marking on the queue a datagram finds: never below `min_bytes`, always
/// above `max_bytes`, in between with a probability rising linearly to `max_probability`
/// (DCQCN's paper: 5 KB, 200 KB, 1 %).
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Red {
    /// Queue below which nothing is marked.
    pub min_bytes: u64,
    /// Queue above which everything is marked.
    pub max_bytes: u64,
    /// Marking probability just below `max_bytes`.
    pub max_probability: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            latency: Duration::from_micros(5),
            jitter: Duration::ZERO,
            bandwidth_bits_per_sec: None,
            max_udp_payload: 4096 + 80,
            max_in_flight: 1 << 20,
            max_transmits_per_step: 10_000,
            max_steps_per_run: 10_000_000,
            trace_limit: 0,
            switch: None,
        }
    }
}

/// Why a run stopped before it was done.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum SimErrorKind {
    /// The run took [`Config::max_steps_per_run`] steps. Nodes that bounce datagrams
    /// forever, or a node whose `poll_timeout` stays at or before `now` after
    /// `handle_timeout(now)`, look like this.
    StepLimit {
        /// Steps taken.
        steps: u64,
    },
    /// [`Fabric::run_until_idle`] reached its limit with work left.
    NotIdle {
        /// Datagrams still in flight.
        in_flight: usize,
        /// The earliest node timeout.
        next_timeout: Option<Time>,
    },
    /// [`Fabric::run_until_cond`] reached its limit and the condition still did not hold.
    ConditionNotMet,
}

/// A run that stopped before it was done, with the seed that replays it.
///
/// `Debug` shows the same text as `Display`, so that `.unwrap()` prints the seed.
#[derive(Clone, PartialEq, Eq)]
pub struct SimError {
    /// What went wrong.
    pub kind: SimErrorKind,
    /// The fabric's seed.
    pub seed: u64,
    /// The virtual time when the run stopped.
    pub now: Time,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            SimErrorKind::StepLimit { steps } => write!(
                f,
                "step limit: {steps} steps and the run is not over at {} (config.max_steps_per_run); \
                 are nodes bouncing datagrams forever, or is a poll_timeout() stuck at or before now?",
                self.now
            )?,
            SimErrorKind::NotIdle { in_flight, next_timeout } => {
                write!(f, "not idle at {}: {in_flight} datagrams in flight, next timeout {next_timeout:?}", self.now)?
            }
            SimErrorKind::ConditionNotMet => write!(f, "condition still false at {}", self.now)?,
        }
        write!(f, "\n{}", reproduce_hint(self.seed))
    }
}

impl fmt::Debug for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for SimError {}

/// A node, reachable again as its concrete type.
trait AnyNode: Node {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Node + Any> AnyNode for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

struct NodeSlot {
    node: Box<dyn AnyNode>,
    addresses: Vec<IpAddr>,
    /// When the node's link finishes sending what it was given (bandwidth model).
    link_free_at: Time,
    /// When the switch's port toward the node finishes sending what it holds.
    port_free_at: Time,
    /// The fabric stopped taking datagrams from the node because its link was busy: poll
    /// it again at `link_free_at`.
    backlogged: bool,
}

struct InFlight {
    to: NodeId,
    datagram: Datagram,
}

struct Capture {
    tap: Tap,
    writer: Option<CaptureWriter<Box<dyn Write>>>,
    error: Option<CaptureError>,
}

/// The RNG stream of the link (jitter); rule `n` uses stream `n + 1`.
const LINK_STREAM: u64 = 0;

/// A deterministic network of [`Node`]s: one seed, a virtual clock, and datagrams in flight
/// ordered by (arrival time, sequence number).
///
/// Every random decision comes from the seed; nodes are visited in the order they were
/// added; nothing reads a wall clock. The same seed, nodes and rules give the same run, byte
/// for byte.
///
/// A run is a sequence of [`step`](Self::step)s. Each step first collects what every node
/// has to send (work a test started between steps), then moves the clock to the next event
/// and fires it: one datagram delivered, or (when no datagram arrives at or before it) the
/// timeouts of every node whose `poll_timeout` has come, in node order; then it collects
/// what the nodes it woke have to send. A datagram and a timeout at the same instant: the
/// datagram goes first, as in a poll loop that drains its socket before its timers.
///
/// Datagrams enter the network when a node's `poll_transmit` returns them (or through
/// [`inject`](Self::inject)). Each goes through the MTU check, the routing table (the
/// [`Node::addresses`] of every node) and the fault [`Rule`]s, and is scheduled to arrive
/// after the link latency, jitter and any delay the rules added.
///
/// If the thread panics while the fabric is alive, its drop prints `reproduce with:
/// SOFTRDMA_SEED=0x...`.
pub struct Fabric {
    seed: u64,
    now: Time,
    config: Config,
    nodes: Vec<NodeSlot>,
    routes: BTreeMap<IpAddr, NodeId>,
    in_flight: BTreeMap<(Time, u64), InFlight>,
    next_seq: u64,
    next_datagram_id: u64,
    link_rng: SimRng,
    rules: Chain,
    counters: Counters,
    trace: VecDeque<TraceEntry>,
    captures: Vec<Capture>,
    scratch: Vec<u8>,
}

impl fmt::Debug for Fabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fabric")
            .field("seed", &format_args!("{:#x}", self.seed))
            .field("now", &self.now)
            .field("nodes", &self.nodes.len())
            .field("rules", &self.rules.len())
            .field("in_flight", &self.in_flight.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Fabric {
    /// An empty fabric with the default [`Config`]. Take `seed` from
    /// [`seed_from_env_or`](crate::seed_from_env_or) so that a failure can be replayed.
    pub fn new(seed: u64) -> Self {
        Self::with_config(seed, Config::default())
    }

    /// An empty fabric.
    pub fn with_config(seed: u64, config: Config) -> Self {
        Self {
            seed,
            now: Time::ZERO,
            config,
            nodes: Vec::new(),
            routes: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            next_seq: 0,
            next_datagram_id: 0,
            link_rng: SimRng::with_stream(seed, LINK_STREAM),
            rules: Chain::new(seed, LINK_STREAM + 1),
            counters: Counters::default(),
            trace: VecDeque::new(),
            captures: Vec::new(),
            scratch: vec![0; MAX_UDP_PAYLOAD],
        }
    }

    // ---- Getters ----

    /// The seed every random decision derives from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The virtual time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The link model and limits.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The link model and limits, to change between steps.
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// What was counted so far.
    pub fn counters(&self) -> &Counters {
        self.check_books();
        &self.counters
    }

    /// Datagrams in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// When the next event (arrival or node timeout) is due, if any.
    pub fn next_event(&self) -> Option<Time> {
        let arrival = self.in_flight.first_key_value().map(|(&(at, _), _)| at);
        let link = self.nodes.iter().filter(|n| n.backlogged).map(|n| n.link_free_at).min();
        [arrival, self.next_timeout(), link].into_iter().flatten().min()
    }

    /// The most recent [`Config::trace_limit`] datagrams, oldest first.
    pub fn trace(&self) -> impl ExactSizeIterator<Item = &TraceEntry> + DoubleEndedIterator + '_ {
        self.trace.iter()
    }

    /// [`reproduce_hint`] for this fabric's seed.
    pub fn reproduce_hint(&self) -> String {
        reproduce_hint(self.seed)
    }

    // ---- Nodes ----

    /// Adds a node; datagrams to its [`addresses`](Node::addresses) are delivered to it.
    ///
    /// # Panics
    /// If another node already owns one of its addresses.
    pub fn add_node<N: Node + 'static>(&mut self, node: N) -> NodeId {
        let id = NodeId(self.nodes.len());
        let addresses = node.addresses();
        for &addr in &addresses {
            if let Some(owner) = self.routes.insert(addr, id) {
                panic!("{addr} already belongs to {owner}; each address has one node");
            }
        }
        self.nodes.push(NodeSlot {
            node: Box::new(node),
            addresses,
            link_free_at: Time::ZERO,
            port_free_at: Time::ZERO,
            backlogged: false,
        });
        id
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The node `id`, as its concrete type.
    ///
    /// # Panics
    /// If there is no such node or it is not an `N`.
    pub fn node<N: Node + 'static>(&self, id: NodeId) -> &N {
        self.try_node(id).unwrap_or_else(|| panic!("{id} is not a {}", type_name::<N>()))
    }

    /// The node `id`, as its concrete type, mutably (to call its commands between steps).
    ///
    /// # Panics
    /// If there is no such node or it is not an `N`.
    pub fn node_mut<N: Node + 'static>(&mut self, id: NodeId) -> &mut N {
        self.try_node_mut(id).unwrap_or_else(|| panic!("{id} is not a {}", type_name::<N>()))
    }

    /// The node `id` if it exists and is an `N`.
    pub fn try_node<N: Node + 'static>(&self, id: NodeId) -> Option<&N> {
        self.nodes.get(id.0)?.node.as_any().downcast_ref()
    }

    /// The node `id` if it exists and is an `N`, mutably.
    pub fn try_node_mut<N: Node + 'static>(&mut self, id: NodeId) -> Option<&mut N> {
        self.nodes.get_mut(id.0)?.node.as_any_mut().downcast_mut()
    }

    /// The addresses node `id` owns.
    pub fn addresses(&self, id: NodeId) -> &[IpAddr] {
        &self.nodes[id.0].addresses
    }

    /// The node that owns `addr`.
    pub fn node_at(&self, addr: IpAddr) -> Option<NodeId> {
        self.routes.get(&addr).copied()
    }

    // ---- Fault rules ----

    /// Appends a fault rule to the chain; it sees every datagram sent from now on.
    pub fn add_rule(&mut self, rule: impl Rule + 'static) -> RuleId {
        self.add_boxed_rule(Box::new(rule))
    }

    /// Appends a boxed fault rule to the chain.
    pub fn add_boxed_rule(&mut self, rule: Box<dyn Rule>) -> RuleId {
        RuleId(self.rules.push(rule))
    }

    /// Appends the rules of `faults` ([`FaultConfig::rules`]).
    pub fn add_faults(&mut self, faults: &FaultConfig) -> Vec<RuleId> {
        faults.rules().into_iter().map(|r| self.add_boxed_rule(r)).collect()
    }

    /// Removes a rule; returns whether it was there. Datagrams already in flight are not
    /// affected.
    pub fn remove_rule(&mut self, id: RuleId) -> bool {
        self.rules.remove(id.0)
    }

    /// Removes every rule: from now on the network is perfect (what is in flight still
    /// arrives as decided). The second half of a VOPR-style run: heal, then demand that
    /// everything converges.
    pub fn clear_rules(&mut self) {
        self.rules.clear();
    }

    /// Cuts every datagram between addresses `a` and addresses `b`, both ways, until
    /// [`heal`](Self::heal). Applied when datagrams are sent: those already in flight arrive.
    pub fn partition(&mut self, a: impl IntoIterator<Item = IpAddr>, b: impl IntoIterator<Item = IpAddr>) -> RuleId {
        self.add_rule(Partition::new(a, b))
    }

    /// Removes a partition (or any rule); returns whether it was there.
    pub fn heal(&mut self, partition: RuleId) -> bool {
        self.remove_rule(partition)
    }

    // ---- Captures ----

    /// Writes every datagram that crosses `tap` to a pcap file at `path` from now on.
    ///
    /// The file is a classic pcap of Ethernet frames made by softrdma-pcap's
    /// [`CaptureWriter`] (MAC addresses derived from the IP addresses, the IP and UDP headers
    /// Linux sends); timestamps are virtual time, counted from 1970-01-01, in microseconds.
    /// [`Tap::Sent`] is the capture to open first: every datagram that reached the wire,
    /// dropped ones included. Write errors are kept and reported by
    /// [`finish_captures`](Self::finish_captures).
    pub fn capture(&mut self, path: impl AsRef<Path>, tap: Tap) -> Result<(), CaptureError> {
        let path = path.as_ref();
        let file =
            File::create(path).map_err(|source| CaptureError::Open { path: path.display().to_string(), source })?;
        self.capture_to(BufWriter::new(file), tap)
    }

    /// Like [`capture`](Self::capture), to any writer.
    pub fn capture_to(&mut self, writer: impl Write + 'static, tap: Tap) -> Result<(), CaptureError> {
        let writer = CaptureWriter::new(Box::new(writer) as Box<dyn Write>)?;
        self.captures.push(Capture { tap, writer: Some(writer), error: None });
        Ok(())
    }

    /// Stops every capture, flushes its file, and returns the first error any of them met.
    pub fn finish_captures(&mut self) -> Result<(), CaptureError> {
        let mut result = Ok(());
        for capture in self.captures.drain(..) {
            let flushed = match (capture.error, capture.writer) {
                (Some(e), _) => Err(e),
                (None, Some(w)) => {
                    w.into_inner().flush().map_err(|e| CaptureError::Format(pcap_file::PcapError::IoError(e)))
                }
                (None, None) => Ok(()),
            };
            if result.is_ok() {
                result = flushed;
            }
        }
        result
    }

    // ---- Commands ----

    /// Sends a datagram that no node sent (a forged packet, a replay), through the same
    /// MTU check, routing and fault rules as any other.
    pub fn inject(&mut self, envelope: Envelope, payload: &[u8]) {
        self.admit(None, envelope, payload.to_vec());
    }

    // ---- Running ----

    /// Takes one step (see [`Fabric`]); returns `false`, without moving the clock, when
    /// nothing is in flight and no node wants a timeout.
    pub fn step(&mut self) -> bool {
        self.step_until(Time::MAX)
    }

    /// Runs every event due at or before `deadline`, then sets the clock to `deadline`.
    pub fn run_until(&mut self, deadline: Time) -> Result<(), SimError> {
        let mut steps = 0;
        while self.step_until(deadline) {
            steps += 1;
            self.check_step_limit(steps)?;
        }
        self.now = self.now.max(deadline);
        Ok(())
    }

    /// Runs for `duration` of virtual time.
    pub fn run_for(&mut self, duration: Duration) -> Result<(), SimError> {
        self.run_until(self.now + duration)
    }

    /// Runs until the fabric is idle (nothing in flight and no node timeout within `limit`
    /// from now), and returns the time it became idle. Fails with
    /// [`SimErrorKind::NotIdle`], the clock at `now + limit`, if it is not idle by then.
    pub fn run_until_idle(&mut self, limit: Duration) -> Result<Time, SimError> {
        let deadline = self.now + limit;
        let mut steps = 0;
        loop {
            self.drain_all();
            if self.in_flight.is_empty() && self.next_timeout().is_none_or(|t| t > deadline) {
                return Ok(self.now);
            }
            if !self.step_until(deadline) {
                self.now = self.now.max(deadline);
                let kind = SimErrorKind::NotIdle { in_flight: self.in_flight.len(), next_timeout: self.next_timeout() };
                return Err(self.error(kind));
            }
            steps += 1;
            self.check_step_limit(steps)?;
        }
    }

    /// Runs until `condition` holds (checked before every step), for at most `limit` of
    /// virtual time; returns the time it first held. Fails with
    /// [`SimErrorKind::ConditionNotMet`], the clock at `now + limit`, if it never did.
    ///
    /// ```
    /// # use softrdma_sim::Fabric;
    /// # use std::time::Duration;
    /// let mut sim = Fabric::new(1);
    /// let err = sim.run_until_cond(Duration::from_millis(1), |s| s.counters().delivered > 0).unwrap_err();
    /// assert!(err.to_string().contains("reproduce with: SOFTRDMA_SEED=0x1"));
    /// ```
    pub fn run_until_cond(
        &mut self,
        limit: Duration,
        mut condition: impl FnMut(&Fabric) -> bool,
    ) -> Result<Time, SimError> {
        let deadline = self.now + limit;
        let mut steps = 0;
        loop {
            if condition(self) {
                return Ok(self.now);
            }
            if !self.step_until(deadline) {
                break;
            }
            steps += 1;
            self.check_step_limit(steps)?;
        }
        self.now = self.now.max(deadline);
        if condition(self) { Ok(self.now) } else { Err(self.error(SimErrorKind::ConditionNotMet)) }
    }

    // ---- Internals ----

    fn error(&self, kind: SimErrorKind) -> SimError {
        SimError { kind, seed: self.seed, now: self.now }
    }

    fn check_step_limit(&self, steps: u64) -> Result<(), SimError> {
        if steps >= self.config.max_steps_per_run {
            return Err(self.error(SimErrorKind::StepLimit { steps }));
        }
        Ok(())
    }

    fn next_timeout(&self) -> Option<Time> {
        self.nodes.iter().filter_map(|slot| slot.node.poll_timeout()).min()
    }

    /// One step, if the next event is due at or before `limit`.
    fn step_until(&mut self, limit: Time) -> bool {
        self.drain_all();
        let Some(at) = self.next_event() else { return false };
        if at > limit {
            return false;
        }
        self.counters.steps += 1;
        // A timeout reported in the past fires now: the clock never goes back.
        self.now = self.now.max(at);
        let arrival_due = self.in_flight.first_key_value().is_some_and(|(&(t, _), _)| t <= self.now);
        if arrival_due {
            let Some((_, InFlight { to, datagram })) = self.in_flight.pop_first() else { unreachable!() };
            self.counters.delivered += 1;
            self.write_captures(Tap::Delivered, &datagram);
            let node = &mut self.nodes[to.0].node;
            if datagram.ce {
                self.counters.marked += 1;
                node.handle_datagram_marked(self.now, &datagram.envelope, &datagram.payload, true);
            } else {
                node.handle_datagram(self.now, &datagram.envelope, &datagram.payload);
            }
            self.drain(to);
        } else {
            for i in 0..self.nodes.len() {
                if self.nodes[i].node.poll_timeout().is_some_and(|t| t <= self.now) {
                    self.nodes[i].node.handle_timeout(self.now);
                    self.drain(NodeId(i));
                }
            }
        }
        self.check_books();
        true
    }

    fn drain_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.drain(NodeId(i));
        }
    }

    /// Takes what node `id` has to send, up to [`Config::max_transmits_per_step`].
    fn drain(&mut self, id: NodeId) {
        let bandwidth = self.config.bandwidth_bits_per_sec.is_some();
        self.nodes[id.0].backlogged = false;
        for _ in 0..self.config.max_transmits_per_step {
            if bandwidth && self.nodes[id.0].link_free_at > self.now {
                // The link is busy: the next datagram is taken when it is free.
                self.nodes[id.0].backlogged = true;
                return;
            }
            let Some((envelope, len)) = self.nodes[id.0].node.poll_transmit(self.now, &mut self.scratch) else {
                return;
            };
            assert!(
                len <= self.scratch.len(),
                "{id} says it wrote {len} bytes into a {}-byte buffer",
                self.scratch.len()
            );
            let payload = self.scratch[..len].to_vec();
            self.admit(Some(id), envelope, payload);
        }
        self.counters.transmit_budget_exhausted += 1;
    }

    /// A datagram enters the network: decide its fate, record it, schedule its copies.
    fn admit(&mut self, src_node: Option<NodeId>, envelope: Envelope, payload: Vec<u8>) {
        let id = self.next_datagram_id;
        self.next_datagram_id += 1;
        self.counters.sent += 1;
        let mut datagram = Datagram { id, sent_at: self.now, src_node, envelope, payload, ce: false };
        let (opcode, psn) = (datagram.opcode(), datagram.psn());
        let (src, dst, len) = (datagram.src(), datagram.dst(), datagram.payload.len());

        let fate = match self.decide(&datagram) {
            Err(reason) => {
                *self.counters.dropped.entry(reason).or_insert(0) += 1;
                Fate::Dropped(reason)
            }
            Ok((to, departed, plan)) => {
                let arrivals: Vec<Time> =
                    (0..plan.copies).map(|_| departed + self.config.latency + self.jitter() + plan.delay).collect();
                match self.through_switch(to, &arrivals, datagram.payload.len()) {
                    Err(reason) => {
                        *self.counters.dropped.entry(reason).or_insert(0) += 1;
                        Fate::Dropped(reason)
                    }
                    Ok((arrivals, ce)) => {
                        datagram.ce = ce;
                        plan.corrupt(&mut datagram.payload);
                        self.counters.corrupted += u64::from(!plan.corruptions.is_empty());
                        self.counters.delayed += u64::from(plan.delay > Duration::ZERO);
                        self.counters.duplicated += plan.copies as u64 - 1;
                        if let Some((&last, copies)) = arrivals.split_last() {
                            for &at in copies {
                                self.schedule(at, to, datagram.clone());
                            }
                            self.schedule(last, to, datagram);
                        }
                        Fate::Delivered { arrivals, corruptions: plan.corruptions }
                    }
                }
            }
        };
        if self.config.trace_limit > 0 {
            if self.trace.len() >= self.config.trace_limit {
                self.trace.pop_front();
            }
            self.trace.push_back(TraceEntry { id, sent_at: self.now, src, dst, len, opcode, psn, fate });
        }
    }

    /// The checks in the order a real network makes them: the sender's MTU (an oversized
    /// datagram never reaches the wire, so no capture shows it), then the wire (the sender's
    /// tap sees it, and its link is busy sending it), routing, the fault rules, and the room
    /// left in the network.
    fn decide(&mut self, datagram: &Datagram) -> Result<(NodeId, Time, Plan), DropReason> {
        if datagram.payload.len() > self.config.max_udp_payload {
            return Err(DropReason::Mtu);
        }
        self.write_captures(Tap::Sent, datagram);
        let departed = self.serialize(datagram);
        let to = self.routes.get(&datagram.dst()).copied().ok_or(DropReason::NoRoute)?;
        let plan = self.rules.judge(datagram).map_err(DropReason::Rule)?;
        if self.in_flight.len() + plan.copies > self.config.max_in_flight {
            return Err(DropReason::QueueFull);
        }
        Ok((to, departed, plan))
    }

    /// The switch's port toward `to` takes copies that reach it at `arrivals` (all copies of
    /// one datagram share its fate): when each leaves the port, and whether it was marked;
    /// or the drop, when the buffer is full.
    fn through_switch(&mut self, to: NodeId, arrivals: &[Time], len: usize) -> Result<(Vec<Time>, bool), DropReason> {
        let Some(port) = self.config.switch else { return Ok((arrivals.to_vec(), false)) };
        let bytes = len as u64 + 18 + 40 + 8;
        let nanos_per = |b: u64| (u128::from(b) * 8 * 1_000_000_000).div_ceil(u128::from(port.bits_per_sec.max(1)));
        let mut out = Vec::with_capacity(arrivals.len());
        let mut ce = false;
        for &at in arrivals {
            let waiting = self.nodes[to.0].port_free_at.saturating_duration_since(at);
            let queued = (waiting.as_nanos() * u128::from(port.bits_per_sec) / 8 / 1_000_000_000) as u64;
            if queued + bytes > port.buffer_bytes {
                return Err(DropReason::PortFull);
            }
            if let Some(red) = port.ecn {
                let p = if queued <= red.min_bytes {
                    0.0
                } else if queued >= red.max_bytes {
                    1.0
                } else {
                    red.max_probability * (queued - red.min_bytes) as f64 / (red.max_bytes - red.min_bytes) as f64
                };
                ce |= p > 0.0 && self.link_rng.chance(p);
            }
            let slot = &mut self.nodes[to.0];
            let start = slot.port_free_at.max(at);
            slot.port_free_at = start + Duration::from_nanos(u64::try_from(nanos_per(bytes)).unwrap_or(u64::MAX));
            out.push(slot.port_free_at);
        }
        Ok((out, ce))
    }

    fn jitter(&mut self) -> Duration {
        if self.config.jitter.is_zero() { Duration::ZERO } else { self.link_rng.duration_up_to(self.config.jitter) }
    }

    fn schedule(&mut self, at: Time, to: NodeId, datagram: Datagram) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.insert((at, seq), InFlight { to, datagram });
    }

    /// When the datagram has left its sender's link (bandwidth model): now, on an
    /// infinitely fast link.
    fn serialize(&mut self, datagram: &Datagram) -> Time {
        let (Some(bps), Some(src)) = (self.config.bandwidth_bits_per_sec, datagram.src_node) else { return self.now };
        // Ethernet (14 + 4 FCS), IP and UDP headers around the UDP payload.
        let headers = match datagram.envelope {
            Envelope::V4(_) => 18 + 20 + 8,
            Envelope::V6(_) => 18 + 40 + 8,
        };
        let bits = (datagram.payload.len() as u128 + headers) * 8;
        let nanos = (bits * 1_000_000_000).div_ceil(u128::from(bps.max(1)));
        let slot = &mut self.nodes[src.0];
        let start = slot.link_free_at.max(self.now);
        slot.link_free_at = start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        slot.link_free_at
    }

    fn write_captures(&mut self, tap: Tap, datagram: &Datagram) {
        for capture in self.captures.iter_mut().filter(|c| c.tap == tap) {
            let Some(writer) = &mut capture.writer else { continue };
            if let Err(e) = writer.write_roce(self.now.since_epoch(), &datagram.envelope, &datagram.payload) {
                capture.error = Some(e);
                capture.writer = None;
            }
        }
    }

    /// Every datagram sent is dropped, delivered (once per copy) or still in flight.
    fn check_books(&self) {
        let c = &self.counters;
        debug_assert_eq!(
            c.sent + c.duplicated,
            c.dropped_total() + c.delivered + self.in_flight.len() as u64,
            "datagrams sent + extra copies = dropped + delivered + in flight"
        );
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        print_hint_if_panicking(self.seed);
    }
}
