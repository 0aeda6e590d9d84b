//! # softrdma-pcap
//!
//! Capture files in and out, for RoCEv2 traffic.
//!
//! - [`CaptureReader`] reads classic pcap and pcapng files (Wireshark saves pcapng by
//!   default) and yields [`Frame`]s; [`Frame::ip_packet`] strips the link layer (Ethernet II
//!   with or without 802.1Q tags, Linux cooked capture v1 from `tcpdump -i any`, raw IP, BSD
//!   loopback) down to the IP packet that [`softrdma_wire`] parses.
//! - [`CaptureWriter`] writes a classic pcap of Ethernet frames: give it the RoCE packet (the
//!   UDP payload) and its [`Envelope`], and it adds the Ethernet, IP and UDP headers a
//!   RoCEv2 sender puts on the wire, so Wireshark decodes the file as it would a tcpdump of
//!   the real link.
//!
//! The file format work is the `pcap-file` crate's; header parsing is `etherparse`'s.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::time::Duration;

use etherparse::{EtherType, Ethernet2Header, LinuxSllHeader, LinuxSllProtocolType, SingleVlanHeader};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, PcapError};
use softrdma_wire::Envelope;
use softrdma_wire::datagram::{emit_ip_udp, ip_udp_headers};

/// Why a capture could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file could not be opened or created.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The path given.
        path: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The bytes are not a pcap or pcapng file, or the file is cut short.
    #[error("not a readable pcap/pcapng capture: {0}")]
    Format(#[from] PcapError),
    /// A RoCE packet too large for a UDP datagram was given to the writer.
    #[error("cannot frame the packet: {0}")]
    Frame(#[from] softrdma_wire::Error),
}

/// One captured frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// When it was captured, since the Unix epoch.
    pub timestamp: Duration,
    /// The link layer its bytes start with.
    pub link: DataLink,
    /// The captured bytes (possibly fewer than were on the wire; see `orig_len`).
    pub data: Vec<u8>,
    /// Its length on the wire.
    pub orig_len: u32,
}

/// Why a frame holds no IP packet to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotIp {
    /// The link layer is one this crate does not strip.
    UnsupportedLink(DataLink),
    /// The frame carries something other than IPv4 or IPv6 (ARP, LLDP, ...).
    OtherProtocol,
    /// The link-layer header is cut short.
    Truncated,
}

impl Frame {
    /// The IP packet inside the frame: link header and any 802.1Q / 802.1ad tags removed.
    pub fn ip_packet(&self) -> Result<&[u8], NotIp> {
        let (mut ether_type, mut rest) = match self.link {
            DataLink::ETHERNET => {
                let (h, rest) = Ethernet2Header::from_slice(&self.data).map_err(|_| NotIp::Truncated)?;
                (h.ether_type, rest)
            }
            DataLink::LINUX_SLL => {
                let (h, rest) = LinuxSllHeader::from_slice(&self.data).map_err(|_| NotIp::Truncated)?;
                match h.protocol_type {
                    LinuxSllProtocolType::EtherType(t) => (t, rest),
                    _ => return Err(NotIp::OtherProtocol),
                }
            }
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => return ip_or_not(&self.data),
            // BSD loopback: a 4-byte address family in host order, then the packet.
            DataLink::NULL | DataLink::LOOP => {
                return self.data.get(4..).ok_or(NotIp::Truncated).and_then(ip_or_not);
            }
            other => return Err(NotIp::UnsupportedLink(other)),
        };
        while matches!(
            ether_type,
            EtherType::VLAN_TAGGED_FRAME | EtherType::PROVIDER_BRIDGING | EtherType::VLAN_DOUBLE_TAGGED_FRAME
        ) {
            let (tag, after) = SingleVlanHeader::from_slice(rest).map_err(|_| NotIp::Truncated)?;
            ether_type = tag.ether_type;
            rest = after;
        }
        if ether_type == EtherType::IPV4 || ether_type == EtherType::IPV6 {
            Ok(rest)
        } else {
            Err(NotIp::OtherProtocol)
        }
    }
}

fn ip_or_not(bytes: &[u8]) -> Result<&[u8], NotIp> {
    match bytes.first().map(|b| b >> 4) {
        Some(4 | 6) => Ok(bytes),
        Some(_) => Err(NotIp::OtherProtocol),
        None => Err(NotIp::Truncated),
    }
}

enum Inner<R: Read> {
    Pcap(PcapReader<R>),
    PcapNg(Box<PcapNgReader<R>>),
}

/// Reads frames from a pcap or pcapng stream; the format is told by its magic number.
pub struct CaptureReader<R: Read> {
    inner: Inner<R>,
}

/// pcapng files start with a section header block, type 0x0A0D0D0A.
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

impl CaptureReader<BufReader<File>> {
    /// Opens a capture file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let path = path.as_ref();
        let open =
            |p: &Path| File::open(p).map_err(|source| CaptureError::Open { path: p.display().to_string(), source });
        let mut magic = [0u8; 4];
        let is_ng = open(path)?.read_exact(&mut magic).is_ok() && magic == PCAPNG_MAGIC;
        Self::new(BufReader::new(open(path)?), is_ng)
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads from `reader`, a pcapng stream if `pcapng` is set, a classic pcap otherwise.
    pub fn new(reader: R, pcapng: bool) -> Result<Self, CaptureError> {
        let inner = if pcapng {
            Inner::PcapNg(Box::new(PcapNgReader::new(reader)?))
        } else {
            Inner::Pcap(PcapReader::new(reader)?)
        };
        Ok(Self { inner })
    }

    /// The next frame, or `None` at the end of the capture.
    pub fn next_frame(&mut self) -> Option<Result<Frame, CaptureError>> {
        match &mut self.inner {
            Inner::Pcap(r) => {
                let link = r.header().datalink;
                r.next_packet().map(|p| {
                    let p = p?;
                    Ok(Frame { timestamp: p.timestamp, link, orig_len: p.orig_len, data: p.data.into_owned() })
                })
            }
            Inner::PcapNg(r) => loop {
                let block = match r.next_block()? {
                    Ok(block) => block,
                    Err(e) => return Some(Err(e.into())),
                };
                // Copy the packet out of the block before asking the reader for its interface.
                let (interface, timestamp, orig_len, data) = match block {
                    Block::EnhancedPacket(p) => (p.interface_id, p.timestamp, p.original_len, p.data.into_owned()),
                    Block::SimplePacket(p) => (0, Duration::ZERO, p.original_len, p.data.into_owned()),
                    _ => continue,
                };
                let link = r.interfaces().get(interface as usize).map_or(DataLink::ETHERNET, |i| i.linktype);
                return Some(Ok(Frame { timestamp, link, orig_len, data }));
            },
        }
    }
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<Frame, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_frame()
    }
}

/// Writes RoCEv2 packets as Ethernet frames to a classic pcap (microsecond timestamps).
pub struct CaptureWriter<W: Write> {
    writer: PcapWriter<W>,
    frame: Vec<u8>,
}

impl CaptureWriter<BufWriter<File>> {
    /// Creates (or truncates) a capture file.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let path = path.as_ref();
        let file =
            File::create(path).map_err(|source| CaptureError::Open { path: path.display().to_string(), source })?;
        Self::new(BufWriter::new(file))
    }
}

impl<W: Write> CaptureWriter<W> {
    /// Writes a pcap header for Ethernet frames to `writer`.
    pub fn new(writer: W) -> Result<Self, CaptureError> {
        let header = PcapHeader { datalink: DataLink::ETHERNET, ..Default::default() };
        Ok(Self { writer: PcapWriter::with_header(writer, header)?, frame: Vec::with_capacity(9000) })
    }

    /// Writes one RoCE packet (a UDP payload: BTH through ICRC) that travelled inside
    /// `envelope`, framed as RoCEv2 is on Ethernet. The MAC addresses are made up from
    /// the IP addresses ([`mac_for`]); the IP and UDP headers are those Linux sends.
    pub fn write_roce(
        &mut self,
        timestamp: Duration,
        envelope: &Envelope,
        udp_payload: &[u8],
    ) -> Result<(), CaptureError> {
        frame_roce(envelope, udp_payload, &mut self.frame)?;
        let len = u32::try_from(self.frame.len()).unwrap_or(u32::MAX);
        self.writer.write_packet(&PcapPacket::new(timestamp, len, &self.frame))?;
        Ok(())
    }

    /// Writes an already framed Ethernet frame.
    pub fn write_frame(&mut self, timestamp: Duration, frame: &[u8]) -> Result<(), CaptureError> {
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        self.writer.write_packet(&PcapPacket::new(timestamp, len, frame))?;
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(self) -> W {
        self.writer.into_writer()
    }
}

/// Frames one RoCE packet (a UDP payload: BTH through ICRC) that travelled inside
/// `envelope` as RoCEv2 is on Ethernet, into `frame` (cleared first; it keeps its capacity, so
/// a caller that reuses it allocates nothing per packet): what
/// [`CaptureWriter::write_roce`] writes, for a caller that keeps frames before writing them.
pub fn frame_roce(envelope: &Envelope, udp_payload: &[u8], frame: &mut Vec<u8>) -> Result<(), CaptureError> {
    let (ip, udp) = ip_udp_headers(envelope, udp_payload.len())?;
    let ether_type = match envelope {
        Envelope::V4(_) => EtherType::IPV4,
        Envelope::V6(_) => EtherType::IPV6,
    };
    let eth =
        Ethernet2Header { source: mac_for(envelope.src_ip()), destination: mac_for(envelope.dst_ip()), ether_type };
    frame.clear();
    frame.extend_from_slice(&eth.to_bytes());
    let at = frame.len();
    frame.resize(at + ip.header_len() + 8, 0);
    emit_ip_udp(&ip, &udp, &mut frame[at..])?;
    frame.extend_from_slice(udp_payload);
    Ok(())
}

/// A locally administered MAC address standing for an IP address in synthesised frames:
/// `02:` followed by the last five bytes of the address (IPv4: `02:00:a:b:c:d`).
pub fn mac_for(ip: std::net::IpAddr) -> [u8; 6] {
    let v6 = match ip {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    let o = v6.octets();
    [0x02, o[11], o[12], o[13], o[14], o[15]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::{EthernetFrameRepr, RocePacket};

    fn data(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data").join(name)
    }

    #[test]
    fn reads_kernel_capture_and_rewrites_it_identically() {
        // Re-frame every RoCE packet of an rxe capture from its envelope alone: rxe's IP
        // headers (TTL 64, TOS 0, DF, UDP checksum 0) are the ones the writer synthesises,
        // so only the MAC addresses may differ.
        let frames: Vec<Frame> = CaptureReader::open(data("rxe2rxe-rping.pcap")).unwrap().map(Result::unwrap).collect();
        assert_eq!(frames.len(), 67);
        let mut writer = CaptureWriter::new(Vec::new()).unwrap();
        let mut originals = Vec::new();
        for f in &frames {
            let Ok(ip) = f.ip_packet() else { continue };
            let Ok(dgram) = softrdma_wire::datagram::UdpDatagram::parse(ip) else {
                continue;
            };
            if !dgram.is_roce() {
                continue;
            }
            writer.write_roce(f.timestamp, &dgram.envelope(), dgram.payload).unwrap();
            originals.push(f.clone());
        }
        let bytes = writer.into_inner();
        let rewritten: Vec<Frame> = CaptureReader::new(&bytes[..], false).unwrap().map(Result::unwrap).collect();
        assert_eq!(rewritten.len(), 65);
        for (a, b) in originals.iter().zip(&rewritten) {
            assert_eq!(a.timestamp, b.timestamp);
            assert_eq!(a.data[12..], b.data[12..], "everything after the MAC addresses is identical");
            assert!(EthernetFrameRepr::parse(&b.data).is_ok());
        }
    }

    #[test]
    fn non_ip_frames_are_told_apart() {
        let arp = CaptureReader::open(data("rxe2rxe-rping.pcap")).unwrap().next().unwrap().unwrap();
        assert_eq!(arp.ip_packet(), Err(NotIp::OtherProtocol), "frame 1 is ARP");
        let raw = Frame { timestamp: Duration::ZERO, link: DataLink::RAW, data: vec![0x45, 0], orig_len: 2 };
        assert_eq!(raw.ip_packet(), Ok(&[0x45, 0][..]));
        let other = Frame { link: DataLink::IEEE802_11, ..raw.clone() };
        assert_eq!(other.ip_packet(), Err(NotIp::UnsupportedLink(DataLink::IEEE802_11)));
    }

    #[test]
    fn linux_cooked_and_vlan_frames_reach_the_ip_packet() {
        let frame = CaptureReader::open(data("rxe2rxe-ib_read_lat.pcap")).unwrap().map(Result::unwrap).nth(24).unwrap();
        let ip = frame.ip_packet().unwrap().to_vec();
        // Linux SLL v1: packet type, ARPHRD, address length, 8 address bytes, protocol.
        let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(&ip);
        let cooked = Frame { link: DataLink::LINUX_SLL, data: sll, ..frame.clone() };
        assert_eq!(cooked.ip_packet().unwrap(), &ip[..]);
        // One 802.1Q tag (VLAN 100) between the MACs and the EtherType.
        let mut tagged = frame.data[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64, 0x08, 0x00]);
        tagged.extend_from_slice(&ip);
        let vlan = Frame { data: tagged, ..frame.clone() };
        assert_eq!(vlan.ip_packet().unwrap(), &ip[..]);
        let dgram = softrdma_wire::datagram::UdpDatagram::parse(&ip).unwrap();
        assert!(RocePacket::new_checked(dgram.payload).unwrap().verify_icrc(&dgram.envelope()));
    }

    #[test]
    fn reads_pcapng() {
        // Convert a classic capture to pcapng with the crate's own writer and read it back.
        use pcap_file::pcapng::PcapNgWriter;
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
        use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
        let frames: Vec<Frame> =
            CaptureReader::open(data("rxe2rxe-ibv_ud_pingpong.pcap")).unwrap().map(Result::unwrap).collect();
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 0, options: vec![] })
            .unwrap();
        for f in &frames {
            let epb = EnhancedPacketBlock {
                interface_id: 0,
                timestamp: f.timestamp,
                original_len: f.orig_len,
                data: std::borrow::Cow::Borrowed(&f.data),
                options: vec![],
            };
            w.write_pcapng_block(epb).unwrap();
        }
        let bytes = w.into_inner();
        assert_eq!(bytes[..4], PCAPNG_MAGIC);
        let back: Vec<Frame> = CaptureReader::new(&bytes[..], true).unwrap().map(Result::unwrap).collect();
        assert_eq!(back, frames);
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = CaptureReader::open("/nonexistent/x.pcap").err().unwrap();
        assert!(err.to_string().starts_with("cannot open /nonexistent/x.pcap: "), "{err}");
    }
}
