//! C programs (tests/c/*.c) compiled against rdma-core's real headers (Debian
//! `libibverbs-dev`, `librdmacm-dev`) and run over this build's libraries: behaviour the
//! Debian programs of the conformance run do not reach. Skips, saying why, where `cc` or the
//! headers are missing (.ci/run installs them).
#![allow(clippy::print_stderr)]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// Compiles `tests/c/<name>.c` against the libraries in `lib` and runs it; its output.
fn run_c(name: &str, lib: &Path) -> Option<std::process::Output> {
    for header in ["/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"] {
        if !Path::new(header).exists() {
            eprintln!("SKIP: {header} is missing (apt-get install libibverbs-dev librdmacm-dev)");
            return None;
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = lib.join(name);
    // Link against our libraries by their sonames, as a program built against rdma-core
    // and then run with LD_LIBRARY_PATH would.
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = match Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(format!("-L{}", lib.display()))
        .args(["-l:librdmacm.so.1", "-l:libibverbs.so.1"])
        .status()
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("SKIP: no C compiler ({cc}: {e})");
            return None;
        }
    };
    assert!(status.success(), "{cc} failed to build {}", src.display());
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
fn channels_in_an_event_loop_nonblocking_and_pollable() {
    passes("event_loop");
}

#[test]
fn the_wr_api_posts_whole_batches_or_nothing() {
    passes("wr_api");
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
fn a_wildcard_listeners_devices_stay_open_after_it_is_destroyed() {
    passes("wildcard_devices");
}
