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
//! **Bursts.** A QP takes room for a burst of [`BURST`] packets at once, and the last
//! packet of a burst asks for an ACK (AckReq; so does a message's last packet, which ends
//! the burst early), so that a QP waits only when an ACK is on its way for all it has
//! outstanding. When QPs took room packet by packet, the packet that filled the window
//! had to ask for an ACK, and in a full window every packet fills it: with 16 QPs a
//! receiver sent 2.4–4.9 ACKs per 64 KiB message (0.5 with one QP), each costing both
//! sides half a microsecond.
//!
//! **Waiting.** A QP that finds no room for a burst waits in its peer's queue, and the
//! queue's first QP gets the next burst's room as soon as there is, before anyone else:
//! waiters go in the order they began to wait and none starves. A QP with packets no ACK
//! is on its way for (a burst cut short) sends one more packet asking for one, past the
//! window if need be: it never waits for an ACK that will not come.

use core::net::IpAddr;
use std::collections::{BTreeMap, VecDeque};

use slab::Slab;
use softrdma_wire::Qpn;

/// Packets a QP takes room for at once; the last asks for an ACK.
pub(crate) const BURST: u32 = 16;

/// A peer's address as the windows key it: 16 bytes, IPv4 mapped into IPv6. `IpAddr` (17
/// bytes, its tag first) made every copy of a [`PeerRef`] a set of odd-sized moves that the
/// next wider load could not take from the store buffer (`perf annotate` of a 64 B SEND
/// stream's sender: a quarter of `admits`' samples on the load that read such a copy back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Addr(u128);

impl From<IpAddr> for Addr {
    #[inline]
    fn from(ip: IpAddr) -> Self {
        Addr(match ip {
            IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
            IpAddr::V6(v6) => u128::from(v6),
        })
    }
}

/// A peer's window, as a QP's share names it: the address, and where its entry is. The
/// entry is found by its index, not looked up by address on every packet (taking away the
/// three lookups and the GID conversions per packet took 11 % off the engine's
/// instructions for a 64-byte SEND).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerRef {
    addr: Addr,
    index: usize,
}

/// A QP's part in its peer's window.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Share {
    /// The peer it was counted against, and how many packets.
    peer: Option<PeerRef>,
    counted: u32,
    /// The last packet it sent asked for an ACK, which covers every packet before it:
    /// an ACK is on its way for all it has outstanding.
    covered: bool,
    /// The peer in whose queue it waits.
    waiting: Option<PeerRef>,
    /// Packets left of its burst, and the peer whose room they hold.
    burst: u32,
    burst_peer: Option<PeerRef>,
    /// The entry [`PeerWindows::entry`] last found for it, kept while its count is zero
    /// (a ping-pong's count goes 1, 0, 1 with every message, and each time its peer was
    /// looked up by address). Checked before use: an idle entry may have been tidied away
    /// and its slot given to another peer.
    home: Option<PeerRef>,
}

/// One peer's window.
#[derive(Debug)]
struct Peer {
    addr: Addr,
    /// Packets sent and not yet acknowledged.
    outstanding: u32,
    /// Room bursts hold and have not used yet.
    reserved: u32,
    /// QPs waiting for room, in the order they began to wait.
    waiters: VecDeque<Qpn>,
}

impl Peer {
    /// Whether the window of `limit` packets has room for a burst of `burst` beside what
    /// is outstanding and what other bursts hold.
    fn has_room(&self, burst: u32, limit: u32) -> bool {
        self.outstanding + self.reserved + burst <= limit
    }

    /// Nothing counted, held or waiting: the entry may go.
    fn is_idle(&self) -> bool {
        self.outstanding == 0 && self.reserved == 0 && self.waiters.is_empty()
    }
}

/// The windows of every peer, and the QPs waiting for room.
///
/// An entry stays while a share names it (it counts packets, holds room or has a QP
/// waiting), so a share's [`PeerRef`] always finds its entry.
#[derive(Debug, Default)]
pub(crate) struct PeerWindows {
    limit: Option<u32>,
    peers: Slab<Peer>,
    /// Each peer's entry, by address: for a share that names no entry of it yet.
    by_addr: BTreeMap<Addr, usize>,
    /// Room came free (packets acknowledged, or a burst's room given back) while QPs
    /// waited: [`pop_woken`](Self::pop_woken) has work.
    freed: bool,
}

impl PeerWindows {
    pub(crate) fn new(limit: Option<u32>) -> Self {
        Self { limit, ..Self::default() }
    }

    /// A burst: [`BURST`] packets, or the whole window if it is smaller.
    fn burst(&self) -> u32 {
        self.limit.map_or(BURST, |l| BURST.min(l.max(1)))
    }

    /// `addr`'s entry, made if it has none: the one `share` found last if it is still
    /// `addr`'s (no lookup), else found by address. A slot holds at most one entry of an
    /// address, so a slot that holds `addr`'s holds the entry every share names for it.
    #[inline]
    fn entry(&mut self, share: &mut Share, addr: Addr) -> PeerRef {
        if let Some(r) = share.home
            && r.addr == addr
            && self.peers.get(r.index).is_some_and(|p| p.addr == addr)
        {
            return r;
        }
        let r = self.entry_by_addr(addr);
        share.home = Some(r);
        r
    }

    /// [`entry`](Self::entry) for a peer the share did not find last: a lookup, or a new
    /// entry. Apart and cold, so that the common case inlines without this one's frame
    /// (`perf record` of a 64 B SEND stream put an eighth of the sender's samples in
    /// `entry`'s prologue).
    #[cold]
    fn entry_by_addr(&mut self, addr: Addr) -> PeerRef {
        let index = match self.by_addr.get(&addr) {
            Some(&index) => index,
            None => {
                let index = self.peers.insert(Peer { addr, outstanding: 0, reserved: 0, waiters: VecDeque::new() });
                self.by_addr.insert(addr, index);
                index
            }
        };
        PeerRef { addr, index }
    }

    /// Counts `outstanding` packets of a QP (with `share`) against `peer`.
    pub(crate) fn recount(&mut self, share: &mut Share, peer: Option<IpAddr>, outstanding: u32) {
        let peer = peer.map(Addr::from);
        if self.limit.is_none() || (share.peer.map(|r| r.addr) == peer && share.counted == outstanding) {
            return;
        }
        // The common case, once per packet sent or ACK taken: same peer, a new count.
        if let Some(r) = share.peer.filter(|r| Some(r.addr) == peer && outstanding > 0) {
            let p = &mut self.peers[r.index];
            p.outstanding = p.outstanding + outstanding - share.counted;
            self.freed |= outstanding < share.counted && !p.waiters.is_empty();
            share.counted = outstanding;
            return;
        }
        if let Some(old) = share.peer {
            let p = &mut self.peers[old.index];
            p.outstanding -= share.counted;
            let freed = if Some(old.addr) == peer { share.counted.saturating_sub(outstanding) } else { share.counted };
            self.freed |= freed > 0 && !p.waiters.is_empty();
        }
        let new = peer.filter(|_| outstanding > 0).map(|addr| self.entry(share, addr));
        share.peer = new;
        share.counted = if new.is_some() { outstanding } else { 0 };
        if let Some(r) = new {
            self.peers[r.index].outstanding += outstanding;
        }
    }

    /// Forgets `peer`'s entry once nothing is counted, held or waiting for it (when a QP
    /// is destroyed: a peer's entry stays while its QPs live, rather than come and go with
    /// each ACK that empties the window).
    fn tidy(&mut self, r: PeerRef) {
        if self.peers.get(r.index).is_some_and(|p| p.addr == r.addr && p.is_idle()) {
            self.peers.remove(r.index);
            self.by_addr.remove(&r.addr);
        }
    }

    /// Whether a QP with `share` may send one more new packet to `peer`, taking room for a
    /// burst if it has none left: a QP in a burst may; another may if the peer has room
    /// for a burst and nobody waits for it before; one whose last packet asked for no ACK
    /// may send one packet (which will), room or not. Otherwise the QP is to
    /// [`wait`](Self::wait): an ACK is on its way for all it has outstanding. Without that
    /// rule, a QP that had sent without AckReq and then found the window full waited for
    /// its local ACK timeout, again and again (128 QPs in a window of 192 packets: 298 of
    /// 2048 WRITEs failed with RETRY_EXC_ERR in the simulator).
    pub(crate) fn admits(&mut self, share: &mut Share, peer: Option<IpAddr>) -> bool {
        let (Some(limit), Some(addr)) = (self.limit, peer.map(Addr::from)) else { return true };
        if share.burst > 0 && share.burst_peer.is_some_and(|r| r.addr == addr) {
            return true;
        }
        self.release(share);
        let burst = self.burst();
        let r = self.entry(share, addr);
        let p = &mut self.peers[r.index];
        let burst = if p.waiters.is_empty() && p.has_room(burst, limit) {
            burst
        } else if share.counted > 0 && !share.covered {
            1
        } else {
            return false;
        };
        p.reserved += burst;
        share.burst = burst;
        share.burst_peer = Some(r);
        true
    }

    /// Whether the QP holds room for more packets of its burst.
    pub(crate) fn in_burst(share: &Share) -> bool {
        share.burst > 0
    }

    /// Whether the QP's next packet is the last of its burst, and so asks for an ACK.
    pub(crate) fn ends_burst(&self, share: &Share) -> bool {
        self.limit.is_some() && share.burst == 1
    }

    /// The QP sent a new packet, asking for an ACK or not. One that asks ends its burst
    /// (the room left goes back to the peer).
    pub(crate) fn sent(&mut self, share: &mut Share, ack_req: bool) {
        share.covered = ack_req;
        if share.burst > 0 {
            share.burst -= 1;
            if let Some(r) = share.burst_peer {
                self.peers[r.index].reserved -= 1;
            }
        }
        if ack_req || share.burst == 0 {
            self.release(share);
        }
    }

    /// Gives back the room the QP's burst holds and has not used (it asked for an ACK,
    /// stopped sending, or goes to another peer).
    pub(crate) fn release(&mut self, share: &mut Share) {
        if let Some(r) = share.burst_peer.take() {
            let p = &mut self.peers[r.index];
            p.reserved -= share.burst;
            self.freed |= share.burst > 0 && !p.waiters.is_empty();
        }
        share.burst = 0;
    }

    /// QP `qpn` (with `share`) waits for room in `peer`'s window (it was refused by
    /// [`admits`](Self::admits)).
    pub(crate) fn wait(&mut self, qpn: Qpn, share: &mut Share, peer: Option<IpAddr>) {
        let Some(addr) = peer.map(Addr::from) else { return };
        if share.waiting.is_none() {
            let r = self.entry(share, addr);
            share.waiting = Some(r);
            self.peers[r.index].waiters.push_back(qpn);
            // It may have been refused only for those before it, with room there: the
            // next `pop_woken` looks.
            self.freed = true;
        }
    }

    /// The next waiter that now has room: it leaves its queue, and its burst's room is
    /// held for it. Give its share to [`woken`](Self::woken) and schedule it (or, if it
    /// is gone, [`unhold`](Self::unhold) the room).
    pub(crate) fn pop_woken(&mut self) -> Option<(Qpn, PeerRef, u32)> {
        if !std::mem::take(&mut self.freed) {
            return None;
        }
        let burst = self.burst();
        let limit = self.limit?;
        for (index, p) in &mut self.peers {
            if p.waiters.is_empty() || !p.has_room(burst, limit) {
                continue;
            }
            let qpn = p.waiters.pop_front()?;
            p.reserved += burst;
            // Others may have room too: look again.
            self.freed = true;
            return Some((qpn, PeerRef { addr: p.addr, index }, burst));
        }
        None
    }

    /// A woken QP left its queue with `burst` packets of room held at `peer`.
    pub(crate) fn woken(&mut self, share: &mut Share, peer: PeerRef, burst: u32) {
        self.release(share);
        share.waiting = None;
        share.burst = burst;
        share.burst_peer = Some(peer);
    }

    /// Room held for a woken QP that is gone goes back.
    pub(crate) fn unhold(&mut self, peer: PeerRef, burst: u32) {
        let p = &mut self.peers[peer.index];
        p.reserved -= burst;
        self.freed |= !p.waiters.is_empty();
        self.tidy(peer);
    }

    /// QP `qpn` is destroyed: it leaves the count, the queue, and gives back its room.
    pub(crate) fn forget(&mut self, qpn: Qpn, share: &mut Share) {
        let peers = [share.peer, share.burst_peer, share.waiting];
        self.release(share);
        if let Some(r) = share.waiting.take() {
            self.peers[r.index].waiters.retain(|&q| q != qpn);
            // Whoever waited behind it may go now.
            self.freed = true;
        }
        self.recount(share, None, 0);
        for r in peers.into_iter().flatten() {
            self.tidy(r);
        }
    }

    /// Packets outstanding to `peer`.
    #[cfg(test)]
    pub(crate) fn outstanding(&self, peer: IpAddr) -> u32 {
        self.by_addr.get(&Addr::from(peer)).map_or(0, |&i| self.peers[i].outstanding)
    }

    /// Room held by bursts at `peer`.
    #[cfg(test)]
    fn reserved(&self, peer: IpAddr) -> u32 {
        self.by_addr.get(&Addr::from(peer)).map_or(0, |&i| self.peers[i].reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, 2));

    /// `share` sends up to `n` packets to PEER, each asking for an ACK where the requester
    /// would (the burst's last); returns how many it was admitted to send.
    fn send(w: &mut PeerWindows, share: &mut Share, n: u32) -> u32 {
        for i in 0..n {
            if !w.admits(share, Some(PEER)) {
                return i;
            }
            let ack_req = w.ends_burst(share);
            w.sent(share, ack_req);
            let counted = share.counted + 1;
            w.recount(share, Some(PEER), counted);
        }
        n
    }

    fn qpn(n: u32) -> Qpn {
        Qpn::new(n).unwrap()
    }

    #[test]
    fn qps_take_room_in_bursts_that_end_asking_for_an_ack_and_wait_in_turn() {
        let mut w = PeerWindows::new(Some(40));
        let (mut a, mut b, mut c) = (Share::default(), Share::default(), Share::default());
        assert_eq!(send(&mut w, &mut a, BURST), BURST, "a burst");
        assert!(a.covered && a.burst == 0, "its last packet asked for an ACK");
        assert_eq!(send(&mut w, &mut b, 3), 3);
        assert!(!b.covered, "B is in its burst");
        assert_eq!((w.outstanding(PEER), w.reserved(PEER)), (BURST + 3, BURST - 3));
        // 19 outstanding and 13 held by B's burst: no room for another burst of 16.
        assert_eq!(send(&mut w, &mut c, 1), 0, "C, with nothing outstanding, waits");
        w.wait(qpn(0x30), &mut c, Some(PEER));
        assert_eq!(send(&mut w, &mut a, 1), 0, "A, covered, waits behind C");
        w.wait(qpn(0x10), &mut a, Some(PEER));
        assert_eq!(send(&mut w, &mut b, BURST), BURST - 3, "B finishes its burst, and no more");
        assert!(b.covered);
        assert_eq!(w.pop_woken(), None, "nothing acknowledged, nobody woken");
        // A's burst is acknowledged: room for one burst, held for the first waiter.
        w.recount(&mut a, Some(PEER), 0);
        let (q, held, burst) = w.pop_woken().unwrap();
        assert_eq!((q, held.addr, burst), (qpn(0x30), Addr::from(PEER), BURST));
        assert_eq!(w.pop_woken(), None, "room for one burst only");
        w.woken(&mut c, held, burst);
        assert_eq!(send(&mut w, &mut b, 1), 0, "B cannot take it: it is C's");
        w.wait(qpn(0x20), &mut b, Some(PEER));
        assert_eq!(send(&mut w, &mut c, BURST), BURST, "C sends its burst");
        // B's burst is acknowledged: A, which waited first, goes before B.
        w.recount(&mut b, Some(PEER), 0);
        let (q, held, burst) = w.pop_woken().unwrap();
        assert_eq!((q, held.addr, burst), (qpn(0x10), Addr::from(PEER), BURST));
        w.woken(&mut a, held, burst);
        for (q, share) in [(0x10, &mut a), (0x20, &mut b), (0x30, &mut c)] {
            w.forget(qpn(q), share);
        }
        assert_eq!((w.outstanding(PEER), w.reserved(PEER)), (0, 0));
        assert!(w.peers.is_empty() && w.by_addr.is_empty(), "a peer nobody counts, holds or waits for is forgotten");
    }

    #[test]
    fn a_qp_whose_peer_entry_was_forgotten_counts_on_the_new_one_not_on_whoever_took_its_slot() {
        const OTHER: IpAddr = IpAddr::V4(core::net::Ipv4Addr::new(10, 0, 0, 3));
        // A one-packet message to `peer` (AckReq), counted.
        fn message(w: &mut PeerWindows, share: &mut Share, peer: IpAddr) {
            assert!(w.admits(share, Some(peer)));
            w.sent(share, true);
            let counted = share.counted + 1;
            w.recount(share, Some(peer), counted);
        }
        let mut w = PeerWindows::new(Some(40));
        let (mut a, mut b, mut c) = (Share::default(), Share::default(), Share::default());
        // A ping-pongs with PEER: its count goes 1, 0, 1, 0, on the same entry.
        for _ in 0..2 {
            message(&mut w, &mut a, PEER);
            w.recount(&mut a, Some(PEER), 0);
        }
        assert_eq!(w.by_addr.len(), 1, "one entry, not one per message");
        // A idles; B, the last QP counting on PEER, is destroyed: PEER's entry goes, and
        // C's peer takes its slot.
        message(&mut w, &mut b, PEER);
        w.forget(qpn(0x20), &mut b);
        assert!(w.by_addr.is_empty());
        message(&mut w, &mut c, OTHER);
        // A sends to PEER again: counted on a new entry of PEER's, OTHER's untouched.
        message(&mut w, &mut a, PEER);
        assert_eq!((w.outstanding(PEER), w.outstanding(OTHER)), (1, 1));
        w.recount(&mut a, Some(PEER), 0);
        assert_eq!((w.outstanding(PEER), w.outstanding(OTHER)), (0, 1));
    }

    #[test]
    fn a_message_that_ends_early_gives_back_the_rest_of_its_burst() {
        let mut w = PeerWindows::new(Some(40));
        let mut a = Share::default();
        assert!(w.admits(&mut a, Some(PEER)));
        w.sent(&mut a, true); // a one-packet message: AckReq
        w.recount(&mut a, Some(PEER), 1);
        assert_eq!((w.outstanding(PEER), w.reserved(PEER), a.burst), (1, 0, 0));
    }

    #[test]
    fn a_burst_cut_short_leaves_a_qp_one_packet_that_asks_for_an_ack_room_or_not() {
        let mut w = PeerWindows::new(Some(20));
        let (mut a, mut b) = (Share::default(), Share::default());
        assert_eq!(send(&mut w, &mut b, 2), 2);
        w.release(&mut b); // B stopped mid-burst (left RTS, say): uncovered
        assert_eq!(send(&mut w, &mut a, BURST), BURST);
        assert!(w.admits(&mut b, Some(PEER)), "no room for a burst, but B is owed an ACK");
        assert!(w.ends_burst(&b), "so it sends one packet that asks for one");
    }

    #[test]
    fn a_woken_qp_that_is_gone_gives_its_room_to_the_next() {
        let mut w = PeerWindows::new(Some(20));
        let (mut a, mut b, mut c) = (Share::default(), Share::default(), Share::default());
        assert_eq!(send(&mut w, &mut a, BURST), BURST);
        for (q, share) in [(0x20, &mut b), (0x30, &mut c)] {
            assert!(!w.admits(share, Some(PEER)));
            w.wait(qpn(q), share, Some(PEER));
        }
        w.recount(&mut a, Some(PEER), 0);
        let (q, peer, burst) = w.pop_woken().unwrap();
        assert_eq!(q, qpn(0x20));
        w.unhold(peer, burst); // B was destroyed meanwhile
        let (q, held, burst) = w.pop_woken().unwrap();
        assert_eq!((q, held.addr, burst), (qpn(0x30), Addr::from(PEER), BURST));
    }

    #[test]
    fn no_limit_admits_everything() {
        let mut w = PeerWindows::new(None);
        let mut a = Share::default();
        w.recount(&mut a, Some(PEER), 1 << 20);
        assert!(w.admits(&mut a, Some(PEER)));
        assert!(!w.ends_burst(&a));
        assert_eq!(w.outstanding(PEER), 0);
    }
}
