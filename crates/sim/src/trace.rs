//! What the fabric records: counters, a trace of every datagram's fate, and pcap captures.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use softrdma_wire::{Opcode, Psn};

use crate::time::Time;

/// Why a datagram did not reach its destination.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum DropReason {
    /// Its UDP payload exceeds [`Config::max_udp_payload`](crate::Config::max_udp_payload).
    Mtu,
    /// No node owns its destination address.
    NoRoute,
    /// [`Config::max_in_flight`](crate::Config::max_in_flight) datagrams were already in
    /// flight.
    QueueFull,
    /// A fault rule dropped it; the rule's [`name`](crate::Rule::name).
    Rule(&'static str),
    /// The switch port toward its destination had no room ([`SwitchPort`](crate::SwitchPort)).
    PortFull,
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DropReason::Mtu => f.write_str("mtu"),
            DropReason::NoRoute => f.write_str("no-route"),
            DropReason::QueueFull => f.write_str("queue-full"),
            DropReason::Rule(name) => f.write_str(name),
            DropReason::PortFull => f.write_str("port-full"),
        }
    }
}

/// One byte changed on the way: `payload[index] ^= xor`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Corruption {
    /// Offset in the UDP payload.
    pub index: usize,
    /// The bits flipped (never zero).
    pub xor: u8,
}

/// What happened to a datagram, decided when it entered the network.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Fate {
    /// It was lost.
    Dropped(DropReason),
    /// It was (or, while the run lasts, will be) delivered, once per arrival time.
    Delivered {
        /// When each copy arrives, in the order the copies were scheduled.
        arrivals: Vec<Time>,
        /// The bytes changed on the way, the same in every copy.
        corruptions: Vec<Corruption>,
    },
}

/// One datagram that entered the network.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct TraceEntry {
    /// Its number (see [`Datagram::id`](crate::Datagram::id)).
    pub id: u64,
    /// When it entered the network.
    pub sent_at: Time,
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// Length of its UDP payload.
    pub len: usize,
    /// Its BTH opcode, if it has a BTH.
    pub opcode: Option<Opcode>,
    /// Its BTH PSN, if it has a BTH.
    pub psn: Option<Psn>,
    /// What happened to it.
    pub fate: Fate,
}

/// One line: `0.000005000s #3 10.0.0.1 -> 10.0.0.2 UD_SEND_ONLY psn=7 len=40 delivered@0.000010000s`.
impl fmt::Display for TraceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{} {} -> {}", self.sent_at, self.id, self.src, self.dst)?;
        if let Some(op) = self.opcode {
            write!(f, " {op}")?;
        }
        if let Some(psn) = self.psn {
            write!(f, " psn={}", psn.value())?;
        }
        write!(f, " len={}", self.len)?;
        match &self.fate {
            Fate::Dropped(reason) => write!(f, " dropped({reason})"),
            Fate::Delivered { arrivals, corruptions } => {
                for at in arrivals {
                    write!(f, " delivered@{at}")?;
                }
                for c in corruptions {
                    write!(f, " corrupt[{}]^={:#04x}", c.index, c.xor)?;
                }
                Ok(())
            }
        }
    }
}

/// What the fabric counted since it was created.
///
/// Every datagram is counted once in `sent`; then either once in `dropped`, or in
/// `delivered` once per copy (extra copies are also counted in `duplicated`) or, until it
/// arrives, in flight. [`Fabric::counters`](crate::Fabric::counters) checks that the books
/// balance.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Counters {
    /// Datagrams that entered the network (from nodes and [injected](crate::Fabric::inject)).
    pub sent: u64,
    /// Copies handed to a node's `handle_datagram`.
    pub delivered: u64,
    /// Datagrams lost, by reason.
    pub dropped: BTreeMap<DropReason, u64>,
    /// Extra copies made by [`Verdict::Duplicate`](crate::Verdict::Duplicate).
    pub duplicated: u64,
    /// Datagrams with at least one byte changed by [`Verdict::Corrupt`](crate::Verdict::Corrupt).
    pub corrupted: u64,
    /// Datagrams held back by [`Verdict::Delay`](crate::Verdict::Delay).
    pub delayed: u64,
    /// Times a node still had datagrams to send when [`Config::max_transmits_per_step`](crate::Config::max_transmits_per_step)
    /// ran out.
    pub transmit_budget_exhausted: u64,
    /// Steps taken.
    pub steps: u64,
    /// Copies delivered marked Congestion Experienced by a switch port.
    pub marked: u64,
}

impl Counters {
    /// Datagrams lost, whatever the reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }

    /// Datagrams lost for `reason`.
    pub fn dropped_by(&self, reason: DropReason) -> u64 {
        self.dropped.get(&reason).copied().unwrap_or(0)
    }
}

/// Where a capture taps the network.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Tap {
    /// Every datagram as it entered the network, when it entered, dropped ones included:
    /// what a capture on the sender's link would see. Bytes are as sent, before corruption;
    /// a duplicated datagram appears once. Only datagrams too large for the MTU are missing
    /// (they never reach the wire).
    Sent,
    /// Every copy as it was delivered, when it was delivered: what a capture on the
    /// receiver's link would see. Corrupted bytes are shown corrupted; dropped datagrams do
    /// not appear.
    Delivered,
}
