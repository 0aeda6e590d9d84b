//! Virtual time.
//!
//! The fabric owns the only clock there is: a count of nanoseconds since the simulation
//! started, advanced by the fabric from one event to the next and never by the wall clock.
//! Nodes receive it as `now` on every call. It is the engine's and the CM's `Instant`
//! ([`softrdma_wire::time`]), so nodes pass it on as it is.

pub use softrdma_wire::time::Instant as Time;
pub(crate) use softrdma_wire::time::duration_nanos;
