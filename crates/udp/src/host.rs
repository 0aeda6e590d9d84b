//! Many processes, one host: the steering program of a device's reuseport group.

#[allow(dead_code)] // used by the coordinator, which comes next
mod steer;

/// QPN bits below the slot: a slot owns `1 << 13` QPNs.
pub const QPN_SLOT_BITS: u32 = 13;
/// Comm ID / SIDR request ID bits below the slot.
pub const COMM_ID_COUNTER_BITS: u32 = 21;
/// Slots are `1..MAX_SLOTS`.
pub const MAX_SLOTS: u32 = 2048;
