//! Newtypes for the protocol quantities that travel in headers.
//!
//! A raw `u32` is never a QPN or an R_Key by accident: each quantity has its own type, and the
//! 24-bit ones refuse values that do not fit.

use core::fmt;

macro_rules! u24_newtype {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(u32);

        impl $name {
            /// The largest value a 24-bit field holds.
            pub const MAX: Self = Self(0x00ff_ffff);

            /// Returns `None` when `value` does not fit in 24 bits.
            pub const fn new(value: u32) -> Option<Self> {
                if value <= Self::MAX.0 { Some(Self(value)) } else { None }
            }

            /// Keeps the low 24 bits of `value`, as the wire does.
            pub const fn from_u24_truncating(value: u32) -> Self {
                Self(value & Self::MAX.0)
            }

            /// The value, always below 2^24.
            pub const fn value(self) -> u32 {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($what, "({:#08x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#08x}", self.0)
            }
        }
    };
}

u24_newtype!(
    /// A queue pair number (24 bits). QPN 0 is the SMI, QPN 1 the GSI that carries CM MADs.
    Qpn,
    "Qpn"
);

u24_newtype!(
    /// The responder's message sequence number carried in every AETH (24 bits).
    Msn,
    "Msn"
);

impl Qpn {
    /// The general services interface QP, which carries every CM MAD (IBA 13.4.6).
    pub const GSI: Self = Self(1);
    /// The destination QPN of every multicast packet (IBA 10.5.2.1: `0xFFFFFF`, "the
    /// permissive QP"): the receiving device hands it to each of its QPs attached to the
    /// destination group.
    pub const MULTICAST: Self = Self(0xff_ffff);
}

/// A remote key: names a memory region (or window) to the responder. Opaque 32 bits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RKey(pub u32);

impl fmt::Debug for RKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RKey({:#010x})", self.0)
    }
}

impl fmt::Display for RKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// A queue key, checked by UD and GSI receivers against the DETH. Opaque 32 bits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct QKey(pub u32);

impl QKey {
    /// The Q_Key of QP1, the GSI (IBA 13.4.6.1; Linux `IB_QP1_QKEY`).
    pub const GSI: Self = Self(0x8001_0000);
    /// The Q_Key rdma_cm gives UD QPs in the UDP port space (`RDMA_UDP_QKEY`).
    pub const RDMA_CM_UDP: Self = Self(0x0123_4567);
}

impl fmt::Debug for QKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QKey({:#010x})", self.0)
    }
}

impl fmt::Display for QKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// A partition key. RoCE uses the default full-member key 0xFFFF.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct PKey(pub u16);

impl PKey {
    /// The default partition, full membership (IBA 10.9.1.2).
    pub const DEFAULT: Self = Self(0xffff);
}

impl Default for PKey {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A 128-bit global identifier. On RoCEv2 a GID *is* an IP address: IPv6 verbatim, IPv4
/// mapped as `::ffff:a.b.c.d` (Linux `rdma_ip2gid`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address.
    pub fn from_ip(ip: core::net::IpAddr) -> Self {
        match ip {
            core::net::IpAddr::V4(v4) => Self(v4.to_ipv6_mapped().octets()),
            core::net::IpAddr::V6(v6) => Self(v6.octets()),
        }
    }

    /// The IP address of a GID: IPv4 for an IPv4-mapped GID, IPv6 otherwise.
    pub fn to_ip(self) -> core::net::IpAddr {
        let v6 = core::net::Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => v4.into(),
            None => v6.into(),
        }
    }

    /// Whether the GID names a multicast group: `ff00::/8`, or an IPv4-mapped
    /// `::ffff:224.0.0.0/4` (Linux `rdma_is_multicast_addr`, which `ibv_attach_mcast`
    /// checks).
    pub fn is_multicast(self) -> bool {
        self.0[0] == 0xff || matches!(self.to_ip(), core::net::IpAddr::V4(v4) if v4.is_multicast())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", core::net::Ipv6Addr::from(self.0))
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", core::net::Ipv6Addr::from(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_gids() {
        let gid = |s: &str| Gid::from_ip(s.parse().unwrap());
        for m in ["230.1.2.3", "224.0.0.1", "239.255.255.255", "ff0e::1", "ff02::1:2", "ff1e::db8"] {
            assert!(gid(m).is_multicast(), "{m}");
        }
        for u in ["10.0.0.1", "223.255.255.255", "240.0.0.1", "::1", "fe80::1", "2001:db8::1", "0.0.0.0"] {
            assert!(!gid(u).is_multicast(), "{u}");
        }
    }

    #[test]
    fn u24_bounds() {
        assert_eq!(Qpn::new(0x00ff_ffff), Some(Qpn::MAX));
        assert_eq!(Qpn::new(0x0100_0000), None);
        assert_eq!(Qpn::from_u24_truncating(0x1234_5678).value(), 0x34_5678);
        assert_eq!(format!("{:?}", Msn::new(5).unwrap()), "Msn(0x000005)");
    }

    #[test]
    fn gid_maps_ipv4() {
        let gid = Gid::from_ip([192, 168, 1, 10].into());
        assert_eq!(gid.0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 10]);
        assert_eq!(gid.to_string(), "::ffff:192.168.1.10");
        assert_eq!(gid.to_ip(), core::net::IpAddr::from([192, 168, 1, 10]));
        let v6: core::net::IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(Gid::from_ip(v6).to_ip(), v6);
    }
}
