//! Byte-range helpers shared by every header view.
//!
//! Each header module declares its layout as private constants (`const PSN: Field = 9..12;`),
//! the way smoltcp does, so that the offsets live in one place and read like the spec tables.

/// A fixed byte range within a header.
pub(crate) type Field = core::ops::Range<usize>;

pub(crate) fn u16_at(b: &[u8], f: Field) -> u16 {
    u16::from_be_bytes([b[f.start], b[f.start + 1]])
}

pub(crate) fn u24_at(b: &[u8], f: Field) -> u32 {
    u32::from_be_bytes([0, b[f.start], b[f.start + 1], b[f.start + 2]])
}

pub(crate) fn u32_at(b: &[u8], f: Field) -> u32 {
    u32::from_be_bytes([b[f.start], b[f.start + 1], b[f.start + 2], b[f.start + 3]])
}

pub(crate) fn u64_at(b: &[u8], f: Field) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[f]);
    u64::from_be_bytes(w)
}

pub(crate) fn set_u16(b: &mut [u8], f: Field, v: u16) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn set_u24(b: &mut [u8], f: Field, v: u32) {
    debug_assert!(v <= 0x00ff_ffff, "24-bit field overflow: {v:#x}");
    b[f].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn set_u32(b: &mut [u8], f: Field, v: u32) {
    b[f].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn set_u64(b: &mut [u8], f: Field, v: u64) {
    b[f].copy_from_slice(&v.to_be_bytes());
}
