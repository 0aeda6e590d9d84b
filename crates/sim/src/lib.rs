//! # softrdma-sim
//!
//! A deterministic network for testing RoCEv2 endpoints: a virtual clock, one seed from
//! which every random decision derives, fault rules that drop, duplicate, delay (reorder),
//! corrupt and partition, and a pcap of everything that crossed it. The models are turmoil
//! (the harness owns time; packet fate is a chain of rules), TigerBeetle's VOPR (one seed
//! replays a run; fault parameters are themselves drawn from the seed; heal, then demand
//! convergence) and smoltcp's fault-injecting device.
//!
//! - [`Node`]: the sans-IO endpoint the fabric drives (`handle_datagram`, `handle_timeout`,
//!   `poll_transmit`, `poll_timeout`). A softrdma device plugs in through an adapter.
//! - [`Fabric`]: owns the nodes, the clock and the datagrams in flight; [`Fabric::step`] and
//!   the `run_*` methods move time; every loop is bounded in steps and in virtual time.
//! - [`Rule`] and [`Verdict`]: the fault chain. Built in: [`Loss`], [`Duplicate`],
//!   [`Reorder`], [`Corrupt`], [`Partition`], [`Match`] (target packets by opcode, PSN, ...);
//!   any closure `FnMut(&Datagram) -> Verdict`; [`Scope`] restricts a rule to a direction;
//!   [`FaultConfig::random`] draws a whole bad network from the seed; [`FaultSpec`] parses one
//!   from words (`loss 5%; reorder 10% 200us`), as softrdma's `SOFTRDMA_FAULTS` does; [`Chain`]
//!   asks the rules, in the fabric and in softrdma's runtime alike.
//! - [`Counters`], [`TraceEntry`] and [`Fabric::capture`]: what happened.
//! - [`seed_from_env_or`], [`swarm`], [`SeedGuard`]: `SOFTRDMA_SEED=0x...` replays a failure;
//!   every failure prints that line.
//!
//! ```
//! use std::net::IpAddr;
//! use std::time::Duration;
//! use softrdma_sim::{Fabric, Loss, Node, Time, seed_from_env_or};
//! use softrdma_wire::Envelope;
//!
//! /// Sends one datagram to its peer at start, counts what it receives.
//! struct Hello { me: IpAddr, peer: IpAddr, pending: bool, received: u32 }
//!
//! impl Node for Hello {
//!     fn addresses(&self) -> Vec<IpAddr> { vec![self.me] }
//!     fn handle_datagram(&mut self, _: Time, _: &Envelope, _: &[u8]) { self.received += 1 }
//!     fn handle_timeout(&mut self, _: Time) {}
//!     fn poll_transmit(&mut self, _: Time, buf: &mut [u8]) -> Option<(Envelope, usize)> {
//!         if !std::mem::take(&mut self.pending) { return None }
//!         buf[..5].copy_from_slice(b"hello");
//!         Some((Envelope::rocev2(self.me, 0xc000, self.peer)?, 5))
//!     }
//!     fn poll_timeout(&self) -> Option<Time> { None }
//! }
//!
//! let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
//! let mut sim = Fabric::new(seed_from_env_or(0x5eed));
//! let na = sim.add_node(Hello { me: a, peer: b, pending: true, received: 0 });
//! let nb = sim.add_node(Hello { me: b, peer: a, pending: true, received: 0 });
//! sim.add_rule(Loss::new(0.0));
//! let idle_at = sim.run_until_idle(Duration::from_millis(1)).unwrap();
//! assert_eq!(idle_at, Time::from_micros(5)); // the default one-way latency
//! assert_eq!(sim.node::<Hello>(na).received, 1);
//! assert_eq!(sim.node::<Hello>(nb).received, 1);
//! assert_eq!(sim.counters().delivered, 2);
//! ```
#![forbid(unsafe_code)]

mod fabric;
mod fault;
mod node;
mod rng;
mod seed;
mod spec;
mod time;
mod trace;

pub use fabric::{Config, Fabric, NodeId, Red, RuleId, SimError, SimErrorKind, SwitchPort};
pub use fault::{
    Chain, Corrupt, Datagram, Delay, Duplicate, FaultConfig, Flap, Loss, MAX_COPIES, Match, Named, OpClass, Partition,
    Plan, RateLimit, Reorder, Rule, RuleExt, Scope, Scoped, Verdict,
};
pub use node::{MAX_UDP_PAYLOAD, Node};
pub use rng::SimRng;
pub use seed::{
    SEED_ENV, SEEDS_ENV, SeedGuard, SwarmFailure, parse_seed, reproduce_hint, seed_from_env_or, swarm, swarm_seed,
    try_swarm,
};
pub use softrdma_pcap::CaptureError;
pub use softrdma_wire::Envelope;
pub use spec::{DEFAULT_RATE_QUEUE, DEFAULT_REORDER_DELAY, FaultKind, FaultRule, FaultSpec};
pub use time::Time;
pub use trace::{Corruption, Counters, DropReason, Fate, Tap, TraceEntry};
