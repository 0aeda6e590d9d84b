//! The extended send API: `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`,
//! `ibv_qp_to_qp_ex` and the `ibv_wr_*` builders (ibv_wr_post(3)).
//!
//! Every QP's wrapper starts with a whole `struct ibv_qp_ex` (its `qp_base` is the
//! `ibv_qp` programs hold), whose builder pointers the header's inlines call unchecked.
//! Between `ibv_wr_start` and `ibv_wr_complete` the builders collect work requests in the
//! QP's [`Builder`], one thread at a time ([`Section`]); a builder or setter that cannot do what it is asked (an operation the
//! QP was not created for, a setter with no work request to set, an AH not ours) records
//! the error, and `ibv_wr_complete` returns it having posted nothing. `ibv_wr_complete`
//! posts the batch with [`softrdma::Qp::post_send_all`]: all of it, or none ("the entire
//! posting will be aborted").

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::PoisonError;

use softrdma::{LKey, QKey, Qpn, RKey, SendFlags, SendOp, SendWr, Sge, UdDest};

use crate::abi::*;
use crate::errno;
use crate::guard;
use crate::objects::{AhC, QpC, obj};

/// `IBV_QP_INIT_ATTR_PD`, `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: the `comp_mask` bits
/// `ibv_create_qp_ex` takes.
const INIT_ATTR_PD: u32 = 1 << 0;
/// `IBV_QP_INIT_ATTR_XRCD`: an XRC_RECV QP's domain.
const INIT_ATTR_XRCD: u32 = 1 << 1;
/// `IBV_QPT_XRC_SEND`, `IBV_QPT_XRC_RECV`.
pub(crate) const QPT_XRC_SEND: u32 = 9;
pub(crate) const QPT_XRC_RECV: u32 = 10;
const INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`: taken with no flag set (softrdma does none of them).
const INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;

/// `enum ibv_qp_create_send_ops_flags` that softrdma does.
const WITH_RDMA_WRITE: u64 = 1 << 0;
const WITH_RDMA_WRITE_WITH_IMM: u64 = 1 << 1;
const WITH_SEND: u64 = 1 << 2;
const WITH_SEND_WITH_IMM: u64 = 1 << 3;
const WITH_RDMA_READ: u64 = 1 << 4;
const WITH_ATOMIC_CMP_AND_SWP: u64 = 1 << 5;
const WITH_ATOMIC_FETCH_AND_ADD: u64 = 1 << 6;
const WITH_LOCAL_INV: u64 = 1 << 7;
const WITH_BIND_MW: u64 = 1 << 8;
const WITH_SEND_WITH_INV: u64 = 1 << 9;
const WITH_FLUSH: u64 = 1 << 11;
const WITH_ATOMIC_WRITE: u64 = 1 << 12;
const SUPPORTED: u64 = WITH_ATOMIC_WRITE
    | WITH_FLUSH
    | WITH_RDMA_WRITE
    | WITH_RDMA_WRITE_WITH_IMM
    | WITH_SEND
    | WITH_SEND_WITH_IMM
    | WITH_RDMA_READ
    | WITH_ATOMIC_CMP_AND_SWP
    | WITH_ATOMIC_FETCH_AND_ADD
    | WITH_LOCAL_INV
    | WITH_BIND_MW
    | WITH_SEND_WITH_INV;

/// `IBV_SEND_INLINE`.
const SEND_INLINE: u32 = 8;

/// One work request being built.
struct Pending {
    wr_id: u64,
    flags: u32,
    op: SendOp,
    sges: Vec<Sge>,
    /// Inline data, copied when it is set (the caller may reuse its buffer at once).
    inline: Option<Vec<u8>>,
    ud: Option<UdDest>,
    /// `ibv_wr_set_xrc_srqn`.
    xrc_srqn: Option<u32>,
}

/// The work requests of one `ibv_wr_start` .. `ibv_wr_complete` section.
#[derive(Default)]
pub(crate) struct Builder {
    wrs: Vec<Pending>,
    /// The first thing that went wrong: `ibv_wr_complete` returns it.
    error: Option<c_int>,
}

/// The builders every QP's `ibv_qp_ex` carries.
pub(crate) fn qp_ex(qp_base: IbvQp) -> IbvQpEx {
    IbvQpEx {
        qp_base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp,
        wr_atomic_fetch_add,
        wr_bind_mw,
        wr_local_inv,
        wr_rdma_read,
        wr_rdma_write,
        wr_rdma_write_imm,
        wr_send,
        wr_send_imm,
        wr_send_inv,
        wr_send_tso,
        wr_set_ud_addr,
        wr_set_xrc_srqn,
        wr_set_inline_data,
        wr_set_inline_data_list,
        wr_set_sge,
        wr_set_sge_list,
        wr_start,
        wr_complete,
        wr_abort,
        wr_atomic_write,
        wr_flush,
    }
}

/// `verbs_context.create_qp_ex`: a QP in `attr.pd`, or an XRC_RECV QP of `attr.xrcd`
/// (`IBV_QP_INIT_ATTR_XRCD`; it has no PD, CQs or queues); with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` its `ibv_qp_ex` takes the `ibv_wr_*` operations named
/// there; `IBV_QP_INIT_ATTR_CREATE_FLAGS` with no flag set is taken. Other `comp_mask` bits
/// (TSO, RSS), any creation flag and
/// operations softrdma does not do (TSO), or that the transport has not (UC: READ, atomics,
/// ATOMIC_WRITE, SEND_WITH_INV, which no UC opcode carries; UD: all but SENDs), fail with
/// `EOPNOTSUPP`, as ibv_create_qp_ex(3) says of a QP that cannot do what was asked.
pub(crate) unsafe extern "C" fn create_qp_ex(ctx: *mut IbvContext, attr: *mut IbvQpInitAttrEx) -> *mut IbvQp {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller's attributes or NULL.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        let flags = if a.comp_mask & INIT_ATTR_CREATE_FLAGS != 0 { a.create_flags } else { 0 };
        let known = INIT_ATTR_PD | INIT_ATTR_XRCD | INIT_ATTR_SEND_OPS_FLAGS | INIT_ATTR_CREATE_FLAGS;
        if a.comp_mask & !known != 0 || flags != 0 {
            errno::set(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        if a.qp_type == QPT_XRC_RECV {
            if a.comp_mask & INIT_ATTR_XRCD == 0 || a.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0 {
                errno::set(libc::EINVAL); // its domain, and it sends nothing
                return ptr::null_mut();
            }
            // SAFETY: the caller's XRC domain (ours) or NULL; ctx is ours.
            return unsafe { crate::xrc::create_tgt_qp(ctx, a.xrcd.cast(), a.qp_context) };
        }
        if a.comp_mask & INIT_ATTR_PD == 0 || a.pd.is_null() || ctx.is_null() {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        }
        let send_ops = if a.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0 { a.send_ops_flags } else { 0 };
        // What each transport can post (IBA: UC has no READ, atomics or SEND_WITH_INV, UD
        // only SENDs; BIND_MW and LOCAL_INV are local, as rxe has them on UC).
        let uc = WITH_RDMA_WRITE | WITH_RDMA_WRITE_WITH_IMM | WITH_SEND | WITH_SEND_WITH_IMM;
        let possible = match a.qp_type {
            2 => SUPPORTED,                                                // RC
            3 => uc | WITH_BIND_MW | WITH_LOCAL_INV,                       // UC
            4 => WITH_SEND | WITH_SEND_WITH_IMM,                           // UD
            QPT_XRC_SEND => SUPPORTED & !(WITH_ATOMIC_WRITE | WITH_FLUSH), // no XRC opcodes for them
            _ => 0,
        };
        if send_ops & !possible != 0 {
            errno::set(libc::EOPNOTSUPP);
            return ptr::null_mut();
        }
        let mut init = a.plain();
        // SAFETY: pd is the caller's PD (ours); init is a local.
        let qp = unsafe { crate::objects::create_qp(a.pd, &mut init) };
        a.cap = init.cap;
        if !qp.is_null() && send_ops != 0 {
            // SAFETY: just made by create_qp, so a QpC.
            let q = unsafe { &mut *qp.cast::<QpC>() };
            q.send_ops = send_ops;
        }
        qp
    })
}

/// `ibv_qp_to_qp_ex`: the `ibv_qp_ex` of a QP made with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`,
/// NULL for any other.
unsafe extern "C" fn qp_to_qp_ex(qp: *mut IbvQp) -> *mut IbvQpEx {
    guard(ptr::null_mut(), || {
        // SAFETY: qp is ours or NULL.
        match unsafe { obj::<IbvQp, QpC>(qp) } {
            Some(q) if q.send_ops != 0 => qp.cast(),
            _ => {
                errno::set(libc::EOPNOTSUPP);
                ptr::null_mut()
            }
        }
    })
}
export!("ibv_qp_to_qp_ex", "IBVERBS_1.6", qp_to_qp_ex);

/// `ibv_wr_start` .. `ibv_wr_complete`/`ibv_wr_abort` is a per-QP critical section
/// (ibv_wr_post(3), CONCURRENCY): a second thread's `ibv_wr_start` waits for the first
/// thread's section to end, and only the thread in the section builds.
#[derive(Default)]
pub(crate) struct Section {
    busy: std::sync::Mutex<bool>,
    free: std::sync::Condvar,
}

impl Section {
    pub(crate) fn enter(&self) {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while *busy {
            busy = self.free.wait(busy).unwrap_or_else(PoisonError::into_inner);
        }
        *busy = true;
    }

    pub(crate) fn leave(&self) {
        *self.busy.lock().unwrap_or_else(PoisonError::into_inner) = false;
        self.free.notify_one();
    }
}

/// Runs `f` on the builder of `qpx` (ours: the start of a `QpC`).
fn with_builder(qpx: *mut IbvQpEx, f: impl FnOnce(&QpC, &mut Builder)) {
    guard((), || {
        // SAFETY: qpx is the ibv_qp_ex at the start of one of our QpCs, or NULL.
        let Some(q) = (unsafe { obj::<IbvQpEx, QpC>(qpx) }) else { return };
        let mut b = q.builder.lock().unwrap_or_else(PoisonError::into_inner);
        f(q, &mut b);
    })
}

impl Builder {
    fn fail(&mut self, n: c_int) {
        self.error.get_or_insert(n);
    }

    /// A builder: a new work request with the QP's `wr_id` and `wr_flags`, if the QP was
    /// created for `needs`.
    fn push(&mut self, q: &QpC, needs: u64, op: SendOp) {
        if q.send_ops & needs == 0 {
            self.fail(libc::EINVAL); // not asked for in send_ops_flags
            return;
        }
        // The application set them before calling the builder (ibv_wr_post(3)).
        let (wr_id, flags) = (q.qpx.wr_id, q.qpx.wr_flags);
        self.wrs.push(Pending { wr_id, flags, op, sges: Vec::new(), inline: None, ud: None, xrc_srqn: None });
    }

    /// A setter: the work request built last.
    fn last(&mut self) -> Option<&mut Pending> {
        if self.wrs.is_empty() {
            self.fail(libc::EINVAL); // a setter before any builder
        }
        self.wrs.last_mut()
    }
}

unsafe extern "C" fn wr_start(qpx: *mut IbvQpEx) {
    guard((), || {
        // SAFETY: qpx is the ibv_qp_ex at the start of one of our QpCs, or NULL.
        if let Some(q) = unsafe { obj::<IbvQpEx, QpC>(qpx) } {
            q.section.enter(); // not under the builder's lock: a waiter must not hold it
        }
    });
    with_builder(qpx, |_, b| *b = Builder::default());
}

unsafe extern "C" fn wr_abort(qpx: *mut IbvQpEx) {
    with_builder(qpx, |q, b| {
        *b = Builder::default();
        q.section.leave();
    });
}

unsafe extern "C" fn wr_complete(qpx: *mut IbvQpEx) -> c_int {
    let mut rc = libc::EIO;
    with_builder(qpx, |q, b| {
        let batch = std::mem::take(b);
        q.section.leave(); // the batch is this call's now
        if let Some(n) = batch.error {
            rc = n;
            return;
        }
        // Inline data lives in the batch until posted; the engine copies it then.
        let inline_sges: Vec<Option<Sge>> = batch
            .wrs
            .iter()
            .map(|p| p.inline.as_ref().map(|d| Sge { addr: d.as_ptr() as u64, length: d.len() as u32, lkey: LKey(0) }))
            .collect();
        let wrs: Vec<SendWr<'_>> = batch
            .wrs
            .iter()
            .zip(&inline_sges)
            .map(|(p, inline)| {
                let flags = if inline.is_some() { p.flags | SEND_INLINE } else { p.flags };
                SendWr {
                    wr_id: p.wr_id,
                    op: p.op,
                    sg_list: inline.as_slice().get(..1).unwrap_or(&p.sges),
                    flags: SendFlags(flags & 0xf),
                    ud: p.ud,
                    xrc_srqn: p.xrc_srqn,
                }
            })
            .collect();
        rc = match q.inner.post_send_all(&wrs) {
            Ok(()) => 0,
            Err(e) => errno::of(&e),
        };
    });
    rc
}

unsafe extern "C" fn wr_send(qpx: *mut IbvQpEx) {
    with_builder(qpx, |q, b| b.push(q, WITH_SEND, SendOp::Send));
}

unsafe extern "C" fn wr_send_imm(qpx: *mut IbvQpEx, imm: u32) {
    let imm = imm.to_ne_bytes(); // __be32, already in network order
    with_builder(qpx, |q, b| b.push(q, WITH_SEND_WITH_IMM, SendOp::SendWithImm { imm }));
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut IbvQpEx, rkey: u32, remote_addr: u64) {
    with_builder(qpx, |q, b| b.push(q, WITH_RDMA_WRITE, SendOp::RdmaWrite { remote_addr, rkey: RKey(rkey) }));
}

unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut IbvQpEx, rkey: u32, remote_addr: u64, imm: u32) {
    let op = SendOp::RdmaWriteWithImm { remote_addr, rkey: RKey(rkey), imm: imm.to_ne_bytes() };
    with_builder(qpx, |q, b| b.push(q, WITH_RDMA_WRITE_WITH_IMM, op));
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut IbvQpEx, rkey: u32, remote_addr: u64) {
    with_builder(qpx, |q, b| b.push(q, WITH_RDMA_READ, SendOp::RdmaRead { remote_addr, rkey: RKey(rkey) }));
}

unsafe extern "C" fn wr_atomic_cmp_swp(qpx: *mut IbvQpEx, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
    let op = SendOp::CompareSwap { remote_addr, rkey: RKey(rkey), compare, swap };
    with_builder(qpx, |q, b| b.push(q, WITH_ATOMIC_CMP_AND_SWP, op));
}

unsafe extern "C" fn wr_atomic_fetch_add(qpx: *mut IbvQpEx, rkey: u32, remote_addr: u64, add: u64) {
    let op = SendOp::FetchAdd { remote_addr, rkey: RKey(rkey), add };
    with_builder(qpx, |q, b| b.push(q, WITH_ATOMIC_FETCH_AND_ADD, op));
}

/// `ibv_wr_bind_mw`: binds `mw` as `info` says, its R_Key then `rkey` (whose low 8 bits
/// are the key; `ibv_inc_rkey`), as rxe's (which leaves `mw->rkey` to the application).
unsafe extern "C" fn wr_bind_mw(qpx: *mut IbvQpEx, mw: *mut c_void, rkey: u32, info: *const c_void) {
    with_builder(qpx, |q, b| {
        // SAFETY: the caller's bind info, or NULL.
        let Some(info) = (unsafe { info.cast::<IbvMwBindInfo>().as_ref() }) else {
            b.fail(libc::EINVAL);
            return;
        };
        // SAFETY: the window and region are the caller's (ours) or NULL.
        match unsafe { crate::objects::bind_of(mw.cast(), info) } {
            Some((id, _, bind)) => b.push(q, WITH_BIND_MW, SendOp::BindMw { mw: id, rkey: RKey(rkey), bind }),
            None => b.fail(libc::EINVAL),
        }
    });
}

unsafe extern "C" fn wr_local_inv(qpx: *mut IbvQpEx, rkey: u32) {
    with_builder(qpx, |q, b| b.push(q, WITH_LOCAL_INV, SendOp::LocalInv { rkey: RKey(rkey) }));
}

unsafe extern "C" fn wr_send_inv(qpx: *mut IbvQpEx, rkey: u32) {
    with_builder(qpx, |q, b| b.push(q, WITH_SEND_WITH_INV, SendOp::SendWithInv { rkey: RKey(rkey) }));
}

/// Builders of operations softrdma does not do (creation refuses their flags, so only a
/// program that calls one it did not ask for gets here): the batch fails.
unsafe extern "C" fn wr_send_tso(qpx: *mut IbvQpEx, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    with_builder(qpx, |_, b| b.fail(libc::EOPNOTSUPP));
}

/// `ibv_wr_set_xrc_srqn`: the XRC SRQ at the target that takes the work request built last
/// (an XRC_SEND QP's; any other QP's batch fails).
unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut IbvQpEx, srqn: u32) {
    with_builder(qpx, |q, b| {
        if q.qpx.qp_base.qp_type != QPT_XRC_SEND {
            b.fail(libc::EINVAL);
            return;
        }
        if let Some(p) = b.last() {
            p.xrc_srqn = Some(srqn);
        }
    });
}

/// `ibv_wr_atomic_write`: the 8 bytes at `data`, taken now.
unsafe extern "C" fn wr_atomic_write(qpx: *mut IbvQpEx, rkey: u32, remote_addr: u64, data: *const c_void) {
    with_builder(qpx, |q, b| {
        if data.is_null() {
            b.fail(libc::EINVAL);
            return;
        }
        // SAFETY: data names the 8 bytes to write (the caller's contract).
        let value = unsafe { data.cast::<[u8; 8]>().read_unaligned() };
        b.push(q, WITH_ATOMIC_WRITE, SendOp::AtomicWrite { remote_addr, rkey: RKey(rkey), value });
    });
}

/// `ibv_wr_flush` (rdma-core 47 on): `len` bytes at `remote_addr` (`IBV_FLUSH_RANGE`) or the
/// whole region of `rkey` (`IBV_FLUSH_MR`), to global visibility and/or persistence
/// (`type`: `IBV_FLUSH_GLOBAL`, `IBV_FLUSH_PERSISTENT`).
unsafe extern "C" fn wr_flush(qpx: *mut IbvQpEx, rkey: u32, remote_addr: u64, len: usize, placement: u8, level: u8) {
    with_builder(qpx, |q, b| {
        let Ok(length) = u32::try_from(len) else {
            b.fail(libc::EINVAL); // a RETH's length is 32 bits
            return;
        };
        b.push(q, WITH_FLUSH, SendOp::Flush { remote_addr, rkey: RKey(rkey), length, placement, level });
    });
}

unsafe extern "C" fn wr_set_sge(qpx: *mut IbvQpEx, lkey: u32, addr: u64, length: u32) {
    with_builder(qpx, |_, b| {
        if let Some(p) = b.last() {
            p.sges = vec![Sge { addr, length, lkey: LKey(lkey) }];
        }
    });
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut IbvQpEx, n: usize, list: *const IbvSge) {
    with_builder(qpx, |_, b| {
        if n > 0 && list.is_null() {
            b.fail(libc::EINVAL);
            return;
        }
        let Some(p) = b.last() else { return };
        p.sges = (0..n)
            .map(|i| {
                // SAFETY: the caller's list of n SGEs.
                let s = unsafe { *list.add(i) };
                Sge { addr: s.addr, length: s.length, lkey: LKey(s.lkey) }
            })
            .collect();
    });
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut IbvQpEx, addr: *mut c_void, length: usize) {
    let buf = IbvDataBuf { addr, length };
    // SAFETY: one buffer, the caller's.
    unsafe { wr_set_inline_data_list(qpx, 1, &buf) };
}

unsafe extern "C" fn wr_set_inline_data_list(qpx: *mut IbvQpEx, n: usize, list: *const IbvDataBuf) {
    with_builder(qpx, |_, b| {
        if n > 0 && list.is_null() {
            b.fail(libc::EINVAL);
            return;
        }
        let mut data = Vec::new();
        for i in 0..n {
            // SAFETY: the caller's list of n buffers, each `length` readable bytes.
            let d = unsafe { *list.add(i) };
            if d.length > 0 && d.addr.is_null() {
                b.fail(libc::EINVAL);
                return;
            }
            if d.length > 0 {
                // SAFETY: as above.
                data.extend_from_slice(unsafe { std::slice::from_raw_parts(d.addr.cast::<u8>(), d.length) });
            }
        }
        if let Some(p) = b.last() {
            p.inline = Some(data);
        }
    });
}

unsafe extern "C" fn wr_set_ud_addr(qpx: *mut IbvQpEx, ah: *mut IbvAh, remote_qpn: u32, remote_qkey: u32) {
    with_builder(qpx, |_, b| {
        // SAFETY: ah is ours or NULL.
        let Some(a) = (unsafe { obj::<IbvAh, AhC>(ah) }) else {
            b.fail(libc::EINVAL);
            return;
        };
        let dest = UdDest {
            ah: a.inner.id(),
            remote_qpn: Qpn::from_u24_truncating(remote_qpn),
            remote_qkey: QKey(remote_qkey),
        };
        if let Some(p) = b.last() {
            p.ud = Some(dest);
        }
    });
}
