//! Founding a group again: when every process of the group's user has ended while guests
//! (processes of other users) still hold sockets it made for them, the group lives on,
//! steered by its last program, but nobody can coordinate it (only its user can make its
//! sockets, and a guest's are locked), so no process of another user can join. The guests
//! then agree, close their sockets together, and found a new group: the first to bind the
//! port owns it, the others join it (as members, or as its user's guests), each keeping
//! its slot, so its QPNs and comm IDs stay valid. Their sockets keep their descriptor
//! numbers ([`RoceSocket::replace_with`]): the progress loops never notice.
//!
//! One guest leads (the first to bind `softrdma.refound.<user>.<device>.<port>`); the
//! others report to it their slot and their sockets (by inode). It goes on only if every
//! socket on the port (`/proc/net/udp`) is one reported: a guest that does not answer
//! (stopped, or of a build without this) would keep the port, and the others would be left
//! with none; then it calls it off and the guests try again later.

use std::collections::BTreeSet;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use super::{Ino, Shared, coordinator_name, guest_fds, port_owner, port_sockets, random_u64};
use crate::RoceSocket;
use crate::fork::ParentOnly;

/// How long the leader waits for the other guests' reports: they all saw the coordinator
/// go at the same moment, and each tries within milliseconds of the others.
const REPORT_WINDOW: Duration = Duration::from_millis(60);
/// How long each later step waits (a follower's close, the port to free, a new group).
const STEP: Duration = Duration::from_secs(2);

/// The messages between the leader and the other guests.
#[derive(Debug, PartialEq, Eq)]
enum Msg {
    /// Follower → leader: its slot and its sockets.
    Report { slot: u32, inos: Vec<Ino> },
    /// Leader → followers: close your sockets now.
    Close,
    /// Follower → leader: closed.
    Closed,
    /// Leader → followers: the new group is there; join it.
    Rejoin,
    /// Leader → followers: called off (sockets on the port nobody reported).
    Abort,
}

impl Msg {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Msg::Report { slot, inos } => {
                b.push(1);
                b.extend_from_slice(&slot.to_le_bytes());
                for (dev, ino) in inos {
                    b.extend_from_slice(&dev.to_le_bytes());
                    b.extend_from_slice(&ino.to_le_bytes());
                }
            }
            Msg::Close => b.push(2),
            Msg::Closed => b.push(3),
            Msg::Rejoin => b.push(4),
            Msg::Abort => b.push(5),
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Msg> {
        let (&tag, rest) = b.split_first()?;
        Some(match tag {
            1 if rest.len() >= 4 && (rest.len() - 4) % 16 == 0 => {
                let slot = u32::from_le_bytes(rest[..4].try_into().ok()?);
                let inos = rest[4..]
                    .chunks(16)
                    .map(|c| {
                        let dev = u64::from_le_bytes(c[..8].try_into().expect("16 bytes"));
                        (dev, u64::from_le_bytes(c[8..].try_into().expect("16 bytes")))
                    })
                    .collect();
                Msg::Report { slot, inos }
            }
            2 if rest.is_empty() => Msg::Close,
            3 if rest.is_empty() => Msg::Closed,
            4 if rest.is_empty() => Msg::Rejoin,
            5 if rest.is_empty() => Msg::Abort,
            _ => return None,
        })
    }
}

fn send(conn: &impl AsFd, m: &Msg) -> io::Result<()> {
    super::proto::send(conn, &m.encode(), &[])
}

/// The next message on `conn` within `limit`; `None` when it hangs up or says nothing.
fn recv(conn: &impl AsFd, limit: Duration) -> Option<Msg> {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        match super::proto::recv(conn, &mut buf) {
            Ok(Some((len, _))) => return Msg::decode(&buf[..len]),
            Ok(None) => return None,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !crate::sys::poll(conn.as_fd(), libc::POLLIN, Some(left)).unwrap_or(false) {
                    return None;
                }
            }
            Err(_) => return None,
        }
    }
}

fn socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?)
}

/// The inodes of the sockets on `port` and one of `addresses` (`/proc/net/udp` has no
/// device: only inodes are compared).
fn port_inodes(addresses: &[IpAddr], port: u16) -> BTreeSet<u64> {
    port_sockets(addresses, port).into_iter().map(|s| s.inode).collect()
}

/// Founds the group again with the other guests (module documentation). On success this
/// member's sockets are in the new group, in their old places (descriptor numbers), and
/// it is a member of its own user's group or a guest of the new one's user, with its slot;
/// it registers as after a failover. Returns the slots of the guests that took part when
/// this member led (its new group's coordinator keeps them for them), none otherwise. On
/// failure nothing changed, or (a step failing after the sockets closed) it keeps trying
/// to bind them anew for a while.
pub(super) fn refound(shared: &Shared) -> io::Result<Vec<u32>> {
    let owner = shared.guest_of().ok_or_else(|| io::Error::other("not a guest"))?;
    let name = format!("softrdma.refound.{owner}.{}.{}", shared.device, shared.port).into_bytes();
    let listener = socket()?;
    match rustix::net::bind(&listener, &SocketAddrUnix::new_abstract_name(&name)?) {
        Ok(()) => {
            rustix::net::listen(&listener, 1024)?;
            lead(shared, &ParentOnly::new(listener))
        }
        Err(rustix::io::Errno::ADDRINUSE) => follow(shared, &name).map(|()| Vec::new()),
        Err(e) => Err(e.into()),
    }
}

fn lead(shared: &Shared, listener: &ParentOnly) -> io::Result<Vec<u32>> {
    let deadline = Instant::now() + REPORT_WINDOW;
    let mut followers: Vec<ParentOnly> = Vec::new();
    let mut slots = vec![shared.slot.load(std::sync::atomic::Ordering::Relaxed)];
    let mut known: BTreeSet<u64> = shared.inodes().into_iter().map(|(_, i)| i).collect();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        if crate::sys::poll(listener.as_fd(), libc::POLLIN, Some(left)).unwrap_or(false) {
            while let Ok(c) = rustix::net::accept_with(listener, SocketFlags::CLOEXEC | SocketFlags::NONBLOCK) {
                let c = ParentOnly::new(c);
                if let Some(Msg::Report { slot, inos }) = recv(&c, REPORT_WINDOW) {
                    known.extend(inos.into_iter().map(|(_, i)| i));
                    slots.push(slot);
                    followers.push(c);
                }
            }
        }
    }
    let on_port = port_inodes(&shared.addresses, shared.port);
    tracing::debug!(target: "softrdma::host", "founding again: on the port {on_port:?}, reported {known:?}");
    let unknown: Vec<&u64> = on_port.difference(&known).collect();
    if !unknown.is_empty() {
        for f in &followers {
            let _ = send(f, &Msg::Abort);
        }
        return Err(io::Error::other(format!(
            "{} sockets on the port belong to no guest that answered (a stopped process, or one of a build \
             without this): the group stays as it is",
            unknown.len()
        )));
    }
    tracing::info!(
        target: "softrdma::host",
        "founding {} again with {} other guests: no process of user {} is left",
        shared.port_name(),
        followers.len(),
        shared.guest_of().unwrap_or(0),
    );
    for f in &followers {
        let _ = send(f, &Msg::Close);
    }
    for f in &followers {
        let _ = recv(f, STEP);
    }
    vacate(shared)?;
    let free_by = Instant::now() + STEP;
    while !port_inodes(&shared.addresses, shared.port).is_empty() && Instant::now() < free_by {
        std::thread::sleep(Duration::from_millis(2));
    }
    let left = port_inodes(&shared.addresses, shared.port);
    if !left.is_empty() {
        tracing::debug!(target: "softrdma::host", "founding again: sockets still on the port after every guest closed its own: {left:?}");
    }
    let result = rejoin(shared);
    for f in &followers {
        let _ = send(f, &Msg::Rejoin);
    }
    result.map(|()| slots)
}

fn follow(shared: &Shared, name: &[u8]) -> io::Result<()> {
    let conn = socket()?;
    let deadline = Instant::now() + REPORT_WINDOW / 3;
    loop {
        match rustix::net::connect(&conn, &SocketAddrUnix::new_abstract_name(name)?) {
            Ok(()) => break,
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    let conn = ParentOnly::new(conn);
    let slot = shared.slot.load(std::sync::atomic::Ordering::Relaxed);
    send(&conn, &Msg::Report { slot, inos: shared.inodes() })?;
    match recv(&conn, REPORT_WINDOW + STEP) {
        Some(Msg::Close) => {}
        Some(Msg::Abort) => return Err(io::Error::other("the leading guest called it off")),
        other => return Err(io::Error::other(format!("the leading guest said {other:?}"))),
    }
    vacate(shared)?;
    let _ = send(&conn, &Msg::Closed);
    // The leader's group first (it says so), so that the slot is asked of it.
    let _ = recv(&conn, STEP);
    rejoin(shared)
}

/// Closes this member's sockets (their descriptors stay, unbound).
fn vacate(shared: &Shared) -> io::Result<()> {
    let result = shared.sockets.iter().try_for_each(RoceSocket::vacate);
    shared.sockets_replaced();
    result
}

/// Puts this member's sockets into the port's new group: bound by itself (its user's
/// group, new or joined), or made by the new group's coordinator (another user's), for its
/// slot; then it registers as after a failover.
fn rejoin(shared: &Shared) -> io::Result<()> {
    let uid = rustix::process::getuid().as_raw();
    let slot = shared.slot.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = Instant::now() + STEP;
    loop {
        let bound: io::Result<Vec<RoceSocket>> =
            shared.addresses.iter().map(|&a| RoceSocket::bind_with(a, &shared.socket_config)).collect();
        match bound {
            Ok(new) => {
                for (s, n) in shared.sockets.iter().zip(&new) {
                    s.replace_with(n)?;
                }
                shared.sockets_replaced();
                shared.set_owner(None);
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                if let Some(owner) = port_owner(&shared.addresses, shared.port).filter(|&o| o != uid) {
                    let name = coordinator_name(owner, &shared.device, shared.port);
                    let got =
                        guest_fds(&name, owner, &shared.addresses, slot, &shared.socket_config, &shared.port_name());
                    if let Ok((conn, new_slot, fds)) = got {
                        if new_slot != slot {
                            tracing::warn!(target: "softrdma::host", "slot {slot} taken in the new group: now {new_slot}");
                        }
                        for (s, fd) in shared.sockets.iter().zip(fds) {
                            s.replace_with(&RoceSocket::adopt(fd, &shared.socket_config)?)?;
                        }
                        shared.sockets_replaced();
                        shared.slot.store(new_slot, std::sync::atomic::Ordering::Relaxed);
                        shared.set_owner(Some(owner));
                        *shared.bootstrap.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
                        return Ok(());
                    }
                }
            }
            Err(e) => return Err(e),
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the port did not take this member's sockets again"));
        }
        std::thread::sleep(Duration::from_millis(2 + random_u64() % 8));
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::os::unix::net::UnixDatagram;

    use super::super::{HostConfig, Member};
    use super::*;

    /// A thread that polls a member's sockets and the runtime's doorbell, asleep since
    /// before they were put in new ones' places, returns: the member rings the doorbell.
    /// Woken through the old socket, `poll` looks at the new one, finds nothing, and sleeps
    /// on; a datagram to the new socket does not wake it (it waits only on what it first
    /// found), so a progress thread of an idle device never watched its new sockets.
    #[test]
    fn a_thread_asleep_on_replaced_sockets_is_woken_through_the_runtimes_doorbell() {
        let config = HostConfig {
            device: format!("refound{}", random_u64() % 1_000_000),
            port: 20_000 + (random_u64() % 12_000) as u16,
            ..HostConfig::default()
        };
        let member = std::sync::Arc::new(Member::join(&[IpAddr::V4(Ipv4Addr::LOCALHOST)], &config).unwrap());
        let (bell_tx, bell_rx) = UnixDatagram::pair().unwrap();
        member.on_sockets_replaced(move || {
            let _ = bell_tx.send(&[1]);
        });
        // The placeholder's probe taken (as the progress loop takes it) and the bell
        // emptied: nothing is readable when the thread starts to sleep.
        vacate(&member.shared).unwrap();
        let mut buf = [0u8; 64];
        while rustix::net::recv(&member.sockets()[0], &mut buf, rustix::net::RecvFlags::DONTWAIT).is_ok() {}
        bell_rx.set_nonblocking(true).unwrap();
        while bell_rx.recv(&mut buf).is_ok() {}
        // The descriptor itself, as a progress loop polls it (a copy would keep naming the
        // socket that was there).
        let polled = member.clone();
        let poller = std::thread::spawn(move || {
            use rustix::event::{PollFd, PollFlags, poll};
            let mut fds = [PollFd::new(&polled.sockets()[0], PollFlags::IN), PollFd::new(&bell_rx, PollFlags::IN)];
            poll(&mut fds, None).unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        rejoin(&member.shared).unwrap();
        let start = Instant::now();
        while !poller.is_finished() {
            assert!(start.elapsed() < Duration::from_secs(2), "the thread sleeps on the replaced sockets");
            std::thread::sleep(Duration::from_millis(1));
        }
        poller.join().unwrap();
    }

    #[test]
    fn messages_round_trip() {
        for m in [
            Msg::Report { slot: 7, inos: vec![(1, 2), (u64::MAX, 0)] },
            Msg::Report { slot: 0, inos: vec![] },
            Msg::Close,
            Msg::Closed,
            Msg::Rejoin,
            Msg::Abort,
        ] {
            assert_eq!(Msg::decode(&m.encode()), Some(m));
        }
        assert_eq!(Msg::decode(&[1, 0, 0, 0]), None);
        assert_eq!(Msg::decode(&[9]), None);
    }
}
