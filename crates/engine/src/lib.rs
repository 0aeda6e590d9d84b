//! # softrdma-engine
//!
//! A software RDMA device, sans-IO: the objects of the verbs API (protection domains, memory
//! regions, completion queues, shared receive queues, address handles, queue pairs of type
//! RC, UC and UD), the QP state machine, and the RoCEv2 protocol engine behind them
//! (requester, responder, completer, RC reliability with go-back-N, RNR and local ACK
//! timeouts). It speaks through [`softrdma_wire`] and never does I/O: see [`Engine`] for
//! the calling contract.
#![forbid(unsafe_code)]

pub mod auth;
mod completer;
pub mod congestion;
pub mod direct;
mod engine;
pub mod identification;
pub mod inspect;
pub mod memory;
mod qp;
pub mod qp_state;
pub mod reference;
mod responder;
mod sgl;
pub mod time;
mod transmit;
pub mod verbs;
pub mod window;

pub use auth::PacketKeys;
pub use direct::{AtomicGrant, DirectAtomic, DirectOp};
pub use engine::{AckBeside, Counters, DeviceConfig, Engine, Transmit, udp_source_port};
pub use identification::IcrcCheck;
pub use inspect::{CqInfo, MrInfo, QpCounters, QpInfo, QpPeer, SrqInfo};
pub use memory::{Memory, MemoryFault, VecMemory};
pub use responder::{IpInfo, grh_for};
pub use time::Instant;
pub use verbs::*;
