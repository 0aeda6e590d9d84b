//! librdmacm's `rdma_*` calls over softrdma's connection manager ([`softrdma::CmId`],
//! [`softrdma::EventChannel`]).
//!
//! They live here, in `libibverbs.so.1`, because the objects librdmacm hands out must be
//! this library's own: `rdma_cm_id.verbs` is an `ibv_context` of ours (one per device,
//! [`cm_context`]), `id->pd`, `id->qp`, `id->send_cq`, ... are our `ibv_pd`, `ibv_qp`,
//! `ibv_cq`, so `ibv_*` calls and the header inlines (`rdma_post_send`,
//! `rdma_get_recv_comp`, ...) work on them. Each is exported as
//! `softrdma_rdmacm_<name>@@SOFTRDMA_PRIVATE_1`; `librdmacm.so.1` (crates/rdmacm) is only a
//! table of `rdma_<name>@@RDMACM_1.x` jumps to them, so one process has one softrdma runtime.
//!
//! What softrdma's CM does not do yet fails with `ENOSYS` (never aborts). The rsocket calls
//! are in `rsocket.rs`.

use std::ffi::{CStr, c_char, c_int, c_long, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr;
use std::sync::{Mutex, PoisonError};

use softrdma::{CmEvent, CmEventKind, CmId, CmStatus, ConnParam, EventChannel, PortSpace, QpType};

use crate::abi::*;
use crate::cma_abi::*;
use crate::device::cm_context;
use crate::errno;
use crate::guard;
use crate::objects::{self, PdC, obj};

/// An `rdma_event_channel` and the softrdma channel behind it.
#[repr(C)]
struct ChannelC {
    ch: RdmaEventChannel,
    inner: EventChannel,
}

/// An `rdma_cm_id` and what librdmacm keeps next to it.
#[repr(C)]
struct IdC {
    id: RdmaCmId,
    inner: CmId,
    /// A synchronous ID's own channel (`rdma_create_id` with no channel, `rdma_create_ep`,
    /// `rdma_get_request`): its calls wait for their event.
    own_channel: *mut ChannelC,
    /// Bound to a wildcard address: no device (`verbs` stays NULL).
    wildcard: bool,
    /// A passive endpoint's QP attributes, for the IDs `rdma_get_request` returns.
    init_attr: Option<IbvQpInitAttr>,
    owns_pd: bool,
    owns_send_cq: bool,
    owns_recv_cq: bool,
    /// A connection request's READ/atomic depths as this side sees them (responder
    /// resources, initiator depth): what `rdma_accept(id, NULL)` accepts with, as
    /// librdmacm's `ucma_process_conn_req` keeps them.
    request_depths: Option<(u8, u8)>,
    /// `rdma_set_local_ece`'s vendor ID and options.
    local_ece: (u32, u32),
    /// The multicast groups joined: address, the join's `context` (what its events carry in
    /// `param.ud.private_data`, as librdmacm's), the group's GID.
    mcast: Vec<(SocketAddr, usize, softrdma::Gid)>,
}

/// An `rdma_cm_event` and the private data it points at.
#[repr(C)]
struct EventC {
    ev: RdmaCmEvent,
    private_data: Vec<u8>,
    /// The ID the event counts against until acked ([`pin`]): its own, or for a connect
    /// request the listener's, as in librdmacm.
    pinned: usize,
}

/// Every live ID, to name the `rdma_cm_id` of a softrdma event.
static IDS: Mutex<Vec<(CmId, usize)>> = Mutex::new(Vec::new());

/// Per ID (its `IdC` address), the events made for it and not yet acked. As librdmacm's
/// `rdma_destroy_id`, ours waits until every event of the ID is acked: a thread building or
/// handling an event then never meets a freed ID. (rping's main thread destroys its ID
/// while its CM thread takes the ID's last event: the client crashed once in CI.)
static UNACKED: Mutex<Vec<(usize, u32)>> = Mutex::new(Vec::new());
static ACKED: std::sync::Condvar = std::sync::Condvar::new();

/// One more event of ID `p` is out. Call with [`IDS`] held, so that `p` is live.
fn pin(p: usize) {
    let mut u = UNACKED.lock().unwrap_or_else(PoisonError::into_inner);
    match u.iter_mut().find(|(q, _)| *q == p) {
        Some((_, n)) => *n += 1,
        None => u.push((p, 1)),
    }
}

/// An event of ID `p` was acked.
fn unpin(p: usize) {
    let mut u = UNACKED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(i) = u.iter().position(|(q, _)| *q == p) {
        u[i].1 -= 1;
        if u[i].1 == 0 {
            u.swap_remove(i);
        }
        ACKED.notify_all();
    }
}

/// Waits until every event of ID `p` (no longer in [`IDS`]) is acked.
fn wait_acked(p: usize) {
    let mut u = UNACKED.lock().unwrap_or_else(PoisonError::into_inner);
    while u.iter().any(|(q, _)| *q == p) {
        u = ACKED.wait(u).unwrap_or_else(PoisonError::into_inner);
    }
}

fn fail(e: &softrdma::Error) -> c_int {
    errno::fail(e);
    -1
}

fn fail_with(n: c_int) -> c_int {
    errno::set(n);
    -1
}

/// `ibv_qp_type` of the QPs a port space carries (`rdma_create_id`'s choice).
fn qp_type_of(ps: u32) -> (QpType, u32) {
    if ps == u32::from(PortSpace::UDP.0) || ps == u32::from(PortSpace::IPOIB.0) {
        (QpType::Ud, 4)
    } else {
        (QpType::Rc, 2)
    }
}

/// A C socket address as Rust's.
///
/// # Safety
/// `sa` must be NULL or point at a `sockaddr_in`/`sockaddr_in6` (as its family says).
pub(crate) unsafe fn sockaddr_to(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: per the contract.
    let family = c_int::from(unsafe { sa.as_ref() }?.sa_family);
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let s = unsafe { &*(sa as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(s.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let s = unsafe { &*(sa as *const libc::sockaddr_in6) };
            // The scope too: a link-local address names its interface (device) by it.
            let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
            Some(
                SocketAddrV6::new(ip, u16::from_be(s.sin6_port), u32::from_be(s.sin6_flowinfo), s.sin6_scope_id).into(),
            )
        }
        _ => None,
    }
}

/// `a` as a C socket address, with its length.
pub(crate) fn sockaddr_from(a: SocketAddr) -> (libc::sockaddr_storage, u32) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid (empty) value.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from(*v.ip()).to_be() },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage, which is suitably aligned.
            unsafe { ptr::write((&raw mut st).cast::<libc::sockaddr_in>(), s) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v.port().to_be(),
                sin6_flowinfo: v.flowinfo().to_be(),
                sin6_addr: libc::in6_addr { s6_addr: v.ip().octets() },
                sin6_scope_id: v.scope_id(),
            };
            // SAFETY: as above.
            unsafe { ptr::write((&raw mut st).cast::<libc::sockaddr_in6>(), s) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (st, len as u32)
}

/// The protection domain librdmacm gives every ID of device `verbs` (`cma_device.pd`, which
/// `ucma_get_device` sets as `id->pd`): one per device context, made on first use and kept
/// for the process's life, as the context. Programs make their QPs and MRs in it (UCX's
/// rdmacm transport creates a UD QP there to reserve a QPN); `rdma_create_qp` with a NULL
/// PD uses it. NULL if it cannot be made.
fn cm_pd(verbs: *mut IbvContext) -> *mut IbvPd {
    static PDS: std::sync::OnceLock<Mutex<std::collections::HashMap<usize, usize>>> = std::sync::OnceLock::new();
    let mut map = PDS.get_or_init(Default::default).lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&pd) = map.get(&(verbs as usize)) {
        return pd as *mut IbvPd;
    }
    // SAFETY: verbs is one of cm_context's contexts, never closed.
    let pd = unsafe { objects::alloc_pd(verbs) };
    if !pd.is_null() {
        map.insert(verbs as usize, pd as usize);
    }
    pd
}

/// Fills what the application reads of an ID from softrdma's: `verbs`, `port_num`, `pd`,
/// the addresses.
fn refresh(i: &mut IdC) {
    if i.id.verbs.is_null() && !i.wildcard {
        if let Some(ctx) = i.inner.context() {
            i.id.verbs = cm_context(&ctx);
            i.id.port_num = 1;
        }
    }
    if i.id.pd.is_null() && !i.id.verbs.is_null() {
        i.id.pd = cm_pd(i.id.verbs);
    }
    if let Some(a) = i.inner.local_addr() {
        i.id.route.addr.src_addr = sockaddr_from(a).0;
    }
    if let Some(a) = i.inner.peer_addr() {
        i.id.route.addr.dst_addr = sockaddr_from(a).0;
    }
}

fn new_channel() -> Result<*mut ChannelC, softrdma::Error> {
    let inner = EventChannel::new()?;
    let ch = RdmaEventChannel { fd: inner.as_fd().as_raw_fd() };
    Ok(Box::into_raw(Box::new(ChannelC { ch, inner })))
}

/// Registers a new `rdma_cm_id` for `inner`, its events on `channel`.
fn new_id(inner: CmId, channel: *mut ChannelC, own: bool, context: *mut c_void, ps: u32) -> *mut IdC {
    // SAFETY: the route is plain data (socket addresses, a NULL path); zero is its empty value.
    let route: RdmaRoute = unsafe { std::mem::zeroed() };
    let id = RdmaCmId {
        verbs: ptr::null_mut(),
        // SAFETY: channel is one of ours (the field is its first member).
        channel: channel.cast(),
        context,
        qp: ptr::null_mut(),
        route,
        ps,
        port_num: 0,
        event: ptr::null_mut(),
        send_cq_channel: ptr::null_mut(),
        send_cq: ptr::null_mut(),
        recv_cq_channel: ptr::null_mut(),
        recv_cq: ptr::null_mut(),
        srq: ptr::null_mut(),
        pd: ptr::null_mut(),
        qp_type: objects::qp_type_raw(inner.qp_type()),
    };
    let key = inner.clone();
    let p = Box::into_raw(Box::new(IdC {
        id,
        inner,
        own_channel: if own { channel } else { ptr::null_mut() },
        wildcard: false,
        init_attr: None,
        owns_pd: false,
        owns_send_cq: false,
        owns_recv_cq: false,
        request_depths: None,
        local_ece: (0, 0),
        mcast: Vec::new(),
    }));
    IDS.lock().unwrap_or_else(PoisonError::into_inner).push((key, p as usize));
    p
}

/// `rdma_cm_event.status` for `s`.
fn status_c(s: CmStatus) -> c_int {
    match s {
        CmStatus::Ok => 0,
        CmStatus::TimedOut => -libc::ETIMEDOUT,
        CmStatus::Rejected(r) => c_int::from(r.0),
        CmStatus::Sidr(s) => c_int::from(s.0),
        CmStatus::AddrNotAvailable => -libc::EADDRNOTAVAIL,
        CmStatus::InvalidQkey => -libc::EINVAL,
        CmStatus::NotAuthenticated => -libc::EKEYREJECTED,
    }
}

/// A softrdma event as an `rdma_cm_event` (made the application's to ack), creating the ID
/// of a connection request on `channel`. `None` for an event of an ID already destroyed.
fn event_c(ev: CmEvent, channel: *mut ChannelC) -> Option<*mut RdmaCmEvent> {
    // The ID the event counts against is found and pinned ([`pin`]) under one hold of IDS:
    // it cannot be destroyed in between, and its destruction then waits for this event's
    // ack. A connect request's new ID counts against its listener, as in librdmacm (a
    // program may reject and destroy the new ID before it acks the request).
    let (listen, found, pinned) = {
        let ids = IDS.lock().unwrap_or_else(PoisonError::into_inner);
        let live = |id: &CmId| ids.iter().find(|(i, _)| i.same(id)).map(|&(_, p)| p as *mut IdC);
        let listen = ev.listen_id.as_ref().and_then(live);
        let found = match (live(&ev.id), listen) {
            (Some(p), _) => Ok(p),
            // SAFETY: l is a live ID of ours (registered, and IDS is held).
            (None, Some(l)) => Err((l, unsafe { ((*l).id.context, (*l).id.ps) })),
            (None, None) => return None,
        };
        let pinned = match found {
            Ok(p) | Err((p, _)) => p as usize,
        };
        pin(pinned);
        (listen, found, pinned)
    };
    let id = match found {
        Ok(p) => p,
        Err((_, (context, ps))) => new_id(ev.id.clone(), channel, false, context, ps),
    };
    // SAFETY: id is a live ID of ours; the application does not use it concurrently with
    // the call that delivers its event.
    refresh(unsafe { &mut *id });
    if let (CmEventKind::ConnectRequest, Some(p)) = (ev.kind, &ev.param) {
        // SAFETY: as above.
        unsafe { (*id).request_depths = Some((p.responder_resources, p.initiator_depth)) };
    }
    let private_data = ev.private_data.clone();
    let mut pd_ptr: *const c_void = if private_data.is_empty() { ptr::null() } else { private_data.as_ptr().cast() };
    if let (CmEventKind::MulticastJoin | CmEventKind::MulticastError, Some(u)) = (ev.kind, &ev.ud) {
        // librdmacm: a join's events carry the join's context in param.ud.private_data.
        // SAFETY: id is a live ID of ours (above).
        if let Some(&(_, context, _)) = unsafe { &(*id).mcast }.iter().find(|m| m.2 == u.ah.dgid) {
            pd_ptr = context as *const c_void;
        }
    }
    let pd_len = u8::try_from(private_data.len()).unwrap_or(u8::MAX);
    let param = match (&ev.ud, &ev.param) {
        (Some(u), _) => RdmaCmEventParam {
            ud: RdmaUdParam {
                private_data: pd_ptr,
                private_data_len: pd_len,
                _pad: [0; 7],
                ah_attr: objects::ah_attr_c(Some(&u.ah)),
                qp_num: u.remote_qpn,
                qkey: u.qkey,
            },
        },
        (None, p) => {
            let p = p.clone().unwrap_or_default();
            RdmaCmEventParam {
                conn: RdmaConnParam {
                    private_data: pd_ptr,
                    private_data_len: pd_len,
                    responder_resources: p.responder_resources,
                    initiator_depth: p.initiator_depth,
                    flow_control: u8::from(p.flow_control),
                    retry_count: p.retry_count,
                    rnr_retry_count: p.rnr_retry_count,
                    srq: u8::from(p.srq),
                    qp_num: p.qp_num,
                },
            }
        }
    };
    let e = RdmaCmEvent {
        id: id.cast(),
        listen_id: listen.map_or(ptr::null_mut(), |l| l.cast()),
        event: ev.kind as u32,
        status: status_c(ev.status),
        param,
    };
    Some(Box::into_raw(Box::new(EventC { ev: e, private_data, pinned })).cast())
}

/// The next event of `ch` as an `rdma_cm_event`, waiting for it.
fn next_event(ch: *mut ChannelC) -> Result<*mut RdmaCmEvent, c_int> {
    // SAFETY: ch is one of ours, alive while its IDs use it.
    let c = unsafe { &*ch };
    // librdmacm reads the channel's fd: made non-blocking (fcntl O_NONBLOCK, for an event
    // loop), an empty channel fails with EAGAIN instead of waiting.
    let wait = crate::would_block(c.ch.fd).then_some(std::time::Duration::ZERO);
    // The wait keeps its own reference: a program may destroy the channel while a thread
    // waits on it (rping's main thread does, its CM thread blocked in rdma_get_cm_event).
    // librdmacm's waiter then stays blocked in read(2) on a file the kernel keeps open for
    // it; ours stays blocked on the queue it holds, never touching the freed channel.
    let inner = c.inner.clone();
    loop {
        match inner.get_cm_event(wait) {
            Ok(Some(ev)) => {
                if let Some(p) = event_c(ev, ch) {
                    return Ok(p);
                }
            }
            Ok(None) if wait.is_some() => return Err(libc::EAGAIN),
            Ok(None) => {}
            Err(e) => return Err(crate::errno::of(&e)),
        }
    }
}

/// Frees an event made by [`event_c`].
///
/// # Safety
/// `e` must come from [`event_c`] and be freed once.
unsafe fn free_event(e: *mut RdmaCmEvent) {
    // SAFETY: per the contract.
    let e = unsafe { Box::from_raw(e.cast::<EventC>()) };
    unpin(e.pinned);
}

/// librdmacm's `ucma_complete`: a synchronous ID waits for its next event (kept in
/// `id->event`) and fails if the event does.
fn complete(i: &mut IdC) -> c_int {
    if i.own_channel.is_null() {
        return 0;
    }
    if !i.id.event.is_null() {
        // SAFETY: the previous event of this synchronous ID, ours.
        unsafe { free_event(i.id.event) };
        i.id.event = ptr::null_mut();
    }
    let e = match next_event(i.own_channel) {
        Ok(e) => e,
        Err(n) => return fail_with(n),
    };
    i.id.event = e;
    // SAFETY: e was just made.
    let (kind, status) = unsafe { ((*e).event, (*e).status) };
    if status == 0 {
        0
    } else if kind == CmEventKind::Rejected as u32 {
        fail_with(libc::ECONNREFUSED)
    } else {
        fail_with(status.abs())
    }
}

/// The ID behind an `rdma_cm_id` we handed out; `None` for NULL and for a pointer that is
/// not a live ID (one already destroyed: perftest 4.5's `-R` retry passes IDs it destroyed,
/// read from an array it freed, which librdmacm dereferences and crashes on; here the call
/// fails with EINVAL).
///
/// # Safety
/// `id` must not be used concurrently by another call.
unsafe fn id_mut<'a>(id: *mut RdmaCmId) -> Option<&'a mut IdC> {
    let live = IDS.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|&(_, p)| p == id as usize);
    // SAFETY: a live ID of ours (checked above); the rdma_cm_id is the first member of its IdC.
    live.then(|| unsafe { id.cast::<IdC>().as_mut() }).flatten()
}

// ---- event channels --------------------------------------------------------------------

unsafe extern "C" fn create_event_channel() -> *mut RdmaEventChannel {
    guard(ptr::null_mut(), || errno::or_null(new_channel(), |c| c.cast()))
}
export!("softrdma_rdmacm_rdma_create_event_channel", "SOFTRDMA_PRIVATE_1", create_event_channel);

unsafe extern "C" fn destroy_event_channel(ch: *mut RdmaEventChannel) {
    guard((), || {
        if !ch.is_null() {
            // SAFETY: made by rdma_create_event_channel, destroyed once.
            drop(unsafe { Box::from_raw(ch.cast::<ChannelC>()) });
        }
    })
}
export!("softrdma_rdmacm_rdma_destroy_event_channel", "SOFTRDMA_PRIVATE_1", destroy_event_channel);

unsafe extern "C" fn get_cm_event(ch: *mut RdmaEventChannel, out: *mut *mut RdmaCmEvent) -> c_int {
    guard(-1, || {
        if ch.is_null() || out.is_null() {
            return fail_with(libc::EINVAL);
        }
        match next_event(ch.cast()) {
            Ok(e) => {
                // SAFETY: the caller's out pointer.
                unsafe { *out = e };
                0
            }
            Err(n) => fail_with(n),
        }
    })
}
export!("softrdma_rdmacm_rdma_get_cm_event", "SOFTRDMA_PRIVATE_1", get_cm_event);

unsafe extern "C" fn ack_cm_event(e: *mut RdmaCmEvent) -> c_int {
    guard(-1, || {
        if e.is_null() {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: made by rdma_get_cm_event, acked once.
        unsafe { free_event(e) };
        0
    })
}
export!("softrdma_rdmacm_rdma_ack_cm_event", "SOFTRDMA_PRIVATE_1", ack_cm_event);

unsafe extern "C" fn event_str(event: c_int) -> *const c_char {
    const NAMES: [&CStr; 16] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    crate::name_in(&NAMES, event, c"UNKNOWN EVENT")
}
export!("softrdma_rdmacm_rdma_event_str", "SOFTRDMA_PRIVATE_1", event_str);

// ---- IDs ---------------------------------------------------------------------------------

unsafe extern "C" fn create_id(
    channel: *mut RdmaEventChannel,
    out: *mut *mut RdmaCmId,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    // SAFETY: the caller's, passed on.
    unsafe { create_id_of(channel, out, context, ps, qp_type_of(ps).0) }
}
export!("softrdma_rdmacm_rdma_create_id", "SOFTRDMA_PRIVATE_1", create_id);

/// `rdma_create_id` for QPs of `qp_type` (librdmacm's `rdma_create_id2`, which
/// `rdma_create_ep` calls with the addrinfo's QP type).
///
/// # Safety
/// As `rdma_create_id`'s arguments.
unsafe fn create_id_of(
    channel: *mut RdmaEventChannel,
    out: *mut *mut RdmaCmId,
    context: *mut c_void,
    ps: u32,
    qp_type: QpType,
) -> c_int {
    guard(-1, || {
        if out.is_null() {
            return fail_with(libc::EINVAL);
        }
        let Ok(port_space) = u16::try_from(ps).map(PortSpace) else {
            return fail_with(libc::EINVAL);
        };
        let (own, ch) = if channel.is_null() {
            match new_channel() {
                Ok(c) => (true, c),
                Err(e) => return fail(&e),
            }
        } else {
            (false, channel.cast::<ChannelC>())
        };
        // SAFETY: ch is one of ours.
        let inner = match unsafe { &*ch }.inner.create_id(port_space, qp_type) {
            Ok(i) => i,
            Err(e) => return fail(&e),
        };
        let p = new_id(inner, ch, own, context, ps);
        // SAFETY: the caller's out pointer.
        unsafe { *out = p.cast() };
        0
    })
}

unsafe extern "C" fn destroy_id(id: *mut RdmaCmId) -> c_int {
    guard(-1, || {
        if id.is_null() {
            return fail_with(libc::EINVAL);
        }
        {
            let mut ids = IDS.lock().unwrap_or_else(PoisonError::into_inner);
            let before = ids.len();
            ids.retain(|&(_, p)| p != id as usize);
            if ids.len() == before {
                return fail_with(libc::EINVAL); // not a live ID (destroyed already)
            }
        }
        // SAFETY: made by new_id, live until now (checked above); no other call uses it
        // (the caller's contract), and no event can be made for it any more (it left IDS).
        let last = unsafe { (*id.cast::<IdC>()).id.event };
        if !last.is_null() {
            // SAFETY: a synchronous ID's last event, ours.
            unsafe { free_event(last) };
        }
        // librdmacm's rdma_destroy_id: wait until the application has acked every event
        // of the ID, which may still be in another thread's hands.
        wait_acked(id as usize);
        // SAFETY: as above, destroyed once.
        let i = unsafe { Box::from_raw(id.cast::<IdC>()) };
        let own = i.own_channel;
        drop(i);
        if !own.is_null() {
            // SAFETY: the ID's own channel, which only it used.
            drop(unsafe { Box::from_raw(own) });
        }
        0
    })
}
export!("softrdma_rdmacm_rdma_destroy_id", "SOFTRDMA_PRIVATE_1", destroy_id);

unsafe extern "C" fn bind_addr(id: *mut RdmaCmId, addr: *mut libc::sockaddr) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; addr is the caller's.
        let (Some(i), Some(a)) = (unsafe { id_mut(id) }, unsafe { sockaddr_to(addr) }) else {
            return fail_with(libc::EINVAL);
        };
        if let Err(e) = i.inner.bind_addr(a) {
            return fail(&e);
        }
        // A loopback address too, as the kernel's rdma_cm (a bind to 127.0.0.1 succeeds with
        // no device): libfabric's verbs provider binds "localhost" to find the devices, and
        // one named there would hide every other (the loopback interface is never its).
        i.wildcard = a.ip().is_unspecified() || a.ip().to_canonical().is_loopback();
        if i.wildcard {
            // librdmacm never closes a device it opened (ucma_put_device frees only the
            // PD), and an ID bound to one device keeps its context here (refresh): the
            // devices of a wildcard bind stay open too. Else the next wildcard bind opens
            // them again (sockets, a progress thread, joining the host's port: milliseconds)
            // while a peer's REQ meets no listener (REJ 8): perftest -R's server listens
            // for its QPs right after destroying the listener of its exchange.
            for ctx in i.inner.contexts() {
                cm_context(&ctx);
            }
        }
        refresh(i);
        0
    })
}
export!("softrdma_rdmacm_rdma_bind_addr", "SOFTRDMA_PRIVATE_1", bind_addr);

unsafe extern "C" fn resolve_addr(
    id: *mut RdmaCmId,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; the addresses are the caller's.
        let (Some(i), src, Some(dst)) =
            (unsafe { id_mut(id) }, unsafe { sockaddr_to(src) }, unsafe { sockaddr_to(dst) })
        else {
            return fail_with(libc::EINVAL);
        };
        if let Err(e) = i.inner.resolve_addr(src, dst) {
            return fail(&e);
        }
        // Resolved, the ID has its device, whatever its bind was.
        i.wildcard = false;
        refresh(i);
        complete(i)
    })
}
export!("softrdma_rdmacm_rdma_resolve_addr", "SOFTRDMA_PRIVATE_1", resolve_addr);

unsafe extern "C" fn resolve_route(id: *mut RdmaCmId, _timeout_ms: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL.
        let Some(i) = (unsafe { id_mut(id) }) else { return fail_with(libc::EINVAL) };
        if let Err(e) = i.inner.resolve_route() {
            return fail(&e);
        }
        complete(i)
    })
}
export!("softrdma_rdmacm_rdma_resolve_route", "SOFTRDMA_PRIVATE_1", resolve_route);

unsafe extern "C" fn listen(id: *mut RdmaCmId, backlog: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL.
        let Some(i) = (unsafe { id_mut(id) }) else { return fail_with(libc::EINVAL) };
        let backlog = u32::try_from(backlog).ok().filter(|&b| b > 0).unwrap_or(1024);
        match i.inner.listen(backlog) {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}
export!("softrdma_rdmacm_rdma_listen", "SOFTRDMA_PRIVATE_1", listen);

/// `rdma_set_option`: the ID options of the kernel's `ucma_set_option_id`, with its checks
/// (the value's size; EINVAL otherwise): `RDMA_OPTION_ID_TOS` (a `uint8_t` traffic class
/// for the route made after it) and `RDMA_OPTION_ID_ACK_TIMEOUT` (a `uint8_t` ACK timeout
/// exponent for an RC ID's QP). `RDMA_OPTION_ID_REUSEADDR`, `RDMA_OPTION_ID_AFONLY` and the
/// IB level's path records are not supported: ENOSYS, as the kernel answers an option it
/// does not know.
unsafe extern "C" fn set_option(
    id: *mut RdmaCmId,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: libc::size_t,
) -> c_int {
    const RDMA_OPTION_ID: c_int = 0;
    const RDMA_OPTION_ID_TOS: c_int = 0;
    const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
    guard(-1, || {
        // SAFETY: id is ours or NULL.
        let Some(i) = (unsafe { id_mut(id) }) else { return fail_with(libc::EINVAL) };
        if level != RDMA_OPTION_ID || !matches!(optname, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT) {
            return fail_with(libc::ENOSYS);
        }
        if optval.is_null() || optlen != 1 {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: optval points at optlen (1) readable bytes (the API's contract).
        let value = unsafe { *optval.cast::<u8>() };
        let set = if optname == RDMA_OPTION_ID_TOS { i.inner.set_tos(value) } else { i.inner.set_ack_timeout(value) };
        match set {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}
export!("softrdma_rdmacm_rdma_set_option", "SOFTRDMA_PRIVATE_1", set_option);

unsafe extern "C" fn migrate_id(id: *mut RdmaCmId, channel: *mut RdmaEventChannel) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL.
        let Some(i) = (unsafe { id_mut(id) }) else { return fail_with(libc::EINVAL) };
        let (ch, own) = if channel.is_null() {
            match new_channel() {
                Ok(c) => (c, true),
                Err(e) => return fail(&e),
            }
        } else {
            (channel.cast::<ChannelC>(), false)
        };
        // SAFETY: ch is one of ours.
        i.inner.migrate(&unsafe { &*ch }.inner);
        let old = std::mem::replace(&mut i.own_channel, if own { ch } else { ptr::null_mut() });
        i.id.channel = ch.cast();
        if !old.is_null() {
            // SAFETY: the ID's previous own channel, which only it used.
            drop(unsafe { Box::from_raw(old) });
        }
        0
    })
}
export!("softrdma_rdmacm_rdma_migrate_id", "SOFTRDMA_PRIVATE_1", migrate_id);

// ---- QPs ---------------------------------------------------------------------------------

/// A completion channel and a CQ of `depth` whose context is the ID, as librdmacm's
/// `ucma_create_cqs` makes them.
fn id_cq(i: &mut IdC, depth: u32) -> Option<(*mut IbvCompChannel, *mut IbvCq)> {
    // SAFETY: verbs is our context.
    let ch = unsafe { objects::create_comp_channel(i.id.verbs) };
    if ch.is_null() {
        return None;
    }
    let depth = c_int::try_from(depth.max(1)).unwrap_or(c_int::MAX);
    let me: *mut RdmaCmId = &raw mut i.id;
    // SAFETY: verbs and ch are ours.
    let cq = unsafe { objects::create_cq(i.id.verbs, depth, me.cast(), ch, 0) };
    if cq.is_null() {
        // SAFETY: made above, unused.
        unsafe { objects::destroy_comp_channel(ch) };
        return None;
    }
    Some((ch, cq))
}

/// The ID's PD (`id->pd`), allocated (and owned by the ID) if it has none yet.
fn id_pd(i: &mut IdC) -> Option<*mut IbvPd> {
    if i.id.pd.is_null() {
        // SAFETY: verbs is our context.
        let p = unsafe { objects::alloc_pd(i.id.verbs) };
        if p.is_null() {
            return None;
        }
        (i.id.pd, i.owns_pd) = (p, true);
    }
    Some(i.id.pd)
}

/// The ID's receive CQ (`id->recv_cq`), made (with its channel, owned by the ID) for
/// `depth` completions if it has none yet: a QP's and an XRC SRQ's share it, as librdmacm's
/// `ucma_create_cqs` has them.
fn id_recv_cq(i: &mut IdC, depth: u32) -> Option<*mut IbvCq> {
    if i.id.recv_cq.is_null() {
        let (ch, cq) = id_cq(i, depth)?;
        (i.id.recv_cq_channel, i.id.recv_cq, i.owns_recv_cq) = (ch, cq, true);
    }
    Some(i.id.recv_cq)
}

fn create_qp_for(i: &mut IdC, pd: *mut IbvPd, attr: &mut IbvQpInitAttr) -> c_int {
    if i.id.verbs.is_null() {
        return fail_with(libc::EINVAL);
    }
    let pd = if !pd.is_null() {
        pd
    } else {
        let Some(p) = id_pd(i) else { return -1 };
        p
    };
    if attr.recv_cq.is_null() {
        let Some(cq) = id_recv_cq(i, attr.cap.max_recv_wr) else { return -1 };
        attr.recv_cq = cq;
    }
    if attr.qp_type == 0 {
        attr.qp_type = i.id.qp_type;
    }
    if attr.qp_type == XRC_RECV {
        // An XRC TGT QP of the device's domain (librdmacm's ucma_get_xrcd); the receive CQ
        // above is for the XRC SRQ rdma_create_srq makes next, as librdmacm's.
        let Some(x) = cm_xrcd(i.id.verbs) else { return -1 };
        return match i.inner.create_xrc_tgt_qp(&x.inner) {
            Ok(qp) => {
                attr.send_cq = ptr::null_mut();
                attr.recv_cq = ptr::null_mut();
                i.id.qp = objects::wrap_qp_of(i.id.verbs, pd, attr, qp);
                0
            }
            Err(e) => fail(&e),
        };
    }
    if attr.send_cq.is_null() {
        let Some((ch, cq)) = id_cq(i, attr.cap.max_send_wr) else { return -1 };
        (i.id.send_cq_channel, i.id.send_cq, i.owns_send_cq) = (ch, cq, true);
        attr.send_cq = cq;
    }
    // SAFETY: the CQs and SRQ are ours (or NULL).
    let init = match unsafe { objects::qp_init(attr) } {
        Ok(init) => init,
        Err(n) => return fail_with(n),
    };
    // SAFETY: the PD is ours (or NULL).
    let Some(p) = (unsafe { obj::<IbvPd, PdC>(pd) }) else { return fail_with(libc::EINVAL) };
    match i.inner.create_qp_with(&p.inner, &init) {
        Ok(qp) => {
            i.id.qp = objects::wrap_qp(pd, attr, qp);
            i.id.srq = attr.srq;
            0
        }
        Err(e) => fail(&e),
    }
}

unsafe extern "C" fn create_qp(id: *mut RdmaCmId, pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; attr is the caller's.
        let (Some(i), Some(a)) = (unsafe { id_mut(id) }, unsafe { attr.as_mut() }) else {
            return fail_with(libc::EINVAL);
        };
        create_qp_for(i, pd, a)
    })
}
export!("softrdma_rdmacm_rdma_create_qp", "SOFTRDMA_PRIVATE_1", create_qp);

fn destroy_qp_of(i: &mut IdC) {
    if !i.id.qp.is_null() {
        // SAFETY: the ID's QP, ours, destroyed once.
        unsafe { objects::destroy_qp(i.id.qp) };
        i.id.qp = ptr::null_mut();
    }
    if i.id.qp_type == XRC_RECV && !i.id.srq.is_null() {
        return; // its CQ is its XRC SRQ's: rdma_destroy_srq destroys them (librdmacm's order)
    }
    destroy_cqs_of(i);
}

/// The CQs (and channels) the ID made itself.
fn destroy_cqs_of(i: &mut IdC) {
    if std::mem::take(&mut i.owns_send_cq) {
        // SAFETY: the CQ and channel this ID made, destroyed once, the CQ first.
        unsafe { objects::destroy_cq(i.id.send_cq) };
        // SAFETY: as above.
        unsafe { objects::destroy_comp_channel(i.id.send_cq_channel) };
        (i.id.send_cq, i.id.send_cq_channel) = (ptr::null_mut(), ptr::null_mut());
    }
    if std::mem::take(&mut i.owns_recv_cq) {
        // SAFETY: the CQ and channel this ID made, destroyed once, the CQ first.
        unsafe { objects::destroy_cq(i.id.recv_cq) };
        // SAFETY: as above.
        unsafe { objects::destroy_comp_channel(i.id.recv_cq_channel) };
        (i.id.recv_cq, i.id.recv_cq_channel) = (ptr::null_mut(), ptr::null_mut());
    }
}

/// `IBV_QPT_XRC_RECV`.
const XRC_RECV: u32 = 10;

/// The XRC domain rdma_cm's IDs of device context `verbs` use (librdmacm's
/// `ucma_get_xrcd`: one per device, opened without a file on first use, kept while the
/// process runs, as the rdma_cm contexts are).
fn cm_xrcd<'a>(verbs: *mut IbvContext) -> Option<&'a crate::xrc::XrcdC> {
    static DOMAINS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut d = DOMAINS.lock().unwrap_or_else(PoisonError::into_inner);
    let p = match d.iter().find(|(c, _)| *c == verbs as usize) {
        Some(&(_, x)) => x as *mut c_void,
        None => {
            let mut attr = IbvXrcdInitAttr { comp_mask: 3, fd: -1, oflags: libc::O_CREAT };
            // SAFETY: verbs is our context; attr a local.
            let x = unsafe { crate::xrc::open_xrcd(verbs, &mut attr) };
            if x.is_null() {
                return None;
            }
            d.push((verbs as usize, x as usize));
            x
        }
    };
    // SAFETY: made by open_xrcd above (now or before), never closed.
    unsafe { obj::<c_void, crate::xrc::XrcdC>(p) }
}

/// `rdma_create_srq_ex`: an SRQ for the ID (`id->srq`): in `attr.pd` or the ID's PD; an
/// XRC SRQ (`IBV_SRQT_XRC`) in the device's rdma_cm domain unless `attr.xrcd` names one,
/// completing to the ID's receive CQ unless `attr.cq` names one (made now if need be), as
/// librdmacm's.
unsafe extern "C" fn create_srq_ex(id: *mut RdmaCmId, attr: *mut IbvSrqInitAttrEx) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; attr is the caller's.
        let (Some(i), Some(a)) = (unsafe { id_mut(id) }, unsafe { attr.as_mut() }) else {
            return fail_with(libc::EINVAL);
        };
        const TYPE: u32 = 1;
        const PD: u32 = 2;
        const XRCD: u32 = 4;
        const CQ: u32 = 8;
        if a.comp_mask & TYPE == 0 || i.id.verbs.is_null() {
            return fail_with(libc::EINVAL);
        }
        if a.comp_mask & PD == 0 || a.pd.is_null() {
            let Some(p) = id_pd(i) else { return -1 };
            a.pd = p;
            a.comp_mask |= PD;
        }
        if a.srq_type == 1 {
            if a.comp_mask & XRCD == 0 || a.xrcd.is_null() {
                let Some(x) = cm_xrcd(i.id.verbs) else { return -1 };
                a.xrcd = (x as *const crate::xrc::XrcdC).cast_mut().cast();
            }
            if a.comp_mask & CQ == 0 || a.cq.is_null() {
                let Some(cq) = id_recv_cq(i, a.attr.max_wr) else { return -1 };
                a.cq = cq;
            }
            a.comp_mask |= XRCD | CQ;
        }
        // SAFETY: verbs is our context; a the caller's attributes, completed above.
        let srq = unsafe { crate::xrc::create_srq_ex(i.id.verbs, a) };
        if srq.is_null() {
            return -1;
        }
        i.id.srq = srq;
        0
    })
}
export!("softrdma_rdmacm_rdma_create_srq_ex", "SOFTRDMA_PRIVATE_1", create_srq_ex);

/// `rdma_create_srq`: [`create_srq_ex`] of a basic SRQ, or an XRC one for an XRC_RECV ID.
unsafe extern "C" fn create_srq(id: *mut RdmaCmId, pd: *mut IbvPd, attr: *mut IbvSrqInitAttr) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; attr is the caller's.
        let (Some(i), Some(a)) = (unsafe { id_mut(id) }, unsafe { attr.as_mut() }) else {
            return fail_with(libc::EINVAL);
        };
        let mut ex = IbvSrqInitAttrEx {
            srq_context: a.srq_context,
            attr: a.attr,
            comp_mask: 1 | 2,
            srq_type: u32::from(i.id.qp_type == XRC_RECV),
            pd,
            xrcd: ptr::null_mut(),
            cq: ptr::null_mut(),
            tm_cap: [0; 2],
        };
        // SAFETY: id is ours; ex a local.
        let rc = unsafe { create_srq_ex(id, &mut ex) };
        a.attr = ex.attr;
        rc
    })
}
export!("softrdma_rdmacm_rdma_create_srq", "SOFTRDMA_PRIVATE_1", create_srq);

fn destroy_srq_of(i: &mut IdC) {
    if !i.id.srq.is_null() {
        // SAFETY: the ID's SRQ, ours, destroyed once.
        unsafe { objects::destroy_srq(i.id.srq) };
        i.id.srq = ptr::null_mut();
    }
    if i.id.qp.is_null() {
        destroy_cqs_of(i);
    }
}

/// `rdma_destroy_srq`.
unsafe extern "C" fn destroy_srq(id: *mut RdmaCmId) {
    guard((), || {
        // SAFETY: id is ours or NULL.
        if let Some(i) = unsafe { id_mut(id) } {
            destroy_srq_of(i);
        }
    })
}
export!("softrdma_rdmacm_rdma_destroy_srq", "SOFTRDMA_PRIVATE_1", destroy_srq);

/// `rdma_create_qp_ex`: [`create_qp`] from an `ibv_qp_init_attr_ex` with `IBV_QP_INIT_ATTR_PD`
/// and `IBV_QP_INIT_ATTR_XRCD` (an XRC_RECV QP's domain is the device's rdma_cm one); other
/// `comp_mask` bits are EOPNOTSUPP.
unsafe extern "C" fn create_qp_ex(id: *mut RdmaCmId, attr: *mut IbvQpInitAttrEx) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; attr is the caller's.
        let (Some(i), Some(a)) = (unsafe { id_mut(id) }, unsafe { attr.as_mut() }) else {
            return fail_with(libc::EINVAL);
        };
        if a.comp_mask & !(1 | 2) != 0 {
            return fail_with(libc::EOPNOTSUPP);
        }
        let mut init = a.plain();
        let pd = if a.comp_mask & 1 != 0 { a.pd } else { ptr::null_mut() };
        let rc = create_qp_for(i, pd, &mut init);
        a.cap = init.cap;
        rc
    })
}
export!("softrdma_rdmacm_rdma_create_qp_ex", "SOFTRDMA_PRIVATE_1", create_qp_ex);

unsafe extern "C" fn destroy_qp(id: *mut RdmaCmId) {
    guard((), || {
        // SAFETY: id is ours or NULL.
        if let Some(i) = unsafe { id_mut(id) } {
            destroy_qp_of(i);
        }
    })
}
export!("softrdma_rdmacm_rdma_destroy_qp", "SOFTRDMA_PRIVATE_1", destroy_qp);

// ---- connections ---------------------------------------------------------------------

/// A C `rdma_conn_param` (NULL: librdmacm's defaults).
///
/// # Safety
/// `p` must be NULL or valid, its private data `private_data_len` bytes.
unsafe fn conn_param(p: *const RdmaConnParam) -> ConnParam {
    // SAFETY: per the contract.
    let Some(c) = (unsafe { p.as_ref() }) else { return ConnParam::default() };
    let private_data = if c.private_data.is_null() {
        Vec::new()
    } else {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len)) }.to_vec()
    };
    ConnParam {
        private_data,
        responder_resources: c.responder_resources,
        initiator_depth: c.initiator_depth,
        flow_control: c.flow_control != 0,
        retry_count: c.retry_count.min(7),
        rnr_retry_count: c.rnr_retry_count.min(7),
        srq: c.srq != 0,
        qp_num: c.qp_num,
        ..ConnParam::default()
    }
}

/// `RDMA_MAX_RESP_RES` and `RDMA_MAX_INIT_DEPTH`: "as many as the device allows".
const RDMA_MAX_DEPTH: u8 = 0xff;

/// librdmacm's READ/atomic depths of `rdma_connect` and `rdma_accept`: 0xff
/// (`RDMA_MAX_RESP_RES`, `RDMA_MAX_INIT_DEPTH`; libfabric's verbs provider passes them) is
/// the device's maximum, for `rdma_accept` no more than the request asked for (`request`:
/// responder resources, initiator depth); another value past the maximum is `EINVAL`.
fn depths(i: &IdC, p: &mut ConnParam, request: Option<(u8, u8)>) -> Result<(), c_int> {
    let (max_resp, max_init) = i.inner.context().map_or((0, 0), |c| {
        let a = c.device().attributes();
        (a.max_qp_rd_atom, a.max_qp_init_rd_atom)
    });
    let (req_resp, req_init) = request.unwrap_or((RDMA_MAX_DEPTH, RDMA_MAX_DEPTH));
    for (v, max, req) in
        [(&mut p.responder_resources, max_resp, req_resp), (&mut p.initiator_depth, max_init, req_init)]
    {
        if *v == RDMA_MAX_DEPTH {
            *v = max.min(req);
        } else if *v > max {
            return Err(libc::EINVAL);
        }
    }
    Ok(())
}

unsafe extern "C" fn connect(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; param the caller's.
        let (Some(i), mut p) = (unsafe { id_mut(id) }, unsafe { conn_param(param) }) else {
            return fail_with(libc::EINVAL);
        };
        if let Err(n) = depths(i, &mut p, None) {
            return fail_with(n);
        }
        if let Err(e) = i.inner.connect(&p) {
            return fail(&e);
        }
        complete(i)
    })
}
export!("softrdma_rdmacm_rdma_connect", "SOFTRDMA_PRIVATE_1", connect);

unsafe extern "C" fn accept(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; param the caller's.
        let (Some(i), mut p) = (unsafe { id_mut(id) }, unsafe { conn_param(param) }) else {
            return fail_with(libc::EINVAL);
        };
        if param.is_null() {
            // librdmacm's rdma_accept(id, NULL): the depths the request asked for, within
            // what the device allows (rping accepts so, then READs the client's buffer).
            let (responder_resources, initiator_depth) = i.request_depths.unwrap_or((0, 0));
            let max = i.inner.context().map_or(0, |c| c.device().attributes().max_qp_rd_atom);
            p.responder_resources = responder_resources.min(max);
            p.initiator_depth = initiator_depth.min(max);
        } else if let Err(n) = depths(i, &mut p, i.request_depths) {
            return fail_with(n);
        }
        if let Err(e) = i.inner.accept(&p) {
            return fail(&e);
        }
        if i.id.qp_type == 4 { 0 } else { complete(i) }
    })
}
export!("softrdma_rdmacm_rdma_accept", "SOFTRDMA_PRIVATE_1", accept);

unsafe extern "C" fn reject(id: *mut RdmaCmId, data: *const c_void, len: u8) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL.
        let Some(i) = (unsafe { id_mut(id) }) else { return fail_with(libc::EINVAL) };
        let data = if data.is_null() {
            &[][..]
        } else {
            // SAFETY: the caller's len bytes.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }
        };
        match i.inner.reject(data) {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}
export!("softrdma_rdmacm_rdma_reject", "SOFTRDMA_PRIVATE_1", reject);

unsafe extern "C" fn disconnect(id: *mut RdmaCmId) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL.
        let Some(i) = (unsafe { id_mut(id) }) else { return fail_with(libc::EINVAL) };
        if let Err(e) = i.inner.disconnect() {
            return fail(&e);
        }
        complete(i)
    })
}
export!("softrdma_rdmacm_rdma_disconnect", "SOFTRDMA_PRIVATE_1", disconnect);

/// `rdma_init_qp_attr`: `attr->qp_state` names the state to reach (INIT, RTR, RTS); the
/// attributes and mask for `ibv_modify_qp` come back.
unsafe extern "C" fn init_qp_attr(id: *mut RdmaCmId, attr: *mut IbvQpAttr, mask: *mut c_int) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; attr and mask are the caller's.
        let (Some(i), Some(a), false) = (unsafe { id_mut(id) }, unsafe { attr.as_mut() }, mask.is_null()) else {
            return fail_with(libc::EINVAL);
        };
        let target = match a.qp_state {
            1 => softrdma::QpState::Init,
            2 => softrdma::QpState::Rtr,
            3 => softrdma::QpState::Rts,
            _ => return fail_with(libc::EINVAL),
        };
        match i.inner.init_qp_attr(target) {
            Ok((q, m)) => {
                *a = objects::qp_attr_c(&q, &softrdma::QpCap::default());
                // SAFETY: the caller's int.
                unsafe { *mask = m.0 as c_int };
                0
            }
            Err(e) => fail(&e),
        }
    })
}
export!("softrdma_rdmacm_rdma_init_qp_attr", "SOFTRDMA_PRIVATE_1", init_qp_attr);

/// `rdma_establish`: the active side of a connection whose QP is the program's own (none
/// attached to the ID) completes it after `CONNECT_RESPONSE`; `ESTABLISHED` follows. An ID
/// with a QP is completed by the library itself, so this is `EINVAL` there, as librdmacm.
unsafe extern "C" fn establish(id: *mut RdmaCmId) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL.
        let Some(i) = (unsafe { id_mut(id) }) else { return fail_with(libc::EINVAL) };
        if !i.id.qp.is_null() {
            return fail_with(libc::EINVAL);
        }
        match i.inner.establish() {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}
export!("softrdma_rdmacm_rdma_establish", "SOFTRDMA_PRIVATE_1", establish);

// ---- endpoints (the synchronous API) -------------------------------------------------

unsafe extern "C" fn create_ep(
    out: *mut *mut RdmaCmId,
    res: *mut RdmaAddrinfo,
    pd: *mut IbvPd,
    attr: *mut IbvQpInitAttr,
) -> c_int {
    guard(-1, || {
        // SAFETY: res is the caller's rdma_addrinfo.
        let Some(r) = (unsafe { res.as_ref() }) else { return fail_with(libc::EINVAL) };
        if out.is_null() {
            return fail_with(libc::EINVAL);
        }
        let mut idp: *mut RdmaCmId = ptr::null_mut();
        let ps = r.ai_port_space as u32;
        let Some(qp_type) =
            objects::qp_type(r.ai_qp_type as u32).or(Some(qp_type_of(ps).0).filter(|_| r.ai_qp_type == 0))
        else {
            return fail_with(libc::EINVAL);
        };
        // SAFETY: a synchronous ID (no channel) into a local.
        if unsafe { create_id_of(ptr::null_mut(), &mut idp, ptr::null_mut(), ps, qp_type) } != 0 {
            return -1;
        }
        let done = |rc: c_int| {
            if rc != 0 {
                // SAFETY: the ID made above, not handed out.
                unsafe { destroy_ep(idp) };
            }
            rc
        };
        // SAFETY: made above.
        let i = unsafe { &mut *idp.cast::<IdC>() };
        if r.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the addrinfo's source address.
            if unsafe { bind_addr(idp, r.ai_src_addr) } != 0 {
                return done(-1);
            }
            // SAFETY: the caller's attributes, plain data copied for rdma_get_request.
            i.init_attr = unsafe { attr.as_ref() }.map(|a| unsafe { ptr::read(a) });
            i.id.pd = pd;
        } else {
            // SAFETY: the addrinfo's addresses.
            if unsafe { resolve_addr(idp, r.ai_src_addr, r.ai_dst_addr, 2000) } != 0 {
                return done(-1);
            }
            // SAFETY: the ID made above.
            if unsafe { resolve_route(idp, 2000) } != 0 {
                return done(-1);
            }
            // SAFETY: the caller's attributes.
            if let Some(a) = unsafe { attr.as_mut() } {
                a.qp_type = i.id.qp_type;
                if create_qp_for(i, pd, a) != 0 {
                    return done(-1);
                }
            }
        }
        // SAFETY: the caller's out pointer.
        unsafe { *out = idp };
        0
    })
}
export!("softrdma_rdmacm_rdma_create_ep", "SOFTRDMA_PRIVATE_1", create_ep);

unsafe extern "C" fn destroy_ep(id: *mut RdmaCmId) {
    guard((), || {
        // SAFETY: id is ours or NULL.
        let Some(i) = (unsafe { id_mut(id) }) else { return };
        destroy_qp_of(i);
        destroy_srq_of(i);
        if std::mem::take(&mut i.owns_pd) {
            // SAFETY: the PD this ID made, destroyed once, after its QP.
            unsafe { objects::dealloc_pd(i.id.pd) };
            i.id.pd = ptr::null_mut();
        }
        // SAFETY: ours, destroyed once.
        unsafe { destroy_id(id) };
    })
}
export!("softrdma_rdmacm_rdma_destroy_ep", "SOFTRDMA_PRIVATE_1", destroy_ep);

unsafe extern "C" fn get_request(listen: *mut RdmaCmId, out: *mut *mut RdmaCmId) -> c_int {
    guard(-1, || {
        // SAFETY: listen is ours or NULL.
        let Some(l) = (unsafe { id_mut(listen) }) else { return fail_with(libc::EINVAL) };
        if l.own_channel.is_null() || out.is_null() {
            return fail_with(libc::EINVAL);
        }
        let e = match next_event(l.own_channel) {
            Ok(e) => e,
            Err(n) => return fail_with(n),
        };
        // SAFETY: e was just made.
        let (kind, status, idp) = unsafe { ((*e).event, (*e).status, (*e).id) };
        if status != 0 || kind != CmEventKind::ConnectRequest as u32 {
            // SAFETY: ours, not handed out.
            unsafe { free_event(e) };
            return fail_with(if status != 0 { status.abs() } else { libc::EINVAL });
        }
        // The new ID is synchronous too, on a channel of its own.
        // SAFETY: the event's new ID, ours.
        if unsafe { migrate_id(idp, ptr::null_mut()) } != 0 {
            return -1;
        }
        // SAFETY: as above.
        let i = unsafe { &mut *idp.cast::<IdC>() };
        if let Some(a) = &l.init_attr {
            // SAFETY: plain data.
            let mut a = unsafe { ptr::read(a) };
            if create_qp_for(i, l.id.pd, &mut a) != 0 {
                // SAFETY: ours.
                unsafe { free_event(e) };
                return -1;
            }
        }
        i.id.event = e;
        // SAFETY: the caller's out pointer.
        unsafe { *out = idp };
        0
    })
}
export!("softrdma_rdmacm_rdma_get_request", "SOFTRDMA_PRIVATE_1", get_request);

// ---- rdma_getaddrinfo ----------------------------------------------------------------

#[repr(C)]
struct AddrinfoC {
    ai: RdmaAddrinfo,
    src: libc::sockaddr_storage,
    dst: libc::sockaddr_storage,
}

/// The address of `node` (a numeric address or a host name), of `family` if not 0.
fn lookup(node: &str, port: u16, family: c_int) -> Option<SocketAddr> {
    let want = |a: &SocketAddr| match family {
        libc::AF_INET => a.is_ipv4(),
        libc::AF_INET6 => a.is_ipv6(),
        _ => true,
    };
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, port)).filter(want);
    }
    let all: Vec<SocketAddr> = (node, port).to_socket_addrs().ok()?.filter(want).collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied()
}

unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
    res: *mut *mut RdmaAddrinfo,
) -> c_int {
    guard(-1, || {
        if res.is_null() {
            return fail_with(libc::EINVAL);
        }
        // SAFETY: C strings or NULL, as the caller passes them.
        let (node, service) = unsafe {
            (
                (!node.is_null()).then(|| CStr::from_ptr(node).to_string_lossy().into_owned()),
                (!service.is_null()).then(|| CStr::from_ptr(service).to_string_lossy().into_owned()),
            )
        };
        // SAFETY: the caller's hints or NULL.
        let h = unsafe { hints.as_ref() };
        let flags = h.map_or(0, |h| h.ai_flags);
        let family = h.map_or(0, |h| if h.ai_flags & RAI_FAMILY != 0 || h.ai_family != 0 { h.ai_family } else { 0 });
        let Ok(port) = service.as_deref().map_or(Ok(0), str::parse::<u16>) else {
            return libc::EAI_SERVICE;
        };
        let passive = flags & RAI_PASSIVE != 0;
        // SAFETY: the hints' addresses, if any.
        let (hint_src, hint_dst) =
            h.map_or((None, None), |h| unsafe { (sockaddr_to(h.ai_src_addr), sockaddr_to(h.ai_dst_addr)) });
        // `None`: an active result with no destination, only the hints' source.
        let addr = match &node {
            Some(n) => match lookup(n, port, family) {
                Some(a) => Some(a),
                None => return libc::EAI_NONAME,
            },
            // No node and no service: the addresses are the hints' own, as in librdmacm
            // (libfabric's verbs provider names its peer so; pyverbs' AddrInfo(src=...)
            // gives a source alone, as its tests name a multicast group).
            None if service.is_none() => match (passive, hint_src, hint_dst) {
                (true, Some(a), _) | (false, _, Some(a)) => Some(a),
                (true, None, _) => Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)),
                (false, Some(_), None) => None,
                (false, None, None) => return fail_with(libc::EINVAL),
            },
            None if passive => {
                let any = if family == libc::AF_INET6 {
                    IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                } else {
                    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                };
                Some(SocketAddr::new(any, port))
            }
            None => return libc::EAI_NONAME,
        };
        let v4 = addr.or(hint_src).is_some_and(|a| a.is_ipv4());
        let mut ps = h.map_or(0, |h| h.ai_port_space);
        let mut qp_type = h.map_or(0, |h| h.ai_qp_type);
        if ps == 0 {
            ps = if qp_type == 4 { i32::from(PortSpace::UDP.0) } else { i32::from(PortSpace::TCP.0) };
        }
        if qp_type == 0 {
            qp_type = qp_type_of(ps as u32).1 as c_int;
        }
        // SAFETY: plain data; zero is empty.
        let zero: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut out = Box::new(AddrinfoC {
            ai: RdmaAddrinfo {
                ai_flags: flags,
                ai_family: if v4 { libc::AF_INET } else { libc::AF_INET6 },
                ai_qp_type: qp_type,
                ai_port_space: ps,
                ai_src_len: 0,
                ai_dst_len: 0,
                ai_src_addr: ptr::null_mut(),
                ai_dst_addr: ptr::null_mut(),
                ai_src_canonname: ptr::null_mut(),
                ai_dst_canonname: ptr::null_mut(),
                ai_route_len: 0,
                ai_route: ptr::null_mut(),
                ai_connect_len: 0,
                ai_connect: ptr::null_mut(),
                ai_next: ptr::null_mut(),
            },
            src: zero,
            dst: zero,
        });
        if let (true, Some(addr)) = (passive, addr) {
            let (sa, len) = sockaddr_from(addr);
            out.src = sa;
            out.ai.ai_src_len = len;
            out.ai.ai_src_addr = (&raw mut out.src).cast();
        } else {
            if let Some(addr) = addr {
                let (sa, len) = sockaddr_from(addr);
                out.dst = sa;
                out.ai.ai_dst_len = len;
                out.ai.ai_dst_addr = (&raw mut out.dst).cast();
            }
            if let Some(src) = hint_src {
                let (sa, len) = sockaddr_from(src);
                out.src = sa;
                out.ai.ai_src_len = len;
                out.ai.ai_src_addr = (&raw mut out.src).cast();
            }
        }
        // SAFETY: the caller's out pointer.
        unsafe { *res = Box::into_raw(out).cast() };
        0
    })
}
export!("softrdma_rdmacm_rdma_getaddrinfo", "SOFTRDMA_PRIVATE_1", getaddrinfo);

unsafe extern "C" fn freeaddrinfo(res: *mut RdmaAddrinfo) {
    guard((), || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: made by rdma_getaddrinfo, freed once.
            let b = unsafe { Box::from_raw(p.cast::<AddrinfoC>()) };
            p = b.ai.ai_next;
        }
    })
}
export!("softrdma_rdmacm_rdma_freeaddrinfo", "SOFTRDMA_PRIVATE_1", freeaddrinfo);

/// `rdma_get_devices`: the connection manager's `ibv_context` of every device (the
/// `id->verbs` of an ID bound to it), in a NULL-terminated array from `malloc`, their
/// number in `*num_devices` when that is not NULL. A device that cannot be opened is left
/// out. libfabric's verbs provider builds its device list from this.
unsafe extern "C" fn get_devices(num_devices: *mut c_int) -> *mut *mut IbvContext {
    guard(ptr::null_mut(), || {
        let contexts: Vec<*mut IbvContext> = softrdma::devices()
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d.cm_context().ok())
            .map(|ctx| cm_context(&ctx))
            .filter(|p| !p.is_null())
            .collect();
        // SAFETY: calloc of n + 1 pointers; the last stays NULL.
        let list = unsafe { libc::calloc(contexts.len() + 1, size_of::<*mut IbvContext>()) }.cast::<*mut IbvContext>();
        if list.is_null() {
            errno::set(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, &c) in contexts.iter().enumerate() {
            // SAFETY: i < contexts.len(), within the allocation.
            unsafe { *list.add(i) = c };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller passes a valid int or NULL.
            unsafe { *num_devices = c_int::try_from(contexts.len()).unwrap_or(c_int::MAX) };
        }
        list
    })
}
export!("softrdma_rdmacm_rdma_get_devices", "SOFTRDMA_PRIVATE_1", get_devices);

/// `rdma_free_devices`: frees the array; the contexts stay open for the process's life,
/// as librdmacm's do.
unsafe extern "C" fn free_devices(list: *mut *mut IbvContext) {
    // SAFETY: list is NULL or the array rdma_get_devices had from calloc.
    unsafe { libc::free(list.cast()) }
}
export!("softrdma_rdmacm_rdma_free_devices", "SOFTRDMA_PRIVATE_1", free_devices);

/// The port of `addr` in network byte order, 0 for none: librdmacm's `ucma_get_port`.
fn port_of(addr: &libc::sockaddr_storage) -> u16 {
    // SAFETY: a sockaddr_storage holds any address; sockaddr_to reads it by its family.
    unsafe { sockaddr_to((&raw const *addr).cast()) }.map_or(0, |a| a.port().to_be())
}

/// `rdma_get_src_port`: the port of the ID's local address, as the application sees it in
/// `id->route.addr.src_addr` (network byte order; 0 for an ID with no address).
unsafe extern "C" fn get_src_port(id: *mut RdmaCmId) -> u16 {
    // SAFETY: NULL or an ID of ours, alive until rdma_destroy_id (the API's contract).
    unsafe { id.as_ref() }.map_or(0, |id| port_of(&id.route.addr.src_addr))
}
export!("softrdma_rdmacm_rdma_get_src_port", "SOFTRDMA_PRIVATE_1", get_src_port);

/// `rdma_get_dst_port`: the port of the ID's peer address (`id->route.addr.dst_addr`).
unsafe extern "C" fn get_dst_port(id: *mut RdmaCmId) -> u16 {
    // SAFETY: NULL or an ID of ours, alive until rdma_destroy_id (the API's contract).
    unsafe { id.as_ref() }.map_or(0, |id| port_of(&id.route.addr.dst_addr))
}
export!("softrdma_rdmacm_rdma_get_dst_port", "SOFTRDMA_PRIVATE_1", get_dst_port);

// ---- multicast -------------------------------------------------------------------------

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
struct JoinMcAttrEx {
    comp_mask: u32,
    join_flags: u32,
    addr: *mut libc::sockaddr,
}

const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1 << 0;
const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 1 << 1;
const RDMA_CM_JOIN_MC_ATTR_RESERVED: u32 = 1 << 2;
const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
const RDMA_MC_JOIN_FLAG_RESERVED: u32 = 2;

/// librdmacm's `rdma_join_multicast2`: joins (the ID's QP attached unless send-only), then
/// `MULTICAST_JOIN` on the ID's channel (a synchronous ID waits for it).
fn join(id: *mut RdmaCmId, addr: *mut libc::sockaddr, join_flags: u32, context: *mut c_void) -> c_int {
    // SAFETY: id is ours or NULL; addr the caller's.
    let (Some(i), Some(a)) = (unsafe { id_mut(id) }, unsafe { sockaddr_to(addr) }) else {
        return fail_with(libc::EINVAL);
    };
    let mgid = softrdma::Gid::from_ip(a.ip().to_canonical());
    // Recorded first: the event, which may be read at once by another thread, names it.
    i.mcast.push((a, context as usize, mgid));
    if let Err(e) = i.inner.join_multicast(a, join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
        i.mcast.pop();
        return fail(&e);
    }
    complete(i)
}

/// `rdma_join_multicast`: a full member of group `addr` (EINVAL for an ID that is not UD or
/// bound, or an address that is no multicast group).
unsafe extern "C" fn join_multicast(id: *mut RdmaCmId, addr: *mut libc::sockaddr, context: *mut c_void) -> c_int {
    guard(-1, || join(id, addr, 0, context))
}
export!("softrdma_rdmacm_rdma_join_multicast", "SOFTRDMA_PRIVATE_1", join_multicast);

/// `rdma_join_multicast_ex`: with librdmacm's checks of the attributes (ENOTSUP for an
/// unknown comp_mask bit, EINVAL without an address or join flags, or with unknown flags);
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` joins without attaching the QP.
unsafe extern "C" fn join_multicast_ex(id: *mut RdmaCmId, attr: *mut JoinMcAttrEx, context: *mut c_void) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's attributes or NULL.
        let Some(a) = (unsafe { attr.as_ref() }) else { return fail_with(libc::EINVAL) };
        if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return fail_with(libc::ENOTSUP);
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
            || a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        {
            return fail_with(libc::EINVAL);
        }
        join(id, a.addr, a.join_flags, context)
    })
}
export!("softrdma_rdmacm_rdma_join_multicast_ex", "SOFTRDMA_PRIVATE_1", join_multicast_ex);

/// `rdma_leave_multicast`: the ID's QP is detached from group `addr`; EADDRNOTAVAIL for a
/// group the ID did not join, as librdmacm's.
unsafe extern "C" fn leave_multicast(id: *mut RdmaCmId, addr: *mut libc::sockaddr) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; addr the caller's.
        let (Some(i), Some(a)) = (unsafe { id_mut(id) }, unsafe { sockaddr_to(addr) }) else {
            return fail_with(libc::EINVAL);
        };
        let Some(at) = i.mcast.iter().position(|m| m.0 == a) else { return fail_with(libc::EADDRNOTAVAIL) };
        i.mcast.remove(at);
        match i.inner.leave_multicast(a) {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}
export!("softrdma_rdmacm_rdma_leave_multicast", "SOFTRDMA_PRIVATE_1", leave_multicast);

// ---- Enhanced Connection Establishment ---------------------------------------------------

/// `struct ibv_ece`.
#[repr(C)]
struct IbvEce {
    vendor_id: u32,
    options: u32,
    comp_mask: u32,
}

/// `rdma_set_local_ece`: kept as librdmacm keeps it (EINVAL as there: no ID or ECE, an ID
/// with a QP, vendor ID 0, a comp_mask). softrdma's QPs have no ECE options to agree on
/// (`ibv_query_ece` and `ibv_set_ece` answer EOPNOTSUPP, as rxe's), so it is not sent.
unsafe extern "C" fn set_local_ece(id: *mut RdmaCmId, ece: *mut IbvEce) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; ece is the caller's or NULL.
        let (Some(i), Some(e)) = (unsafe { id_mut(id) }, unsafe { ece.as_ref() }) else {
            return fail_with(libc::EINVAL);
        };
        if !i.id.qp.is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
            return fail_with(libc::EINVAL);
        }
        i.local_ece = (e.vendor_id, e.options);
        0
    })
}
export!("softrdma_rdmacm_rdma_set_local_ece", "SOFTRDMA_PRIVATE_1", set_local_ece);

/// `rdma_get_remote_ece`: the peer's ECE, all zero: no ECE comes over softrdma's CM, as from
/// a peer that sets none (a program then keeps its QP's defaults). EINVAL as librdmacm's.
unsafe extern "C" fn get_remote_ece(id: *mut RdmaCmId, ece: *mut IbvEce) -> c_int {
    guard(-1, || {
        // SAFETY: id is ours or NULL; ece is the caller's or NULL.
        let (Some(i), Some(e)) = (unsafe { id_mut(id) }, unsafe { ece.as_mut() }) else {
            return fail_with(libc::EINVAL);
        };
        if !i.id.qp.is_null() {
            return fail_with(libc::EINVAL);
        }
        *e = IbvEce { vendor_id: 0, options: 0, comp_mask: 0 };
        0
    })
}
export!("softrdma_rdmacm_rdma_get_remote_ece", "SOFTRDMA_PRIVATE_1", get_remote_ece);

// ---- not done yet ----------------------------------------------------------------------

/// Not supported yet: -1 with `errno = ENOSYS` (for the calls returning `int`, `ssize_t`
/// or `off_t`).
unsafe extern "C" fn minus_one_enosys() -> c_long {
    errno::set(libc::ENOSYS);
    -1
}

macro_rules! enosys {
    ($($name:literal),* $(,)?) => { $( export!($name, "SOFTRDMA_PRIVATE_1", minus_one_enosys); )* };
}

enosys!("softrdma_rdmacm_rdma_notify", "softrdma_rdmacm_rdma_reject_ece",);
