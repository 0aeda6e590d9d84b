//! Socket I/O for softrdma: RoCEv2 datagrams over a plain UDP socket.
//!
//! A [`RoceSocket`] is an unconnected, non-blocking UDP socket bound to one address and (by
//! default) port 4791, set up so that what the kernel puts on the wire is what the ICRC was
//! computed for, and so that a receiver learns every field the ICRC covers:
//!
//! - **IPv4 identification 0, DF set.** `IP_MTU_DISCOVER = IP_PMTUDISC_DO` on an
//!   *unconnected* socket makes Linux send DF=1 and ID 0 (`ip_select_ident_segs`; a
//!   connected socket would use a per-socket counter instead). That is the envelope
//!   [`softrdma_wire::Envelope::rocev2`] builds and the engine's `Transmit` carries, and
//!   [`RoceSocket::send`] refuses an envelope that asks for anything else. IPv6 gets
//!   `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO` (never fragment). Datagrams larger than the
//!   path MTU fail with `EMSGSIZE` instead of being fragmented.
//! - **Receive metadata.** `IP_PKTINFO`/`IPV6_RECVPKTINFO` (the destination address, which
//!   the ICRC covers, and the interface), `IP_RECVTTL`/`IPV6_RECVHOPLIMIT`,
//!   `IP_RECVTOS`/`IPV6_RECVTCLASS` and `IPV6_FLOWINFO` (for the GRH a UD receive buffer
//!   starts with). Linux's automatic IPv6 flow labels (`net.ipv6.auto_flowlabels`) stay on:
//!   our IPv6 datagrams carry a hashed label where rxe writes 0; the ICRC masks it. [`Received::envelope`] rebuilds the [`Envelope`] the ICRC needs and
//!   [`Received::ip`] the variant fields as an [`IpInfo`].
//! - **Link-local IPv6.** An `fe80::/10` address means something only on one interface, so
//!   a socket on one is bound with the interface's index as `sin6_scope_id`
//!   ([`Config::scope_id`]), every datagram to a link-local address leaves in that scope,
//!   and a receive reports link-local addresses with the scope they arrived in. The ICRC
//!   covers only the 16 address bytes, which are the same either way.
//! - **rxe's zero UDP checksums.** Kernel rxe sends UDP checksum 0, also over IPv6, where
//!   Linux drops such datagrams unless the socket sets `UDP_NO_CHECK6_RX`, which IPv6
//!   sockets here always do.
//! - **Batching.** [`RoceSocket::send_batch`] is one `sendmmsg` per [`MAX_BATCH`]
//!   datagrams, each with its own destination and, optionally, its own traffic class and
//!   GSO segment size; [`RoceSocket::recv`] is one `recvmmsg` filling a [`RecvBatch`].
//!   `UDP_GRO` can be turned on ([`Config::gro`]); the receive iterator splits coalesced
//!   datagrams again.
//! - **Waiting.** The socket is non-blocking. Its descriptor ([`AsFd`]) goes into the
//!   driver's poll/epoll set; [`RoceSocket::wait_readable`] and
//!   [`RoceSocket::recv_timeout`] block on it for simple users and tests.
//!
//! The layer parses nothing: any datagram arrives as bytes, and the ICRC check is the
//! caller's, with [`softrdma_wire::RoceRepr::parse`].
//!
//! - **Many processes, one host.** [`host::Member`] joins a device's reuseport group with
//!   a classic-BPF program that steers each datagram to the process owning its QPN or CM
//!   connection (docs/architecture.md, "Many processes, one host"); [`local`] carries
//!   datagrams between those processes through shared memory instead of the kernel.
//!
//! # What the receiver cannot see: the IPv4 identification
//!
//! The ICRC covers the IPv4 ID, and a UDP socket does not report it. [`Received::envelope`]
//! **assumes ID 0 and DF**, which is what every softrdma sender puts on the wire (tests in
//! `tests/loopback.rs` prove it on loopback, by ICRC and by capture), and
//! [`Received::envelope_with_id`] takes another guess. Kernel rxe and NICs send other
//! identifications (rxe: `__ip_select_ident`); the engine recovers them from the ICRC and
//! its memory of each peer (`softrdma_engine::identification`: exact, predicted or solved,
//! each counted). IPv6 has no ID, and every IPv6 field the ICRC covers is known to the
//! receiver, so IPv6 ICRCs verify in full.
//!
//! # GSO: segment *i* carries IPv4 ID *i*
//!
//! [`Outgoing::segment_size`] asks the kernel to cut one buffer into equal datagrams
//! (`UDP_SEGMENT`): one syscall and one trip through the stack for up to
//! [`MAX_GSO_SEGMENTS`] packets to one destination. With `IP_PMTUDISC_DO`, segment *i* of
//! one send gets **IPv4 ID *i*** (0, 1, 2, …), not 0, so the sender must compute segment
//! *i*'s ICRC with `identification = i`. Any receiver that sees the IP header (kernel rxe,
//! a NIC) verifies it as it is; a softrdma receiver recovers the identification (segment
//! *i* follows segment *i − 1*: predicted). On loopback with [`Config::gro`] on, a GSO send
//! arrives whole and [`Received::segment_index`] equals the ID; that is a property of
//! loopback, not a promise: GRO on a real NIC coalesces whatever arrives together.
//! `send_batch` never uses GSO unless asked.
//!
//! # Why not `quinn-udp`, `nix` or `rustix`
//!
//! The unsafe code this crate needs is in one private module (`sys`): `setsockopt`, `poll`,
//! `sendmmsg`, `recvmmsg` and control-message encoding/decoding on libc, with a `SAFETY`
//! comment on each block. The crates that would have held it were checked first, against
//! their sources:
//!
//! - **quinn-udp 0.6.3** (made for QUIC, and good at it) sets `IP_PMTUDISC_PROBE` (also ID
//!   0 per the reference), `IP_PKTINFO`/`IPV6_RECVPKTINFO` (it reports the destination
//!   address) and does GSO/GRO. But it reduces the received TOS/traffic class to its two
//!   ECN bits (`EcnCodepoint::from_bits(x & 0b11)`), does not ask for or decode the TTL /
//!   hop limit (the engine's `IpInfo` and the UD GRH need both), and attaches an
//!   `IP_TOS`/`IPV6_TCLASS` control message holding only the ECN value to every send, so
//!   the DSCP of an address vector's traffic class could never reach the wire. It sends one
//!   `sendmsg` per transmit (no `sendmmsg` across destinations or sizes), does not set
//!   `UDP_NO_CHECK6_RX`, receives into a fixed 96-byte control buffer without checking
//!   `MSG_CTRUNC` (adding options of our own would silently drop messages), and needs Rust
//!   1.88 while the workspace promises 1.85. Extra options could be set on its socket, but
//!   its receive path would still throw their control messages away.
//! - **nix 0.31** wraps `sendmmsg`/`recvmmsg` safely, but `sendmmsg` shares one list of
//!   control messages among all messages of a batch (nix-rust/nix#1954), and reusing its
//!   preallocated headers across `recvmmsg` calls loses control messages because
//!   `msg_controllen` is not restored (nix-rust/nix#2813, open): exactly the GRO segment
//!   size and the packet info. It has no `IP_MTU_DISCOVER` or `UDP_NO_CHECK6_RX` either.
//! - **rustix 1.1** has `sendmmsg` and `set_ip_mtu_discover`, but no `recvmmsg`, no
//!   decoding of IP-level control messages and no `UDP_NO_CHECK6_RX`.
//! - **socket2 0.6** is used: it creates, binds and configures the socket (`SO_REUSEPORT`,
//!   buffers, `IPV6_V6ONLY`, `IP_RECVTOS`, hop limits). It has no `IP_MTU_DISCOVER`,
//!   `IP_PKTINFO`, `IP_RECVTTL`, `UDP_NO_CHECK6_*` or `UDP_GRO`, and no mmsg calls.
//!
//! `UDP_NO_CHECK6_RX` alone is in none of them, so a `setsockopt` of our own was needed
//! anyway.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use softrdma_udp::{Config, RecvBatch, RoceSocket};
//!
//! // Tests bind an ephemeral port; production uses the default, 4791.
//! let config = Config { port: 0, ..Config::default() };
//! let a = RoceSocket::bind_with([127, 0, 0, 1].into(), &config)?;
//! let b = RoceSocket::bind_with([127, 0, 0, 1].into(), &config)?;
//!
//! // The envelope is what the ICRC covers: addresses, ports, IPv4 ID 0 and DF.
//! let envelope = a.envelope_to(b.local_addr())?;
//! a.send(&envelope, b"a RoCE packet would go here")?;
//!
//! let mut batch = RecvBatch::new(8, 2048);
//! assert_eq!(b.recv_timeout(&mut batch, Duration::from_secs(2))?, 1);
//! let d = batch.iter().next().unwrap();
//! assert_eq!(d.payload, b"a RoCE packet would go here");
//! assert_eq!(d.envelope(), envelope); // what `RoceRepr::parse` checks the ICRC against
//! assert_eq!(d.ip().hop_limit, 64);
//! # Ok::<(), std::io::Error>(())
//! ```

#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod sys;

#[allow(unsafe_code)]
mod fork;

pub mod host;
#[allow(unsafe_code)]
mod life;
#[allow(unsafe_code)]
pub mod local;
#[allow(unsafe_code)]
pub mod peer_region;

use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use socket2::{Domain, Protocol, Socket, Type};
pub use softrdma_wire::{Envelope, Ipv4Envelope, Ipv6Envelope};

/// The RoCEv2 UDP destination port.
pub const ROCEV2_PORT: u16 = softrdma_wire::ROCEV2_UDP_PORT;

/// Datagrams (or GSO buffers) per `sendmmsg`, and messages per `recvmmsg`.
pub const MAX_BATCH: usize = sys::MAX_BATCH;

/// Most segments one GSO buffer may hold. Linux allowed 64 (`UDP_MAX_SEGMENTS`) before
/// raising it to 128; 64 works on every kernel with UDP GSO (4.18 on).
pub const MAX_GSO_SEGMENTS: usize = 64;

/// How to set up a [`RoceSocket`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Local UDP port. RoCEv2 receives on [`ROCEV2_PORT`] (the default); tests that run in
    /// parallel use 0, an ephemeral port.
    pub port: u16,
    /// Set `SO_REUSEPORT` before binding, so that several sockets (processes) share the
    /// address and port. Which one gets a datagram is the kernel's hash unless a
    /// `SO_ATTACH_REUSEPORT_CBPF` program chooses (DESIGN.md, hard problem 1).
    pub reuse_port: bool,
    /// `SO_RCVBUF` in bytes. Tried with `SO_RCVBUFFORCE` first, which root may use to pass
    /// `net.core.rmem_max`; otherwise the kernel caps it there. `None` keeps the default.
    pub recv_buffer_size: Option<usize>,
    /// `SO_SNDBUF` in bytes, the same way (`SO_SNDBUFFORCE`, `net.core.wmem_max`).
    pub send_buffer_size: Option<usize>,
    /// IPv4 TTL / IPv6 unicast hop limit of sent datagrams. `None` keeps the system
    /// default (64). The ICRC does not cover it.
    pub hop_limit: Option<u8>,
    /// Default IPv4 TOS / IPv6 traffic class of sent datagrams (DSCP in the upper six
    /// bits); [`Outgoing::traffic_class`] overrides it per datagram. Not covered by the
    /// ICRC.
    pub traffic_class: Option<u8>,
    /// Turn on `UDP_GRO`: the kernel may hand over several datagrams of one flow in one
    /// buffer, which [`RecvBatch::iter`] splits again. Give the batch slots of 64 KiB then.
    pub gro: bool,
    /// IPv6 only: send UDP checksum 0 (`UDP_NO_CHECK6_TX`), as kernel rxe does. Receivers
    /// that are not rxe or a [`RoceSocket`] drop such datagrams, and GSO refuses them, so
    /// this is for imitating rxe in tests.
    pub udp6_zero_checksum_tx: bool,
    /// The index of the interface the socket serves: the scope (`sin6_scope_id`) of
    /// link-local IPv6 addresses (`fe80::/10`), which name no interface themselves. A
    /// socket on a link-local address is bound in this scope (binding one without it
    /// fails), and every datagram to a link-local address goes out in it. `None` for
    /// sockets that use no link-local address.
    pub scope_id: Option<u32>,
    /// The index of the interface datagrams to a multicast group leave by
    /// (`IP_MULTICAST_IF`: the socket's own IPv4 address; `IPV6_MULTICAST_IF`: this index),
    /// with hop limit 1 (the link: `IP_MULTICAST_TTL` / `IPV6_MULTICAST_HOPS`) and looped
    /// back to the sending host (`IP_MULTICAST_LOOP`), whose own members of the group must
    /// receive them too. `None` leaves the kernel's choice (the route; then the same TTL and
    /// loop, the kernel's defaults).
    pub multicast_interface: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            port: ROCEV2_PORT,
            reuse_port: false,
            recv_buffer_size: None,
            send_buffer_size: None,
            hop_limit: None,
            traffic_class: None,
            gro: false,
            udp6_zero_checksum_tx: false,
            scope_id: None,
            multicast_interface: None,
        }
    }
}

/// The variant IP fields of a received datagram: those the ICRC does not cover. Field for
/// field the engine's `IpInfo`, which `handle_datagram_with` takes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct IpInfo {
    /// IPv4 TTL / IPv6 hop limit as received.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class as received (DSCP and ECN).
    pub traffic_class: u8,
    /// IPv6 flow label as received; 0 for IPv4.
    pub flow_label: u32,
}

/// A datagram's UDP payload: a whole RoCE packet (or a GSO run of them), ICRC included.
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// In one buffer.
    Bytes(&'a [u8]),
    /// In pieces, sent in this order (scatter-gather): a packet's headers from one buffer,
    /// its data from where the application keeps it, its pad and ICRC from the first
    /// again, and with GSO one packet after another.
    Parts(&'a [IoSlice<'a>]),
}

impl Payload<'_> {
    /// Bytes in all.
    pub fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Parts(parts) => parts.iter().map(|p| p.len()).sum(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One datagram to send: where (the envelope its ICRC was computed for) and what.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    /// The envelope the payload's ICRC was computed for. Its destination address and port
    /// say where the datagram goes; its source must be this socket's address and port, and
    /// an IPv4 envelope must have identification 0 and DF (what the kernel will send).
    pub envelope: Envelope,
    /// The UDP payload.
    pub payload: Payload<'a>,
    /// IPv4 TOS / IPv6 traffic class for this datagram (an address vector's traffic
    /// class); `None` uses the socket's ([`Config::traffic_class`]).
    pub traffic_class: Option<u8>,
    /// GSO: cut `payload` into datagrams of this many bytes (the last may be shorter), at
    /// most [`MAX_GSO_SEGMENTS`]. Over IPv4, segment *i* goes out with identification *i*:
    /// its ICRC must have been computed with that (see the crate documentation).
    pub segment_size: Option<u16>,
}

impl<'a> Outgoing<'a> {
    /// A datagram in `envelope`, with the socket's traffic class and no GSO.
    pub fn new(envelope: Envelope, payload: &'a [u8]) -> Self {
        Self { envelope, payload: Payload::Bytes(payload), traffic_class: None, segment_size: None }
    }

    /// A datagram in `envelope` whose payload is `parts` in order, with the socket's
    /// traffic class and no GSO.
    pub fn gathered(envelope: Envelope, parts: &'a [IoSlice<'a>]) -> Self {
        Self { envelope, payload: Payload::Parts(parts), traffic_class: None, segment_size: None }
    }
}

/// A UDP socket for RoCEv2. See the [crate documentation](crate).
///
/// Unconnected and non-blocking. All methods take `&self`: threads may share one socket
/// (the kernel serialises the syscalls).
#[derive(Debug)]
pub struct RoceSocket {
    /// Closed in children of `fork` ([`fork::ParentOnly`]): a copy there would stay in the
    /// port's reuseport group after this process closed it, at an index the coordinator
    /// took for free.
    socket: fork::ParentOnly,
    local: SocketAddr,
    gro: bool,
    /// [`Config::scope_id`]: the scope of link-local destinations.
    scope_id: Option<u32>,
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Wakes a thread asleep in `poll` on `old`: a datagram to it. Shutting an unconnected UDP
/// socket down wakes nobody (measured on 6.18), and a datagram to a group's address is
/// steered by its program; so `old` is connected to a fresh socket of its address, which
/// makes the kernel deliver that socket's datagram to `old` whatever the program says (and
/// nothing else changes: no other datagram comes from there). The datagram is a probe,
/// which a guest's locked filter keeps ([`host::wake_datagram`]). Best effort: on a failure
/// the poller wakes at its own timeout, which may be never (a progress thread of an idle
/// device), and `old` stays in its group meanwhile.
fn wake_pollers(old: &OwnedFd) {
    let old = socket2::SockRef::from(old);
    let bound = old.local_addr().ok().and_then(|a| a.as_socket()).filter(|a| a.port() != 0);
    let at = match bound {
        Some(at) => at,
        None => {
            // Unbound (a placeholder, which receives nothing): bound on loopback for the wake.
            let any: SocketAddr = match old.domain() {
                Ok(socket2::Domain::IPV6) => (Ipv6Addr::LOCALHOST, 0).into(),
                _ => (Ipv4Addr::LOCALHOST, 0).into(),
            };
            let bound = old.bind(&any.into()).ok().and_then(|()| old.local_addr().ok()).and_then(|a| a.as_socket());
            let Some(at) = bound else { return };
            at
        }
    };
    let mut from = at;
    from.set_port(0);
    let Ok(waker) = std::net::UdpSocket::bind(from) else { return };
    let Ok(waker_addr) = waker.local_addr() else { return };
    if old.connect(&waker_addr.into()).is_ok() {
        let _ = waker.send_to(&host::wake_datagram(), at);
    }
}

/// Sets a buffer size, with the `FORCE` variant first (root passes the sysctl cap).
fn set_buffer(fd: BorrowedFd<'_>, force: libc::c_int, plain: libc::c_int, bytes: usize) -> io::Result<()> {
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    sys::set_int(fd, libc::SOL_SOCKET, force, value).or_else(|_| sys::set_int(fd, libc::SOL_SOCKET, plain, value))
}

impl RoceSocket {
    /// Binds `ip`, port 4791, with the default [`Config`].
    pub fn bind(ip: IpAddr) -> io::Result<Self> {
        Self::bind_with(ip, &Config::default())
    }

    /// Binds `ip` and `config.port` with `config`.
    ///
    /// `ip` may be a wildcard (`0.0.0.0`, `::`); then each send names its source address
    /// with `IP_PKTINFO`/`IPV6_PKTINFO` from the envelope, and each receive reports the
    /// address it was sent to. An IPv6 socket is IPv6-only (`IPV6_V6ONLY`): bind one socket
    /// per family. A link-local IPv6 address is bound in [`Config::scope_id`], which it
    /// needs, even while it is tentative (`IPV6_FREEBIND`).
    pub fn bind_with(ip: IpAddr, config: &Config) -> io::Result<Self> {
        let addr = match ip {
            IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                let scope = config.scope_id.filter(|&s| s != 0).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "binding link-local {v6} needs the index of its interface as Config::scope_id \
                             (a link-local address names no interface)"
                        ),
                    )
                })?;
                SocketAddr::V6(SocketAddrV6::new(v6, config.port, 0, scope))
            }
            _ => SocketAddr::new(ip, config.port),
        };
        Self::open(addr, config, false)
    }

    /// Binds multicast group `group` on `config.port`, and joins the group on interface
    /// `interface` (an index): the socket receives the group's datagrams that arrive there
    /// or that this host sends there (looped back). Every socket bound to the group and
    /// port receives its own copy of each datagram, in any process of the host (the kernel
    /// delivers multicast to all of them: `SO_REUSEADDR`, no reuseport group and no
    /// steering), so every process with a member receives. Closing the socket leaves the
    /// group. Such a socket receives only; `InvalidInput` for a `group` that is not a
    /// multicast address.
    pub fn bind_group(group: IpAddr, interface: u32, config: &Config) -> io::Result<Self> {
        if !group.is_multicast() {
            return Err(invalid("bind_group: not a multicast address"));
        }
        let addr = match group {
            // A link-scope group needs its interface (the scope); any other ignores it.
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, config.port, 0, interface)),
            IpAddr::V4(_) => SocketAddr::new(group, config.port),
        };
        let config = Config { reuse_port: false, multicast_interface: None, ..config.clone() };
        let s = Self::open(addr, &config, true)?;
        let sock = socket2::SockRef::from(&s.socket);
        match group {
            IpAddr::V4(g) => {
                sock.join_multicast_v4_n(&g, &socket2::InterfaceIndexOrAddress::Index(interface))?;
                // Only the groups this socket joined (it is bound to one anyway).
                sock.set_multicast_all_v4(false)?;
            }
            IpAddr::V6(g) => {
                sock.join_multicast_v6(&g, interface)?;
                // Linux 4.20 on; older kernels bind the address alone, which suffices.
                let _ = sock.set_multicast_all_v6(false);
            }
        }
        Ok(s)
    }

    /// Creates, configures and binds the socket (`SO_REUSEADDR` with `reuse_address`).
    fn open(addr: SocketAddr, config: &Config, reuse_address: bool) -> io::Result<Self> {
        let socket = Self::unbound(addr, config.reuse_port, reuse_address)?;
        Self::configure(&socket, addr, config)?;
        socket.bind(&addr.into())?;
        Self::wrap(socket, config)
    }

    /// A socket of `addr`'s family, non-blocking, IPv6 only for IPv6, with the reuse
    /// options, ready to bind `addr`.
    fn unbound(addr: SocketAddr, reuse_port: bool, reuse_address: bool) -> io::Result<Socket> {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_nonblocking(true)?;
        if !addr.is_ipv4() {
            socket.set_only_v6(true)?;
        }
        if reuse_port {
            socket.set_reuse_port(true)?;
        }
        if reuse_address {
            socket.set_reuse_address(true)?;
        }
        if let SocketAddr::V6(a) = addr {
            if a.ip().is_unicast_link_local() {
                // Every interface with IPv6 has a link-local address, and it is tentative
                // (duplicate address detection) for a second or so after the link comes up,
                // or for good where detection failed: binding it then would fail with
                // EADDRNOTAVAIL, and the whole device would not open. It receives once the
                // kernel has it.
                socket.set_freebind_v6(true)?;
            }
        }
        Ok(socket)
    }

    /// A bare socket bound to `addr` in its port's reuseport group, nothing else set: what
    /// a coordinator makes for a process of another user, which [`adopt`](Self::adopt)s it.
    pub(crate) fn bare(addr: SocketAddr) -> io::Result<OwnedFd> {
        let socket = Self::unbound(addr, true, false)?;
        socket.bind(&addr.into())?;
        Ok(socket.into())
    }

    /// Takes a socket another process bound (a [`bare`](Self::bare) one: its options
    /// other than the reuse ones are set here, as [`bind_with`](Self::bind_with) sets them).
    pub(crate) fn adopt(fd: OwnedFd, config: &Config) -> io::Result<Self> {
        let socket = Socket::from(fd);
        let addr = socket.local_addr()?.as_socket().ok_or_else(|| invalid("bound to a non-IP address"))?;
        socket.set_nonblocking(true)?;
        Self::configure(&socket, addr, config)?;
        Self::wrap(socket, config)
    }

    /// Puts the socket `with` in this one's place (the same descriptor number, which the
    /// caller's poll sets and threads keep using): what this socket was leaves, closed.
    /// For a member whose group is founded again; `with` must be bound to the same address.
    pub(crate) fn replace_with(&self, with: &RoceSocket) -> io::Result<()> {
        self.swap_in(with.socket.as_fd())
    }

    /// Puts `with` behind this socket's descriptor and wakes whoever polls what was there: a
    /// thread asleep in `poll` on it (a progress loop, a thread waiting on a completion
    /// channel) holds the old socket until it returns, so the old one would stay bound, and
    /// the new one unwatched, until its timeout. Woken, it returns only if `with` is
    /// readable ([`vacate`](Self::vacate)); otherwise it watches `with` from then on.
    fn swap_in(&self, with: BorrowedFd<'_>) -> io::Result<()> {
        let old = self.socket.try_clone()?;
        sys::replace_fd(self.socket.as_fd(), with)?;
        wake_pollers(&old);
        Ok(())
    }

    /// [`replace_with`](Self::replace_with) a placeholder, a socket of the same family on
    /// a port of its own on loopback, in no group: this one leaves its group.
    ///
    /// The placeholder holds one datagram already (a [probe](host::wake_datagram), which
    /// the progress loop reading it answers to nobody), so that a thread asleep in `poll`
    /// returns. Woken, `poll` looks again at what its descriptors are now, and sleeps on
    /// if nothing there is readable, holding the files it first looked at until it
    /// returns: a progress thread of an idle device (no timeout) kept the old socket, and
    /// with it the old socket's place in its group, for good.
    pub(crate) fn vacate(&self) -> io::Result<()> {
        let placeholder = Socket::new(Domain::for_address(self.local), Type::DGRAM, Some(Protocol::UDP))?;
        placeholder.set_nonblocking(true)?;
        let loopback: SocketAddr =
            if self.local.is_ipv4() { (Ipv4Addr::LOCALHOST, 0).into() } else { (Ipv6Addr::LOCALHOST, 0).into() };
        // Without loopback (IPv6 off), unbound: its poller wakes at its timeout.
        if placeholder.bind(&loopback.into()).is_ok() {
            if let Some(at) = placeholder.local_addr().ok().and_then(|a| a.as_socket()) {
                let _ = std::net::UdpSocket::bind(loopback).and_then(|w| w.send_to(&host::wake_datagram(), at));
            }
        }
        self.swap_in(placeholder.as_fd())
    }

    /// Every option of [`Config`] but the reuse ones, for a socket of `addr`.
    fn configure(socket: &Socket, addr: SocketAddr, config: &Config) -> io::Result<()> {
        let v4 = addr.is_ipv4();
        let fd = socket.as_fd();
        if let Some(bytes) = config.recv_buffer_size {
            set_buffer(fd, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, bytes)?;
        }
        if let Some(bytes) = config.send_buffer_size {
            set_buffer(fd, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, bytes)?;
        }
        if v4 {
            // DF and, on an unconnected socket, IPv4 ID 0: what the ICRC was computed for.
            sys::set_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
            sys::set_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
            sys::set_int(fd, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)?;
            socket.set_recv_tos_v4(true)?;
            if let Some(ttl) = config.hop_limit {
                socket.set_ttl_v4(u32::from(ttl))?;
            }
            if let Some(tos) = config.traffic_class {
                socket.set_tos_v4(u32::from(tos))?;
            }
            if let (Some(_), IpAddr::V4(own)) = (config.multicast_interface, addr.ip()) {
                if !own.is_unspecified() {
                    socket.set_multicast_if_v4(&own)?;
                }
                socket.set_multicast_ttl_v4(1)?;
                socket.set_multicast_loop_v4(true)?;
            }
        } else {
            sys::set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, libc::IPV6_PMTUDISC_DO)?;
            sys::set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
            socket.set_recv_hoplimit_v6(true)?;
            socket.set_recv_tclass_v6(true)?;
            sys::set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO, 1)?;
            // rxe sends UDP checksum 0; without this Linux drops those IPv6 datagrams.
            sys::set_int(fd, libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1)?;
            if config.udp6_zero_checksum_tx {
                sys::set_int(fd, libc::SOL_UDP, libc::UDP_NO_CHECK6_TX, 1)?;
            }
            if let Some(hops) = config.hop_limit {
                socket.set_unicast_hops_v6(u32::from(hops))?;
            }
            if let Some(tclass) = config.traffic_class {
                socket.set_tclass_v6(u32::from(tclass))?;
            }
            if let Some(interface) = config.multicast_interface {
                socket.set_multicast_if_v6(interface)?;
                socket.set_multicast_hops_v6(1)?;
                socket.set_multicast_loop_v6(true)?;
            }
        }
        if config.gro {
            sys::set_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1)?;
        }
        // The drop counter of a full receive buffer, with every datagram (RecvBatch::drops):
        // congestion control's signal that this receiver is overrun.
        sys::set_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)?;
        Ok(())
    }

    fn wrap(socket: Socket, config: &Config) -> io::Result<Self> {
        let local = socket.local_addr()?.as_socket().ok_or_else(|| invalid("bound to a non-IP address"))?;
        Ok(Self {
            socket: fork::ParentOnly::new(OwnedFd::from(socket)),
            local,
            gro: config.gro,
            scope_id: config.scope_id.filter(|&s| s != 0),
        })
    }

    /// The bound address and port (the real port when [`Config::port`] was 0), with its
    /// scope when the address is link-local.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// `dst` as the kernel needs it: a link-local IPv6 destination in this socket's scope
    /// ([`Config::scope_id`]); any other as it is.
    fn scoped(&self, ip: IpAddr, port: u16) -> SocketAddr {
        match (ip, self.scope_id) {
            (IpAddr::V6(v6), Some(scope)) if v6.is_unicast_link_local() => {
                SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope))
            }
            _ => SocketAddr::new(ip, port),
        }
    }

    /// Whether `UDP_GRO` is on.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// The socket's receive buffer size as the kernel reports it (twice what was set:
    /// the kernel counts its bookkeeping).
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        socket2::SockRef::from(&self.socket).recv_buffer_size()
    }

    /// The envelope of a datagram from this socket to `dst`: this socket's address and
    /// port as the source, IPv4 ID 0 and DF. Fails for a wildcard-bound socket (whose
    /// source address depends on the route) or a destination of the other family.
    pub fn envelope_to(&self, dst: SocketAddr) -> io::Result<Envelope> {
        if self.local.ip().is_unspecified() {
            return Err(invalid("a wildcard-bound socket has no single source address"));
        }
        match (self.local.ip(), dst.ip()) {
            (IpAddr::V4(src), IpAddr::V4(dst_ip)) => Ok(Envelope::V4(Ipv4Envelope {
                src,
                dst: dst_ip,
                identification: 0,
                dont_fragment: true,
                src_port: self.local.port(),
                dst_port: dst.port(),
            })),
            (IpAddr::V6(src), IpAddr::V6(dst_ip)) => {
                Ok(Envelope::V6(Ipv6Envelope { src, dst: dst_ip, src_port: self.local.port(), dst_port: dst.port() }))
            }
            _ => Err(invalid("destination of the other address family")),
        }
    }

    /// Checks that the kernel will send `out` in exactly its envelope, and converts it.
    fn prepare<'a>(&self, out: &Outgoing<'a>) -> io::Result<sys::SendMsg<'a>> {
        let e = &out.envelope;
        match (e, self.local) {
            (Envelope::V4(v4), SocketAddr::V4(_)) => {
                if v4.identification != 0 || !v4.dont_fragment {
                    return Err(invalid("the kernel sends IPv4 ID 0 with DF; the ICRC must be computed for that"));
                }
            }
            (Envelope::V6(_), SocketAddr::V6(_)) => {}
            _ => return Err(invalid("envelope of the other address family than the socket")),
        }
        if e.src_port() != self.local.port() {
            return Err(invalid("envelope source port is not the socket's port"));
        }
        let src_ip = if self.local.ip().is_unspecified() {
            if e.src_ip().is_unspecified() {
                return Err(invalid("envelope has no source address"));
            }
            Some(e.src_ip())
        } else if e.src_ip() != self.local.ip() {
            return Err(invalid("envelope source address is not the socket's address"));
        } else {
            None
        };
        let segment_size = match out.segment_size {
            None => None,
            Some(seg) => {
                // Summed once: a gathered payload is a list of pieces.
                let len = out.payload.len();
                if seg == 0 || len.div_ceil(usize::from(seg)) > MAX_GSO_SEGMENTS {
                    return Err(invalid("GSO segment size 0, or more than MAX_GSO_SEGMENTS segments"));
                }
                // A buffer that fits in one segment is simply one datagram.
                (len > usize::from(seg)).then_some(seg)
            }
        };
        Ok(sys::SendMsg {
            dst: self.scoped(e.dst_ip(), e.dst_port()),
            payload: out.payload,
            src_ip,
            traffic_class: out.traffic_class,
            segment_size,
        })
    }

    /// Sends one datagram in `envelope` (see [`Outgoing::envelope`] for what it must hold).
    ///
    /// Non-blocking: `WouldBlock` when the send buffer is full ([`wait_writable`] waits).
    /// `InvalidInput` when the envelope is not what the kernel will send.
    ///
    /// [`wait_writable`]: Self::wait_writable
    pub fn send(&self, envelope: &Envelope, payload: &[u8]) -> io::Result<()> {
        self.send_batch(&[Outgoing::new(*envelope, payload)]).map(|_| ())
    }

    /// Sends datagrams with as few `sendmmsg` calls as it takes ([`MAX_BATCH`] per call).
    ///
    /// Returns how many of `batch` were sent, in order; fewer than all when the send buffer
    /// filled up or datagram `n` failed, which the next call starting at `n` reports. An
    /// error only when none was sent: `WouldBlock`, `InvalidInput` for an envelope the
    /// kernel would not honour, `EMSGSIZE` for a datagram over the path MTU, ...
    pub fn send_batch(&self, batch: &[Outgoing<'_>]) -> io::Result<usize> {
        let mut sent = 0;
        // Only the entries in use are written: a whole array of MAX_BATCH messages, made
        // for every send, was 5 KiB to fill for an ACK sent alone (about 700 instructions,
        // an eighth of a message's send path in a ping-pong).
        let mut msgs: SmallVec<[sys::SendMsg<'_>; MAX_BATCH]> = SmallVec::new();
        while sent < batch.len() {
            let chunk = &batch[sent..batch.len().min(sent + MAX_BATCH)];
            msgs.clear();
            let mut bad = None;
            for out in chunk {
                match self.prepare(out) {
                    Ok(m) => msgs.push(m),
                    Err(e) => {
                        bad = Some(e);
                        break;
                    }
                }
            }
            let ready = msgs.len();
            if ready > 0 {
                let n = match sys::sendmmsg(self.socket.as_fd(), &msgs) {
                    Ok(n) => n,
                    Err(e) if sent == 0 => return Err(e),
                    Err(_) => return Ok(sent),
                };
                sent += n;
                if n < ready {
                    return Ok(sent);
                }
            }
            if let Some(e) = bad {
                return if sent == 0 { Err(e) } else { Ok(sent) };
            }
        }
        Ok(sent)
    }

    /// Sends `payload` to `dst` as it is, with no envelope check: for datagrams that are
    /// not RoCE, and tests.
    pub fn send_to(&self, dst: SocketAddr, payload: &[u8]) -> io::Result<()> {
        let msg = sys::SendMsg {
            dst,
            payload: Payload::Bytes(payload),
            src_ip: None,
            traffic_class: None,
            segment_size: None,
        };
        sys::sendmmsg(self.socket.as_fd(), std::slice::from_ref(&msg)).map(|_| ())
    }

    /// Receives what is queued, up to the batch's [`limit`](RecvBatch::limit), with one
    /// `recvmmsg`, replacing the batch's contents. Non-blocking: `WouldBlock` when nothing
    /// is queued. Returns the number of messages (a GRO message may hold several
    /// datagrams; [`RecvBatch::iter`] yields each).
    pub fn recv(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        batch.filled = 0;
        let n = batch.slots.recvmmsg(self.socket.as_fd(), &mut batch.meta[..batch.limit])?;
        batch.filled = n;
        batch.local = self.local;
        Ok(n)
    }

    /// Like [`recv`](Self::recv), but waits up to `timeout` for the first datagram.
    /// Returns `Ok(0)` when the time passed with nothing received.
    pub fn recv_timeout(&self, batch: &mut RecvBatch, timeout: Duration) -> io::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.recv(batch) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                other => return other,
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.wait_readable(Some(left))? {
                return Ok(0);
            }
        }
    }

    /// Waits until a datagram is queued (or an error is pending), at most `timeout`
    /// (`None`: forever). Returns whether the socket became readable.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        sys::poll(self.socket.as_fd(), libc::POLLIN, timeout)
    }

    /// Waits until the send buffer has room, at most `timeout` (`None`: forever).
    pub fn wait_writable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        sys::poll(self.socket.as_fd(), libc::POLLOUT, timeout)
    }
}

impl AsFd for RoceSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

impl AsRawFd for RoceSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// Buffers for [`RoceSocket::recv`], allocated once and reused: `count` slots of
/// `slot_len` bytes and their metadata.
///
/// A datagram longer than its slot is cut to the slot (and marked
/// [`truncated`](Received::truncated)). RoCE datagrams are at most 4096 bytes of payload
/// plus headers, so 4352-byte slots hold any of them; with [`Config::gro`], use 65536.
#[derive(Debug)]
pub struct RecvBatch {
    slots: sys::RecvSlots,
    meta: Vec<sys::RawMeta>,
    filled: usize,
    /// Messages the next receive may take (1 to the capacity).
    limit: usize,
    local: SocketAddr,
}

impl RecvBatch {
    /// `count` slots (1 to [`MAX_BATCH`]; clamped) of `slot_len` bytes (at least 1).
    pub fn new(count: usize, slot_len: usize) -> Self {
        let slots = sys::RecvSlots::new(count, slot_len);
        Self {
            meta: vec![sys::RawMeta::EMPTY; slots.count()],
            limit: slots.count(),
            slots,
            filled: 0,
            local: SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
        }
    }

    /// Messages one receive can take.
    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Messages the next [`RoceSocket::recv`] may take: the capacity unless
    /// [`set_limit`](Self::set_limit) said fewer.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Lets the next receives take at most `messages` (clamped to 1 through the capacity):
    /// with GRO slots of 64 KiB, a receive of the whole capacity may take megabytes before
    /// the receiver can answer any of it.
    pub fn set_limit(&mut self, messages: usize) {
        self.limit = messages.clamp(1, self.meta.len());
    }

    /// The bytes the last receive took, all its messages together (a GRO message counts
    /// whole).
    pub fn bytes(&self) -> usize {
        self.meta[..self.filled].iter().map(|m| m.len).sum()
    }

    /// The longest message the last receive took, in bytes (0 if none).
    pub fn longest(&self) -> usize {
        self.meta[..self.filled].iter().map(|m| m.len).max().unwrap_or(0)
    }

    /// Messages received by the last [`RoceSocket::recv`].
    pub fn len(&self) -> usize {
        self.filled
    }

    /// Whether the last receive got nothing.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Whether the kernel had to drop some control messages of a message for lack of room
    /// (`MSG_CTRUNC`; never expected: the buffer has room for all that is asked for).
    pub fn control_truncated(&self) -> bool {
        self.meta[..self.filled].iter().any(|m| m.ctrl_truncated)
    }

    /// How many datagrams the socket has dropped since it was opened because its receive
    /// buffer was full (`SO_RXQ_OVFL`), as of the last receive. `None` when the last
    /// receive got nothing, or only datagrams queued before the first drop (the kernel
    /// stamps the count on datagrams once it is not zero). A rise means this receiver is
    /// overrun: congestion control answers it with CNPs.
    pub fn drops(&self) -> Option<u32> {
        self.meta[..self.filled].iter().filter_map(|m| m.drops).max()
    }

    /// The datagrams of the last receive, GRO messages split into their datagrams.
    pub fn iter(&self) -> Datagrams<'_> {
        self.iter_from(RxPosition::default())
    }

    /// The datagrams of the last receive from `at` on: where an earlier iteration stopped
    /// ([`Datagrams::rest`]). Valid until the next receive into this batch.
    pub fn iter_from(&self, at: RxPosition) -> Datagrams<'_> {
        Datagrams { batch: self, message: at.message, offset: at.offset, segment: at.segment }
    }
}

/// Where in a [`RecvBatch`] an iteration of its datagrams stands: the message, and the
/// byte and segment index of the next datagram within a GRO message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxPosition {
    message: usize,
    offset: usize,
    segment: usize,
}

impl<'a> IntoIterator for &'a RecvBatch {
    type Item = Received<'a>;
    type IntoIter = Datagrams<'a>;
    fn into_iter(self) -> Datagrams<'a> {
        self.iter()
    }
}

/// Iterator over the datagrams of a [`RecvBatch`].
#[derive(Clone, Debug)]
pub struct Datagrams<'a> {
    batch: &'a RecvBatch,
    message: usize,
    offset: usize,
    segment: usize,
}

impl Datagrams<'_> {
    /// Where the datagrams not yet yielded begin, or `None` if none is left: what
    /// [`RecvBatch::iter_from`] takes to go on later.
    pub fn rest(&self) -> Option<RxPosition> {
        (self.message < self.batch.filled).then_some(RxPosition {
            message: self.message,
            offset: self.offset,
            segment: self.segment,
        })
    }
}

impl<'a> Iterator for Datagrams<'a> {
    type Item = Received<'a>;

    fn next(&mut self) -> Option<Received<'a>> {
        let b = self.batch;
        while self.message < b.filled {
            let m = &b.meta[self.message];
            let len = m.len.min(b.slots.slot_len());
            let stride = m.gro_segment.filter(|&s| s > 0).unwrap_or(len);
            let start = self.offset;
            // An empty datagram is still a datagram: yield it once.
            if start < len || (len == 0 && self.segment == 0) {
                let end = if stride == 0 { start } else { len.min(start + stride) };
                let item = Received {
                    payload: &b.slots.slot(self.message)[start..end],
                    source: m.source.unwrap_or_else(|| SocketAddr::new(unspecified_like(b.local.ip()), 0)),
                    destination: destination(m.dst_ip.unwrap_or(b.local.ip()), b.local, m.ifindex),
                    hop_limit: m.hop_limit.unwrap_or(0),
                    traffic_class: m.traffic_class.unwrap_or(0),
                    flow_label: m.flow_label.unwrap_or(0),
                    ifindex: m.ifindex,
                    truncated: m.truncated && end == len,
                    segment_index: self.segment,
                };
                self.offset = end;
                self.segment += 1;
                if end >= len {
                    self.message += 1;
                    self.offset = 0;
                    self.segment = 0;
                }
                return Some(item);
            }
            self.message += 1;
            self.offset = 0;
            self.segment = 0;
        }
        None
    }
}

/// The address a datagram was sent to, on `local`'s port: a link-local one in the scope of
/// the interface it arrived on (or the socket's own scope, if the kernel did not say).
fn destination(ip: IpAddr, local: SocketAddr, ifindex: u32) -> SocketAddr {
    match (ip, local) {
        (IpAddr::V6(v6), SocketAddr::V6(l)) if v6.is_unicast_link_local() => {
            let scope = if ifindex != 0 { ifindex } else { l.scope_id() };
            SocketAddr::V6(SocketAddrV6::new(v6, l.port(), 0, scope))
        }
        _ => SocketAddr::new(ip, local.port()),
    }
}

fn unspecified_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

/// One received datagram and what the kernel said about it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Received<'a> {
    /// The UDP payload (cut to the slot if [`truncated`](Self::truncated)).
    pub payload: &'a [u8],
    /// Sender's address and UDP port (a link-local one with its scope, the interface it
    /// came in on).
    pub source: SocketAddr,
    /// The address the datagram was sent to (`IP_PKTINFO`/`IPV6_PKTINFO`; the bound
    /// address if the kernel did not say) and this socket's port; a link-local one with
    /// its scope.
    pub destination: SocketAddr,
    /// IPv4 TTL / IPv6 hop limit (0 if the kernel did not say; it always does on Linux).
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class (0 if the kernel did not say).
    pub traffic_class: u8,
    /// IPv6 flow label (0 for IPv4).
    pub flow_label: u32,
    /// Index of the interface it arrived on (0 if unknown).
    pub ifindex: u32,
    /// The datagram was longer than the slot: `payload` is only its beginning.
    pub truncated: bool,
    /// Position within a GRO message (0 without GRO). See the crate documentation on GSO
    /// for why this is not the sender's IPv4 ID in general.
    pub segment_index: usize,
}

impl Received<'_> {
    /// The envelope to check the ICRC against, assuming IPv4 ID 0 and DF: what softrdma
    /// senders send, not what rxe sends (see the crate documentation).
    pub fn envelope(&self) -> Envelope {
        self.envelope_with_id(0)
    }

    /// The envelope with a given IPv4 identification (for GSO segment *i*, or an ID
    /// learnt elsewhere); DF set. Ignored for IPv6.
    pub fn envelope_with_id(&self, identification: u16) -> Envelope {
        let (src_port, dst_port) = (self.source.port(), self.destination.port());
        match (self.source.ip(), self.destination.ip()) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                Envelope::V4(Ipv4Envelope { src, dst, identification, dont_fragment: true, src_port, dst_port })
            }
            (src, dst) => Envelope::V6(Ipv6Envelope { src: to_v6(src), dst: to_v6(dst), src_port, dst_port }),
        }
    }

    /// The variant IP fields, for the engine (`handle_datagram_with`) and the UD GRH.
    pub fn ip(&self) -> IpInfo {
        IpInfo { hop_limit: self.hop_limit, traffic_class: self.traffic_class, flow_label: self.flow_label }
    }
}

fn to_v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
