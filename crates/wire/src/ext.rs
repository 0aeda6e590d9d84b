//! The fixed-layout extended transport headers (IBA 9.3): RETH, AtomicETH, AtomicAckETH,
//! ImmDt, IETH, DETH and FETH. The AETH, which has a syndrome to interpret, lives in
//! [`crate::aeth`].
//!
//! Each has a zero-copy view and a `Repr` whose `emit` writes every byte (reserved ones as 0).

use crate::Result;
use crate::field::{self, Field};
use crate::types::{QKey, Qpn, RKey};
use crate::view::header_view;

/// RDMA extended transport header: where a WRITE, READ or FLUSH goes (16 bytes).
pub mod reth {
    use super::*;

    /// Length in bytes.
    pub const HEADER_LEN: usize = 16;
    const VA: Field = 0..8;
    const RKEY: Field = 8..12;
    const DMA_LEN: Field = 12..16;

    header_view!(
        /// A zero-copy view of a RETH.
        RethPacket,
        HEADER_LEN
    );

    impl<T: AsRef<[u8]>> RethPacket<T> {
        /// Virtual address of the first remote byte.
        pub fn virtual_address(&self) -> u64 {
            field::u64_at(self.buffer.as_ref(), VA)
        }
        /// The remote key that names the memory region.
        pub fn rkey(&self) -> RKey {
            RKey(field::u32_at(self.buffer.as_ref(), RKEY))
        }
        /// Length of the whole message, not just this packet.
        pub fn dma_length(&self) -> u32 {
            field::u32_at(self.buffer.as_ref(), DMA_LEN)
        }
    }

    /// A parsed RETH.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct RethRepr {
        /// Remote virtual address.
        pub virtual_address: u64,
        /// Remote key.
        pub rkey: RKey,
        /// Total length of the operation in bytes.
        pub dma_length: u32,
    }

    impl RethRepr {
        /// Parses a RETH.
        pub fn parse<T: AsRef<[u8]>>(p: &RethPacket<T>) -> Result<Self> {
            p.check_len()?;
            Ok(Self { virtual_address: p.virtual_address(), rkey: p.rkey(), dma_length: p.dma_length() })
        }
        /// Writes the RETH.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RethPacket<T>) {
            let b = p.buffer.as_mut();
            field::set_u64(b, VA, self.virtual_address);
            field::set_u32(b, RKEY, self.rkey.0);
            field::set_u32(b, DMA_LEN, self.dma_length);
        }
    }
}

/// Atomic extended transport header: the target and operands of CMP_SWAP / FETCH_ADD
/// (28 bytes, packed without alignment padding).
pub mod atomic_eth {
    use super::*;

    /// Length in bytes.
    pub const HEADER_LEN: usize = 28;
    const VA: Field = 0..8;
    const RKEY: Field = 8..12;
    const SWAP_ADD: Field = 12..20;
    const COMPARE: Field = 20..28;

    header_view!(
        /// A zero-copy view of an AtomicETH.
        AtomicEthPacket,
        HEADER_LEN
    );

    impl<T: AsRef<[u8]>> AtomicEthPacket<T> {
        /// Remote virtual address (must be 8-byte aligned; the responder checks).
        pub fn virtual_address(&self) -> u64 {
            field::u64_at(self.buffer.as_ref(), VA)
        }
        /// Remote key.
        pub fn rkey(&self) -> RKey {
            RKey(field::u32_at(self.buffer.as_ref(), RKEY))
        }
        /// Swap value (CMP_SWAP) or addend (FETCH_ADD).
        pub fn swap_add(&self) -> u64 {
            field::u64_at(self.buffer.as_ref(), SWAP_ADD)
        }
        /// Compare value (CMP_SWAP only).
        pub fn compare(&self) -> u64 {
            field::u64_at(self.buffer.as_ref(), COMPARE)
        }
    }

    /// A parsed AtomicETH.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct AtomicEthRepr {
        /// Remote virtual address.
        pub virtual_address: u64,
        /// Remote key.
        pub rkey: RKey,
        /// Swap value or addend.
        pub swap_add: u64,
        /// Compare value.
        pub compare: u64,
    }

    impl AtomicEthRepr {
        /// Parses an AtomicETH.
        pub fn parse<T: AsRef<[u8]>>(p: &AtomicEthPacket<T>) -> Result<Self> {
            p.check_len()?;
            Ok(Self {
                virtual_address: p.virtual_address(),
                rkey: p.rkey(),
                swap_add: p.swap_add(),
                compare: p.compare(),
            })
        }
        /// Writes the AtomicETH.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicEthPacket<T>) {
            let b = p.buffer.as_mut();
            field::set_u64(b, VA, self.virtual_address);
            field::set_u32(b, RKEY, self.rkey.0);
            field::set_u64(b, SWAP_ADD, self.swap_add);
            field::set_u64(b, COMPARE, self.compare);
        }
    }
}

/// Atomic acknowledge extended transport header: the value the target held before the
/// atomic (8 bytes).
pub mod atomic_ack_eth {
    use super::*;

    /// Length in bytes.
    pub const HEADER_LEN: usize = 8;
    const ORIG: Field = 0..8;

    header_view!(
        /// A zero-copy view of an AtomicAckETH.
        AtomicAckEthPacket,
        HEADER_LEN
    );

    impl<T: AsRef<[u8]>> AtomicAckEthPacket<T> {
        /// The original remote data.
        pub fn original_data(&self) -> u64 {
            field::u64_at(self.buffer.as_ref(), ORIG)
        }
    }

    /// A parsed AtomicAckETH.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct AtomicAckEthRepr {
        /// The original remote data.
        pub original_data: u64,
    }

    impl AtomicAckEthRepr {
        /// Parses an AtomicAckETH.
        pub fn parse<T: AsRef<[u8]>>(p: &AtomicAckEthPacket<T>) -> Result<Self> {
            p.check_len()?;
            Ok(Self { original_data: p.original_data() })
        }
        /// Writes the AtomicAckETH.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicAckEthPacket<T>) {
            field::set_u64(p.buffer.as_mut(), ORIG, self.original_data);
        }
    }
}

/// Immediate data (4 opaque bytes, handed to the receiver as `wc.imm_data`, in network
/// order).
pub mod imm_dt {
    use super::*;

    /// Length in bytes.
    pub const HEADER_LEN: usize = 4;

    header_view!(
        /// A zero-copy view of an ImmDt header.
        ImmDtPacket,
        HEADER_LEN
    );

    impl<T: AsRef<[u8]>> ImmDtPacket<T> {
        /// The immediate data as it travels (big-endian bytes).
        pub fn immediate(&self) -> [u8; 4] {
            let b = self.buffer.as_ref();
            [b[0], b[1], b[2], b[3]]
        }
    }

    /// Immediate data. Kept as the four wire bytes: verbs hand them to the application
    /// unchanged (`imm_data` is `__be32`).
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct ImmDtRepr(pub [u8; 4]);

    impl ImmDtRepr {
        /// Parses an ImmDt.
        pub fn parse<T: AsRef<[u8]>>(p: &ImmDtPacket<T>) -> Result<Self> {
            p.check_len()?;
            Ok(Self(p.immediate()))
        }
        /// Writes the ImmDt.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ImmDtPacket<T>) {
            p.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&self.0);
        }
        /// The value read big-endian, as tools print it.
        pub fn value(&self) -> u32 {
            u32::from_be_bytes(self.0)
        }
    }
}

/// Invalidate extended transport header: the R_Key a SEND_WITH_INVALIDATE invalidates
/// (4 bytes).
pub mod ieth {
    use super::*;

    /// Length in bytes.
    pub const HEADER_LEN: usize = 4;
    const RKEY: Field = 0..4;

    header_view!(
        /// A zero-copy view of an IETH.
        IethPacket,
        HEADER_LEN
    );

    impl<T: AsRef<[u8]>> IethPacket<T> {
        /// The R_Key to invalidate.
        pub fn rkey(&self) -> RKey {
            RKey(field::u32_at(self.buffer.as_ref(), RKEY))
        }
    }

    /// A parsed IETH.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct IethRepr {
        /// The R_Key to invalidate.
        pub rkey: RKey,
    }

    impl IethRepr {
        /// Parses an IETH.
        pub fn parse<T: AsRef<[u8]>>(p: &IethPacket<T>) -> Result<Self> {
            p.check_len()?;
            Ok(Self { rkey: p.rkey() })
        }
        /// Writes the IETH.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut IethPacket<T>) {
            field::set_u32(p.buffer.as_mut(), RKEY, self.rkey.0);
        }
    }
}

/// XRC extended transport header: the XRC SRQ of the target that a request's receive
/// comes from (4 bytes: 8 reserved bits, the 24-bit SRQ number).
pub mod xrceth {
    use super::*;

    /// Length in bytes.
    pub const HEADER_LEN: usize = 4;
    const SRQN: Field = 0..4;

    header_view!(
        /// A zero-copy view of an XRCETH.
        XrcEthPacket,
        HEADER_LEN
    );

    impl<T: AsRef<[u8]>> XrcEthPacket<T> {
        /// The XRC SRQ number (the low 24 bits; the reserved byte is ignored).
        pub fn srqn(&self) -> u32 {
            field::u32_at(self.buffer.as_ref(), SRQN) & 0x00ff_ffff
        }
    }

    /// A parsed XRCETH.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct XrcEthRepr {
        /// The XRC SRQ number, 24 bits.
        pub srqn: u32,
    }

    impl XrcEthRepr {
        /// Parses an XRCETH.
        pub fn parse<T: AsRef<[u8]>>(p: &XrcEthPacket<T>) -> Result<Self> {
            p.check_len()?;
            Ok(Self { srqn: p.srqn() })
        }
        /// Writes the XRCETH, its reserved byte zero; a number wider than 24 bits is masked.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut XrcEthPacket<T>) {
            field::set_u32(p.buffer.as_mut(), SRQN, self.srqn & 0x00ff_ffff);
        }
    }
}

/// Datagram extended transport header: the Q_Key and the sender's QP of a UD packet
/// (8 bytes).
pub mod deth {
    use super::*;

    /// Length in bytes.
    pub const HEADER_LEN: usize = 8;
    const QKEY: Field = 0..4;
    const SRC_QP: Field = 5..8;

    header_view!(
        /// A zero-copy view of a DETH.
        DethPacket,
        HEADER_LEN
    );

    impl<T: AsRef<[u8]>> DethPacket<T> {
        /// Queue key, checked by the receiving QP.
        pub fn qkey(&self) -> QKey {
            QKey(field::u32_at(self.buffer.as_ref(), QKEY))
        }
        /// The sending QP.
        pub fn src_qp(&self) -> Qpn {
            Qpn::from_u24_truncating(field::u24_at(self.buffer.as_ref(), SRC_QP))
        }
    }

    /// A parsed DETH.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct DethRepr {
        /// Queue key.
        pub qkey: QKey,
        /// Source QP.
        pub src_qp: Qpn,
    }

    impl DethRepr {
        /// Parses a DETH (the reserved byte is ignored).
        pub fn parse<T: AsRef<[u8]>>(p: &DethPacket<T>) -> Result<Self> {
            p.check_len()?;
            Ok(Self { qkey: p.qkey(), src_qp: p.src_qp() })
        }
        /// Writes the DETH, reserved byte zero.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut DethPacket<T>) {
            let b = p.buffer.as_mut();
            field::set_u32(b, QKEY, self.qkey.0);
            b[4] = 0;
            field::set_u24(b, SRC_QP, self.src_qp.value());
        }
    }
}

/// FLUSH extended transport header (IBA 1.5): what to flush and to where (4 bytes).
pub mod feth {
    use super::*;

    /// Length in bytes.
    pub const HEADER_LEN: usize = 4;
    const WORD: Field = 0..4;

    header_view!(
        /// A zero-copy view of a FETH.
        FethPacket,
        HEADER_LEN
    );

    impl<T: AsRef<[u8]>> FethPacket<T> {
        /// Selectivity level (bits 5:4): 0 the memory region range, 1 the whole region.
        pub fn selectivity(&self) -> u8 {
            ((field::u32_at(self.buffer.as_ref(), WORD) >> 4) & 0x3) as u8
        }
        /// Placement type (bits 3:0): 1 global visibility, 2 persistence.
        pub fn placement_type(&self) -> u8 {
            (field::u32_at(self.buffer.as_ref(), WORD) & 0xf) as u8
        }
    }

    /// A parsed FETH.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct FethRepr {
        /// Selectivity level (2 bits).
        pub selectivity: u8,
        /// Placement type (4 bits).
        pub placement_type: u8,
    }

    impl FethRepr {
        /// Parses a FETH.
        pub fn parse<T: AsRef<[u8]>>(p: &FethPacket<T>) -> Result<Self> {
            p.check_len()?;
            Ok(Self { selectivity: p.selectivity(), placement_type: p.placement_type() })
        }
        /// Writes the FETH, reserved bits zero. Values wider than their field are masked.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut FethPacket<T>) {
            let word = (u32::from(self.selectivity & 0x3) << 4) | u32::from(self.placement_type & 0xf);
            field::set_u32(p.buffer.as_mut(), WORD, word);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::atomic_eth::*;
    use super::deth::*;
    use super::reth::*;
    use super::*;

    #[test]
    fn reth_golden() {
        // READ request of example D: VA 0x7f0000001000, R_Key 0xa0b, length 2500.
        let bytes = [0, 0, 0x7f, 0, 0, 0, 0x10, 0, 0, 0, 0x0a, 0x0b, 0, 0, 0x09, 0xc4];
        let r = RethRepr::parse(&RethPacket::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r, RethRepr { virtual_address: 0x7f00_0000_1000, rkey: RKey(0xa0b), dma_length: 2500 });
        let mut out = [0xa5u8; 16];
        r.emit(&mut RethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn atomic_eth_is_packed() {
        let r = AtomicEthRepr {
            virtual_address: 0x0102_0304_0506_0708,
            rkey: RKey(0x1112_1314),
            swap_add: 0x2122_2324_2526_2728,
            compare: 0x3132_3334_3536_3738,
        };
        let mut out = [0xa5u8; 28];
        r.emit(&mut AtomicEthPacket::new_unchecked(&mut out[..]));
        assert_eq!(&out[8..12], &[0x11, 0x12, 0x13, 0x14]);
        assert_eq!(&out[12..14], &[0x21, 0x22]);
        assert_eq!(&out[20..22], &[0x31, 0x32]);
        assert_eq!(AtomicEthRepr::parse(&AtomicEthPacket::new_unchecked(&out[..])).unwrap(), r);
    }

    #[test]
    fn deth_writes_reserved_byte() {
        let r = DethRepr { qkey: QKey::GSI, src_qp: Qpn::GSI };
        let mut out = [0xa5u8; 8];
        r.emit(&mut DethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x80, 0x01, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn feth_fields() {
        let r = feth::FethRepr { selectivity: 1, placement_type: 2 };
        let mut out = [0xa5u8; 4];
        r.emit(&mut feth::FethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, [0, 0, 0, 0x12]);
        assert_eq!(feth::FethRepr::parse(&feth::FethPacket::new_unchecked(&out[..])).unwrap(), r);
    }

    #[test]
    fn short_buffers_are_truncated_errors() {
        assert!(RethPacket::new_checked(&[0u8; 15][..]).is_err());
        assert!(AtomicEthPacket::new_checked(&[0u8; 27][..]).is_err());
        assert!(DethPacket::new_checked(&[0u8; 7][..]).is_err());
        assert!(ieth::IethPacket::new_checked(&[0u8; 3][..]).is_err());
    }
}
