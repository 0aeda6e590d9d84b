//! Base Transport Header (IBA 9.2), 12 bytes, first in every RoCE packet.
//!
//! ```text
//!  0       OpCode
//!  1       SE(7) M(6) PadCnt(5:4) TVer(3:0)
//!  2..4    P_Key
//!  4       FECN(7) BECN(6) reserved(5:0)
//!  5..8    DestQP
//!  8       AckReq(7) reserved(6:0)
//!  9..12   PSN
//! ```

use crate::field::{self, Field};
use crate::opcode::Opcode;
use crate::psn::Psn;
use crate::types::{PKey, Qpn};
use crate::view::header_view;
use crate::{Error, Result};

/// Length of the BTH in bytes.
pub const HEADER_LEN: usize = 12;

mod f {
    use super::Field;
    pub(super) const OPCODE: usize = 0;
    pub(super) const FLAGS: usize = 1;
    pub(super) const PKEY: Field = 2..4;
    pub(super) const ECN: usize = 4;
    pub(super) const DEST_QP: Field = 5..8;
    pub(super) const ACK_REQ: usize = 8;
    pub(super) const PSN: Field = 9..12;
}

const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const PAD: u8 = 0x30;
const TVER: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

header_view!(
    /// A zero-copy view of a BTH.
    BthPacket,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> BthPacket<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[f::OPCODE])
    }

    /// Solicited event: the responder should raise a completion event.
    pub fn solicited_event(&self) -> bool {
        self.b()[f::FLAGS] & SE != 0
    }

    /// Migration request bit (rxe sends 0 and ignores it).
    pub fn mig_req(&self) -> bool {
        self.b()[f::FLAGS] & MIG != 0
    }

    /// Pad bytes (0..=3) between the payload and the ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.b()[f::FLAGS] & PAD) >> PAD_SHIFT
    }

    /// Transport header version; only 0 exists.
    pub fn transport_version(&self) -> u8 {
        self.b()[f::FLAGS] & TVER
    }

    /// Partition key.
    pub fn pkey(&self) -> PKey {
        PKey(field::u16_at(self.b(), f::PKEY))
    }

    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[f::ECN] & FECN != 0
    }

    /// Backward explicit congestion notification (set in CNPs).
    pub fn becn(&self) -> bool {
        self.b()[f::ECN] & BECN != 0
    }

    /// Destination queue pair.
    pub fn dest_qp(&self) -> Qpn {
        Qpn::from_u24_truncating(field::u24_at(self.b(), f::DEST_QP))
    }

    /// The requester asks for an acknowledgement of this packet.
    pub fn ack_req(&self) -> bool {
        self.b()[f::ACK_REQ] & ACK_REQ != 0
    }

    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::from_u24_truncating(field::u24_at(self.b(), f::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    fn b_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    /// Sets the opcode.
    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.b_mut()[f::OPCODE] = opcode.0;
    }

    /// Sets the pad count (0..=3; higher bits are dropped).
    pub fn set_pad_count(&mut self, pad: u8) {
        let b = &mut self.b_mut()[f::FLAGS];
        *b = (*b & !PAD) | ((pad << PAD_SHIFT) & PAD);
    }

    /// Sets the PSN.
    pub fn set_psn(&mut self, psn: Psn) {
        field::set_u24(self.b_mut(), f::PSN, psn.value());
    }

    /// Sets the AckReq bit, leaving the reserved bits of that byte alone.
    pub fn set_ack_req(&mut self, ack_req: bool) {
        let b = &mut self.b_mut()[f::ACK_REQ];
        *b = if ack_req { *b | ACK_REQ } else { *b & !ACK_REQ };
    }

    /// Sets the destination QP.
    pub fn set_dest_qp(&mut self, qpn: Qpn) {
        field::set_u24(self.b_mut(), f::DEST_QP, qpn.value());
    }
}

/// A validated BTH.
///
/// The pad count is not part of the representation: it follows from the payload length, so
/// [`RoceRepr`](crate::RoceRepr) writes it. [`BthRepr::emit`] leaves the pad bits at zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct BthRepr {
    /// The opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited_event: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Partition key.
    pub pkey: PKey,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// Acknowledgement requested.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Parses a BTH. Fails on a transport version other than 0 (rxe drops those too).
    ///
    /// Reserved bits are ignored, as IBA 9.2 asks of receivers.
    pub fn parse<T: AsRef<[u8]>>(packet: &BthPacket<T>) -> Result<Self> {
        packet.check_len()?;
        if packet.transport_version() != 0 {
            return Err(Error::BadTransportVersion);
        }
        Ok(Self {
            opcode: packet.opcode(),
            solicited_event: packet.solicited_event(),
            mig_req: packet.mig_req(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Writes every byte of the BTH: reserved bits, TVer and the pad count as zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut BthPacket<T>) {
        let b = packet.b_mut();
        b[f::OPCODE] = self.opcode.0;
        b[f::FLAGS] = if self.solicited_event { SE } else { 0 } | if self.mig_req { MIG } else { 0 };
        field::set_u16(b, f::PKEY, self.pkey.0);
        b[f::ECN] = if self.fecn { FECN } else { 0 } | if self.becn { BECN } else { 0 };
        field::set_u24(b, f::DEST_QP, self.dest_qp.value());
        b[f::ACK_REQ] = if self.ack_req { ACK_REQ } else { 0 };
        field::set_u24(b, f::PSN, self.psn.value());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RC SEND_ONLY to QP 0x12, AckReq, PSN 0x123456 (RoCE wire reference, example A).
    const GOLDEN: [u8; 12] = [0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x12, 0x34, 0x56];

    fn golden_repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited_event: false,
            mig_req: false,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x12).unwrap(),
            ack_req: true,
            psn: Psn::new(0x12_3456).unwrap(),
        }
    }

    #[test]
    fn parses_golden() {
        let p = BthPacket::new_checked(&GOLDEN[..]).unwrap();
        assert_eq!(BthRepr::parse(&p).unwrap(), golden_repr());
        assert_eq!(p.pad_count(), 0);
    }

    #[test]
    fn emits_every_byte() {
        let mut buf = [0xa5u8; 12];
        golden_repr().emit(&mut BthPacket::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn flags_and_pad() {
        let mut buf = GOLDEN;
        buf[1] = 0xf0; // SE, M, pad 3, TVer 0
        buf[4] = 0xc0; // FECN, BECN
        let p = BthPacket::new_checked(&buf[..]).unwrap();
        assert!(p.solicited_event() && p.mig_req() && p.fecn() && p.becn());
        assert_eq!(p.pad_count(), 3);
        let mut p = BthPacket::new_unchecked(&mut buf[..]);
        p.set_pad_count(1);
        assert_eq!(p.pad_count(), 1);
        assert!(p.solicited_event());
    }

    #[test]
    fn rejects_transport_version_and_short_buffers() {
        let mut buf = GOLDEN;
        buf[1] = 0x01;
        assert_eq!(BthRepr::parse(&BthPacket::new_unchecked(&buf[..])), Err(Error::BadTransportVersion));
        assert_eq!(BthPacket::new_checked(&GOLDEN[..11]).unwrap_err(), Error::Truncated);
    }
}
