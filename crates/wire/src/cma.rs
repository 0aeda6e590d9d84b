//! rdma_cm's part of the CM exchange: the service ID it derives from a port, and the 36-byte
//! header (`struct cma_hdr`, `drivers/infiniband/core/cma.c`) it puts at the start of the
//! private data of every REQ and SIDR_REQ so that the listener learns the IP addresses and
//! port of the connection.
//!
//! | Off | Size | Field |
//! |---|---|---|
//! | 0 | 1 | cma_version (0x00) |
//! | 1 | 1 | ip_version in bits 7:4 (4 or 6); bits 3:0 reserved |
//! | 2 | 2 | port: the active side's rdma_cm source port |
//! | 4 | 16 | src_addr (active side); IPv4 as 12 zero bytes and the address |
//! | 20 | 16 | dst_addr (passive side), same encoding |
//!
//! REP, RTU, REJ and DREQ private data carry no such header.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::cm::{REQ_PRIVATE_DATA_LEN, SIDR_REQ_PRIVATE_DATA_LEN};
use crate::field::{self, Field};
use crate::{Error, Result};

/// Length of the rdma_cm private-data header.
pub const CMA_HEADER_LEN: usize = 36;
/// The only cma_version there is (`cma.c: CMA_VERSION`).
pub const CMA_VERSION: u8 = 0x00;
/// Private data a REQ leaves to the rdma_cm user after the header (92 − 36).
pub const REQ_USER_PRIVATE_DATA_LEN_MAX: usize = REQ_PRIVATE_DATA_LEN - CMA_HEADER_LEN;
/// Private data a SIDR_REQ leaves to the rdma_cm user after the header (216 − 36).
pub const SIDR_REQ_USER_PRIVATE_DATA_LEN_MAX: usize = SIDR_REQ_PRIVATE_DATA_LEN - CMA_HEADER_LEN;

const VERSION: usize = 0;
const IP_VERSION: usize = 1;
const PORT: Field = 2..4;
const SRC_ADDR: Field = 4..20;
const DST_ADDR: Field = 20..36;

/// An rdma_cm port space (`include/uapi/rdma/rdma_user_cm.h: enum rdma_ucm_port_space`),
/// the top half of an rdma_cm service ID. Open: unknown values are kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct PortSpace(pub u16);

impl PortSpace {
    /// IP over IB.
    pub const IPOIB: Self = Self(0x0002);
    /// Connected (RC) service, addressed like TCP; what rping and most users pick.
    pub const TCP: Self = Self(0x0106);
    /// Datagram (UD) service, resolved with SIDR.
    pub const UDP: Self = Self(0x0111);
    /// Any QP type; the service ID may be chosen freely.
    pub const IB: Self = Self(0x013f);

    /// The port space's name, if it is a known one.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::IPOIB => "IPOIB",
            Self::TCP => "TCP",
            Self::UDP => "UDP",
            Self::IB => "IB",
            _ => return None,
        })
    }
}

impl fmt::Display for PortSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "{:#06x}", self.0),
        }
    }
}

/// The service ID rdma_cm listens on and connects to: `(port_space << 16) | port`
/// (`cma.c: rdma_get_service_id`). rping's default, TCP port 7174, is 0x1061c06.
pub const fn service_id(port_space: PortSpace, port: u16) -> u64 {
    ((port_space.0 as u64) << 16) | port as u64
}

/// The port space and port of an rdma_cm service ID, the inverse of [`service_id`]
/// (`cma.c: rdma_ps_from_service_id`, `cma_port_from_service_id`). `None` when bits 63:32
/// are set: such an ID was not made from a port (an IB service ID chosen by the user).
pub const fn split_service_id(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    Some((PortSpace((service_id >> 16) as u16), service_id as u16))
}

/// The user's part of REQ or SIDR_REQ private data: what follows the header. `None` if the
/// private data is shorter than the header.
pub fn user_private_data(private_data: &[u8]) -> Option<&[u8]> {
    private_data.get(CMA_HEADER_LEN..)
}

/// A parsed rdma_cm private-data header.
///
/// The addresses are kept as their 16 wire bytes, so a header with an unknown IP version,
/// or with non-zero padding before an IPv4 address, re-emits unchanged. Bits 3:0 of the IP
/// version byte are reserved (`cma.c: cma_set_ip_ver` leaves them alone; Linux sends 0) and
/// emit as zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CmaHeaderRepr {
    /// Header version, [`CMA_VERSION`] (Linux rejects others with REJ 28).
    pub cma_version: u8,
    /// IP version, 4 bits: 4 or 6.
    pub ip_version: u8,
    /// The active side's rdma_cm source port.
    pub port: u16,
    /// The active side's address, as carried.
    pub src_addr: [u8; 16],
    /// The passive side's address, as carried.
    pub dst_addr: [u8; 16],
}

impl CmaHeaderRepr {
    /// The header rdma_cm writes for a connection from `src` (port `port`) to `dst`
    /// (`cma.c: cma_format_hdr`). `None` if the two addresses are of different families.
    pub fn new(port: u16, src: IpAddr, dst: IpAddr) -> Option<Self> {
        let (ip_version, src_addr, dst_addr) = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4, v4_bytes(s), v4_bytes(d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6, s.octets(), d.octets()),
            _ => return None,
        };
        Some(Self { cma_version: CMA_VERSION, ip_version, port, src_addr, dst_addr })
    }

    /// Parses the header at the start of REQ or SIDR_REQ private data. Fails with
    /// [`Error::Truncated`] if `private_data` is shorter than [`CMA_HEADER_LEN`]. Every value
    /// is accepted.
    pub fn parse(private_data: &[u8]) -> Result<Self> {
        let b = private_data.get(..CMA_HEADER_LEN).ok_or(Error::Truncated)?;
        let mut src_addr = [0u8; 16];
        src_addr.copy_from_slice(&b[SRC_ADDR]);
        let mut dst_addr = [0u8; 16];
        dst_addr.copy_from_slice(&b[DST_ADDR]);
        Ok(Self {
            cma_version: b[VERSION],
            ip_version: b[IP_VERSION] >> 4,
            port: field::u16_at(b, PORT),
            src_addr,
            dst_addr,
        })
    }

    /// Writes the 36 header bytes at the start of `private_data`, reserved bits zero and the
    /// IP version masked to 4 bits. Fails with [`Error::BufferTooSmall`] if it is shorter.
    pub fn emit(&self, private_data: &mut [u8]) -> Result<()> {
        let b = private_data.get_mut(..CMA_HEADER_LEN).ok_or(Error::BufferTooSmall)?;
        b[VERSION] = self.cma_version;
        b[IP_VERSION] = (self.ip_version & 0x0f) << 4;
        field::set_u16(b, PORT, self.port);
        b[SRC_ADDR].copy_from_slice(&self.src_addr);
        b[DST_ADDR].copy_from_slice(&self.dst_addr);
        Ok(())
    }

    /// The active side's IP address, or `None` for an IP version other than 4 and 6.
    pub fn src_ip(&self) -> Option<IpAddr> {
        self.ip(&self.src_addr)
    }

    /// The passive side's IP address, or `None` for an IP version other than 4 and 6.
    pub fn dst_ip(&self) -> Option<IpAddr> {
        self.ip(&self.dst_addr)
    }

    fn ip(&self, addr: &[u8; 16]) -> Option<IpAddr> {
        // cma.c reads only the last four bytes of an IPv4 address (`union cma_ip_addr`).
        match self.ip_version {
            4 => Some(Ipv4Addr::new(addr[12], addr[13], addr[14], addr[15]).into()),
            6 => Some(Ipv6Addr::from(*addr).into()),
            _ => None,
        }
    }
}

fn v4_bytes(a: Ipv4Addr) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[12..].copy_from_slice(&a.octets());
    b
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The private data of the REQ of reference §7.9: 192.168.1.10 port 40000 to
    /// 192.168.1.20, no user data.
    fn reference_private_data() -> [u8; REQ_PRIVATE_DATA_LEN] {
        let mut p = [0u8; REQ_PRIVATE_DATA_LEN];
        p[..4].copy_from_slice(&[0x00, 0x40, 0x9c, 0x40]);
        p[16..20].copy_from_slice(&[192, 168, 1, 10]);
        p[32..36].copy_from_slice(&[192, 168, 1, 20]);
        p
    }

    #[test]
    fn golden_reference_header() {
        let p = reference_private_data();
        let h = CmaHeaderRepr::parse(&p).unwrap();
        assert_eq!(h, CmaHeaderRepr::new(40000, [192, 168, 1, 10].into(), [192, 168, 1, 20].into()).unwrap());
        assert_eq!(h.cma_version, CMA_VERSION);
        assert_eq!(h.ip_version, 4);
        assert_eq!(h.port, 40000);
        assert_eq!(h.src_ip(), Some(IpAddr::from([192, 168, 1, 10])));
        assert_eq!(h.dst_ip(), Some(IpAddr::from([192, 168, 1, 20])));
        assert_eq!(user_private_data(&p).map(<[u8]>::len), Some(REQ_USER_PRIVATE_DATA_LEN_MAX));

        let mut out = [0xa5u8; REQ_PRIVATE_DATA_LEN];
        out[CMA_HEADER_LEN..].fill(0);
        h.emit(&mut out).unwrap();
        assert_eq!(out, p);
    }

    #[test]
    fn ipv6_header() {
        let src: IpAddr = "fe80::1".parse().unwrap();
        let dst: IpAddr = "2001:db8::2".parse().unwrap();
        let h = CmaHeaderRepr::new(7174, src, dst).unwrap();
        let mut out = [0xa5u8; CMA_HEADER_LEN];
        h.emit(&mut out).unwrap();
        assert_eq!(out[..4], [0x00, 0x60, 0x1c, 0x06]);
        let back = CmaHeaderRepr::parse(&out).unwrap();
        assert_eq!((back.src_ip(), back.dst_ip()), (Some(src), Some(dst)));
        assert_eq!(CmaHeaderRepr::new(1, src, [10, 0, 0, 1].into()), None);
    }

    #[test]
    fn unknown_ip_version_round_trips() {
        let mut p = [0x11u8; CMA_HEADER_LEN];
        p[1] = 0x50;
        let h = CmaHeaderRepr::parse(&p).unwrap();
        assert_eq!(h.ip_version, 5);
        assert_eq!((h.src_ip(), h.dst_ip()), (None, None));
        let mut out = [0xa5u8; CMA_HEADER_LEN];
        h.emit(&mut out).unwrap();
        assert_eq!(out, p);
    }

    #[test]
    fn lengths() {
        assert_eq!(REQ_USER_PRIVATE_DATA_LEN_MAX, 56);
        assert_eq!(SIDR_REQ_USER_PRIVATE_DATA_LEN_MAX, 180);
        let p = [0u8; CMA_HEADER_LEN];
        for len in 0..CMA_HEADER_LEN {
            assert_eq!(CmaHeaderRepr::parse(&p[..len]), Err(Error::Truncated));
            assert_eq!(user_private_data(&p[..len]), None);
        }
        let h = CmaHeaderRepr::parse(&p).unwrap();
        let mut short = [0u8; CMA_HEADER_LEN - 1];
        assert_eq!(h.emit(&mut short), Err(Error::BufferTooSmall));
    }

    #[test]
    fn service_ids() {
        assert_eq!(service_id(PortSpace::TCP, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(split_service_id(0x0000_0000_0106_1c06), Some((PortSpace::TCP, 7174)));
        assert_eq!(split_service_id(0x0000_0000_0111_0001), Some((PortSpace::UDP, 1)));
        assert_eq!(split_service_id(0x1000_0000_0106_1c06), None);
        assert_eq!(PortSpace::TCP.to_string(), "TCP");
        assert_eq!(PortSpace(0x0999).to_string(), "0x0999");
    }

    proptest! {
        #[test]
        fn header_round_trips(
            cma_version in any::<u8>(),
            ip_version in 0u8..16,
            port in any::<u16>(),
            addrs in any::<([u8; 16], [u8; 16])>(),
        ) {
            let h = CmaHeaderRepr { cma_version, ip_version, port, src_addr: addrs.0, dst_addr: addrs.1 };
            let mut out = [0xa5u8; CMA_HEADER_LEN];
            h.emit(&mut out).unwrap();
            prop_assert_eq!(CmaHeaderRepr::parse(&out).unwrap(), h);
        }

        #[test]
        fn service_id_round_trips(ps in any::<u16>(), port in any::<u16>()) {
            prop_assert_eq!(split_service_id(service_id(PortSpace(ps), port)), Some((PortSpace(ps), port)));
        }

        #[test]
        fn any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = CmaHeaderRepr::parse(&bytes).map(|h| (h.src_ip(), h.dst_ip()));
        }
    }
}
