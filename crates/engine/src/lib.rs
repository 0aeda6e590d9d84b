//! # softrdma-engine (being written)
#![forbid(unsafe_code)]

pub mod qp_state;
pub mod time;

pub use time::Instant;
