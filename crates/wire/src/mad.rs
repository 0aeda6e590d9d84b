//! Management datagrams (IBA 13.4): the 256-byte MAD, its 24-byte common header and the
//! 232-byte data area that each management class lays out its own way.
//!
//! On RoCE every MAD travels alone in a UD SEND_ONLY to or from a GSI QP (QPN 1): BTH, DETH,
//! the 256 bytes of the MAD, then the ICRC. A MAD is always exactly 256 bytes
//! (`include/rdma/ib_mad.h: IB_MGMT_MAD_SIZE`), so [`MadRepr::parse`] refuses any other size.
//!
//! The class, method and attribute numbers are open newtypes ([`MgmtClass`], [`Method`],
//! [`AttributeId`]): every value parses and re-emits unchanged, and the known ones have names.
//! The connection-manager messages carried in class [`MgmtClass::CM`] are in [`crate::cm`].

use core::fmt;

use crate::field::{self, Field};
use crate::view::header_view;
use crate::{Error, Result};

/// Length of a MAD in bytes, header included (IBA 13.4.3).
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header (IBA 13.4.2).
pub const MAD_HEADER_LEN: usize = 24;
/// Length of the data area that follows the common header.
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

const BASE_VERSION: usize = 0;
const MGMT_CLASS: usize = 1;
const CLASS_VERSION: usize = 2;
const METHOD: usize = 3;
const STATUS: Field = 4..6;
const CLASS_SPECIFIC: Field = 6..8;
const TRANSACTION_ID: Field = 8..16;
const ATTRIBUTE_ID: Field = 16..18;
const RESERVED: Field = 18..20;
const ATTRIBUTE_MODIFIER: Field = 20..24;
const DATA: Field = MAD_HEADER_LEN..MAD_LEN;

/// A management class (IBA Table 102; Linux `IB_MGMT_CLASS_*`). Open: unknown classes are
/// kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct MgmtClass(pub u8);

impl MgmtClass {
    /// Subnet management, LID-routed SMPs.
    pub const SUBN_LID_ROUTED: Self = Self(0x01);
    /// Subnet administration (the SA).
    pub const SUBN_ADM: Self = Self(0x03);
    /// Performance management (PortCounters and friends).
    pub const PERF: Self = Self(0x04);
    /// Baseboard management.
    pub const BM: Self = Self(0x05);
    /// Device management.
    pub const DEV_MGT: Self = Self(0x06);
    /// Communication management: the IB CM, which rdma_cm uses on RoCE.
    pub const CM: Self = Self(0x07);
    /// SNMP tunnelling.
    pub const SNMP: Self = Self(0x08);
    /// Device administration.
    pub const DEV_ADM: Self = Self(0x10);
    /// Boot management.
    pub const BOOT_MGMT: Self = Self(0x11);
    /// BIS.
    pub const BIS: Self = Self(0x12);
    /// Congestion management.
    pub const CONG_MGMT: Self = Self(0x21);
    /// Subnet management, directed-route SMPs.
    pub const SUBN_DIRECTED: Self = Self(0x81);

    /// The class's name, if it is a known one.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::SUBN_LID_ROUTED => "SUBN_LID_ROUTED",
            Self::SUBN_ADM => "SUBN_ADM",
            Self::PERF => "PERF",
            Self::BM => "BM",
            Self::DEV_MGT => "DEV_MGT",
            Self::CM => "CM",
            Self::SNMP => "SNMP",
            Self::DEV_ADM => "DEV_ADM",
            Self::BOOT_MGMT => "BOOT_MGMT",
            Self::BIS => "BIS",
            Self::CONG_MGMT => "CONG_MGMT",
            Self::SUBN_DIRECTED => "SUBN_DIRECTED",
            _ => return None,
        })
    }

    /// Whether the class is in one of the vendor-specific ranges, 0x09..=0x0F and
    /// 0x30..=0x4F (IBA 13.4.4).
    pub const fn is_vendor(self) -> bool {
        matches!(self.0, 0x09..=0x0f | 0x30..=0x4f)
    }
}

impl fmt::Display for MgmtClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "{:#04x}", self.0),
        }
    }
}

/// A MAD method (IBA Table 103; Linux `IB_MGMT_METHOD_*`). Bit 7 is the response bit. Open:
/// unknown methods are kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Method(pub u8);

impl Method {
    /// The bit that marks a response method.
    pub const RESPONSE_BIT: u8 = 0x80;

    /// Read an attribute.
    pub const GET: Self = Self(0x01);
    /// Write an attribute.
    pub const SET: Self = Self(0x02);
    /// Send a datagram that needs no response; every CM message uses it.
    pub const SEND: Self = Self(0x03);
    /// Unsolicited notice.
    pub const TRAP: Self = Self(0x05);
    /// Forward a subscribed event.
    pub const REPORT: Self = Self(0x06);
    /// Stop repeating a trap.
    pub const TRAP_REPRESS: Self = Self(0x07);
    /// SA: read a table.
    pub const GET_TABLE: Self = Self(0x12);
    /// SA: trace a path.
    pub const GET_TRACE_TABLE: Self = Self(0x13);
    /// SA: read several records.
    pub const GET_MULTI: Self = Self(0x14);
    /// SA: delete a record.
    pub const DELETE: Self = Self(0x15);
    /// Response to GET or SET.
    pub const GET_RESP: Self = Self(0x81);
    /// Response to REPORT.
    pub const REPORT_RESP: Self = Self(0x86);
    /// Response to GET_TABLE.
    pub const GET_TABLE_RESP: Self = Self(0x92);
    /// Response to GET_MULTI.
    pub const GET_MULTI_RESP: Self = Self(0x94);
    /// Response to DELETE.
    pub const DELETE_RESP: Self = Self(0x95);

    /// Whether bit 7, the response bit, is set.
    pub const fn is_response(self) -> bool {
        self.0 & Self::RESPONSE_BIT != 0
    }

    /// The method's name, if it is a known one.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::GET => "GET",
            Self::SET => "SET",
            Self::SEND => "SEND",
            Self::TRAP => "TRAP",
            Self::REPORT => "REPORT",
            Self::TRAP_REPRESS => "TRAP_REPRESS",
            Self::GET_TABLE => "GET_TABLE",
            Self::GET_TRACE_TABLE => "GET_TRACE_TABLE",
            Self::GET_MULTI => "GET_MULTI",
            Self::DELETE => "DELETE",
            Self::GET_RESP => "GET_RESP",
            Self::REPORT_RESP => "REPORT_RESP",
            Self::GET_TABLE_RESP => "GET_TABLE_RESP",
            Self::GET_MULTI_RESP => "GET_MULTI_RESP",
            Self::DELETE_RESP => "DELETE_RESP",
            _ => return None,
        })
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "{:#04x}", self.0),
        }
    }
}

/// A MAD attribute ID. Its meaning depends on the management class: 0x0012 is a CM REJ but a
/// PERF PortCounters. The constants without a prefix are the CM ones (`cm_msgs.h`), which is
/// what this crate decodes; [`name`](Self::name) takes the class. Open: unknown attributes
/// are kept verbatim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct AttributeId(pub u16);

impl AttributeId {
    /// ClassPortInfo, common to every class (IBA 13.4.8.1).
    pub const CLASS_PORT_INFO: Self = Self(0x0001);
    /// Notice, common to every class.
    pub const NOTICE: Self = Self(0x0002);
    /// InformInfo, common to every class.
    pub const INFORM_INFO: Self = Self(0x0003);

    /// CM: connection request.
    pub const REQ: Self = Self(0x0010);
    /// CM: message receipt acknowledgement (asks the peer to wait longer).
    pub const MRA: Self = Self(0x0011);
    /// CM: reject.
    pub const REJ: Self = Self(0x0012);
    /// CM: reply to a REQ.
    pub const REP: Self = Self(0x0013);
    /// CM: ready to use.
    pub const RTU: Self = Self(0x0014);
    /// CM: disconnect request.
    pub const DREQ: Self = Self(0x0015);
    /// CM: disconnect reply.
    pub const DREP: Self = Self(0x0016);
    /// CM: service ID resolution request (UD).
    pub const SIDR_REQ: Self = Self(0x0017);
    /// CM: service ID resolution reply.
    pub const SIDR_REP: Self = Self(0x0018);
    /// CM: load alternate path.
    pub const LAP: Self = Self(0x0019);
    /// CM: alternate path response.
    pub const APR: Self = Self(0x001a);

    /// PERF: PortSamplesControl (same number as CM REQ).
    pub const PORT_SAMPLES_CONTROL: Self = Self(0x0010);
    /// PERF: PortSamplesResult (same number as CM MRA).
    pub const PORT_SAMPLES_RESULT: Self = Self(0x0011);
    /// PERF: PortCounters (same number as CM REJ).
    pub const PORT_COUNTERS: Self = Self(0x0012);
    /// PERF: PortCountersExtended.
    pub const PORT_COUNTERS_EXT: Self = Self(0x001d);

    /// The attribute's name within `class`, if known.
    pub const fn name(self, class: MgmtClass) -> Option<&'static str> {
        match self {
            Self::CLASS_PORT_INFO => return Some("CLASS_PORT_INFO"),
            Self::NOTICE => return Some("NOTICE"),
            Self::INFORM_INFO => return Some("INFORM_INFO"),
            _ => {}
        }
        if class.0 == MgmtClass::CM.0 {
            Some(match self {
                Self::REQ => "REQ",
                Self::MRA => "MRA",
                Self::REJ => "REJ",
                Self::REP => "REP",
                Self::RTU => "RTU",
                Self::DREQ => "DREQ",
                Self::DREP => "DREP",
                Self::SIDR_REQ => "SIDR_REQ",
                Self::SIDR_REP => "SIDR_REP",
                Self::LAP => "LAP",
                Self::APR => "APR",
                _ => return None,
            })
        } else if class.0 == MgmtClass::PERF.0 {
            Some(match self {
                Self::PORT_SAMPLES_CONTROL => "PORT_SAMPLES_CONTROL",
                Self::PORT_SAMPLES_RESULT => "PORT_SAMPLES_RESULT",
                Self::PORT_COUNTERS => "PORT_COUNTERS",
                Self::PORT_COUNTERS_EXT => "PORT_COUNTERS_EXT",
                _ => return None,
            })
        } else {
            None
        }
    }
}

/// Prints the class-independent names (CLASS_PORT_INFO, NOTICE, INFORM_INFO) and the number
/// otherwise, since the rest depend on the class: use [`MadHeader::attribute_name`].
impl fmt::Display for AttributeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name(MgmtClass(0)) {
            Some(name) => f.write_str(name),
            None => write!(f, "{:#06x}", self.0),
        }
    }
}

header_view!(
    /// A zero-copy view of a whole MAD: the 24-byte common header and the 232-byte data area.
    /// `check_len` asks for at least [`MAD_LEN`] bytes.
    MadPacket,
    MAD_LEN
);

impl<T: AsRef<[u8]>> MadPacket<T> {
    /// Version of the MAD base format: 1.
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[BASE_VERSION]
    }
    /// The management class.
    pub fn mgmt_class(&self) -> MgmtClass {
        MgmtClass(self.buffer.as_ref()[MGMT_CLASS])
    }
    /// Version of the class's format (CM: 2).
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[CLASS_VERSION]
    }
    /// The method.
    pub fn method(&self) -> Method {
        Method(self.buffer.as_ref()[METHOD])
    }
    /// Status of a response (IBA Table 104: bits 4:2 hold the common error code; 0 is
    /// success).
    pub fn status(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), STATUS)
    }
    /// Class-specific word (directed-route hop pointers for SMPs, otherwise 0).
    pub fn class_specific(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), CLASS_SPECIFIC)
    }
    /// Transaction ID, echoed by the response.
    pub fn transaction_id(&self) -> u64 {
        field::u64_at(self.buffer.as_ref(), TRANSACTION_ID)
    }
    /// The attribute the data area holds.
    pub fn attribute_id(&self) -> AttributeId {
        AttributeId(field::u16_at(self.buffer.as_ref(), ATTRIBUTE_ID))
    }
    /// The two reserved bytes after the attribute ID.
    pub fn reserved(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), RESERVED)
    }
    /// Attribute modifier (CM REQ/REP: the ECE options, otherwise 0).
    pub fn attribute_modifier(&self) -> u32 {
        field::u32_at(self.buffer.as_ref(), ATTRIBUTE_MODIFIER)
    }
    /// The 232-byte data area.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[DATA]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MadPacket<T> {
    /// The 232-byte data area, for a class's message to [`emit`](crate::cm::CmMessage::emit)
    /// into.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[DATA]
    }
}

/// A parsed common MAD header.
///
/// The two reserved bytes are not kept: every MAD in the project's kernel captures has them
/// zero, and [`emit`](Self::emit) writes zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MadHeader {
    /// Version of the MAD base format: 1.
    pub base_version: u8,
    /// The management class.
    pub mgmt_class: MgmtClass,
    /// Version of the class's format (CM: 2).
    pub class_version: u8,
    /// The method.
    pub method: Method,
    /// Status of a response (0 for requests).
    pub status: u16,
    /// Class-specific word.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// The attribute the data area holds.
    pub attribute_id: AttributeId,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// The MAD base version every MAD on RoCE carries.
    pub const BASE_VERSION: u8 = 1;
    /// The CM class version Linux registers for (`cm.c: IB_CM_CLASS_VERSION`).
    pub const CM_CLASS_VERSION: u8 = 2;

    /// The header of a CM message: base version 1, class CM version 2, method SEND, status
    /// and attribute modifier 0 (`cm.c: cm_format_mad_hdr`).
    pub const fn cm(attribute_id: AttributeId, transaction_id: u64) -> Self {
        Self {
            base_version: Self::BASE_VERSION,
            mgmt_class: MgmtClass::CM,
            class_version: Self::CM_CLASS_VERSION,
            method: Method::SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Parses the common header. Every value is accepted.
    pub fn parse<T: AsRef<[u8]>>(packet: &MadPacket<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            base_version: packet.base_version(),
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// Writes the 24 header bytes, reserved ones zero; the data area is left alone.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut MadPacket<T>) {
        let b = packet.buffer.as_mut();
        b[BASE_VERSION] = self.base_version;
        b[MGMT_CLASS] = self.mgmt_class.0;
        b[CLASS_VERSION] = self.class_version;
        b[METHOD] = self.method.0;
        field::set_u16(b, STATUS, self.status);
        field::set_u16(b, CLASS_SPECIFIC, self.class_specific);
        field::set_u64(b, TRANSACTION_ID, self.transaction_id);
        field::set_u16(b, ATTRIBUTE_ID, self.attribute_id.0);
        field::set_u16(b, RESERVED, 0);
        field::set_u32(b, ATTRIBUTE_MODIFIER, self.attribute_modifier);
    }

    /// The attribute's name within this header's class, if known.
    pub const fn attribute_name(&self) -> Option<&'static str> {
        self.attribute_id.name(self.mgmt_class)
    }
}

/// A parsed MAD: the header, and the data area borrowed from the buffer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MadRepr<'a> {
    /// The common header.
    pub header: MadHeader,
    /// The data area, [`MAD_DATA_LEN`] bytes.
    pub data: &'a [u8],
}

impl<'a> MadRepr<'a> {
    /// Parses a MAD. The buffer must be exactly [`MAD_LEN`] bytes (a MAD in a UD packet is
    /// the whole payload), or this fails with [`Error::BadMadLength`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &MadPacket<&'a T>) -> Result<Self> {
        let buffer: &'a [u8] = packet.buffer.as_ref();
        if buffer.len() != MAD_LEN {
            return Err(Error::BadMadLength);
        }
        let header = MadHeader::parse(packet)?;
        Ok(Self { header, data: &buffer[DATA] })
    }

    /// Writes all [`MAD_LEN`] bytes. Fails with [`Error::BufferTooSmall`] if the buffer is
    /// shorter, and with [`Error::BadMadLength`] unless `data` is exactly
    /// [`MAD_DATA_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut MadPacket<T>) -> Result<()> {
        if packet.check_len().is_err() {
            return Err(Error::BufferTooSmall);
        }
        if self.data.len() != MAD_DATA_LEN {
            return Err(Error::BadMadLength);
        }
        self.header.emit(packet);
        packet.data_mut().copy_from_slice(self.data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A PerfMgmt GetResp from `host-guest-mad-probe.pcap` frame 2: rxe answers PortCounters
    /// with status 0x000c (unsupported method/attribute combination) and no data.
    fn perf_get_resp() -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        mad[..24].copy_from_slice(&[
            0x01, 0x04, 0x01, 0x81, 0x00, 0x0c, 0x00, 0x00, 0x30, 0xe1, 0x7d, 0x90, 0xd1, 0x83, 0x9b, 0x5f, 0x00, 0x12,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ]);
        mad
    }

    #[test]
    fn golden_perf_get_resp() {
        let bytes = perf_get_resp();
        let repr = MadRepr::parse(&MadPacket::new_unchecked(&bytes[..])).unwrap();
        assert_eq!(
            repr.header,
            MadHeader {
                base_version: 1,
                mgmt_class: MgmtClass::PERF,
                class_version: 1,
                method: Method::GET_RESP,
                status: 0x000c,
                class_specific: 0,
                transaction_id: 0x30e1_7d90_d183_9b5f,
                attribute_id: AttributeId::PORT_COUNTERS,
                attribute_modifier: 0,
            }
        );
        assert!(repr.header.method.is_response());
        assert_eq!(repr.header.attribute_name(), Some("PORT_COUNTERS"));
        assert_eq!(repr.data.len(), MAD_DATA_LEN);

        let mut out = [0xa5u8; MAD_LEN];
        repr.emit(&mut MadPacket::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn view_getters() {
        let mut bytes = perf_get_resp();
        bytes[18] = 0xbe;
        bytes[19] = 0xef;
        bytes[20..24].copy_from_slice(&[1, 2, 3, 4]);
        bytes[24] = 0x77;
        let p = MadPacket::new_checked(&bytes[..]).unwrap();
        assert_eq!(p.base_version(), 1);
        assert_eq!(p.mgmt_class(), MgmtClass::PERF);
        assert_eq!(p.class_version(), 1);
        assert_eq!(p.method(), Method::GET_RESP);
        assert_eq!(p.status(), 0x000c);
        assert_eq!(p.class_specific(), 0);
        assert_eq!(p.transaction_id(), 0x30e1_7d90_d183_9b5f);
        assert_eq!(p.attribute_id(), AttributeId(0x0012));
        assert_eq!(p.reserved(), 0xbeef);
        assert_eq!(p.attribute_modifier(), 0x0102_0304);
        assert_eq!(p.data()[0], 0x77);
        assert_eq!(p.data().len(), MAD_DATA_LEN);
    }

    #[test]
    fn reserved_bytes_emit_as_zero() {
        let mut bytes = perf_get_resp();
        bytes[18] = 0xff;
        let repr = MadRepr::parse(&MadPacket::new_unchecked(&bytes[..])).unwrap();
        let mut out = [0xa5u8; MAD_LEN];
        repr.emit(&mut MadPacket::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out[18..20], [0, 0]);
    }

    #[test]
    fn length_must_be_exactly_256() {
        let bytes = [0u8; MAD_LEN + 1];
        for len in [0, 1, 23, 24, 255, 257] {
            let r = MadRepr::parse(&MadPacket::new_unchecked(&bytes[..len]));
            assert_eq!(r, Err(Error::BadMadLength), "len {len}");
        }
        assert_eq!(MadPacket::new_checked(&bytes[..255]).unwrap_err(), Error::Truncated);
        assert_eq!(MadHeader::parse(&MadPacket::new_unchecked(&bytes[..10])), Err(Error::Truncated));
    }

    #[test]
    fn emit_checks_sizes() {
        let bytes = perf_get_resp();
        let repr = MadRepr::parse(&MadPacket::new_unchecked(&bytes[..])).unwrap();
        let mut short = [0u8; MAD_LEN - 1];
        assert_eq!(repr.emit(&mut MadPacket::new_unchecked(&mut short[..])), Err(Error::BufferTooSmall));
        let bad = MadRepr { data: &bytes[..100], ..repr };
        let mut out = [0u8; MAD_LEN];
        assert_eq!(bad.emit(&mut MadPacket::new_unchecked(&mut out[..])), Err(Error::BadMadLength));
    }

    #[test]
    fn unknown_class_method_attribute_round_trip() {
        let mut bytes = [0x3cu8; MAD_LEN];
        bytes[18] = 0;
        bytes[19] = 0;
        bytes[1] = 0x4e; // vendor range 2
        bytes[3] = 0x7f;
        bytes[16] = 0xab;
        bytes[17] = 0xcd;
        let repr = MadRepr::parse(&MadPacket::new_unchecked(&bytes[..])).unwrap();
        assert!(repr.header.mgmt_class.is_vendor());
        assert_eq!(repr.header.mgmt_class.to_string(), "0x4e");
        assert_eq!(repr.header.method.to_string(), "0x7f");
        assert_eq!(repr.header.attribute_id.to_string(), "0xabcd");
        assert_eq!(repr.header.attribute_name(), None);
        let mut out = [0xa5u8; MAD_LEN];
        repr.emit(&mut MadPacket::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn names() {
        assert_eq!(MgmtClass::CM.to_string(), "CM");
        assert_eq!(MgmtClass::SUBN_DIRECTED.to_string(), "SUBN_DIRECTED");
        assert_eq!(Method::SEND.to_string(), "SEND");
        assert_eq!(Method::GET_RESP.to_string(), "GET_RESP");
        assert!(!Method::SEND.is_response());
        assert_eq!(AttributeId::CLASS_PORT_INFO.to_string(), "CLASS_PORT_INFO");
        assert_eq!(AttributeId::REJ.to_string(), "0x0012");
        assert_eq!(AttributeId::REJ.name(MgmtClass::CM), Some("REJ"));
        assert_eq!(AttributeId(0x0012).name(MgmtClass::PERF), Some("PORT_COUNTERS"));
        assert_eq!(AttributeId::APR.name(MgmtClass::CM), Some("APR"));
        assert_eq!(AttributeId::REQ.name(MgmtClass::SUBN_ADM), None);
        assert_eq!(MadHeader::cm(AttributeId::RTU, 7).attribute_name(), Some("RTU"));
    }

    fn header_strategy() -> impl Strategy<Value = MadHeader> {
        (any::<[u8; 4]>(), any::<u16>(), any::<u16>(), any::<u64>(), any::<u16>(), any::<u32>()).prop_map(
            |(b, status, class_specific, transaction_id, attribute_id, attribute_modifier)| MadHeader {
                base_version: b[0],
                mgmt_class: MgmtClass(b[1]),
                class_version: b[2],
                method: Method(b[3]),
                status,
                class_specific,
                transaction_id,
                attribute_id: AttributeId(attribute_id),
                attribute_modifier,
            },
        )
    }

    proptest! {
        #[test]
        fn header_round_trips(header in header_strategy(), data in prop::collection::vec(any::<u8>(), MAD_DATA_LEN)) {
            let repr = MadRepr { header, data: &data };
            let mut out = [0xa5u8; MAD_LEN];
            repr.emit(&mut MadPacket::new_unchecked(&mut out[..])).unwrap();
            prop_assert_eq!(out[18..20].to_vec(), vec![0u8, 0]);
            let parsed = MadRepr::parse(&MadPacket::new_unchecked(&out[..])).unwrap();
            prop_assert_eq!(parsed, repr);
        }

        #[test]
        fn any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let packet = MadPacket::new_unchecked(&bytes[..]);
            if let Ok(repr) = MadRepr::parse(&packet) {
                prop_assert_eq!(bytes.len(), MAD_LEN);
                let mut out = [0u8; MAD_LEN];
                repr.emit(&mut MadPacket::new_unchecked(&mut out[..])).unwrap();
                // Everything but the reserved bytes survives.
                prop_assert_eq!(&out[..18], &bytes[..18]);
                prop_assert_eq!(&out[20..], &bytes[20..]);
            } else {
                prop_assert_ne!(bytes.len(), MAD_LEN);
            }
        }
    }
}
