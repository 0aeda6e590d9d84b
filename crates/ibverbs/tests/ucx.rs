//! UCX (Debian's ucx-utils, 1.13) over this build's libraries: `ucx_info -d` lists the
//! `rc_verbs` and `ud_verbs` transports on `softrdma_lo`, `ucx_perftest` runs as a server
//! and a client process on 127.0.0.1 over each, and `io_demo` connects through UCX's rdmacm
//! connection manager. Each run is in a network namespace of its own (`unshare -n`) under
//! `scripts/softrdma-sysfs-ns`, which gives UCX the `/dev/infiniband/uverbsN` and
//! `/sys/class/infiniband` it reads: so it needs root. Skips, saying why, where UCX is not
//! installed (`apt-get install ucx-utils`) or this is not root.
#![allow(clippy::print_stderr)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

/// Runs `script` (bash) in a new network namespace with `lo` up, inside
/// scripts/softrdma-sysfs-ns, over the libraries in `lib`, with `env`.
fn in_namespace(lib: &Path, env: &[(&str, &str)], script: &str) -> Output {
    let ns = repo().join("scripts/softrdma-sysfs-ns");
    let inner = format!("ip link set lo up && exec {} bash -c '{}'", ns.display(), script.replace('\'', r"'\''"));
    let mut cmd = Command::new("timeout");
    cmd.args(["300", "unshare", "-n", "bash", "-c", &inner])
        .env("LD_LIBRARY_PATH", lib)
        .env("UCX_NET_DEVICES", "softrdma_lo:1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running unshare")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Whether this process can run the namespaced cases; says why not.
fn can_run() -> bool {
    for program in ["ucx_info", "ucx_perftest", "io_demo"] {
        if !installed(program) {
            eprintln!("SKIP: {program} is not installed (apt-get install ucx-utils)");
            return false;
        }
    }
    if !run(&["id", "-u"]).is_ok_and(|u| u.trim() == "0") {
        eprintln!("SKIP: UCX needs /dev/infiniband/uverbsN, which scripts/softrdma-sysfs-ns makes as root only");
        return false;
    }
    if !installed("ibv_devices") {
        eprintln!(
            "SKIP: ibv_devices is not installed (apt-get install ibverbs-utils): it writes the device tree first"
        );
        return false;
    }
    true
}

#[test]
fn ucx_info_lists_rc_verbs_and_ud_verbs_on_softrdma() {
    if !can_run() {
        return;
    }
    let lib = lib_dir("ucx-info");
    let out = in_namespace(&lib.path, &[], "ucx_info -d");
    let t = text(&out);
    assert!(out.status.success(), "ucx_info -d failed:\n{t}");
    // The memory domain's section, up to the next one.
    let md = t.split("# Memory domain: ").find(|s| s.starts_with("softrdma_lo\n")).unwrap_or_else(|| {
        panic!("no memory domain softrdma_lo:\n{t}");
    });
    for tl in ["rc_verbs", "ud_verbs"] {
        let section = md.split("#      Transport: ").find(|s| s.starts_with(&format!("{tl}\n")));
        let section = section.unwrap_or_else(|| panic!("no transport {tl} on softrdma_lo:\n{md}"));
        assert!(section.contains("Device: softrdma_lo:1"), "{tl} is not on port 1:\n{section}");
    }
}

/// One ucx_perftest server and client, on 127.0.0.1; the client's last line, or what failed.
fn perftest(lib: &Path, tls: &str, test: &str, size: u32, iters: u32) -> Result<String, String> {
    let args = format!("-t {test} -s {size} -n {iters} -w 100 -f");
    let script = format!(
        "ucx_perftest {args} > /dev/null 2>server.err & server=$!
         for i in $(seq 100); do ss -ltn | grep -q :13337 && break; sleep 0.1; done
         timeout 120 ucx_perftest 127.0.0.1 {args}; client=$?
         wait $server; server=$?
         [ $server = 0 ] || {{ echo server exited $server; cat server.err; }} >&2
         [ $client = 0 ] && [ $server = 0 ]"
    );
    let dir = std::env::temp_dir().join(format!("softrdma-ucx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = in_namespace(lib, &[("UCX_TLS", tls)], &format!("cd {} || exit 1\n{script}", dir.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let t = text(&out);
    if !out.status.success() {
        return Err(t);
    }
    let last = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned();
    // -f: "<iterations> <typical> <average> <overall> ..." for the whole run.
    match last.split_whitespace().next() {
        Some(n) if n == iters.to_string() => Ok(last),
        _ => Err(format!("the client did not report {iters} iterations:\n{t}")),
    }
}

#[test]
fn ucx_perftest_runs_over_rc_verbs_and_ud_verbs() {
    if !can_run() {
        return;
    }
    let lib = lib_dir("ucx-perftest");
    let mut failed = Vec::new();
    // rc_verbs needs ud_verbs as its auxiliary transport to connect (UCX's "rc_v").
    for tls in ["rc_verbs,ud_verbs:aux", "ud_verbs"] {
        for test in ["ucp_put_bw", "ucp_get", "tag_lat", "tag_bw", "stream_bw"] {
            for size in [8, 65536] {
                match perftest(&lib.path, tls, test, size, 500) {
                    Ok(line) => eprintln!("pass  UCX_TLS={tls} -t {test} -s {size}: {line}"),
                    Err(e) => {
                        eprintln!("FAIL  UCX_TLS={tls} -t {test} -s {size}:\n{e}");
                        failed.push(format!("{tls} {test} {size}"));
                    }
                }
            }
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

/// UCX's own connection establishment through rdma_cm (a UCP listener and a client that
/// connects to its socket address): io_demo writes with data checks (-q) over rc_verbs.
#[test]
fn ucx_connects_through_rdmacm() {
    if !can_run() {
        return;
    }
    let lib = lib_dir("ucx-rdmacm");
    let script = "io_demo -q -i 200 -d 8:65536 > server.out 2>&1 & server=$!
         for i in $(seq 100); do ss -ltn | grep -q :1337 && break; sleep 0.1; done
         timeout 120 io_demo -q -i 200 -d 8:65536 -c 3 -y 1 127.0.0.1; client=$?
         kill $server
         for i in $(seq 50); do kill -0 $server 2>/dev/null || break; sleep 0.1; done
         kill -9 $server 2>/dev/null; wait $server
         exit $client";
    let dir = std::env::temp_dir().join(format!("softrdma-ucx-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = in_namespace(
        &lib.path,
        &[("UCX_TLS", "rc_verbs"), ("UCX_SOCKADDR_TLS_PRIORITY", "rdmacm")],
        &format!("cd {} || exit 1\n{script}", dir.display()),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let t = text(&out);
    assert!(out.status.success(), "io_demo over rdmacm failed:\n{t}");
    assert!(t.contains("Client exit with status 'OK'"), "{t}");
    // io_demo reports its operations every so often ("[DEMO] total min:170 max:170
    // total:170 | read ... | write ..."), one line per period: 200 in all.
    let done: u64 = t
        .lines()
        .filter_map(|l| l.split_once("[DEMO] total min:"))
        .filter_map(|(_, rest)| rest.split_once(" total:"))
        .filter_map(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(done, 200, "the client did not write 200 times:\n{t}");
}
