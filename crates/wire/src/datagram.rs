//! The framing around a RoCEv2 packet: IPv4 or IPv6, UDP to port 4791, and for capture
//! files Ethernet II. The headers themselves are etherparse's; this module adds the RoCEv2
//! rules (no IP options or fragments, UDP lengths consistent, IPv4 checksum valid) and
//! writes the lengths and checksum on emit, so that a `Repr` cannot emit an inconsistent
//! datagram.

use core::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header, Ipv6Header, UdpHeader};

use crate::icrc::{Envelope, Ipv4Envelope, Ipv6Envelope};
use crate::roce::{RocePacket, RoceRepr};
use crate::{Error, ROCEV2_UDP_PORT, Result};

/// An IPv4 or IPv6 header (no IPv4 options, no IPv6 extension headers).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum IpRepr {
    /// IPv4.
    V4(Ipv4Header),
    /// IPv6.
    V6(Ipv6Header),
}

impl IpRepr {
    /// Length of the header in bytes.
    pub fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => Ipv4Header::MIN_LEN,
            IpRepr::V6(_) => Ipv6Header::LEN,
        }
    }
}

/// A UDP datagram carried in IP, as received: headers checked, payload borrowed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct UdpDatagram<'a> {
    /// The IP header.
    pub ip: IpRepr,
    /// The UDP header.
    pub udp: UdpHeader,
    /// The UDP payload, exactly `udp.length - 8` bytes.
    pub payload: &'a [u8],
}

impl<'a> UdpDatagram<'a> {
    /// Reads an IP packet holding a UDP datagram. Bytes past the IP length (Ethernet
    /// padding) are ignored.
    ///
    /// Fails with [`Error::NotRoce`] for anything but UDP, [`Error::Unsupported`] for IPv4
    /// options, IPv6 extension headers or fragments, [`Error::BadIpChecksum`],
    /// [`Error::BadLength`] when the IP and UDP lengths disagree and [`Error::Truncated`]
    /// when the bytes end early.
    pub fn parse(ip_packet: &'a [u8]) -> Result<Self> {
        let version = ip_packet.first().ok_or(Error::Truncated)? >> 4;
        let (ip, ip_payload) = match version {
            4 => {
                let (h, _) = Ipv4Header::from_slice(ip_packet).map_err(|_| Error::Truncated)?;
                if h.header_len() != Ipv4Header::MIN_LEN {
                    return Err(Error::Unsupported);
                }
                if h.more_fragments || h.fragment_offset.value() != 0 {
                    return Err(Error::Unsupported);
                }
                if h.header_checksum != h.calc_header_checksum() {
                    return Err(Error::BadIpChecksum);
                }
                if h.protocol != IpNumber::UDP {
                    return Err(Error::NotRoce);
                }
                let end = usize::from(h.total_len);
                let payload = ip_packet.get(Ipv4Header::MIN_LEN..end).ok_or(Error::Truncated)?;
                (IpRepr::V4(h), payload)
            }
            6 => {
                let (h, _) = Ipv6Header::from_slice(ip_packet).map_err(|_| Error::Truncated)?;
                if h.next_header.is_ipv6_ext_header_value() {
                    return Err(Error::Unsupported);
                }
                if h.next_header != IpNumber::UDP {
                    return Err(Error::NotRoce);
                }
                let end = Ipv6Header::LEN + usize::from(h.payload_length);
                let payload = ip_packet.get(Ipv6Header::LEN..end).ok_or(Error::Truncated)?;
                (IpRepr::V6(h), payload)
            }
            _ => return Err(Error::NotRoce),
        };
        let (udp, _) = UdpHeader::from_slice(ip_payload).map_err(|_| Error::Truncated)?;
        if usize::from(udp.length) != ip_payload.len() {
            return Err(Error::BadLength);
        }
        Ok(Self { ip, udp, payload: &ip_payload[UdpHeader::LEN..] })
    }

    /// Whether the datagram goes to the RoCEv2 port.
    pub fn is_roce(&self) -> bool {
        self.udp.destination_port == ROCEV2_UDP_PORT
    }

    /// The fields of the IP and UDP headers that the ICRC covers.
    pub fn envelope(&self) -> Envelope {
        envelope(&self.ip, &self.udp)
    }
}

fn envelope(ip: &IpRepr, udp: &UdpHeader) -> Envelope {
    match ip {
        IpRepr::V4(h) => Envelope::V4(Ipv4Envelope {
            src: Ipv4Addr::from(h.source),
            dst: Ipv4Addr::from(h.destination),
            identification: h.identification,
            dont_fragment: h.dont_fragment,
            src_port: udp.source_port,
            dst_port: udp.destination_port,
        }),
        IpRepr::V6(h) => Envelope::V6(Ipv6Envelope {
            src: Ipv6Addr::from(h.source),
            dst: Ipv6Addr::from(h.destination),
            src_port: udp.source_port,
            dst_port: udp.destination_port,
        }),
    }
}

/// Hop limit (IPv4 TTL) that softrdma sends with, the Linux default route hop limit.
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// The IP and UDP headers a RoCEv2 sender puts before a UDP payload of `udp_payload_len`
/// bytes inside `envelope`, the way Linux sends them from a UDP socket: TOS / traffic class
/// 0, TTL / hop limit 64, IPv6 flow label 0, UDP checksum 0 (as rxe does; the ICRC masks it).
///
/// Used to frame packets for capture files without parsing them (they may be malformed).
pub fn ip_udp_headers(envelope: &Envelope, udp_payload_len: usize) -> Result<(IpRepr, UdpHeader)> {
    ip_udp_headers_with(envelope, udp_payload_len, DEFAULT_HOP_LIMIT, 0, 0)
}

/// [`ip_udp_headers`] with the variant fields the envelope does not carry: hop limit (TTL),
/// traffic class (TOS: DSCP and ECN) and, for IPv6, the flow label (20 bits; higher bits
/// are dropped). A UD receiver rebuilds the header it received this way for the GRH.
pub fn ip_udp_headers_with(
    envelope: &Envelope,
    udp_payload_len: usize,
    hop_limit: u8,
    traffic_class: u8,
    flow_label: u32,
) -> Result<(IpRepr, UdpHeader)> {
    let udp_len = u16::try_from(UdpHeader::LEN + udp_payload_len).map_err(|_| Error::BadLength)?;
    let udp = UdpHeader {
        source_port: envelope.src_port(),
        destination_port: envelope.dst_port(),
        length: udp_len,
        checksum: 0,
    };
    let ip = match envelope {
        Envelope::V4(e) => {
            let mut h = Ipv4Header::new(udp_len, hop_limit, IpNumber::UDP, e.src.octets(), e.dst.octets())
                .map_err(|_| Error::BadLength)?;
            h.identification = e.identification;
            h.dont_fragment = e.dont_fragment;
            h.dscp = etherparse::IpDscp::try_new(traffic_class >> 2).unwrap_or_default();
            h.ecn = etherparse::IpEcn::try_new(traffic_class & 3).unwrap_or_default();
            h.header_checksum = h.calc_header_checksum();
            IpRepr::V4(h)
        }
        Envelope::V6(e) => IpRepr::V6(Ipv6Header {
            traffic_class,
            flow_label: etherparse::Ipv6FlowLabel::try_new(flow_label & 0xf_ffff).unwrap_or_default(),
            payload_length: udp_len,
            next_header: IpNumber::UDP,
            hop_limit,
            source: e.src.octets(),
            destination: e.dst.octets(),
        }),
    };
    Ok((ip, udp))
}

/// Writes `ip` and `udp` as they are (no length or checksum fixing) to the start of `buf`;
/// returns the bytes written.
pub fn emit_ip_udp(ip: &IpRepr, udp: &UdpHeader, buf: &mut [u8]) -> Result<usize> {
    let ip_len = ip.header_len();
    let buf = buf.get_mut(..ip_len + UdpHeader::LEN).ok_or(Error::BufferTooSmall)?;
    match ip {
        IpRepr::V4(h) => {
            if h.header_len() != Ipv4Header::MIN_LEN {
                return Err(Error::Unsupported);
            }
            buf[..ip_len].copy_from_slice(&h.to_bytes());
        }
        IpRepr::V6(h) => buf[..ip_len].copy_from_slice(&h.to_bytes()),
    }
    buf[ip_len..].copy_from_slice(&udp.to_bytes());
    Ok(buf.len())
}

/// A RoCEv2 packet with its IP and UDP headers.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DatagramRepr<'a> {
    /// The IP header. On emit its length (and IPv4 checksum) fields are recomputed.
    pub ip: IpRepr,
    /// The UDP header. On emit its length is recomputed; the checksum is written as given
    /// (RoCEv2 senders use 0, and the ICRC masks it).
    pub udp: UdpHeader,
    /// The RoCE packet.
    pub roce: RoceRepr<'a>,
}

impl<'a> DatagramRepr<'a> {
    /// Reads an IP packet holding a RoCEv2 packet and checks everything, the ICRC included.
    pub fn parse(ip_packet: &'a [u8]) -> Result<Self> {
        let dgram = UdpDatagram::parse(ip_packet)?;
        if !dgram.is_roce() {
            return Err(Error::NotRoce);
        }
        let roce = RoceRepr::parse(&RocePacket::new_unchecked(dgram.payload), &dgram.envelope())?;
        Ok(Self { ip: dgram.ip, udp: dgram.udp, roce })
    }

    /// The fields of the IP and UDP headers that the ICRC covers.
    pub fn envelope(&self) -> Envelope {
        envelope(&self.ip, &self.udp)
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub fn buffer_len(&self) -> usize {
        self.ip.header_len() + UdpHeader::LEN + self.roce.buffer_len()
    }

    /// Refuses what [`parse`](Self::parse) would refuse, so that emitting then parsing gives
    /// back the same value: IPv4 options or fragments, IPv6 extension headers, a protocol
    /// other than UDP ([`Error::Unsupported`]), a UDP port other than 4791
    /// ([`Error::NotRoce`]).
    fn validate_framing(&self) -> Result<()> {
        let udp_only = match &self.ip {
            IpRepr::V4(h) => {
                h.header_len() == Ipv4Header::MIN_LEN
                    && !h.more_fragments
                    && h.fragment_offset.value() == 0
                    && h.protocol == IpNumber::UDP
            }
            IpRepr::V6(h) => h.next_header == IpNumber::UDP,
        };
        if !udp_only {
            return Err(Error::Unsupported);
        }
        if self.udp.destination_port != ROCEV2_UDP_PORT {
            return Err(Error::NotRoce);
        }
        Ok(())
    }

    /// Writes IP header, UDP header and RoCE packet (with its ICRC) to the start of `buf`.
    /// Returns the number of bytes written. IPv4 options are refused ([`Error::Unsupported`]):
    /// RoCEv2 does not use them and [`parse`](Self::parse) would not accept them back.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.validate_framing()?;
        let len = self.buffer_len();
        let buf = buf.get_mut(..len).ok_or(Error::BufferTooSmall)?;
        let roce_len = self.roce.buffer_len();
        let udp_len = u16::try_from(UdpHeader::LEN + roce_len).map_err(|_| Error::BadLength)?;
        let mut udp = self.udp.clone();
        udp.length = udp_len;
        let ip_len = match &self.ip {
            IpRepr::V4(h) => {
                let mut h = h.clone();
                h.total_len = udp_len.checked_add(Ipv4Header::MIN_LEN as u16).ok_or(Error::BadLength)?;
                h.header_checksum = h.calc_header_checksum();
                let bytes = h.to_bytes();
                buf[..bytes.len()].copy_from_slice(&bytes);
                bytes.len()
            }
            IpRepr::V6(h) => {
                let mut h = h.clone();
                h.payload_length = udp_len;
                buf[..Ipv6Header::LEN].copy_from_slice(&h.to_bytes());
                Ipv6Header::LEN
            }
        };
        buf[ip_len..ip_len + UdpHeader::LEN].copy_from_slice(&udp.to_bytes());
        let env = envelope(&self.ip, &udp);
        self.roce.emit(&env, &mut buf[ip_len + UdpHeader::LEN..])?;
        Ok(len)
    }
}

/// A RoCEv2 packet in an Ethernet II frame, as capture files hold it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EthernetFrameRepr<'a> {
    /// The Ethernet header. Its EtherType must name the IP version of `datagram`.
    pub ethernet: Ethernet2Header,
    /// The IP datagram.
    pub datagram: DatagramRepr<'a>,
}

impl<'a> EthernetFrameRepr<'a> {
    /// Reads an Ethernet II frame holding a RoCEv2 packet. Bytes after the IP packet
    /// (Ethernet padding) are ignored.
    pub fn parse(frame: &'a [u8]) -> Result<Self> {
        let (ethernet, rest) = Ethernet2Header::from_slice(frame).map_err(|_| Error::Truncated)?;
        if ethernet.ether_type != EtherType::IPV4 && ethernet.ether_type != EtherType::IPV6 {
            return Err(Error::NotRoce);
        }
        let datagram = DatagramRepr::parse(rest)?;
        if ethernet.ether_type != ether_type_of(&datagram.ip) {
            return Err(Error::BadEtherType);
        }
        Ok(Self { ethernet, datagram })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub fn buffer_len(&self) -> usize {
        Ethernet2Header::LEN + self.datagram.buffer_len()
    }

    /// Writes the frame (without FCS) to the start of `buf`; returns its length. Fails with
    /// [`Error::BadEtherType`] when the EtherType does not name the datagram's IP version.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if self.ethernet.ether_type != ether_type_of(&self.datagram.ip) {
            return Err(Error::BadEtherType);
        }
        let len = self.buffer_len();
        let buf = buf.get_mut(..len).ok_or(Error::BufferTooSmall)?;
        buf[..Ethernet2Header::LEN].copy_from_slice(&self.ethernet.to_bytes());
        self.datagram.emit(&mut buf[Ethernet2Header::LEN..])?;
        Ok(len)
    }
}

/// The EtherType that announces `ip`.
pub fn ether_type_of(ip: &IpRepr) -> EtherType {
    match ip {
        IpRepr::V4(_) => EtherType::IPV4,
        IpRepr::V6(_) => EtherType::IPV6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bth::BthRepr;
    use crate::ext::deth::DethRepr;
    use crate::opcode::Opcode;
    use crate::psn::Psn;
    use crate::roce::ExtHeaders;
    use crate::types::{PKey, QKey, Qpn};

    fn hex(s: &str) -> std::vec::Vec<u8> {
        s.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect()
    }

    const EXAMPLE_A: &str = "45 00 00 3c 12 34 40 00 40 11 a5 0e c0 a8 01 0a c0 a8 01 14 c1 32 12 b7 00 28 00 00
        04 00 ff ff 00 00 00 12 80 12 34 56 00 00 7f 12 34 56 00 00 00 00 12 34 00 00 00 40 f6 17 39 8e";

    #[test]
    fn ipv4_example_round_trips_byte_for_byte() {
        let bytes = hex(EXAMPLE_A);
        let d = DatagramRepr::parse(&bytes).unwrap();
        assert_eq!(d.roce.bth.opcode, Opcode::RC_SEND_ONLY);
        assert_eq!(d.roce.payload.len(), 16);
        let mut out = std::vec![0xa5u8; d.buffer_len()];
        assert_eq!(d.emit(&mut out), Ok(bytes.len()));
        assert_eq!(out, bytes);
    }

    #[test]
    fn ipv4_header_problems() {
        let good = hex(EXAMPLE_A);
        let mut ttl = good.clone();
        ttl[8] = 63; // checksum no longer matches
        assert_eq!(DatagramRepr::parse(&ttl), Err(Error::BadIpChecksum));
        let mut port = good.clone();
        port[23] = 0xb8; // UDP to 4792
        assert_eq!(DatagramRepr::parse(&port), Err(Error::NotRoce));
        let mut udp_len = good.clone();
        udp_len[25] = 0x24;
        assert_eq!(DatagramRepr::parse(&udp_len), Err(Error::BadLength));
        assert_eq!(DatagramRepr::parse(&good[..40]), Err(Error::Truncated));
        assert_eq!(DatagramRepr::parse(&[]), Err(Error::Truncated));
        // Ethernet padding after the IP packet is ignored.
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 6]);
        assert!(DatagramRepr::parse(&padded).is_ok());
    }

    #[test]
    fn ipv6_round_trip_and_icrc() {
        let ip = Ipv6Header {
            traffic_class: 0,
            flow_label: Default::default(),
            payload_length: 0,
            next_header: IpNumber::UDP,
            hop_limit: 64,
            source: "fd00::1".parse::<Ipv6Addr>().unwrap().octets(),
            destination: "fd00::2".parse::<Ipv6Addr>().unwrap().octets(),
        };
        let d = DatagramRepr {
            ip: IpRepr::V6(ip),
            udp: UdpHeader { source_port: 0xc000, destination_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
            roce: RoceRepr {
                bth: BthRepr {
                    opcode: Opcode::UD_SEND_ONLY,
                    solicited_event: false,
                    mig_req: false,
                    pkey: PKey::DEFAULT,
                    fecn: false,
                    becn: false,
                    dest_qp: Qpn::new(5).unwrap(),
                    ack_req: false,
                    psn: Psn::new(1).unwrap(),
                },
                ext: ExtHeaders {
                    deth: Some(DethRepr { qkey: QKey(0x1234), src_qp: Qpn::new(6).unwrap() }),
                    ..Default::default()
                },
                payload: b"over ipv6",
            },
        };
        let mut out = std::vec![0xa5u8; d.buffer_len()];
        d.emit(&mut out).unwrap();
        let parsed = DatagramRepr::parse(&out).unwrap();
        let IpRepr::V6(h) = &parsed.ip else { panic!("not v6") };
        assert_eq!(usize::from(h.payload_length), out.len() - 40);
        assert_eq!(parsed.roce, d.roce);
        // The hop limit is variant: a router decrements it and the ICRC still holds.
        out[7] = 63;
        assert!(DatagramRepr::parse(&out).is_ok());
        out[8] ^= 1; // source address is covered
        assert_eq!(DatagramRepr::parse(&out), Err(Error::BadIcrc));
    }

    #[test]
    fn framing_raw_bytes_matches_a_parsed_datagram() {
        let bytes = hex(EXAMPLE_A);
        let d = DatagramRepr::parse(&bytes).unwrap();
        let (ip, udp) = ip_udp_headers(&d.envelope(), bytes.len() - 28).unwrap();
        let mut out = [0xa5u8; 28];
        assert_eq!(emit_ip_udp(&ip, &udp, &mut out), Ok(28));
        assert_eq!(&out[..], &bytes[..28], "same header as the reference example (TTL 64, TOS 0)");
    }
}
