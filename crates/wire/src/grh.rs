//! The 40 bytes at the start of every UD receive buffer.
//!
//! `ibv_post_recv(3)`: "If a WR is being posted to a UD QP, the Global Routing Header (GRH)
//! of the incoming message will be placed in the first 40 bytes of the buffer(s) in the
//! scatter list." On RoCEv2 the IP header stands in for the GRH (Linux
//! `union rdma_network_hdr`, written by rxe's `rxe_resp.c`):
//!
//! - IPv6: the 40-byte IPv6 header;
//! - IPv4: 20 zero bytes, then the 20-byte IPv4 header with a valid checksum.
//!
//! Readers tell the two apart the way Linux's `ib_get_rdma_header_version` does: a version
//! other than 6 at byte 0 means IPv4 if byte 20 says so; a 6 at byte 0 still means IPv4 when
//! bytes 20..40 are an IHL-5 IPv4 header whose checksum verifies (the zero bytes could be
//! garbled). That is why the checksum must be real.

use etherparse::{Ipv4Header, Ipv6Header};

use crate::datagram::IpRepr;
use crate::types::Gid;
use crate::{Error, Result};

/// Size of the GRH area of a UD receive buffer.
pub const GRH_LEN: usize = 40;
const IPV4_OFFSET: usize = 20;

/// The network header a UD receive buffer starts with.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum GrhRepr {
    /// An IPv4 packet: zeros, then the IPv4 header.
    V4(Ipv4Header),
    /// An IPv6 packet: its header.
    V6(Ipv6Header),
}

impl GrhRepr {
    /// The GRH a receiver writes for a datagram that arrived with `ip`.
    pub fn from_ip(ip: &IpRepr) -> Self {
        match ip {
            IpRepr::V4(h) => GrhRepr::V4(h.clone()),
            IpRepr::V6(h) => GrhRepr::V6(h.clone()),
        }
    }

    /// Reads the first 40 bytes of a receive buffer, deciding IPv4 or IPv6 as Linux does.
    pub fn parse(area: &[u8]) -> Result<Self> {
        let area = area.get(..GRH_LEN).ok_or(Error::Truncated)?;
        let v4_at_20 = || Ipv4Header::from_slice(&area[IPV4_OFFSET..]).ok().map(|(h, _)| h);
        if area[0] >> 4 != 6 {
            return v4_at_20().map(GrhRepr::V4).ok_or(Error::BadGrh);
        }
        if let Some(h) = v4_at_20()
            && h.header_len() == Ipv4Header::MIN_LEN
            && h.header_checksum == h.calc_header_checksum()
        {
            return Ok(GrhRepr::V4(h));
        }
        let (h, _) = Ipv6Header::from_slice(area).map_err(|_| Error::BadGrh)?;
        Ok(GrhRepr::V6(h))
    }

    /// Writes all 40 bytes. The IPv4 header checksum is computed, so readers recognise it.
    /// IPv4 options do not fit and are refused with [`Error::Unsupported`].
    pub fn emit(&self, area: &mut [u8]) -> Result<()> {
        let area = area.get_mut(..GRH_LEN).ok_or(Error::BufferTooSmall)?;
        match self {
            GrhRepr::V4(h) => {
                if h.header_len() != Ipv4Header::MIN_LEN {
                    return Err(Error::Unsupported);
                }
                let mut h = h.clone();
                h.header_checksum = h.calc_header_checksum();
                area[..IPV4_OFFSET].fill(0);
                area[IPV4_OFFSET..].copy_from_slice(&h.to_bytes());
            }
            GrhRepr::V6(h) => area.copy_from_slice(&h.to_bytes()),
        }
        Ok(())
    }

    /// The sender's GID (its source address).
    pub fn sgid(&self) -> Gid {
        match self {
            GrhRepr::V4(h) => Gid::from_ip(core::net::Ipv4Addr::from(h.source).into()),
            GrhRepr::V6(h) => Gid(h.source),
        }
    }

    /// The receiver's GID (the destination address).
    pub fn dgid(&self) -> Gid {
        match self {
            GrhRepr::V4(h) => Gid::from_ip(core::net::Ipv4Addr::from(h.destination).into()),
            GrhRepr::V6(h) => Gid(h.destination),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::IpNumber;

    fn v4() -> Ipv4Header {
        let mut h = Ipv4Header::new(36, 64, IpNumber::UDP, [198, 18, 0, 2], [198, 18, 0, 3]).unwrap();
        h.identification = 0x9cfa;
        h.dont_fragment = true;
        h
    }

    #[test]
    fn ipv4_form_is_zeros_then_header() {
        let mut area = [0xa5u8; 40];
        GrhRepr::V4(v4()).emit(&mut area).unwrap();
        assert_eq!(&area[..20], &[0; 20]);
        assert_eq!(area[20], 0x45);
        let parsed = GrhRepr::parse(&area).unwrap();
        let GrhRepr::V4(h) = &parsed else { panic!("not v4") };
        assert_eq!(h.source, [198, 18, 0, 2]);
        assert_eq!(parsed.sgid(), Gid::from_ip([198, 18, 0, 2].into()));
        assert_eq!(parsed.dgid().to_string(), "::ffff:198.18.0.3");
    }

    #[test]
    fn garbled_zeros_still_read_as_ipv4_when_checksum_holds() {
        let mut area = [0u8; 40];
        GrhRepr::V4(v4()).emit(&mut area).unwrap();
        area[0] = 0x60; // looks like IPv6 at byte 0
        assert!(matches!(GrhRepr::parse(&area), Ok(GrhRepr::V4(_))));
        area[31] ^= 0xff; // break the IPv4 checksum: now it is an IPv6 header
        assert!(matches!(GrhRepr::parse(&area), Ok(GrhRepr::V6(_))));
    }

    #[test]
    fn ipv6_form_round_trips() {
        let h = Ipv6Header {
            traffic_class: 0,
            flow_label: Default::default(),
            payload_length: 36,
            next_header: IpNumber::UDP,
            hop_limit: 64,
            source: "fd00::1".parse::<core::net::Ipv6Addr>().unwrap().octets(),
            destination: "fd00::2".parse::<core::net::Ipv6Addr>().unwrap().octets(),
        };
        let mut area = [0xa5u8; 40];
        GrhRepr::V6(h.clone()).emit(&mut area).unwrap();
        assert_eq!(GrhRepr::parse(&area).unwrap(), GrhRepr::V6(h));
    }

    #[test]
    fn rejects_garbage_and_short_areas() {
        assert_eq!(GrhRepr::parse(&[0u8; 40]), Err(Error::BadGrh));
        assert_eq!(GrhRepr::parse(&[0u8; 39]), Err(Error::Truncated));
        assert_eq!(GrhRepr::V4(v4()).emit(&mut [0u8; 39]), Err(Error::BufferTooSmall));
    }
}
