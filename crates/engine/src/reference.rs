//! Payloads carried by reference: the same-host path's one copy.
//!
//! Between two processes of one host, a request's data need not travel in the packet. A QP
//! the runtime allows to ([`Engine::allow_by_reference`](crate::Engine::allow_by_reference))
//! sends a long SEND, WRITE or READ ([`MIN_LEN`] bytes and up) in packets that each stand
//! for up to [`SEGMENT`] bytes of it and carry, as their payload, where those bytes are in the
//! sender's memory: a list of [`Piece`]s, checked against the sender's local keys like a
//! gather. The receiver's engine checks the packet like any other (sequence, R_Key, bounds,
//! access, the receive buffers) and copies the bytes from the sender's process into the
//! registered memory those checks allowed, by [`Memory::pull`], one copy where the packets
//! of the same message by value take four. Everything else is unchanged: PSNs (a packet by
//! reference takes one), ACKs, retries, ordering, errors and flushes are those of the
//! packets by value, and a message keeps the carriage it started with when it is sent
//! again, so that both sides count its PSNs alike.
//!
//! Which packets are carried so is not in the packet: the runtime knows it from where the
//! packet came (the inbox, with a flag beside the datagram) and tells the engine which
//! process sent it
//! ([`Engine::handle_referenced_datagram`](crate::Engine::handle_referenced_datagram)). A
//! packet by reference never leaves by a socket: on the wire it would be a SEND or WRITE
//! with the wrong payload.

use crate::memory::{Memory, MemoryFault};

/// Messages this long and up go by reference (where the QP may). Below, the four copies of
/// the packets by value cost less than a system call: `process_vm_readv` of 4 KiB moves
/// 3.2–3.5 GB/s on the machine this was measured on, of 64 KiB 10.3–10.5 GB/s, and the
/// same-host path by value about 6.
pub const MIN_LEN: u32 = 16 * 1024;

/// Bytes one packet by reference stands for (its message's FIRST and MIDDLE packets exactly
/// this many). Large enough that a copy's system call is a small part of it (64 KiB chunks
/// are where `process_vm_writev` reaches its speed), small enough that a peer's window,
/// which counts packets, holds what the receiver copies well within an ACK timeout:
/// 512 packets of 1 MiB were half a gigabyte in flight, and 128 QPs writing 1 MiB messages
/// to one peer ran out of retries at perftest's 67 ms; of 64 KiB, 32 MiB.
pub const SEGMENT: u32 = 64 << 10;

/// Bytes a FIRST or MIDDLE packet of a message carries, or stands for: a segment by
/// reference, the path MTU by value. Requester, responder and completer count a message's
/// PSNs by it alike.
pub(crate) fn unit(by_reference: bool, mtu: u32) -> u32 {
    if by_reference { SEGMENT } else { mtu }
}

/// Bytes of one [`Piece`] in a packet's payload.
pub const PIECE_LEN: usize = 16;

/// One piece of a payload carried by reference: `len` bytes at `addr` in the sending
/// process. On the way: `addr` (8 bytes, little-endian), `len` (4), 4 reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Where the bytes are, in the sender's address space.
    pub addr: u64,
    /// How many.
    pub len: u32,
}

impl Piece {
    /// Writes the piece at the start of `out` (at least [`PIECE_LEN`] bytes).
    pub(crate) fn emit(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.addr.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].fill(0);
    }

    fn parse(b: &[u8]) -> Piece {
        Piece {
            addr: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
        }
    }
}

/// Writes the pieces' padding after the `len` bytes of pieces at the start of `out` and
/// returns the payload's length: a FIRST or MIDDLE packet (`last` false) carries a path
/// MTU's worth, so empty pieces pad its list to 256 bytes (512 for more than 16 pieces:
/// 32 SGEs at most); a LAST or ONLY packet carries the list as it is. `None` if `out` is
/// too short.
pub(crate) fn pad(out: &mut [u8], len: usize, last: bool) -> Option<usize> {
    let padded = if last { len } else { len.next_power_of_two().max(256) };
    out.get_mut(len..padded)?.fill(0);
    Some(padded)
}

/// A request's data as the responder places it: in the packet, or by reference.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Payload<'a> {
    Bytes(&'a [u8]),
    Reference {
        /// The sending process (for [`Memory::pull`]).
        origin: u32,
        /// The pieces, as they came ([`PIECE_LEN`] bytes each).
        pieces: &'a [u8],
        /// Their lengths added up.
        len: u32,
    },
}

impl<'a> Payload<'a> {
    /// The payload of a packet by reference from process `origin`: `None` if it is not a
    /// whole number of pieces, or they add up past a segment.
    pub(crate) fn reference(origin: u32, pieces: &'a [u8]) -> Option<Payload<'a>> {
        if pieces.len() % PIECE_LEN != 0 {
            return None;
        }
        let mut len = 0u32;
        for p in pieces.chunks_exact(PIECE_LEN).map(Piece::parse) {
            len = len.checked_add(p.len).filter(|&l| l <= SEGMENT)?;
        }
        Some(Payload::Reference { origin, pieces, len })
    }

    /// Bytes it stands for.
    pub(crate) fn len(&self) -> u32 {
        match self {
            Payload::Bytes(b) => b.len() as u32,
            Payload::Reference { len, .. } => *len,
        }
    }

    /// Whether it came by reference.
    pub(crate) fn by_reference(&self) -> bool {
        matches!(self, Payload::Reference { .. })
    }

    /// Copies its bytes `from .. from + n` to `addr` (which the caller checked).
    pub(crate) fn copy_to<M: Memory + ?Sized>(
        &self,
        mem: &mut M,
        addr: u64,
        from: u32,
        n: u32,
    ) -> Result<(), MemoryFault> {
        match *self {
            Payload::Bytes(b) => mem.write(addr, &b[from as usize..(from + n) as usize]),
            Payload::Reference { origin, pieces, .. } => {
                let (mut skip, mut left, mut at) = (from, n, addr);
                for p in pieces.chunks_exact(PIECE_LEN).map(Piece::parse) {
                    if left == 0 {
                        break;
                    }
                    if skip >= p.len {
                        skip -= p.len;
                        continue;
                    }
                    let take = (p.len - skip).min(left);
                    mem.pull(at, origin, p.addr.wrapping_add(u64::from(skip)), take as usize)?;
                    (skip, left, at) = (0, left - take, at + u64::from(take));
                }
                if left == 0 { Ok(()) } else { Err(MemoryFault { addr: at, len: left as usize }) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::VecMemory;

    /// A process's memory that pulls from one other process's.
    struct Pair<'a> {
        mine: VecMemory,
        theirs: &'a VecMemory,
        origin: u32,
    }

    impl Memory for Pair<'_> {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
            self.mine.read(addr, buf)
        }
        fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
            self.mine.write(addr, data)
        }
        fn pull(&mut self, addr: u64, origin: u32, from: u64, len: usize) -> Result<(), MemoryFault> {
            assert_eq!(origin, self.origin);
            let mut buf = vec![0; len];
            self.theirs.read(from, &mut buf)?;
            self.mine.write(addr, &buf)
        }
    }

    fn pieces(list: &[Piece]) -> Vec<u8> {
        let mut out = vec![0; list.len() * PIECE_LEN];
        for (p, o) in list.iter().zip(out.chunks_exact_mut(PIECE_LEN)) {
            p.emit(o);
        }
        out
    }

    #[test]
    fn a_range_of_the_pieces_lands_where_asked() {
        let mut theirs = VecMemory::new(0x1000, 256);
        for (i, b) in theirs.bytes_mut().iter_mut().enumerate() {
            *b = i as u8;
        }
        let list = pieces(&[Piece { addr: 0x1010, len: 10 }, Piece { addr: 0x1080, len: 20 }]);
        let p = Payload::reference(7, &list).expect("whole pieces");
        assert_eq!(p.len(), 30);
        let mut mem = Pair { mine: VecMemory::new(0x9000, 64), theirs: &theirs, origin: 7 };
        // Bytes 5..25: the last 5 of the first piece, the first 15 of the second.
        p.copy_to(&mut mem, 0x9004, 5, 20).expect("in bounds");
        let want: Vec<u8> = (0x15..0x1a).chain(0x80..0x8f).collect();
        assert_eq!(mem.mine.slice(0x9004, 20), &want[..]);
        assert_eq!(mem.mine.slice(0x9000, 4), &[0; 4]);
        assert_eq!(mem.mine.slice(0x9018, 4), &[0; 4]);
    }

    #[test]
    fn malformed_lists_are_refused() {
        assert!(Payload::reference(1, &[0; 15]).is_none(), "not whole pieces");
        let too_long = pieces(&[Piece { addr: 0, len: SEGMENT }, Piece { addr: 0, len: 1 }]);
        assert!(Payload::reference(1, &too_long).is_none(), "past a segment");
        let wraps = pieces(&[Piece { addr: 0, len: u32::MAX }, Piece { addr: 0, len: 2 }]);
        assert!(Payload::reference(1, &wraps).is_none(), "a sum that overflows");
    }

    #[test]
    fn lists_of_first_and_middle_packets_are_padded_to_a_path_mtu() {
        let mut out = [0xaau8; 600];
        assert_eq!(pad(&mut out, PIECE_LEN, false), Some(256));
        assert!(out[PIECE_LEN..256].iter().all(|&b| b == 0) && out[256] == 0xaa);
        let mut out = [0xaau8; 600];
        assert_eq!(pad(&mut out, 17 * PIECE_LEN, false), Some(512), "17 pieces");
        assert_eq!(pad(&mut out, 3 * PIECE_LEN, true), Some(3 * PIECE_LEN), "a LAST packet's list as it is");
        assert_eq!(pad(&mut [0u8; 100], PIECE_LEN, false), None, "no room");
        // The padding adds nothing: the pieces add up as before.
        let mut list = [0u8; 256];
        Piece { addr: 0x1000, len: 77 }.emit(&mut list);
        let padded = pad(&mut list, PIECE_LEN, false).expect("room");
        assert_eq!(Payload::reference(1, &list[..padded]).map(|p| p.len()), Some(77));
    }

    #[test]
    fn a_memory_that_cannot_pull_faults() {
        let list = pieces(&[Piece { addr: 0x10, len: 8 }]);
        let p = Payload::reference(1, &list).expect("whole pieces");
        let mut mem = VecMemory::new(0, 64);
        assert!(p.copy_to(&mut mem, 0, 0, 8).is_err());
        assert_eq!(mem.slice(0, 8), &[0; 8], "nothing written");
    }
}
