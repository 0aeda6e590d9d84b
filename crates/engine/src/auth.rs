//! Packet authentication: a keyed MAC over every packet of an authenticated RC or UC QP.
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
//! QP sends carries a [`TAG_LEN`]-byte tag between its payload (after the pad) and the
//! ICRC: BLAKE3 in keyed mode over the packet from the BTH to the pad, truncated to 128
//! bits. A packet whose tag does not verify with the receive key is dropped before any of
//! its headers are acted on, and counted in `rcvd_auth_failures`. The ICRC still covers the
//! whole UDP payload, so Wireshark decodes the packets; it shows the tag as 16 bytes of
//! payload.
//!
//! What the tag does not stop: a packet recorded and replayed unchanged is a duplicate, and
//! duplicates are handled as IBTA says (a WRITE or SEND is ACKed and dropped, a READ is
//! answered again, an atomic gets its saved result), within the PSN window; replayed
//! 2^24 packets later, when the PSN space has wrapped, it would be taken for new. Keys do
//! not change during a connection.

use softrdma_wire::icrc::ICRC_LEN;

/// Bytes of authentication tag at the end of each packet of an authenticated QP.
pub const TAG_LEN: usize = 16;

/// A connected QP's packet keys: one for what it sends, one for what it receives (each
/// side's `send` is the other's `receive`).
#[derive(Clone, PartialEq, Eq)]
pub struct PacketKeys {
    /// Tags the packets this QP sends.
    pub send: [u8; 32],
    /// Verifies the packets this QP receives.
    pub receive: [u8; 32],
}

impl core::fmt::Debug for PacketKeys {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("PacketKeys { .. }")
    }
}

/// The tag of the packet bytes `covered` (BTH through pad) under `key`.
pub fn tag(key: &[u8; 32], covered: &[u8]) -> [u8; TAG_LEN] {
    let hash = blake3::keyed_hash(key, covered);
    let mut t = [0; TAG_LEN];
    t.copy_from_slice(&hash.as_bytes()[..TAG_LEN]);
    t
}

/// Appends the tag to the packet of `len` bytes (ICRC included) at the start of `buf` and
/// rewrites its ICRC for `envelope`; returns the new length, or `None` if `buf` cannot hold
/// the tag.
pub(crate) fn seal(key: &[u8; 32], envelope: &softrdma_wire::Envelope, buf: &mut [u8], len: usize) -> Option<usize> {
    let body = len.checked_sub(ICRC_LEN)?;
    let sealed = len + TAG_LEN;
    let buf = buf.get_mut(..sealed)?;
    let t = tag(key, &buf[..body]);
    buf[body..body + TAG_LEN].copy_from_slice(&t);
    softrdma_wire::RocePacket::new_unchecked(&mut *buf).fill_icrc(envelope);
    Some(sealed)
}

/// Checks the tag of a received authenticated packet (`payload` is the whole UDP payload,
/// ICRC included) and returns the packet as it was before sealing, with its last
/// [`ICRC_LEN`] bytes standing where the ICRC was (they are the tag's first bytes; callers
/// parse it with `parse_ignoring_icrc`); `None` if the packet is too short or the tag is
/// wrong. The comparison takes the same time whatever bytes differ.
pub(crate) fn open<'a>(key: &[u8; 32], payload: &'a [u8]) -> Option<&'a [u8]> {
    let body = payload.len().checked_sub(ICRC_LEN + TAG_LEN)?;
    let expected = tag(key, &payload[..body]);
    let got = &payload[body..body + TAG_LEN];
    let diff = expected.iter().zip(got).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    (diff == 0).then_some(&payload[..body + ICRC_LEN])
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
        let key = [7u8; 32];
        let sealed = seal(&key, &envelope, &mut buf, len).unwrap();
        assert_eq!(sealed, len + TAG_LEN);
        assert!(softrdma_wire::RocePacket::new_unchecked(&buf[..sealed]).verify_icrc(&envelope));
        let opened = open(&key, &buf[..sealed]).expect("the right key opens it");
        assert_eq!(&opened[..12], &buf[..12]);
        assert!(open(&[8u8; 32], &buf[..sealed]).is_none(), "another key does not");
        for i in 0..sealed - ICRC_LEN {
            let mut bad = buf;
            bad[i] ^= 1;
            assert!(open(&key, &bad[..sealed]).is_none(), "a flipped bit at {i} is refused");
        }
        assert!(open(&key, &buf[..TAG_LEN]).is_none(), "too short to carry a tag");
    }
}
