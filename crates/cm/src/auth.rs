//! Authenticated mode's key agreement: an X25519 exchange carried beside the REQ and the REP.
//!
//! When an ID's [`AuthPolicy`] requires it, the active side
//! sends its REQ with an *offer* after the 256 MAD bytes: [`OFFER_MAGIC`] and a fresh X25519
//! public key ([`OFFER_LEN`] bytes in all; the MAD itself is unchanged, so the private data
//! stays the application's). A softrdma passive side that gets an offer answers with its
//! own in the REP, and both derive the connection's two packet keys
//! ([`softrdma_engine::auth`]) from the shared secret, both public keys, both comm IDs and
//! the policy's pre-shared key if one is set:
//!
//! ```text
//! ikm = X25519(ours, theirs) ‖ offer_active ‖ offer_passive ‖ comm_id_active ‖ comm_id_passive ‖ psk
//! active→passive = BLAKE3-derive_key("softrdma 2026-11-24 packet key, active to passive", ikm)[..16]
//! passive→active = BLAKE3-derive_key("softrdma 2026-11-24 packet key, passive to active", ikm)[..16]
//! ```
//!
//! The runtime gives the keys to the QP before it moves to RTR. The connection's DREQ and
//! DREP then carry a *seal* after their MAD ([`SEAL_MAGIC`] and a BLAKE3 tag under a third
//! key derived the same way, [`SEAL_LEN`] bytes): an authenticated connection takes no
//! DREQ or DREP without a valid one, so a host that sniffed the comm IDs cannot disconnect
//! it. A peer that is not softrdma
//! does not answer an offer (rdma_cm ignores the bytes after a MAD, and rxe drops a UD
//! packet longer than the receive buffer its QP1 posted): the active side then gets no REP,
//! or a REP without an offer, which it rejects. A passive side that requires authentication
//! rejects a REQ without an offer. Without a pre-shared key the exchange stops a host that
//! watches the wire and forges packets later, not one that rewrites the REQ and REP as
//! they pass (as with any unauthenticated Diffie-Hellman); with one, such a host gets keys
//! the two ends do not use, and nothing it sends is accepted.

use softrdma_engine::PacketKeys;

/// Marks an offer: "softrdma authentication, version 1".
pub const OFFER_MAGIC: [u8; 8] = *b"sRDMAau1";
/// Bytes of an offer: the magic, then the X25519 public key.
pub const OFFER_LEN: usize = 8 + 32;
/// Marks a seal: "softrdma CM message authentication, version 1".
pub const SEAL_MAGIC: [u8; 8] = *b"sRDMAcm1";
/// Bytes of a seal after a DREQ's or DREP's MAD: the magic, then a 128-bit tag.
pub const SEAL_LEN: usize = 8 + 16;

/// An ID's authenticated mode ([`Cm::set_auth_policy`](crate::Cm::set_auth_policy); new
/// IDs take [`CmConfig::auth`](crate::CmConfig::auth)).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct AuthPolicy {
    /// Connect with an offer and reject a REP without one; as a listener, reject a REQ
    /// without one. A listener without it still answers an offer, so the active side
    /// decides.
    pub required: bool,
    /// Mixed into the keys, if set: both ends must have the same
    /// ([`psk_from_passphrase`]).
    pub psk: Option<[u8; 32]>,
}

impl core::fmt::Debug for AuthPolicy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("AuthPolicy").field("required", &self.required).field("psk", &self.psk.map(|_| "..")).finish()
    }
}

/// One side's half of the exchange.
#[derive(Clone)]
pub(crate) struct Exchange {
    secret: [u8; 32],
    /// The offer we send: magic and our public key.
    pub(crate) offer: [u8; OFFER_LEN],
    /// The keys, once the peer's offer came and both comm IDs are known.
    pub(crate) keys: Option<PacketKeys>,
    /// Seals the connection's DREQ and DREP (both directions), once the keys are known.
    cm_key: Option<[u8; 32]>,
}

impl core::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Exchange").field("keys", &self.keys.is_some()).finish_non_exhaustive()
    }
}

impl Exchange {
    /// Our half, from 32 random bytes.
    pub(crate) fn new(secret: [u8; 32]) -> Self {
        let public = x25519_dalek::x25519(secret, x25519_dalek::X25519_BASEPOINT_BYTES);
        let mut offer = [0; OFFER_LEN];
        offer[..8].copy_from_slice(&OFFER_MAGIC);
        offer[8..].copy_from_slice(&public);
        Self { secret, offer, keys: None, cm_key: None }
    }

    /// Derives the keys from the peer's `offer`; `active` says which side we are. False
    /// (and no keys) for a public key of low order, which would make the secret known.
    pub(crate) fn complete(
        &mut self,
        theirs: &[u8; OFFER_LEN],
        active: bool,
        comm_ids: (u32, u32),
        psk: Option<&[u8; 32]>,
    ) -> bool {
        let mut public = [0; 32];
        public.copy_from_slice(&theirs[8..]);
        let shared = x25519_dalek::x25519(self.secret, public);
        if shared == [0; 32] {
            return false;
        }
        let (offer_active, offer_passive) = if active { (&self.offer, theirs) } else { (theirs, &self.offer) };
        let mut ikm = Vec::with_capacity(32 + 2 * OFFER_LEN + 8 + 32);
        ikm.extend_from_slice(&shared);
        ikm.extend_from_slice(offer_active);
        ikm.extend_from_slice(offer_passive);
        ikm.extend_from_slice(&comm_ids.0.to_be_bytes());
        ikm.extend_from_slice(&comm_ids.1.to_be_bytes());
        if let Some(psk) = psk {
            ikm.extend_from_slice(psk);
        }
        let key = |context: &str| {
            let mut k = [0; 16];
            k.copy_from_slice(&blake3::derive_key(context, &ikm)[..16]);
            k
        };
        self.cm_key = Some(blake3::derive_key("softrdma 2026-11-24 CM message key", &ikm));
        let a2p = key("softrdma 2026-11-24 packet key, active to passive");
        let p2a = key("softrdma 2026-11-24 packet key, passive to active");
        self.keys =
            Some(if active { PacketKeys { send: a2p, receive: p2a } } else { PacketKeys { send: p2a, receive: a2p } });
        true
    }
}

impl Exchange {
    /// The seal of a DREQ or DREP `mad` this connection sends, once keys exist.
    pub(crate) fn seal(&self, mad: &[u8]) -> Option<[u8; SEAL_LEN]> {
        let key = self.cm_key.as_ref()?;
        let mut seal = [0; SEAL_LEN];
        seal[..8].copy_from_slice(&SEAL_MAGIC);
        seal[8..].copy_from_slice(&blake3::keyed_hash(key, mad).as_bytes()[..16]);
        Some(seal)
    }

    /// Whether `seal` is this connection's for `mad`; true when the connection has no
    /// keys (it is not authenticated, so nothing is required).
    pub(crate) fn verify(&self, mad: &[u8], seal: Option<&[u8; SEAL_LEN]>) -> bool {
        match (self.seal(mad), seal) {
            (None, _) => true,
            (Some(expected), Some(got)) => expected.iter().zip(got).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0,
            (Some(_), None) => false,
        }
    }
}

/// The seal after a MAD's 256 bytes, if `rest` (the bytes after them) is one.
pub(crate) fn seal_in(rest: &[u8]) -> Option<&[u8; SEAL_LEN]> {
    let seal: &[u8; SEAL_LEN] = rest.get(..SEAL_LEN)?.try_into().ok()?;
    (seal[..8] == SEAL_MAGIC).then_some(seal)
}

/// The offer after a MAD's 256 bytes, if `rest` (the bytes after them) is one.
pub(crate) fn offer_in(rest: &[u8]) -> Option<&[u8; OFFER_LEN]> {
    let offer: &[u8; OFFER_LEN] = rest.get(..OFFER_LEN)?.try_into().ok()?;
    (offer[..8] == OFFER_MAGIC).then_some(offer)
}

/// A pre-shared key from a passphrase of any length.
pub fn psk_from_passphrase(passphrase: &[u8]) -> [u8; 32] {
    blake3::derive_key("softrdma 2026-11-24 authentication pre-shared key", passphrase)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_derive_mirrored_keys_and_a_pre_shared_key_changes_them() {
        let (mut a, mut b) = (Exchange::new([1; 32]), Exchange::new([2; 32]));
        let (oa, ob) = (a.offer, b.offer);
        assert!(a.complete(&ob, true, (10, 20), None));
        assert!(b.complete(&oa, false, (10, 20), None));
        let (ka, kb) = (a.keys.clone().unwrap(), b.keys.clone().unwrap());
        assert_eq!((ka.send, ka.receive), (kb.receive, kb.send));
        assert_ne!(ka.send, ka.receive, "one key per direction");

        let mut c = Exchange::new([1; 32]);
        assert!(c.complete(&ob, true, (10, 20), Some(&psk_from_passphrase(b"secret"))));
        assert_ne!(c.keys.unwrap(), ka, "the pre-shared key is mixed in");
        let mut d = Exchange::new([1; 32]);
        assert!(d.complete(&ob, true, (10, 21), None));
        assert_ne!(d.keys.unwrap(), ka, "the comm IDs are mixed in");
    }

    #[test]
    fn a_low_order_public_key_is_refused() {
        let mut a = Exchange::new([1; 32]);
        let mut zero = [0; OFFER_LEN];
        zero[..8].copy_from_slice(&OFFER_MAGIC);
        assert!(!a.complete(&zero, true, (1, 2), None));
        assert!(a.keys.is_none());
        assert!(offer_in(&zero).is_some());
        assert!(offer_in(&zero[..OFFER_LEN - 1]).is_none(), "too short");
        assert!(offer_in(&[0; OFFER_LEN]).is_none(), "no magic");
    }
}
