//! Messages between members and the coordinator, one per `SOCK_SEQPACKET` record, with
//! the members' UDP sockets passed as `SCM_RIGHTS`.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Most sockets (addresses) one member passes.
pub(crate) const MAX_FDS: usize = 16;
/// Largest record: a hello with this many listeners fits.
pub(crate) const MAX_RECORD: usize = 64 * 1024;

/// Member → coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToCoord {
    /// Register: the sockets come along as `SCM_RIGHTS`, the member's own `sockets`
    /// first, then sockets a previous coordinator gave it to hold ([`ToMember::Hold`]),
    /// which the new coordinator holds as tombstones unless it holds them already (more
    /// follow in [`Adopt`](Self::Adopt) records); `slot` 0 asks for a new slot, another
    /// value re-claims it (after a failover); `listeners` are re-registered. (The layout
    /// predates holders: members and coordinators of that version still register with
    /// each other.)
    Hello { pid: u32, slot: u32, sockets: u32, listeners: Vec<u64> },
    /// After a hello, when what the member holds did not fit in it: more sockets to adopt.
    /// The member keeps holding them until told otherwise.
    Adopt,
    /// The set of that [`ToMember::Hold`] generation is complete, and what the member
    /// held before it is closed.
    Held { generation: u64 },
    /// Steer REQ/SIDR_REQ for `service` to me. Answered by `Reply { id }`.
    Listen { id: u64, service: u64 },
    /// Stop that.
    Unlisten { id: u64, service: u64 },
    /// I received the probe for `index` with `nonce`.
    ProbeAnswer { index: u32, nonce: u64 },
}

/// Coordinator → member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToMember {
    /// Registered with `slot`; or refused (`slot` 0) with `errno`.
    Welcome { slot: u32, errno: i32 },
    /// The member's slot (and its listeners) are steered to its sockets.
    Steered,
    /// Result of request `id`: 0 or an errno.
    Reply { id: u64, errno: i32 },
    /// Part of the set of sockets to hold (as `SCM_RIGHTS`) of one generation: the
    /// records of one generation add up; the one with `done` completes the set, which
    /// then replaces the set held before (answered by [`ToCoord::Held`]). Holders keep
    /// sockets in their groups, in place, if the coordinator's process dies; they hand
    /// them to the next coordinator ([`ToCoord::Adopt`]).
    Hold { generation: u64, done: bool },
    /// What a coordinator of the version before holders sends instead: hold these
    /// sockets (they replace the ones held before); not answered.
    Keep,
}

struct Reader<'a>(&'a [u8]);
impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_at_checked(N)?;
        self.0 = rest;
        head.try_into().ok()
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn i32(&mut self) -> Option<i32> {
        self.take().map(i32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
}

impl ToCoord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(24);
        match self {
            Self::Hello { pid, slot, sockets, listeners } => {
                b.push(1);
                b.extend_from_slice(&pid.to_le_bytes());
                b.extend_from_slice(&slot.to_le_bytes());
                b.extend_from_slice(&sockets.to_le_bytes());
                for l in listeners {
                    b.extend_from_slice(&l.to_le_bytes());
                }
            }
            Self::Listen { id, service } | Self::Unlisten { id, service } => {
                b.push(if matches!(self, Self::Listen { .. }) { 2 } else { 3 });
                b.extend_from_slice(&id.to_le_bytes());
                b.extend_from_slice(&service.to_le_bytes());
            }
            Self::ProbeAnswer { index, nonce } => {
                b.push(4);
                b.extend_from_slice(&index.to_le_bytes());
                b.extend_from_slice(&nonce.to_le_bytes());
            }
            Self::Adopt => b.push(5),
            Self::Held { generation } => {
                b.push(6);
                b.extend_from_slice(&generation.to_le_bytes());
            }
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let (&tag, rest) = b.split_first()?;
        let mut r = Reader(rest);
        let m = match tag {
            1 => {
                let (pid, slot, sockets) = (r.u32()?, r.u32()?, r.u32()?);
                let mut listeners = Vec::new();
                while !r.0.is_empty() {
                    listeners.push(r.u64()?);
                }
                Self::Hello { pid, slot, sockets, listeners }
            }
            2 => Self::Listen { id: r.u64()?, service: r.u64()? },
            3 => Self::Unlisten { id: r.u64()?, service: r.u64()? },
            4 => Self::ProbeAnswer { index: r.u32()?, nonce: r.u64()? },
            5 => Self::Adopt,
            6 => Self::Held { generation: r.u64()? },
            _ => return None,
        };
        r.0.is_empty().then_some(m)
    }
}

impl ToMember {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16);
        match self {
            Self::Welcome { slot, errno } => {
                b.push(1);
                b.extend_from_slice(&slot.to_le_bytes());
                b.extend_from_slice(&errno.to_le_bytes());
            }
            Self::Steered => b.push(2),
            Self::Keep => b.push(4),
            Self::Hold { generation, done } => {
                b.push(5);
                b.extend_from_slice(&generation.to_le_bytes());
                b.push(u8::from(*done));
            }
            Self::Reply { id, errno } => {
                b.push(3);
                b.extend_from_slice(&id.to_le_bytes());
                b.extend_from_slice(&errno.to_le_bytes());
            }
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let (&tag, rest) = b.split_first()?;
        let mut r = Reader(rest);
        let m = match tag {
            1 => Self::Welcome { slot: r.u32()?, errno: r.i32()? },
            2 => Self::Steered,
            4 => Self::Keep,
            5 => {
                let generation = r.u64()?;
                let [done] = r.take::<1>()?;
                Self::Hold { generation, done: done != 0 }
            }
            3 => Self::Reply { id: r.u64()?, errno: r.i32()? },
            _ => return None,
        };
        r.0.is_empty().then_some(m)
    }
}

/// Sends one record, with `fds` as `SCM_RIGHTS`, without blocking.
pub(crate) fn send(conn: impl AsFd, bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many sockets"));
    }
    let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
    let n = rustix::net::sendmsg(conn, &[IoSlice::new(bytes)], &mut control, flags)?;
    if n == bytes.len() { Ok(()) } else { Err(io::Error::new(io::ErrorKind::WriteZero, "short record")) }
}

/// Receives one record into `buf` without blocking: its length and the descriptors that
/// came with it. `Ok(None)`: the peer hung up. `WouldBlock`: nothing queued.
pub(crate) fn recv(conn: impl AsFd, buf: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        conn,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((msg.bytes, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for m in [
            ToCoord::Hello { pid: 7, slot: 0, sockets: 1, listeners: vec![] },
            ToCoord::Hello { pid: 7, slot: 3, sockets: 2, listeners: vec![1, u64::MAX] },
            ToCoord::Adopt,
            ToCoord::Held { generation: 9 },
            ToCoord::Listen { id: 1, service: 0x0106_0000_0000_1c06 },
            ToCoord::Unlisten { id: 2, service: 5 },
            ToCoord::ProbeAnswer { index: 4, nonce: 0xdead_beef_0000_0001 },
        ] {
            assert_eq!(ToCoord::decode(&m.encode()), Some(m));
        }
        for m in [
            ToMember::Welcome { slot: 9, errno: 0 },
            ToMember::Steered,
            ToMember::Hold { generation: 2, done: false },
            ToMember::Hold { generation: u64::MAX, done: true },
            ToMember::Keep,
            ToMember::Reply { id: 3, errno: libc::EADDRINUSE },
        ] {
            assert_eq!(ToMember::decode(&m.encode()), Some(m));
        }
        assert_eq!(ToCoord::decode(&[2, 0]), None);
        assert_eq!(ToMember::decode(&[]), None);
    }
}
