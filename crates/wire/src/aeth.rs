//! ACK extended transport header (IBA 9.3.5), 4 bytes: a syndrome and the responder's MSN.
//!
//! The syndrome's top three bits say what the packet is (IBA Table 43):
//! `000` ACK with a credit count, `001` RNR NAK with a timer code, `011` NAK with an error
//! code; `010` and values with bit 7 set are reserved. [`Syndrome`] is lossless: every byte
//! parses, and reserved values re-emit unchanged.

use core::fmt;

use crate::Result;
use crate::field::{self, Field};
use crate::types::Msn;
use crate::view::header_view;

/// Length in bytes.
pub const HEADER_LEN: usize = 4;
const SYNDROME: usize = 0;
const MSN: Field = 1..4;

header_view!(
    /// A zero-copy view of an AETH.
    AethPacket,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> AethPacket<T> {
    /// The raw syndrome byte.
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[SYNDROME]
    }
    /// The interpreted syndrome.
    pub fn syndrome(&self) -> Syndrome {
        Syndrome::from_u8(self.syndrome_raw())
    }
    /// The responder's message sequence number.
    pub fn msn(&self) -> Msn {
        Msn::from_u24_truncating(field::u24_at(self.buffer.as_ref(), MSN))
    }
}

/// What an AETH says.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Syndrome {
    /// Positive acknowledgement, with an end-to-end credit count code (0x1F: no credits
    /// are advertised; rxe always sends that).
    Ack {
        /// Credit count code, 5 bits; see [`credits_from_code`].
        credit_code: u8,
    },
    /// Receiver not ready: retry after the time the timer code names.
    RnrNak(RnrTimer),
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A reserved syndrome (type `010`, or bit 7 set), kept verbatim.
    Reserved(u8),
}

impl Syndrome {
    /// The "no credit information" credit code that rxe and most RNICs send.
    pub const ACK_NO_CREDITS: Syndrome = Syndrome::Ack { credit_code: 0x1f };

    /// Interprets a syndrome byte. Never fails.
    pub const fn from_u8(b: u8) -> Self {
        let low = b & 0x1f;
        match b >> 5 {
            0 => Syndrome::Ack { credit_code: low },
            1 => Syndrome::RnrNak(RnrTimer(low)),
            3 => Syndrome::Nak(NakCode::from_u5(low)),
            _ => Syndrome::Reserved(b),
        }
    }

    /// The syndrome byte. `from_u8(s.to_u8()) == s` for every `s` that `from_u8` returns.
    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => credit_code & 0x1f,
            Syndrome::RnrNak(t) => 0x20 | (t.0 & 0x1f),
            Syndrome::Nak(code) => 0x60 | code.to_u5(),
            Syndrome::Reserved(b) => b,
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Syndrome::Ack { credit_code } => write!(f, "ACK credits={credit_code:#04x}"),
            Syndrome::RnrNak(t) => write!(f, "RNR_NAK timer={} ({} us)", t.0, t.delay_us()),
            Syndrome::Nak(code) => write!(f, "NAK {code}"),
            Syndrome::Reserved(b) => write!(f, "RESERVED({b:#04x})"),
        }
    }
}

/// NAK codes (IBA Table 44).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum NakCode {
    /// PSN sequence error: the responder expected an earlier PSN; go back N from the PSN
    /// in the BTH.
    PsnSequenceError,
    /// Invalid request: unsupported opcode, bad length, misaligned atomic, ...
    InvalidRequest,
    /// Remote access error: bad R_Key, bounds or access rights.
    RemoteAccessError,
    /// Remote operational error: the responder could not complete the request.
    RemoteOperationalError,
    /// Invalid RD request (reliable datagram only).
    InvalidRdRequest,
    /// A reserved code (5..=31), kept verbatim.
    Reserved(u8),
}

impl NakCode {
    /// From the low five bits of the syndrome.
    pub const fn from_u5(v: u8) -> Self {
        match v & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Reserved(other),
        }
    }

    /// The low five bits of the syndrome.
    pub const fn to_u5(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(v) => v & 0x1f,
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NakCode::PsnSequenceError => f.write_str("PSN_SEQUENCE_ERROR"),
            NakCode::InvalidRequest => f.write_str("INVALID_REQUEST"),
            NakCode::RemoteAccessError => f.write_str("REMOTE_ACCESS_ERROR"),
            NakCode::RemoteOperationalError => f.write_str("REMOTE_OPERATIONAL_ERROR"),
            NakCode::InvalidRdRequest => f.write_str("INVALID_RD_REQUEST"),
            NakCode::Reserved(v) => write!(f, "RESERVED({v})"),
        }
    }
}

/// An RNR NAK timer code (5 bits): how long the requester waits before retrying.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RnrTimer(u8);

/// IBA Table 45: RNR timer code → delay in microseconds. Code 0 is the longest, 655.36 ms.
const RNR_DELAY_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120, 7_680,
    10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
];

impl RnrTimer {
    /// Returns `None` for codes above 31.
    pub const fn new(code: u8) -> Option<Self> {
        if code < 32 { Some(Self(code)) } else { None }
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        self.0
    }

    /// The delay the code stands for, in microseconds (IBA Table 45).
    pub const fn delay_us(self) -> u32 {
        RNR_DELAY_US[(self.0 & 0x1f) as usize]
    }
}

/// End-to-end credit count code → number of credits (IBA Table 46). Code 31 means the
/// credit count is invalid (unlimited), and gives `None`.
pub const fn credits_from_code(code: u8) -> Option<u16> {
    const CREDITS: [u16; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
        6144, 8192, 12288, 16384, 24576, 32768,
    ];
    if (code as usize) < CREDITS.len() { Some(CREDITS[code as usize]) } else { None }
}

/// A parsed AETH.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct AethRepr {
    /// The syndrome.
    pub syndrome: Syndrome,
    /// The responder's current MSN.
    pub msn: Msn,
}

impl AethRepr {
    /// Parses an AETH. Every syndrome byte is accepted (see [`Syndrome`]).
    pub fn parse<T: AsRef<[u8]>>(p: &AethPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(Self { syndrome: p.syndrome(), msn: p.msn() })
    }

    /// Writes the AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AethPacket<T>) {
        let b = p.buffer.as_mut();
        b[SYNDROME] = self.syndrome.to_u8();
        field::set_u24(b, MSN, self.msn.value());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syndrome_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(Syndrome::from_u8(b).to_u8(), b, "{b:#04x}");
        }
    }

    #[test]
    fn syndrome_classes() {
        assert_eq!(Syndrome::from_u8(0x1f), Syndrome::ACK_NO_CREDITS);
        assert_eq!(Syndrome::from_u8(0x2c), Syndrome::RnrNak(RnrTimer::new(12).unwrap()));
        assert_eq!(Syndrome::from_u8(0x60), Syndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(Syndrome::from_u8(0x61), Syndrome::Nak(NakCode::InvalidRequest));
        assert_eq!(Syndrome::from_u8(0x62), Syndrome::Nak(NakCode::RemoteAccessError));
        assert_eq!(Syndrome::from_u8(0x63), Syndrome::Nak(NakCode::RemoteOperationalError));
        assert_eq!(Syndrome::from_u8(0x64), Syndrome::Nak(NakCode::InvalidRdRequest));
        assert_eq!(Syndrome::from_u8(0x65), Syndrome::Nak(NakCode::Reserved(5)));
        assert_eq!(Syndrome::from_u8(0x40), Syndrome::Reserved(0x40));
        assert_eq!(Syndrome::from_u8(0x9f), Syndrome::Reserved(0x9f));
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(RnrTimer::new(0).unwrap().delay_us(), 655_360);
        assert_eq!(RnrTimer::new(1).unwrap().delay_us(), 10);
        assert_eq!(RnrTimer::new(12).unwrap().delay_us(), 640);
        // rxe writes code 25 as 61410, a typo; IBA Table 45 says 61.44 ms.
        assert_eq!(RnrTimer::new(25).unwrap().delay_us(), 61_440);
        assert_eq!(RnrTimer::new(31).unwrap().delay_us(), 491_520);
        assert_eq!(RnrTimer::new(32), None);
    }

    #[test]
    fn credit_table() {
        assert_eq!(credits_from_code(0), Some(0));
        assert_eq!(credits_from_code(5), Some(6));
        assert_eq!(credits_from_code(30), Some(32768));
        assert_eq!(credits_from_code(31), None);
    }

    #[test]
    fn golden_ack() {
        // Example B: ACK, credits invalid, MSN 1.
        let bytes = [0x1f, 0, 0, 1];
        let r = AethRepr::parse(&AethPacket::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r, AethRepr { syndrome: Syndrome::ACK_NO_CREDITS, msn: Msn::new(1).unwrap() });
        let mut out = [0xa5u8; 4];
        r.emit(&mut AethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
