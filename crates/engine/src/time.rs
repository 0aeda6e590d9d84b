//! Time as the engine sees it: a number the caller passes in.
//!
//! The engine never reads a clock. Every input carries `now`, and the engine answers with
//! the next instant it wants to be called back ([`Engine::poll_timeout`](crate::Engine)).
//! A simulator drives it with virtual time (the same type: `softrdma_sim::Time`), the
//! runtime with a monotonic clock.

pub use softrdma_wire::time::Instant;
