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
    let (status, text) = run_with(name, args, &[]);
    assert!(status.success(), "{name} failed:\n{text}");
    text
}

/// Runs example `name` with `args` and `env`; its exit status and its stdout then stderr.
fn run_with(name: &str, args: &[&str], env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
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
        .envs(env.iter().copied())
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
    (out.status, text)
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

/// The program with a bug that the README's "Debugging your RDMA program" follows fails as
/// the README shows, and the log names the cause on both sides: the receiver's RNR NAKs, the
/// sender's waits, the failed work request. With enough receives it succeeds.
#[test]
fn the_debugging_walkthroughs_program_fails_as_the_readme_shows() {
    let (status, text) = run_with("too_few_receives", &[], &[("SOFTRDMA_LOG", "softrdma::qp=debug")]);
    assert_eq!(status.code(), Some(1), "{text}");
    // "sender QP 0x002000, receiver QP 0x004000": the numbers depend on the process's slot
    // in the host's group, which other tests running beside this one take too.
    let qps = text.lines().find_map(|l| l.strip_prefix("sender QP ")).unwrap_or_else(|| panic!("{text}"));
    let (sender, receiver) = qps.split_once(", receiver QP ").unwrap_or_else(|| panic!("{text}"));
    let lines = [
        "send 1 completed: Success".to_string(),
        "send 2 completed: RnrRetryExcErr".to_string(),
        "send 3 completed: WrFlushErr".to_string(),
        "receive 1 completed: Success, 4096 bytes".to_string(),
        format!(
            "QP {receiver}: no receive posted for the peer's message at PSN 258: RNR NAK (the peer waits 640 us and resends)"
        ),
        format!("QP {sender}: RNR NAK (the peer had no receive posted): waiting"),
        format!("QP {sender} RTS → ERR: send work request failed with RnrRetryExcErr"),
    ];
    for line in &lines {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert_eq!(text.matches("RNR NAK (the peer waits").count(), 3, "the first try and 2 retries: {text}");
    let (status, text) = run_with("too_few_receives", &["--recvs", "5"], &[]);
    assert!(status.success() && text.matches("completed: Success").count() == 10, "{text}");
}
