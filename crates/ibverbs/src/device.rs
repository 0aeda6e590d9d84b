//! Devices and contexts: `ibv_get_device_list`, `ibv_open_device`, the queries, GIDs and
//! the sysfs reads `ibv_devinfo` makes.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::mem::offset_of;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::{Mutex, OnceLock};

use crate::abi::*;
use crate::errno;
use crate::guard;

/// `ibv_context.num_comp_vectors`: one completion vector (the device's progress thread),
/// as rxe has one; `ibv_create_cq` takes `comp_vector` 0 only.
pub(crate) const NUM_COMP_VECTORS: c_int = 1;

/// An `ibv_device` and the softrdma device it stands for.
#[repr(C)]
pub(crate) struct DeviceC {
    pub(crate) dev: IbvDevice,
    pub(crate) index: usize,
    pub(crate) inner: softrdma::Device,
}

/// An open device: the `verbs_context` (whose `context` member applications get), then
/// the softrdma context.
#[repr(C)]
pub(crate) struct Ctx {
    pub(crate) vctx: VerbsContext,
    pub(crate) inner: softrdma::Context,
    /// QPN → `ibv_qp` (as an address), to name the QP of an asynchronous event.
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
    /// The same for CQs (`CqId` → `ibv_cq`) and SRQs (`SrqId` → `ibv_srq`).
    pub(crate) cqs: Mutex<HashMap<u32, usize>>,
    pub(crate) srqs: Mutex<HashMap<u32, usize>>,
    /// The XRC domains of files (`ibv_open_xrcd` with a descriptor).
    pub(crate) xrcds: crate::xrc::FileDomains,
    /// What `ibv_context.cmd_fd` holds: programs dup it, poll it or hand it to a child
    /// (pyverbs, rdma-core's tests). There is no uverbs device behind softrdma, so it is an
    /// empty memfd of its own (an inode per context, which `ibv_import_device` can tell
    /// apart), closed with the context; -1 if it cannot be made.
    cmd_fd: Option<std::os::fd::OwnedFd>,
}

/// The devices, made once per process and never freed: a device pointer stays valid after
/// `ibv_free_device_list`, as with rdma-core while a context uses it.
fn all_devices() -> &'static [usize] {
    static DEVICES: OnceLock<Vec<usize>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let list = softrdma::devices().unwrap_or_default();
        // The sysfs-shaped tree (softrdma::sysfs) the paths point at; where it cannot be
        // written, the paths name /sys as before and ibv_read_sysfs_file answers alone.
        let root = softrdma::sysfs::publish(&list).ok().filter(|r| r.as_os_str().len() < 200);
        list.into_iter()
            .enumerate()
            .map(|(index, inner)| {
                let mut dev = IbvDevice {
                    ops: [ptr::null_mut(); 2],
                    node_type: 1,      // IBV_NODE_CA
                    transport_type: 0, // IBV_TRANSPORT_IB, as every RoCE device reports
                    name: [0; 64],
                    dev_name: [0; 64],
                    dev_path: [0; 256],
                    ibdev_path: [0; 256],
                };
                copy_str(&mut dev.name, inner.name());
                copy_str(&mut dev.dev_name, &format!("uverbs{index}"));
                let (dev_path, ibdev_path) = match &root {
                    Some(r) => (
                        softrdma::sysfs::dev_path(r, index).display().to_string(),
                        softrdma::sysfs::ibdev_path(r, &inner).display().to_string(),
                    ),
                    None => (
                        format!("/sys/class/infiniband_verbs/uverbs{index}"),
                        format!("/sys/class/infiniband/{}", inner.name()),
                    ),
                };
                copy_str(&mut dev.dev_path, &dev_path);
                copy_str(&mut dev.ibdev_path, &ibdev_path);
                Box::into_raw(Box::new(DeviceC { dev, index, inner })) as usize
            })
            .collect()
    })
}

/// Copies `s` into a C string buffer, truncated and NUL-terminated.
pub(crate) fn copy_str(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

/// The device behind an `ibv_device` pointer we handed out.
///
/// # Safety
/// `dev` must be NULL or come from `ibv_get_device_list`.
unsafe fn device_of<'a>(dev: *mut IbvDevice) -> Option<&'a DeviceC> {
    // SAFETY: our ibv_device pointers point at the first member of a leaked DeviceC.
    unsafe { (dev as *const DeviceC).as_ref() }
}

/// The context behind an `ibv_context` pointer we handed out.
///
/// # Safety
/// `ctx` must be NULL or come from `ibv_open_device` and not be closed.
pub(crate) unsafe fn ctx_of<'a>(ctx: *mut IbvContext) -> Option<&'a Ctx> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: our ibv_context is the `context` member of the VerbsContext that starts a Ctx.
    unsafe { (ctx.cast::<u8>().sub(offset_of!(VerbsContext, context)) as *const Ctx).as_ref() }
}

unsafe extern "C" fn get_device_list(num: *mut c_int) -> *mut *mut IbvDevice {
    guard(ptr::null_mut(), || {
        let devs = all_devices();
        // SAFETY: calloc of (n + 1) pointers; ibv_free_device_list frees it with free().
        let list = unsafe { libc::calloc(devs.len() + 1, size_of::<*mut IbvDevice>()) } as *mut *mut IbvDevice;
        if list.is_null() {
            errno::set(libc::ENOMEM);
            return ptr::null_mut();
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: i < n + 1 entries allocated above.
            unsafe { *list.add(i) = *d as *mut IbvDevice };
        }
        if !num.is_null() {
            // SAFETY: the caller passes a valid int or NULL.
            unsafe { *num = devs.len() as c_int };
        }
        list
    })
}
export!("ibv_get_device_list", "IBVERBS_1.1", get_device_list);

unsafe extern "C" fn free_device_list(list: *mut *mut IbvDevice) {
    // SAFETY: the list came from calloc in ibv_get_device_list (or is NULL).
    guard((), || unsafe { libc::free(list.cast()) })
}
export!("ibv_free_device_list", "IBVERBS_1.1", free_device_list);

unsafe extern "C" fn get_device_name(dev: *mut IbvDevice) -> *const c_char {
    // SAFETY: dev is ours or NULL.
    guard(ptr::null(), || match unsafe { device_of(dev) } {
        Some(d) => d.dev.name.as_ptr(),
        None => {
            errno::set(libc::EINVAL);
            ptr::null()
        }
    })
}
export!("ibv_get_device_name", "IBVERBS_1.1", get_device_name);

unsafe extern "C" fn get_device_guid(dev: *mut IbvDevice) -> u64 {
    // SAFETY: dev is ours or NULL.
    guard(0, || unsafe { device_of(dev) }.map_or(0, |d| d.inner.node_guid().to_be()))
}
export!("ibv_get_device_guid", "IBVERBS_1.1", get_device_guid);

unsafe extern "C" fn get_device_index(dev: *mut IbvDevice) -> c_int {
    // SAFETY: dev is ours or NULL.
    guard(-1, || unsafe { device_of(dev) }.map_or(-1, |d| d.index as c_int))
}
export!("ibv_get_device_index", "IBVERBS_1.9", get_device_index);

unsafe extern "C" fn open_device(dev: *mut IbvDevice) -> *mut IbvContext {
    guard(ptr::null_mut(), || {
        // SAFETY: dev is ours or NULL.
        let Some(d) = (unsafe { device_of(dev) }) else {
            errno::set(libc::EINVAL);
            return ptr::null_mut();
        };
        errno::or_null(d.inner.open().inspect_err(|e| open_failed(&d.inner, e)), |c| new_context(dev, c))
    })
}

/// Says on stderr why `device` did not open. A C program has only `errno` to show
/// ("Couldn't get context"), while the reason (the port held by another program, a
/// coordinator that did not answer, a user whose group refused this one) says what to do;
/// libibverbs prints its own warnings there too.
#[allow(clippy::print_stderr)]
fn open_failed(device: &softrdma::Device, e: &softrdma::Error) {
    eprintln!("softrdma: opening {}: {e}", device.name());
}

/// Wraps an open softrdma context in a `verbs_context` and returns its `ibv_context`.
pub(crate) fn new_context(dev: *mut IbvDevice, inner: softrdma::Context) -> *mut IbvContext {
    let ops = IbvContextOps {
        _before_mw: [0; 7],
        alloc_mw: Some(crate::objects::alloc_mw),
        bind_mw: Some(crate::objects::bind_mw),
        dealloc_mw: Some(crate::objects::dealloc_mw),
        _before_poll: [0; 1],
        poll_cq: Some(crate::post::poll_cq),
        req_notify_cq: Some(crate::post::req_notify_cq),
        _before_srq: [0; 7],
        post_srq_recv: Some(crate::post::post_srq_recv),
        _before_send: [0; 4],
        post_send: Some(crate::post::post_send),
        post_recv: Some(crate::post::post_recv),
        _after: [0; 2],
        attach_mcast: Some(crate::objects::attach_mcast),
        detach_mcast: Some(crate::objects::detach_mcast),
        _async_event: 0,
    };
    // Close-on-exec, as the kernel's uverbs file is.
    // SAFETY: a NUL-terminated name; memfd_create returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"softrdma-cmd-fd".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: fd, if not -1, is a descriptor of our own that nothing else closes.
    let cmd_fd = (fd >= 0).then(|| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let context = IbvContext {
        device: dev,
        ops,
        cmd_fd: cmd_fd.as_ref().map_or(-1, |f| f.as_raw_fd()),
        async_fd: inner.async_fd().as_raw_fd(),
        num_comp_vectors: NUM_COMP_VECTORS,
        mutex: [0; 5],
        abi_compat: usize::MAX as *mut c_void, // __VERBS_ABI_IS_EXTENDED
    };
    let vctx = VerbsContext {
        query_port: Some(vctx_query_port),
        advise_mr: Some(crate::objects::advise_mr),
        _ops1: [0; 5],
        reg_dm_mr: Some(crate::objects::reg_dm_mr),
        alloc_dm: Some(crate::objects::alloc_dm),
        free_dm: Some(crate::objects::free_dm),
        _ops1c: [0; 4],
        alloc_parent_domain: Some(crate::objects::alloc_parent_domain),
        dealloc_td: Some(crate::objects::dealloc_td),
        alloc_td: Some(crate::objects::alloc_td),
        _ops1b: [0; 7],
        query_rt_values: Some(crate::cq_ex::query_rt_values),
        create_cq_ex: Some(crate::cq_ex::create_cq_ex),
        _priv: 0,
        query_device_ex: Some(query_device_ex),
        _ops2: [0; 5],
        create_qp_ex: Some(crate::wr::create_qp_ex),
        get_srq_num: Some(crate::xrc::get_srq_num),
        create_srq_ex: Some(crate::xrc::create_srq_ex),
        open_xrcd: Some(crate::xrc::open_xrcd),
        close_xrcd: Some(crate::xrc::close_xrcd),
        _ops3: 0,
        sz: size_of::<VerbsContext>(),
        context,
    };
    let ctx = Box::into_raw(Box::new(Ctx {
        vctx,
        inner,
        qps: Mutex::default(),
        cqs: Mutex::default(),
        srqs: Mutex::default(),
        xrcds: Mutex::default(),
        cmd_fd,
    }));
    // SAFETY: ctx was just allocated; the pointer to its member lives as long as it.
    unsafe { &raw mut (*ctx).vctx.context }
}

/// The `ibv_context` librdmacm hands out (`rdma_cm_id.verbs`) for the connection manager's
/// context `inner`: one per device, made on first use and kept for the process's life, as
/// librdmacm opens every device once and keeps it.
pub(crate) fn cm_context(inner: &softrdma::Context) -> *mut IbvContext {
    static CM: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    let name = inner.device().name().to_string();
    let mut map = CM.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&p) = map.get(&name) {
        return p as *mut IbvContext;
    }
    let dev = all_devices()
        .iter()
        .copied()
        // SAFETY: every entry is a leaked DeviceC.
        .find(|&d| unsafe { &*(d as *const DeviceC) }.inner.name() == name)
        .map_or(ptr::null_mut(), |d| d as *mut IbvDevice);
    let p = new_context(dev, inner.clone());
    map.insert(name, p as usize);
    p
}
export!("ibv_open_device", "IBVERBS_1.1", open_device);

unsafe extern "C" fn close_device(ctx: *mut IbvContext) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is ours or NULL.
        if unsafe { ctx_of(ctx) }.is_none() {
            errno::set(libc::EINVAL);
            return -1;
        }
        // SAFETY: the Ctx was made by Box::into_raw in ibv_open_device and is closed once.
        drop(unsafe { Box::from_raw(ctx.cast::<u8>().sub(offset_of!(VerbsContext, context)) as *mut Ctx) });
        0
    })
}
export!("ibv_close_device", "IBVERBS_1.1", close_device);

/// An unlimited resource, as a C `int`.
fn limit(v: Option<u32>) -> c_int {
    v.map_or(c_int::MAX, |v| c_int::try_from(v).unwrap_or(c_int::MAX))
}

fn int(v: u32) -> c_int {
    c_int::try_from(v).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn query_device(ctx: *mut IbvContext, out: *mut IbvDeviceAttr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is ours or NULL.
        let (Some(c), false) = (unsafe { ctx_of(ctx) }, out.is_null()) else {
            errno::set(libc::EINVAL);
            return libc::EINVAL;
        };
        let a = c.inner.query_device();
        let mut attr = IbvDeviceAttr {
            fw_ver: [0; 64],
            node_guid: a.node_guid.to_be(),
            sys_image_guid: a.sys_image_guid.to_be(),
            max_mr_size: a.max_mr_size,
            page_size_cap: 0xffff_f000,
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_qp: int(a.max_qp),
            max_qp_wr: int(a.max_qp_wr),
            // IBV_DEVICE_MEM_WINDOW, IBV_DEVICE_MEM_WINDOW_TYPE_2B, as rxe reports them, and
            // IBV_DEVICE_XRC.
            device_cap_flags: (1 << 20) | if a.max_mw > 0 { (1 << 17) | (1 << 24) } else { 0 },
            max_sge: int(a.max_sge),
            max_sge_rd: int(a.max_sge_rd),
            max_cq: limit(a.max_cq),
            max_cqe: int(a.max_cqe),
            max_mr: int(a.max_mr),
            max_pd: limit(a.max_pd),
            max_qp_rd_atom: c_int::from(a.max_qp_rd_atom),
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0,
            max_qp_init_rd_atom: c_int::from(a.max_qp_init_rd_atom),
            max_ee_init_rd_atom: 0,
            atomic_cap: a.atomic_cap as u32,
            max_ee: 0,
            max_rdd: 0,
            max_mw: int(a.max_mw),
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: int(a.max_mcast_grp),
            max_mcast_qp_attach: int(a.max_mcast_qp_attach),
            max_total_mcast_qp_attach: int(a.max_total_mcast_qp_attach),
            max_ah: limit(a.max_ah),
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: limit(a.max_srq),
            max_srq_wr: int(a.max_srq_wr),
            max_srq_sge: int(a.max_srq_sge),
            max_pkeys: a.max_pkeys,
            local_ca_ack_delay: 15,
            phys_port_cnt: a.phys_port_cnt,
        };
        copy_str(&mut attr.fw_ver, &a.fw_ver);
        // SAFETY: out points at a caller's struct ibv_device_attr.
        unsafe { out.write(attr) };
        0
    })
}
export!("ibv_query_device", "IBVERBS_1.1", query_device);

/// `verbs_context.query_device_ex`: `ibv_query_device`'s attributes in `orig_attr`, one
/// physical port in `phys_port_cnt_ex`, completion timestamps (all 64 bits of a clock of
/// 1 GHz: `hca_core_clock` 1,000,000 kHz, one tick a nanosecond), `device_cap_flags_ex` as
/// `device_cap_flags`, on-demand paging (explicit and implicit regions, every operation of
/// RC, UC, UD and XRC), device memory (`max_dm_size`) and no other extended capability (TSO,
/// RSS, tag matching: 0), within the `attr_size` bytes the caller's
/// `struct ibv_device_attr_ex` has (an older program's is shorter), as rdma-core's
/// providers fill it. EINVAL for an input with a comp_mask, as the inline checks.
unsafe extern "C" fn query_device_ex(
    ctx: *mut IbvContext,
    input: *const c_void,
    attr: *mut u8,
    attr_size: usize,
) -> c_int {
    if attr.is_null() || attr_size < size_of::<IbvDeviceAttr>() {
        return libc::EINVAL;
    }
    // SAFETY: input is NULL or a struct ibv_query_device_ex_input, whose first field is
    // the u32 comp_mask.
    if !input.is_null() && unsafe { *input.cast::<u32>() } != 0 {
        return libc::EINVAL;
    }
    let len = attr_size.min(crate::abi::DEVICE_ATTR_EX_LEN);
    // SAFETY: attr points at attr_size writable bytes (the caller's contract); we write
    // `len` <= attr_size of them.
    unsafe { std::ptr::write_bytes(attr, 0, len) };
    // SAFETY: ctx is ours or NULL (checked inside); orig_attr is attr's first field.
    let rc = unsafe { query_device(ctx, attr.cast()) };
    if rc != 0 {
        return rc;
    }
    let put = |offset: usize, bytes: &[u8]| {
        if len >= offset + bytes.len() {
            // SAFETY: in bounds (checked): attr has len writable bytes.
            unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), attr.add(offset), bytes.len()) };
        }
    };
    put(crate::abi::COMPLETION_TIMESTAMP_MASK_OFFSET, &u64::MAX.to_ne_bytes());
    put(crate::abi::HCA_CORE_CLOCK_OFFSET, &crate::cq_ex::HCA_CORE_CLOCK_KHZ.to_ne_bytes());
    put(crate::abi::PHYS_PORT_CNT_EX_OFFSET, &1u32.to_ne_bytes());
    // IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT; per transport IBV_ODP_SUPPORT_SEND (1),
    // _RECV (2), _WRITE (4), _READ (8), _ATOMIC (16), _SRQ_RECV (32), _FLUSH (64, RC), as
    // each has them.
    let (rc, uc, ud) = (0x7fu32, 0x27u32, 0x23u32);
    put(crate::abi::MAX_DM_SIZE_OFFSET, &softrdma::MAX_DM_SIZE.to_ne_bytes());
    put(crate::abi::ODP_CAPS_OFFSET, &3u64.to_ne_bytes());
    put(crate::abi::ODP_CAPS_OFFSET + 8, &rc.to_ne_bytes());
    put(crate::abi::ODP_CAPS_OFFSET + 12, &uc.to_ne_bytes());
    put(crate::abi::ODP_CAPS_OFFSET + 16, &ud.to_ne_bytes());
    // xrc_odp_caps: XRC sends, receives into XRC SRQs, WRITE, READ and atomics, as RC.
    put(crate::abi::XRC_ODP_CAPS_OFFSET, &(rc & 0x3f).to_ne_bytes());
    // device_cap_flags_ex: the same capabilities (its low 32 bits are ibv_device_cap_flags).
    // SAFETY: orig_attr, which query_device just wrote, is attr's first field.
    let flags = unsafe { (*attr.cast::<IbvDeviceAttr>()).device_cap_flags };
    put(crate::abi::DEVICE_CAP_FLAGS_EX_OFFSET, &u64::from(flags).to_ne_bytes());
    0
}

/// `ibv_port_attr` of port `port` of `c`.
fn port_attr(c: &Ctx, port: u8) -> Result<IbvPortAttr, softrdma::Error> {
    let p = c.inner.query_port(port)?;
    Ok(IbvPortAttr {
        state: p.state as u32,
        max_mtu: p.max_mtu as u32,
        active_mtu: p.active_mtu as u32,
        gid_tbl_len: int(p.gid_tbl_len),
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        pkey_tbl_len: p.pkey_tbl_len,
        max_vl_num: 1,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: p.phys_state as u8,
        link_layer: 2, // IBV_LINK_LAYER_ETHERNET
        ..IbvPortAttr::default()
    })
}

/// Writes `attr` into the caller's `size` bytes: no more than it has, the rest of ours cut.
///
/// # Safety
/// `out` must point at `size` writable bytes.
unsafe fn write_port_attr(out: *mut IbvPortAttr, size: usize, attr: &IbvPortAttr) {
    let n = size.min(size_of::<IbvPortAttr>());
    // SAFETY: the caller's buffer has `size` bytes; ours has size_of::<IbvPortAttr>().
    unsafe {
        ptr::write_bytes(out.cast::<u8>(), 0, size);
        ptr::copy_nonoverlapping((attr as *const IbvPortAttr).cast::<u8>(), out.cast::<u8>(), n);
    }
}

/// `verbs_context.query_port`, which the `ibv_query_port` inline calls with its
/// `sizeof(struct ibv_port_attr)`.
unsafe extern "C" fn vctx_query_port(ctx: *mut IbvContext, port: u8, out: *mut IbvPortAttr, size: usize) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is ours or NULL.
        let (Some(c), false) = (unsafe { ctx_of(ctx) }, out.is_null()) else {
            errno::set(libc::EINVAL);
            return libc::EINVAL;
        };
        match port_attr(c, port) {
            // SAFETY: the inline passes sizeof(*out) as size.
            Ok(a) => unsafe { write_port_attr(out, size, &a) },
            Err(e) => return errno::fail(&e),
        }
        0
    })
}

/// The exported compat `ibv_query_port@IBVERBS_1.1`: its caller may hold only the 48-byte
/// `struct _compat_ibv_port_attr`.
unsafe extern "C" fn query_port_compat(ctx: *mut IbvContext, port: u8, out: *mut IbvPortAttr) -> c_int {
    // SAFETY: as vctx_query_port, with the compat size.
    unsafe { vctx_query_port(ctx, port, out, offset_of!(IbvPortAttr, port_cap_flags2)) }
}
export!("ibv_query_port", "IBVERBS_1.1", query_port_compat);

unsafe extern "C" fn query_gid(ctx: *mut IbvContext, port: u8, index: c_int, gid: *mut IbvGid) -> c_int {
    guard(-1, || {
        // SAFETY: ctx is ours or NULL.
        let (Some(c), false) = (unsafe { ctx_of(ctx) }, gid.is_null()) else {
            errno::set(libc::EINVAL);
            return -1;
        };
        let Ok(p) = c.inner.query_port(port) else {
            errno::set(libc::EINVAL);
            return -1;
        };
        if index < 0 || index as u32 >= p.gid_tbl_len.max(1) {
            errno::set(libc::EINVAL);
            return -1;
        }
        let raw = u8::try_from(index).ok().and_then(|i| c.inner.gid(i)).map_or([0; 16], |g| g.0);
        // SAFETY: gid points at a caller's union ibv_gid.
        unsafe { gid.write(IbvGid { raw }) };
        0
    })
}
export!("ibv_query_gid", "IBVERBS_1.1", query_gid);

/// `ibv_query_gid_type`: every softrdma GID is RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2`).
unsafe extern "C" fn query_gid_type(ctx: *mut IbvContext, port: u8, index: u32, out: *mut u32) -> c_int {
    guard(-1, || {
        // SAFETY: ctx is ours or NULL.
        let (Some(c), false) = (unsafe { ctx_of(ctx) }, out.is_null()) else {
            errno::set(libc::EINVAL);
            return -1;
        };
        match c.inner.query_port(port) {
            Ok(p) if index < p.gid_tbl_len => {
                // SAFETY: out points at a caller's enum.
                unsafe { *out = 1 };
                0
            }
            _ => {
                errno::set(libc::EINVAL);
                -1
            }
        }
    })
}
export!("ibv_query_gid_type", "IBVERBS_PRIVATE_34", query_gid_type);

/// One GID entry (`IBV_GID_TYPE_ROCE_V2`, on the device's interface), or `None` past the
/// table.
fn gid_entry(c: &Ctx, port: u8, index: u32) -> Option<IbvGidEntry> {
    let gid = c.inner.gid(u8::try_from(index).ok()?)?;
    Some(IbvGidEntry {
        gid: IbvGid { raw: gid.0 },
        gid_index: index,
        port_num: u32::from(port),
        gid_type: 2,
        ndev_ifindex: c.inner.device().interface_index(),
    })
}

unsafe extern "C" fn query_gid_ex(
    ctx: *mut IbvContext,
    port: u32,
    index: u32,
    entry: *mut IbvGidEntry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: ctx is ours or NULL.
        let (Some(c), false) = (unsafe { ctx_of(ctx) }, entry.is_null()) else {
            return libc::EINVAL;
        };
        if flags != 0 || entry_size < size_of::<IbvGidEntry>() || port != 1 {
            return libc::EINVAL;
        }
        match gid_entry(c, 1, index) {
            Some(e) => {
                // SAFETY: entry points at entry_size >= 32 bytes.
                unsafe { entry.write(e) };
                0
            }
            // Past the table, as the kernel's rdma_get_gid_attr (ENODATA is for an empty
            // entry inside it, which softrdma's compact table does not have).
            None => libc::EINVAL,
        }
    })
}
export!("_ibv_query_gid_ex", "IBVERBS_1.11", query_gid_ex);

unsafe extern "C" fn query_gid_table(
    ctx: *mut IbvContext,
    entries: *mut IbvGidEntry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        // SAFETY: ctx is ours or NULL.
        let (Some(c), false) = (unsafe { ctx_of(ctx) }, entries.is_null()) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || entry_size < size_of::<IbvGidEntry>() {
            return -(libc::EINVAL as isize);
        }
        let mut n = 0;
        while let Some(e) = gid_entry(c, 1, n as u32) {
            // As the kernel's (rdma_query_gid_table): a table that does not fit is an
            // error, not a prefix of it.
            if n == max_entries {
                return -(libc::EINVAL as isize);
            }
            // SAFETY: entries has max_entries elements of entry_size bytes, and n < max_entries.
            unsafe { entries.cast::<u8>().add(n * entry_size).cast::<IbvGidEntry>().write(e) };
            n += 1;
        }
        n as isize
    })
}
export!("_ibv_query_gid_table", "IBVERBS_1.11", query_gid_table);

unsafe extern "C" fn query_pkey(ctx: *mut IbvContext, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    guard(-1, || {
        // SAFETY: ctx is ours or NULL.
        if unsafe { ctx_of(ctx) }.is_none() || pkey.is_null() || port != 1 || index != 0 {
            errno::set(libc::EINVAL);
            return -1;
        }
        // SAFETY: pkey points at a caller's __be16. The default P_Key, 0xffff.
        unsafe { *pkey = 0xffff };
        0
    })
}
export!("ibv_query_pkey", "IBVERBS_1.1", query_pkey);

unsafe extern "C" fn get_pkey_index(ctx: *mut IbvContext, port: u8, pkey: u16) -> c_int {
    // SAFETY: ctx is ours or NULL.
    guard(-1, || if unsafe { ctx_of(ctx) }.is_some() && port == 1 && pkey == 0xffff { 0 } else { -1 })
}
export!("ibv_get_pkey_index", "IBVERBS_1.5", get_pkey_index);

/// What file `file` of our device `dev` holds, from the generator of the tree its
/// `ibdev_path` names (for when the tree could not be written or read).
fn sysfs_value(dev: &DeviceC, file: &str) -> Option<String> {
    let path = format!("class/infiniband/{}/{file}", dev.inner.name());
    softrdma::sysfs::device_files(&dev.inner, dev.index).into_iter().find(|(p, _)| *p == path).map(|(_, text)| text)
}

unsafe extern "C" fn read_sysfs_file(dir: *const c_char, file: *const c_char, buf: *mut c_char, size: usize) -> c_int {
    guard(-1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            errno::set(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller passes C strings.
        let (dir, file) = unsafe { (CStr::from_ptr(dir).to_string_lossy(), CStr::from_ptr(file).to_string_lossy()) };
        let ours = all_devices().iter().find_map(|d| {
            // SAFETY: every address in the list is a leaked DeviceC.
            let d = unsafe { &*(*d as *const DeviceC) };
            // SAFETY: ibdev_path is NUL-terminated by copy_str.
            let path = unsafe { CStr::from_ptr(d.dev.ibdev_path.as_ptr()) };
            (path.to_bytes() == dir.as_bytes()).then_some(d)
        });
        let text =
            std::fs::read_to_string(format!("{dir}/{file}")).ok().or_else(|| ours.and_then(|d| sysfs_value(d, &file)));
        let Some(text) = text else {
            errno::set(libc::ENOENT);
            return -1;
        };
        let text = text.strip_suffix('\n').unwrap_or(&text);
        let n = text.len().min(size - 1);
        // SAFETY: buf has size bytes; n + 1 <= size.
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
        n as c_int
    })
}
export!("ibv_read_sysfs_file", "IBVERBS_1.0", read_sysfs_file);

unsafe extern "C" fn get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}
export!("ibv_get_sysfs_path", "IBVERBS_1.0", get_sysfs_path);
