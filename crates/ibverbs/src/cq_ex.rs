//! The extended CQ: `ibv_create_cq_ex`, and the `ibv_start_poll` / `ibv_next_poll` /
//! `ibv_end_poll` and `ibv_wc_read_*` entries its `struct ibv_cq_ex` carries
//! (ibv_create_cq_ex(3)). Every CQ of ours is an `ibv_cq_ex`; one made by `ibv_create_cq_ex`
//! has the entries its `wc_flags` asked for, and the rest NULL, as rxe's. Completion
//! timestamps (which rxe lacks) are the device clock's ([`softrdma::Context::clock`], one
//! tick a nanosecond), which `ibv_query_rt_values_ex` reads.

use std::ffi::c_int;
use std::ptr;
use std::sync::PoisonError;

use crate::abi::*;
use crate::device::ctx_of;
use crate::errno;
use crate::guard;
use crate::objects::{CqC, new_cq, obj};

/// `IBV_WC_EX_WITH_BYTE_LEN` .. `IBV_WC_EX_WITH_DLID_PATH_BITS`: `IBV_WC_STANDARD_FLAGS`,
/// what `ibv_poll_cq` gives, and what kernel rxe offers.
const WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
const WC_EX_WITH_IMM: u64 = 1 << 1;
const WC_EX_WITH_QP_NUM: u64 = 1 << 2;
const WC_EX_WITH_SRC_QP: u64 = 1 << 3;
const WC_EX_WITH_SLID: u64 = 1 << 4;
const WC_EX_WITH_SL: u64 = 1 << 5;
const WC_EX_WITH_DLID_PATH_BITS: u64 = 1 << 6;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`.
const WC_EX_WITH_COMPLETION_TIMESTAMP: u64 = 1 << 7;
const WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
/// The `wc_flags` softrdma offers.
const SUPPORTED_WC_FLAGS: u64 = WC_EX_WITH_COMPLETION_TIMESTAMP
    | WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
    | WC_EX_WITH_BYTE_LEN
    | WC_EX_WITH_IMM
    | WC_EX_WITH_QP_NUM
    | WC_EX_WITH_SRC_QP
    | WC_EX_WITH_SLID
    | WC_EX_WITH_SL
    | WC_EX_WITH_DLID_PATH_BITS;

/// The device clock's rate in kHz (`ibv_device_attr_ex.hca_core_clock`): 1 GHz, a tick a
/// nanosecond.
pub(crate) const HCA_CORE_CLOCK_KHZ: u64 = 1_000_000;
/// `IBV_VALUES_MASK_RAW_CLOCK`.
const VALUES_MASK_RAW_CLOCK: u32 = 1;

/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`, `IBV_CQ_INIT_ATTR_MASK_PD`.
const CQ_INIT_ATTR_MASK_FLAGS: u32 = 1;
const CQ_INIT_ATTR_MASK_PD: u32 = 2;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a promise of the application's, nothing to do.
const CREATE_CQ_ATTR_SINGLE_THREADED: u32 = 1;

/// The extended part of a CQ that `ibv_create_cq` makes: `start_poll`, `next_poll`,
/// `end_poll` and the reads every CQ has; no `wc_flags` reads.
pub(crate) const EMPTY: IbvCqEx = IbvCqEx {
    cq: IbvCq {
        context: ptr::null_mut(),
        channel: ptr::null_mut(),
        cq_context: ptr::null_mut(),
        handle: 0,
        cqe: 0,
        mutex: [0; 5],
        cond: [0; 6],
        comp_events_completed: 0,
        async_events_completed: 0,
    },
    comp_mask: 0,
    status: 0,
    wr_id: 0,
    start_poll: Some(start_poll),
    next_poll: Some(next_poll),
    end_poll: Some(end_poll),
    read_opcode: Some(read_opcode),
    read_vendor_err: Some(read_vendor_err),
    read_byte_len: None,
    read_imm_data: None,
    read_qp_num: None,
    read_src_qp: None,
    read_wc_flags: Some(read_wc_flags),
    read_slid: None,
    read_sl: None,
    read_dlid_path_bits: None,
    read_completion_ts: None,
    read_cvlan: None,
    read_flow_tag: None,
    read_tm_info: None,
    read_completion_wallclock_ns: None,
};

/// `verbs_context.create_cq_ex`: a CQ whose `ibv_wc_read_*` entries are those
/// `attr.wc_flags` names. EINVAL for a NULL `attr`, an unknown `comp_mask` bit, an invalid
/// `comp_vector` or `cqe`; EOPNOTSUPP for a `wc_flags` bit past `IBV_WC_STANDARD_FLAGS`
/// and the two timestamps (VLAN, flow tag, tag matching), `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`
/// (kernel rxe refuses it too); EINVAL for `IBV_CQ_INIT_ATTR_MASK_PD` with no parent domain
/// (a plain PD is not one), as mlx5.
pub(crate) unsafe extern "C" fn create_cq_ex(ctx: *mut IbvContext, attr: *mut IbvCqInitAttrEx) -> *mut IbvCqEx {
    guard(ptr::null_mut(), || {
        // SAFETY: attr is NULL or the caller's struct ibv_cq_init_attr_ex.
        let Some(a) = (unsafe { attr.as_ref() }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        let unsupported = (a.comp_mask & CQ_INIT_ATTR_MASK_FLAGS != 0
            && a.flags & !CREATE_CQ_ATTR_SINGLE_THREADED != 0)
            || a.wc_flags & !SUPPORTED_WC_FLAGS != 0;
        // SAFETY: parent_domain is NULL or a PD of ours.
        let parent = unsafe { obj::<IbvPd, crate::objects::PdC>(a.parent_domain) };
        let not_parent = a.comp_mask & CQ_INIT_ATTR_MASK_PD != 0 && parent.is_none_or(|p| p.parent.is_none());
        let refused = if a.comp_mask & !(CQ_INIT_ATTR_MASK_FLAGS | CQ_INIT_ATTR_MASK_PD) != 0 || not_parent {
            libc::EINVAL
        } else if unsupported {
            libc::EOPNOTSUPP
        } else {
            0
        };
        let (0, Ok(n), Ok(vector)) = (refused, c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
            errno::set(if refused != 0 { refused } else { libc::EINVAL });
            return ptr::null_mut();
        };
        let flags = a.wc_flags;
        // SAFETY: ctx and channel are ours or NULL, per the contract.
        let cq = unsafe {
            new_cq(ctx, n, a.cq_context, a.channel, vector, |cq| {
                let with = |bit| flags & bit != 0;
                cq.read_byte_len = with(WC_EX_WITH_BYTE_LEN).then_some(read_byte_len);
                cq.read_imm_data = with(WC_EX_WITH_IMM).then_some(read_imm_data);
                cq.read_qp_num = with(WC_EX_WITH_QP_NUM).then_some(read_qp_num);
                cq.read_src_qp = with(WC_EX_WITH_SRC_QP).then_some(read_src_qp);
                cq.read_slid = with(WC_EX_WITH_SLID).then_some(read_slid);
                cq.read_sl = with(WC_EX_WITH_SL).then_some(read_sl);
                cq.read_dlid_path_bits = with(WC_EX_WITH_DLID_PATH_BITS).then_some(read_dlid_path_bits);
                cq.read_completion_ts = with(WC_EX_WITH_COMPLETION_TIMESTAMP).then_some(read_completion_ts);
                cq.read_completion_wallclock_ns =
                    with(WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK).then_some(read_completion_wallclock_ns);
            })
        };
        cq.cast()
    })
}

/// The CQ of `cq` (ours: the start of a `CqC`).
fn cq_of<'a>(cq: *mut IbvCqEx) -> Option<&'a CqC> {
    // SAFETY: cq is the ibv_cq_ex at the start of one of our CqCs, or NULL.
    unsafe { obj::<IbvCqEx, CqC>(cq) }
}

/// Takes the CQ's next completion into `current` and `status`/`wr_id`: 0, or ENOENT
/// when there is none.
fn advance(cq: *mut IbvCqEx, c: &CqC) -> c_int {
    let mut wc = [softrdma::EMPTY_WC];
    if c.inner.poll(&mut wc) == 0 {
        return libc::ENOENT;
    }
    let at = wc[0].completed_at;
    let wc = crate::post::wc_c(&wc[0]);
    *c.current.lock().unwrap_or_else(PoisonError::into_inner) = Current { wc, at };
    // SAFETY: cq is ours and live; status and wr_id are written only by the thread in the
    // poll section, which this one is, and read by it through the header's inlines.
    unsafe {
        (*cq).status = wc.status;
        (*cq).wr_id = wc.wr_id;
    }
    0
}

/// `ibv_start_poll`: enters the CQ's poll section and makes the next completion current;
/// ENOENT (and the section left) when there is none, EINVAL for an unknown
/// `attr.comp_mask` bit.
unsafe extern "C" fn start_poll(cq: *mut IbvCqEx, attr: *mut IbvPollCqAttr) -> c_int {
    guard(libc::EIO, || {
        let Some(c) = cq_of(cq) else { return libc::EINVAL };
        // SAFETY: attr is NULL or the caller's struct ibv_poll_cq_attr.
        if unsafe { attr.as_ref() }.is_some_and(|a| a.comp_mask != 0) {
            return libc::EINVAL;
        }
        c.section.enter();
        let r = advance(cq, c);
        if r != 0 {
            c.section.leave();
        }
        r
    })
}

/// `ibv_next_poll`: the next completion, or ENOENT.
unsafe extern "C" fn next_poll(cq: *mut IbvCqEx) -> c_int {
    guard(libc::EIO, || cq_of(cq).map_or(libc::EINVAL, |c| advance(cq, c)))
}

/// `ibv_end_poll`: leaves the poll section.
unsafe extern "C" fn end_poll(cq: *mut IbvCqEx) {
    guard((), || {
        if let Some(c) = cq_of(cq) {
            c.section.leave();
        }
    })
}

/// The completion `ibv_start_poll`/`ibv_next_poll` made current: as `ibv_poll_cq` would
/// have written it, and when the device made it.
#[derive(Clone, Copy)]
pub(crate) struct Current {
    pub(crate) wc: IbvWc,
    pub(crate) at: Option<softrdma::Instant>,
}

/// `f` of the current completion (zeros for a CQ not ours).
fn read<T: Default>(cq: *mut IbvCqEx, f: impl FnOnce(&IbvWc) -> T) -> T {
    read_current(cq, |c| f(&c.wc))
}

fn read_current<T: Default>(cq: *mut IbvCqEx, f: impl FnOnce(&Current) -> T) -> T {
    guard(T::default(), || {
        cq_of(cq).map_or_else(T::default, |c| f(&c.current.lock().unwrap_or_else(PoisonError::into_inner)))
    })
}

unsafe extern "C" fn read_opcode(cq: *mut IbvCqEx) -> u32 {
    read(cq, |w| w.opcode)
}

unsafe extern "C" fn read_vendor_err(cq: *mut IbvCqEx) -> u32 {
    read(cq, |w| w.vendor_err)
}

unsafe extern "C" fn read_byte_len(cq: *mut IbvCqEx) -> u32 {
    read(cq, |w| w.byte_len)
}

/// In network order, as `ibv_wc.imm_data`.
unsafe extern "C" fn read_imm_data(cq: *mut IbvCqEx) -> u32 {
    read(cq, |w| w.imm_data)
}

unsafe extern "C" fn read_qp_num(cq: *mut IbvCqEx) -> u32 {
    read(cq, |w| w.qp_num)
}

unsafe extern "C" fn read_src_qp(cq: *mut IbvCqEx) -> u32 {
    read(cq, |w| w.src_qp)
}

unsafe extern "C" fn read_wc_flags(cq: *mut IbvCqEx) -> u32 {
    read(cq, |w| w.wc_flags)
}

unsafe extern "C" fn read_slid(cq: *mut IbvCqEx) -> u32 {
    read(cq, |w| u32::from(w.slid))
}

/// What `ibv_wc.sl` holds: on RoCE, a UD receive's packet type (see `wc_c`).
unsafe extern "C" fn read_sl(cq: *mut IbvCqEx) -> u8 {
    read(cq, |w| w.sl)
}

unsafe extern "C" fn read_dlid_path_bits(cq: *mut IbvCqEx) -> u8 {
    read(cq, |w| w.dlid_path_bits)
}

/// The completion's timestamp on the device clock, in ticks of `hca_core_clock`
/// (nanoseconds since the context opened).
unsafe extern "C" fn read_completion_ts(cq: *mut IbvCqEx) -> u64 {
    read_current(cq, |c| c.at.map_or(0, softrdma::Instant::as_nanos))
}

/// The completion's timestamp as wall-clock time, nanoseconds since the Unix epoch.
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut IbvCqEx) -> u64 {
    guard(0, || {
        let Some(c) = cq_of(cq) else { return 0 };
        let at = c.current.lock().unwrap_or_else(PoisonError::into_inner).at.unwrap_or_default();
        // SAFETY: a CQ's context outlives it.
        unsafe { ctx_of(c.cq.cq.context) }.map_or(0, |ctx| ctx.inner.wallclock_ns(at))
    })
}

/// `verbs_context.query_rt_values`: with `IBV_VALUES_MASK_RAW_CLOCK`, the device clock now
/// in `raw_clock`, in ticks of `hca_core_clock`, as mlx5 gives it (`tv_sec` 0, the ticks in
/// `tv_nsec`), the completion timestamps' clock. EINVAL for another `comp_mask` bit.
pub(crate) unsafe extern "C" fn query_rt_values(ctx: *mut IbvContext, values: *mut IbvValuesEx) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is ours or NULL; values is NULL or the caller's struct ibv_values_ex.
        let (Some(c), Some(v)) = (unsafe { ctx_of(ctx) }, unsafe { values.as_mut() }) else {
            return libc::EINVAL;
        };
        if v.comp_mask & !VALUES_MASK_RAW_CLOCK != 0 {
            return libc::EINVAL;
        }
        if v.comp_mask & VALUES_MASK_RAW_CLOCK != 0 {
            let ticks = libc::c_long::try_from(c.inner.clock().as_nanos()).unwrap_or(libc::c_long::MAX);
            v.raw_clock = libc::timespec { tv_sec: 0, tv_nsec: ticks };
        }
        0
    })
}
