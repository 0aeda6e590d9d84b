//! What the fabric drives: a sans-IO endpoint that owns some IP addresses.

use std::net::IpAddr;

use softrdma_wire::Envelope;

use crate::time::Time;

/// The largest UDP payload a node can hand to the fabric in one datagram (IPv6 without
/// jumbograms; IPv4 allows 20 bytes less). The buffer given to
/// [`poll_transmit`](Node::poll_transmit) is this long; the fabric's MTU check
/// ([`Config::max_udp_payload`](crate::Config::max_udp_payload)) usually refuses much less.
pub const MAX_UDP_PAYLOAD: usize = 65_527;

/// A sans-IO endpoint on the fabric: a softrdma device (through an adapter), a hand-written
/// peer, an attacker.
///
/// The fabric calls it the way a runtime calls quinn-proto's `Connection`, on one thread and
/// with virtual time:
///
/// - inputs: [`handle_datagram`](Self::handle_datagram) for each datagram addressed to one of
///   its [`addresses`](Self::addresses), [`handle_timeout`](Self::handle_timeout) once
///   [`poll_timeout`](Self::poll_timeout) has come;
/// - outputs: after every input, and at the start of every step (to pick up work a test
///   started between steps, e.g. by posting a send), [`poll_transmit`](Self::poll_transmit)
///   until it returns `None` or
///   [`Config::max_transmits_per_step`](crate::Config::max_transmits_per_step) runs out;
///   [`poll_timeout`](Self::poll_timeout) before every step.
///
/// `now` never goes backwards. A node that still reports a timeout at or before `now` after
/// `handle_timeout(now)` is called again at the same instant, and a node that never stops
/// doing so makes the run fail with [`SimErrorKind::StepLimit`](crate::SimErrorKind).
pub trait Node {
    /// The IP addresses this node owns: datagrams to them are delivered to it. Read once,
    /// when the node joins the fabric.
    fn addresses(&self) -> Vec<IpAddr>;

    /// One datagram has arrived: its IP/UDP fields (`envelope`, which the ICRC covers) and its
    /// UDP payload, possibly corrupted by the fabric's fault rules.
    fn handle_datagram(&mut self, now: Time, envelope: &Envelope, payload: &[u8]);

    /// [`handle_datagram`](Self::handle_datagram) for a datagram a switch port marked
    /// Congestion Experienced (`ce`: its IP header's ECN field reads 0b11). The default
    /// ignores the mark.
    fn handle_datagram_marked(&mut self, now: Time, envelope: &Envelope, payload: &[u8], ce: bool) {
        let _ = ce;
        self.handle_datagram(now, envelope, payload);
    }

    /// The time reported by [`poll_timeout`](Self::poll_timeout) has come.
    fn handle_timeout(&mut self, now: Time);

    /// The next datagram to send, if any: writes its UDP payload into the start of `buf`
    /// ([`MAX_UDP_PAYLOAD`] bytes long) and returns its envelope and length. The envelope's
    /// source address need not be one of the node's own (spoofing is allowed, and useful in
    /// tests of what a receiver accepts).
    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(Envelope, usize)>;

    /// When the node next wants [`handle_timeout`](Self::handle_timeout), if ever.
    fn poll_timeout(&self) -> Option<Time>;
}
