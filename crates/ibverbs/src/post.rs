//! The data path the header inlines reach through `ibv_context.ops`: `post_send`,
//! `post_recv`, `post_srq_recv`, `poll_cq`, `req_notify_cq`.
//!
//! `*bad_wr` is set as ibv_post_send(3) says: to the first WR that was not posted; every
//! WR before it was. A WR this layer cannot express (an unknown opcode, a negative
//! `num_sge`) stops the list there: the ones before it are posted first.

use std::ffi::c_int;
use std::ptr;

use smallvec::SmallVec;
use softrdma::{LKey, NetworkHdr, QKey, Qpn, RKey, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, Wc, WcOpcode};

use crate::abi::*;
use crate::errno;
use crate::guard;
use crate::objects::{AhC, CqC, QpC, SrqC, obj};

/// Work requests and SGEs of one post are converted on the stack up to these counts (a
/// post is mostly one WR of one or two SGEs): no allocation on the data path.
const INLINE_WRS: usize = 4;
type Sges = SmallVec<[Sge; 8]>;
/// A receive list: each WR's id and its SGEs' range in the [`Sges`].
type RecvList = SmallVec<[(u64, std::ops::Range<usize>); INLINE_WRS]>;

/// The SGEs of a C list as softrdma's.
///
/// # Safety
/// `sg` must point at `n` SGEs when `n > 0`.
unsafe fn sges(sg: *const IbvSge, n: c_int, out: &mut Sges) -> Option<()> {
    let n = usize::try_from(n).ok()?;
    if n > 0 && sg.is_null() {
        return None;
    }
    for i in 0..n {
        // SAFETY: the caller's list has n elements.
        let s = unsafe { *sg.add(i) };
        out.push(Sge { addr: s.addr, length: s.length, lkey: LKey(s.lkey) });
    }
    Some(())
}

/// The operation of a C send WR, or `None` for one softrdma does not do (or a BIND_MW
/// whose window or region is not ours).
///
/// # Safety
/// `w` must be a valid WR; for UD, `wr.ud.ah` one of ours; for BIND_MW, `bind_mw.mw` and
/// `bind_mw.bind_info.mr` ours or NULL.
unsafe fn send_op(w: &IbvSendWr, ud: bool) -> Option<(SendOp, Option<UdDest>)> {
    // SAFETY: reading the union member the opcode names.
    let (rdma, atomic) = unsafe { (w.wr.rdma, w.wr.atomic) };
    let imm = w.imm_data.to_ne_bytes(); // __be32 stored in network order
    let op = match w.opcode {
        0 => SendOp::RdmaWrite { remote_addr: rdma.remote_addr, rkey: RKey(rdma.rkey) },
        1 => SendOp::RdmaWriteWithImm { remote_addr: rdma.remote_addr, rkey: RKey(rdma.rkey), imm },
        2 => SendOp::Send,
        3 => SendOp::SendWithImm { imm },
        4 => SendOp::RdmaRead { remote_addr: rdma.remote_addr, rkey: RKey(rdma.rkey) },
        5 => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: RKey(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        6 => SendOp::FetchAdd { remote_addr: atomic.remote_addr, rkey: RKey(atomic.rkey), add: atomic.compare_add },
        // invalidate_rkey shares imm_data's slot, in host order.
        7 => SendOp::LocalInv { rkey: RKey(w.imm_data) },
        8 => {
            // rxe's validate_send_wr: nothing in the imm_data/invalidate_rkey slot.
            if w.imm_data != 0 {
                return None;
            }
            // SAFETY: the window and region are the caller's (ours) or NULL.
            let (id, _, bind) = unsafe { crate::objects::bind_of(w.bind_mw.mw, &w.bind_mw.bind_info) }?;
            SendOp::BindMw { mw: id, rkey: RKey(w.bind_mw.rkey), bind }
        }
        9 => SendOp::SendWithInv { rkey: RKey(w.imm_data) },
        // IBV_WR_ATOMIC_WRITE: the 8 bytes the first SGE holds, taken now (as rxe's provider).
        15 => {
            // SAFETY: the caller's SGE list has num_sge entries.
            let s = unsafe { w.sg_list.as_ref() }.filter(|s| w.num_sge >= 1 && s.length == 8 && s.addr != 0)?;
            // SAFETY: the SGE names 8 readable bytes of the caller's (its contract).
            let value = unsafe { (s.addr as usize as *const [u8; 8]).read_unaligned() };
            SendOp::AtomicWrite { remote_addr: rdma.remote_addr, rkey: RKey(rdma.rkey), value }
        }
        _ => return None,
    };
    let dest = if ud {
        // SAFETY: a UD WR carries wr.ud.
        let u = unsafe { w.wr.ud };
        // SAFETY: the AH is ours or NULL.
        let ah = unsafe { obj::<IbvAh, AhC>(u.ah) }?;
        Some(UdDest {
            ah: ah.inner.id(),
            remote_qpn: Qpn::from_u24_truncating(u.remote_qpn),
            remote_qkey: QKey(u.remote_qkey),
        })
    } else {
        None
    };
    Some((op, dest))
}

/// A C send WR as softrdma's, with its converted operation, destination and SGEs.
fn send_wr<'a>(c: &IbvSendWr, op: SendOp, ud: Option<UdDest>, xrc: bool, sg_list: &'a [Sge]) -> SendWr<'a> {
    SendWr {
        wr_id: c.wr_id,
        op,
        sg_list,
        flags: SendFlags(c.send_flags & 0xf),
        ud,
        xrc_srqn: xrc.then_some(c.remote_srqn),
    }
}

/// Finds the `index`-th WR of a C list.
///
/// # Safety
/// The list must have more than `index` WRs.
unsafe fn nth<T>(mut w: *mut T, index: usize, next: impl Fn(*mut T) -> *mut T) -> *mut T {
    for _ in 0..index {
        w = next(w);
    }
    w
}

/// What a post returns: 0, or the error number with `*bad` set to the first WR not posted
/// (ibv_post_send(3)).
///
/// # Safety
/// `wr` must be a valid list of more WRs than the index in `posted`; `bad` NULL or writable.
unsafe fn reported<T>(
    posted: Result<(), (c_int, usize)>,
    wr: *mut T,
    bad: *mut *mut T,
    next: impl Fn(*mut T) -> *mut T,
) -> c_int {
    match posted {
        Ok(()) => 0,
        Err((e, index)) => {
            if !bad.is_null() {
                // SAFETY: index is within the list; bad is the caller's.
                unsafe { *bad = nth(wr, index, next) };
            }
            e
        }
    }
}

/// Posts what was converted; returns the error number and the index of the first WR not
/// posted, or `Ok` when all of them were.
fn finish(posted: Result<(), softrdma::Error>, converted: usize, stop: Option<c_int>) -> Result<(), (c_int, usize)> {
    match posted {
        Err(softrdma::Error::Post { index, kind }) => {
            Err((errno::of(&softrdma::Error::Post { index, kind }), index.min(converted)))
        }
        Err(e) => Err((errno::of(&e), 0)),
        Ok(()) => match stop {
            Some(e) => Err((e, converted)),
            None => Ok(()),
        },
    }
}

pub(crate) unsafe extern "C" fn post_send(qp: *mut IbvQp, wr: *mut IbvSendWr, bad: *mut *mut IbvSendWr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp is ours or NULL.
        let Some(q) = (unsafe { obj::<IbvQp, QpC>(qp) }) else {
            return libc::EINVAL;
        };
        let ud = q.qpx.qp_base.qp_type == 4;
        // IBV_QPT_XRC_SEND: each WR names the XRC SRQ at the target.
        let xrc = q.qpx.qp_base.qp_type == 9;
        let mut sg = Sges::new();
        // SAFETY: the WR list is the caller's, NULL-terminated.
        if let Some(c) = unsafe { wr.as_ref() }.filter(|c| c.next.is_null()) {
            // The usual post, one WR: converted into one SendWr, without the lists below
            // (the layer's own instructions for a ping-pong's SEND 166 against 342, and
            // 91 against 261 for its receive: callgrind).
            // SAFETY: its SGE list has num_sge entries.
            let posted = match unsafe { (sges(c.sg_list, c.num_sge, &mut sg), send_op(c, ud)) } {
                (Some(()), Some((op, dest))) => {
                    if matches!(op, SendOp::AtomicWrite { .. }) {
                        sg.clear(); // its bytes are in the operation
                    }
                    let one = send_wr(c, op, dest, xrc, &sg);
                    finish(q.inner.post_send(std::slice::from_ref(&one)), 1, None)
                }
                _ => finish(Ok(()), 0, Some(libc::EINVAL)),
            };
            // SAFETY: the caller's list of one WR, and out pointer.
            return unsafe { reported(posted, wr, bad, |w| (*w).next) };
        }
        let mut ops = SmallVec::<[_; INLINE_WRS]>::new();
        let mut stop = None;
        let mut w = wr;
        // SAFETY: the WR list is the caller's, NULL-terminated; each WR's SGE list has num_sge entries.
        while let Some(c) = unsafe { w.as_ref() } {
            let start = sg.len();
            // SAFETY: as above.
            match unsafe { (sges(c.sg_list, c.num_sge, &mut sg), send_op(c, ud)) } {
                (Some(()), Some((op, dest))) => {
                    if matches!(op, SendOp::AtomicWrite { .. }) {
                        sg.truncate(start); // its bytes are in the operation
                    }
                    ops.push((c, op, dest, start..sg.len()))
                }
                _ => {
                    stop = Some(libc::EINVAL);
                    break;
                }
            }
            w = c.next;
        }
        let wrs: SmallVec<[SendWr<'_>; INLINE_WRS]> =
            ops.iter().map(|&(c, op, dest, ref r)| send_wr(c, op, dest, xrc, &sg[r.clone()])).collect();
        let posted = if wrs.is_empty() { Ok(()) } else { q.inner.post_send(&wrs) };
        // SAFETY: the caller's list and out pointer.
        unsafe { reported(finish(posted, wrs.len(), stop), wr, bad, |w| (*w).next) }
    })
}

/// Converts a C receive list; returns the WRs' ids and SGE ranges, and the error number
/// of the WR that stopped it, if one did.
///
/// # Safety
/// `wr` must be a valid NULL-terminated list.
unsafe fn recv_list(wr: *mut IbvRecvWr, sg: &mut Sges) -> (RecvList, Option<c_int>) {
    let mut out = SmallVec::new();
    let mut w = wr;
    // SAFETY: per the contract.
    while let Some(c) = unsafe { w.as_ref() } {
        let start = sg.len();
        // SAFETY: num_sge entries at sg_list.
        if unsafe { sges(c.sg_list, c.num_sge, sg) }.is_none() {
            return (out, Some(libc::EINVAL));
        }
        out.push((c.wr_id, start..sg.len()));
        w = c.next;
    }
    (out, None)
}

/// Posts a receive list with `post`, setting `*bad` as ibv_post_recv(3) says.
///
/// # Safety
/// `wr` must be a valid NULL-terminated list, `bad` NULL or writable.
unsafe fn post_recv_with(
    wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
    post: impl FnOnce(&[RecvWr<'_>]) -> Result<(), softrdma::Error>,
) -> c_int {
    let mut sg = Sges::new();
    // SAFETY: per the contract.
    if let Some(c) = unsafe { wr.as_ref() }.filter(|c| c.next.is_null()) {
        // The usual post, one WR: straight into one RecvWr, without the lists below.
        // SAFETY: its SGE list has num_sge entries.
        let posted = match unsafe { sges(c.sg_list, c.num_sge, &mut sg) } {
            Some(()) => finish(post(&[RecvWr { wr_id: c.wr_id, sg_list: &sg }]), 1, None),
            None => finish(Ok(()), 0, Some(libc::EINVAL)),
        };
        // SAFETY: per the contract.
        return unsafe { reported(posted, wr, bad, |w| (*w).next) };
    }
    // SAFETY: per the contract.
    let (list, stop) = unsafe { recv_list(wr, &mut sg) };
    let wrs: SmallVec<[RecvWr<'_>; INLINE_WRS]> =
        list.iter().map(|(id, r)| RecvWr { wr_id: *id, sg_list: &sg[r.clone()] }).collect();
    let posted = if wrs.is_empty() { Ok(()) } else { post(&wrs) };
    // SAFETY: per the contract.
    unsafe { reported(finish(posted, wrs.len(), stop), wr, bad, |w| (*w).next) }
}

pub(crate) unsafe extern "C" fn post_recv(qp: *mut IbvQp, wr: *mut IbvRecvWr, bad: *mut *mut IbvRecvWr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: qp is ours or NULL.
        let Some(q) = (unsafe { obj::<IbvQp, QpC>(qp) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller's list and out pointer.
        unsafe { post_recv_with(wr, bad, |w| q.inner.post_recv(w)) }
    })
}

pub(crate) unsafe extern "C" fn post_srq_recv(srq: *mut IbvSrq, wr: *mut IbvRecvWr, bad: *mut *mut IbvRecvWr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: srq is ours or NULL.
        let Some(s) = (unsafe { obj::<IbvSrq, SrqC>(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the caller's list and out pointer.
        unsafe { post_recv_with(wr, bad, |w| s.inner.post_recv(w)) }
    })
}

/// A softrdma completion as `struct ibv_wc`.
pub(crate) fn wc_c(wc: &Wc) -> IbvWc {
    let opcode = match wc.opcode {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::BindMw => 5,
        WcOpcode::LocalInv => 6,
        WcOpcode::Flush => 8,
        WcOpcode::AtomicWrite => 9,
        WcOpcode::Recv => 128,
        WcOpcode::RecvRdmaWithImm => 129,
    };
    let mut flags = 0;
    // On RoCE `sl` means nothing (priority is in DSCP/PCP); ConnectX reports there the
    // packet type of a UD receive (bit 3: UDP, i.e. RoCE v2; bits 0-2: 1 IPv6, 2 IPv4),
    // and UCX's UD transport reads it to find the destination address in the GRH area.
    let sl = match wc.grh {
        Some(NetworkHdr::Ipv6) => 0x8 | 1,
        Some(NetworkHdr::Ipv4) => 0x8 | 2,
        None => 0,
    };
    if wc.grh.is_some() {
        flags |= 1; // IBV_WC_GRH
    }
    if wc.imm_data.is_some() {
        flags |= 2; // IBV_WC_WITH_IMM
    }
    if wc.invalidated_rkey.is_some() {
        flags |= 8; // IBV_WC_WITH_INV
    }
    IbvWc {
        wr_id: wc.wr_id,
        status: errno::wc_status(wc.status),
        opcode,
        vendor_err: 0,
        byte_len: wc.byte_len,
        // The union's two members: __be32 imm_data, or the host-order invalidated_rkey.
        imm_data: match (wc.imm_data, wc.invalidated_rkey) {
            (Some(imm), _) => u32::from_ne_bytes(imm),
            (None, Some(rkey)) => rkey.0,
            (None, None) => 0,
        },
        qp_num: wc.qp_num.value(),
        src_qp: wc.src_qp.value(),
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl,
        dlid_path_bits: 0,
    }
}

pub(crate) unsafe extern "C" fn poll_cq(cq: *mut IbvCq, n: c_int, out: *mut IbvWc) -> c_int {
    guard(-1, || {
        // SAFETY: cq is ours or NULL.
        let Some(c) = (unsafe { obj::<IbvCq, CqC>(cq) }) else {
            return -1;
        };
        let Ok(n) = usize::try_from(n) else { return -1 };
        if n > 0 && out.is_null() {
            return -1;
        }
        // A buffer of completions as large as the call asks for, up to 16: a poll for one or
        // two (a ping-pong's) set up a buffer of 16 first (callgrind, the layer's own work a
        // call 121 instructions against 165).
        // SAFETY: out has n entries.
        let done = unsafe {
            if n <= 2 {
                poll_into(&c.inner, out, n, &mut [softrdma::EMPTY_WC; 2])
            } else {
                poll_into(&c.inner, out, n, &mut [softrdma::EMPTY_WC; 16])
            }
        };
        done as c_int
    })
}

/// Polls `cq` for at most `n` completions into `out`, through `buf`; how many there were.
///
/// # Safety
/// `out` must have room for `n` entries.
unsafe fn poll_into(cq: &softrdma::Cq, out: *mut IbvWc, n: usize, buf: &mut [Wc]) -> usize {
    let mut done = 0;
    while done < n {
        let want = (n - done).min(buf.len());
        let got = cq.poll(&mut buf[..want]);
        for (i, wc) in buf[..got].iter().enumerate() {
            // SAFETY: out has n entries and done + i < n.
            unsafe { ptr::write(out.add(done + i), wc_c(wc)) };
        }
        done += got;
        if got < want {
            break;
        }
    }
    done
}

pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut IbvCq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: cq is ours or NULL.
        let Some(c) = (unsafe { obj::<IbvCq, CqC>(cq) }) else {
            return libc::EINVAL;
        };
        match c.inner.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => errno::fail(&e),
        }
    })
}
