//! The invariant CRC (IBA 9.9, RoCEv2 Annex A17.3.3) and the envelope it covers.
//!
//! The ICRC protects the parts of a packet that no router changes. Over RoCEv2 it is the
//! standard reflected CRC-32 (Ethernet/zlib: poly 0xEDB88320, init and final XOR all ones)
//! of:
//!
//! 1. eight `0xFF` bytes, standing in for the IB LRH that RoCEv2 does not have;
//! 2. the IP header with its variant fields set to all ones: IPv4 TOS, TTL and header
//!    checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum set to all ones;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) set to all ones;
//! 5. the rest of the packet through the pad.
//!
//! It is appended little-endian, the one field of the packet that is not big-endian.
//!
//! A socket-based stack never sees the IP and UDP headers it sends or receives, so the
//! fields they contribute are given as an [`Envelope`]: addresses, ports, and for IPv4 the
//! identification and DF bit. Lengths follow from the packet itself.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::ROCEV2_UDP_PORT;

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const UDP_HEADER_LEN: usize = 8;
/// Offset within the BTH of the byte holding FECN/BECN, masked out of the ICRC.
const BTH_VARIANT_BYTE: usize = 4;
/// Length of the BTH, which every RoCE packet starts with.
const BTH_LEN: usize = 12;
const PROTO_UDP: u8 = 17;

/// The IPv4 and UDP fields the ICRC covers, for a packet with no IP options.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ipv4Envelope {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// IPv4 identification. Linux sends 0 on an unconnected UDP socket with
    /// `IP_PMTUDISC_DO`; kernel rxe sends a pseudo-random value.
    pub identification: u16,
    /// The don't-fragment flag (RoCEv2 senders set it).
    pub dont_fragment: bool,
    /// UDP source port (flow entropy; any value).
    pub src_port: u16,
    /// UDP destination port, 4791 for RoCEv2.
    pub dst_port: u16,
}

/// The IPv6 and UDP fields the ICRC covers, for a packet with no extension headers.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Ipv6Envelope {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port, 4791 for RoCEv2.
    pub dst_port: u16,
}

/// What the ICRC covers outside the UDP payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Envelope {
    /// RoCEv2 over IPv4.
    V4(Ipv4Envelope),
    /// RoCEv2 over IPv6.
    V6(Ipv6Envelope),
}

impl Envelope {
    /// The envelope a RoCEv2 sender uses from `src` to `dst` (port 4791) on an unconnected
    /// socket with path-MTU discovery on: DF set, IPv4 identification 0.
    pub fn rocev2(src: IpAddr, src_port: u16, dst: IpAddr) -> Option<Self> {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Some(Envelope::V4(Ipv4Envelope {
                src,
                dst,
                identification: 0,
                dont_fragment: true,
                src_port,
                dst_port: ROCEV2_UDP_PORT,
            })),
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                Some(Envelope::V6(Ipv6Envelope { src, dst, src_port, dst_port: ROCEV2_UDP_PORT }))
            }
            _ => None,
        }
    }

    /// The same envelope to UDP destination port `port` (4791 is RoCEv2's; tests that keep
    /// groups of devices apart on one host use others).
    #[must_use]
    pub fn with_dst_port(mut self, port: u16) -> Self {
        match &mut self {
            Envelope::V4(e) => e.dst_port = port,
            Envelope::V6(e) => e.dst_port = port,
        }
        self
    }

    /// Source IP address.
    pub fn src_ip(&self) -> IpAddr {
        match self {
            Envelope::V4(e) => e.src.into(),
            Envelope::V6(e) => e.src.into(),
        }
    }

    /// Destination IP address.
    pub fn dst_ip(&self) -> IpAddr {
        match self {
            Envelope::V4(e) => e.dst.into(),
            Envelope::V6(e) => e.dst.into(),
        }
    }

    /// UDP source port.
    pub fn src_port(&self) -> u16 {
        match self {
            Envelope::V4(e) => e.src_port,
            Envelope::V6(e) => e.src_port,
        }
    }

    /// UDP destination port.
    pub fn dst_port(&self) -> u16 {
        match self {
            Envelope::V4(e) => e.dst_port,
            Envelope::V6(e) => e.dst_port,
        }
    }
}

/// An ICRC computed piece by piece, so that a header and a payload held in different
/// buffers need not be copied together.
///
/// ```
/// # use softrdma_wire::{icrc::{self, IcrcHasher}, Envelope};
/// let env = Envelope::rocev2([10, 0, 0, 1].into(), 0xc000, [10, 0, 0, 2].into()).unwrap();
/// let packet = [0x64u8, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 7, 0x80, 1, 0, 0, 0, 0, 0, 1];
/// let mut h = IcrcHasher::new(&env, packet.len());
/// h.update(&packet[..10]);
/// h.update(&packet[10..]);
/// assert_eq!(h.finalize(), icrc::compute(&env, &packet));
/// ```
#[derive(Clone)]
pub struct IcrcHasher {
    crc: crc32fast::Hasher,
    /// Bytes of the UDP payload fed so far, to find the BTH byte that must be masked.
    position: usize,
}

impl IcrcHasher {
    /// Starts an ICRC for a UDP payload whose covered part (everything but the 4-byte ICRC)
    /// is `covered_len` bytes long; the length enters the IP and UDP length fields.
    ///
    /// Lengths too large for a datagram wrap around in those fields; such a packet cannot
    /// have been sent, so its ICRC simply will not match.
    pub fn new(envelope: &Envelope, covered_len: usize) -> Self {
        // The whole prefix in one buffer and one `update`: three short updates (8, 20 and 8
        // bytes) cost crc32fast's byte-at-a-time tail three times.
        let mut prefix = [0xffu8; 8 + IPV6_HEADER_LEN + UDP_HEADER_LEN];
        let udp_len = (UDP_HEADER_LEN + covered_len + ICRC_LEN) as u16;
        let (ip_len, src_port, dst_port) = match envelope {
            Envelope::V4(e) => {
                let total_len = udp_len.wrapping_add(IPV4_HEADER_LEN as u16);
                let flags: u8 = if e.dont_fragment { 0x40 } else { 0 };
                let ip = &mut prefix[8..8 + IPV4_HEADER_LEN];
                ip[0] = 0x45;
                ip[1] = 0xff; // TOS: variant
                ip[2..4].copy_from_slice(&total_len.to_be_bytes());
                ip[4..6].copy_from_slice(&e.identification.to_be_bytes());
                ip[6] = flags; // fragment offset 0: RoCEv2 is never fragmented
                ip[7] = 0;
                ip[8] = 0xff; // TTL: variant
                ip[9] = PROTO_UDP;
                ip[10] = 0xff; // header checksum: variant
                ip[11] = 0xff;
                ip[12..16].copy_from_slice(&e.src.octets());
                ip[16..20].copy_from_slice(&e.dst.octets());
                (IPV4_HEADER_LEN, e.src_port, e.dst_port)
            }
            Envelope::V6(e) => {
                let ip = &mut prefix[8..8 + IPV6_HEADER_LEN];
                // Version 6, traffic class and flow label all ones: variant.
                ip[..4].copy_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
                ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
                ip[6] = PROTO_UDP;
                ip[7] = 0xff; // hop limit: variant
                ip[8..24].copy_from_slice(&e.src.octets());
                ip[24..40].copy_from_slice(&e.dst.octets());
                (IPV6_HEADER_LEN, e.src_port, e.dst_port)
            }
        };
        let udp = &mut prefix[8 + ip_len..8 + ip_len + UDP_HEADER_LEN]; // checksum (6..8): variant, all ones
        udp[0..2].copy_from_slice(&src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&prefix[..8 + ip_len + UDP_HEADER_LEN]);
        Self { crc, position: 0 }
    }

    /// Feeds the next bytes of the UDP payload (BTH first), masking BTH byte 4.
    pub fn update(&mut self, bytes: &[u8]) {
        let start = self.position;
        self.position += bytes.len();
        if (start..self.position).contains(&BTH_VARIANT_BYTE) {
            // The bytes up to the end of the BTH, masked, in one update: crc32fast takes
            // short inputs a byte at a time at a cost per call, and three calls (the bytes
            // before the mask, the mask, the rest) were a third of a 64-byte SEND's ICRC.
            let head = bytes.len().min(BTH_LEN - start);
            let mut masked = [0u8; BTH_LEN];
            masked[..head].copy_from_slice(&bytes[..head]);
            masked[BTH_VARIANT_BYTE - start] = 0xff;
            self.crc.update(&masked[..head]);
            self.crc.update(&bytes[head..]);
        } else {
            self.crc.update(bytes);
        }
    }

    /// The ICRC value; on the wire it goes little-endian (`to_le_bytes`).
    pub fn finalize(self) -> u32 {
        self.crc.finalize()
    }
}

/// The ICRC's start (the masked IP and UDP headers) for the last few envelopes and
/// lengths it was asked for, so that a flow's packets do not hash their 36 or 56 bytes of
/// envelope each: a stream's packets share one, and a ping-pong's two (its requests and
/// its ACKs). Entries are replaced in turn.
///
/// ```
/// # use softrdma_wire::{icrc::{self, IcrcPrefixCache}, Envelope};
/// let env = Envelope::rocev2([10, 0, 0, 1].into(), 0xc000, [10, 0, 0, 2].into()).unwrap();
/// let packet = [0x64u8, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 7, 0x80, 1, 0, 0, 0, 0, 0, 1];
/// let mut cache = IcrcPrefixCache::default();
/// assert_eq!(cache.compute(&env, &packet), icrc::compute(&env, &packet));
/// assert_eq!(cache.compute(&env, &packet), icrc::compute(&env, &packet)); // from the cache
/// ```
#[derive(Clone, Default)]
pub struct IcrcPrefixCache {
    entries: [Option<(Envelope, usize, IcrcHasher)>; PREFIX_CACHE_ENTRIES],
    next: usize,
}

/// Envelopes and lengths an [`IcrcPrefixCache`] keeps.
const PREFIX_CACHE_ENTRIES: usize = 4;

impl core::fmt::Debug for IcrcPrefixCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.entries.iter().flatten().map(|(e, len, _)| (e, len))).finish()
    }
}

impl IcrcPrefixCache {
    /// [`IcrcHasher::new`]`(envelope, covered_len)`, its prefix taken from the cache when
    /// it holds this envelope and length.
    pub fn hasher(&mut self, envelope: &Envelope, covered_len: usize) -> IcrcHasher {
        for (e, len, h) in self.entries.iter().flatten() {
            if *len == covered_len && e == envelope {
                return h.clone();
            }
        }
        let h = IcrcHasher::new(envelope, covered_len);
        self.entries[self.next] = Some((*envelope, covered_len, h.clone()));
        self.next = (self.next + 1) % PREFIX_CACHE_ENTRIES;
        h
    }

    /// [`compute`], through the cache.
    pub fn compute(&mut self, envelope: &Envelope, covered: &[u8]) -> u32 {
        let mut h = self.hasher(envelope, covered.len());
        h.update(covered);
        h.finalize()
    }
}

/// The ICRC of a UDP payload whose first `covered.len()` bytes are BTH through pad.
pub fn compute(envelope: &Envelope, covered: &[u8]) -> u32 {
    let mut h = IcrcHasher::new(envelope, covered.len());
    h.update(covered);
    h.finalize()
}

/// How the ICRC of an IPv4 packet depends on its identification field, which the ICRC
/// covers, which the kernel may set after the ICRC was computed (UDP GSO gives segment *i*
/// of a send identification *i*), and which a UDP socket never shows its receiver.
///
/// A CRC is affine: for two inputs of one length, `crc(a) ^ crc(b)` is a linear function of
/// `a ^ b` alone. So the ICRC with identification `id` is the ICRC with identification 0
/// XOR [`delta`](Self::delta)`(id)`, a linear function of the 16 bits of `id` that depends
/// only on the packet's length. In GF(2)\[x\] modulo the CRC polynomial P it is
/// `m(x) · x^(32 + 8·n)`, where `m(x)` is the identification as a 16-bit message and `n`
/// the number of bytes the ICRC covers after it. Since P has a constant term, `x` is
/// invertible modulo P, so the map is one-to-one and can be run backwards:
/// [`solve`](Self::solve) finds the one identification (if any) that explains a
/// mismatch. Of the 2^32 possible mismatches 2^16 are explained by some identification,
/// so a receiver that accepts any solution lets a random corruption through with
/// probability 2^-16; one that accepts only identifications it predicted (a window of *w*
/// after the sender's previous one) keeps a probability of *w*·2^-32.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Ipv4IdentificationDeltas {
    covered_len: usize,
    /// `delta` of each of the 16 identification bits (bit `i`: `delta(1 << i)`): the delta
    /// of any identification is the XOR of its bits' (the CRC is linear in them), a few
    /// XORs per GSO segment where a multiplication modulo P takes 32 steps.
    basis: [u32; 16],
    /// The inverse of `x^(32 + 8·n)`, in the reflected representation.
    unshift: u32,
}

impl Ipv4IdentificationDeltas {
    /// The map for UDP payloads whose covered part is `covered_len` bytes (a few dozen
    /// multiplications modulo P: compute once per length and keep it).
    pub fn new(covered_len: usize) -> Self {
        // The identification is bytes 4..6 of the IPv4 header, which the ICRC input starts
        // 8 bytes in; what follows it: the rest of the IP header (14), UDP (8), payload.
        let after = (IPV4_HEADER_LEN - 6 + UDP_HEADER_LEN + covered_len) as u64;
        let degree = 32 + 8 * after;
        let shift = gf2::pow(gf2::X, degree);
        let basis = core::array::from_fn(|i| gf2::mul(shift, message(1 << i)));
        Self { covered_len, basis, unshift: gf2::pow(gf2::X_INVERSE, degree) }
    }

    /// The covered length this map is for.
    pub fn covered_len(&self) -> usize {
        self.covered_len
    }

    /// `icrc(identification = id) ^ icrc(identification = 0)`.
    pub fn delta(&self, id: u16) -> u32 {
        let (mut bits, mut d) = (id, 0);
        while bits != 0 {
            d ^= self.basis[bits.trailing_zeros() as usize];
            bits &= bits - 1;
        }
        d
    }

    /// The identification `id` with `delta(id) == syndrome`, if there is one (there is for
    /// 2^16 of the 2^32 syndromes). `syndrome` is the ICRC a packet carries XOR the ICRC
    /// computed for identification 0.
    pub fn solve(&self, syndrome: u32) -> Option<u16> {
        let m = gf2::mul(self.unshift, syndrome);
        // A 16-bit message has no term of degree 16 or more: bits 15..0 of the
        // reflected representation.
        (m & 0xffff == 0).then(|| ((m >> 16) as u16).swap_bytes())
    }
}

/// The maps for the last few packet lengths, kept by whoever corrects or recovers many
/// packets' identifications (a sender's GSO segments, a receiver's check): few lengths
/// recur (full packets, ACKs, a message's last packet), and a map costs a few dozen
/// multiplications to build.
#[derive(Clone, Debug, Default)]
pub struct Ipv4IdentificationCache {
    maps: [Option<Ipv4IdentificationDeltas>; 16],
}

impl Ipv4IdentificationCache {
    /// The map for covered length `covered_len`, built if this cache does not hold it
    /// (replacing the one in its slot).
    pub fn get(&mut self, covered_len: usize) -> Ipv4IdentificationDeltas {
        let n = self.maps.len();
        let slot = &mut self.maps[(covered_len.wrapping_mul(0x9e37_79b1) >> 7) % n];
        match slot {
            Some(m) if m.covered_len() == covered_len => *m,
            _ => *slot.insert(Ipv4IdentificationDeltas::new(covered_len)),
        }
    }
}

/// The identification as a message polynomial in the reflected representation (x^0 at bit
/// 31). The CRC reads the high byte first, least significant bit first, as the highest
/// degree: its bit 0 is x^15 (bit 16), the low byte's bit 7 is x^0 (bit 31).
fn message(id: u16) -> u32 {
    u32::from(id.swap_bytes()) << 16
}

/// Arithmetic in GF(2)\[x\] modulo the CRC-32 polynomial, in the reflected representation
/// zlib uses (`crc32.c`: `multmodp`): bit 31 is x^0, bit 0 is x^31.
mod gf2 {
    /// P without its x^32 term, reflected.
    const POLY: u32 = 0xedb8_8320;
    /// x^0.
    pub(super) const ONE: u32 = 1 << 31;
    /// x^1.
    pub(super) const X: u32 = 1 << 30;
    /// x^-1: P = x^32 + q(x) + 1, so x · (x^31 + q(x)/x) = P - 1 ≡ 1. In the reflected
    /// representation dividing by x is a shift left, and x^31 is bit 0.
    pub(super) const X_INVERSE: u32 = ((POLY & 0x7fff_ffff) << 1) | 1;

    /// `a · b mod P`.
    pub(super) const fn mul(a: u32, mut b: u32) -> u32 {
        let mut product = 0;
        let mut m = ONE;
        while m != 0 {
            if a & m != 0 {
                product ^= b;
            }
            b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
            m >>= 1;
        }
        product
    }

    /// `base^exponent mod P`.
    pub(super) fn pow(mut base: u32, mut exponent: u64) -> u32 {
        let mut result = ONE;
        while exponent != 0 {
            if exponent & 1 != 0 {
                result = mul(result, base);
            }
            base = mul(base, base);
            exponent >>= 1;
        }
        result
    }
}

/// The IPv4 identification that makes `icrc` the ICRC of `covered` sent inside
/// `envelope` (whose own identification is ignored), if one does. Computes the map for
/// this length afresh; a receiver that sees many packets keeps an
/// [`Ipv4IdentificationCache`]. `None` for IPv6, which has no identification.
pub fn recover_identification(envelope: &Envelope, covered: &[u8], icrc: u32) -> Option<u16> {
    let Envelope::V4(e) = envelope else { return None };
    let zero = Envelope::V4(Ipv4Envelope { identification: 0, ..*e });
    Ipv4IdentificationDeltas::new(covered.len()).solve(icrc ^ compute(&zero, covered))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> std::vec::Vec<u8> {
        s.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect()
    }

    /// Checks a whole IPv4 packet (IP header onward, ICRC last) against `compute`, taking
    /// the envelope from its header.
    fn check_ipv4_packet(bytes: &[u8]) {
        let envelope = Envelope::V4(Ipv4Envelope {
            src: Ipv4Addr::new(bytes[12], bytes[13], bytes[14], bytes[15]),
            dst: Ipv4Addr::new(bytes[16], bytes[17], bytes[18], bytes[19]),
            identification: u16::from_be_bytes([bytes[4], bytes[5]]),
            dont_fragment: bytes[6] & 0x40 != 0,
            src_port: u16::from_be_bytes([bytes[20], bytes[21]]),
            dst_port: u16::from_be_bytes([bytes[22], bytes[23]]),
        });
        let udp_payload = &bytes[28..];
        let (covered, trailer) = udp_payload.split_at(udp_payload.len() - 4);
        assert_eq!(compute(&envelope, covered).to_le_bytes(), trailer);
    }

    #[test]
    fn worked_examples_of_the_reference() {
        // RC SEND_ONLY (A), its ACK (B), UD SEND_ONLY with pad 3 (C), READ request (D).
        check_ipv4_packet(&hex("45 00 00 3c 12 34 40 00 40 11 a5 0e c0 a8 01 0a c0 a8 01 14 c1 32 12 b7 00 28 00 00
             04 00 ff ff 00 00 00 12 80 12 34 56 00 00 7f 12 34 56 00 00 00 00 12 34 00 00 00 40
             f6 17 39 8e"));
        check_ipv4_packet(&hex("45 00 00 30 43 21 40 00 40 11 74 2d c0 a8 01 14 c0 a8 01 0a c1 32 12 b7 00 1c 00 00
             11 00 ff ff 00 00 00 11 00 12 34 56 1f 00 00 01 8c 11 96 d7"));
        check_ipv4_packet(&hex("45 00 00 3c 00 01 40 00 40 11 b7 41 c0 a8 01 0a c0 a8 01 14 c4 20 12 b7 00 28 00 00
             64 30 ff ff 00 00 00 21 00 00 00 01 11 11 11 11 00 00 00 20 68 65 6c 6c 6f 00 00 00
             00 d3 0b 07"));
        check_ipv4_packet(&hex("45 00 00 3c 22 22 40 00 40 11 95 20 c0 a8 01 0a c0 a8 01 14 c1 32 12 b7 00 28 00 00
             0c 00 ff ff 00 00 00 12 80 00 01 00 00 00 7f 00 00 00 10 00 00 00 0a 0b 00 00 09 c4
             f2 95 00 a7"));
    }

    #[test]
    fn scapy_vectors() {
        // secdev/scapy test/contrib/roce.uts: a CNP captured on a ConnectX-4 Lx (TOS 0xc2 is
        // variant, UDP source port 0 is covered as sent) ...
        check_ipv4_packet(&hex("45 c2 00 3c 71 8c 40 00 40 11 91 61 0a 00 11 01 0a 00 12 01 00 00 12 b7 00 28 00 00
             81 00 ff ff 40 00 01 18 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
             82 fd 00 2a"));
        // ... and a UC SEND_ONLY with MigReq and pad 2 (TOS 1, ID 1144, 192.168.0.7 to itself).
        check_ipv4_packet(&hex("45 01 00 40 04 78 40 00 40 11 00 00 c0 a8 00 07 c0 a8 00 07 c0 00 12 b7 00 2c 00 00
             24 60 ff ff 00 00 00 d3 00 cf 17 10
             46 30 81 8b e2 89 35 d9 0e 9a 95 50 54 01 be 88 5e 50 00 00
             78 f3 53 f3"));
    }

    #[test]
    fn masks_exactly_the_variant_bth_byte() {
        let env = Envelope::rocev2([10, 0, 0, 1].into(), 0xc000, [10, 0, 0, 2].into()).unwrap();
        let mut packet = hex("04 00 ff ff 00 00 00 12 80 00 00 01");
        let base = compute(&env, &packet);
        packet[4] = 0xc0; // FECN + BECN: variant
        assert_eq!(compute(&env, &packet), base);
        for i in (0..packet.len()).filter(|&i| i != 4) {
            let mut flipped = packet.clone();
            flipped[i] ^= 1;
            assert_ne!(compute(&env, &flipped), base, "byte {i} not covered");
        }
    }

    #[test]
    fn split_updates_match_one_shot_at_every_split_point() {
        let env = Envelope::rocev2([10, 0, 0, 1].into(), 0xc000, [10, 0, 0, 2].into()).unwrap();
        let packet: std::vec::Vec<u8> = (0u8..40).collect();
        let whole = compute(&env, &packet);
        for a in 0..=packet.len() {
            for b in a..=packet.len() {
                let mut h = IcrcHasher::new(&env, packet.len());
                h.update(&packet[..a]);
                h.update(&packet[a..b]);
                h.update(&packet[b..]);
                assert_eq!(h.finalize(), whole, "split at {a}/{b}");
            }
        }
    }

    #[test]
    fn the_prefix_cache_gives_each_envelope_and_length_its_own_icrc() {
        // More envelopes and lengths than the cache keeps, in an order that hits, misses and
        // replaces entries: a cache that ignored the length, the identification or the
        // family would answer with another packet's prefix.
        let v4 = |id: u16| {
            let Envelope::V4(e) = Envelope::rocev2([10, 0, 0, 1].into(), 0xc000, [10, 0, 0, 2].into()).unwrap() else {
                unreachable!()
            };
            Envelope::V4(Ipv4Envelope { identification: id, ..e })
        };
        let v6 = Envelope::rocev2("fe80::1".parse().unwrap(), 0xc000, "fe80::2".parse().unwrap()).unwrap();
        let envelopes = [v4(0), v4(1), v4(0x8000), v6];
        let packet: std::vec::Vec<u8> = (0u8..=255).cycle().take(300).collect();
        let mut cache = IcrcPrefixCache::default();
        let mut seen = std::collections::BTreeSet::new();
        for step in 0..200usize {
            let e = &envelopes[step * 7 % envelopes.len()];
            let len = [12, 40, 300][step * 5 % 3];
            let got = cache.compute(e, &packet[..len]);
            assert_eq!(got, compute(e, &packet[..len]), "step {step}, length {len}, {e:?}");
            seen.insert(got);
        }
        assert_eq!(seen.len(), envelopes.len() * 3, "every envelope and length has an ICRC of its own");
    }

    #[test]
    fn ipv6_envelope_is_covered() {
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: Ipv6Addr = "fe80::2".parse().unwrap();
        let env = Envelope::rocev2(src.into(), 0xc000, dst.into()).unwrap();
        let packet = hex("04 00 ff ff 00 00 00 12 80 00 00 01");
        let base = compute(&env, &packet);
        let other = Envelope::rocev2(src.into(), 0xc001, dst.into()).unwrap();
        assert_ne!(compute(&other, &packet), base);
        let swapped = Envelope::rocev2(dst.into(), 0xc000, src.into()).unwrap();
        assert_ne!(compute(&swapped, &packet), base);
        assert!(Envelope::rocev2(src.into(), 1, Ipv4Addr::LOCALHOST.into()).is_none());
    }

    #[test]
    fn x_inverse_is_the_inverse_of_x() {
        assert_eq!(gf2::mul(gf2::X, gf2::X_INVERSE), gf2::ONE);
        assert_eq!(gf2::mul(gf2::pow(gf2::X, 40_000), gf2::pow(gf2::X_INVERSE, 40_000)), gf2::ONE);
        assert_eq!(gf2::pow(gf2::X, 0), gf2::ONE);
    }

    /// The map built by algebra equals the one built the slow way: CRCs over zeros with the
    /// identification set (one bit, or several), minus the CRC with none.
    #[test]
    fn deltas_agree_with_crcs_over_zeros() {
        for covered_len in [0usize, 1, 12, 28, 1036, 4124, 9000] {
            let after = IPV4_HEADER_LEN - 6 + UDP_HEADER_LEN + covered_len;
            let crc_of = |prefix: [u8; 2]| {
                let mut h = crc32fast::Hasher::new();
                h.update(&prefix);
                h.update(&std::vec![0u8; after]);
                h.finalize()
            };
            let deltas = Ipv4IdentificationDeltas::new(covered_len);
            let ids = (0..16).map(|bit| 1u16 << bit).chain([3, 63, 0x1234, 0x8001, 0xffff]);
            for id in ids {
                assert_eq!(deltas.delta(id), crc_of(id.to_be_bytes()) ^ crc_of([0, 0]), "len {covered_len} id {id:#x}");
            }
        }
    }

    #[test]
    fn the_cache_gives_the_map_of_the_length_asked_for() {
        let mut cache = Ipv4IdentificationCache::default();
        for round in 0..2 {
            for len in (0..200).map(|k| 12 + 4 * k) {
                assert_eq!(cache.get(len), Ipv4IdentificationDeltas::new(len), "round {round} len {len}");
            }
        }
    }

    #[test]
    fn solve_inverts_delta_for_every_identification() {
        for covered_len in [12usize, 1036, 4124] {
            let deltas = Ipv4IdentificationDeltas::new(covered_len);
            for id in 0..=u16::MAX {
                assert_eq!(deltas.solve(deltas.delta(id)), Some(id), "len {covered_len}");
            }
        }
    }

    #[test]
    fn exactly_one_syndrome_in_two_to_the_sixteen_is_solvable() {
        // The image of a one-to-one linear map of 16 bits: 2^16 of 2^32 syndromes. Count
        // over a stride that visits 2^24 syndromes spread over the whole space.
        let deltas = Ipv4IdentificationDeltas::new(1036);
        let solvable = (0..1u32 << 24).filter(|i| deltas.solve(i.wrapping_mul(0x9e37_79b1)).is_some()).count();
        // Expected 2^24 / 2^16 = 256 for a random sample; the stride is not random, so
        // allow for it, but far from "often".
        assert!(solvable < 1024, "{solvable} of 2^24 syndromes solvable");
    }

    #[test]
    fn recover_identification_finds_the_identification_a_packet_was_sent_with() {
        let payload: std::vec::Vec<u8> = (0..300u32).map(|i| (i * 13 + 1) as u8).collect();
        let env = |id| {
            Envelope::V4(Ipv4Envelope {
                src: Ipv4Addr::new(198, 18, 0, 2),
                dst: Ipv4Addr::new(198, 18, 0, 3),
                identification: id,
                dont_fragment: true,
                src_port: 0xc123,
                dst_port: 4791,
            })
        };
        for id in [0u16, 1, 0x89db, 0xffff] {
            let icrc = compute(&env(id), &payload);
            assert_eq!(recover_identification(&env(0), &payload, icrc), Some(id));
            assert_eq!(recover_identification(&env(7), &payload, icrc), Some(id), "the envelope's own id is ignored");
        }
        let v6 =
            Envelope::rocev2("::1".parse::<Ipv6Addr>().unwrap().into(), 1, "::1".parse::<Ipv6Addr>().unwrap().into());
        assert_eq!(recover_identification(&v6.unwrap(), &payload, 0), None);
    }

    #[test]
    fn identification_deltas_turn_the_icrc_for_id_0_into_the_icrc_for_any_id() {
        let payload: std::vec::Vec<u8> = (0..4112u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [12usize, 28, 1024 + 12, 4112] {
            let deltas = Ipv4IdentificationDeltas::new(len);
            let env = |id| {
                Envelope::V4(Ipv4Envelope {
                    src: Ipv4Addr::new(10, 0, 0, 1),
                    dst: Ipv4Addr::new(10, 0, 0, 2),
                    identification: id,
                    dont_fragment: true,
                    src_port: 4791,
                    dst_port: 4791,
                })
            };
            let base = compute(&env(0), &payload[..len]);
            for id in [1u16, 2, 15, 63, 0x1234, 0xffff] {
                assert_eq!(base ^ deltas.delta(id), compute(&env(id), &payload[..len]), "len {len} id {id}");
            }
        }
    }
}
