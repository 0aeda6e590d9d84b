//! The MAD and CM message carried by a UD packet (QP1 traffic), for `softrdma decode`.

use std::fmt;

use serde::Serialize;

/// A MAD as shown by the decoder.
#[derive(Serialize, Debug)]
pub(crate) struct Mad {}

impl Mad {
    pub(crate) fn write_text(&self, _s: &mut String) -> fmt::Result {
        Ok(())
    }
}

/// Reads the MAD in a UD payload, if the payload is one (256 bytes).
pub(crate) fn decode(_payload: &[u8]) -> Option<Mad> {
    None
}
