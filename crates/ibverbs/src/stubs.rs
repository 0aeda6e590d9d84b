//! The rest of libibverbs' public API: strings, rates, fork support, and the calls
//! softrdma does not do yet, which fail the documented way (NULL with `errno`
//! `EOPNOTSUPP`, or the error number) instead of being missing: programs are linked with
//! BIND_NOW and need every symbol they import at load time.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use crate::errno;

unsafe extern "C" fn wc_status_str(status: c_int) -> *const c_char {
    crate::name_in(&errno::WC_STATUS_STR, status, c"unknown")
}
export!("ibv_wc_status_str", "IBVERBS_1.1", wc_status_str);

unsafe extern "C" fn node_type_str(t: c_int) -> *const c_char {
    let s = match t {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        _ => c"unknown",
    };
    s.as_ptr()
}
export!("ibv_node_type_str", "IBVERBS_1.1", node_type_str);

unsafe extern "C" fn port_state_str(s: c_int) -> *const c_char {
    let s = match s {
        0 => c"PORT_NOP",
        1 => c"PORT_DOWN",
        2 => c"PORT_INIT",
        3 => c"PORT_ARMED",
        4 => c"PORT_ACTIVE",
        5 => c"PORT_ACTIVE_DEFER",
        _ => c"unknown",
    };
    s.as_ptr()
}
export!("ibv_port_state_str", "IBVERBS_1.1", port_state_str);

unsafe extern "C" fn event_type_str(e: c_int) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    crate::name_in(&NAMES, e, c"unknown")
}
export!("ibv_event_type_str", "IBVERBS_1.1", event_type_str);

/// `enum ibv_rate` → (multiple of 2.5 Gb/s or -1, Mb/s).
const RATES: [(c_int, c_int, c_int); 23] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, -1, 28125),
    (20, -1, 53125),
    (21, -1, 425000),
    (22, -1, 637500),
    (23, -1, 850000),
    (24, -1, 1275000),
];

unsafe extern "C" fn rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}
export!("ibv_rate_to_mult", "IBVERBS_1.0", rate_to_mult);

unsafe extern "C" fn mult_to_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult && mult > 0).map_or(0, |r| r.0)
}
export!("mult_to_ibv_rate", "IBVERBS_1.0", mult_to_rate);

unsafe extern "C" fn rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}
export!("ibv_rate_to_mbps", "IBVERBS_1.1", rate_to_mbps);

unsafe extern "C" fn mbps_to_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}
export!("mbps_to_ibv_rate", "IBVERBS_1.1", mbps_to_rate);

/// `ibv_fork_init`: nothing to do. softrdma pins no pages, so a child of `fork` sees no
/// corrupted memory; it gets no working device either (the progress thread is not copied).
unsafe extern "C" fn fork_init() -> c_int {
    0
}
export!("ibv_fork_init", "IBVERBS_1.1", fork_init);

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
unsafe extern "C" fn is_fork_initialized() -> c_int {
    2
}
export!("ibv_is_fork_initialized", "IBVERBS_1.13", is_fork_initialized);

unsafe extern "C" fn fork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
export!("ibv_dontfork_range", "IBVERBS_1.1", fork_range);
export!("ibv_dofork_range", "IBVERBS_1.1", fork_range);

unsafe extern "C" fn query_qp_data_in_order(_qp: *mut c_void, _op: c_int, _flags: u32) -> c_int {
    0
}
export!("ibv_query_qp_data_in_order", "IBVERBS_1.14", query_qp_data_in_order);

/// Not supported yet: NULL with `errno = EOPNOTSUPP`.
unsafe extern "C" fn null_eopnotsupp() -> *mut c_void {
    errno::set(libc::EOPNOTSUPP);
    ptr::null_mut()
}
export!("ibv_import_device", "IBVERBS_1.10", null_eopnotsupp);
export!("ibv_import_mr", "IBVERBS_1.10", null_eopnotsupp);
export!("ibv_import_pd", "IBVERBS_1.10", null_eopnotsupp);
export!("ibv_import_dm", "IBVERBS_1.13", null_eopnotsupp);
export!("ibv_reg_dmabuf_mr", "IBVERBS_1.12", null_eopnotsupp);

/// Not supported yet: returns `EOPNOTSUPP` (and sets `errno` to it).
unsafe extern "C" fn int_eopnotsupp() -> c_int {
    errno::set(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}
export!("ibv_query_ece", "IBVERBS_1.10", int_eopnotsupp);
export!("ibv_set_ece", "IBVERBS_1.10", int_eopnotsupp);

/// Not supported yet: returns -1 with `errno = EOPNOTSUPP` (`ibv_resolve_eth_l2_from_gid`'s
/// failure).
unsafe extern "C" fn minus_one_eopnotsupp() -> c_int {
    errno::set(libc::EOPNOTSUPP);
    -1
}
export!("ibv_resolve_eth_l2_from_gid", "IBVERBS_1.1", minus_one_eopnotsupp);

/// No-ops: the `unimport` calls of objects that cannot be imported, and the converters of
/// the kernel's binary formats (there is no kernel side; only Debian's librdmacm calls them).
unsafe extern "C" fn nothing() {}
export!("ibv_unimport_mr", "IBVERBS_1.10", nothing);
export!("ibv_unimport_pd", "IBVERBS_1.10", nothing);
export!("ibv_unimport_dm", "IBVERBS_1.13", nothing);
export!("ibv_copy_ah_attr_from_kern", "IBVERBS_1.1", nothing);
export!("ibv_copy_qp_attr_from_kern", "IBVERBS_1.0", nothing);
export!("ibv_copy_path_rec_from_kern", "IBVERBS_1.0", nothing);
export!("ibv_copy_path_rec_to_kern", "IBVERBS_1.0", nothing);
