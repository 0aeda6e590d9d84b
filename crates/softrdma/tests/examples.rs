//! The examples run: each does its whole exchange (both sides in one process) and checks
//! its own data, exiting 0 only if everything matched. `cargo test` builds them; this runs
//! the binaries it built, one at a time (they use fixed service ports), each bounded.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/examples-<hash> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("the test binary");
    exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>").join("examples").join(name)
}

fn run(name: &str, args: &[&str]) -> String {
    let path = example(name);
    if !path.exists() {
        // `cargo test --workspace` builds the examples; a run of this test alone may not.
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "softrdma", "--example", name])
            .status()
            .expect("run cargo build --example");
        assert!(status.success() && path.exists(), "could not build example {name}");
    }
    let mut child = Command::new(&path)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the example");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{name} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{name} failed:\n{text}");
    text
}

#[test]
fn examples_run_and_check_their_data() {
    let p = run("pingpong", &["-n", "200", "-s", "1000"]);
    assert!(p.contains("200 round trips of 1000 bytes, data checked"), "{p}");
    let w = run("write_read", &[]);
    for check in
        ["ok   RDMA WRITE of 64 KiB", "ok   the bytes read equal the bytes written", "ok   the counter now holds 7"]
    {
        assert!(w.contains(check), "{w}");
    }
    assert!(!w.contains("FAIL"), "{w}");
    let u = run("ud", &[]);
    assert_eq!(u.matches("(40 of GRH) from 127.0.0.1").count(), 4, "{u}");
}
