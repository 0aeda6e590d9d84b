//! Packet authentication: a MAC over every packet of an authenticated RC or UC QP.
//!
//! RoCEv2's only integrity check, the ICRC, is a CRC anyone can recompute: a host on the
//! path that has seen a connection's packets can forge the next one. One forged
//! zero-length RDMA WRITE at the responder's expected PSN needs no R_Key, moves the PSN on,
//! and makes the honest WRITE that follows look like a duplicate: it is ACKed and dropped
//! and completes with success at the requester while its data never lands. IBTA has no
//! answer to this and rxe behaves the same.
//!
//! When both ends are softrdma they can agree on a pair of per-connection keys (the CM does,
//! with an X25519 exchange: `softrdma_cm`'s authenticated mode) and give them to the QP
//! with [`Engine::set_qp_keys`](crate::Engine::set_qp_keys). From then on each packet the
//! QP sends carries a [`TRAILER_LEN`]-byte trailer between its pad and the ICRC: a 64-bit
//! counter, then the AES-128-GMAC tag of the packet from the BTH to the pad, with the
//! counter as the nonce. The counter counts every packet the QP sends with its key,
//! retransmissions included, so no nonce is ever used twice with one key. A packet whose
//! tag does not verify with the receive key is dropped before any of its headers are acted
//! on, and counted in `rcvd_auth_failures`. The ICRC still covers the whole UDP payload, so
//! Wireshark decodes the packets (the trailer shows as payload, or as trailing bytes after
//! an ACK).
//!
//! What the tag does not stop: a packet recorded and replayed unchanged is a duplicate, and
//! duplicates are handled as IBTA says (a WRITE or SEND is ACKed and dropped, a READ is
//! answered again, an atomic gets its saved result), within the PSN window; replayed after
//! the PSN space has wrapped (2^24 packets later) it would be taken for new. Keys do not
//! change during a connection.
//!
//! Why GMAC: measured on the 2-core development machine, AES-128-GMAC (AES-NI and
//! PCLMULQDQ through the `aes-gcm` crate) tags a 4 KiB packet in 1.45 µs, keyed BLAKE3 in
//! 4.1 µs and ChaCha20-Poly1305 in 2.9 µs. GMAC needs a unique nonce per key, which the
//! counter gives.

use aes_gcm::aead::{AeadInOut, KeyInit, inout::InOutBuf};
use aes_gcm::{Aes128Gcm, Tag};

type Nonce = aes_gcm::Nonce<aes_gcm::aead::consts::U12>;
use softrdma_wire::icrc::ICRC_LEN;

/// Bytes of the counter at the start of the trailer.
pub const COUNTER_LEN: usize = 8;
/// Bytes of the tag at the end of the trailer.
pub const TAG_LEN: usize = 16;
/// Bytes of trailer (counter and tag) at the end of each packet of an authenticated QP,
/// before the ICRC.
pub const TRAILER_LEN: usize = COUNTER_LEN + TAG_LEN;

/// A connected QP's packet keys (AES-128): one for what it sends, one for what it
/// receives (each side's `send` is the other's `receive`).
#[derive(Clone, PartialEq, Eq)]
pub struct PacketKeys {
    /// Tags the packets this QP sends.
    pub send: [u8; 16],
    /// Verifies the packets this QP receives.
    pub receive: [u8; 16],
}

impl core::fmt::Debug for PacketKeys {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("PacketKeys { .. }")
    }
}

/// A QP's authentication state: its two keys, expanded, and the next nonce.
pub(crate) struct Sealer {
    send: Aes128Gcm,
    receive: Aes128Gcm,
    next: u64,
}

impl core::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sealer").field("next", &self.next).finish_non_exhaustive()
    }
}

fn nonce(counter: &[u8]) -> Nonce {
    let mut n = Nonce::default();
    n[12 - COUNTER_LEN..].copy_from_slice(counter);
    n
}

impl Sealer {
    pub(crate) fn new(keys: &PacketKeys) -> Self {
        let cipher = |k: &[u8; 16]| Aes128Gcm::new_from_slice(k).expect("a 16-byte key");
        Self { send: cipher(&keys.send), receive: cipher(&keys.receive), next: 0 }
    }

    /// Appends the trailer to the packet of `len` bytes (ICRC included) at the start of
    /// `buf` and rewrites its ICRC for `envelope`; returns the new length, or `None` if
    /// `buf` cannot hold the trailer.
    pub(crate) fn seal(&mut self, envelope: &softrdma_wire::Envelope, buf: &mut [u8], len: usize) -> Option<usize> {
        let body = len.checked_sub(ICRC_LEN)?;
        let sealed = len + TRAILER_LEN;
        let buf = buf.get_mut(..sealed)?;
        let counter = self.next.to_be_bytes();
        self.next += 1;
        let (covered, trailer) = buf.split_at_mut(body);
        trailer[..COUNTER_LEN].copy_from_slice(&counter);
        let tag = self.send.encrypt_inout_detached(&nonce(&counter), covered, InOutBuf::from(&mut [][..])).ok()?;
        trailer[COUNTER_LEN..TRAILER_LEN].copy_from_slice(&tag);
        softrdma_wire::RocePacket::new_unchecked(&mut *buf).fill_icrc(envelope);
        Some(sealed)
    }

    /// Checks the trailer of a received packet (`payload` is the whole UDP payload, ICRC
    /// included) and returns the packet as it was before sealing, with its last
    /// [`ICRC_LEN`] bytes standing where the ICRC was (they are the trailer's first bytes;
    /// callers parse it with `parse_ignoring_icrc`); `None` if the packet is too short or
    /// the tag is wrong.
    pub(crate) fn open<'a>(&self, payload: &'a [u8]) -> Option<&'a [u8]> {
        let body = payload.len().checked_sub(ICRC_LEN + TRAILER_LEN)?;
        let (covered, trailer) = payload.split_at(body);
        let tag = Tag::try_from(&trailer[COUNTER_LEN..TRAILER_LEN]).ok()?;
        let nonce = nonce(&trailer[..COUNTER_LEN]);
        self.receive.decrypt_inout_detached(&nonce, covered, InOutBuf::from(&mut [][..]), &tag).ok()?;
        Some(&payload[..body + ICRC_LEN])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_packet_opens_with_the_same_key_and_no_other() {
        let envelope =
            softrdma_wire::Envelope::rocev2("10.0.0.1".parse().unwrap(), 4791, "10.0.0.2".parse().unwrap()).unwrap();
        let mut buf = [0u8; 64];
        buf[..12].copy_from_slice(&[0x0a, 0, 0xff, 0xff, 0, 0, 0, 17, 0, 0, 0, 5]);
        let len = 12 + ICRC_LEN;
        softrdma_wire::RocePacket::new_unchecked(&mut buf[..len]).fill_icrc(&envelope);
        let keys = PacketKeys { send: [7; 16], receive: [8; 16] };
        let mirrored = PacketKeys { send: [8; 16], receive: [7; 16] };
        let (mut a, b) = (Sealer::new(&keys), Sealer::new(&mirrored));
        let sealed = a.seal(&envelope, &mut buf, len).unwrap();
        assert_eq!(sealed, len + TRAILER_LEN);
        assert!(softrdma_wire::RocePacket::new_unchecked(&buf[..sealed]).verify_icrc(&envelope));
        let opened = b.open(&buf[..sealed]).expect("the peer's receive key opens it");
        assert_eq!(&opened[..12], &buf[..12]);
        assert!(a.open(&buf[..sealed]).is_none(), "our own receive key does not");
        for i in 0..sealed - ICRC_LEN {
            let mut bad = buf;
            bad[i] ^= 1;
            assert!(b.open(&bad[..sealed]).is_none(), "a flipped bit at {i} is refused");
        }
        assert!(b.open(&buf[..TRAILER_LEN]).is_none(), "too short to carry a trailer");

        // The same packet sealed again gets the next nonce, so another tag.
        let mut again = [0u8; 64];
        again[..len].copy_from_slice(&buf[..len]);
        again[len - ICRC_LEN..len].fill(0);
        again[..12].copy_from_slice(&buf[..12]);
        let n = a.seal(&envelope, &mut again, len).unwrap();
        assert_ne!(&again[len - ICRC_LEN..n - ICRC_LEN], &buf[len - ICRC_LEN..sealed - ICRC_LEN]);
        assert!(b.open(&again[..n]).is_some());
    }
}
