//! # softrdma-wire
//!
//! The RoCEv2 wire format, byte-exact with the Linux kernel's Soft-RoCE (rxe): the
//! InfiniBand transport headers carried in UDP port 4791, the ICRC that protects them, the
//! 40-byte GRH a UD receive buffer starts with, and the management datagrams (MADs) of the
//! IB connection manager with rdma_cm's private-data header.
//!
//! The crate does no I/O, never allocates and has no `unsafe`. Its shape is smoltcp's:
//!
//! - every header has a zero-copy view `XxxPacket<T: AsRef<[u8]>>` over a byte buffer, whose
//!   accessors never panic once `check_len` (or `new_checked`) has passed, and setters when
//!   `T: AsMut<[u8]>`;
//! - and a validated `XxxRepr` with `parse` (view → value) and `emit` (value → bytes), where
//!   `emit` writes every byte it owns, reserved bits included.
//!
//! One table, [`opcode::OPCODES`], says for every opcode which headers follow the BTH and what
//! payload is allowed; [`RocePacket`] and [`RoceRepr`] use it to lay out whole packets.
//! The ICRC is checked by every [`RoceRepr::parse`] and written by every [`RoceRepr::emit`];
//! what it covers outside the UDP payload is an [`Envelope`].
//!
//! ```
//! use softrdma_wire::{Envelope, Ipv4Envelope, RocePacket, RoceRepr};
//!
//! // Example A of the RoCE wire reference: an RC SEND_ONLY of 16 bytes.
//! let udp_payload = [
//!     0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x12, 0x34, 0x56,
//!     0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x00, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x40,
//!     0xf6, 0x17, 0x39, 0x8e,
//! ];
//! let envelope = Envelope::V4(Ipv4Envelope {
//!     src: [192, 168, 1, 10].into(),
//!     dst: [192, 168, 1, 20].into(),
//!     identification: 0x1234,
//!     dont_fragment: true,
//!     src_port: 0xc132,
//!     dst_port: 4791,
//! });
//! let packet = RocePacket::new_checked(&udp_payload[..]).unwrap();
//! let repr = RoceRepr::parse(&packet, &envelope).unwrap(); // checks the ICRC
//! assert_eq!(repr.bth.opcode.to_string(), "RC_SEND_ONLY");
//! assert_eq!(repr.payload.len(), 16);
//!
//! let mut out = [0u8; 32];
//! let n = repr.emit(&envelope, &mut out).unwrap(); // writes the ICRC
//! assert_eq!(&out[..n], &udp_payload[..]);
//! ```
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]

mod field;
mod view;

pub mod aeth;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod datagram;
pub mod ext;
pub mod grh;
pub mod icrc;
pub mod mad;
pub mod opcode;
pub mod psn;
pub mod roce;
pub mod time;
pub mod types;

pub use aeth::{AethPacket, AethRepr, NakCode, RnrTimer, Syndrome};
pub use bth::{BthPacket, BthRepr};
pub use datagram::{DatagramRepr, EthernetFrameRepr, IpRepr, UdpDatagram};
pub use ext::atomic_ack_eth::{AtomicAckEthPacket, AtomicAckEthRepr};
pub use ext::atomic_eth::{AtomicEthPacket, AtomicEthRepr};
pub use ext::deth::{DethPacket, DethRepr};
pub use ext::feth::{FethPacket, FethRepr};
pub use ext::ieth::{IethPacket, IethRepr};
pub use ext::imm_dt::{ImmDtPacket, ImmDtRepr};
pub use ext::reth::{RethPacket, RethRepr};
pub use ext::xrceth::{XrcEthPacket, XrcEthRepr};
pub use icrc::{Envelope, Ipv4Envelope, Ipv6Envelope};
pub use opcode::{Headers, Opcode, OpcodeInfo, Operation, PayloadRule, Position, Transport};
pub use psn::{Psn, PsnWindow};
pub use roce::{ExtHeaders, RocePacket, RoceRepr};
pub use types::{Gid, Msn, PKey, QKey, Qpn, RKey};

/// The UDP destination port of RoCEv2 (IANA), for requests and responses alike.
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Why bytes could not be read as (or written as) a RoCEv2 packet.
///
/// A received packet that fails to parse is dropped and counted by kind, which is why the
/// variants carry no data: each names one rule of the wire format.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before the headers its first bytes announce.
    #[error("truncated: the buffer ends before the headers its opcode or type announce")]
    Truncated,
    /// BTH TVer is not 0, the only transport version there is.
    #[error("BTH transport version (TVer) is not 0")]
    BadTransportVersion,
    /// The payload length breaks the opcode's rule: FIRST/MIDDLE carry exactly one path
    /// MTU (256..4096), LAST 1..=4096 bytes, ONLY 0..=4096, requests for READ/atomics and
    /// ACKs none.
    #[error(
        "payload length not allowed for this opcode (FIRST/MIDDLE: one path MTU, LAST: 1..=4096, ONLY: 0..=4096, READ request/atomic/ACK: none)"
    )]
    BadPayloadLength,
    /// The packet (without the ICRC) is not a multiple of 4 bytes, or the BTH pad count
    /// claims more pad bytes than the packet has.
    #[error("bad padding: the packet is not 4-byte aligned, or the pad count exceeds the payload")]
    BadPadding,
    /// The invariant CRC does not match the packet.
    #[error("ICRC mismatch: the packet was corrupted, or its IP/UDP envelope is not the one it was sent with")]
    BadIcrc,
    /// An IP or UDP length field disagrees with the bytes present.
    #[error("IP or UDP length field disagrees with the datagram size")]
    BadLength,
    /// The IPv4 header checksum is wrong.
    #[error("IPv4 header checksum is wrong")]
    BadIpChecksum,
    /// Not UDP to port 4791.
    #[error("not RoCEv2: not a UDP datagram to port 4791")]
    NotRoce,
    /// The Ethernet EtherType names one IP version and the packet is the other.
    #[error("EtherType disagrees with the IP version of the packet it carries (0x0800 is IPv4, 0x86dd IPv6)")]
    BadEtherType,
    /// IPv4 options, IPv6 extension headers or IP fragments, none of which RoCEv2 uses.
    #[error("unsupported IP feature for RoCEv2 (IPv4 options, IPv6 extension headers or fragments)")]
    Unsupported,
    /// The extended headers given to `emit` are not the ones the opcode carries.
    #[error("extended headers do not match the opcode (see opcode::OPCODES for which headers each opcode carries)")]
    HeaderMismatch,
    /// The output buffer cannot hold what `emit` must write; size it with `buffer_len`.
    #[error("output buffer too small; size it with buffer_len()")]
    BufferTooSmall,
    /// A MAD is not exactly 256 bytes.
    #[error("a MAD must be exactly 256 bytes")]
    BadMadLength,
    /// The MAD is not of the connection-management class (0x07).
    #[error("not a CM MAD (management class 0x07)")]
    NotCm,
    /// A variable-length part given to `emit` (CM private data, REJ additional reject
    /// information, SIDR_REP additional information) is longer than its field.
    #[error(
        "private data or additional information longer than its field in the CM message (REQ allows 92 bytes, of which rdma_cm leaves 56 to the user)"
    )]
    FieldTooLong,
    /// The 40 bytes of a UD receive buffer's GRH area hold neither a valid IPv4 header at
    /// offset 20 nor an IPv6 header.
    #[error("GRH area holds neither an IPv4 header (at offset 20) nor an IPv6 header")]
    BadGrh,
}

/// Result with [`Error`].
pub type Result<T> = core::result::Result<T, Error>;
