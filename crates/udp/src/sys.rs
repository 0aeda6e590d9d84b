//! Every `unsafe` line of the crate: the libc calls that neither `socket2` nor the standard
//! library makes for us.
//!
//! - `setsockopt` of `int` options socket2 has no setter for (`IP_MTU_DISCOVER`,
//!   `IP_PKTINFO`, `IP_RECVTTL`, `UDP_NO_CHECK6_RX`, `UDP_GRO`, ...);
//! - `getsockopt(SO_PEERCRED)` (rustix's would hold a peer's pid 0, which another PID
//!   namespace's process has, in a non-zero type);
//! - classic-BPF programs: a reuseport group's (`SO_ATTACH_REUSEPORT_CBPF`) and a
//!   socket's own filter (`SO_ATTACH_FILTER`, read back with `SO_GET_FILTER`, and whether
//!   it is locked, `SO_LOCK_FILTER`);
//! - `poll` on one descriptor;
//! - `sendmmsg` with per-message control messages (source address, traffic class, GSO
//!   segment size);
//! - `recvmmsg` and the decoding of the control messages it returns.
//!
//! All buffers the kernel reads or writes live on the caller's stack or in slices the
//! caller lends for the duration of one call; nothing here keeps a raw pointer past the
//! function that made it.

use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;
use std::time::Duration;

use libc::{c_int, c_void};

use crate::Payload;

/// Datagrams per `sendmmsg`/`recvmmsg` call. A `sendmmsg`'s headers live on the stack; a
/// receive batch keeps its own ([`RecvSlots`]).
pub(crate) const MAX_BATCH: usize = 64;

/// Bytes of control-message space per datagram. A received IPv6 datagram carries at most
/// `IPV6_PKTINFO` (40 with its header), `IPV6_HOPLIMIT`, `IPV6_TCLASS`, `IPV6_FLOWINFO`
/// and `UDP_GRO` (24 each): 136. A sent one at most a pktinfo, a traffic class and a
/// segment size: 88. 256 leaves room; a shortfall would show as `MSG_CTRUNC`.
const CMSG_BUF_LEN: usize = 256;

/// A control-message buffer, aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_BUF_LEN]);

const _: () = assert!(mem::align_of::<libc::cmsghdr>() <= mem::align_of::<CmsgBuf>());

fn cmsg_space(data_len: usize) -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
    unsafe { libc::CMSG_SPACE(data_len as libc::c_uint) as usize }
}

fn cmsg_len(data_len: usize) -> usize {
    // SAFETY: CMSG_LEN is arithmetic on its argument; it touches no memory.
    unsafe { libc::CMSG_LEN(data_len as libc::c_uint) as usize }
}

/// Sets an `int`-valued socket option.
pub(crate) fn set_int(fd: BorrowedFd<'_>, level: c_int, name: c_int, value: c_int) -> io::Result<()> {
    // SAFETY: `fd` is an open descriptor for the duration of the borrow; the option value
    // is a live `c_int` on our stack and its exact size is passed as the length.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            ptr::from_ref(&value).cast::<c_void>(),
            mem::size_of::<c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The process and user at the other end of a connected Unix socket (the ones that created
/// the listening socket, for a connecting side): pid 0 when it lives in a PID namespace
/// this process cannot see.
pub(crate) fn peer_cred(fd: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `fd` is open for the borrow; the kernel writes at most `len` bytes into the
    // `ucred` on our stack, whose exact size `len` holds.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            ptr::from_mut(&mut cred).cast::<c_void>(),
            &raw mut len,
        )
    };
    if rc == 0 { Ok((u32::try_from(cred.pid).unwrap_or(0), cred.uid)) } else { Err(io::Error::last_os_error()) }
}

/// Waits until `fd` has one of `events` (`POLLIN`, `POLLOUT`), or the timeout passes.
/// Returns whether it became ready. `None` waits forever.
pub(crate) fn poll(fd: BorrowedFd<'_>, events: libc::c_short, timeout: Option<Duration>) -> io::Result<bool> {
    let timeout_ms: c_int = match timeout {
        None => -1,
        // Round up, so that a short positive timeout does not become a busy non-wait.
        Some(t) => c_int::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(c_int::MAX),
    };
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 };
    loop {
        // SAFETY: one valid `pollfd` on our stack, and the count says one.
        let rc = unsafe { libc::poll(&raw mut pfd, 1, timeout_ms) };
        if rc >= 0 {
            return Ok(rc > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A `sockaddr_in` or `sockaddr_in6`, built without `unsafe` and passed by pointer.
#[derive(Clone, Copy)]
#[repr(C)]
union RawAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl RawAddr {
    fn new(addr: SocketAddr) -> (Self, libc::socklen_t) {
        match addr {
            SocketAddr::V4(a) => (
                Self {
                    v4: libc::sockaddr_in {
                        sin_family: libc::AF_INET as libc::sa_family_t,
                        sin_port: a.port().to_be(),
                        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                        sin_zero: [0; 8],
                    },
                },
                mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            SocketAddr::V6(a) => (
                Self {
                    v6: libc::sockaddr_in6 {
                        sin6_family: libc::AF_INET6 as libc::sa_family_t,
                        sin6_port: a.port().to_be(),
                        sin6_flowinfo: a.flowinfo().to_be(),
                        sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                        sin6_scope_id: a.scope_id(),
                    },
                },
                mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }
}

/// Plain data that any bit pattern of its size is a valid value of, so it may be read
/// from the kernel's control-message bytes.
trait Pod: Copy {}
impl Pod for u8 {}
impl Pod for u16 {}
impl Pod for c_int {}
impl Pod for u32 {}
impl Pod for libc::in_pktinfo {}
impl Pod for libc::in6_pktinfo {}

/// Writes control messages into a [`CmsgBuf`], never past its end.
///
/// The buffer may start uninitialised: each message's `CMSG_SPACE` bytes (header, data and
/// padding) are written in full, so the `len` bytes handed to the kernel are initialised.
struct CmsgWriter<'a> {
    buf: &'a mut MaybeUninit<CmsgBuf>,
    len: usize,
}

impl CmsgWriter<'_> {
    fn push<T: Pod>(&mut self, level: c_int, kind: c_int, value: T) {
        let size = mem::size_of::<T>();
        let space = cmsg_space(size);
        // A fixed set of small messages: overflowing is a bug here, not bad input.
        assert!(self.len + space <= CMSG_BUF_LEN, "control-message buffer too small");
        // SAFETY: an all-zero `cmsghdr` is valid (integers and, on some targets, padding).
        let mut header: libc::cmsghdr = unsafe { mem::zeroed() };
        header.cmsg_len = cmsg_len(size) as _;
        header.cmsg_level = level;
        header.cmsg_type = kind;
        let base = self.buf.as_mut_ptr().cast::<u8>();
        // SAFETY: `self.len + space <= CMSG_BUF_LEN` (asserted above), so the `space` bytes
        // zeroed first, and the header and the data at CMSG_LEN(0) past it, all end within
        // the buffer; `write_unaligned` needs no alignment.
        unsafe {
            ptr::write_bytes(base.add(self.len), 0, space);
            ptr::write_unaligned(base.add(self.len).cast::<libc::cmsghdr>(), header);
            ptr::write_unaligned(base.add(self.len + cmsg_len(0)).cast::<T>(), value);
        }
        self.len += space;
    }
}

/// One datagram to send.
#[derive(Clone, Copy)]
pub(crate) struct SendMsg<'a> {
    pub(crate) dst: SocketAddr,
    pub(crate) payload: Payload<'a>,
    /// Source address to put in `IP_PKTINFO`/`IPV6_PKTINFO` (for a wildcard-bound socket).
    pub(crate) src_ip: Option<IpAddr>,
    /// IPv4 TOS / IPv6 traffic class for this datagram only.
    pub(crate) traffic_class: Option<u8>,
    /// GSO: split `payload` into datagrams of this many bytes (`UDP_SEGMENT`).
    pub(crate) segment_size: Option<u16>,
}

/// Sends up to [`MAX_BATCH`] datagrams with one `sendmmsg`. Returns how many the kernel
/// took; an error only when it took none.
pub(crate) fn sendmmsg(fd: BorrowedFd<'_>, msgs: &[SendMsg<'_>]) -> io::Result<usize> {
    let count = msgs.len().min(MAX_BATCH);
    if count == 0 {
        return Ok(0);
    }
    // Only the `count` entries in use are initialised: zeroing all MAX_BATCH names, iovecs,
    // headers and control buffers cost 23 KiB of memset per call, for every ACK sent alone.
    let mut names: [MaybeUninit<RawAddr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut iovs: [MaybeUninit<libc::iovec>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut ctrls: [MaybeUninit<CmsgBuf>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    let mut hdrs: [MaybeUninit<libc::mmsghdr>; MAX_BATCH] = [const { MaybeUninit::uninit() }; MAX_BATCH];
    for (i, m) in msgs[..count].iter().enumerate() {
        let (name, name_len) = RawAddr::new(m.dst);
        let name = names[i].write(name);
        let mut w = CmsgWriter { buf: &mut ctrls[i], len: 0 };
        let v4 = m.dst.is_ipv4();
        if let Some(src) = m.src_ip {
            match src {
                IpAddr::V4(ip) => w.push(
                    libc::IPPROTO_IP,
                    libc::IP_PKTINFO,
                    libc::in_pktinfo {
                        ipi_ifindex: 0,
                        ipi_spec_dst: libc::in_addr { s_addr: u32::from_ne_bytes(ip.octets()) },
                        ipi_addr: libc::in_addr { s_addr: 0 },
                    },
                ),
                IpAddr::V6(ip) => w.push(
                    libc::IPPROTO_IPV6,
                    libc::IPV6_PKTINFO,
                    libc::in6_pktinfo { ipi6_addr: libc::in6_addr { s6_addr: ip.octets() }, ipi6_ifindex: 0 },
                ),
            }
        }
        if let Some(tc) = m.traffic_class {
            if v4 {
                w.push(libc::IPPROTO_IP, libc::IP_TOS, c_int::from(tc));
            } else {
                w.push(libc::IPPROTO_IPV6, libc::IPV6_TCLASS, c_int::from(tc));
            }
        }
        if let Some(seg) = m.segment_size {
            // The kernel reads a u16 here.
            w.push(libc::SOL_UDP, libc::UDP_SEGMENT, seg);
        }
        let ctrl_len = w.len;
        // SAFETY: `mmsghdr` is plain C data; all-zero is a valid value (null pointers, zero
        // lengths), and every field the kernel reads is set below.
        let hdr = hdrs[i].write(unsafe { mem::zeroed() });
        let h = &mut hdr.msg_hdr;
        h.msg_name = ptr::from_mut(name).cast::<c_void>();
        h.msg_namelen = name_len;
        // The kernel only reads through these pointers (sendmmsg never writes the payload).
        match m.payload {
            Payload::Bytes(b) => {
                let iov =
                    iovs[i].write(libc::iovec { iov_base: b.as_ptr().cast_mut().cast::<c_void>(), iov_len: b.len() });
                h.msg_iov = ptr::from_mut(iov);
                h.msg_iovlen = 1;
            }
            Payload::Parts(parts) => {
                // `IoSlice` is ABI-compatible with `iovec` (std's guarantee on Unix).
                h.msg_iov = parts.as_ptr().cast_mut().cast::<libc::iovec>();
                h.msg_iovlen = parts.len() as _;
            }
        }
        if ctrl_len > 0 {
            h.msg_control = ctrls[i].as_mut_ptr().cast::<c_void>();
            h.msg_controllen = ctrl_len as _;
        }
    }
    loop {
        // SAFETY: `hdrs[..count]` (initialised above) point at `names`, `iovs` and the
        // initialised first `msg_controllen` bytes of `ctrls` on this stack frame and at the
        // payloads (and parts) borrowed through `msgs`, all alive until we return; each
        // length matches its buffer. The kernel writes only `msg_len` of each header.
        let rc = unsafe { libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr().cast::<libc::mmsghdr>(), count as _, 0) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What the kernel told us about one received message (a datagram, or a GRO train of
/// datagrams of `gro_segment` bytes each).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawMeta {
    pub(crate) len: usize,
    pub(crate) source: Option<SocketAddr>,
    pub(crate) dst_ip: Option<IpAddr>,
    pub(crate) ifindex: u32,
    pub(crate) hop_limit: Option<u8>,
    pub(crate) traffic_class: Option<u8>,
    pub(crate) flow_label: Option<u32>,
    pub(crate) gro_segment: Option<usize>,
    /// The datagram was longer than its buffer (`MSG_TRUNC`).
    pub(crate) truncated: bool,
    /// Some control messages did not fit (`MSG_CTRUNC`).
    pub(crate) ctrl_truncated: bool,
    /// The socket's count of datagrams dropped so far for a full receive buffer
    /// (`SO_RXQ_OVFL`), as of this one.
    pub(crate) drops: Option<u32>,
}

impl RawMeta {
    pub(crate) const EMPTY: Self = Self {
        len: 0,
        source: None,
        dst_ip: None,
        ifindex: 0,
        hop_limit: None,
        traffic_class: None,
        flow_label: None,
        gro_segment: None,
        truncated: false,
        ctrl_truncated: false,
        drops: None,
    };
}

/// The buffers and `recvmmsg` headers of a receive batch, made once. Each header points at
/// its slot of `storage`, its name and its control buffer, heap allocations owned here that
/// never move, so a call re-arms only the headers the last call filled: the kernel writes
/// `msg_namelen`, `msg_controllen`, `msg_flags` and `msg_len` of the messages it returns
/// and of no other. Building all 32 headers for every call (an `iovec`, a zeroed
/// `mmsghdr` and four pointers each) took 12-15 % of a busy poll's time, the largest part
/// of an empty `recvmmsg` outside the kernel.
pub(crate) struct RecvSlots {
    storage: Vec<u8>,
    slot_len: usize,
    hdrs: Box<[libc::mmsghdr]>,
    /// Read by the kernel through `hdrs`; kept for their addresses.
    _iovs: Box<[libc::iovec]>,
    names: Box<[MaybeUninit<libc::sockaddr_storage>]>,
    _ctrls: Box<[MaybeUninit<CmsgBuf>]>,
    /// Headers `0..dirty` may have been written by the kernel since they were armed.
    dirty: usize,
}

// SAFETY: the raw pointers in `hdrs` point only into this value's own heap allocations
// (`storage`, `_iovs`, `names`, `_ctrls`), which move with it and are never shared; they are
// dereferenced only by the kernel, inside `recvmmsg`, which takes `&mut self`.
unsafe impl Send for RecvSlots {}
// SAFETY: as for `Send`: `&self` reads `storage`, `hdrs` and `names` and writes nothing.
unsafe impl Sync for RecvSlots {}

impl std::fmt::Debug for RecvSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvSlots").field("count", &self.hdrs.len()).field("slot_len", &self.slot_len).finish()
    }
}

impl RecvSlots {
    /// `count` slots (at most [`MAX_BATCH`]) of `slot_len` bytes.
    pub(crate) fn new(count: usize, slot_len: usize) -> Self {
        let count = count.clamp(1, MAX_BATCH);
        let slot_len = slot_len.max(1);
        let mut storage = vec![0u8; count * slot_len];
        let base = storage.as_mut_ptr();
        let mut iovs: Box<[libc::iovec]> = (0..count)
            // SAFETY: `i * slot_len < count * slot_len`, within `storage`.
            .map(|i| libc::iovec { iov_base: unsafe { base.add(i * slot_len) }.cast::<c_void>(), iov_len: slot_len })
            .collect();
        let mut names: Box<[MaybeUninit<libc::sockaddr_storage>]> = (0..count).map(|_| MaybeUninit::uninit()).collect();
        // Control buffers stay uninitialised: the kernel writes them and we read only the
        // `msg_controllen` bytes it reports. Names too: we read no more than `msg_namelen`.
        let mut ctrls: Box<[MaybeUninit<CmsgBuf>]> = (0..count).map(|_| MaybeUninit::uninit()).collect();
        let hdrs: Box<[libc::mmsghdr]> = (0..count)
            .map(|i| {
                // SAFETY: `mmsghdr` is plain C data for which all-zero is valid.
                let mut hdr: libc::mmsghdr = unsafe { mem::zeroed() };
                let h = &mut hdr.msg_hdr;
                h.msg_name = names[i].as_mut_ptr().cast::<c_void>();
                h.msg_iov = ptr::from_mut(&mut iovs[i]);
                h.msg_iovlen = 1;
                h.msg_control = ctrls[i].as_mut_ptr().cast::<c_void>();
                hdr
            })
            .collect();
        let mut slots = Self { storage, slot_len, hdrs, _iovs: iovs, names, _ctrls: ctrls, dirty: count };
        slots.rearm();
        slots
    }

    fn rearm(&mut self) {
        for hdr in &mut self.hdrs[..self.dirty] {
            hdr.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdr.msg_hdr.msg_controllen = CMSG_BUF_LEN as _;
            hdr.msg_hdr.msg_flags = 0;
            hdr.msg_len = 0;
        }
        self.dirty = 0;
    }

    /// How many messages one call can take.
    pub(crate) fn count(&self) -> usize {
        self.hdrs.len()
    }

    pub(crate) fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Message `i`'s slot (its first `len` bytes are the message).
    pub(crate) fn slot(&self, i: usize) -> &[u8] {
        &self.storage[i * self.slot_len..][..self.slot_len]
    }

    /// Receives up to [`count`](Self::count) messages with one non-blocking `recvmmsg`,
    /// message `i` into slot `i`, its metadata into `out[i]`. Returns the number received;
    /// `WouldBlock` when there is none.
    pub(crate) fn recvmmsg(&mut self, fd: BorrowedFd<'_>, out: &mut [RawMeta]) -> io::Result<usize> {
        self.rearm();
        let count = self.count().min(out.len());
        let received = loop {
            // The kernel may write the headers it tries, and those alone.
            self.dirty = count;
            // SAFETY: `hdrs[..count]` point at `names`, `_iovs`, `_ctrls` and disjoint
            // `slot_len`-byte chunks of `storage`, all owned by `self` (borrowed mutably for
            // this call); every length is its buffer's capacity, so the kernel writes within
            // them.
            let rc = unsafe {
                libc::recvmmsg(
                    fd.as_raw_fd(),
                    self.hdrs.as_mut_ptr(),
                    count as _,
                    libc::MSG_DONTWAIT as _,
                    ptr::null_mut(),
                )
            };
            if rc >= 0 {
                break rc as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                // Nothing was received: only the first header was tried.
                self.dirty = 1;
                return Err(e);
            }
            self.rearm();
        };
        // A call that returns `received` messages tried one more at most.
        self.dirty = (received + 1).min(count);
        for (i, meta) in out.iter_mut().enumerate().take(received) {
            let h = &self.hdrs[i].msg_hdr;
            let mut m = RawMeta::EMPTY;
            m.len = self.hdrs[i].msg_len as usize;
            m.truncated = h.msg_flags & libc::MSG_TRUNC != 0;
            m.ctrl_truncated = h.msg_flags & libc::MSG_CTRUNC != 0;
            m.source = decode_addr(&self.names[i], h.msg_namelen as usize);
            decode_cmsgs(h, &mut m);
            *meta = m;
        }
        Ok(received)
    }
}

/// The source address the kernel wrote into `ss`: its first `len` bytes (`msg_namelen`).
fn decode_addr(ss: &MaybeUninit<libc::sockaddr_storage>, len: usize) -> Option<SocketAddr> {
    let p = ss.as_ptr();
    if len < mem::size_of::<libc::sa_family_t>() || len > mem::size_of::<libc::sockaddr_storage>() {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of the name, which include the family field at
    // its start; `read_unaligned` needs no alignment.
    let family = unsafe { ptr::read_unaligned(ptr::addr_of!((*p).ss_family)) };
    match c_int::from(family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the kernel wrote a `sockaddr_in`, and `len` says all
            // of it; `read_unaligned` needs no alignment.
            let sin = unsafe { ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            Some(
                SocketAddrV4::new(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()), u16::from_be(sin.sin_port)).into(),
            )
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for `sockaddr_in6`.
            let sin6 = unsafe { ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
            Some(
                SocketAddrV6::new(
                    Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                    u16::from_be(sin6.sin6_port),
                    u32::from_be(sin6.sin6_flowinfo),
                    sin6.sin6_scope_id,
                )
                .into(),
            )
        }
        _ => None,
    }
}

/// Walks the control messages of a received message.
fn decode_cmsgs(h: &libc::msghdr, meta: &mut RawMeta) {
    if h.msg_control.is_null() {
        return;
    }
    // SAFETY: `h.msg_control` points at our `CmsgBuf`, and the kernel set
    // `h.msg_controllen` to the bytes it wrote there (at most the buffer's length).
    // CMSG_FIRSTHDR returns null or a header that fits within `msg_controllen`.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(h) };
    #[allow(clippy::unnecessary_cast)] // `size_t` on glibc, `socklen_t` on musl
    let end = (h.msg_control as usize).saturating_add(h.msg_controllen as usize);
    while !c.is_null() {
        // SAFETY: `c` is non-null, so CMSG_FIRSTHDR/CMSG_NXTHDR checked that a whole
        // `cmsghdr` lies within the control buffer.
        let header = unsafe { ptr::read_unaligned(c) };
        // SAFETY: CMSG_DATA is pointer arithmetic within the same message.
        let data = unsafe { libc::CMSG_DATA(c) }.cast_const();
        // The kernel never claims more than it wrote, but trust only what lies in the
        // buffer.
        let data_len = (header.cmsg_len as usize).saturating_sub(cmsg_len(0)).min(end.saturating_sub(data as usize));
        match (header.cmsg_level, header.cmsg_type) {
            (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                if let Some(p) = read_data::<libc::in_pktinfo>(data, data_len) {
                    meta.dst_ip = Some(IpAddr::V4(Ipv4Addr::from(p.ipi_addr.s_addr.to_ne_bytes())));
                    meta.ifindex = p.ipi_ifindex as u32;
                }
            }
            (libc::IPPROTO_IP, libc::IP_TTL) => {
                meta.hop_limit = read_data::<c_int>(data, data_len).map(|v| v as u8);
            }
            (libc::IPPROTO_IP, libc::IP_TOS) => {
                meta.traffic_class = read_data::<u8>(data, data_len);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                if let Some(p) = read_data::<libc::in6_pktinfo>(data, data_len) {
                    meta.dst_ip = Some(IpAddr::V6(Ipv6Addr::from(p.ipi6_addr.s6_addr)));
                    meta.ifindex = p.ipi6_ifindex;
                }
            }
            (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                meta.hop_limit = read_data::<c_int>(data, data_len).map(|v| v as u8);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                meta.traffic_class = read_data::<c_int>(data, data_len).map(|v| v as u8);
            }
            (libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO) => {
                // Network order: traffic class and flow label; keep the 20-bit label.
                meta.flow_label = read_data::<u32>(data, data_len).map(|v| u32::from_be(v) & 0x000f_ffff);
            }
            (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                meta.drops = read_data::<u32>(data, data_len);
            }
            (libc::SOL_UDP, libc::UDP_GRO) => {
                meta.gro_segment = read_data::<c_int>(data, data_len).and_then(|v| usize::try_from(v).ok());
            }
            _ => {}
        }
        // SAFETY: `h` and `c` are as above; CMSG_NXTHDR returns null at the end of the
        // `msg_controllen` bytes instead of walking past them.
        c = unsafe { libc::CMSG_NXTHDR(h, c) };
    }
}

/// Reads a `T` from control-message data of `data_len` bytes, if it holds one.
fn read_data<T: Pod>(data: *const u8, data_len: usize) -> Option<T> {
    if data_len < mem::size_of::<T>() {
        return None;
    }
    // SAFETY: `data` points at `data_len >= size_of::<T>()` bytes inside the control
    // buffer (the caller took both from a header CMSG_FIRSTHDR/NXTHDR vouched for), and
    // `T: Pod` accepts any bit pattern; `read_unaligned` needs no alignment.
    Some(unsafe { ptr::read_unaligned(data.cast::<T>()) })
}

/// Attaches a classic-BPF program to the reuseport group of `fd`
/// (`SO_ATTACH_REUSEPORT_CBPF`), replacing the group's previous program. Needs no
/// capability. `code` holds `(code, jt, jf, k)` instructions.
pub(crate) fn attach_reuseport_cbpf(fd: BorrowedFd<'_>, code: &[(u16, u8, u8, u32)]) -> io::Result<()> {
    attach_cbpf(fd, libc::SO_ATTACH_REUSEPORT_CBPF, code)
}

/// Attaches a classic-BPF socket filter (`SO_ATTACH_FILTER`): the socket receives only
/// what it accepts, and it sees the UDP header at offset 0.
pub(crate) fn attach_filter(fd: BorrowedFd<'_>, code: &[(u16, u8, u8, u32)]) -> io::Result<()> {
    attach_cbpf(fd, libc::SO_ATTACH_FILTER, code)
}

fn attach_cbpf(fd: BorrowedFd<'_>, option: c_int, code: &[(u16, u8, u8, u32)]) -> io::Result<()> {
    let mut filters: Vec<libc::sock_filter> =
        code.iter().map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k }).collect();
    let len = u16::try_from(filters.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let prog = libc::sock_fprog { len, filter: filters.as_mut_ptr() };
    // SAFETY: `fd` is open for the borrow; `prog` points at `len` live `sock_filter`s in
    // `filters`, which outlives the call; the kernel copies the program during the call and
    // keeps no pointer to it. The option length is the size of `prog`.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&raw const prog).cast::<c_void>(),
            mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Puts the file `with` refers to in place of `target`'s (`dup3`, close-on-exec): the
/// descriptor number stays, what it names changes at once for every thread.
pub(crate) fn replace_fd(target: BorrowedFd<'_>, with: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: both descriptors are open for their borrows; `dup3` closes the file `target`
    // named and makes its number name `with`'s file, which the caller's owner of `target`
    // (a `RoceSocket`) then owns; no memory is touched.
    let rc = unsafe { libc::dup3(with.as_raw_fd(), target.as_raw_fd(), libc::O_CLOEXEC) };
    if rc >= 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The socket filter attached to `fd` (`SO_GET_FILTER`): empty when there is none.
pub(crate) fn filter_of(fd: BorrowedFd<'_>) -> io::Result<Vec<(u16, u8, u8, u32)>> {
    // The option's length counts instructions, not bytes: asked with 0, the kernel says
    // how many there are.
    let mut count: libc::socklen_t = 0;
    // SAFETY: `fd` is open for the borrow; with a length of 0 the kernel writes nothing
    // through the (null) value pointer and only the length, a live local.
    let rc = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_GET_FILTER, ptr::null_mut(), &raw mut count)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    let mut code = vec![libc::sock_filter { code: 0, jt: 0, jf: 0, k: 0 }; count as usize];
    let mut len = count;
    // SAFETY: `code` holds `count` `sock_filter`s, as many as the length tells the kernel
    // it may write; it outlives the call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_GET_FILTER,
            code.as_mut_ptr().cast::<c_void>(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    code.truncate(len as usize);
    Ok(code.iter().map(|f| (f.code, f.jt, f.jf, f.k)).collect())
}

/// Whether `fd`'s filters are locked (`SO_LOCK_FILTER`): nobody holding it can replace its
/// socket filter or, through it, its group's steering program.
pub(crate) fn filter_locked(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut value: c_int = 0;
    let mut len = mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: `fd` is open for the borrow; the kernel writes at most `len` bytes into the
    // `c_int` on our stack, whose exact size `len` holds.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LOCK_FILTER,
            ptr::from_mut(&mut value).cast::<c_void>(),
            &raw mut len,
        )
    };
    if rc == 0 { Ok(value != 0) } else { Err(io::Error::last_os_error()) }
}
