//! Debian's libfabric (libfabric-bin's `fi_info` and `fi_pingpong`) over this build's
//! libraries: its verbs provider lists softrdma's devices (MSG endpoints, and RDM ones
//! through `ofi_rxm`), and `fi_pingpong` passes over `verbs` (MSG) and `verbs;ofi_rxm`
//! (RDM), 64 B and 64 KiB, between two network namespaces joined by veth, and between two
//! processes of one namespace over its veth address (the verbs provider never uses a
//! loopback interface, so not over 127.0.0.1: softrdma_lo has no MSG endpoint); its other providers
//! (tcp, udp, shm) still work with our directory first. Skips, saying why, without
//! libfabric-bin or where this process may not make namespaces (root).
#![allow(clippy::print_stderr)]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

const ADDRS: [&str; 2] = ["10.78.0.1", "10.78.0.2"];

/// `fi_* args` in namespace `ns` over the libraries in `lib`, killed after 60 s, run in the
/// temporary directory: libfabric's psm3 provider leaves a `<program>.<host>-<pid>,vm.btr`
/// backtrace in the working directory of a process that crashes.
fn fabric(ns: &str, lib: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "timeout", "-s", "KILL", "60"]).args(args).env("LD_LIBRARY_PATH", lib);
    c.current_dir(std::env::temp_dir());
    c
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `fi_pingpong -p prov -e ep -S size` between a server in namespace `at` and a client in
/// namespace 0 (two hosts, or two processes on one); the client's output.
/// A DGRAM endpoint names its side's domain (`-d softrdma_<veth>-dgram`): the first one
/// listed is softrdma_lo's, whose address (127.0.0.1) the other host cannot reach.
fn pingpong(ns: &NetnsPair, lib: &Path, at: usize, prov: &str, ep: &str, size: &str) -> String {
    let domain = |i: usize| format!("softrdma_{}-dgram", ns.ifaces[i]);
    let args = |i: usize| {
        let mut a: Vec<String> =
            ["fi_pingpong", "-p", prov, "-e", ep, "-S", size, "-I", "100"].map(String::from).to_vec();
        if ep == "dgram" {
            a.extend(["-d".to_string(), domain(i)]);
        }
        a
    };
    let (server_args, client_args) = (args(at), args(0));
    let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let client_args: Vec<&str> = client_args.iter().map(String::as_str).collect();
    let server =
        fabric(&ns.names[at], lib, &server_args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // The client gives up at once if the server's control port is not open yet.
    let mut client = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let out = fabric(&ns.names[0], lib, &client_args).arg(ADDRS[at]).output().unwrap();
        if !text(&out).contains("Connection refused") {
            client = Some(out);
            break;
        }
    }
    let server = server.wait_with_output().unwrap();
    let client =
        client.unwrap_or_else(|| panic!("fi_pingpong -p {prov}: the server never listened: {}", text(&server)));
    let what = format!("fi_pingpong -p {prov} -e {ep} -S {size} {}", ADDRS[at]);
    let passed = |out: &Output| out.status.success() || rxm_teardown_crash(&what, out);
    assert!(
        passed(&client) && passed(&server),
        "{what}: client {}:\n{}\nserver {}:\n{}",
        client.status,
        text(&client),
        server.status,
        text(&server)
    );
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    // "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec", then one line per size.
    let want = if size == "65536" { "64k " } else { "64 " };
    assert!(out.lines().any(|l| l.starts_with(want) && l.contains("=100")), "{what}: no result line:\n{out}");
    eprintln!("{what}:\n{out}");
    out
}

/// Debian's libfabric 1.17.0 (`libfabric1` 1.17.0-3) has a use-after-free in `ofi_rxm`'s
/// teardown: `rxm_close_conn` closes a connection's MSG endpoint and only then drains the
/// MSG CQ, so a receive that completed after the process's last CQ read and before it
/// handled the peer's disconnect is reposted on the freed endpoint (`rxm_flush_msg_cq` →
/// `rxm_finish_recv` → `rxm_post_recv` → `ep->msg->recv`, a NULL `msg`), and the process
/// dies of SIGSEGV after its test has passed. Any provider whose completions arrive while
/// the application thread is off the CPU meets it (here under CI's load, about one run in
/// fifty; the core dumps of a debug build of v1.17.0 show that path and the peer's "fin"
/// message in the buffer). Fixed upstream by 697688386 ("prov/rxm: fix the msg_ep
/// use-after-free at connection teardown", flush first, then close).
///
/// True only for that crash of that build: an RDM run whose side printed its whole result
/// line and then died with the fault's own frame, `libfabric.so.1(+0xb7882)` (the call
/// through `ep->msg` in `rxm_post_recv`), on top. Any other failure fails the test.
fn rxm_teardown_crash(what: &str, out: &Output) -> bool {
    let text = text(out);
    let finished = text.lines().any(|l| l.contains("=100"));
    let crashed = text.contains("terminated with signal 11");
    let top = text.lines().skip_while(|l| !l.contains("Backtrace:")).nth(1).unwrap_or_default();
    let known = what.contains("-e rdm") && finished && crashed && top.contains("libfabric.so.1(+0xb7882)");
    if known {
        eprintln!("{what}: passed, then died in libfabric 1.17's rxm teardown (a libfabric bug, not ours): {top}");
    }
    known
}

#[test]
fn libfabric_runs_over_softrdma() {
    if !installed("fi_pingpong") || !installed("fi_info") {
        eprintln!("SKIP: fi_info or fi_pingpong is not installed (apt-get install libfabric-bin)");
        return;
    }
    let Some(ns) = NetnsPair::create_or_skip("fabric", ["fab0", "fab1"]) else { return };
    for (i, a) in ADDRS.iter().enumerate() {
        ns.add_address(i, &format!("{a}/24"));
    }
    let lib = lib_dir("libfabric");
    assert!(lib.rdmacm && lib.dv, "librdmacm.so.1 or the provider stand-ins were not built");

    // The verbs provider lists the veth end's device: MSG, and RDM through ofi_rxm.
    let out = fabric(&ns.names[0], &lib.path, &["fi_info", "-p", "verbs"]).output().unwrap();
    let info = text(&out);
    assert!(out.status.success(), "fi_info -p verbs: {info}");
    for want in ["domain: softrdma_fab0\n", "type: FI_EP_MSG", "type: FI_EP_DGRAM"] {
        assert!(info.contains(want), "fi_info -p verbs lacks {want:?}:\n{info}");
    }
    let out = fabric(&ns.names[0], &lib.path, &["fi_info", "-p", "verbs;ofi_rxm"]).output().unwrap();
    let info = text(&out);
    assert!(out.status.success() && info.contains("type: FI_EP_RDM"), "fi_info -p 'verbs;ofi_rxm': {info}");
    // The other providers still load and answer.
    for prov in ["tcp", "udp", "shm"] {
        let out = fabric(&ns.names[0], &lib.path, &["fi_info", "-p", prov]).output().unwrap();
        assert!(
            out.status.success() && text(&out).contains(&format!("provider: {prov}")),
            "fi_info -p {prov}: {}",
            text(&out)
        );
    }

    for size in ["64", "65536"] {
        pingpong(&ns, &lib.path, 1, "verbs", "msg", size);
        pingpong(&ns, &lib.path, 1, "verbs;ofi_rxm", "rdm", size);
        pingpong(&ns, &lib.path, 1, "tcp", "msg", size);
    }
    pingpong(&ns, &lib.path, 1, "verbs", "dgram", "64");
    // Two processes on one host, over its own (non-loopback) address.
    pingpong(&ns, &lib.path, 0, "verbs", "msg", "64");
    pingpong(&ns, &lib.path, 0, "verbs;ofi_rxm", "rdm", "64");
}

/// The tolerance above takes that one crash and nothing near it: the output is a server's
/// from a CI run (trimmed), then the same with another frame on top, with the run
/// unfinished, and on a MSG endpoint.
#[test]
fn only_libfabrics_own_teardown_crash_is_forgiven() {
    use std::os::unix::process::ExitStatusExt;
    let crash = |top: &str, result: &str| Output {
        status: std::process::ExitStatus::from_raw(1 << 8),
        stdout: format!("bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n{result}")
            .into(),
        stderr: format!(
            "fi_pingpong:16341 terminated with signal 11 at PC=7f69cf180882 SP=7ffdf1de6430.  Backtrace:\n\
             /lib/x86_64-linux-gnu/libfabric.so.1({top})[0x7f69cf180882]\n\
             /lib/x86_64-linux-gnu/libfabric.so.1(+0xb8cae)[0x7f69cf181cae]\n"
        )
        .into(),
    };
    let done = "64      100     =100     12k         0.56s      0.02    2786.94       0.00\n";
    let rdm = "fi_pingpong -p verbs;ofi_rxm -e rdm -S 64 10.78.0.1";
    assert!(rxm_teardown_crash(rdm, &crash("+0xb7882", done)));
    assert!(!rxm_teardown_crash(rdm, &crash("+0xb8cae", done)), "another frame on top");
    assert!(!rxm_teardown_crash(rdm, &crash("+0xb7882", "")), "a run that did not finish");
    assert!(!rxm_teardown_crash("fi_pingpong -p verbs -e msg -S 64 10.78.0.1", &crash("+0xb7882", done)));
}
