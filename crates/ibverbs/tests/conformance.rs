//! Runs tests/conformance/run.sh against the libraries this test build produced: Debian's
//! unmodified `ibv_devices`, `ibv_devinfo -v` and the four ping-pongs (RC also with `-N` and `-t`) (two processes each on
//! 127.0.0.1) over our `libibverbs.so.1`; with `librdmacm.so.1` and the `libmlx5.so.1` /
//! `libefa.so.1` stand-ins (which this test builds) also rdmacm-utils and perftest, and as
//! root perftest -R between two network namespaces. Skips, saying why, where ibverbs-utils
//! is not installed (`apt-get install ibverbs-utils`; .ci/run installs it and the others).
#![allow(clippy::print_stderr)]

mod common;

use std::process::Command;

use common::*;

#[test]
fn debian_ibverbs_utils_run_over_softrdma() {
    if !installed("ibv_rc_pingpong") {
        eprintln!("SKIP: ibv_rc_pingpong is not installed (apt-get install ibverbs-utils)");
        return;
    }
    let lib = lib_dir("conformance");
    let script = repo().join("tests/conformance/run.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("SOFTRDMA_LIB_DIR", &lib.path)
        .env("SOFTRDMA_CONFORMANCE_NO_INSTALL", "1")
        .output()
        .expect("running tests/conformance/run.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    for program in [
        "ibv_devices",
        "ibv_devinfo -v",
        "ibv_rc_pingpong -g 0 ",
        "ibv_rc_pingpong -g 0 -N",
        "ibv_rc_pingpong -g 0 -t",
        "ibv_uc_pingpong",
        "ibv_ud_pingpong",
        "ibv_srq_pingpong",
        "ibv_xsrq_pingpong",
    ] {
        assert!(
            // "pass", or "pass (attempt 2; ...)" for a UC/UD ping-pong the script retried.
            text.lines().any(|l| l.starts_with(program) && (l.ends_with(" pass") || l.contains(" pass (attempt 2"))),
            "{program} did not pass:\n{text}"
        );
    }
    let rdmacm_utils = installed("rdma_server");
    // "pass", or "pass (attempt 2: ...)" after perftest's own clock calibration failed.
    let passed = |program: &str| {
        text.lines().any(|l| {
            l.starts_with(&format!("{program} "))
                && (l.ends_with(" pass") || l.contains(" pass (attempt 2: perftest's clock calibration failed"))
        })
    };
    if lib.rdmacm && rdmacm_utils {
        for program in [
            "rdma_server/rdma_client",
            "rdma_xserver/rdma_xclient",
            "rdma_xserver/rdma_xclient -c x",
            "rping -s/-c -v -C 10",
            "rping -v -C 10, SOFTRDMA_AUTH=1",
            "udaddy",
            "ucmatose",
        ] {
            assert!(passed(program), "{program} did not pass:\n{text}");
        }
    }
    if lib.rdmacm && lib.dv && installed("ib_write_bw") {
        for test in ["send", "write", "read", "atomic"] {
            for kind in ["bw", "lat"] {
                for cm in ["", " -R"] {
                    let program = format!("ib_{test}_{kind}{cm}");
                    assert!(passed(&program), "{program} did not pass:\n{text}");
                }
            }
        }
        assert!(passed("ib_write_bw -a"), "ib_write_bw -a did not pass:\n{text}");
        // Two hosts (network namespaces, root only, else a SKIP line): "pass", or "pass
        // (attempt n; ...)" after perftest 4.5+0.17's own crash in its -R retry.
        if !text.lines().any(|l| l.starts_with("two hosts: perftest -R ") && l.contains(" SKIP ")) {
            for program in ["two hosts: ib_send_lat -R", "two hosts: ib_write_bw -R"] {
                let pass = |l: &str| l.ends_with(" pass") || l.contains(" pass (attempt ");
                assert!(
                    text.lines().any(|l| l.starts_with(&format!("{program} ")) && pass(l)),
                    "{program} did not pass:\n{text}"
                );
            }
        }
    }
    assert!(out.status.success(), "a program failed:\n{text}");
}
