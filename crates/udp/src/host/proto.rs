//! Messages between members and the coordinator, one per `SOCK_SEQPACKET` record, with
//! the members' UDP sockets passed as `SCM_RIGHTS`.
//!
//! **Versions.** Processes of different softrdma builds meet on one port, so the protocol
//! has a number ([`VERSION`]):
//! 1. the first (`ce78613`..`b99f578`): the hello is pid, slot, listeners;
//! 2. (`6d9d9e4`..`b0edaa1`) the hello also says how many of its sockets are the member's
//!    own ([`ToCoord::Hello`], tag 1, which this build still speaks and accepts); the
//!    coordinator gives members sockets to hold ([`ToMember::Keep`], then
//!    [`ToMember::Hold`], [`ToCoord::Held`] and [`ToCoord::Adopt`], added compatibly);
//! 3. a member opens with a versioned hello ([`ToCoord::Join`], tag 7), which a
//!    coordinator answers in that version or refuses ([`ToMember::Refused`], tag 6).
//!
//! What never changes, so that processes of any two versions from 3 on can name each other
//! when they cannot work together: the coordinator's name, that a member's first record is
//! a `Join` whose first fields are [`Envelope`] (the version, then who sends it) and that
//! carries the member's sockets, and the layout of `Refused`. Coordinators of versions 1
//! and 2 cannot decode a `Join` and hang up; a member then says hello in protocol 2's
//! layout.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Most sockets (addresses) one member passes.
pub(crate) const MAX_FDS: usize = 16;
/// Largest record: a hello with this many listeners fits.
pub(crate) const MAX_RECORD: usize = 64 * 1024;

/// The host protocol this build speaks.
pub(crate) const VERSION: u32 = 3;
/// The version before [`VERSION`], whose hello ([`ToCoord::Hello`]) this build still speaks
/// to a coordinator of that version and accepts from its members.
pub(crate) const LEGACY_VERSION: u32 = 2;

/// This build, as a process names it to another.
pub(crate) const BUILD: &str = concat!("softrdma ", env!("CARGO_PKG_VERSION"));

/// The versions a process speaks: [`VERSION`] and [`LEGACY_VERSION`]'s hello, unless a
/// test makes it a process of another version
/// ([`Member::join_as`](super::Member::join_as)): [`LEGACY_VERSION`] alone is a process of
/// that version (no `Join`), any other a process of that version only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Speaks(pub(crate) u32);

impl Speaks {
    /// The version of its [`ToCoord::Join`]; `None` for a process of protocol 2, which
    /// sends none (and, as a coordinator, cannot decode one).
    pub(crate) fn join_version(self) -> Option<u32> {
        (self.0 != LEGACY_VERSION).then_some(self.0)
    }
    /// Whether it speaks protocol 2's [`ToCoord::Hello`].
    pub(crate) fn legacy(self) -> bool {
        self.0 == VERSION || self.0 == LEGACY_VERSION
    }
    pub(crate) fn oldest(self) -> u32 {
        if self.legacy() { LEGACY_VERSION } else { self.0 }
    }
    pub(crate) fn newest(self) -> u32 {
        self.0
    }
}

/// Who sends a [`ToCoord::Join`] or a [`ToMember::Refused`]; the same layout in every
/// version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub(crate) version: u32,
    pub(crate) pid: u32,
    /// The softrdma build (`softrdma 0.1.0`).
    pub(crate) build: String,
    /// The program's path.
    pub(crate) program: String,
}

impl Envelope {
    /// This process, speaking `version`.
    pub(crate) fn me(version: u32) -> Self {
        let program = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
        Self {
            version,
            pid: std::process::id(),
            build: concat!("softrdma ", env!("CARGO_PKG_VERSION")).into(),
            program,
        }
    }

    fn encode(&self, b: &mut Vec<u8>) {
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        put_str(b, &self.build);
        put_str(b, &self.program);
    }

    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        Some(Self { version: r.u32()?, pid: r.u32()?, build: r.str()?, program: r.str()? })
    }
}

/// A string: its length (u16, at most [`MAX_STR`]) and UTF-8 bytes.
fn put_str(b: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(MAX_STR);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    b.extend_from_slice(&(end as u16).to_le_bytes());
    b.extend_from_slice(&s.as_bytes()[..end]);
}

/// An address: family (4 or 6), 16 bytes of address (an IPv4 one in the first 4), port,
/// scope.
fn put_addr(b: &mut Vec<u8>, a: &SocketAddr) {
    let (family, ip, scope) = match a {
        SocketAddr::V4(v4) => {
            let mut ip = [0u8; 16];
            ip[..4].copy_from_slice(&v4.ip().octets());
            (4u8, ip, 0)
        }
        SocketAddr::V6(v6) => (6u8, v6.ip().octets(), v6.scope_id()),
    };
    b.push(family);
    b.extend_from_slice(&ip);
    b.extend_from_slice(&a.port().to_le_bytes());
    b.extend_from_slice(&scope.to_le_bytes());
}

/// Longest string in an [`Envelope`].
const MAX_STR: usize = 1024;

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
    /// The hello of protocol 1 (tag 1 too): it says neither its version nor how many of its
    /// sockets are its own. Decoded only to refuse it.
    HelloV1 { pid: u32 },
    /// The first record of a member of protocol 3 or later: who it is and which version it
    /// speaks, then that version's hello (`body`), with the sockets as in a [`Hello`](Self::Hello).
    /// Version 3's body is a `Hello`'s fields after the pid ([`join`](Self::join)).
    Join { envelope: Envelope, body: Vec<u8> },
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
    /// The first record of a process of another user than the coordinator's (a *guest*,
    /// which cannot bind sockets into the group: the kernel groups one user's sockets):
    /// make me sockets on these addresses (the port is the group's), for `slot` if it is
    /// free (a guest that had it in a group that was founded again), any slot for 0. Answered by
    /// [`ToMember::Sockets`]; the guest then registers with a `Join` carrying them.
    /// (Added to protocol 3: a coordinator of a build without guests refuses it as a
    /// record of another version.)
    Guest { envelope: Envelope, slot: u32, addresses: Vec<SocketAddr> },
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
    /// The answer to a [`ToCoord::Join`] of a version the coordinator does not speak: the
    /// oldest and newest versions it speaks, and who it is (`envelope.version` is the newest).
    /// The same layout in every version.
    Refused { oldest: u32, envelope: Envelope },
    /// The answer to a [`ToCoord::Guest`]: its slot and, as `SCM_RIGHTS`, one socket per
    /// address asked, bound into the group, whose locked filter keeps only that slot's
    /// datagrams; or `errno` (slot 0, no sockets).
    Sockets { slot: u32, errno: i32 },
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
    fn addr(&mut self) -> Option<SocketAddr> {
        let [family] = self.take::<1>()?;
        let ip: [u8; 16] = self.take()?;
        let port = u16::from_le_bytes(self.take()?);
        let scope = self.u32()?;
        match family {
            4 => Some(SocketAddr::new(IpAddr::from(<[u8; 4]>::try_from(&ip[..4]).ok()?), port)),
            6 => Some(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, scope))),
            _ => None,
        }
    }
    fn str(&mut self) -> Option<String> {
        let len = usize::from(u16::from_le_bytes(self.take()?));
        let (head, rest) = self.0.split_at_checked(len)?;
        self.0 = rest;
        Some(String::from_utf8_lossy(head).into_owned())
    }
}

impl ToCoord {
    /// A member's [`Join`](Self::Join) in `envelope.version`, with version 3's body.
    pub(crate) fn join(envelope: Envelope, slot: u32, sockets: u32, listeners: &[u64]) -> Self {
        let mut body = Vec::with_capacity(8 + 8 * listeners.len());
        body.extend_from_slice(&slot.to_le_bytes());
        body.extend_from_slice(&sockets.to_le_bytes());
        for l in listeners {
            body.extend_from_slice(&l.to_le_bytes());
        }
        Self::Join { envelope, body }
    }

    /// The [`Hello`](Self::Hello) of a `Join` with version 3's body.
    pub(crate) fn hello_of(pid: u32, body: &[u8]) -> Option<Self> {
        let mut r = Reader(body);
        let (slot, sockets) = (r.u32()?, r.u32()?);
        let mut listeners = Vec::new();
        while !r.0.is_empty() {
            listeners.push(r.u64()?);
        }
        Some(Self::Hello { pid, slot, sockets, listeners })
    }

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
            Self::HelloV1 { pid } => {
                b.push(1);
                b.extend_from_slice(&pid.to_le_bytes());
                b.extend_from_slice(&0u32.to_le_bytes());
            }
            Self::Adopt => b.push(5),
            Self::Held { generation } => {
                b.push(6);
                b.extend_from_slice(&generation.to_le_bytes());
            }
            Self::Join { envelope, body } => {
                b.push(7);
                envelope.encode(&mut b);
                b.extend_from_slice(body);
            }
            Self::Guest { envelope, slot, addresses } => {
                b.push(8);
                envelope.encode(&mut b);
                b.extend_from_slice(&slot.to_le_bytes());
                for a in addresses {
                    put_addr(&mut b, a);
                }
            }
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let (&tag, rest) = b.split_first()?;
        let mut r = Reader(rest);
        let m = match tag {
            // Protocol 1's hello: pid, slot and whole listeners; protocol 2's has 4 bytes more.
            1 if rest.len() % 8 == 0 => Self::HelloV1 { pid: r.u32()? },
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
            7 => {
                let envelope = Envelope::decode(&mut r)?;
                Self::Join { envelope, body: std::mem::take(&mut r.0).to_vec() }
            }
            8 => {
                let envelope = Envelope::decode(&mut r)?;
                let slot = r.u32()?;
                let mut addresses = Vec::new();
                while !r.0.is_empty() && addresses.len() < MAX_FDS {
                    addresses.push(r.addr()?);
                }
                Self::Guest { envelope, slot, addresses }
            }
            _ => return None,
        };
        if let Self::HelloV1 { .. } = m {
            // The rest (slot, listeners) does not matter: it is refused.
            return Some(m);
        }
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
            Self::Refused { oldest, envelope } => {
                b.push(6);
                b.extend_from_slice(&oldest.to_le_bytes());
                envelope.encode(&mut b);
            }
            Self::Sockets { slot, errno } => {
                b.push(7);
                b.extend_from_slice(&slot.to_le_bytes());
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
            6 => Self::Refused { oldest: r.u32()?, envelope: Envelope::decode(&mut r)? },
            7 => Self::Sockets { slot: r.u32()?, errno: r.i32()? },
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
            ToCoord::HelloV1 { pid: 7 },
            ToCoord::join(Envelope::me(VERSION), 3, 2, &[1, u64::MAX]),
            ToCoord::Join { envelope: Envelope::me(99), body: vec![] },
            ToCoord::Guest { envelope: Envelope::me(VERSION), slot: 0, addresses: vec![] },
            ToCoord::Guest {
                envelope: Envelope::me(VERSION),
                slot: 2047,
                addresses: vec![
                    "127.0.0.1:4791".parse().unwrap(),
                    "[::1]:4791".parse().unwrap(),
                    SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 4791, 0, 7)),
                ],
            },
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
            ToMember::Refused { oldest: 2, envelope: Envelope::me(3) },
            ToMember::Sockets { slot: 12, errno: 0 },
            ToMember::Sockets { slot: 0, errno: libc::EADDRINUSE },
        ] {
            assert_eq!(ToMember::decode(&m.encode()), Some(m));
        }
        assert_eq!(ToCoord::decode(&[2, 0]), None);
        assert_eq!(ToMember::decode(&[]), None);
    }

    fn envelope() -> Envelope {
        Envelope { version: 3, pid: 0x1234, build: "b".into(), program: "/p".into() }
    }

    /// The layouts every version keeps: a `Join` opens with its version and sender; a
    /// `Refused` with the versions and the coordinator.
    #[test]
    fn stable_layouts() {
        let join = ToCoord::join(envelope(), 5, 1, &[]).encode();
        assert_eq!(
            join,
            [&[7, 3, 0, 0, 0, 0x34, 0x12, 0, 0, 1, 0, b'b', 2, 0, b'/', b'p'][..], &[5, 0, 0, 0, 1, 0, 0, 0]].concat()
        );
        assert_eq!(
            ToCoord::hello_of(0x1234, &join[16..]),
            Some(ToCoord::Hello { pid: 0x1234, slot: 5, sockets: 1, listeners: vec![] })
        );
        let refused = ToMember::Refused { oldest: 2, envelope: envelope() }.encode();
        assert_eq!(refused, [6, 2, 0, 0, 0, 3, 0, 0, 0, 0x34, 0x12, 0, 0, 1, 0, b'b', 2, 0, b'/', b'p']);
    }

    /// Protocol 1's hello (pid, slot, listeners) and protocol 2's (pid, slot, sockets,
    /// listeners) share tag 1; their lengths tell them apart.
    #[test]
    fn hellos_of_protocols_1_and_2() {
        let mut v1 = vec![1u8];
        for x in [7u32, 0] {
            v1.extend_from_slice(&x.to_le_bytes());
        }
        assert_eq!(ToCoord::decode(&v1), Some(ToCoord::HelloV1 { pid: 7 }));
        v1.extend_from_slice(&0x0106_0000_0000_1c06u64.to_le_bytes());
        assert_eq!(ToCoord::decode(&v1), Some(ToCoord::HelloV1 { pid: 7 }));
        let v2 = ToCoord::Hello { pid: 7, slot: 0, sockets: 1, listeners: vec![5] };
        assert_eq!(ToCoord::decode(&v2.encode()), Some(v2));
    }

    #[test]
    fn long_strings_are_cut_at_a_character() {
        let long = "é".repeat(MAX_STR);
        let e = Envelope { program: long.clone(), ..envelope() };
        let Some(ToCoord::Join { envelope, .. }) =
            ToCoord::decode(&ToCoord::Join { envelope: e, body: vec![] }.encode())
        else {
            panic!("decodes")
        };
        assert_eq!(envelope.program, long[..MAX_STR]);
    }
}
