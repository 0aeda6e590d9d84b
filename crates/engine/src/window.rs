//! One window per peer host, shared by every RC QP that sends to it.
//!
//! Each RC requester stops [`MAX_UNACKED_PSNS`](crate::transmit::MAX_UNACKED_PSNS) (128)
//! packets ahead of its oldest ACK, as rxe does. A NIC on a lossless fabric can let every
//! QP do so; a UDP socket cannot: 128 QPs writing 64 KiB messages to one peer put 16 384
//! packets (64 MiB) on the way to a receive buffer of a few MiB, and most of them were
//! dropped and resent (`softrdma perf write bw -q 128`: 245 000 packets resent in 2 s).
//! So the device also counts, per peer address, the packets its RC QPs have sent and not
//! yet seen acknowledged, and a QP that would go past
//! [`DeviceConfig::peer_window`](crate::DeviceConfig::peer_window) waits for an ACK: a QP's
//! share of the peer falls as more QPs send to it, and a QP alone keeps its whole window.
//!
//! A QP with nothing outstanding may always send a packet, so none starves; a QP waits
//! only when an ACK is on its way for all it has outstanding (the packet that fills the
//! window asks for one); waiters are woken in the order they began to wait, one per packet
//! acknowledged.

use core::net::IpAddr;
use std::collections::{BTreeMap, VecDeque};

use softrdma_wire::Qpn;

/// A QP's part in its peer's window.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Share {
    /// The peer it was counted against, and how many packets.
    peer: Option<IpAddr>,
    counted: u32,
    /// The last packet it sent asked for an ACK, which covers every packet before it:
    /// an ACK is on its way for all it has outstanding.
    covered: bool,
    /// In the waiters' queue.
    waiting: bool,
}

/// The windows of every peer, and the QPs waiting for room.
#[derive(Debug, Default)]
pub(crate) struct PeerWindows {
    limit: Option<u32>,
    outstanding: BTreeMap<IpAddr, u32>,
    waiters: VecDeque<Qpn>,
    /// Packets acknowledged since the waiters were last woken.
    freed: u32,
}

impl PeerWindows {
    pub(crate) fn new(limit: Option<u32>) -> Self {
        Self { limit, ..Self::default() }
    }

    /// Counts `outstanding` packets of a QP (with `share`) against `peer`.
    pub(crate) fn recount(&mut self, share: &mut Share, peer: Option<IpAddr>, outstanding: u32) {
        if self.limit.is_none() || (share.peer == peer && share.counted == outstanding) {
            return;
        }
        // The common case, once per packet sent or ACK taken: same peer, a new count.
        if let (Some(p), true, true) = (peer, share.peer == peer, outstanding > 0) {
            let total = self.outstanding.entry(p).or_default();
            *total = *total + outstanding - share.counted;
            if outstanding < share.counted && !self.waiters.is_empty() {
                self.freed += share.counted - outstanding;
            }
            share.counted = outstanding;
            return;
        }
        if let Some(old) = share.peer {
            let total = self.outstanding.entry(old).or_default();
            *total -= share.counted;
            if *total == 0 {
                self.outstanding.remove(&old);
            }
            let freed = if share.peer == peer { share.counted.saturating_sub(outstanding) } else { share.counted };
            if !self.waiters.is_empty() {
                self.freed += freed;
            }
        }
        share.peer = peer.filter(|_| outstanding > 0);
        share.counted = if share.peer.is_some() { outstanding } else { 0 };
        if let Some(p) = share.peer {
            *self.outstanding.entry(p).or_default() += outstanding;
        }
    }

    /// Whether a QP with `share` may send one more new packet to `peer`: if there is
    /// room, or it has nothing outstanding, or no ACK is on its way for what it has (then
    /// this packet, which fills the window, asks for one: [`fills`](Self::fills)). A QP
    /// thus waits only for an ACK that will come: without that rule, one that sent a
    /// packet without AckReq while there was room and then found the window full waited
    /// for its local ACK timeout, again and again (128 QPs in a window of 192 packets:
    /// 298 of 2048 WRITEs failed with RETRY_EXC_ERR in the simulator).
    pub(crate) fn admits(&self, share: &Share, peer: Option<IpAddr>) -> bool {
        let (Some(limit), Some(peer)) = (self.limit, peer) else { return true };
        share.counted == 0 || !share.covered || self.outstanding.get(&peer).copied().unwrap_or(0) < limit
    }

    /// The QP sent a new packet, asking for an ACK or not.
    pub(crate) fn sent(share: &mut Share, ack_req: bool) {
        share.covered = ack_req;
    }

    /// Whether one more packet to `peer` fills its window. That packet asks for an ACK
    /// (AckReq): otherwise the QPs could all wait for room with packets outstanding that no
    /// ACK will ever cover until a local ACK timeout.
    pub(crate) fn fills(&self, peer: Option<IpAddr>) -> bool {
        let (Some(limit), Some(peer)) = (self.limit, peer) else { return false };
        self.outstanding.get(&peer).copied().unwrap_or(0) + 1 >= limit
    }

    /// QP `qpn` (with `share`) waits for room.
    pub(crate) fn wait(&mut self, qpn: Qpn, share: &mut Share) {
        if !share.waiting {
            share.waiting = true;
            self.waiters.push_back(qpn);
        }
    }

    /// The next waiter to wake: one per packet acknowledged while it waited. Give its
    /// share to [`left`](Self::left) and schedule it.
    pub(crate) fn pop_woken(&mut self) -> Option<Qpn> {
        if self.freed == 0 {
            return None;
        }
        self.freed -= 1;
        let qpn = self.waiters.pop_front();
        if self.waiters.is_empty() {
            self.freed = 0;
        }
        qpn
    }

    /// A woken QP left the queue.
    pub(crate) fn left(share: &mut Share) {
        share.waiting = false;
    }

    /// QP `qpn` is destroyed: it leaves the count and the queue.
    pub(crate) fn forget(&mut self, qpn: Qpn, share: &mut Share) {
        self.recount(share, None, 0);
        self.waiters.retain(|&q| q != qpn);
    }

    /// Packets outstanding to `peer`.
    #[cfg(test)]
    pub(crate) fn outstanding(&self, peer: IpAddr) -> u32 {
        self.outstanding.get(&peer).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn qps_share_a_peer_and_wake_in_turn() {
        let mut w = PeerWindows::new(Some(10));
        let (mut a, mut b) = (Share::default(), Share::default());
        w.recount(&mut a, Some(PEER), 8);
        assert!(w.admits(&b, Some(PEER)), "a QP under its minimum share is always admitted");
        w.recount(&mut b, Some(PEER), 4);
        assert_eq!(w.outstanding(PEER), 12);
        // Full: B's last packet asked for no ACK, so it may send one more (which will);
        // A's did, so A waits.
        PeerWindows::sent(&mut a, true);
        PeerWindows::sent(&mut b, false);
        assert!(w.fills(Some(PEER)));
        assert!(!w.admits(&a, Some(PEER)) && w.admits(&b, Some(PEER)));
        PeerWindows::sent(&mut b, true);
        assert!(!w.admits(&b, Some(PEER)));
        w.wait(Qpn::new(0x20).unwrap(), &mut b);
        w.wait(Qpn::new(0x20).unwrap(), &mut b);
        w.wait(Qpn::new(0x10).unwrap(), &mut a);
        assert_eq!(w.pop_woken(), None, "nothing acknowledged, nobody woken");
        // A's oldest packet is acknowledged: one waiter, the first, wakes.
        w.recount(&mut a, Some(PEER), 7);
        assert_eq!(w.pop_woken(), Some(Qpn::new(0x20).unwrap()));
        assert_eq!(w.pop_woken(), None);
        PeerWindows::left(&mut b);
        // A goes to ERR: its packets leave the count, the other waiter wakes.
        w.recount(&mut a, Some(PEER), 0);
        assert_eq!(w.outstanding(PEER), 4);
        assert_eq!(w.pop_woken(), Some(Qpn::new(0x10).unwrap()));
        assert_eq!(w.pop_woken(), None, "no waiter left");
        w.forget(Qpn::new(0x20).unwrap(), &mut b);
        assert_eq!(w.outstanding(PEER), 0);
    }

    #[test]
    fn no_limit_admits_everything() {
        let mut w = PeerWindows::new(None);
        let mut a = Share::default();
        w.recount(&mut a, Some(PEER), 1 << 20);
        assert!(w.admits(&a, Some(PEER)));
        assert_eq!(w.outstanding(PEER), 0);
    }
}
