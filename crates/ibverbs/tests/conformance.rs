//! Runs tests/conformance/run.sh against the libraries this test build produced: Debian's
//! unmodified `ibv_devices`, `ibv_devinfo -v` and the four ping-pongs (two processes each on
//! 127.0.0.1) over our `libibverbs.so.1`; with `librdmacm.so.1` and the `libmlx5.so.1` /
//! `libefa.so.1` stand-ins (built by `cargo test --workspace`) also rdmacm-utils and
//! perftest. Skips, saying why, where ibverbs-utils is not installed (`apt-get install
//! ibverbs-utils`; .ci/run installs it and the others).
#![allow(clippy::print_stderr)]

use std::path::PathBuf;
use std::process::Command;

#[test]
fn debian_ibverbs_utils_run_over_softrdma() {
    if Command::new("sh").args(["-c", "command -v ibv_rc_pingpong"]).output().map_or(true, |o| !o.status.success()) {
        eprintln!("SKIP: ibv_rc_pingpong is not installed (apt-get install ibverbs-utils)");
        return;
    }
    // The cdylib cargo built for this test: next to it in target/<profile>/deps when `cargo
    // test` built the library as the test's dependency, in target/<profile> after a `cargo
    // build`; the newer one is this build's.
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let newest = |name: &str| {
        [deps.join(name), deps.parent().unwrap().join(name)]
            .into_iter()
            .filter_map(|p| std::fs::metadata(&p).and_then(|m| m.modified()).ok().map(|t| (t, p)))
            .max()
            .map(|(_, p)| p)
    };
    let built = newest("libsoftrdma_ibverbs.so")
        .unwrap_or_else(|| panic!("libsoftrdma_ibverbs.so was not built next to {}", exe.display()));
    let lib = std::env::temp_dir().join(format!("softrdma-ibverbs-{}", std::process::id()));
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::copy(&built, lib.join("libibverbs.so.1")).unwrap();
    // librdmacm.so.1 (softrdma-rdmacm) and the provider stand-ins (softrdma-dv) are
    // cdylibs no test depends on: `cargo test` does not build them, so this does, with the
    // same profile (its output lands next to the libibverbs.so.1 found above).
    let profile_dir = built.parent().unwrap();
    let profile_dir = if profile_dir.ends_with("deps") { profile_dir.parent().unwrap() } else { profile_dir };
    let release = profile_dir.ends_with("release");
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "-q", "-p", "softrdma-rdmacm", "-p", "softrdma-dv"]);
    if release {
        cargo.arg("--release");
    }
    let status = cargo.status().expect("running cargo build -p softrdma-rdmacm -p softrdma-dv");
    assert!(status.success(), "cargo build -p softrdma-rdmacm -p softrdma-dv failed");
    let rdmacm = newest("libsoftrdma_rdmacm.so");
    if let Some(r) = &rdmacm {
        std::fs::copy(r, lib.join("librdmacm.so.1")).unwrap();
    }
    // The provider stand-ins perftest links (softrdma-dv): one object, two names.
    let dv = newest("libsoftrdma_dv.so");
    if let Some(d) = &dv {
        std::fs::copy(d, lib.join("libmlx5.so.1")).unwrap();
        std::os::unix::fs::symlink("libmlx5.so.1", lib.join("libefa.so.1")).unwrap();
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance/run.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("SOFTRDMA_LIB_DIR", &lib)
        .env("SOFTRDMA_CONFORMANCE_NO_INSTALL", "1")
        .output()
        .expect("running tests/conformance/run.sh");
    let _ = std::fs::remove_dir_all(&lib);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    for program in
        ["ibv_devices", "ibv_devinfo -v", "ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong", "ibv_srq_pingpong"]
    {
        assert!(
            // "pass", or "pass (attempt 2; ...)" for a UC/UD ping-pong the script retried.
            text.lines().any(|l| l.starts_with(program) && (l.ends_with(" pass") || l.contains(" pass (attempt 2"))),
            "{program} did not pass:\n{text}"
        );
    }
    let rdmacm_utils =
        Command::new("sh").args(["-c", "command -v rdma_server"]).output().is_ok_and(|o| o.status.success());
    let passed = |program: &str| text.lines().any(|l| l.starts_with(&format!("{program} ")) && l.ends_with(" pass"));
    if rdmacm.is_some() && rdmacm_utils {
        for program in ["rdma_server/rdma_client", "rping -s/-c -v -C 10", "udaddy", "ucmatose"] {
            assert!(passed(program), "{program} did not pass:\n{text}");
        }
    }
    let perftest = Command::new("sh").args(["-c", "command -v ib_write_bw"]).output().is_ok_and(|o| o.status.success());
    if rdmacm.is_some() && dv.is_some() && perftest {
        for test in ["send", "write", "read", "atomic"] {
            for kind in ["bw", "lat"] {
                for cm in ["", " -R"] {
                    let program = format!("ib_{test}_{kind}{cm}");
                    assert!(passed(&program), "{program} did not pass:\n{text}");
                }
            }
        }
        assert!(passed("ib_write_bw -a"), "ib_write_bw -a did not pass:\n{text}");
    }
    assert!(out.status.success(), "a program failed:\n{text}");
}
