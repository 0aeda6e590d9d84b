//! The receive side of the ICRC over IPv4: with which identification was a packet sent?
//!
//! The ICRC covers the IPv4 identification, and a UDP socket never shows it to its
//! receiver. softrdma sends 0 (an unconnected socket with `IP_PMTUDISC_DO`), and segment
//! *i* of a GSO send *i*; kernel rxe and NICs send a changing one. Linux gives rxe's
//! packets `__ip_select_ident`'s: one counter per (source, destination, protocol) bucket,
//! one step per packet, and after the bucket idled for *n* jiffies a random jump of less
//! than *n* (`ip_idents_reserve`). So every packet is checked in up to three ways, and
//! counted by the one that accepted it:
//!
//! | path | accepted when | a corrupted packet gets through with probability |
//! |---|---|---|
//! | **exact** | the ICRC matches the envelope's identification: 0, or a same-host GSO segment's index (and every IPv6 packet) | 2^-32 (and none with up to 3 flipped bits) |
//! | **predicted** | the identification that explains the ICRC ([`Ipv4IdentificationDeltas::solve`]) is at most [`WINDOW`] plus one per millisecond since this peer's last packet after its last one | (64 + ms)·2^-32: 2^-26 for a busy peer |
//! | **solved** | some identification explains the ICRC, and the peer is not [trusted](TRUST) | 2^-16 for a random mismatch; see below |
//!
//! The solved path is the weak one, and weaker against some errors than others: an error
//! `e` at bit distance `d` after the identification passes when `e·x^d mod P` is itself an
//! identification's pattern. Measured (`tests/identification.rs`): 1 to 8 random bytes
//! corrupted in packets under 300 bytes pass at 2.4 to 2.8 × 2^-16; of all 268 005
//! single-byte errors of a 1 KiB packet, 15 pass, all at byte 93 of the UDP payload (15 of
//! its 255 masks form a subspace that an identification explains). From a trusted peer
//! none of them passed, nor any of 2^20 random corruptions.
//!
//! A peer becomes trusted at its first exact packet (a softrdma peer, whose packets are all
//! exact), or after [`TRUST`] packets in a row that were predicted (a steady rxe peer after
//! its first few packets): from then on, an
//! identification outside its window is not believed at once. Such a packet is dropped
//! (counted bad) and remembered; the next one in sequence with it is accepted (solved) and
//! the peer follows the new sequence. A sender whose counter jumps further than Linux's
//! can loses one packet per jump, which RC retransmits; a sender whose identifications are
//! random never becomes trusted, and every packet of it keeps the 2^-16 of the solved path.
//!
//! Bounded: [`PEERS`] peers in a table indexed by a hash of the addresses (a newcomer
//! takes its slot from whoever had it, who starts untrusted again), and an
//! [`Ipv4IdentificationCache`] of maps by packet length.

use core::net::Ipv4Addr;

use softrdma_wire::icrc::{IcrcPrefixCache, Ipv4Envelope, Ipv4IdentificationCache};
use softrdma_wire::{Envelope, RocePacket};

use crate::Instant;

/// Identifications after a peer's last one that count as predicted, besides one per
/// millisecond of silence: packets lost on the way, and the peer's other UDP traffic to
/// this address, which shares its counter.
pub const WINDOW: u16 = 64;
/// Packets in a row, exact or predicted, after which a peer is trusted.
pub const TRUST: u8 = 8;
/// Peers remembered.
pub const PEERS: usize = 64;

/// How a received packet's ICRC was accepted, or that it was not.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum IcrcCheck {
    /// It matched the envelope as given.
    Exact,
    /// It matched an identification the receiver expected from this peer.
    Predicted(u16),
    /// It matched an identification the receiver did not expect from this peer.
    Solved(u16),
    /// It matched no identification, or one that a trusted peer should not have sent
    /// (the packet is dropped).
    Bad,
}

#[derive(Clone, Copy, Debug)]
struct Peer {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    last: u16,
    at: Instant,
    /// Exact or predicted packets in a row, up to [`TRUST`].
    streak: u8,
    /// An identification out of a trusted peer's window, dropped: the next packet in
    /// sequence with it moves the peer there.
    pending: Option<(u16, Instant)>,
}

/// The per-peer state of the IPv4 identification check. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Identifications {
    peers: [Option<Peer>; PEERS],
    maps: Ipv4IdentificationCache,
    /// The ICRC's envelope part, by envelope and length (a flow's packets share one).
    prefixes: IcrcPrefixCache,
}

impl Default for Identifications {
    fn default() -> Self {
        Self { peers: [None; PEERS], maps: Ipv4IdentificationCache::default(), prefixes: IcrcPrefixCache::default() }
    }
}

/// Whether `id` follows `last` within the window `since` a packet at `then` allows.
fn follows(id: u16, last: u16, then: Instant, now: Instant) -> bool {
    let millis = u16::try_from((now - then).as_millis()).unwrap_or(u16::MAX);
    let step = id.wrapping_sub(last);
    step != 0 && step <= WINDOW.saturating_add(millis)
}

impl Identifications {
    /// Checks the ICRC of `packet` (at least [`softrdma_wire::roce::MIN_LEN`] bytes)
    /// received inside `envelope` at `now`. Returns the verdict and the envelope the packet
    /// was sent in (with the identification found).
    pub(crate) fn check(
        &mut self,
        now: Instant,
        envelope: &Envelope,
        packet: &RocePacket<&[u8]>,
    ) -> (IcrcCheck, Envelope) {
        let covered = packet.icrc_covered();
        let Envelope::V4(e) = envelope else {
            let computed = self.prefixes.compute(envelope, covered);
            let verdict = if computed == packet.icrc() { IcrcCheck::Exact } else { IcrcCheck::Bad };
            return (verdict, *envelope);
        };
        // The ICRC for identification 0, and the guess's part XORed in after (the CRC is
        // affine in the identification): the prefix cache then holds one entry per flow
        // and length, where one per identification missed on every segment of a GSO train
        // after the fourth (each segment has its own).
        let zero = Envelope::V4(Ipv4Envelope { identification: 0, ..*e });
        let syndrome = self.prefixes.compute(&zero, covered) ^ packet.icrc();
        let guessed = if e.identification == 0 { 0 } else { self.maps.get(covered.len()).delta(e.identification) };
        let slot = &mut self.peers[slot_of(e.src, e.dst)];
        let peer = slot.filter(|p| p.src == e.src && p.dst == e.dst);
        if syndrome == guessed {
            // An exact match is the sender's own identification (2^-32 for a corrupted
            // packet): a softrdma peer, which sends exact packets only, is trusted at once,
            // so that its corrupted packets never meet the solved path's 2^-16 after its
            // first one.
            *slot =
                Some(Peer { src: e.src, dst: e.dst, last: e.identification, at: now, streak: TRUST, pending: None });
            return (IcrcCheck::Exact, *envelope);
        }
        let Some(id) = self.maps.get(covered.len()).solve(syndrome) else {
            return (IcrcCheck::Bad, *envelope);
        };
        let found = Envelope::V4(Ipv4Envelope { identification: id, ..*e });
        let fresh = |streak| Some(Peer { src: e.src, dst: e.dst, last: id, at: now, streak, pending: None });
        match peer {
            Some(p) if follows(id, p.last, p.at, now) => {
                *slot = fresh(p.streak.saturating_add(1).min(TRUST));
                (IcrcCheck::Predicted(id), found)
            }
            Some(p) if p.streak >= TRUST => {
                if p.pending.is_some_and(|(pending, at)| follows(id, pending, at, now)) {
                    *slot = fresh(TRUST);
                    (IcrcCheck::Solved(id), found)
                } else {
                    *slot = Some(Peer { pending: Some((id, now)), ..p });
                    (IcrcCheck::Bad, *envelope)
                }
            }
            _ => {
                *slot = fresh(0);
                (IcrcCheck::Solved(id), found)
            }
        }
    }
}

fn slot_of(src: Ipv4Addr, dst: Ipv4Addr) -> usize {
    let key = u32::from(src) ^ u32::from(dst).rotate_left(16);
    (key.wrapping_mul(0x9e37_79b1) >> 26) as usize % PEERS
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn envelope(id: u16) -> Envelope {
        Envelope::V4(Ipv4Envelope {
            src: Ipv4Addr::new(198, 18, 0, 2),
            dst: Ipv4Addr::new(198, 18, 0, 3),
            identification: id,
            dont_fragment: true,
            src_port: 0xc0de,
            dst_port: 4791,
        })
    }

    /// An RC SEND_ONLY of `len` payload bytes with its ICRC for identification `id`.
    fn packet(id: u16, len: usize) -> std::vec::Vec<u8> {
        let mut p = std::vec![0u8; 12 + len + 4];
        p[..12].copy_from_slice(&[0x04, 0, 0xff, 0xff, 0, 0, 0, 0x12, 0x80, 0, 0, 1]);
        for (i, b) in p[12..12 + len].iter_mut().enumerate() {
            *b = (i * 7 + usize::from(id)) as u8;
        }
        RocePacket::new_unchecked(&mut p[..]).fill_icrc(&envelope(id));
        p
    }

    fn check(ids: &mut Identifications, at_ms: u64, bytes: &[u8]) -> IcrcCheck {
        let now = Instant::ZERO + Duration::from_millis(at_ms);
        ids.check(now, &envelope(0), &RocePacket::new_unchecked(bytes)).0
    }

    #[test]
    fn a_linux_sender_is_solved_once_then_predicted() {
        let mut ids = Identifications::default();
        assert_eq!(check(&mut ids, 0, &packet(0x89db, 64)), IcrcCheck::Solved(0x89db));
        assert_eq!(check(&mut ids, 0, &packet(0x89dc, 64)), IcrcCheck::Predicted(0x89dc));
        // Two lost on the way, then a random jump of less than the 300 ms of silence.
        assert_eq!(check(&mut ids, 0, &packet(0x89df, 4096)), IcrcCheck::Predicted(0x89df));
        assert_eq!(check(&mut ids, 300, &packet(0x89df + 250, 4096)), IcrcCheck::Predicted(0x89df + 250));
        // Across the wrap.
        let mut ids = Identifications::default();
        assert_eq!(check(&mut ids, 0, &packet(0xffff, 64)), IcrcCheck::Solved(0xffff));
        assert_eq!(check(&mut ids, 0, &packet(0, 64)), IcrcCheck::Exact);
        assert_eq!(check(&mut ids, 0, &packet(1, 64)), IcrcCheck::Predicted(1));
    }

    #[test]
    fn the_envelope_identification_is_tried_first() {
        let mut ids = Identifications::default();
        let p = packet(3, 100);
        let now = Instant::ZERO;
        let (verdict, found) = ids.check(now, &envelope(3), &RocePacket::new_unchecked(&p[..]));
        assert_eq!((verdict, found), (IcrcCheck::Exact, envelope(3)));
        // A guess that is wrong still finds the identification.
        let (verdict, found) = ids.check(now, &envelope(9), &RocePacket::new_unchecked(&packet(4, 100)[..]));
        assert_eq!((verdict, found), (IcrcCheck::Predicted(4), envelope(4)));
    }

    #[test]
    fn a_trusted_peer_that_jumps_loses_one_packet_then_is_followed() {
        let mut ids = Identifications::default();
        for id in 100..100 + u16::from(TRUST) + 1 {
            assert_ne!(check(&mut ids, 0, &packet(id, 64)), IcrcCheck::Bad);
        }
        assert_eq!(check(&mut ids, 1, &packet(30_000, 64)), IcrcCheck::Bad);
        assert_eq!(check(&mut ids, 1, &packet(30_001, 64)), IcrcCheck::Solved(30_001));
        assert_eq!(check(&mut ids, 1, &packet(30_002, 64)), IcrcCheck::Predicted(30_002));
    }

    #[test]
    fn an_exact_packet_makes_its_peer_trusted_at_once() {
        // A softrdma peer sends identification 0 (exact); one exact packet, then a
        // corrupted one that some identification far out of the window explains.
        let mut ids = Identifications::default();
        assert_eq!(check(&mut ids, 0, &packet(0, 64)), IcrcCheck::Exact);
        assert_eq!(check(&mut ids, 0, &packet(30_000, 64)), IcrcCheck::Bad);
        // A Linux sender that happened to send 0 goes on in sequence, predicted.
        assert_eq!(check(&mut ids, 0, &packet(1, 64)), IcrcCheck::Predicted(1));
    }

    #[test]
    fn an_untrusted_peer_is_solved_every_time() {
        let mut ids = Identifications::default();
        for (k, id) in [0x1234u16, 0x9999, 0x0042, 0xfff0, 0x7777].into_iter().enumerate() {
            assert_eq!(check(&mut ids, k as u64, &packet(id, 200)), IcrcCheck::Solved(id));
        }
    }

    #[test]
    fn ipv6_is_exact_or_bad() {
        let mut ids = Identifications::default();
        let env = Envelope::rocev2(
            "fe80::1".parse::<core::net::Ipv6Addr>().unwrap().into(),
            1,
            "fe80::2".parse::<core::net::Ipv6Addr>().unwrap().into(),
        )
        .unwrap();
        let mut p = packet(0, 32);
        RocePacket::new_unchecked(&mut p[..]).fill_icrc(&env);
        assert_eq!(ids.check(Instant::ZERO, &env, &RocePacket::new_unchecked(&p[..])).0, IcrcCheck::Exact);
        p[20] ^= 1;
        assert_eq!(ids.check(Instant::ZERO, &env, &RocePacket::new_unchecked(&p[..])).0, IcrcCheck::Bad);
    }
}
