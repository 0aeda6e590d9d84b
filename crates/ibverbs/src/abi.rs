#![allow(missing_docs)] // Field names are rdma-core's, documented in <infiniband/verbs.h>.
//! rdma-core's public C structs (`<infiniband/verbs.h>`, v44, x86_64), as far as this
//! library reads or writes them. Every size and offset is checked against the real header
//! by `tests/layout.rs`; fields nobody here touches are padding of the right size.

use std::ffi::{c_char, c_int, c_void};

/// `pthread_mutex_t` (40 bytes on x86_64 glibc); all zero is `PTHREAD_MUTEX_INITIALIZER`.
pub type Mutex = [u64; 5];
/// `pthread_cond_t` (48 bytes); all zero is `PTHREAD_COND_INITIALIZER`.
pub type Cond = [u64; 6];

/// `struct ibv_device`.
#[repr(C)]
pub struct IbvDevice {
    /// `_ops` (the provider's, unused).
    pub ops: [*mut c_void; 2],
    /// `node_type`: `IBV_NODE_CA` (1).
    pub node_type: c_int,
    /// `transport_type`: `IBV_TRANSPORT_IB` (0), as RoCE devices report.
    pub transport_type: c_int,
    /// `name`.
    pub name: [c_char; 64],
    /// `dev_name` (the uverbs device).
    pub dev_name: [c_char; 64],
    /// `dev_path`.
    pub dev_path: [c_char; 256],
    /// `ibdev_path`: the sysfs directory `ibv_read_sysfs_file` is asked about.
    pub ibdev_path: [c_char; 256],
}

/// A `post_send` entry of `struct ibv_context_ops`.
pub type PostSendFn = unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
/// A `post_recv` entry.
pub type PostRecvFn = unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
/// `attach_mcast` / `detach_mcast` of the context ops (`ibv_attach_mcast`'s signature).
pub type McastFn = unsafe extern "C" fn(*mut IbvQp, *const IbvGid, u16) -> c_int;
/// The `post_srq_recv` entry.
pub type PostSrqRecvFn = unsafe extern "C" fn(*mut IbvSrq, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
/// The `poll_cq` entry.
pub type PollCqFn = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;
/// The `req_notify_cq` entry.
pub type ReqNotifyFn = unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int;
/// `verbs_context.query_port`.
pub type QueryPortFn = unsafe extern "C" fn(*mut IbvContext, u8, *mut IbvPortAttr, usize) -> c_int;
/// `verbs_context.query_device_ex`: (context, input, attr, attr_size).
pub type QueryDeviceExFn = unsafe extern "C" fn(*mut IbvContext, *const c_void, *mut u8, usize) -> c_int;
/// `sizeof(struct ibv_device_attr_ex)` in rdma-core 44 (its `orig_attr` first).
pub const DEVICE_ATTR_EX_LEN: usize = 400;
/// `offsetof(struct ibv_device_attr_ex, phys_port_cnt_ex)`.
pub const PHYS_PORT_CNT_EX_OFFSET: usize = 396;
/// `verbs_context.advise_mr`: (pd, advice, flags, sg_list, num_sge).
pub type AdviseMrFn = unsafe extern "C" fn(*mut IbvPd, u32, u32, *mut IbvSge, u32) -> c_int;
/// `offsetof(struct ibv_device_attr_ex, odp_caps)`: `struct ibv_odp_caps` (`general_caps`,
/// then the RC, UC and UD capabilities, u32 each).
pub const ODP_CAPS_OFFSET: usize = 240;
/// `offsetof(struct ibv_device_attr_ex, xrc_odp_caps)`.
pub const XRC_ODP_CAPS_OFFSET: usize = 392;
/// `verbs_context.query_rt_values`.
pub type QueryRtValuesFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvValuesEx) -> c_int;
/// `offsetof(struct ibv_device_attr_ex, completion_timestamp_mask)`.
pub const COMPLETION_TIMESTAMP_MASK_OFFSET: usize = 264;
/// `offsetof(struct ibv_device_attr_ex, hca_core_clock)`.
pub const HCA_CORE_CLOCK_OFFSET: usize = 272;
/// `offsetof(struct ibv_device_attr_ex, device_cap_flags_ex)`.
pub const DEVICE_CAP_FLAGS_EX_OFFSET: usize = 280;
/// `verbs_context.create_cq_ex`.
pub type CreateCqExFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvCqInitAttrEx) -> *mut IbvCqEx;
/// `verbs_context.create_qp_ex`.
pub type CreateQpExFn = unsafe extern "C" fn(*mut IbvContext, *mut IbvQpInitAttrEx) -> *mut IbvQp;

/// The `alloc_mw` entry (`ibv_alloc_mw` calls it if set, else fails with EOPNOTSUPP).
pub type AllocMwFn = unsafe extern "C" fn(*mut IbvPd, u32) -> *mut IbvMw;
/// The `bind_mw` entry (`ibv_bind_mw`, for type 1 windows).
pub type BindMwFn = unsafe extern "C" fn(*mut IbvQp, *mut IbvMw, *mut IbvMwBind) -> c_int;
/// The `dealloc_mw` entry (`ibv_dealloc_mw`).
pub type DeallocMwFn = unsafe extern "C" fn(*mut IbvMw) -> c_int;

/// `struct ibv_context_ops`: the header inlines (`ibv_post_send`, `ibv_poll_cq`, ...) call
/// these without a NULL check.
#[repr(C)]
pub struct IbvContextOps {
    /// `_compat_query_device` .. `_compat_dereg_mr`.
    pub _before_mw: [usize; 7],
    /// `alloc_mw` (offset 56).
    pub alloc_mw: Option<AllocMwFn>,
    /// `bind_mw` (64).
    pub bind_mw: Option<BindMwFn>,
    /// `dealloc_mw` (72).
    pub dealloc_mw: Option<DeallocMwFn>,
    /// `_compat_create_cq`.
    pub _before_poll: [usize; 1],
    /// `poll_cq` (offset 88).
    pub poll_cq: Option<PollCqFn>,
    /// `req_notify_cq` (96).
    pub req_notify_cq: Option<ReqNotifyFn>,
    /// `_compat_cq_event` .. `_compat_destroy_srq`.
    pub _before_srq: [usize; 7],
    /// `post_srq_recv` (160).
    pub post_srq_recv: Option<PostSrqRecvFn>,
    /// `_compat_create_qp` .. `_compat_destroy_qp`.
    pub _before_send: [usize; 4],
    /// `post_send` (200).
    pub post_send: Option<PostSendFn>,
    /// `post_recv` (208).
    pub post_recv: Option<PostRecvFn>,
    /// `_compat_create_ah`, `_compat_destroy_ah`.
    pub _after: [usize; 2],
    /// `_compat_attach_mcast` (232): rdma-core's library calls its own op table, not this
    /// slot, but a program that reads the context's ops finds `ibv_attach_mcast` here, as
    /// the providers of old set it.
    pub attach_mcast: Option<McastFn>,
    /// `_compat_detach_mcast` (240): `ibv_detach_mcast`, likewise.
    pub detach_mcast: Option<McastFn>,
    /// `_compat_async_event`.
    pub _async_event: usize,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct IbvContext {
    /// `device`.
    pub device: *mut IbvDevice,
    /// `ops`.
    pub ops: IbvContextOps,
    /// `cmd_fd`: -1, there is no kernel.
    pub cmd_fd: c_int,
    /// `async_fd`: readable when an asynchronous event may wait.
    pub async_fd: c_int,
    /// `num_comp_vectors`.
    pub num_comp_vectors: c_int,
    /// `mutex`.
    pub mutex: Mutex,
    /// `abi_compat`: `__VERBS_ABI_IS_EXTENDED` (all ones), so `verbs_get_ctx` works.
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: the extended ops sit before the `ibv_context`, which is what
/// applications get.
#[repr(C)]
pub struct VerbsContext {
    /// `query_port` (offset 0).
    pub query_port: Option<QueryPortFn>,
    /// `advise_mr` (8), which the `ibv_advise_mr` inline calls.
    pub advise_mr: Option<AdviseMrFn>,
    /// `alloc_null_mr` .. `create_counters`, `destroy_counters`.
    pub _ops1: [usize; 5],
    /// `reg_dm_mr` (56), which the `ibv_reg_dm_mr` inline calls.
    pub reg_dm_mr: Option<unsafe extern "C" fn(*mut IbvPd, *mut IbvDm, u64, usize, u32) -> *mut IbvMr>,
    /// `alloc_dm` (64), which the `ibv_alloc_dm` inline calls.
    pub alloc_dm: Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvAllocDmAttr) -> *mut IbvDm>,
    /// `free_dm` (72), which the `ibv_free_dm` inline calls.
    pub free_dm: Option<unsafe extern "C" fn(*mut IbvDm) -> c_int>,
    /// `modify_flow_action_esp` .. `modify_qp_rate_limit`.
    pub _ops1c: [usize; 4],
    /// `alloc_parent_domain` (112), which the `ibv_alloc_parent_domain` inline calls.
    pub alloc_parent_domain: Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvParentDomainInitAttr) -> *mut IbvPd>,
    /// `dealloc_td` (120), which the `ibv_dealloc_td` inline calls.
    pub dealloc_td: Option<unsafe extern "C" fn(*mut IbvTd) -> c_int>,
    /// `alloc_td` (128), which the `ibv_alloc_td` inline calls.
    pub alloc_td: Option<unsafe extern "C" fn(*mut IbvContext, *mut c_void) -> *mut IbvTd>,
    /// `modify_cq` .. `create_wq`.
    pub _ops1b: [usize; 7],
    /// `query_rt_values` (192), which the `ibv_query_rt_values_ex` inline calls.
    pub query_rt_values: Option<QueryRtValuesFn>,
    /// `create_cq_ex` (200), which the `ibv_create_cq_ex` inline calls.
    pub create_cq_ex: Option<CreateCqExFn>,
    /// `priv`.
    pub _priv: usize,
    /// `query_device_ex` (216), which the `ibv_query_device_ex` inline calls.
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// `ibv_destroy_flow` .. `open_qp`.
    pub _ops2: [usize; 5],
    /// `create_qp_ex` (264), which the `ibv_create_qp_ex` inline calls.
    pub create_qp_ex: Option<CreateQpExFn>,
    /// `get_srq_num` (272), which the `ibv_get_srq_num` inline calls.
    pub get_srq_num: Option<unsafe extern "C" fn(*mut IbvSrq, *mut u32) -> c_int>,
    /// `create_srq_ex` (280), which the `ibv_create_srq_ex` inline calls for what
    /// `ibv_create_srq` cannot make.
    pub create_srq_ex: Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvSrqInitAttrEx) -> *mut IbvSrq>,
    /// `open_xrcd` (288), which the `ibv_open_xrcd` inline calls.
    pub open_xrcd: Option<unsafe extern "C" fn(*mut IbvContext, *mut IbvXrcdInitAttr) -> *mut c_void>,
    /// `close_xrcd` (296), which the `ibv_close_xrcd` inline calls.
    pub close_xrcd: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
    /// `_ABI_placeholder3`.
    pub _ops3: usize,
    /// `sz`: `sizeof(struct verbs_context)`, never more (see the crate docs).
    pub sz: usize,
    /// `context`.
    pub context: IbvContext,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDeviceAttr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_port_attr` (52 bytes with v44 headers; older callers pass 48).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `union ibv_gid` (8-byte aligned, as its `global` member is).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvGidEntry {
    pub gid: IbvGid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct IbvMw {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub rkey: u32,
    pub handle: u32,
    /// `enum ibv_mw_type`: `IBV_MW_TYPE_1` (1), `IBV_MW_TYPE_2` (2).
    pub mw_type: u32,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvMwBindInfo {
    pub mr: *mut IbvMr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: u32,
}

/// `struct ibv_mw_bind` (`ibv_bind_mw`'s).
#[repr(C)]
pub struct IbvMwBind {
    pub wr_id: u64,
    pub send_flags: u32,
    pub bind_info: IbvMwBindInfo,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
    pub channel: *mut IbvCompChannel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: Mutex,
    pub cond: Cond,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_cq_ex`: an `ibv_cq` (`ibv_cq_ex_to_cq` is a cast), then the polling state
/// and entries the `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll` and `ibv_wc_read_*`
/// inlines call.
#[repr(C)]
pub struct IbvCqEx {
    pub cq: IbvCq,
    pub comp_mask: u32,
    /// The current completion's status.
    pub status: u32,
    /// The current completion's `wr_id`.
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut IbvCqEx, *mut IbvPollCqAttr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut IbvCqEx) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut IbvCqEx)>,
    pub read_opcode: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_vendor_err: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_byte_len: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_imm_data: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_qp_num: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_src_qp: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_wc_flags: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_slid: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_sl: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u8>,
    pub read_completion_ts: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u64>,
    pub read_cvlan: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u16>,
    pub read_flow_tag: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut IbvCqEx, *mut c_void)>,
    pub read_completion_wallclock_ns: Option<unsafe extern "C" fn(*mut IbvCqEx) -> u64>,
}

/// `struct ibv_values_ex`.
#[repr(C)]
pub struct IbvValuesEx {
    /// In: `IBV_VALUES_MASK_RAW_CLOCK` (1) asks for the clock; out: what was filled.
    pub comp_mask: u32,
    pub raw_clock: libc::timespec,
}

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
pub struct IbvPollCqAttr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct IbvCqInitAttrEx {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut IbvCompChannel,
    pub comp_vector: u32,
    /// `IBV_WC_EX_WITH_*`: what the `ibv_wc_read_*` calls may read.
    pub wc_flags: u64,
    /// `IBV_CQ_INIT_ATTR_MASK_FLAGS` (1), `_PD` (2).
    pub comp_mask: u32,
    /// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` (1), `_IGNORE_OVERRUN` (2).
    pub flags: u32,
    pub parent_domain: *mut IbvPd,
}

/// `struct ibv_dm`: device memory; the `ibv_memcpy_to_dm`/`_from_dm` inlines call its
/// entries.
#[repr(C)]
pub struct IbvDm {
    pub context: *mut IbvContext,
    pub memcpy_to_dm: Option<unsafe extern "C" fn(*mut IbvDm, u64, *const c_void, usize) -> c_int>,
    pub memcpy_from_dm: Option<unsafe extern "C" fn(*mut c_void, *mut IbvDm, u64, usize) -> c_int>,
    pub comp_mask: u32,
    pub handle: u32,
}

/// `struct ibv_alloc_dm_attr`.
#[repr(C)]
pub struct IbvAllocDmAttr {
    pub length: usize,
    pub log_align_req: u32,
    pub comp_mask: u32,
}

/// `offsetof(struct ibv_device_attr_ex, max_dm_size)`.
pub const MAX_DM_SIZE_OFFSET: usize = 376;

/// `struct ibv_td`: a thread domain.
#[repr(C)]
pub struct IbvTd {
    pub context: *mut IbvContext,
}

/// `struct ibv_parent_domain_init_attr`.
#[repr(C)]
pub struct IbvParentDomainInitAttr {
    pub pd: *mut IbvPd,
    pub td: *mut IbvTd,
    /// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS` (1), `_PD_CONTEXT` (2).
    pub comp_mask: u32,
    pub alloc: Option<unsafe extern "C" fn(*mut IbvPd, *mut c_void, usize, usize, u64) -> *mut c_void>,
    pub free: Option<unsafe extern "C" fn(*mut IbvPd, *mut c_void, *mut c_void, u64)>,
    pub pd_context: *mut c_void,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct IbvSrq {
    pub context: *mut IbvContext,
    pub srq_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub handle: u32,
    pub mutex: Mutex,
    pub cond: Cond,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: u32,
    pub qp_type: u32,
    pub mutex: Mutex,
    pub cond: Cond,
    pub events_completed: u32,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct IbvAh {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub handle: u32,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) / `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrRdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrAtomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrUd {
    pub ah: *mut IbvAh,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union.
#[repr(C)]
#[derive(Clone, Copy)]
pub union WrUnion {
    pub rdma: WrRdma,
    pub atomic: WrAtomic,
    pub ud: WrUd,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// `imm_data` (network order) / `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: WrUnion,
    /// `qp_type.xrc.remote_srqn`.
    pub remote_srqn: u32,
    /// `bind_mw` (its union with `tso`: softrdma does no TSO).
    pub bind_mw: WrBindMw,
}

/// `bind_mw` of `struct ibv_send_wr` (`IBV_WR_BIND_MW`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrBindMw {
    pub mw: *mut IbvMw,
    pub rkey: u32,
    pub bind_info: IbvMwBindInfo,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf` (RSS; softrdma has none).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvRxHashConf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`: `ibv_qp_init_attr`, then what `comp_mask` says is set.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpInitAttrEx {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut IbvSrq,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut IbvPd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: IbvRxHashConf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

impl IbvQpInitAttrEx {
    /// Its `struct ibv_qp_init_attr` part (the fields the two structs share, in order).
    pub fn plain(&self) -> IbvQpInitAttr {
        IbvQpInitAttr {
            qp_context: self.qp_context,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            srq: self.srq,
            cap: self.cap,
            qp_type: self.qp_type,
            sq_sig_all: self.sq_sig_all,
        }
    }
}

/// `struct ibv_data_buf` (`ibv_wr_set_inline_data_list`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDataBuf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct ibv_qp_ex`: an `ibv_qp`, then the state and the builders of the `ibv_wr_*`
/// API (the header's inlines call the builders unchecked).
#[repr(C)]
pub struct IbvQpEx {
    pub qp_base: IbvQp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: u32,
    pub wr_atomic_cmp_swp: unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u64, u64),
    pub wr_atomic_fetch_add: unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u64),
    pub wr_bind_mw: unsafe extern "C" fn(*mut IbvQpEx, *mut c_void, u32, *const c_void),
    pub wr_local_inv: unsafe extern "C" fn(*mut IbvQpEx, u32),
    pub wr_rdma_read: unsafe extern "C" fn(*mut IbvQpEx, u32, u64),
    pub wr_rdma_write: unsafe extern "C" fn(*mut IbvQpEx, u32, u64),
    pub wr_rdma_write_imm: unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u32),
    pub wr_send: unsafe extern "C" fn(*mut IbvQpEx),
    pub wr_send_imm: unsafe extern "C" fn(*mut IbvQpEx, u32),
    pub wr_send_inv: unsafe extern "C" fn(*mut IbvQpEx, u32),
    pub wr_send_tso: unsafe extern "C" fn(*mut IbvQpEx, *mut c_void, u16, u16),
    pub wr_set_ud_addr: unsafe extern "C" fn(*mut IbvQpEx, *mut IbvAh, u32, u32),
    pub wr_set_xrc_srqn: unsafe extern "C" fn(*mut IbvQpEx, u32),
    pub wr_set_inline_data: unsafe extern "C" fn(*mut IbvQpEx, *mut c_void, usize),
    pub wr_set_inline_data_list: unsafe extern "C" fn(*mut IbvQpEx, usize, *const IbvDataBuf),
    pub wr_set_sge: unsafe extern "C" fn(*mut IbvQpEx, u32, u64, u32),
    pub wr_set_sge_list: unsafe extern "C" fn(*mut IbvQpEx, usize, *const IbvSge),
    pub wr_start: unsafe extern "C" fn(*mut IbvQpEx),
    pub wr_complete: unsafe extern "C" fn(*mut IbvQpEx) -> c_int,
    pub wr_abort: unsafe extern "C" fn(*mut IbvQpEx),
    pub wr_atomic_write: unsafe extern "C" fn(*mut IbvQpEx, u32, u64, *const c_void),
    /// `wr_flush` (rdma-core 47 on; past the end of rdma-core 44's `struct ibv_qp_ex`, which
    /// Debian's headers describe, so programs built against them never reach it).
    pub wr_flush: unsafe extern "C" fn(*mut IbvQpEx, u32, u64, usize, u8, u8),
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct IbvSrqInitAttr {
    pub srq_context: *mut c_void,
    pub attr: IbvSrqAttr,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct IbvAsyncEvent {
    /// `element`: the QP, CQ or SRQ (a union of pointers), or the port number.
    pub element: *mut c_void,
    pub event_type: u32,
}

// Sizes the header inlines and the applications rely on (tests/layout.rs checks every
// offset against the real header too).
const _: () = {
    assert!(size_of::<IbvDevice>() == 664);
    assert!(size_of::<IbvContextOps>() == 256);
    assert!(size_of::<IbvContext>() == 328);
    assert!(size_of::<VerbsContext>() == 648);
    assert!(size_of::<IbvDeviceAttr>() == 232);
    assert!(size_of::<IbvPortAttr>() == 52);
    assert!(size_of::<IbvCq>() == 128);
    assert!(size_of::<IbvCqEx>() == 288);
    assert!(size_of::<IbvCqInitAttrEx>() == 56);
    assert!(size_of::<IbvValuesEx>() == 24);
    assert!(size_of::<IbvParentDomainInitAttr>() == 48);
    assert!(size_of::<IbvDm>() == 32);
    assert!(size_of::<IbvAllocDmAttr>() == 16);
    assert!(size_of::<IbvQp>() == 160);
    assert!(size_of::<IbvSrq>() == 128);
    assert!(size_of::<IbvWc>() == 48);
    assert!(size_of::<IbvSendWr>() == 128);
    assert!(size_of::<IbvMw>() == 32);
    assert!(size_of::<IbvMwBind>() == 48);
    assert!(size_of::<IbvQpAttr>() == 144);
};

/// `struct ibv_xrcd_init_attr`.
#[repr(C)]
pub struct IbvXrcdInitAttr {
    pub comp_mask: u32,
    pub fd: c_int,
    pub oflags: c_int,
}

/// `struct ibv_srq_init_attr_ex`.
#[repr(C)]
pub struct IbvSrqInitAttrEx {
    pub srq_context: *mut c_void,
    pub attr: IbvSrqAttr,
    pub comp_mask: u32,
    pub srq_type: u32,
    pub pd: *mut IbvPd,
    /// `xrcd`: a `struct ibv_xrcd *`.
    pub xrcd: *mut c_void,
    pub cq: *mut IbvCq,
    /// `tm_cap`: `max_num_tags`, `max_ops` (tag matching, which softrdma refuses).
    pub tm_cap: [u32; 2],
}
