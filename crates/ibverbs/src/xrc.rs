//! XRC: `ibv_open_xrcd`/`ibv_close_xrcd`, `ibv_create_srq_ex` (basic and XRC SRQs),
//! `ibv_get_srq_num` and the XRC_RECV QPs of `ibv_create_qp_ex` ([`softrdma::Xrcd`]).
//!
//! A domain opened with a file (`IBV_XRCD_INIT_ATTR_FD`) is the file's: a second
//! `ibv_open_xrcd` of the same inode, in the same context, gets the same domain, as the
//! kernel's uverbs gives it; without `O_CREAT` no domain is made (EAGAIN), with `O_EXCL` an
//! existing one is refused (EINVAL). softrdma's devices live in their processes, so the
//! sharing ends at the process: another process opening the file gets a domain of its own.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Mutex;

use crate::abi::*;
use crate::device::ctx_of;
use crate::errno;
use crate::guard;
use crate::objects::{CqC, PdC, SrqC, boxed, free, obj, srq_c, wrap_qp_of};

/// `IBV_XRCD_INIT_ATTR_FD`, `IBV_XRCD_INIT_ATTR_OFLAGS`.
const XRCD_ATTR_FD: u32 = 1 << 0;
const XRCD_ATTR_OFLAGS: u32 = 1 << 1;

/// `IBV_SRQ_INIT_ATTR_TYPE`, `_PD`, `_XRCD`, `_CQ`, `_TM`.
const SRQ_ATTR_TYPE: u32 = 1 << 0;
const SRQ_ATTR_PD: u32 = 1 << 1;
const SRQ_ATTR_XRCD: u32 = 1 << 2;
const SRQ_ATTR_CQ: u32 = 1 << 3;
const SRQ_ATTR_TM: u32 = 1 << 4;
/// `IBV_SRQT_BASIC`, `IBV_SRQT_XRC`.
const SRQT_BASIC: u32 = 0;
const SRQT_XRC: u32 = 1;

/// An XRC domain as C sees it: `struct verbs_xrcd` (its `ibv_xrcd`, then `comp_mask` and
/// `handle`), then the domain.
#[repr(C)]
pub(crate) struct XrcdC {
    /// `xrcd.context`.
    context: *mut IbvContext,
    comp_mask: u32,
    handle: u32,
    pub(crate) inner: softrdma::Xrcd,
    /// The file it belongs to, if opened with one: `(st_dev, st_ino)`.
    file: Option<(u64, u64)>,
}

/// The domains of files, per context: the domain and how many `ibv_xrcd`s name it.
pub(crate) type FileDomains = Mutex<HashMap<(u64, u64), (softrdma::Xrcd, usize)>>;

/// `verbs_context.open_xrcd`.
pub(crate) unsafe extern "C" fn open_xrcd(ctx: *mut IbvContext, attr: *mut IbvXrcdInitAttr) -> *mut c_void {
    guard(ptr::null_mut(), || {
        // SAFETY: ctx is ours or NULL; attr the caller's or NULL.
        let (Some(c), Some(a)) = (unsafe { ctx_of(ctx) }, unsafe { attr.as_ref() }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        // As rdma-core's ibv_cmd_open_xrcd: both fields, and nothing else.
        if a.comp_mask & !(XRCD_ATTR_FD | XRCD_ATTR_OFLAGS) != 0 {
            errno::set(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        if a.comp_mask != XRCD_ATTR_FD | XRCD_ATTR_OFLAGS {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
        let file = if a.fd == -1 {
            None
        } else {
            // SAFETY: an all-zero stat is valid; fstat writes it or fails.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: st is a local; a.fd is the caller's descriptor (fstat checks it).
            if unsafe { libc::fstat(a.fd, &mut st) } != 0 {
                errno::set(libc::EBADF);
                return ptr::null_mut();
            }
            Some((st.st_dev, st.st_ino))
        };
        let inner = match file {
            None => c.inner.open_xrcd(),
            Some(key) => {
                let mut files = c.xrcds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match files.get_mut(&key) {
                    Some(_) if a.oflags & libc::O_EXCL != 0 => {
                        errno::set(libc::EINVAL);
                        return ptr::null_mut();
                    }
                    Some((d, n)) => {
                        *n += 1;
                        Ok(d.clone())
                    }
                    None if a.oflags & libc::O_CREAT == 0 => {
                        errno::set(libc::EAGAIN); // no domain for the file, and not asked to make one
                        return ptr::null_mut();
                    }
                    None => c.inner.open_xrcd().inspect(|d| {
                        files.insert(key, (d.clone(), 1));
                    }),
                }
            }
        };
        errno::or_null(inner, |inner| {
            let handle = inner.id().0;
            boxed::<c_void, _>(XrcdC { context: ctx, comp_mask: 0, handle, inner, file })
        })
    })
}

/// `verbs_context.close_xrcd`: EBUSY while the domain has XRC SRQs or XRC_RECV QPs and this
/// is the last `ibv_xrcd` of it.
pub(crate) unsafe extern "C" fn close_xrcd(xrcd: *mut c_void) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: xrcd is ours (made by open_xrcd) or NULL.
        let Some(x) = (unsafe { obj::<c_void, XrcdC>(xrcd) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the context outlives its domains.
        let c = unsafe { ctx_of(x.context) };
        let mut files = c.map(|c| c.xrcds.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let others = match (&x.file, files.as_deref()) {
            (Some(key), Some(f)) => f.get(key).map_or(0, |(_, n)| n - 1),
            _ => 0,
        };
        if others == 0 && x.inner.in_use() {
            return libc::EBUSY;
        }
        if let (Some(key), Some(f)) = (&x.file, files.as_deref_mut()) {
            match f.get_mut(key) {
                Some((_, n)) if *n > 1 => *n -= 1,
                _ => {
                    f.remove(key);
                }
            }
        }
        drop(files);
        // SAFETY: made by open_xrcd, closed once.
        unsafe { free::<c_void, XrcdC>(xrcd) };
        0
    })
}

/// `verbs_context.create_srq_ex`: a basic SRQ in `attr.pd` or an XRC SRQ in `attr.pd`,
/// `attr.xrcd` and `attr.cq` (each named in `comp_mask`); tag-matching SRQs are EOPNOTSUPP.
pub(crate) unsafe extern "C" fn create_srq_ex(ctx: *mut IbvContext, attr: *mut IbvSrqInitAttrEx) -> *mut IbvSrq {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller's attributes or NULL.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        let known = SRQ_ATTR_TYPE | SRQ_ATTR_PD | SRQ_ATTR_XRCD | SRQ_ATTR_CQ;
        let srq_type = if a.comp_mask & SRQ_ATTR_TYPE != 0 { a.srq_type } else { SRQT_BASIC };
        if a.comp_mask & SRQ_ATTR_TM != 0 || !matches!(srq_type, SRQT_BASIC | SRQT_XRC) {
            errno::set(libc::EOPNOTSUPP); // tag matching
            return ptr::null_mut();
        }
        if a.comp_mask & !known != 0 || a.comp_mask & SRQ_ATTR_PD == 0 {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
        // SAFETY: the caller's PD, domain and CQ: ours or NULL.
        let (pd, xrcd, cq) =
            unsafe { (obj::<IbvPd, PdC>(a.pd), obj::<c_void, XrcdC>(a.xrcd), obj::<IbvCq, CqC>(a.cq)) };
        let Some(p) = pd.filter(|p| p.pd.context == ctx) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        let created = match srq_type {
            SRQT_XRC => {
                let (Some(x), Some(cq)) = (xrcd, cq) else {
                    errno::set(libc::EINVAL); // an XRC SRQ needs its domain and CQ
                    return ptr::null_mut();
                };
                if a.comp_mask & (SRQ_ATTR_XRCD | SRQ_ATTR_CQ) != SRQ_ATTR_XRCD | SRQ_ATTR_CQ {
                    errno::set(libc::EINVAL);
                    return ptr::null_mut();
                }
                p.inner.create_xrc_srq(&x.inner, &cq.inner, a.attr.max_wr, a.attr.max_sge)
            }
            _ => p.inner.create_srq(a.attr.max_wr, a.attr.max_sge),
        };
        errno::or_null(created, |inner| srq_c(p, a.pd, a.srq_context, inner))
    })
}

/// `verbs_context.get_srq_num`: the number peers' XRC sends name the SRQ by.
pub(crate) unsafe extern "C" fn get_srq_num(srq: *mut IbvSrq, srq_num: *mut u32) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: srq is ours or NULL; srq_num the caller's or NULL.
        let (Some(s), Some(out)) = (unsafe { obj::<IbvSrq, SrqC>(srq) }, unsafe { srq_num.as_mut() }) else {
            return libc::EINVAL;
        };
        *out = s.inner.number();
        0
    })
}

/// An XRC_RECV QP of domain `xrcd` (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_XRCD`): no PD,
/// CQs or SRQ in its `ibv_qp`.
///
/// # Safety
/// `ctx` must be ours, `xrcd` ours or NULL.
pub(crate) unsafe fn create_tgt_qp(ctx: *mut IbvContext, xrcd: *mut c_void, qp_context: *mut c_void) -> *mut IbvQp {
    // SAFETY: per the contract.
    let Some(x) = (unsafe { obj::<c_void, XrcdC>(xrcd) }) else {
        errno::set(libc::EINVAL);
        return ptr::null_mut();
    };
    let mut init = IbvQpInitAttr {
        qp_context,
        send_cq: ptr::null_mut(),
        recv_cq: ptr::null_mut(),
        srq: ptr::null_mut(),
        cap: IbvQpCap::default(),
        qp_type: crate::wr::QPT_XRC_RECV,
        sq_sig_all: 0,
    };
    errno::or_null(x.inner.create_tgt_qp(), |qp| wrap_qp_of(ctx, ptr::null_mut(), &mut init, qp))
}
