//! Arbitrary bytes as a MAD (the 256-byte payload of a UD packet to QP1) and as a CM data
//! area.
//!
//! - `MadPacket` accessors never panic once `new_checked` has passed; `MadHeader::parse`,
//!   `MadRepr::parse`, `CmMessage::parse` and `CmMessage::parse_data` never panic.
//! - Round-trip oracles: a MAD that parses re-emits to bytes that parse the same and differ
//!   from the input only in the two reserved header bytes; a CM message that parses re-emits
//!   to a data area that parses to the same message.
//! - Inputs of any length are also tried cut or zero-padded to 256 bytes, since
//!   `MadRepr::parse` wants exactly that many, and as `attribute ID (2 bytes) ++ data area`
//!   for `CmMessage::parse_data`, so that every CM message is reached without the fuzzer
//!   first having to find the CM class byte.
use softrdma_wire::cm::CmMessage;
use softrdma_wire::mad::{AttributeId, MAD_DATA_LEN, MAD_LEN, MadHeader, MadPacket, MadRepr};

/// Runs the target on one input; panics when an oracle above does not hold.
pub fn run(data: &[u8]) {
    check_mad(data);
    let mut exact = [0u8; MAD_LEN];
    let n = data.len().min(MAD_LEN);
    exact[..n].copy_from_slice(&data[..n]);
    check_mad(&exact);

    if let [a, b, area @ ..] = data {
        let attribute_id = AttributeId(u16::from_be_bytes([*a, *b]));
        check_cm(attribute_id, area);
        let mut exact = [0u8; MAD_DATA_LEN];
        let n = area.len().min(MAD_DATA_LEN);
        exact[..n].copy_from_slice(&area[..n]);
        check_cm(attribute_id, &exact);
    }
}

fn check_mad(data: &[u8]) {
    if let Ok(p) = MadPacket::new_checked(data) {
        let _ = (p.base_version(), p.mgmt_class(), p.class_version(), p.method(), p.status());
        let _ = (p.class_specific(), p.transaction_id(), p.attribute_id(), p.reserved());
        let _ = (p.attribute_modifier(), p.data(), MadHeader::parse(&p));
    }
    let Ok(m) = MadRepr::parse(&MadPacket::new_unchecked(data)) else { return };
    let _ = m.header.attribute_name();
    let mut out = [0u8; MAD_LEN];
    assert_eq!(m.emit(&mut MadPacket::new_unchecked(&mut out[..])), Ok(()));
    assert_eq!(MadRepr::parse(&MadPacket::new_unchecked(&out[..])), Ok(m), "re-emitted MAD parses differently");
    assert_eq!(&out[..18], &data[..18]);
    assert_eq!(&out[20..], &data[20..]);

    if let Ok(msg) = CmMessage::parse(&m) {
        assert_eq!(msg.attribute_id(), m.header.attribute_id);
        check_message(&msg);
    }
}

fn check_cm(attribute_id: AttributeId, area: &[u8]) {
    if let Ok(msg) = CmMessage::parse_data(attribute_id, area) {
        assert_eq!(msg.attribute_id(), attribute_id);
        check_message(&msg);
    }
}

fn check_message(msg: &CmMessage<'_>) {
    let _ = (msg.name(), msg.local_comm_id(), msg.remote_comm_id(), msg.mad_header(0));
    let mut out = [0u8; MAD_DATA_LEN];
    assert_eq!(msg.emit(&mut out), Ok(()), "a parsed {} does not re-emit", msg.name());
    let again = CmMessage::parse_data(msg.attribute_id(), &out);
    assert_eq!(again.as_ref(), Ok(msg), "re-emitted {} parses differently", msg.name());
}
