//! Every size and field offset of the `#[repr(C)]` structs in `softrdma_ibverbs::abi`,
//! against rdma-core's real `<infiniband/verbs.h>` (Debian `libibverbs-dev`): a small C
//! program compiled with `cc` prints `sizeof`/`offsetof` for each, and they must equal
//! Rust's `size_of`/`offset_of!`. Skips, saying why, where the header or `cc` is missing.
#![allow(clippy::print_stderr)]

use std::mem::offset_of;
use std::process::Command;

use softrdma_ibverbs::abi::*;
use softrdma_ibverbs::cma_abi::*;

/// (C type, C member designator or "sizeof", Rust value).
type Entry = (&'static str, String, usize);

macro_rules! layout {
    ($out:ident, $rust:ty, $c:literal, [$($rf:ident => $cf:literal),* $(,)?]) => {
        $out.push(($c, "sizeof".to_owned(), size_of::<$rust>()));
        $( $out.push(($c, $cf.to_owned(), offset_of!($rust, $rf))); )*
    };
}

fn entries() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    layout!(v, IbvDevice, "struct ibv_device", [ops => "_ops", node_type => "node_type", transport_type => "transport_type",
        name => "name", dev_name => "dev_name", dev_path => "dev_path", ibdev_path => "ibdev_path"]);
    layout!(v, IbvContextOps, "struct ibv_context_ops", [alloc_mw => "alloc_mw", bind_mw => "bind_mw",
        dealloc_mw => "dealloc_mw", poll_cq => "poll_cq", req_notify_cq => "req_notify_cq",
        post_srq_recv => "post_srq_recv", post_send => "post_send", post_recv => "post_recv",
        attach_mcast => "_compat_attach_mcast", detach_mcast => "_compat_detach_mcast"]);
    layout!(v, IbvContext, "struct ibv_context", [device => "device", ops => "ops", cmd_fd => "cmd_fd",
        async_fd => "async_fd", num_comp_vectors => "num_comp_vectors", mutex => "mutex", abi_compat => "abi_compat"]);
    layout!(v, IbvParentDomainInitAttr, "struct ibv_parent_domain_init_attr", [pd => "pd", td => "td",
        comp_mask => "comp_mask", alloc => "alloc", free => "free", pd_context => "pd_context"]);
    layout!(v, IbvDm, "struct ibv_dm", [context => "context", memcpy_to_dm => "memcpy_to_dm",
        memcpy_from_dm => "memcpy_from_dm", comp_mask => "comp_mask", handle => "handle"]);
    layout!(v, IbvAllocDmAttr, "struct ibv_alloc_dm_attr", [length => "length", log_align_req => "log_align_req",
        comp_mask => "comp_mask"]);
    v.push(("struct ibv_device_attr_ex", "max_dm_size".to_owned(), MAX_DM_SIZE_OFFSET));
    layout!(v, VerbsContext, "struct verbs_context", [query_port => "query_port", advise_mr => "advise_mr",
        reg_dm_mr => "reg_dm_mr", alloc_dm => "alloc_dm", free_dm => "free_dm",
        alloc_parent_domain => "alloc_parent_domain", dealloc_td => "dealloc_td", alloc_td => "alloc_td", query_device_ex => "query_device_ex",
        query_rt_values => "query_rt_values", create_cq_ex => "create_cq_ex", create_qp_ex => "create_qp_ex",
        get_srq_num => "get_srq_num", create_srq_ex => "create_srq_ex", open_xrcd => "open_xrcd",
        close_xrcd => "close_xrcd", sz => "sz", context => "context"]);
    layout!(v, IbvCqEx, "struct ibv_cq_ex", [cq => "context", comp_mask => "comp_mask", status => "status",
        wr_id => "wr_id", start_poll => "start_poll", next_poll => "next_poll", end_poll => "end_poll",
        read_opcode => "read_opcode", read_vendor_err => "read_vendor_err", read_byte_len => "read_byte_len",
        read_imm_data => "read_imm_data", read_qp_num => "read_qp_num", read_src_qp => "read_src_qp",
        read_wc_flags => "read_wc_flags", read_slid => "read_slid", read_sl => "read_sl",
        read_dlid_path_bits => "read_dlid_path_bits", read_completion_ts => "read_completion_ts",
        read_cvlan => "read_cvlan", read_flow_tag => "read_flow_tag", read_tm_info => "read_tm_info",
        read_completion_wallclock_ns => "read_completion_wallclock_ns"]);
    layout!(v, IbvValuesEx, "struct ibv_values_ex", [comp_mask => "comp_mask", raw_clock => "raw_clock"]);
    v.push(("struct ibv_device_attr_ex", "completion_timestamp_mask".to_owned(), COMPLETION_TIMESTAMP_MASK_OFFSET));
    v.push(("struct ibv_device_attr_ex", "hca_core_clock".to_owned(), HCA_CORE_CLOCK_OFFSET));
    v.push(("struct ibv_device_attr_ex", "odp_caps".to_owned(), ODP_CAPS_OFFSET));
    v.push(("struct ibv_device_attr_ex", "xrc_odp_caps".to_owned(), XRC_ODP_CAPS_OFFSET));
    layout!(v, IbvXrcdInitAttr, "struct ibv_xrcd_init_attr", [comp_mask => "comp_mask", fd => "fd", oflags => "oflags"]);
    layout!(v, IbvSrqInitAttrEx, "struct ibv_srq_init_attr_ex", [srq_context => "srq_context", attr => "attr",
        comp_mask => "comp_mask", srq_type => "srq_type", pd => "pd", xrcd => "xrcd", cq => "cq", tm_cap => "tm_cap"]);
    v.push(("struct ibv_device_attr_ex", "device_cap_flags_ex".to_owned(), DEVICE_CAP_FLAGS_EX_OFFSET));
    layout!(v, IbvPollCqAttr, "struct ibv_poll_cq_attr", [comp_mask => "comp_mask"]);
    layout!(v, IbvCqInitAttrEx, "struct ibv_cq_init_attr_ex", [cqe => "cqe", cq_context => "cq_context",
        channel => "channel", comp_vector => "comp_vector", wc_flags => "wc_flags", comp_mask => "comp_mask",
        flags => "flags", parent_domain => "parent_domain"]);
    // query_device_ex writes `struct ibv_device_attr_ex` by these two numbers.
    v.push(("struct ibv_device_attr_ex", "sizeof".to_owned(), DEVICE_ATTR_EX_LEN));
    v.push(("struct ibv_device_attr_ex", "phys_port_cnt_ex".to_owned(), PHYS_PORT_CNT_EX_OFFSET));
    v.push(("struct ibv_device_attr_ex", "comp_mask".to_owned(), size_of::<IbvDeviceAttr>()));
    layout!(v, IbvQpEx, "struct ibv_qp_ex", [qp_base => "qp_base", comp_mask => "comp_mask", wr_id => "wr_id",
        wr_flags => "wr_flags", wr_atomic_cmp_swp => "wr_atomic_cmp_swp", wr_atomic_fetch_add => "wr_atomic_fetch_add",
        wr_bind_mw => "wr_bind_mw", wr_local_inv => "wr_local_inv", wr_rdma_read => "wr_rdma_read",
        wr_rdma_write => "wr_rdma_write", wr_rdma_write_imm => "wr_rdma_write_imm", wr_send => "wr_send",
        wr_send_imm => "wr_send_imm", wr_send_inv => "wr_send_inv", wr_send_tso => "wr_send_tso",
        wr_set_ud_addr => "wr_set_ud_addr", wr_set_xrc_srqn => "wr_set_xrc_srqn",
        wr_set_inline_data => "wr_set_inline_data", wr_set_inline_data_list => "wr_set_inline_data_list",
        wr_set_sge => "wr_set_sge", wr_set_sge_list => "wr_set_sge_list", wr_start => "wr_start",
        wr_complete => "wr_complete", wr_abort => "wr_abort", wr_atomic_write => "wr_atomic_write"]);
    // rdma-core 47 appends `wr_flush`: Debian's (44) struct ends where it begins.
    for e in v.iter_mut().filter(|e| e.0 == "struct ibv_qp_ex" && e.1 == "sizeof") {
        e.2 = offset_of!(IbvQpEx, wr_flush);
    }
    layout!(v, IbvQpInitAttrEx, "struct ibv_qp_init_attr_ex", [qp_context => "qp_context", send_cq => "send_cq",
        recv_cq => "recv_cq", srq => "srq", cap => "cap", qp_type => "qp_type", sq_sig_all => "sq_sig_all",
        comp_mask => "comp_mask", pd => "pd", xrcd => "xrcd", create_flags => "create_flags",
        max_tso_header => "max_tso_header", rwq_ind_tbl => "rwq_ind_tbl", rx_hash_conf => "rx_hash_conf",
        source_qpn => "source_qpn", send_ops_flags => "send_ops_flags"]);
    layout!(v, IbvRxHashConf, "struct ibv_rx_hash_conf", [rx_hash_function => "rx_hash_function",
        rx_hash_key_len => "rx_hash_key_len", rx_hash_key => "rx_hash_key", rx_hash_fields_mask => "rx_hash_fields_mask"]);
    layout!(v, IbvDataBuf, "struct ibv_data_buf", [addr => "addr", length => "length"]);
    layout!(v, IbvDeviceAttr, "struct ibv_device_attr", [fw_ver => "fw_ver", node_guid => "node_guid",
        sys_image_guid => "sys_image_guid", max_mr_size => "max_mr_size", page_size_cap => "page_size_cap",
        vendor_id => "vendor_id", vendor_part_id => "vendor_part_id", hw_ver => "hw_ver", max_qp => "max_qp",
        max_qp_wr => "max_qp_wr", device_cap_flags => "device_cap_flags", max_sge => "max_sge",
        max_sge_rd => "max_sge_rd", max_cq => "max_cq", max_cqe => "max_cqe", max_mr => "max_mr", max_pd => "max_pd",
        max_qp_rd_atom => "max_qp_rd_atom", max_ee_rd_atom => "max_ee_rd_atom", max_res_rd_atom => "max_res_rd_atom",
        max_qp_init_rd_atom => "max_qp_init_rd_atom", max_ee_init_rd_atom => "max_ee_init_rd_atom",
        atomic_cap => "atomic_cap", max_ee => "max_ee", max_rdd => "max_rdd", max_mw => "max_mw",
        max_raw_ipv6_qp => "max_raw_ipv6_qp", max_raw_ethy_qp => "max_raw_ethy_qp", max_mcast_grp => "max_mcast_grp",
        max_mcast_qp_attach => "max_mcast_qp_attach", max_total_mcast_qp_attach => "max_total_mcast_qp_attach",
        max_ah => "max_ah", max_fmr => "max_fmr", max_map_per_fmr => "max_map_per_fmr", max_srq => "max_srq",
        max_srq_wr => "max_srq_wr", max_srq_sge => "max_srq_sge", max_pkeys => "max_pkeys",
        local_ca_ack_delay => "local_ca_ack_delay", phys_port_cnt => "phys_port_cnt"]);
    layout!(v, IbvPortAttr, "struct ibv_port_attr", [state => "state", max_mtu => "max_mtu", active_mtu => "active_mtu",
        gid_tbl_len => "gid_tbl_len", port_cap_flags => "port_cap_flags", max_msg_sz => "max_msg_sz",
        bad_pkey_cntr => "bad_pkey_cntr", qkey_viol_cntr => "qkey_viol_cntr", pkey_tbl_len => "pkey_tbl_len",
        lid => "lid", sm_lid => "sm_lid", lmc => "lmc", max_vl_num => "max_vl_num", sm_sl => "sm_sl",
        subnet_timeout => "subnet_timeout", init_type_reply => "init_type_reply", active_width => "active_width",
        active_speed => "active_speed", phys_state => "phys_state", link_layer => "link_layer", flags => "flags",
        port_cap_flags2 => "port_cap_flags2"]);
    layout!(v, IbvGid, "union ibv_gid", [raw => "raw"]);
    layout!(v, IbvGidEntry, "struct ibv_gid_entry", [gid => "gid", gid_index => "gid_index", port_num => "port_num",
        gid_type => "gid_type", ndev_ifindex => "ndev_ifindex"]);
    layout!(v, IbvPd, "struct ibv_pd", [context => "context", handle => "handle"]);
    layout!(v, IbvMr, "struct ibv_mr", [context => "context", pd => "pd", addr => "addr", length => "length",
        handle => "handle", lkey => "lkey", rkey => "rkey"]);
    layout!(v, IbvCompChannel, "struct ibv_comp_channel", [context => "context", fd => "fd", refcnt => "refcnt"]);
    layout!(v, IbvCq, "struct ibv_cq", [context => "context", channel => "channel", cq_context => "cq_context",
        handle => "handle", cqe => "cqe", mutex => "mutex", cond => "cond",
        comp_events_completed => "comp_events_completed", async_events_completed => "async_events_completed"]);
    layout!(v, IbvSrq, "struct ibv_srq", [context => "context", srq_context => "srq_context", pd => "pd",
        handle => "handle", mutex => "mutex", cond => "cond", events_completed => "events_completed"]);
    layout!(v, IbvQp, "struct ibv_qp", [context => "context", qp_context => "qp_context", pd => "pd",
        send_cq => "send_cq", recv_cq => "recv_cq", srq => "srq", handle => "handle", qp_num => "qp_num",
        state => "state", qp_type => "qp_type", mutex => "mutex", cond => "cond", events_completed => "events_completed"]);
    layout!(v, IbvAh, "struct ibv_ah", [context => "context", pd => "pd", handle => "handle"]);
    layout!(v, IbvWc, "struct ibv_wc", [wr_id => "wr_id", status => "status", opcode => "opcode",
        vendor_err => "vendor_err", byte_len => "byte_len", imm_data => "imm_data", qp_num => "qp_num",
        src_qp => "src_qp", wc_flags => "wc_flags", pkey_index => "pkey_index", slid => "slid", sl => "sl",
        dlid_path_bits => "dlid_path_bits"]);
    layout!(v, IbvSge, "struct ibv_sge", [addr => "addr", length => "length", lkey => "lkey"]);
    layout!(v, IbvSendWr, "struct ibv_send_wr", [wr_id => "wr_id", next => "next", sg_list => "sg_list",
        num_sge => "num_sge", opcode => "opcode", send_flags => "send_flags", imm_data => "imm_data", wr => "wr",
        remote_srqn => "qp_type.xrc.remote_srqn", bind_mw => "bind_mw"]);
    let bind = offset_of!(IbvSendWr, bind_mw);
    v.push(("struct ibv_send_wr", "bind_mw.mw".into(), bind + offset_of!(WrBindMw, mw)));
    v.push(("struct ibv_send_wr", "bind_mw.rkey".into(), bind + offset_of!(WrBindMw, rkey)));
    v.push(("struct ibv_send_wr", "bind_mw.bind_info".into(), bind + offset_of!(WrBindMw, bind_info)));
    layout!(v, IbvMw, "struct ibv_mw", [context => "context", pd => "pd", rkey => "rkey", handle => "handle",
        mw_type => "type"]);
    layout!(v, IbvMwBindInfo, "struct ibv_mw_bind_info", [mr => "mr", addr => "addr", length => "length",
        mw_access_flags => "mw_access_flags"]);
    layout!(v, IbvMwBind, "struct ibv_mw_bind", [wr_id => "wr_id", send_flags => "send_flags",
        bind_info => "bind_info"]);
    let wr = offset_of!(IbvSendWr, wr);
    v.push(("struct ibv_send_wr", "wr.rdma.remote_addr".into(), wr + offset_of!(WrRdma, remote_addr)));
    v.push(("struct ibv_send_wr", "wr.rdma.rkey".into(), wr + offset_of!(WrRdma, rkey)));
    v.push(("struct ibv_send_wr", "wr.atomic.remote_addr".into(), wr + offset_of!(WrAtomic, remote_addr)));
    v.push(("struct ibv_send_wr", "wr.atomic.compare_add".into(), wr + offset_of!(WrAtomic, compare_add)));
    v.push(("struct ibv_send_wr", "wr.atomic.swap".into(), wr + offset_of!(WrAtomic, swap)));
    v.push(("struct ibv_send_wr", "wr.atomic.rkey".into(), wr + offset_of!(WrAtomic, rkey)));
    v.push(("struct ibv_send_wr", "wr.ud.ah".into(), wr + offset_of!(WrUd, ah)));
    v.push(("struct ibv_send_wr", "wr.ud.remote_qpn".into(), wr + offset_of!(WrUd, remote_qpn)));
    v.push(("struct ibv_send_wr", "wr.ud.remote_qkey".into(), wr + offset_of!(WrUd, remote_qkey)));
    layout!(v, IbvRecvWr, "struct ibv_recv_wr", [wr_id => "wr_id", next => "next", sg_list => "sg_list",
        num_sge => "num_sge"]);
    layout!(v, IbvQpCap, "struct ibv_qp_cap", [max_send_wr => "max_send_wr", max_recv_wr => "max_recv_wr",
        max_send_sge => "max_send_sge", max_recv_sge => "max_recv_sge", max_inline_data => "max_inline_data"]);
    layout!(v, IbvQpInitAttr, "struct ibv_qp_init_attr", [qp_context => "qp_context", send_cq => "send_cq",
        recv_cq => "recv_cq", srq => "srq", cap => "cap", qp_type => "qp_type", sq_sig_all => "sq_sig_all"]);
    layout!(v, IbvGlobalRoute, "struct ibv_global_route", [dgid => "dgid", flow_label => "flow_label",
        sgid_index => "sgid_index", hop_limit => "hop_limit", traffic_class => "traffic_class"]);
    layout!(v, IbvAhAttr, "struct ibv_ah_attr", [grh => "grh", dlid => "dlid", sl => "sl",
        src_path_bits => "src_path_bits", static_rate => "static_rate", is_global => "is_global",
        port_num => "port_num"]);
    layout!(v, IbvQpAttr, "struct ibv_qp_attr", [qp_state => "qp_state", cur_qp_state => "cur_qp_state",
        path_mtu => "path_mtu", path_mig_state => "path_mig_state", qkey => "qkey", rq_psn => "rq_psn",
        sq_psn => "sq_psn", dest_qp_num => "dest_qp_num", qp_access_flags => "qp_access_flags", cap => "cap",
        ah_attr => "ah_attr", alt_ah_attr => "alt_ah_attr", pkey_index => "pkey_index",
        alt_pkey_index => "alt_pkey_index", en_sqd_async_notify => "en_sqd_async_notify",
        sq_draining => "sq_draining", max_rd_atomic => "max_rd_atomic", max_dest_rd_atomic => "max_dest_rd_atomic",
        min_rnr_timer => "min_rnr_timer", port_num => "port_num", timeout => "timeout", retry_cnt => "retry_cnt",
        rnr_retry => "rnr_retry", alt_port_num => "alt_port_num", alt_timeout => "alt_timeout",
        rate_limit => "rate_limit"]);
    layout!(v, IbvSrqAttr, "struct ibv_srq_attr", [max_wr => "max_wr", max_sge => "max_sge", srq_limit => "srq_limit"]);
    layout!(v, IbvSrqInitAttr, "struct ibv_srq_init_attr", [srq_context => "srq_context", attr => "attr"]);
    layout!(v, IbvAsyncEvent, "struct ibv_async_event", [element => "element", event_type => "event_type"]);
    v
}

/// The rdma_cm structs librdmacm hands out or reads (`softrdma_ibverbs::cma_abi`).
fn cma_entries() -> Vec<Entry> {
    let mut v: Vec<Entry> = Vec::new();
    layout!(v, RdmaEventChannel, "struct rdma_event_channel", [fd => "fd"]);
    layout!(v, RdmaIbAddr, "struct rdma_ib_addr", [sgid => "sgid", dgid => "dgid", pkey => "pkey"]);
    layout!(v, RdmaAddr, "struct rdma_addr", [src_addr => "src_addr", dst_addr => "dst_addr",
        ibaddr => "addr.ibaddr"]);
    layout!(v, RdmaRoute, "struct rdma_route", [addr => "addr", path_rec => "path_rec", num_paths => "num_paths"]);
    layout!(v, RdmaCmId, "struct rdma_cm_id", [verbs => "verbs", channel => "channel", context => "context",
        qp => "qp", route => "route", ps => "ps", port_num => "port_num", event => "event",
        send_cq_channel => "send_cq_channel", send_cq => "send_cq", recv_cq_channel => "recv_cq_channel",
        recv_cq => "recv_cq", srq => "srq", pd => "pd", qp_type => "qp_type"]);
    layout!(v, RdmaConnParam, "struct rdma_conn_param", [private_data => "private_data",
        private_data_len => "private_data_len", responder_resources => "responder_resources",
        initiator_depth => "initiator_depth", flow_control => "flow_control", retry_count => "retry_count",
        rnr_retry_count => "rnr_retry_count", srq => "srq", qp_num => "qp_num"]);
    layout!(v, RdmaUdParam, "struct rdma_ud_param", [private_data => "private_data",
        private_data_len => "private_data_len", ah_attr => "ah_attr", qp_num => "qp_num", qkey => "qkey"]);
    layout!(v, RdmaCmEvent, "struct rdma_cm_event", [id => "id", listen_id => "listen_id", event => "event",
        status => "status", param => "param"]);
    layout!(v, RdmaAddrinfo, "struct rdma_addrinfo", [ai_flags => "ai_flags", ai_family => "ai_family",
        ai_qp_type => "ai_qp_type", ai_port_space => "ai_port_space", ai_src_len => "ai_src_len",
        ai_dst_len => "ai_dst_len", ai_src_addr => "ai_src_addr", ai_dst_addr => "ai_dst_addr",
        ai_src_canonname => "ai_src_canonname", ai_dst_canonname => "ai_dst_canonname",
        ai_route_len => "ai_route_len", ai_route => "ai_route", ai_connect_len => "ai_connect_len",
        ai_connect => "ai_connect", ai_next => "ai_next"]);
    v
}

#[test]
fn structs_match_rdma_core_headers() {
    check("/usr/include/infiniband/verbs.h", "libibverbs-dev", &entries());
}

#[test]
fn rdma_cm_structs_match_rdma_core_headers() {
    check("/usr/include/rdma/rdma_cma.h", "librdmacm-dev", &cma_entries());
}

/// Compiles a program printing the C side of `entries` against `header` and compares.
fn check(header: &str, package: &str, entries: &[Entry]) {
    let header = std::path::Path::new(header);
    if !header.exists() {
        eprintln!("SKIP: {} is missing (apt-get install {package})", header.display());
        return;
    }
    let mut c =
        format!("#include <stdio.h>\n#include <stddef.h>\n#include <{}>\nint main(void) {{\n", header.display());
    for (ty, field, _) in entries {
        if field == "sizeof" {
            c += &format!("  printf(\"%zu\\n\", sizeof({ty}));\n");
        } else {
            c += &format!("  printf(\"%zu\\n\", offsetof({ty}, {field}));\n");
        }
    }
    c += "  return 0;\n}\n";
    let dir = std::env::temp_dir().join(format!("softrdma-layout-{}-{package}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, c).unwrap();
    let cc = match Command::new("cc").arg(&src).arg("-o").arg(&exe).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIP: cannot run cc: {e}");
            return;
        }
    };
    assert!(cc.status.success(), "cc failed:\n{}", String::from_utf8_lossy(&cc.stderr));
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let c_values: Vec<usize> = String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(c_values.len(), entries.len());
    let wrong: Vec<String> = entries
        .iter()
        .zip(&c_values)
        .filter(|((_, _, rust), c)| rust != *c)
        .map(|((ty, field, rust), c)| format!("{ty} {field}: C {c}, Rust {rust}"))
        .collect();
    assert!(wrong.is_empty(), "layouts differ from {}:\n{}", header.display(), wrong.join("\n"));
    eprintln!("{} sizes and offsets equal rdma-core's", entries.len());
}
