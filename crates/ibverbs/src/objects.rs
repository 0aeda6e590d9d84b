//! PD, MR, MW, completion channel, CQ, QP, SRQ, AH and asynchronous events. Each C object is
//! a `#[repr(C)]` struct whose first member is the public C struct, followed by the
//! softrdma handle; dropping the handle destroys the object on the device.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use softrdma::{Access, AddressVector, AttrMask, Gid, Mtu, QKey, QpAttr, QpCap, QpInit, QpState, QpType};

use crate::abi::*;
use crate::device::{Ctx, ctx_of};
use crate::errno;
use crate::guard;

#[repr(C)]
pub(crate) struct PdC {
    pub(crate) pd: IbvPd,
    pub(crate) inner: softrdma::Pd,
    /// A parent domain's own (`ibv_alloc_parent_domain`); `inner` is then its protection
    /// domain's.
    pub(crate) parent: Option<Parent>,
}

/// What a parent domain adds to the protection domain it contains.
pub(crate) struct Parent {
    /// The thread domain, or NULL.
    td: *mut IbvTd,
    /// The application's allocators and their context. softrdma's queues live in the
    /// device, not in buffers the provider hands it, so it has nothing to allocate with them
    /// and never calls them (ibv_alloc_parent_domain(3): how a provider uses them is its
    /// own); they are kept, as given.
    _alloc: Option<unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, usize, u64) -> *mut c_void>,
    _free: Option<unsafe extern "C" fn(*mut IbvPd, *mut c_void, *mut c_void, u64)>,
    _pd_context: *mut c_void,
}

/// A thread domain (`ibv_alloc_td`): a promise that what uses it is used by one thread at a
/// time, which softrdma's locks need not exploit.
#[repr(C)]
pub(crate) struct TdC {
    td: IbvTd,
    /// Parent domains that name it: `ibv_dealloc_td` answers EBUSY while any does.
    users: AtomicU32,
}

#[repr(C)]
pub(crate) struct MrC {
    pub(crate) mr: IbvMr,
    pub(crate) inner: softrdma::RawMr,
}

#[repr(C)]
pub(crate) struct MwC {
    pub(crate) mw: IbvMw,
    pub(crate) inner: softrdma::Mw,
}

#[repr(C)]
pub(crate) struct ChannelC {
    pub(crate) ch: IbvCompChannel,
    pub(crate) inner: softrdma::CompChannel,
    /// The CQs attached, with their `ibv_cq` addresses, to name the one an event is for.
    pub(crate) cqs: Mutex<Vec<(softrdma::Cq, usize)>>,
}

/// Every CQ is an `ibv_cq_ex` (`ibv_create_cq` programs see its `ibv_cq` part).
#[repr(C)]
pub(crate) struct CqC {
    pub(crate) cq: IbvCqEx,
    pub(crate) inner: softrdma::Cq,
    /// Completion events delivered by `ibv_get_cq_event`.
    pub(crate) events: AtomicU32,
    /// `ibv_start_poll` .. `ibv_end_poll`: one thread at a time.
    pub(crate) section: crate::wr::Section,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current, as `ibv_poll_cq`
    /// would have written it.
    pub(crate) current: Mutex<crate::cq_ex::Current>,
}

#[repr(C)]
pub(crate) struct QpC {
    /// Its `qp_base` is the `ibv_qp` programs get; the rest serves `ibv_qp_to_qp_ex`.
    pub(crate) qpx: IbvQpEx,
    pub(crate) inner: softrdma::Qp,
    pub(crate) sq_sig_all: bool,
    /// The `ibv_wr_*` operations the QP was created for (`ibv_create_qp_ex`); 0: none, and
    /// `ibv_qp_to_qp_ex` gives NULL.
    pub(crate) send_ops: u64,
    /// The work requests between `ibv_wr_start` and `ibv_wr_complete`.
    pub(crate) builder: Mutex<crate::wr::Builder>,
    /// Who is between `ibv_wr_start` and `ibv_wr_complete`/`ibv_wr_abort`.
    pub(crate) section: crate::wr::Section,
}

#[repr(C)]
pub(crate) struct SrqC {
    pub(crate) srq: IbvSrq,
    pub(crate) inner: softrdma::Srq,
}

#[repr(C)]
pub(crate) struct AhC {
    pub(crate) ah: IbvAh,
    pub(crate) inner: softrdma::Ah,
}

/// The wrapper `W` of a C object pointer `p` we handed out (its first member).
///
/// # Safety
/// `p` must be NULL or point at the first member of a live `W`.
pub(crate) unsafe fn obj<'a, C, W>(p: *mut C) -> Option<&'a W> {
    // SAFETY: per the contract, a non-NULL p is the address of a live W.
    unsafe { (p as *const W).as_ref() }
}

/// Frees a wrapper made by [`boxed`].
///
/// # Safety
/// `p` must come from [`boxed`] for this `W` and be freed once.
pub(crate) unsafe fn free<C, W>(p: *mut C) {
    // SAFETY: per the contract.
    drop(unsafe { Box::from_raw(p as *mut W) });
}

/// An `ibv_dealloc_pd`/`ibv_dereg_mr`/`ibv_destroy_ah`: `EINVAL` for NULL, else the
/// wrapper freed, 0. What the object holds keeps what it needs alive inside.
///
/// # Safety
/// `p` must be NULL or come from [`boxed`] for this `W`, and be freed once.
unsafe fn destroy<C, W>(p: *mut C) -> c_int {
    guard(libc::EIO, || {
        if p.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: per the contract.
        unsafe { free::<C, W>(p) };
        0
    })
}

/// Moves a wrapper to the heap and returns the pointer C gets: its first member.
pub(crate) fn boxed<C, W>(w: W) -> *mut C {
    Box::into_raw(Box::new(w)) as *mut C
}

const NULL_MUTEX: Mutex_ = [0; 5];
type Mutex_ = crate::abi::Mutex;

/// `ibv_qp_state` values ↔ [`QpState`].
fn qp_state(raw: u32) -> Option<QpState> {
    u8::try_from(raw).ok().and_then(QpState::from_raw)
}

pub(crate) unsafe extern "C" fn alloc_pd(ctx: *mut IbvContext) -> *mut IbvPd {
    guard(ptr::null_mut(), || {
        // SAFETY: ctx is ours or NULL.
        let Some(c) = (unsafe { ctx_of(ctx) }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        errno::or_null(c.inner.alloc_pd(), |inner| {
            boxed(PdC { pd: IbvPd { context: ctx, handle: 0 }, inner, parent: None })
        })
    })
}
export!("ibv_alloc_pd", "IBVERBS_1.1", alloc_pd);

/// `ibv_dealloc_pd`, of a protection domain or a parent domain (whose thread domain is then
/// free of it).
pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut IbvPd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: pd is ours or NULL.
        let td = unsafe { obj::<IbvPd, PdC>(pd) }.and_then(|p| p.parent.as_ref()).map_or(ptr::null_mut(), |p| p.td);
        // SAFETY: a parent domain's thread domain outlives it (ibv_dealloc_td refuses).
        if let Some(t) = unsafe { obj::<IbvTd, TdC>(td) } {
            t.users.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: pd came from ibv_alloc_pd or ibv_alloc_parent_domain; objects made from it
        // hold the PD alive inside.
        unsafe { destroy::<IbvPd, PdC>(pd) }
    })
}
export!("ibv_dealloc_pd", "IBVERBS_1.1", dealloc_pd);

/// `verbs_context.alloc_td` (`ibv_alloc_td`): EINVAL for an unknown `comp_mask` bit.
pub(crate) unsafe extern "C" fn alloc_td(ctx: *mut IbvContext, attr: *mut c_void) -> *mut IbvTd {
    guard(ptr::null_mut(), || {
        // SAFETY: ctx is ours or NULL; attr is NULL or a struct ibv_td_init_attr (its u32
        // comp_mask).
        let (c, mask) = unsafe { (ctx_of(ctx), attr.cast::<u32>().as_ref().copied().unwrap_or(0)) };
        if c.is_none() || mask != 0 {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
        boxed(TdC { td: IbvTd { context: ctx }, users: AtomicU32::new(0) })
    })
}

/// `verbs_context.dealloc_td` (`ibv_dealloc_td`): EBUSY while a parent domain names it.
pub(crate) unsafe extern "C" fn dealloc_td(td: *mut IbvTd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: td is ours or NULL.
        match unsafe { obj::<IbvTd, TdC>(td) } {
            None => libc::EINVAL,
            Some(t) if t.users.load(Ordering::Acquire) > 0 => libc::EBUSY,
            // SAFETY: made by alloc_td, freed once, no parent domain names it.
            Some(_) => unsafe { destroy::<IbvTd, TdC>(td) },
        }
    })
}

/// `verbs_context.alloc_parent_domain` (`ibv_alloc_parent_domain`): a PD that is its
/// protection domain's for every verb (what is made with it is in that PD), with a thread
/// domain and the application's allocators and context. EINVAL for a NULL or parent-domain
/// `pd` (no nesting, as EFA), another context's PD or TD, or an unknown `comp_mask` bit.
pub(crate) unsafe extern "C" fn alloc_parent_domain(
    ctx: *mut IbvContext,
    attr: *mut IbvParentDomainInitAttr,
) -> *mut IbvPd {
    guard(ptr::null_mut(), || {
        // SAFETY: attr is NULL or the caller's struct.
        let a = unsafe { attr.as_ref() };
        // SAFETY: its pd is ours or NULL.
        let pd = a.and_then(|a| unsafe { obj::<IbvPd, PdC>(a.pd) });
        // SAFETY: its td is ours or NULL.
        let td = a.and_then(|a| unsafe { obj::<IbvTd, TdC>(a.td) });
        let (Some(a), Some(p)) = (a, pd) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        let foreign = p.pd.context != ctx || td.is_some_and(|t| t.td.context != ctx);
        if p.parent.is_some() || foreign || a.comp_mask & !3 != 0 {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
        let allocators = a.comp_mask & 1 != 0;
        if let Some(t) = td {
            t.users.fetch_add(1, Ordering::AcqRel);
        }
        let parent = Parent {
            td: a.td,
            _alloc: a.alloc.filter(|_| allocators),
            _free: a.free.filter(|_| allocators),
            _pd_context: if a.comp_mask & 2 != 0 { a.pd_context } else { ptr::null_mut() },
        };
        boxed(PdC { pd: IbvPd { context: ctx, handle: p.pd.handle }, inner: p.inner.clone(), parent: Some(parent) })
    })
}

/// The access flags softrdma enforces for a region (the four rights, MW_BIND, ON_DEMAND and
/// FLUSH's placements); the optional ones (relaxed ordering, huge pages, ...) are accepted
/// and ignored.
fn access(flags: c_int) -> Access {
    let enforced = Access::ALL | Access::MW_BIND | Access::ON_DEMAND | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT;
    Access(flags as u32 & enforced.0)
}

unsafe fn reg_mr_common(pd: *mut IbvPd, addr: *mut c_void, len: usize, iova: u64, flags: c_int) -> *mut IbvMr {
    // SAFETY: pd is ours or NULL.
    let Some(p) = (unsafe { obj::<IbvPd, PdC>(pd) }) else {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    };
    if addr.is_null() && len == usize::MAX && !access(flags).contains(Access::ON_DEMAND) {
        // The whole address space is the implicit on-demand region, and only that: the
        // kernel fails to pin it (EFAULT).
        errno::set(libc::EFAULT);
        return ptr::null_mut();
    }
    // SAFETY: the C contract of ibv_reg_mr: the application keeps addr..addr+len allocated
    // until ibv_dereg_mr, and accepts that the device writes there at any time.
    let registered = unsafe { p.inner.reg_mr_raw_iova(addr.cast(), len, iova, access(flags)) };
    errno::or_null(registered, |inner| mr_c(p, pd, addr, len, inner))
}

/// The `ibv_mr` of region `inner` of PD `p` (whose C address is `pd`), as the application
/// names it: from `addr`, `len` bytes.
fn mr_c(p: &PdC, pd: *mut IbvPd, addr: *mut c_void, len: usize, inner: softrdma::RawMr) -> *mut IbvMr {
    let (lkey, rkey) = (inner.lkey(), inner.rkey());
    let mr = IbvMr { context: p.pd.context, pd, addr, length: len, handle: lkey, lkey, rkey };
    boxed(MrC { mr, inner })
}

pub(crate) unsafe extern "C" fn reg_mr(pd: *mut IbvPd, addr: *mut c_void, len: usize, flags: c_int) -> *mut IbvMr {
    // SAFETY: as reg_mr_common.
    guard(ptr::null_mut(), || unsafe { reg_mr_common(pd, addr, len, addr as u64, flags) })
}
export!("ibv_reg_mr", "IBVERBS_1.1", reg_mr);

unsafe extern "C" fn reg_mr_iova(pd: *mut IbvPd, addr: *mut c_void, len: usize, iova: u64, flags: c_int) -> *mut IbvMr {
    // SAFETY: as reg_mr_common.
    guard(ptr::null_mut(), || unsafe { reg_mr_common(pd, addr, len, iova, flags) })
}
export!("ibv_reg_mr_iova", "IBVERBS_1.7", reg_mr_iova);

unsafe extern "C" fn reg_mr_iova2(pd: *mut IbvPd, addr: *mut c_void, len: usize, iova: u64, flags: u32) -> *mut IbvMr {
    // SAFETY: as reg_mr_common.
    guard(ptr::null_mut(), || unsafe { reg_mr_common(pd, addr, len, iova, flags as c_int) })
}
export!("ibv_reg_mr_iova2", "IBVERBS_1.8", reg_mr_iova2);

/// `IBV_REREG_MR_CHANGE_TRANSLATION`, `_CHANGE_PD`, `_CHANGE_ACCESS`, `_KEEP_VALID`.
const REREG_FLAGS: c_int = 1 | 2 | 4 | 8;
/// `enum ibv_rereg_mr_err_code`: bad input; the command failed.
const REREG_ERR_INPUT: c_int = -1;
const REREG_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`: a region moved to another PD of its context (`IBV_REREG_MR_CHANGE_PD`),
/// to other memory (`_CHANGE_TRANSLATION`: `addr`, `length`), given other access rights
/// (`_CHANGE_ACCESS`), its keys kept; `ibv_mr` then says so. Input errors (EINVAL,
/// `IBV_REREG_MR_ERR_INPUT`) as libibverbs's: no flag, an unknown flag, a translation
/// without address or length, a PD change without a PD (or another context's); what the
/// device refuses (as `ibv_reg_mr` would) is `IBV_REREG_MR_ERR_CMD`, nothing changed.
unsafe extern "C" fn rereg_mr(
    mr: *mut IbvMr,
    flags: c_int,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access_flags: c_int,
) -> c_int {
    guard(REREG_ERR_CMD, || {
        let (translation, change_pd) = (flags & 1 != 0, flags & 2 != 0);
        if mr.is_null()
            || flags & !REREG_FLAGS != 0
            || flags & 7 == 0
            || (translation && (addr.is_null() || length == 0))
            || (change_pd && pd.is_null())
        {
            errno::set(libc::EINVAL);
            return REREG_ERR_INPUT;
        }
        // SAFETY: pd is ours or NULL.
        let new_pd = if change_pd { unsafe { obj::<IbvPd, PdC>(pd) } } else { None };
        // SAFETY: mr came from ibv_reg_mr (a live MrC, the caller's to change).
        let m = unsafe { &mut *(mr as *mut MrC) };
        if change_pd && new_pd.is_none_or(|p| p.pd.context != m.mr.context) {
            errno::set(libc::EINVAL);
            return REREG_ERR_INPUT;
        }
        let range = translation.then_some((addr.cast::<u8>(), length));
        let rights = (flags & 4 != 0).then(|| access(access_flags));
        // SAFETY: the C contract of ibv_rereg_mr: a new range stays allocated until
        // ibv_dereg_mr, as ibv_reg_mr's.
        if let Err(e) = unsafe { m.inner.rereg(new_pd.map(|p| &p.inner), range, rights) } {
            errno::fail(&e);
            return REREG_ERR_CMD;
        }
        if let Some((a, l)) = range {
            (m.mr.addr, m.mr.length) = (a.cast(), l);
        }
        if change_pd {
            m.mr.pd = pd;
        }
        0
    })
}
export!("ibv_rereg_mr", "IBVERBS_1.1", rereg_mr);

/// `verbs_context.advise_mr` (`ibv_advise_mr`): prefetch advice for SGEs of regions on
/// demand. `IBV_ADVISE_MR_FLAG_FLUSH` or not, the pages are faulted in before it returns.
/// EINVAL for a NULL PD or list, an unknown flag or advice, an SGE outside a region of the
/// PD registered on demand; EFAULT where the pages do not allow the access.
pub(crate) unsafe extern "C" fn advise_mr(pd: *mut IbvPd, advice: u32, flags: u32, sg: *mut IbvSge, n: u32) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: pd is ours or NULL.
        let Some(p) = (unsafe { obj::<IbvPd, PdC>(pd) }) else { return libc::EINVAL };
        let advice = match advice {
            0 => softrdma::Prefetch::Read,
            1 => softrdma::Prefetch::Write,
            2 => softrdma::Prefetch::NoFault,
            _ => return libc::EINVAL,
        };
        if flags & !1 != 0 || sg.is_null() || n == 0 {
            return libc::EINVAL;
        }
        // SAFETY: sg points at n SGEs (the caller's contract).
        let sges: Vec<softrdma::Sge> = unsafe { std::slice::from_raw_parts(sg, n as usize) }
            .iter()
            .map(|s| softrdma::Sge { addr: s.addr, length: s.length, lkey: softrdma::LKey(s.lkey) })
            .collect();
        match p.inner.prefetch(&sges, advice) {
            Ok(()) => 0,
            Err(e) => errno::of(&e),
        }
    })
}

/// Device memory: `ibv_alloc_dm`'s, its copies the `ibv_memcpy_*_dm` inlines call.
#[repr(C)]
pub(crate) struct DmC {
    dm: IbvDm,
    inner: softrdma::DeviceMemory,
}

/// `verbs_context.alloc_dm` (`ibv_alloc_dm`): EINVAL for a `comp_mask`, an alignment past a
/// page (`log_align_req` > 12) or more than `max_dm_size` (what mlx5 answers); ENOMEM when
/// the context already holds too much.
pub(crate) unsafe extern "C" fn alloc_dm(ctx: *mut IbvContext, attr: *mut IbvAllocDmAttr) -> *mut IbvDm {
    guard(ptr::null_mut(), || {
        // SAFETY: ctx is ours or NULL; attr is NULL or the caller's struct.
        let (Some(c), Some(a)) = (unsafe { ctx_of(ctx) }, unsafe { attr.as_ref() }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        if a.comp_mask != 0 || a.log_align_req > 12 || a.length as u64 > softrdma::MAX_DM_SIZE {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
        errno::or_null(c.inner.alloc_dm(a.length), |inner| {
            let dm = IbvDm {
                context: ctx,
                memcpy_to_dm: Some(memcpy_to_dm),
                memcpy_from_dm: Some(memcpy_from_dm),
                comp_mask: 0,
                handle: 0,
            };
            boxed(DmC { dm, inner })
        })
    })
}

/// `verbs_context.free_dm` (`ibv_free_dm`): EBUSY while a region is over it.
pub(crate) unsafe extern "C" fn free_dm(dm: *mut IbvDm) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: dm is ours or NULL.
        match unsafe { obj::<IbvDm, DmC>(dm) } {
            None => libc::EINVAL,
            Some(d) if d.inner.regions() > 0 => libc::EBUSY,
            // SAFETY: made by alloc_dm, freed once.
            Some(_) => unsafe { destroy::<IbvDm, DmC>(dm) },
        }
    })
}

/// The errno value of a device memory copy's error: EFAULT outside it, EINVAL unaligned
/// (mlx5's).
fn dm_errno(e: &softrdma::Error) -> c_int {
    if matches!(e, softrdma::Error::OutOfRange { .. }) { libc::EFAULT } else { errno::of(e) }
}

unsafe extern "C" fn memcpy_to_dm(dm: *mut IbvDm, offset: u64, host: *const c_void, len: usize) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: dm is ours or NULL.
        let Some(d) = (unsafe { obj::<IbvDm, DmC>(dm) }) else { return libc::EINVAL };
        if len == 0 {
            return 0;
        }
        // SAFETY: host points at len readable bytes (the caller's contract).
        let data = unsafe { std::slice::from_raw_parts(host.cast::<u8>(), len) };
        d.inner.copy_to(offset, data).map_or_else(|e| dm_errno(&e), |()| 0)
    })
}

unsafe extern "C" fn memcpy_from_dm(host: *mut c_void, dm: *mut IbvDm, offset: u64, len: usize) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: dm is ours or NULL.
        let Some(d) = (unsafe { obj::<IbvDm, DmC>(dm) }) else { return libc::EINVAL };
        if len == 0 {
            return 0;
        }
        // SAFETY: host points at len writable bytes (the caller's contract).
        let out = unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), len) };
        d.inner.copy_from(offset, out).map_or_else(|e| dm_errno(&e), |()| 0)
    })
}

/// `IBV_ACCESS_ZERO_BASED`.
const ACCESS_ZERO_BASED: u32 = 1 << 5;

/// `verbs_context.reg_dm_mr` (`ibv_reg_dm_mr`): a zero-based region over `length` bytes of
/// the device memory at `offset` (`ibv_mr.addr` NULL: work requests name them from 0).
/// EINVAL without `IBV_ACCESS_ZERO_BASED` (as libibverbs), or past the device memory's end.
pub(crate) unsafe extern "C" fn reg_dm_mr(
    pd: *mut IbvPd,
    dm: *mut IbvDm,
    offset: u64,
    len: usize,
    acc: u32,
) -> *mut IbvMr {
    guard(ptr::null_mut(), || {
        // SAFETY: pd and dm are ours or NULL.
        let (Some(p), Some(d)) = (unsafe { obj::<IbvPd, PdC>(pd) }, unsafe { obj::<IbvDm, DmC>(dm) }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        if acc & ACCESS_ZERO_BASED == 0 {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
        match d.inner.reg_mr(&p.inner, offset, len, access(acc as c_int)) {
            Ok(inner) => mr_c(p, pd, ptr::null_mut(), len, inner),
            Err(e) => {
                errno::set(if matches!(e, softrdma::Error::OutOfRange { .. }) { libc::EINVAL } else { errno::of(&e) });
                ptr::null_mut()
            }
        }
    })
}

/// `ibv_dereg_mr`: EINVAL, the region kept, while memory windows are bound to it (as rxe,
/// IBA 10.6.7.2.6).
pub(crate) unsafe extern "C" fn dereg_mr(mr: *mut IbvMr) -> c_int {
    guard(libc::EIO, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: mr came from ibv_reg_mr (a live MrC, the caller's to destroy).
        let m = unsafe { &mut *(mr as *mut MrC) };
        if let Err(e) = m.inner.deregister() {
            return errno::fail(&e);
        }
        // SAFETY: made by ibv_reg_mr, destroyed once; its RawMr is deregistered already.
        unsafe { free::<IbvMr, MrC>(mr) };
        0
    })
}
export!("ibv_dereg_mr", "IBVERBS_1.1", dereg_mr);

/// `ops.alloc_mw` (`ibv_alloc_mw`): a window of `IBV_MW_TYPE_1` or `IBV_MW_TYPE_2`; any
/// other type is EINVAL.
pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut IbvPd, mw_type: u32) -> *mut IbvMw {
    guard(ptr::null_mut(), || {
        // SAFETY: pd is ours or NULL.
        let (Some(p), Some(t)) = (unsafe { obj::<IbvPd, PdC>(pd) }, mw_type_of(mw_type)) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        errno::or_null(p.inner.alloc_mw(t), |inner| {
            let mw = IbvMw { context: p.pd.context, pd, rkey: inner.rkey().0, handle: inner.id().0, mw_type };
            boxed(MwC { mw, inner })
        })
    })
}

fn mw_type_of(raw: u32) -> Option<softrdma::MwType> {
    match raw {
        1 => Some(softrdma::MwType::Type1),
        2 => Some(softrdma::MwType::Type2),
        _ => None,
    }
}

/// `ops.dealloc_mw` (`ibv_dealloc_mw`).
pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut IbvMw) -> c_int {
    // SAFETY: mw came from ibv_alloc_mw; dropping the Mw deallocates it.
    unsafe { destroy::<IbvMw, MwC>(mw) }
}

/// `IBV_ACCESS_OPTIONAL_RANGE`: flags a device may ignore.
const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// A window's `mw_access_flags` as the engine takes them: the optional flags dropped, any
/// other unknown bit kept (the bind then fails with `IBV_WC_MW_BIND_ERR`, as rxe's).
pub(crate) fn mw_access(flags: u32) -> Access {
    Access(flags & !ACCESS_OPTIONAL_RANGE)
}

/// The window a BIND_MW of `mw` with `info` binds, what it binds, and `mw->rkey`: for
/// `ibv_bind_mw`, `IBV_WR_BIND_MW` and `ibv_wr_bind_mw`. `None` when `mw` or the region is
/// not ours. The window is named by its handle, whatever `mw->rkey` says: rxe's provider
/// names it by `mw->rkey` and its kernel refuses one that is not current, which a type 2
/// window bound by a work request before (rxe leaves `mw->rkey` alone then) never is.
///
/// # Safety
/// `mw` and `info.mr` must be NULL or ours.
pub(crate) unsafe fn bind_of(
    mw: *mut IbvMw,
    info: &IbvMwBindInfo,
) -> Option<(softrdma::MwId, softrdma::RKey, softrdma::MwBind)> {
    // SAFETY: per the contract.
    let w = unsafe { obj::<IbvMw, MwC>(mw) }?;
    let lkey = if info.mr.is_null() {
        0
    } else {
        // SAFETY: per the contract.
        unsafe { obj::<IbvMr, MrC>(info.mr) }?.mr.lkey
    };
    let bind = softrdma::MwBind {
        mr: softrdma::LKey(lkey),
        addr: info.addr,
        length: info.length,
        access: mw_access(info.mw_access_flags),
    };
    Some((w.inner.id(), softrdma::RKey(w.mw.rkey), bind))
}

/// `ops.bind_mw` (`ibv_bind_mw`, type 1 windows; the inline checked the type and the PDs):
/// as rxe's, a BIND_MW work request posted on `qp` with the window's next R_Key
/// (`ibv_inc_rkey`), which `mw->rkey` takes at once ("the user has to undo this if he gets
/// an error completion"). A zero-based type 1 window is EINVAL (o10-36.2.2).
pub(crate) unsafe extern "C" fn bind_mw(qp: *mut IbvQp, mw: *mut IbvMw, mw_bind: *mut IbvMwBind) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the caller's objects (ours) or NULL.
        let (Some(q), Some(b)) = (unsafe { obj::<IbvQp, QpC>(qp) }, unsafe { mw_bind.as_ref() }) else {
            return errno::fail_with(libc::EINVAL);
        };
        if b.bind_info.mw_access_flags & Access::ZERO_BASED.0 != 0 {
            return errno::fail_with(libc::EINVAL);
        }
        // SAFETY: the window and region are the caller's (ours) or NULL.
        let Some((id, from, bind)) = (unsafe { bind_of(mw, &b.bind_info) }) else {
            return errno::fail_with(libc::EINVAL);
        };
        let to = softrdma::inc_rkey(from);
        let op = softrdma::SendOp::BindMw { mw: id, rkey: to, bind };
        let flags = softrdma::SendFlags(b.send_flags & 0xf);
        let wr = softrdma::SendWr { wr_id: b.wr_id, op, sg_list: &[], flags, ud: None, xrc_srqn: None };
        if let Err(e) = q.inner.post_send(&[wr]) {
            return errno::fail(&e);
        }
        // SAFETY: mw is a live window of ours (mw_bind found it); the application owns its
        // fields, as it does rxe's.
        unsafe { (*mw).rkey = to.0 };
        0
    })
}

pub(crate) unsafe extern "C" fn create_comp_channel(ctx: *mut IbvContext) -> *mut IbvCompChannel {
    guard(ptr::null_mut(), || {
        // SAFETY: ctx is ours or NULL.
        let Some(c) = (unsafe { ctx_of(ctx) }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        errno::or_null(c.inner.create_comp_channel(), |inner| {
            let ch = IbvCompChannel { context: ctx, fd: inner.as_fd().as_raw_fd(), refcnt: 0 };
            boxed(ChannelC { ch, inner, cqs: Mutex::new(Vec::new()) })
        })
    })
}
export!("ibv_create_comp_channel", "IBVERBS_1.0", create_comp_channel);

pub(crate) unsafe extern "C" fn destroy_comp_channel(ch: *mut IbvCompChannel) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ch is ours or NULL.
        let Some(c) = (unsafe { obj::<IbvCompChannel, ChannelC>(ch) }) else {
            return libc::EINVAL;
        };
        if !c.cqs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty() {
            errno::set(libc::EBUSY);
            return libc::EBUSY;
        }
        // SAFETY: made by ibv_create_comp_channel, no CQ uses it any more.
        unsafe { free::<IbvCompChannel, ChannelC>(ch) };
        0
    })
}
export!("ibv_destroy_comp_channel", "IBVERBS_1.0", destroy_comp_channel);

pub(crate) unsafe extern "C" fn create_cq(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
) -> *mut IbvCq {
    // SAFETY: per ibv_create_cq's contract, as new_cq's.
    unsafe { new_cq(ctx, cqe, cq_context, channel, comp_vector, |_| {}) }.cast()
}

/// A CQ of `ctx` for `ibv_create_cq` and `ibv_create_cq_ex` (`ex` fills its extended
/// entries), or NULL with `errno` set.
///
/// # Safety
/// `ctx` and `channel` must be ours or NULL.
pub(crate) unsafe fn new_cq(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
    ex: impl FnOnce(&mut IbvCqEx),
) -> *mut CqC {
    guard(ptr::null_mut(), || {
        // SAFETY: ctx and channel are ours or NULL.
        let (c, ch) = unsafe { (ctx_of(ctx), obj::<IbvCompChannel, ChannelC>(channel)) };
        // The kernel refuses a vector at or past num_comp_vectors (ib_uverbs_create_cq).
        let vector_ok = (0..crate::device::NUM_COMP_VECTORS).contains(&comp_vector);
        let (Some(c), Ok(n), true) = (c, u32::try_from(cqe), vector_ok) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        errno::or_null(c.inner.create_cq(n.max(1), ch.map(|ch| &ch.inner)), |inner| {
            let mut cq = IbvCqEx {
                cq: IbvCq {
                    context: ctx,
                    channel,
                    cq_context,
                    handle: 0,
                    cqe,
                    mutex: NULL_MUTEX,
                    cond: [0; 6],
                    comp_events_completed: 0,
                    async_events_completed: 0,
                },
                ..crate::cq_ex::EMPTY
            };
            ex(&mut cq);
            let keep = inner.clone();
            let id = inner.id().0;
            let current = Mutex::new(crate::cq_ex::Current { wc: crate::post::wc_c(&softrdma::EMPTY_WC), at: None });
            let p: *mut CqC = boxed(CqC { cq, inner, events: AtomicU32::new(0), section: Default::default(), current });
            elements(&c.cqs).insert(id, p as usize);
            if let Some(ch) = ch {
                ch.cqs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((keep, p as usize));
            }
            p
        })
    })
}
export!("ibv_create_cq", "IBVERBS_1.1", create_cq);

pub(crate) unsafe extern "C" fn destroy_cq(cq: *mut IbvCq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: cq is ours or NULL.
        let Some(c) = (unsafe { obj::<IbvCq, CqC>(cq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the channel outlives its CQs (ibv_destroy_comp_channel refuses while any is left).
        if let Some(ch) = unsafe { obj::<IbvCompChannel, ChannelC>(c.cq.cq.channel) } {
            ch.cqs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|(_, p)| *p != cq as usize);
        }
        // SAFETY: the context outlives its CQs.
        if let Some(ctx) = unsafe { ctx_of(c.cq.cq.context) } {
            elements(&ctx.cqs).remove(&c.inner.id().0);
            // An event still queued for it would name whatever CQ gets its handle next.
            ctx.inner.forget_async_events_of_cq(c.inner.id());
        }
        // SAFETY: made by ibv_create_cq, destroyed once.
        unsafe { free::<IbvCq, CqC>(cq) };
        0
    })
}
export!("ibv_destroy_cq", "IBVERBS_1.1", destroy_cq);

/// `ibv_resize_cq`: the CQ holds up to `cqe` completions, which `cq->cqe` then says; 0 or
/// the errno value (EINVAL for 0, past `max_cqe`, or fewer than it holds).
unsafe extern "C" fn resize_cq(cq: *mut IbvCq, cqe: c_int) -> c_int {
    guard(libc::EIO, || {
        let resized = {
            // SAFETY: cq is ours or NULL.
            let Some(c) = (unsafe { obj::<IbvCq, CqC>(cq) }) else {
                return libc::EINVAL;
            };
            let Ok(n) = u32::try_from(cqe) else { return libc::EINVAL };
            c.inner.resize(n)
        };
        match resized {
            Ok(n) => {
                // SAFETY: cq is a live CQ of ours (checked above); nothing else refers to
                // its fields now.
                unsafe { (*cq).cqe = c_int::try_from(n).unwrap_or(c_int::MAX) };
                0
            }
            Err(e) => errno::fail(&e),
        }
    })
}
export!("ibv_resize_cq", "IBVERBS_1.1", resize_cq);

unsafe extern "C" fn get_cq_event(ch: *mut IbvCompChannel, cq: *mut *mut IbvCq, cq_context: *mut *mut c_void) -> c_int {
    guard(-1, || {
        // SAFETY: ch is ours or NULL.
        let Some(c) = (unsafe { obj::<IbvCompChannel, ChannelC>(ch) }) else {
            errno::set(libc::EINVAL);
            return -1;
        };
        // rdma-core reads the channel's fd: made non-blocking (fcntl O_NONBLOCK, for an
        // event loop), an empty channel fails with EAGAIN instead of waiting.
        let wait = crate::would_block(c.ch.fd).then_some(std::time::Duration::ZERO);
        loop {
            let got = match c.inner.get_cq_event(wait) {
                Ok(Some(got)) => got,
                Ok(None) if wait.is_some() => {
                    errno::set(libc::EAGAIN);
                    return -1;
                }
                Ok(None) => continue,
                Err(e) => {
                    errno::fail(&e);
                    return -1;
                }
            };
            let cqs = c.cqs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // A CQ destroyed since its event fired is not reported.
            let Some(&(_, p)) = cqs.iter().find(|(q, _)| q.same(&got)) else { continue };
            let p = p as *mut IbvCq;
            // SAFETY: p is a live CQ of this channel (it is in the list).
            let w = unsafe { &*(p as *const CqC) };
            w.events.fetch_add(1, Ordering::Relaxed);
            if !cq.is_null() {
                // SAFETY: the caller's out pointers.
                unsafe { *cq = p };
            }
            if !cq_context.is_null() {
                // SAFETY: as above.
                unsafe { *cq_context = w.cq.cq.cq_context };
            }
            return 0;
        }
    })
}
export!("ibv_get_cq_event", "IBVERBS_1.1", get_cq_event);

unsafe extern "C" fn ack_cq_events(cq: *mut IbvCq, n: u32) {
    guard((), || {
        if !cq.is_null() {
            // SAFETY: cq is ours; comp_events_completed is only written here, by the
            // application's acking thread, as in rdma-core (under its mutex there).
            unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n) };
        }
    })
}
export!("ibv_ack_cq_events", "IBVERBS_1.1", ack_cq_events);

unsafe extern "C" fn create_srq(pd: *mut IbvPd, init: *mut IbvSrqInitAttr) -> *mut IbvSrq {
    guard(ptr::null_mut(), || {
        // SAFETY: pd is ours or NULL; init is the caller's.
        let (Some(p), Some(init)) = (unsafe { obj::<IbvPd, PdC>(pd) }, unsafe { init.as_mut() }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        errno::or_null(p.inner.create_srq(init.attr.max_wr, init.attr.max_sge), |inner| {
            srq_c(p, pd, init.srq_context, inner)
        })
    })
}
export!("ibv_create_srq", "IBVERBS_1.1", create_srq);

/// Hands out SRQ `inner`, made in PD `p` (whose C address is `pd`), as an `ibv_srq`, known
/// to its context for the asynchronous events that name it.
pub(crate) fn srq_c(p: &PdC, pd: *mut IbvPd, srq_context: *mut c_void, inner: softrdma::Srq) -> *mut IbvSrq {
    let srq = IbvSrq {
        context: p.pd.context,
        srq_context,
        pd,
        handle: inner.number(),
        mutex: NULL_MUTEX,
        cond: [0; 6],
        events_completed: 0,
    };
    let id = inner.id().0;
    let out: *mut IbvSrq = boxed(SrqC { srq, inner });
    // SAFETY: the PD's context is ours.
    if let Some(c) = unsafe { ctx_of(p.pd.context) } {
        elements(&c.srqs).insert(id, out as usize);
    }
    out
}

unsafe extern "C" fn modify_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr, mask: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: srq is ours or NULL; attr is the caller's.
        let (Some(s), Some(a)) = (unsafe { obj::<IbvSrq, SrqC>(srq) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        const IBV_SRQ_LIMIT: c_int = 2;
        if mask & !IBV_SRQ_LIMIT != 0 {
            return libc::EOPNOTSUPP; // resizing (IBV_SRQ_MAX_WR)
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            if let Err(e) = s.inner.arm_limit(a.srq_limit) {
                return errno::fail(&e);
            }
        }
        0
    })
}
export!("ibv_modify_srq", "IBVERBS_1.1", modify_srq);

unsafe extern "C" fn query_srq(_srq: *mut IbvSrq, _attr: *mut IbvSrqAttr) -> c_int {
    libc::EOPNOTSUPP
}
export!("ibv_query_srq", "IBVERBS_1.1", query_srq);

pub(crate) unsafe extern "C" fn destroy_srq(srq: *mut IbvSrq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: srq is ours or NULL.
        let Some(s) = (unsafe { obj::<IbvSrq, SrqC>(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the context outlives its SRQs.
        if let Some(c) = unsafe { ctx_of(s.srq.context) } {
            elements(&c.srqs).remove(&s.inner.id().0);
            c.inner.forget_async_events_of_srq(s.inner.id());
        }
        // SAFETY: made by ibv_create_srq; QPs using it hold it alive inside.
        unsafe { free::<IbvSrq, SrqC>(srq) };
        0
    })
}
export!("ibv_destroy_srq", "IBVERBS_1.1", destroy_srq);

/// An `ibv_qp_type` as softrdma's; `None` for one it lacks.
pub(crate) fn qp_type(raw: u32) -> Option<QpType> {
    match raw {
        2 => Some(QpType::Rc),
        3 => Some(QpType::Uc),
        4 => Some(QpType::Ud),
        9 => Some(QpType::XrcIni),
        10 => Some(QpType::XrcTgt),
        _ => None,
    }
}

/// The `ibv_qp_type` of softrdma's `t`.
pub(crate) fn qp_type_raw(t: QpType) -> u32 {
    match t {
        QpType::Rc => 2,
        QpType::Uc => 3,
        QpType::Ud | QpType::Gsi => 4,
        QpType::XrcIni => 9,
        QpType::XrcTgt => 10,
    }
}

fn cap_c(c: &QpCap) -> IbvQpCap {
    IbvQpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The QP a C `ibv_qp_init_attr` describes, its CQs and SRQ resolved to ours; the errno
/// for one softrdma cannot create (EOPNOTSUPP: a QP type it lacks; EINVAL: no CQs).
///
/// # Safety
/// The CQs and SRQ `init` names must be ours or NULL, and outlive the result.
pub(crate) unsafe fn qp_init<'a>(init: &IbvQpInitAttr) -> Result<QpInit<'a>, c_int> {
    let t = qp_type(init.qp_type).ok_or(libc::EOPNOTSUPP)?;
    // SAFETY: per the contract.
    let (scq, rcq, srq) =
        unsafe { (obj::<IbvCq, CqC>(init.send_cq), obj::<IbvCq, CqC>(init.recv_cq), obj::<IbvSrq, SrqC>(init.srq)) };
    // An XRC_SEND QP receives nothing and needs no receive CQ: its send CQ stands in, and
    // its `ibv_qp.recv_cq` stays the NULL it was given.
    let rcq = if t == QpType::XrcIni && init.recv_cq.is_null() { scq } else { rcq };
    let (Some(scq), Some(rcq)) = (scq, rcq) else { return Err(libc::EINVAL) };
    let c = init.cap;
    Ok(QpInit {
        qp_type: t,
        send_cq: &scq.inner,
        recv_cq: &rcq.inner,
        srq: srq.map(|s| &s.inner),
        cap: QpCap {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
            max_inline_data: c.max_inline_data,
        },
        sq_sig_all: init.sq_sig_all != 0,
    })
}

pub(crate) unsafe extern "C" fn create_qp(pd: *mut IbvPd, init: *mut IbvQpInitAttr) -> *mut IbvQp {
    guard(ptr::null_mut(), || {
        // SAFETY: pd is ours or NULL; init is the caller's.
        let (Some(p), Some(init)) = (unsafe { obj::<IbvPd, PdC>(pd) }, unsafe { init.as_mut() }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        // SAFETY: the CQs and SRQ are ours or NULL.
        let q = match unsafe { qp_init(init) } {
            Ok(q) => q,
            Err(n) => {
                errno::set(n);
                return ptr::null_mut();
            }
        };
        errno::or_null(p.inner.create_qp(&q), |qp| wrap_qp(pd, init, qp))
    })
}

/// Hands out QP `inner`, created in `pd` (ours) from `init`, as an `ibv_qp`; reports the
/// capabilities it got in `init.cap`, as rdma-core does.
pub(crate) fn wrap_qp(pd: *mut IbvPd, init: &mut IbvQpInitAttr, inner: softrdma::Qp) -> *mut IbvQp {
    // SAFETY: pd is ours (the caller created inner in it).
    let context = unsafe { (*pd).context };
    wrap_qp_of(context, pd, init, inner)
}

/// [`wrap_qp`] for a QP of `context` in `pd`, which may be NULL (an XRC_RECV QP's).
pub(crate) fn wrap_qp_of(
    context: *mut IbvContext,
    pd: *mut IbvPd,
    init: &mut IbvQpInitAttr,
    inner: softrdma::Qp,
) -> *mut IbvQp {
    if let Ok((_, cap)) = inner.query() {
        init.cap = cap_c(&cap); // what the QP got, as rdma-core reports it
    }
    let qpn = inner.qpn();
    let qp = IbvQp {
        context,
        qp_context: init.qp_context,
        pd,
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        handle: qpn,
        qp_num: qpn,
        state: inner.state().map_or(0, |s| s as u32),
        qp_type: init.qp_type,
        mutex: NULL_MUTEX,
        cond: [0; 6],
        events_completed: 0,
    };
    let out: *mut IbvQp = boxed(QpC {
        qpx: crate::wr::qp_ex(qp),
        inner,
        sq_sig_all: init.sq_sig_all != 0,
        send_ops: 0,
        builder: Mutex::default(),
        section: crate::wr::Section::default(),
    });
    // SAFETY: the context outlives its QPs.
    if let Some(c) = unsafe { ctx_of(context) } {
        qps(c).insert(qpn, out as usize);
    }
    out
}
export!("ibv_create_qp", "IBVERBS_1.1", create_qp);

fn qps(c: &Ctx) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, usize>> {
    elements(&c.qps)
}

/// One of a context's maps from softrdma's handles to the C objects.
fn elements(
    m: &Mutex<std::collections::HashMap<u32, usize>>,
) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, usize>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) unsafe extern "C" fn destroy_qp(qp: *mut IbvQp) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp is ours or NULL.
        let Some(q) = (unsafe { obj::<IbvQp, QpC>(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the context outlives its QPs.
        if let Some(c) = unsafe { ctx_of(q.qpx.qp_base.context) } {
            qps(c).remove(&q.qpx.qp_base.qp_num);
        }
        // SAFETY: made by ibv_create_qp, destroyed once.
        unsafe { free::<IbvQp, QpC>(qp) };
        0
    })
}
export!("ibv_destroy_qp", "IBVERBS_1.1", destroy_qp);

/// `ibv_attach_mcast`: UD QP `qp` receives multicast group `gid`'s datagrams
/// ([`softrdma::Qp::attach_mcast`]; the first QP of the device joins the group on its
/// interface). `lid` is unused, as on every RoCE device (the group is its GID). 0, or the
/// error number (also in `errno`): EINVAL for a GID that is no multicast group or a QP that
/// is not UD, ENOMEM past the device's `max_mcast_*`.
pub(crate) unsafe extern "C" fn attach_mcast(qp: *mut IbvQp, gid: *const IbvGid, _lid: u16) -> c_int {
    // SAFETY: qp is ours or NULL; gid the caller's or NULL.
    unsafe { mcast(qp, gid, true) }
}
export!("ibv_attach_mcast", "IBVERBS_1.1", attach_mcast);

/// `ibv_detach_mcast`: the reverse (EINVAL if the QP is not attached to the group); the
/// device's last QP to leave leaves the group on the interface.
pub(crate) unsafe extern "C" fn detach_mcast(qp: *mut IbvQp, gid: *const IbvGid, _lid: u16) -> c_int {
    // SAFETY: as above.
    unsafe { mcast(qp, gid, false) }
}
export!("ibv_detach_mcast", "IBVERBS_1.1", detach_mcast);

/// # Safety
/// `qp` must be NULL or ours, `gid` NULL or a readable `union ibv_gid`.
unsafe fn mcast(qp: *mut IbvQp, gid: *const IbvGid, attach: bool) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: per the contract.
        let (Some(q), Some(g)) = (unsafe { obj::<IbvQp, QpC>(qp) }, unsafe { gid.as_ref() }) else {
            errno::set(libc::EINVAL);
            return libc::EINVAL;
        };
        let gid = Gid(g.raw);
        let done = if attach { q.inner.attach_mcast(gid) } else { q.inner.detach_mcast(gid) };
        match done {
            Ok(()) => 0,
            Err(e) => errno::fail(&e),
        }
    })
}

/// `ibv_ah_attr` → [`AddressVector`]. On RoCE every address is global: an AH without a
/// GRH has nowhere to go.
fn av(a: &IbvAhAttr) -> Option<AddressVector> {
    (a.is_global != 0).then_some(AddressVector {
        dgid: Gid(a.grh.dgid.raw),
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
    })
}

pub(crate) fn ah_attr_c(av: Option<&AddressVector>) -> IbvAhAttr {
    match av {
        Some(v) => IbvAhAttr {
            grh: IbvGlobalRoute {
                dgid: IbvGid { raw: v.dgid.0 },
                flow_label: v.flow_label,
                sgid_index: v.sgid_index,
                hop_limit: v.hop_limit,
                traffic_class: v.traffic_class,
            },
            is_global: 1,
            port_num: 1,
            ..IbvAhAttr::default()
        },
        None => IbvAhAttr::default(),
    }
}

unsafe extern "C" fn modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, mask: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp is ours or NULL; attr is the caller's.
        let (Some(q), Some(a)) = (unsafe { obj::<IbvQp, QpC>(qp) }, unsafe { attr.as_ref() }) else {
            errno::set(libc::EINVAL);
            return libc::EINVAL;
        };
        let mask = AttrMask(mask as u32);
        let bad = || {
            errno::set(libc::EINVAL);
            libc::EINVAL
        };
        let state = |raw, bit| if mask.0 & bit != 0 { qp_state(raw) } else { Some(QpState::Reset) };
        let (Some(qp_state), Some(cur_qp_state)) =
            (state(a.qp_state, AttrMask::STATE.0), state(a.cur_qp_state, AttrMask::CUR_STATE.0))
        else {
            return bad();
        };
        let path_mtu = if mask.0 & AttrMask::PATH_MTU.0 != 0 {
            match u8::try_from(a.path_mtu).ok().and_then(Mtu::from_ibv) {
                Some(m) => m,
                None => return bad(),
            }
        } else {
            Mtu::default()
        };
        let ah_attr = if mask.0 & AttrMask::AV.0 != 0 {
            match av(&a.ah_attr) {
                Some(v) => Some(v),
                None => return bad(),
            }
        } else {
            None
        };
        let r = QpAttr {
            qp_state,
            cur_qp_state,
            en_sqd_async_notify: a.en_sqd_async_notify != 0,
            // The remote rights and FLUSH's placements; the rest (MW_BIND, ...) are a region's.
            qp_access_flags: Access(
                a.qp_access_flags & (Access::ALL | Access::FLUSH_GLOBAL | Access::FLUSH_PERSISTENT).0,
            ),
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            qkey: QKey(a.qkey),
            ah_attr,
            path_mtu,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            rq_psn: a.rq_psn,
            max_rd_atomic: a.max_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            sq_psn: a.sq_psn,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            dest_qp_num: a.dest_qp_num,
        };
        if let Err(e) = q.inner.modify(&r, mask) {
            return errno::fail(&e);
        }
        if let Some(s) = q.inner.state() {
            // SAFETY: qp is ours; the application reads qp->state, we write it here only.
            unsafe { (*qp).state = s as u32 };
        }
        0
    })
}
export!("ibv_modify_qp", "IBVERBS_1.1", modify_qp);

/// softrdma's QP attributes as `struct ibv_qp_attr` (`ibv_query_qp`, `rdma_init_qp_attr`).
pub(crate) fn qp_attr_c(a: &QpAttr, cap: &QpCap) -> IbvQpAttr {
    IbvQpAttr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: 2, // IBV_MIG_ARMED, as rxe
        qkey: a.qkey.0,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.0,
        cap: cap_c(cap),
        ah_attr: ah_attr_c(a.ah_attr.as_ref()),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        ..IbvQpAttr::default()
    }
}

unsafe extern "C" fn query_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, _mask: c_int, init: *mut IbvQpInitAttr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp is ours or NULL.
        let Some(q) = (unsafe { obj::<IbvQp, QpC>(qp) }) else {
            errno::set(libc::EINVAL);
            return libc::EINVAL;
        };
        let (a, cap) = match q.inner.query() {
            Ok(v) => v,
            Err(e) => return errno::fail(&e),
        };
        let out = qp_attr_c(&a, &cap);
        if !attr.is_null() {
            // SAFETY: the caller's struct ibv_qp_attr.
            unsafe { attr.write(out) };
        }
        if !init.is_null() {
            let i = IbvQpInitAttr {
                qp_context: q.qpx.qp_base.qp_context,
                send_cq: q.qpx.qp_base.send_cq,
                recv_cq: q.qpx.qp_base.recv_cq,
                srq: q.qpx.qp_base.srq,
                cap: cap_c(&cap),
                qp_type: qp_type_raw(q.inner.qp_type()),
                sq_sig_all: c_int::from(q.sq_sig_all),
            };
            // SAFETY: the caller's struct ibv_qp_init_attr.
            unsafe { init.write(i) };
        }
        0
    })
}
export!("ibv_query_qp", "IBVERBS_1.1", query_qp);

unsafe extern "C" fn create_ah(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    guard(ptr::null_mut(), || {
        // SAFETY: pd is ours or NULL; attr is the caller's.
        let (Some(p), Some(a)) = (unsafe { obj::<IbvPd, PdC>(pd) }, unsafe { attr.as_ref() }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        let Some(v) = av(a) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        errno::or_null(p.inner.create_ah(v), |inner| {
            boxed(AhC { ah: IbvAh { context: p.pd.context, pd, handle: inner.id().0 }, inner })
        })
    })
}
export!("ibv_create_ah", "IBVERBS_1.1", create_ah);

unsafe extern "C" fn destroy_ah(ah: *mut IbvAh) -> c_int {
    // SAFETY: made by ibv_create_ah, destroyed once.
    unsafe { destroy::<IbvAh, AhC>(ah) }
}
export!("ibv_destroy_ah", "IBVERBS_1.1", destroy_ah);

/// `ibv_init_ah_from_wc`: the AH attributes that answer a UD receive, from the network
/// header in the first 40 bytes of its buffer (`Device::reply_av`). Without `IBV_WC_GRH`
/// the attributes have no GRH, as rdma-core's (and a RoCE AH needs one).
unsafe extern "C" fn init_ah_from_wc(
    ctx: *mut IbvContext,
    port: u8,
    wc: *mut IbvWc,
    grh: *mut c_void,
    attr: *mut IbvAhAttr,
) -> c_int {
    guard(-1, || {
        // SAFETY: ctx is ours or NULL; wc and attr are the caller's.
        let (Some(c), Some(wc)) = (unsafe { ctx_of(ctx) }, unsafe { wc.as_ref() }) else {
            errno::set(libc::EINVAL);
            return -1;
        };
        if attr.is_null() {
            errno::set(libc::EINVAL);
            return -1;
        }
        let mut a = IbvAhAttr { port_num: port, ..IbvAhAttr::default() };
        if wc.wc_flags & 1 != 0 {
            if grh.is_null() {
                errno::set(libc::EINVAL);
                return -1;
            }
            let mut b = [0u8; 40];
            // SAFETY: a UD receive buffer starts with the 40-byte GRH area (IBV_WC_GRH).
            unsafe { ptr::copy_nonoverlapping(grh.cast::<u8>(), b.as_mut_ptr(), 40) };
            match c.inner.device().reply_av(&b) {
                Ok(av) => a = IbvAhAttr { port_num: port, ..ah_attr_c(Some(&av)) },
                Err(e) => {
                    errno::fail(&e);
                    return -1;
                }
            }
        }
        // SAFETY: the caller's struct ibv_ah_attr.
        unsafe { attr.write(a) };
        0
    })
}
export!("ibv_init_ah_from_wc", "IBVERBS_1.1", init_ah_from_wc);

unsafe extern "C" fn create_ah_from_wc(pd: *mut IbvPd, wc: *mut IbvWc, grh: *mut c_void, port: u8) -> *mut IbvAh {
    guard(ptr::null_mut(), || {
        // SAFETY: pd is ours or NULL.
        let Some(p) = (unsafe { obj::<IbvPd, PdC>(pd) }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        let mut a = IbvAhAttr::default();
        // SAFETY: forwarded caller pointers.
        if unsafe { init_ah_from_wc(p.pd.context, port, wc, grh, &mut a) } != 0 {
            return ptr::null_mut();
        }
        // SAFETY: pd is ours; a is a local.
        unsafe { create_ah(pd, &mut a) }
    })
}
export!("ibv_create_ah_from_wc", "IBVERBS_1.1", create_ah_from_wc);

unsafe extern "C" fn get_async_event(ctx: *mut IbvContext, event: *mut IbvAsyncEvent) -> c_int {
    guard(-1, || {
        // SAFETY: ctx is ours or NULL.
        let (Some(c), false) = (unsafe { ctx_of(ctx) }, event.is_null()) else {
            errno::set(libc::EINVAL);
            return -1;
        };
        // rdma-core reads the fd: made non-blocking, an empty queue gives EAGAIN.
        let wait = crate::would_block(c.vctx.context.async_fd).then_some(std::time::Duration::ZERO);
        use softrdma::AsyncEvent as A;
        let qp = |n: softrdma::Qpn| qps(c).get(&n.value()).copied().unwrap_or(0) as *mut c_void;
        let cq = |id: softrdma::CqId| elements(&c.cqs).get(&id.0).copied().unwrap_or(0) as *mut c_void;
        let srq = |id: softrdma::SrqId| elements(&c.srqs).get(&id.0).copied().unwrap_or(0) as *mut c_void;
        let (element, event_type) = loop {
            let e = match c.inner.get_async_event(wait) {
                Ok(Some(e)) => e,
                Ok(None) if wait.is_some() => {
                    errno::set(libc::EAGAIN);
                    return -1;
                }
                Ok(None) => continue,
                Err(e) => {
                    errno::fail(&e);
                    return -1;
                }
            };
            let named = match e {
                A::CqError(id) => (cq(id), 0),
                A::QpFatal(n) => (qp(n), 1),
                A::QpRequestError(n) => (qp(n), 2),
                A::QpAccessError(n) => (qp(n), 3),
                A::CommEstablished(n) => (qp(n), 4),
                A::SqDrained(n) => (qp(n), 5),
                A::SrqLimitReached(id) => (srq(id), 15),
                A::QpLastWqeReached(n) => (qp(n), 16),
            };
            // An object this context does not hand out (destroyed by now) gets no event:
            // programs dereference the element (UCX reads element.qp->qp_num).
            if !named.0.is_null() {
                break named;
            }
        };
        // SAFETY: the caller's struct ibv_async_event.
        unsafe { event.write(IbvAsyncEvent { element, event_type }) };
        0
    })
}
export!("ibv_get_async_event", "IBVERBS_1.1", get_async_event);

unsafe extern "C" fn ack_async_event(_event: *mut IbvAsyncEvent) {}
export!("ibv_ack_async_event", "IBVERBS_1.1", ack_async_event);
