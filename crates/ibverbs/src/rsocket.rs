//! librdmacm's rsockets (`<rdma/rsocket.h>`: `rsocket`, `rbind`, ..., `rpoll`, `riomap`)
//! over [`softrdma::rsocket::RSocket`], which speaks rdma-core's rsocket protocol. Each is
//! exported as `softrdma_rdmacm_<name>@@SOFTRDMA_PRIVATE_1`, the target of
//! `librdmacm.so.1`'s `<name>@@RDMACM_1.x` jump (crates/rdmacm).
//!
//! A socket's number is its CM event channel's descriptor, as in rdma-core: it never
//! collides with another open file, so `rpoll` takes rsockets and ordinary descriptors in
//! one array (librspreload's `poll` and `select` pass such mixes).
//!
//! Stream sockets only: `SOCK_DGRAM` (UD rsockets) fails with `ENOTSUP`, as every other
//! domain and type does (librspreload then makes an ordinary socket).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::os::fd::BorrowedFd;
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use softrdma::rsocket::{MsgFlags, PollItem, PollTarget, RSocket};

use crate::errno;
use crate::guard;
use crate::rdmacm::{sockaddr_from, sockaddr_to};

/// `SOL_RDMA` and its options (`<rdma/rsocket.h>`).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

/// Every open rsocket by number.
static SOCKETS: Mutex<BTreeMap<c_int, Arc<RSocket>>> = Mutex::new(BTreeMap::new());

fn get(s: c_int) -> Option<Arc<RSocket>> {
    SOCKETS.lock().unwrap_or_else(PoisonError::into_inner).get(&s).cloned()
}

fn fail(e: &softrdma::Error) -> c_int {
    errno::fail(e);
    -1
}

fn fail_with(n: c_int) -> c_int {
    errno::set(n);
    -1
}

/// Runs `f` on socket `s`, or fails with `EBADF`.
fn with<T: Copy>(s: c_int, bad: T, f: impl FnOnce(&RSocket) -> T) -> T {
    guard(bad, || match get(s) {
        Some(rs) => f(&rs),
        None => {
            errno::set(libc::EBADF);
            bad
        }
    })
}

fn msg_flags(flags: c_int) -> MsgFlags {
    MsgFlags {
        dontwait: flags & libc::MSG_DONTWAIT != 0,
        peek: flags & libc::MSG_PEEK != 0,
        waitall: flags & libc::MSG_WAITALL != 0,
    }
}

fn len_result(r: softrdma::Result<usize>) -> isize {
    match r {
        Ok(n) => n as isize,
        Err(e) => fail(&e) as isize,
    }
}

/// Writes `a` to a caller's `sockaddr` of `*len` bytes, truncated, and the full length to
/// `*len` (`rs_copy_addr`).
///
/// # Safety
/// `addr` must be NULL or hold `*len` bytes; `len` NULL or valid.
unsafe fn copy_addr(a: Option<std::net::SocketAddr>, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    if addr.is_null() || len.is_null() {
        return fail_with(libc::EFAULT);
    }
    let Some(a) = a else { return fail_with(libc::ENOTCONN) };
    let (st, full) = sockaddr_from(a);
    // SAFETY: the caller's length.
    let room = unsafe { *len } as usize;
    // SAFETY: at most `room` bytes into the caller's buffer, from our storage of `full`.
    unsafe {
        ptr::copy_nonoverlapping((&raw const st).cast::<u8>(), addr.cast::<u8>(), room.min(full as usize));
        *len = full;
    }
    0
}

/// Makes `rs` reachable by its number, which it returns.
fn register(rs: RSocket) -> c_int {
    let fd = rs.fd();
    SOCKETS.lock().unwrap_or_else(PoisonError::into_inner).insert(fd, Arc::new(rs));
    fd
}

unsafe extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    guard(-1, || {
        if (domain != libc::AF_INET && domain != libc::AF_INET6)
            || ty != libc::SOCK_STREAM
            || (protocol != 0 && protocol != libc::IPPROTO_TCP)
        {
            return fail_with(libc::ENOTSUP);
        }
        RSocket::new().map_or_else(|e| fail(&e), register)
    })
}
export!("softrdma_rdmacm_rsocket", "SOFTRDMA_PRIVATE_1", rsocket);

unsafe extern "C" fn rbind(s: c_int, addr: *const libc::sockaddr, _len: libc::socklen_t) -> c_int {
    with(s, -1, |rs| {
        // SAFETY: the caller's address, of the family it says.
        let Some(a) = (unsafe { sockaddr_to(addr) }) else { return fail_with(libc::EINVAL) };
        rs.bind(a).map_or_else(|e| fail(&e), |()| 0)
    })
}
export!("softrdma_rdmacm_rbind", "SOFTRDMA_PRIVATE_1", rbind);

unsafe extern "C" fn rlisten(s: c_int, backlog: c_int) -> c_int {
    with(s, -1, |rs| rs.listen(backlog.max(1) as u32).map_or_else(|e| fail(&e), |()| 0))
}
export!("softrdma_rdmacm_rlisten", "SOFTRDMA_PRIVATE_1", rlisten);

unsafe extern "C" fn raccept(s: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    with(s, -1, |rs| match rs.accept() {
        Ok(new) => {
            if !addr.is_null() && !len.is_null() {
                // SAFETY: the caller's buffer and length.
                unsafe { copy_addr(new.peer_addr(), addr, len) };
            }
            register(new)
        }
        Err(e) => fail(&e),
    })
}
export!("softrdma_rdmacm_raccept", "SOFTRDMA_PRIVATE_1", raccept);

unsafe extern "C" fn rconnect(s: c_int, addr: *const libc::sockaddr, _len: libc::socklen_t) -> c_int {
    with(s, -1, |rs| {
        // SAFETY: the caller's address.
        let Some(a) = (unsafe { sockaddr_to(addr) }) else { return fail_with(libc::EINVAL) };
        rs.connect(a).map_or_else(|e| fail(&e), |()| 0)
    })
}
export!("softrdma_rdmacm_rconnect", "SOFTRDMA_PRIVATE_1", rconnect);

unsafe extern "C" fn rshutdown(s: c_int, how: c_int) -> c_int {
    with(s, -1, |rs| {
        let (read, write) = match how {
            libc::SHUT_RD => (true, false),
            libc::SHUT_WR => (false, true),
            libc::SHUT_RDWR => (true, true),
            _ => return fail_with(libc::EINVAL),
        };
        rs.shutdown(read, write).map_or_else(|e| fail(&e), |()| 0)
    })
}
export!("softrdma_rdmacm_rshutdown", "SOFTRDMA_PRIVATE_1", rshutdown);

unsafe extern "C" fn rclose(s: c_int) -> c_int {
    guard(-1, || {
        let rs = SOCKETS.lock().unwrap_or_else(PoisonError::into_inner).remove(&s);
        let Some(rs) = rs else { return fail_with(libc::EBADF) };
        // A graceful end for the peer (its reads see the end of the stream); the last
        // reference dropped destroys the connection (DREQ).
        let _ = rs.shutdown(true, true);
        0
    })
}
export!("softrdma_rdmacm_rclose", "SOFTRDMA_PRIVATE_1", rclose);

/// A caller's buffer as a slice (empty for NULL or 0 bytes).
///
/// # Safety
/// `buf` must be NULL or hold `len` bytes, not used elsewhere during the call.
unsafe fn buf_mut<'a>(buf: *mut c_void, len: usize) -> &'a mut [u8] {
    if buf.is_null() || len == 0 {
        return &mut [];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
}

/// # Safety
/// `buf` must be NULL or hold `len` bytes.
unsafe fn buf_ref<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    if buf.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(buf.cast(), len) }
}

unsafe extern "C" fn rrecv(s: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    // SAFETY: the caller's buffer.
    with(s, -1, |rs| len_result(rs.recv_with(unsafe { buf_mut(buf, len) }, msg_flags(flags))))
}
export!("softrdma_rdmacm_rrecv", "SOFTRDMA_PRIVATE_1", rrecv);

unsafe extern "C" fn rread(s: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: as rrecv.
    unsafe { rrecv(s, buf, len, 0) }
}
export!("softrdma_rdmacm_rread", "SOFTRDMA_PRIVATE_1", rread);

unsafe extern "C" fn rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    srclen: *mut libc::socklen_t,
) -> isize {
    // SAFETY: as rrecv.
    let n = unsafe { rrecv(s, buf, len, flags) };
    if n > 0 && !src.is_null() {
        // SAFETY: the caller's address buffer.
        with(s, -1, |rs| unsafe { copy_addr(rs.peer_addr(), src, srclen) });
    }
    n
}
export!("softrdma_rdmacm_rrecvfrom", "SOFTRDMA_PRIVATE_1", rrecvfrom);

/// Reads into the iovecs in order (rdma-core fills only the first).
///
/// # Safety
/// `iov` must hold `cnt` valid iovecs.
unsafe fn recvv(s: c_int, iov: *const libc::iovec, cnt: c_int, flags: c_int) -> isize {
    if cnt <= 0 || iov.is_null() {
        return 0;
    }
    // SAFETY: the caller's array.
    let iovs = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    let first = iovs.iter().find(|v| v.iov_len > 0);
    match first {
        // SAFETY: the caller's buffer.
        Some(v) => unsafe { rrecv(s, v.iov_base, v.iov_len, flags) },
        None => 0,
    }
}

unsafe extern "C" fn rreadv(s: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the caller's iovecs.
    unsafe { recvv(s, iov, cnt, 0) }
}
export!("softrdma_rdmacm_rreadv", "SOFTRDMA_PRIVATE_1", rreadv);

unsafe extern "C" fn rrecvmsg(s: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    // SAFETY: the caller's msghdr.
    let Some(m) = (unsafe { msg.as_ref() }) else { return fail_with(libc::EFAULT) as isize };
    if !m.msg_control.is_null() && m.msg_controllen > 0 {
        return fail_with(libc::ENOTSUP) as isize;
    }
    // SAFETY: its iovecs.
    unsafe { recvv(s, m.msg_iov, m.msg_iovlen as c_int, flags) }
}
export!("softrdma_rdmacm_rrecvmsg", "SOFTRDMA_PRIVATE_1", rrecvmsg);

unsafe extern "C" fn rsend(s: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    // SAFETY: the caller's buffer.
    with(s, -1, |rs| len_result(rs.send_with(unsafe { buf_ref(buf, len) }, msg_flags(flags))))
}
export!("softrdma_rdmacm_rsend", "SOFTRDMA_PRIVATE_1", rsend);

unsafe extern "C" fn rwrite(s: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: as rsend.
    unsafe { rsend(s, buf, len, 0) }
}
export!("softrdma_rdmacm_rwrite", "SOFTRDMA_PRIVATE_1", rwrite);

unsafe extern "C" fn rsendto(
    s: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const libc::sockaddr,
    dstlen: libc::socklen_t,
) -> isize {
    if !dst.is_null() || dstlen != 0 {
        return fail_with(libc::EISCONN) as isize;
    }
    // SAFETY: as rsend.
    unsafe { rsend(s, buf, len, flags) }
}
export!("softrdma_rdmacm_rsendto", "SOFTRDMA_PRIVATE_1", rsendto);

/// # Safety
/// `iov` must hold `cnt` valid iovecs.
unsafe fn sendv(s: c_int, iov: *const libc::iovec, cnt: c_int, flags: c_int) -> isize {
    if cnt <= 0 || iov.is_null() {
        return 0;
    }
    // SAFETY: the caller's array and buffers.
    let iovs = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    // SAFETY: each the caller's buffer.
    let bufs: Vec<&[u8]> = iovs.iter().map(|v| unsafe { buf_ref(v.iov_base, v.iov_len) }).collect();
    with(s, -1, |rs| len_result(rs.sendv(&bufs, msg_flags(flags))))
}

unsafe extern "C" fn rwritev(s: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: the caller's iovecs.
    unsafe { sendv(s, iov, cnt, 0) }
}
export!("softrdma_rdmacm_rwritev", "SOFTRDMA_PRIVATE_1", rwritev);

unsafe extern "C" fn rsendmsg(s: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    // SAFETY: the caller's msghdr.
    let Some(m) = (unsafe { msg.as_ref() }) else { return fail_with(libc::EFAULT) as isize };
    if !m.msg_control.is_null() && m.msg_controllen > 0 {
        return fail_with(libc::ENOTSUP) as isize;
    }
    // SAFETY: its iovecs.
    unsafe { sendv(s, m.msg_iov, m.msg_iovlen as c_int, flags) }
}
export!("softrdma_rdmacm_rsendmsg", "SOFTRDMA_PRIVATE_1", rsendmsg);

/// `rpoll` over a Rust slice of `pollfd`s.
fn poll_fds(fds: &mut [libc::pollfd], timeout_ms: c_int) -> c_int {
    let sockets: Vec<Option<Arc<RSocket>>> = fds.iter().map(|p| get(p.fd)).collect();
    let mut items: Vec<PollItem<'_>> = fds
        .iter()
        .zip(&sockets)
        .map(|(p, s)| {
            let target = match s {
                Some(rs) => PollTarget::Socket(rs),
                None if p.fd < 0 => PollTarget::None,
                // SAFETY: the caller's descriptor, polled during this call only (a closed one
                // reports POLLNVAL, as poll(2) does).
                None => PollTarget::Fd(unsafe { BorrowedFd::borrow_raw(p.fd) }),
            };
            PollItem { target, events: p.events, revents: 0 }
        })
        .collect();
    let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
    match softrdma::rsocket::poll(&mut items, timeout) {
        Ok(n) => {
            for (p, it) in fds.iter_mut().zip(&items) {
                p.revents = it.revents;
            }
            n as c_int
        }
        Err(e) => fail(&e),
    }
}

unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    guard(-1, || {
        let fds: &mut [libc::pollfd] = if fds.is_null() || nfds == 0 {
            &mut []
        } else {
            // SAFETY: the caller's array of nfds entries.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        poll_fds(fds, timeout)
    })
}
export!("softrdma_rdmacm_rpoll", "SOFTRDMA_PRIVATE_1", rpoll);

unsafe extern "C" fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    guard(-1, || {
        // SAFETY: each set is NULL or the caller's, and fd < nfds <= FD_SETSIZE.
        let isset = |set: *mut libc::fd_set, fd: c_int| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
        let mut fds: Vec<libc::pollfd> = Vec::new();
        for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
            let mut events = 0;
            if isset(readfds, fd) {
                events |= libc::POLLIN;
            }
            if isset(writefds, fd) {
                events |= libc::POLLOUT;
            }
            if events != 0 || isset(exceptfds, fd) {
                fds.push(libc::pollfd { fd, events, revents: 0 });
            }
        }
        // SAFETY: the caller's timeval, if any.
        let ms = match unsafe { timeout.as_ref() } {
            None => -1,
            Some(t) => (t.tv_sec * 1000 + t.tv_usec / 1000).clamp(0, c_int::MAX as i64) as c_int,
        };
        let ret = poll_fds(&mut fds, ms);
        for set in [readfds, writefds, exceptfds] {
            if !set.is_null() {
                // SAFETY: the caller's set.
                unsafe { libc::FD_ZERO(set) };
            }
        }
        if ret <= 0 {
            return ret;
        }
        let mut cnt = 0;
        for p in &fds {
            // SAFETY: the caller's sets, fd < nfds.
            unsafe {
                if !readfds.is_null() && p.revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                    libc::FD_SET(p.fd, readfds);
                    cnt += 1;
                }
                if !writefds.is_null() && p.revents & libc::POLLOUT != 0 {
                    libc::FD_SET(p.fd, writefds);
                    cnt += 1;
                }
                if !exceptfds.is_null() && p.revents & !(libc::POLLIN | libc::POLLOUT) != 0 {
                    libc::FD_SET(p.fd, exceptfds);
                    cnt += 1;
                }
            }
        }
        cnt
    })
}
export!("softrdma_rdmacm_rselect", "SOFTRDMA_PRIVATE_1", rselect);

unsafe extern "C" fn rsetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    with(s, -1, |rs| {
        if level == SOL_RDMA && name == RDMA_ROUTE {
            return 0; // a path from rdma_getaddrinfo: RoCE resolves its own
        }
        if val.is_null() || (len as usize) < size_of::<c_int>() {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: the caller's value of at least an int (checked above).
        let v = unsafe { val.cast::<c_int>().read_unaligned() };
        let mut sizes = rs.sizes();
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_RCVBUF) | (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                let bytes = (v.max(0) as u32).saturating_mul(2);
                if name == libc::SO_RCVBUF {
                    sizes.rbuf = bytes;
                } else {
                    sizes.sbuf = bytes;
                }
                // Once connected the buffers stay (rdma-core ignores it too).
                let _ = rs.set_sizes(sizes);
                0
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => rs.set_keepalive(v != 0).map_or_else(|e| fail(&e), |()| 0),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => rs.set_keepalive_idle(v).map_or_else(|e| fail(&e), |()| 0),
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_OOBINLINE | libc::SO_LINGER)
            | (libc::IPPROTO_TCP, libc::TCP_NODELAY | libc::TCP_MAXSEG)
            // Accepted and not needed: the connection's own retries say when a keepalive
            // went unanswered (rdma-core ignores them too).
            | (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL)
            | (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
                rs.set_option(level, name, v);
                0
            }
            (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE) => {
                let v = v.max(0) as u32;
                match name {
                    RDMA_SQSIZE => sizes.sq = v,
                    RDMA_RQSIZE => sizes.rq = v,
                    RDMA_INLINE => sizes.inline = v,
                    _ => sizes.iomap = v,
                }
                rs.set_sizes(sizes).map_or_else(|e| fail(&e), |()| 0)
            }
            _ => fail_with(libc::ENOTSUP),
        }
    })
}
export!("softrdma_rdmacm_rsetsockopt", "SOFTRDMA_PRIVATE_1", rsetsockopt);

unsafe extern "C" fn rgetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    with(s, -1, |rs| {
        if val.is_null() || len.is_null() {
            return fail_with(libc::EFAULT);
        }
        let sizes = rs.sizes();
        let v: c_int = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => rs.take_error(),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => sizes.rbuf as c_int,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => sizes.sbuf as c_int,
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => c_int::from(rs.keepalive()),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => rs.keepalive_idle().min(c_int::MAX as u32) as c_int,
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_OOBINLINE)
            | (libc::IPPROTO_TCP, libc::TCP_NODELAY)
            | (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => c_int::from(rs.option(level, name) != 0),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 2048,
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => 1,
            (SOL_RDMA, RDMA_SQSIZE) => sizes.sq as c_int,
            (SOL_RDMA, RDMA_RQSIZE) => sizes.rq as c_int,
            (SOL_RDMA, RDMA_INLINE) => sizes.inline as c_int,
            (SOL_RDMA, RDMA_IOMAPSIZE) => sizes.iomap as c_int,
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                // SAFETY: the caller's length.
                if (unsafe { *len } as usize) < size_of::<libc::linger>() {
                    return fail_with(libc::EINVAL);
                }
                let l = libc::linger { l_onoff: c_int::from(rs.option(level, name) == 0), l_linger: 0 };
                // SAFETY: the caller's buffer, big enough (checked above).
                unsafe {
                    val.cast::<libc::linger>().write_unaligned(l);
                    *len = size_of::<libc::linger>() as libc::socklen_t;
                }
                return 0;
            }
            _ => return fail_with(libc::ENOTSUP),
        };
        // SAFETY: the caller's length.
        if (unsafe { *len } as usize) < size_of::<c_int>() {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: the caller's buffer, of an int at least (checked above).
        unsafe {
            val.cast::<c_int>().write_unaligned(v);
            *len = size_of::<c_int>() as libc::socklen_t;
        }
        0
    })
}
export!("softrdma_rdmacm_rgetsockopt", "SOFTRDMA_PRIVATE_1", rgetsockopt);

/// `rfcntl(socket, cmd, ...)`: `F_GETFL` and `F_SETFL` (`O_NONBLOCK`). The variadic
/// argument is read as the int `F_SETFL` passes (the x86-64 and AArch64 calling
/// conventions pass it where a third fixed argument goes).
unsafe extern "C" fn rfcntl(s: c_int, cmd: c_int, arg: c_int) -> c_int {
    with(s, -1, |rs| match cmd {
        libc::F_GETFL => {
            if rs.nonblocking() {
                libc::O_NONBLOCK
            } else {
                0
            }
        }
        libc::F_SETFL => {
            rs.set_nonblocking(arg & libc::O_NONBLOCK != 0);
            0
        }
        _ => fail_with(libc::ENOTSUP),
    })
}
export!("softrdma_rdmacm_rfcntl", "SOFTRDMA_PRIVATE_1", rfcntl);

unsafe extern "C" fn rgetpeername(s: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    // SAFETY: the caller's buffer and length.
    with(s, -1, |rs| unsafe { copy_addr(rs.peer_addr(), addr, len) })
}
export!("softrdma_rdmacm_rgetpeername", "SOFTRDMA_PRIVATE_1", rgetpeername);

unsafe extern "C" fn rgetsockname(s: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    // SAFETY: the caller's buffer and length.
    with(s, -1, |rs| unsafe { copy_addr(rs.local_addr(), addr, len) })
}
export!("softrdma_rdmacm_rgetsockname", "SOFTRDMA_PRIVATE_1", rgetsockname);

unsafe extern "C" fn riomap(
    s: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    with(s, -1, |rs| {
        if prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 || buf.is_null() {
            return fail_with(libc::EINVAL) as libc::off_t;
        }
        let at = if offset == -1 { None } else { Some(offset as u64) };
        if prot & libc::PROT_WRITE == 0 {
            // Mapped for this side only: nothing to publish.
            return at.unwrap_or(buf as usize as u64) as libc::off_t;
        }
        // SAFETY: riomap(3)'s contract: the buffer stays mapped until riounmap or rclose,
        // and the application expects the peer to write it meanwhile.
        match unsafe { rs.iomap(buf.cast(), len, at) } {
            Ok(o) => o as libc::off_t,
            Err(e) => fail(&e) as libc::off_t,
        }
    })
}
export!("softrdma_rdmacm_riomap", "SOFTRDMA_PRIVATE_1", riomap);

unsafe extern "C" fn riounmap(s: c_int, buf: *mut c_void, len: usize) -> c_int {
    with(s, -1, |rs| rs.iounmap(buf.cast(), len).map_or_else(|e| fail(&e), |()| 0))
}
export!("softrdma_rdmacm_riounmap", "SOFTRDMA_PRIVATE_1", riounmap);

unsafe extern "C" fn riowrite(s: c_int, buf: *const c_void, count: usize, offset: libc::off_t, flags: c_int) -> usize {
    with(s, usize::MAX, |rs| {
        // SAFETY: the caller's buffer.
        let data = unsafe { buf_ref(buf, count) };
        match rs.iowrite(data, offset as u64, msg_flags(flags)) {
            Ok(n) => n,
            Err(e) => fail(&e) as isize as usize,
        }
    })
}
export!("softrdma_rdmacm_riowrite", "SOFTRDMA_PRIVATE_1", riowrite);
