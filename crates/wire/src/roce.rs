//! A whole RoCEv2 packet as it sits in a UDP payload: BTH, extended headers, payload, pad,
//! ICRC. Layout comes from the opcode table ([`crate::opcode`]).
//!
//! An opcode the table does not know (reserved values, RD) still parses: its packet has no
//! extended headers, and everything between the BTH and the pad is payload. Its ICRC is
//! checked like any other, and it re-emits unchanged; a receiver decides what to do with it.

use crate::aeth::{AethPacket, AethRepr};
use crate::bth::{self, BthPacket, BthRepr};
use crate::ext::atomic_ack_eth::{AtomicAckEthPacket, AtomicAckEthRepr};
use crate::ext::atomic_eth::{AtomicEthPacket, AtomicEthRepr};
use crate::ext::deth::{DethPacket, DethRepr};
use crate::ext::feth::{FethPacket, FethRepr};
use crate::ext::ieth::{IethPacket, IethRepr};
use crate::ext::imm_dt::{ImmDtPacket, ImmDtRepr};
use crate::ext::reth::{RethPacket, RethRepr};
use crate::ext::xrceth::{XrcEthPacket, XrcEthRepr};
use crate::icrc::{self, Envelope, ICRC_LEN};
use crate::opcode::{Headers, OpcodeInfo, PayloadRule};
use crate::{Error, Result};

/// The smallest RoCE packet: a BTH and an ICRC.
pub const MIN_LEN: usize = bth::HEADER_LEN + ICRC_LEN;

/// A zero-copy view of a RoCEv2 UDP payload.
///
/// After [`check_len`](Self::check_len) passes, no accessor panics: the buffer holds the
/// BTH, every extended header the opcode announces, the pad the BTH announces and the ICRC.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RocePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RocePacket<T> {
    /// Wraps `buffer` without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps `buffer` after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the BTH, the extended headers of its opcode, its pad and
    /// the ICRC. Fails with [`Error::Truncated`] or, when only the pad does not fit,
    /// [`Error::BadPadding`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < MIN_LEN {
            return Err(Error::Truncated);
        }
        let fixed = self.header_len() + ICRC_LEN;
        if len < fixed {
            return Err(Error::Truncated);
        }
        if len < fixed + usize::from(self.bth().pad_count()) {
            return Err(Error::BadPadding);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The BTH.
    pub fn bth(&self) -> BthPacket<&[u8]> {
        BthPacket::new_unchecked(self.buffer.as_ref())
    }

    /// What the opcode table says about this packet's opcode.
    pub fn info(&self) -> Option<&'static OpcodeInfo> {
        self.bth().opcode().info()
    }

    /// The extended headers present (none for an unknown opcode).
    pub fn headers(&self) -> Headers {
        self.info().map_or(Headers::NONE, |i| i.headers)
    }

    /// Length of BTH plus extended headers.
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.headers().len()
    }

    fn ext(&self, header: Headers) -> Option<&[u8]> {
        let offset = bth::HEADER_LEN + self.headers().offset_of(header)?;
        Some(&self.buffer.as_ref()[offset..])
    }

    /// The RETH, if the opcode carries one.
    pub fn reth(&self) -> Option<RethPacket<&[u8]>> {
        self.ext(Headers::RETH).map(RethPacket::new_unchecked)
    }

    /// The AETH, if the opcode carries one.
    pub fn aeth(&self) -> Option<AethPacket<&[u8]>> {
        self.ext(Headers::AETH).map(AethPacket::new_unchecked)
    }

    /// The DETH, if the opcode carries one.
    pub fn deth(&self) -> Option<DethPacket<&[u8]>> {
        self.ext(Headers::DETH).map(DethPacket::new_unchecked)
    }

    /// The AtomicETH, if the opcode carries one.
    pub fn atomic_eth(&self) -> Option<AtomicEthPacket<&[u8]>> {
        self.ext(Headers::ATOMIC_ETH).map(AtomicEthPacket::new_unchecked)
    }

    /// The AtomicAckETH, if the opcode carries one.
    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEthPacket<&[u8]>> {
        self.ext(Headers::ATOMIC_ACK_ETH).map(AtomicAckEthPacket::new_unchecked)
    }

    /// The immediate data, if the opcode carries it.
    pub fn imm_dt(&self) -> Option<ImmDtPacket<&[u8]>> {
        self.ext(Headers::IMM_DT).map(ImmDtPacket::new_unchecked)
    }

    /// The IETH, if the opcode carries one.
    pub fn ieth(&self) -> Option<IethPacket<&[u8]>> {
        self.ext(Headers::IETH).map(IethPacket::new_unchecked)
    }

    /// The FETH, if the opcode carries one.
    pub fn feth(&self) -> Option<FethPacket<&[u8]>> {
        self.ext(Headers::FETH).map(FethPacket::new_unchecked)
    }

    fn payload_end(&self) -> usize {
        self.buffer.as_ref().len() - ICRC_LEN - usize::from(self.bth().pad_count())
    }

    /// The payload, without pad.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.payload_end()]
    }

    /// The pad bytes (zero to three).
    pub fn pad(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[self.payload_end()..b.len() - ICRC_LEN]
    }

    /// Everything the ICRC covers inside the UDP payload: BTH through pad.
    pub fn icrc_covered(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - ICRC_LEN]
    }

    /// The ICRC as it travels (little-endian on the wire).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let t = &b[b.len() - ICRC_LEN..];
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    }

    /// Whether the ICRC matches the packet sent inside `envelope`.
    ///
    /// Needs only [`MIN_LEN`] bytes, not a full `check_len`, so that corruption is reported
    /// as corruption even when it garbled the opcode.
    pub fn verify_icrc(&self, envelope: &Envelope) -> bool {
        self.buffer.as_ref().len() >= MIN_LEN && icrc::compute(envelope, self.icrc_covered()) == self.icrc()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RocePacket<T> {
    /// The BTH, writable.
    pub fn bth_mut(&mut self) -> BthPacket<&mut [u8]> {
        BthPacket::new_unchecked(self.buffer.as_mut())
    }

    /// Recomputes and writes the ICRC, e.g. after changing a header in place.
    pub fn fill_icrc(&mut self, envelope: &Envelope) {
        let value = icrc::compute(envelope, self.icrc_covered());
        self.write_icrc(value);
    }

    /// [`fill_icrc`](Self::fill_icrc), the envelope's part through `prefixes`.
    pub fn fill_icrc_with(&mut self, envelope: &Envelope, prefixes: &mut icrc::IcrcPrefixCache) {
        let value = prefixes.compute(envelope, self.icrc_covered());
        self.write_icrc(value);
    }

    fn write_icrc(&mut self, value: u32) {
        let b = self.buffer.as_mut();
        let at = b.len() - ICRC_LEN;
        b[at..].copy_from_slice(&value.to_le_bytes());
    }
}

/// The extended headers of one packet; which are present must be exactly what the opcode
/// table says for its opcode.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ExtHeaders {
    /// XRC extended transport header (every XRC request).
    pub xrceth: Option<XrcEthRepr>,
    /// FLUSH extended transport header.
    pub feth: Option<FethRepr>,
    /// RDMA extended transport header.
    pub reth: Option<RethRepr>,
    /// ACK extended transport header.
    pub aeth: Option<AethRepr>,
    /// Datagram extended transport header.
    pub deth: Option<DethRepr>,
    /// Atomic extended transport header.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// Atomic acknowledge extended transport header.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data.
    pub imm_dt: Option<ImmDtRepr>,
    /// Invalidate extended transport header.
    pub ieth: Option<IethRepr>,
}

impl ExtHeaders {
    /// The set of headers present.
    pub fn headers(&self) -> Headers {
        let mut h = Headers::NONE;
        let present = [
            (self.xrceth.is_some(), Headers::XRCETH),
            (self.feth.is_some(), Headers::FETH),
            (self.reth.is_some(), Headers::RETH),
            (self.aeth.is_some(), Headers::AETH),
            (self.deth.is_some(), Headers::DETH),
            (self.atomic_eth.is_some(), Headers::ATOMIC_ETH),
            (self.atomic_ack_eth.is_some(), Headers::ATOMIC_ACK_ETH),
            (self.imm_dt.is_some(), Headers::IMM_DT),
            (self.ieth.is_some(), Headers::IETH),
        ];
        for (is_present, header) in present {
            if is_present {
                h = h.with(header);
            }
        }
        h
    }
}

/// A packet's length from its headers' (BTH included) and its payload's: headers, payload,
/// pad, ICRC.
fn packet_len(header_len: usize, payload_len: usize) -> usize {
    header_len + payload_len + (payload_len.wrapping_neg() & 3) + ICRC_LEN
}

/// A validated RoCEv2 packet: BTH, extended headers and a borrowed payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RoceRepr<'a> {
    /// The base transport header (its pad count follows from `payload`).
    pub bth: BthRepr,
    /// The extended headers, exactly those of the opcode.
    pub ext: ExtHeaders,
    /// The payload, without pad.
    pub payload: &'a [u8],
}

impl<'a> RoceRepr<'a> {
    /// Parses a packet received inside `envelope`, checking its ICRC first, then its
    /// layout and the opcode's payload rule.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &RocePacket<&'a T>, envelope: &Envelope) -> Result<Self> {
        if packet.buffer.as_ref().len() < MIN_LEN {
            return Err(Error::Truncated);
        }
        if !packet.verify_icrc(envelope) {
            return Err(Error::BadIcrc);
        }
        Self::parse_ignoring_icrc(packet)
    }

    /// Parses a packet without checking its ICRC.
    ///
    /// Only for tools that must show a corrupted packet (a capture decoder); a receiver uses
    /// [`parse`](Self::parse), which drops it.
    pub fn parse_ignoring_icrc<T: AsRef<[u8]> + ?Sized>(packet: &RocePacket<&'a T>) -> Result<Self> {
        packet.check_len()?;
        let bth = BthRepr::parse(&packet.bth())?;
        // IBA 9.8.3: the packet through the pad is a whole number of 4-byte words.
        if packet.icrc_covered().len() % 4 != 0 {
            return Err(Error::BadPadding);
        }
        let bytes: &'a [u8] = packet.buffer.as_ref();
        let view = RocePacket::new_unchecked(bytes);
        let payload = &bytes[view.header_len()..view.payload_end()];
        // Filled in place: no copy of the 128-byte set of extended headers at the end.
        let mut repr = Self { bth, ext: ExtHeaders::default(), payload };
        if let Some(info) = view.info() {
            if !info.payload.allows(payload.len()) {
                return Err(Error::BadPayloadLength);
            }
            if info.payload == PayloadRule::PathMtu && !view.pad().is_empty() {
                return Err(Error::BadPadding);
            }
            // The opcode's headers, in wire order (`Headers::ORDER`): a bit test each, and a
            // parse for those present only (a loop over the nine that matched on each was
            // a sixth of the instructions to take a packet).
            let present = info.headers;
            let mut at = bth::HEADER_LEN;
            macro_rules! take {
                ($header:expr, $field:ident, $ty:ident, $packet:ident) => {
                    if present.contains($header) {
                        repr.ext.$field = Some($ty::parse(&$packet::new_unchecked(&bytes[at..]))?);
                        at += $header.len();
                    }
                };
            }
            take!(Headers::XRCETH, xrceth, XrcEthRepr, XrcEthPacket);
            take!(Headers::FETH, feth, FethRepr, FethPacket);
            take!(Headers::RETH, reth, RethRepr, RethPacket);
            take!(Headers::AETH, aeth, AethRepr, AethPacket);
            take!(Headers::DETH, deth, DethRepr, DethPacket);
            take!(Headers::ATOMIC_ETH, atomic_eth, AtomicEthRepr, AtomicEthPacket);
            take!(Headers::ATOMIC_ACK_ETH, atomic_ack_eth, AtomicAckEthRepr, AtomicAckEthPacket);
            take!(Headers::IMM_DT, imm_dt, ImmDtRepr, ImmDtPacket);
            take!(Headers::IETH, ieth, IethRepr, IethPacket);
            debug_assert_eq!(at, view.header_len(), "Headers::ORDER is the wire order");
        }
        Ok(repr)
    }

    /// Pad bytes needed after the payload.
    pub fn pad_len(&self) -> usize {
        self.payload.len().wrapping_neg() & 3
    }

    /// Length of BTH plus extended headers.
    pub fn header_len(&self) -> usize {
        bth::HEADER_LEN + self.ext.headers().len()
    }

    /// Bytes [`emit`](Self::emit) writes: the whole UDP payload, ICRC included.
    pub fn buffer_len(&self) -> usize {
        packet_len(self.header_len(), self.payload.len())
    }

    /// Checks that the headers are the opcode's and the payload fits its rule.
    pub fn validate(&self) -> Result<()> {
        self.validate_for(self.payload.len()).map(|_| ())
    }

    /// [`validate`](Self::validate) for a payload of `payload_len` bytes. Returns the
    /// headers present, which every caller needs next (the set is worked out once per
    /// packet, not once per question).
    fn validate_for(&self, payload_len: usize) -> Result<Headers> {
        let headers = self.ext.headers();
        match self.bth.opcode.info() {
            Some(info) => {
                if headers != info.headers {
                    return Err(Error::HeaderMismatch);
                }
                if !info.payload.allows(payload_len) {
                    return Err(Error::BadPayloadLength);
                }
            }
            None => {
                if !headers.is_empty() {
                    return Err(Error::HeaderMismatch);
                }
            }
        }
        Ok(headers)
    }

    /// Writes the packet to the start of `buf`, sent inside `envelope`: every header, the
    /// payload, zeroed pad and the ICRC. Returns the number of bytes written.
    pub fn emit(&self, envelope: &Envelope, buf: &mut [u8]) -> Result<usize> {
        let headers = self.validate_for(self.payload.len())?;
        let header_len = bth::HEADER_LEN + headers.len();
        let buf = buf.get_mut(..packet_len(header_len, self.payload.len())).ok_or(Error::BufferTooSmall)?;
        buf[header_len..header_len + self.payload.len()].copy_from_slice(self.payload);
        self.finish(headers, envelope, self.payload.len(), buf)
    }

    /// Writes the packet around a payload of `payload_len` bytes that the caller already
    /// placed at `buf[self.header_len()..]`: the headers before it, the zeroed pad after it
    /// and the ICRC over all. `self.payload` is ignored. This lets a sender copy user memory
    /// straight into the datagram, once.
    pub fn emit_around_payload(&self, envelope: &Envelope, payload_len: usize, buf: &mut [u8]) -> Result<usize> {
        let headers = self.validate_for(payload_len)?;
        let len = packet_len(bth::HEADER_LEN + headers.len(), payload_len);
        let buf = buf.get_mut(..len).ok_or(Error::BufferTooSmall)?;
        self.finish(headers, envelope, payload_len, buf)
    }

    /// [`emit_around_payload`](Self::emit_around_payload) without the ICRC: its four bytes
    /// are left as they are, for a sender that computes it later or never (a packet that
    /// crosses no wire; [`RocePacket::fill_icrc`] computes it).
    pub fn emit_around_payload_without_icrc(&self, payload_len: usize, buf: &mut [u8]) -> Result<usize> {
        let headers = self.validate_for(payload_len)?;
        let len = packet_len(bth::HEADER_LEN + headers.len(), payload_len);
        let buf = buf.get_mut(..len).ok_or(Error::BufferTooSmall)?;
        self.headers(headers, payload_len, buf);
        Ok(buf.len())
    }

    /// Headers (`headers`, validated), pad and ICRC around a payload of `payload_len` bytes
    /// already in `buf`, which is exactly the packet's length.
    fn finish(&self, headers: Headers, envelope: &Envelope, payload_len: usize, buf: &mut [u8]) -> Result<usize> {
        self.headers(headers, payload_len, buf);
        RocePacket::new_unchecked(&mut *buf).fill_icrc(envelope);
        Ok(buf.len())
    }

    /// Headers (`headers`, the set present, validated) and pad around a payload of
    /// `payload_len` bytes already in `buf`, which is exactly the packet's length.
    fn headers(&self, headers: Headers, payload_len: usize, buf: &mut [u8]) {
        let header_len = bth::HEADER_LEN + headers.len();
        let pad = payload_len.wrapping_neg() & 3;

        let mut bth = BthPacket::new_unchecked(&mut buf[..bth::HEADER_LEN]);
        self.bth.emit(&mut bth);
        bth.set_pad_count(pad as u8);

        // In wire order (`Headers::ORDER`), each after the one before: no offset looked up.
        let mut at = bth::HEADER_LEN;
        macro_rules! put {
            ($field:ident, $header:expr, $packet:ident) => {
                if let Some(r) = &self.ext.$field {
                    r.emit(&mut $packet::new_unchecked(&mut buf[at..]));
                    at += $header.len();
                }
            };
        }
        put!(xrceth, Headers::XRCETH, XrcEthPacket);
        put!(feth, Headers::FETH, FethPacket);
        put!(reth, Headers::RETH, RethPacket);
        put!(aeth, Headers::AETH, AethPacket);
        put!(deth, Headers::DETH, DethPacket);
        put!(atomic_eth, Headers::ATOMIC_ETH, AtomicEthPacket);
        put!(atomic_ack_eth, Headers::ATOMIC_ACK_ETH, AtomicAckEthPacket);
        put!(imm_dt, Headers::IMM_DT, ImmDtPacket);
        put!(ieth, Headers::IETH, IethPacket);
        debug_assert_eq!(at, header_len, "Headers::ORDER is the wire order");
        let pad_at = header_len + payload_len;
        buf[pad_at..pad_at + pad].fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::Syndrome;
    use crate::opcode::Opcode;
    use crate::psn::Psn;
    use crate::types::{Msn, PKey, QKey, Qpn, RKey};

    fn env() -> Envelope {
        Envelope::rocev2([192, 168, 1, 10].into(), 0xc132, [192, 168, 1, 20].into()).unwrap()
    }

    fn bth(opcode: Opcode) -> BthRepr {
        BthRepr {
            opcode,
            solicited_event: false,
            mig_req: false,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x12).unwrap(),
            ack_req: true,
            psn: Psn::new(0x100).unwrap(),
        }
    }

    /// Emits into a buffer pre-filled with 0xa5, so that an unwritten byte shows.
    fn emit(repr: &RoceRepr<'_>) -> std::vec::Vec<u8> {
        let mut buf = std::vec![0xa5u8; repr.buffer_len() + 8];
        let n = repr.emit(&env(), &mut buf).unwrap();
        assert_eq!(n, repr.buffer_len());
        assert!(buf[n..].iter().all(|&b| b == 0xa5), "wrote past buffer_len");
        buf.truncate(n);
        buf
    }

    fn round_trip(repr: RoceRepr<'_>) -> std::vec::Vec<u8> {
        let bytes = emit(&repr);
        let packet = RocePacket::new_checked(&bytes[..]).unwrap();
        assert_eq!(RoceRepr::parse(&packet, &env()).unwrap(), repr);
        bytes
    }

    #[test]
    fn golden_read_request() {
        // Example D of the reference, UDP payload only.
        let repr = RoceRepr {
            bth: BthRepr { psn: Psn::new(0x100).unwrap(), ..bth(Opcode::RC_RDMA_READ_REQUEST) },
            ext: ExtHeaders {
                reth: Some(RethRepr { virtual_address: 0x7f00_0000_1000, rkey: RKey(0xa0b), dma_length: 2500 }),
                ..Default::default()
            },
            payload: &[],
        };
        let Envelope::V4(mut e) = env() else { unreachable!() };
        e.identification = 0x2222;
        let mut bytes = [0xa5u8; 32];
        assert_eq!(repr.emit(&Envelope::V4(e), &mut bytes), Ok(32));
        assert_eq!(
            bytes,
            [
                0x0c, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x01, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00,
                0x00, 0x10, 0x00, 0x00, 0x00, 0x0a, 0x0b, 0x00, 0x00, 0x09, 0xc4, 0xf2, 0x95, 0x00, 0xa7
            ]
        );
    }

    #[test]
    fn golden_ud_send_with_pad() {
        // Example C: "hello", pad 3, DETH Q_Key 0x11111111 from QP 0x20, ID 1.
        let Envelope::V4(mut e) = env() else { unreachable!() };
        e.identification = 1;
        e.src_port = 0xc420;
        let envelope = Envelope::V4(e);
        let repr = RoceRepr {
            bth: BthRepr {
                dest_qp: Qpn::new(0x21).unwrap(),
                ack_req: false,
                psn: Psn::new(1).unwrap(),
                ..bth(Opcode::UD_SEND_ONLY)
            },
            ext: ExtHeaders {
                deth: Some(DethRepr { qkey: QKey(0x1111_1111), src_qp: Qpn::new(0x20).unwrap() }),
                ..Default::default()
            },
            payload: b"hello",
        };
        let mut buf = [0xa5u8; 40];
        let n = repr.emit(&envelope, &mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            &[
                0x64, 0x30, 0xff, 0xff, 0x00, 0x00, 0x00, 0x21, 0x00, 0x00, 0x00, 0x01, 0x11, 0x11, 0x11, 0x11, 0x00,
                0x00, 0x00, 0x20, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, 0x00, 0x00, 0x00, 0xd3, 0x0b, 0x07
            ]
        );
        let p = RocePacket::new_checked(&buf[..n]).unwrap();
        assert_eq!(p.pad(), &[0, 0, 0]);
        assert_eq!(p.payload(), b"hello");
    }

    #[test]
    fn every_opcode_class_round_trips() {
        let data = [7u8; 1024];
        let aeth = AethRepr { syndrome: Syndrome::ACK_NO_CREDITS, msn: Msn::new(9).unwrap() };
        let reth = RethRepr { virtual_address: 0x1000, rkey: RKey(0xdead_beef), dma_length: 3000 };
        let atomic = AtomicEthRepr { virtual_address: 0x2000, rkey: RKey(7), swap_add: 1, compare: 2 };
        for info in &crate::opcode::OPCODES {
            let payload: &[u8] = match info.payload {
                PayloadRule::None => &[],
                PayloadRule::PathMtu => &data[..1024],
                PayloadRule::UpToPathMtuNonEmpty | PayloadRule::UpToPathMtu => &data[..13],
                PayloadRule::Exactly(n) => &data[..usize::from(n)],
            };
            let h = info.headers;
            let ext = ExtHeaders {
                xrceth: h.contains(Headers::XRCETH).then_some(XrcEthRepr { srqn: 0x12_3456 }),
                feth: h.contains(Headers::FETH).then_some(FethRepr { selectivity: 0, placement_type: 1 }),
                reth: h.contains(Headers::RETH).then_some(reth),
                aeth: h.contains(Headers::AETH).then_some(aeth),
                deth: h.contains(Headers::DETH).then_some(DethRepr { qkey: QKey::GSI, src_qp: Qpn::GSI }),
                atomic_eth: h.contains(Headers::ATOMIC_ETH).then_some(atomic),
                atomic_ack_eth: h.contains(Headers::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr { original_data: 5 }),
                imm_dt: h.contains(Headers::IMM_DT).then_some(ImmDtRepr([1, 2, 3, 4])),
                ieth: h.contains(Headers::IETH).then_some(IethRepr { rkey: RKey(3) }),
            };
            let bytes = round_trip(RoceRepr { bth: bth(info.opcode), ext, payload });
            assert_eq!(
                bytes.len(),
                info.header_len() + payload.len() + (payload.len().wrapping_neg() & 3) + 4,
                "{}",
                info.name
            );
        }
    }

    #[test]
    fn emit_refuses_headers_the_opcode_does_not_carry() {
        let repr = RoceRepr {
            bth: bth(Opcode::RC_SEND_ONLY),
            ext: ExtHeaders { imm_dt: Some(ImmDtRepr([0; 4])), ..Default::default() },
            payload: &[],
        };
        assert_eq!(repr.emit(&env(), &mut [0u8; 64]), Err(Error::HeaderMismatch));
        let repr = RoceRepr { bth: bth(Opcode::RC_SEND_FIRST), ext: ExtHeaders::default(), payload: &[0; 100] };
        assert_eq!(repr.emit(&env(), &mut [0u8; 256]), Err(Error::BadPayloadLength));
        let repr = RoceRepr { bth: bth(Opcode::RC_SEND_ONLY), ext: ExtHeaders::default(), payload: &[0; 100] };
        assert_eq!(repr.emit(&env(), &mut [0u8; 64]), Err(Error::BufferTooSmall));
    }

    #[test]
    fn unknown_opcode_is_opaque_but_checked() {
        let repr = RoceRepr { bth: bth(Opcode(0x44)), ext: ExtHeaders::default(), payload: &[1, 2, 3, 4, 5, 6, 7, 8] };
        let bytes = round_trip(repr);
        assert_eq!(RocePacket::new_checked(&bytes[..]).unwrap().payload(), &[1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn any_flipped_covered_bit_is_an_icrc_error() {
        let payload: std::vec::Vec<u8> = (0..37).collect();
        let repr = RoceRepr {
            bth: bth(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE),
            ext: ExtHeaders {
                reth: Some(RethRepr { virtual_address: 1 << 40, rkey: RKey(0x1234), dma_length: 37 }),
                imm_dt: Some(ImmDtRepr([9; 4])),
                ..Default::default()
            },
            payload: &payload,
        };
        let bytes = emit(&repr);
        for bit in 0..bytes.len() * 8 {
            let mut corrupt = bytes.clone();
            corrupt[bit / 8] ^= 1 << (bit % 8);
            let got = RoceRepr::parse(&RocePacket::new_unchecked(&corrupt[..]), &env());
            if bit / 8 == 4 {
                // BTH byte 4 (FECN, BECN, reserved) is variant: routers may set FECN.
                assert!(got.is_ok(), "variant bit {bit} broke the packet");
            } else {
                assert_eq!(got, Err(Error::BadIcrc), "flipped bit {bit}");
            }
        }
    }

    #[test]
    fn envelope_fields_are_covered() {
        let bytes = emit(&RoceRepr { bth: bth(Opcode::RC_SEND_ONLY), ext: ExtHeaders::default(), payload: b"ping" });
        let p = RocePacket::new_checked(&bytes[..]).unwrap();
        let Envelope::V4(e) = env() else { unreachable!() };
        let variants = [
            Ipv4Envelope { identification: 1, ..e },
            Ipv4Envelope { dont_fragment: false, ..e },
            Ipv4Envelope { src_port: e.src_port + 1, ..e },
            Ipv4Envelope { dst_port: 4792, ..e },
            Ipv4Envelope { src: [192, 168, 1, 11].into(), ..e },
            Ipv4Envelope { dst: [192, 168, 1, 21].into(), ..e },
        ];
        for v in variants {
            assert_eq!(RoceRepr::parse(&p, &Envelope::V4(v)), Err(Error::BadIcrc), "{v:?}");
        }
        use crate::icrc::Ipv4Envelope;
    }

    fn with_icrc(mut bytes: std::vec::Vec<u8>) -> std::vec::Vec<u8> {
        RocePacket::new_unchecked(&mut bytes[..]).fill_icrc(&env());
        bytes
    }

    #[test]
    fn layout_errors() {
        let hello = emit(&RoceRepr { bth: bth(Opcode::RC_SEND_ONLY), ext: ExtHeaders::default(), payload: b"hello" });
        fn parse(b: &[u8]) -> Result<RoceRepr<'_>> {
            RoceRepr::parse(&RocePacket::new_unchecked(b), &env())
        }

        // Pad count 0 and the pad bytes dropped: 17 covered bytes are not 4-byte aligned.
        let mut unaligned = hello[..17].to_vec();
        unaligned[1] &= !0x30;
        unaligned.extend_from_slice(&[0; 4]);
        assert_eq!(parse(&with_icrc(unaligned)), Err(Error::BadPadding));

        // A pad count larger than what follows the headers.
        let mut bth_only = hello[..12].to_vec();
        bth_only[1] |= 0x30;
        bth_only.extend_from_slice(&[0; 4]);
        assert_eq!(parse(&with_icrc(bth_only)), Err(Error::BadPadding));

        // An ACK whose AETH is followed by payload.
        let mut ack = hello[..12].to_vec();
        ack[0] = Opcode::RC_ACKNOWLEDGE.0;
        ack[1] &= !0x30;
        ack.extend_from_slice(&[0x1f, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0]);
        assert_eq!(parse(&with_icrc(ack)), Err(Error::BadPayloadLength));

        // A compare-and-swap needs 28 header bytes after the BTH.
        let mut atomic = hello.clone();
        atomic[0] = Opcode::RC_COMPARE_SWAP.0;
        assert_eq!(parse(&with_icrc(atomic)), Err(Error::Truncated));

        // A SEND_FIRST that is not a path MTU long.
        let mut first = hello.clone();
        first[0] = Opcode::RC_SEND_FIRST.0;
        assert_eq!(parse(&with_icrc(first)), Err(Error::BadPayloadLength));

        // TVer 1.
        let mut tver = hello.clone();
        tver[1] |= 1;
        assert_eq!(parse(&with_icrc(tver)), Err(Error::BadTransportVersion));

        assert_eq!(parse(&hello[..15]), Err(Error::Truncated));
    }

    #[test]
    fn emit_around_a_placed_payload_equals_emit() {
        let payload: std::vec::Vec<u8> = (0..1021u32).map(|i| i as u8).collect();
        let repr = RoceRepr {
            bth: bth(Opcode::RC_RDMA_WRITE_ONLY),
            ext: ExtHeaders {
                reth: Some(RethRepr { virtual_address: 0x10, rkey: RKey(1), dma_length: 1021 }),
                ..Default::default()
            },
            payload: &payload,
        };
        let whole = emit(&repr);
        let mut placed = std::vec![0xa5u8; whole.len() + 4];
        placed[repr.header_len()..repr.header_len() + payload.len()].copy_from_slice(&payload);
        let headers_only = RoceRepr { payload: &[], ..repr };
        assert_eq!(headers_only.emit_around_payload(&env(), payload.len(), &mut placed), Ok(whole.len()));
        assert_eq!(&placed[..whole.len()], &whole[..]);
        assert_eq!(headers_only.emit_around_payload(&env(), 5000, &mut placed), Err(Error::BadPayloadLength));
    }
}
