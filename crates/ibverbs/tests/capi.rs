//! C programs (tests/c/*.c) compiled against rdma-core's real headers (Debian
//! `libibverbs-dev`, `librdmacm-dev`) and run over this build's libraries: behaviour the
//! Debian programs of the conformance run do not reach. Skips, saying why, where `cc` or the
//! headers are missing (.ci/run installs them).
#![allow(clippy::print_stderr)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;

/// Compiles `tests/c/<name>.c` against the libraries in `lib` and runs it; its output.
fn run_c(name: &str, lib: &Path) -> Option<std::process::Output> {
    let exe = build_c(name, lib)?;
    Some(Command::new(&exe).env("LD_LIBRARY_PATH", lib).output().expect("running the C test"))
}

/// Builds and runs `tests/c/<name>.c` over this build's libraries; it must print "ok".
fn passes(name: &str) {
    let lib = lib_dir(&format!("capi-{name}"));
    assert!(lib.rdmacm, "librdmacm.so.1 was not built");
    let Some(out) = run_c(name, &lib.path) else { return };
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.trim() == "ok", "{stdout}{stderr}");
}

#[test]
fn a_failed_post_names_its_first_unposted_wr_in_bad_wr() {
    passes("post_bad_wr");
}

#[test]
fn multicast_reaches_every_attached_qp_of_every_process() {
    passes("mcast");
}

#[test]
fn rdma_join_multicast_reports_the_group_and_attaches_the_ids_qp() {
    passes("mcast_cm");
}

#[test]
fn channels_in_an_event_loop_nonblocking_and_pollable() {
    passes("event_loop");
}

#[test]
fn the_extended_cq_reads_what_ibv_poll_cq_gives() {
    passes("cq_ex");
}

#[test]
fn regions_on_demand_fault_pages_in_and_fail_where_they_cannot() {
    passes("odp");
}

#[test]
fn a_parent_domain_is_its_protection_domain_for_every_verb() {
    passes("parent_domain");
}

#[test]
fn device_memory_and_regions_named_by_an_iova() {
    passes("dm");
}

#[test]
fn atomic_write_stores_eight_bytes() {
    passes("atomic_write");
}

#[test]
fn the_wr_api_posts_whole_batches_or_nothing() {
    passes("wr_api");
}

#[test]
fn memory_windows_of_both_types_bind_reach_and_invalidate() {
    passes("mw");
}

#[test]
fn flush_through_rdma_core_47s_wr_flush_to_global_visibility_and_persistence() {
    passes("flush");
}

#[test]
fn xrc_domains_srqs_and_qps_deliver_each_message_to_the_srq_it_names() {
    passes("xrc");
}

#[test]
fn async_events_name_their_cq_and_srq() {
    passes("async_events");
}

#[test]
fn a_forked_child_that_exits_leaves_its_parents_connections_alone() {
    passes("fork_exit");
}

#[test]
fn a_child_forked_from_a_process_with_60_contexts_connects() {
    passes("fork_many_contexts");
}

#[test]
fn rdma_get_src_and_dst_port_read_the_ids_addresses() {
    passes("ports");
}

#[test]
fn rereg_mr_changes_access_rights_and_keeps_the_keys() {
    passes("rereg_mr");
}

#[test]
fn rdma_set_local_ece_and_get_remote_ece_behave_as_librdmacms() {
    passes("ece");
}

#[test]
fn rdma_set_option_sets_the_tos_and_the_ack_timeout() {
    passes("set_option");
}

#[test]
fn query_device_ex_gives_one_physical_port_and_cmd_fd_is_a_file() {
    passes("query_device_ex");
}

#[test]
fn resize_cq_grows_and_keeps_what_it_holds() {
    passes("resize_cq");
}

#[test]
fn create_qp_ex_takes_the_create_flags_bit_with_no_flag() {
    passes("qp_ex_create_flags");
}

#[test]
fn create_cq_refuses_a_completion_vector_past_num_comp_vectors() {
    passes("cq_comp_vector");
}

#[test]
fn a_ud_receive_tells_its_ip_version_in_sl_as_connectx_does() {
    passes("ud_packet_type");
}

#[test]
fn a_resolved_rdma_cm_id_carries_its_devices_pd() {
    passes("id_pd");
}

#[test]
fn a_connection_over_the_programs_own_qps_uses_init_qp_attr_and_establish() {
    passes("own_qp_connect");
}

#[test]
fn the_sysfs_tree_says_what_the_verbs_say() {
    passes("sysfs_tree");
}

#[test]
fn a_destroyed_rdma_cm_id_is_refused_not_dereferenced() {
    passes("destroyed_id");
}

#[test]
fn rdma_destroy_id_waits_until_the_ids_events_are_acked() {
    passes("destroy_waits_for_ack");
}

#[test]
fn a_wildcard_listeners_devices_stay_open_after_it_is_destroyed() {
    passes("wildcard_devices");
}

#[test]
fn rdma_cm_does_what_libfabrics_verbs_provider_needs() {
    passes("libfabric_cm");
}

/// perftest -R's client retrying after REJ 8 (tests/c/rejected_retry.c), with each cleanup
/// perftest has used, against a server process that listens only after the client's second
/// REJECTED: on one host the REJ comes once the same-host REQ resends (63 ms) are spent.
#[test]
fn perftests_retry_after_rej_8_connects_on_one_host() {
    let lib = lib_dir("capi-rejected_retry");
    assert!(lib.rdmacm, "librdmacm.so.1 was not built");
    let Some(exe) = build_c("rejected_retry", &lib.path) else { return };
    let port = 7000 + (std::process::id() % 1000) as u16 * 4;
    for (i, cleanup) in ["upstream", "debian"].into_iter().enumerate() {
        let port = (port + 2 * i as u16).to_string();
        let server = spawn(None, &exe, &lib.path, &["server", "127.0.0.1", &port]);
        pair(server, spawn(None, &exe, &lib.path, &["client", "127.0.0.1", &port, cleanup]), cleanup);
    }
}

/// The same between two hosts (network namespaces joined by veth), where nothing resends a
/// rejected REQ: the peer's REJ 8 reaches the client at once. Needs root; skips, saying why,
/// where namespaces cannot be made.
#[test]
fn perftests_retry_after_rej_8_connects_across_two_hosts() {
    const ADDRS: [&str; 2] = ["10.77.0.1", "10.77.0.2"];
    let Some(ns) = NetnsPair::create_or_skip("rr", ["srdma-va", "srdma-vb"]) else { return };
    for (i, addr) in ADDRS.into_iter().enumerate() {
        ns.add_address(i, &format!("{addr}/24"));
    }
    let lib = lib_dir("capi-rejected_retry-netns");
    assert!(lib.rdmacm, "librdmacm.so.1 was not built");
    let Some(exe) = build_c("rejected_retry", &lib.path) else { return };
    for (port, cleanup) in [("7481", "upstream"), ("7483", "debian")] {
        let server = spawn(Some(&ns.names[1]), &exe, &lib.path, &["server", ADDRS[1], port]);
        let client = spawn(Some(&ns.names[0]), &exe, &lib.path, &["client", ADDRS[1], port, cleanup]);
        pair(server, client, cleanup);
    }
}

/// `exe args` over the libraries in `lib`, in network namespace `netns`, its standard
/// streams piped.
fn spawn(netns: Option<&str>, exe: &Path, lib: &Path, args: &[&str]) -> Child {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args(args).env("LD_LIBRARY_PATH", lib).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("starting the C test")
}

/// Tells the server to listen once the client says "rejected 2", then waits for the client
/// and the server (killed if the client failed); each must end with "ok".
fn pair(mut server: Child, mut client: Child, what: &str) {
    let mut server_stdin = server.stdin.take();
    let mut said = String::new();
    for line in BufReader::new(client.stdout.take().expect("the client's stdout")).lines() {
        let Ok(line) = line else { break };
        if line == "rejected 2" {
            if let Some(mut stdin) = server_stdin.take() {
                let _ = stdin.write_all(b"listen\n");
            }
        }
        said.push_str(&line);
        said.push('\n');
    }
    let client = client.wait_with_output().expect("waiting for the client");
    if !client.status.success() {
        let _ = server.kill();
    }
    drop(server_stdin);
    let server = server.wait_with_output().expect("waiting for the server");
    let server_said = String::from_utf8_lossy(&server.stdout);
    let ok = client.status.success() && said.ends_with("ok\n") && server.status.success() && server_said.trim() == "ok";
    assert!(
        ok,
        "{what}: client {}: {said}{}server {}: {server_said}{}",
        client.status,
        String::from_utf8_lossy(&client.stderr),
        server.status,
        String::from_utf8_lossy(&server.stderr)
    );
}
