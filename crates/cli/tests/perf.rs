//! `softrdma perf` end to end, through the real binary: every operation and mode over
//! `--loopback` (two processes on 127.0.0.1, RoCEv2 on UDP 4791) with small iteration
//! counts, a separate server and client, bad options, an unreachable server, `--plot` and
//! `perf baseline`. Every JSON output is validated against `perf-report.schema.json` (the
//! crate's documented schema) and then checked for figures that make sense.
//!
//! Every child runs under a deadline: one still running then is killed by its PID and the
//! test fails with what it printed. Traffic goes to 127.0.0.1 only.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long one perf run may take before the test calls it hung. The runs below take
/// 0.05 to 3 s on a loaded 2-core machine in the debug build.
const RUN_LIMIT: Duration = Duration::from_secs(30);
/// How long a command that should fail at once may take.
const QUICK: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------
// Running the binary with a deadline.

/// A running `softrdma`: its output is collected as it comes, so that a hung child can be
/// shown; dropped while running, it is killed by its PID.
struct Proc {
    child: Child,
    what: String,
    started: Instant,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
}

/// A finished run.
struct Done {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

fn collect(mut pipe: impl Read + Send + 'static, into: &Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    let into = Arc::clone(into);
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => into.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(&buf[..n]),
            }
        }
    })
}

fn text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
}

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        Self::spawn_with_env(args, &[])
    }

    fn spawn_with_env(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_softrdma"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start softrdma");
        let (out, err) = (Arc::default(), Arc::default());
        let readers = vec![
            collect(child.stdout.take().expect("stdout pipe"), &out),
            collect(child.stderr.take().expect("stderr pipe"), &err),
        ];
        Proc { child, what: format!("softrdma {}", args.join(" ")), started: Instant::now(), out, err, readers }
    }

    /// Kills the child by its PID and fails the test with what it printed.
    fn kill_and_fail(&mut self, why: &str) -> ! {
        let pid = self.child.id();
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(Duration::from_millis(100));
        panic!(
            "{}: {why}; killed PID {pid}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what,
            text(&self.out),
            text(&self.err)
        );
    }

    /// Waits until the child's standard output contains `needle`.
    fn wait_for_stdout(&mut self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !text(&self.out).contains(needle) {
            if let Ok(Some(status)) = self.child.try_wait() {
                let _ = status;
                self.kill_and_fail(&format!("exited ({status}) before printing {needle:?}"));
            }
            if Instant::now() >= deadline {
                self.kill_and_fail(&format!("did not print {needle:?} within {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the child to exit, at most `limit` from its start.
    fn finish(mut self, limit: Duration) -> Done {
        let deadline = self.started + limit;
        let status = loop {
            match self.child.try_wait().expect("try_wait") {
                Some(status) => break status,
                None if Instant::now() >= deadline => self.kill_and_fail(&format!("still running after {limit:?}")),
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let elapsed = self.started.elapsed();
        // The pipes close when the child (and any child of its own still holding them) is
        // gone; give that a moment, not forever.
        let readers = std::mem::take(&mut self.readers);
        let drain = Instant::now() + Duration::from_secs(5);
        for r in readers {
            while !r.is_finished() && Instant::now() < drain {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Done { status, stdout: text(&self.out), stderr: text(&self.err), elapsed }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn softrdma(args: &[&str], limit: Duration) -> Done {
    Proc::spawn(args).finish(limit)
}

/// Runs a `--json` command that must succeed, and returns its one JSON object.
fn perf_json(args: &[&str]) -> Value {
    let done = softrdma(args, RUN_LIMIT);
    let cmd = args.join(" ");
    assert!(done.status.success(), "softrdma {cmd}: {}\nstderr: {}", done.status, done.stderr);
    assert!(done.stderr.is_empty(), "softrdma {cmd} printed on stderr: {}", done.stderr);
    serde_json::from_str(&done.stdout).unwrap_or_else(|e| panic!("softrdma {cmd}: not JSON ({e}):\n{}", done.stdout))
}

/// A TCP port of 127.0.0.1 that nobody listened on a moment ago.
fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
    l.local_addr().expect("local_addr").port()
}

/// Tests that open devices run one at a time: each checks figures and counters (messages
/// received, packets sent and resent) that runs beside it would disturb. That processes
/// coming and going lose nobody's datagrams is the `*_while_other_processes_come_and_go`
/// tests' to show.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------
// The schema and what the figures must say.

fn schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        serde_json::from_str(include_str!("../perf-report.schema.json")).expect("perf-report.schema.json is JSON")
    })
}

/// Validates `v` against the schema (`def`: one of its `$defs` instead of the root).
fn validate(v: &Value, def: Option<&str>, what: &str) {
    let root = schema();
    let target = match def {
        None => root.clone(),
        Some(name) => {
            assert!(root["$defs"].get(name).is_some(), "the schema has no $defs/{name}");
            serde_json::json!({
                "$schema": root["$schema"],
                "$defs": root["$defs"],
                "$ref": format!("#/$defs/{name}"),
            })
        }
    };
    let validator = jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&target)
        .unwrap_or_else(|e| panic!("perf-report.schema.json is not a valid schema: {e}"));
    let errors: Vec<String> = validator.iter_errors(v).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{what}: the output breaks the schema:\n{}\n{v:#}", errors.join("\n"));
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} is not an unsigned integer in {v}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

fn check_lat_stats(l: &Value, what: &str) {
    let [min, median, avg, p99, p99_9, max] = ["min", "median", "avg", "p99", "p99_9", "max"].map(|k| f(l, k));
    assert!(min > 0.0, "{what}: a latency of {min} us");
    assert!(
        min <= median && median <= p99 && p99 <= p99_9 && p99_9 <= max,
        "{what}: min {min} <= median {median} <= p99 {p99} <= p99.9 {p99_9} <= max {max} does not hold"
    );
    assert!(min <= avg && avg <= max, "{what}: the average {avg} is outside [{min}, {max}]");
    assert!(f(l, "stddev") <= max - min, "{what}: stddev {} wider than the range", f(l, "stddev"));
}

/// Validates a report and checks that its figures make sense for the test it says it ran.
/// Returns it.
fn check_report(r: Value, cmd: &str) -> Value {
    validate(&r, None, cmd);
    let spec = &r["spec"];
    let sizes: Vec<u64> =
        spec["sizes"].as_array().expect("sizes").iter().map(|s| s.as_u64().expect("a size")).collect();
    let results = r["results"].as_array().expect("results");
    assert_eq!(results.len(), sizes.len(), "{cmd}: one result per size");
    let timed = spec["duration_ms"].as_u64();
    let iters = u(spec, "iters");
    let qps = u(spec, "qps");
    let bidirectional = spec["bidirectional"].as_bool().expect("bidirectional");
    let op = spec["op"].as_str().expect("op");
    let conn = spec["conn"].as_str().expect("conn");
    assert_eq!(r["local"]["qps"].as_array().expect("qps").len() as u64, qps, "{cmd}: local QPs");
    assert_eq!(r["remote"]["qps"].as_array().expect("qps").len() as u64, qps, "{cmd}: remote QPs");
    for (res, &size) in results.iter().zip(&sizes) {
        let what = format!("{cmd}, {size} B");
        assert_eq!(u(res, "bytes"), size, "{what}: results in the order of the sizes");
        let (client, server) = (&res["client"], &res["server"]);
        let n = u(res, "iterations");
        // The retransmission counts are there (the schema requires them) and are counts.
        let _ = (u(client, "retransmitted"), u(server, "retransmitted"));
        assert!(u(client, "packets_sent") > 0, "{what}: the client sent no packets");
        match timed {
            // -D: as many as fit in the time, and the time is spent.
            Some(ms) => {
                assert!(n > 0, "{what}: no operations in {ms} ms");
                assert!(f(res, "seconds") >= ms as f64 / 1e3 * 0.95, "{what}: ran {} s of {ms} ms", f(res, "seconds"));
            }
            None if conn != "RC" && res.get("latency_us").is_some() => {
                // A UC or UD ping-pong counts the pings that got no answer lost, not timed.
                let lost = u(client, "lost");
                assert!(n <= iters && n + lost >= iters, "{what}: {n} timed and {lost} lost of -n {iters}");
            }
            None => {
                let per_side = iters * qps;
                let want = if bidirectional { 2 * per_side } else { per_side };
                assert_eq!(n, want, "{what}: iterations (-n {iters}, {qps} QPs, bidirectional {bidirectional})");
            }
        }
        if conn == "RC" {
            assert_eq!((u(client, "lost"), u(server, "lost")), (0, 0), "{what}: RC loses nothing");
        }
        if let Some(l) = res.get("latency_us") {
            check_lat_stats(l, &what);
            assert_eq!(u(client, "ops"), n, "{what}: the client's operations are the samples");
            if matches!(op, "send" | "write") && conn != "UD" {
                // A ping-pong: the server answered every ping, the warm-up's too.
                assert!(u(server, "received") >= n, "{what}: the server took {} pings", u(server, "received"));
                assert_eq!(u(server, "ops"), u(server, "received"), "{what}: one pong per ping");
            }
        } else {
            let (peak, avg) = (f(res, "bw_peak_mb_per_sec"), f(res, "bw_avg_mb_per_sec"));
            let rate = f(res, "msg_rate_mpps");
            assert!(avg > 0.0 && rate > 0.0 && f(res, "seconds") > 0.0, "{what}: no bandwidth: {res}");
            assert!(peak >= avg * (1.0 - 1e-9), "{what}: peak {peak} below the average {avg}");
            assert!(close(f(res, "bw_avg_gbit_per_sec"), avg * 8.0 / 1e3), "{what}: Gb/s and MB/s disagree");
            assert!(close(f(res, "bw_peak_gbit_per_sec"), peak * 8.0 / 1e3), "{what}: Gb/s and MB/s disagree");
            assert!(close(rate * size as f64, avg), "{what}: {rate} Mpps of {size} B is not {avg} MB/s");
            let ops = u(client, "ops") + if bidirectional { u(server, "ops") } else { 0 };
            assert_eq!(n, ops, "{what}: iterations are the operations completed");
            if op == "send" {
                let received = u(res, "received");
                if conn == "RC" {
                    assert_eq!(received, n, "{what}: RC delivers every SEND");
                } else {
                    // UC and UD may lose messages: none may be invented. (That they arrive
                    // while others come and go is `ud_sends_arrive_while_other_processes_come_and_go`'s.)
                    assert!(received <= n, "{what}: {received} of {n} SENDs received");
                }
            }
        }
    }
    r
}

/// `softrdma perf ARGS --json`, validated and checked.
fn perf(args: &[&str]) -> Value {
    let mut all = vec!["perf"];
    all.extend_from_slice(args);
    all.push("--json");
    let cmd = all.join(" ");
    check_report(perf_json(&all), &cmd)
}

fn spec_of<'a>(r: &'a Value, key: &str) -> &'a Value {
    &r["spec"][key]
}

// ---------------------------------------------------------------------------------------
// Every mode over --loopback.

#[test]
fn bw_of_every_operation_over_loopback() {
    let _serial = serial();
    for op in ["send", "write", "read", "atomic"] {
        let r = perf(&[op, "bw", "--loopback", "-n", "200"]);
        assert_eq!(r["test"], format!("{op} bw"));
        assert_eq!(spec_of(&r, "iters"), 200);
        assert_eq!(spec_of(&r, "conn"), "RC");
        let want_size = if op == "atomic" { 8 } else { 65536 };
        assert_eq!(r["results"][0]["bytes"], want_size, "{op}: the default size");
    }
}

#[test]
fn lat_of_every_operation_over_loopback() {
    let _serial = serial();
    for op in ["send", "write", "read", "atomic"] {
        let r = perf(&[op, "lat", "--loopback", "-n", "100"]);
        assert_eq!(r["test"], format!("{op} lat"));
        let way = if matches!(op, "send" | "write") { "one way" } else { "the round trip" };
        let is = r["latency_is"].as_str().expect("latency_is");
        assert!(is.starts_with(way), "{op}: latency is {is:?}");
        assert_eq!(r["results"][0]["iterations"], 100);
    }
}

#[test]
fn uc_and_ud_transports() {
    let _serial = serial();
    for (op, conn, extra) in [("send", "UC", None), ("write", "UC", None), ("send", "UD", Some("1024"))] {
        let mut args = vec![op, "bw", "--loopback", "-n", "100", "--connection", conn];
        if let Some(size) = extra {
            args.extend(["-s", size]);
        }
        let r = perf(&args);
        assert_eq!(spec_of(&r, "conn").as_str().map(str::to_uppercase).as_deref(), Some(conn));
    }
    // A UD message must fit one packet: -a stops at the path MTU.
    let r = perf(&["send", "bw", "--loopback", "-n", "20", "-c", "UD", "-a", "--mtu", "1024"]);
    let sizes: Vec<u64> = r["results"].as_array().expect("results").iter().map(|x| u(x, "bytes")).collect();
    assert_eq!(sizes, (1..=10).map(|i| 1u64 << i).collect::<Vec<_>>());
}

/// A UC or UD ping-pong survives a lost datagram: a ping without an answer counts as lost
/// and the run goes on (it once waited for its 30 s deadline). Losses happen on loopback
/// when other processes join or leave 127.0.0.1:4791 (see
/// `ud_sends_arrive_while_other_processes_come_and_go`): other perf runs come and go in a
/// thread meanwhile.
#[test]
fn unreliable_pingpong_survives_a_lost_datagram() {
    let _serial = serial();
    with_churn(1, || {
        for _ in 0..4 {
            for conn in ["UD", "UC"] {
                let args = ["perf", "send", "lat", "--loopback", "-n", "100", "-c", conn, "--json"];
                let done = softrdma(&args, Duration::from_secs(10));
                assert!(done.status.success(), "send lat -c {conn}: {}", done.stderr);
                let r = serde_json::from_str(&done.stdout).expect("JSON");
                check_report(r, &args.join(" "));
            }
        }
    });
}

/// `SOFTRDMA_FAULTS` reaches an unmodified run, both of its processes: under 5 % loss and
/// reordering on everything each receives, WRITE, READ and SEND finish, with the
/// retransmissions the losses cost in the report.
#[test]
fn perf_runs_finish_under_injected_loss_and_reordering() {
    let _serial = serial();
    let spec = "loss 5%; reorder 5% 500us";
    for op in ["write", "read", "send"] {
        let args = ["perf", op, "bw", "--loopback", "-n", "300", "-s", "16384", "--json"];
        let done = Proc::spawn_with_env(&args, &[("SOFTRDMA_FAULTS", spec)]).finish(RUN_LIMIT);
        let cmd = args.join(" ");
        assert!(done.status.success(), "{cmd} under {spec:?}: {}\nstderr: {}", done.status, done.stderr);
        let announced = done.stderr.lines().filter(|l| l.contains("injecting faults") && l.contains(spec)).count();
        assert_eq!(announced, 2, "each process names its faults and seed: {}", done.stderr);
        let r = check_report(serde_json::from_str(&done.stdout).expect("JSON"), &cmd);
        let retransmitted: u64 = r["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|x| u(&x["client"], "retransmitted") + u(&x["server"], "retransmitted"))
            .sum();
        assert!(retransmitted > 0, "{cmd}: 5 % of ~1500 packets lost, none resent: {}", done.stdout);
    }
}

/// Runs short `perf write bw --loopback` tests over and over in `threads` threads until
/// `f` returns: other processes joining and leaving 127.0.0.1:4791.
fn with_churn<T>(threads: usize, f: impl FnOnce() -> T + std::panic::UnwindSafe) -> T {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = (0..threads)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                for _ in 0..300 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let _ = Proc::spawn(&["perf", "write", "bw", "--loopback", "-n", "20"]).finish(RUN_LIMIT);
                }
            })
        })
        .collect();
    let result = std::panic::catch_unwind(f);
    stop.store(true, Ordering::Relaxed);
    for t in churn {
        let _ = t.join();
    }
    result.unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// 20 UD SENDs per size over loopback, into 512 posted receives, all arrive (the kernel
/// drops none: its UDP RcvbufErrors do not move) even while other processes join and leave
/// the device: the members' steering must not lose them.
#[test]
fn ud_sends_arrive_while_other_processes_come_and_go() {
    let _serial = serial();
    with_churn(1, || {
        for _ in 0..6 {
            let r = perf(&["send", "bw", "--loopback", "-n", "20", "-c", "UD", "-a", "--mtu", "1024"]);
            let received: Vec<u64> =
                r["results"].as_array().expect("results").iter().map(|x| u(x, "received")).collect();
            assert!(received.iter().all(|&n| n > 0), "SENDs received per size (of 20): {received:?}");
        }
    });
}

/// An RC run survives other processes joining and leaving the device: its packets may be
/// lost for a moment, and retransmission must outlast that.
#[test]
fn rc_survives_other_processes_coming_and_going() {
    let _serial = serial();
    with_churn(2, || {
        for _ in 0..30 {
            perf(&["write", "bw", "--loopback", "-n", "200"]);
        }
    });
}

/// `-e`: both sides take their completions' events from a completion channel, and without
/// it neither does. The events are what `-e` guarantees: whether taking one waited (the
/// device's `channel_waits_*`) depends on whether the device had delivered it already, which
/// its progress thread often has for a bandwidth client (CI: a WRITE bw client that took its
/// events without a single wait).
#[test]
fn events_wait_on_the_completion_channel() {
    let _serial = serial();
    let waits = |side: &Value| u(side, "channel_waits_polled") + u(side, "channel_waits_slept");
    for (op, mode) in [("write", "lat"), ("send", "lat"), ("send", "bw"), ("write", "bw")] {
        let r = perf(&[op, mode, "--loopback", "-n", "200", "-s", "64", "-e"]);
        assert_eq!(spec_of(&r, "events"), true);
        let res = &r["results"][0];
        assert_eq!(u(res, "iterations"), 200, "{op} {mode} -e: every operation completed");
        assert!(u(&res["client"], "channel_events") > 0, "{op} {mode} -e: the client took no event: {res}");
        if op == "send" || mode == "lat" {
            // The server takes receives' events (a WRITE bw server has no completion).
            assert!(u(&res["server"], "channel_events") > 0, "{op} {mode} -e: the server took no event: {res}");
        }
    }
    let r = perf(&["write", "lat", "--loopback", "-n", "100"]);
    assert_eq!(spec_of(&r, "events"), false);
    let res = &r["results"][0];
    for side in [&res["client"], &res["server"]] {
        assert_eq!(waits(side) + u(side, "channel_events"), 0, "polled: {res}");
    }
}

#[test]
fn two_qps_and_bidirectional() {
    let _serial = serial();
    for op in ["write", "send"] {
        let r = perf(&[op, "bw", "--loopback", "-n", "100", "-q", "2"]);
        assert_eq!(spec_of(&r, "qps"), 2);
        assert_eq!(r["results"][0]["client"]["ops"], 200, "{op} -q 2: -n operations on each QP");
        let r = perf(&[op, "bw", "--loopback", "-n", "100", "--bidirectional"]);
        assert_eq!(spec_of(&r, "bidirectional"), true);
        let res = &r["results"][0];
        assert_eq!((u(&res["client"], "ops"), u(&res["server"], "ops")), (100, 100), "{op}: both sides sent");
    }
}

#[test]
fn all_sizes_give_one_result_each() {
    let _serial = serial();
    let r = perf(&["write", "bw", "--loopback", "-a", "-n", "20"]);
    let sizes: Vec<u64> = r["results"].as_array().expect("results").iter().map(|x| u(x, "bytes")).collect();
    assert_eq!(sizes, (1..=23).map(|i| 1u64 << i).collect::<Vec<_>>(), "2 B to 8 MiB, doubling");
}

#[test]
fn duration_mode_runs_for_the_time() {
    let _serial = serial();
    for (op, mode) in [("write", "bw"), ("send", "lat")] {
        let started = Instant::now();
        let r = perf(&[op, mode, "--loopback", "-D", "0.2"]);
        assert_eq!(spec_of(&r, "duration_ms"), 200);
        assert!(started.elapsed() >= Duration::from_millis(200), "{op} {mode}: finished before -D 0.2");
    }
}

#[test]
fn inline_and_mtu() {
    let _serial = serial();
    let r = perf(&["send", "bw", "--loopback", "-n", "100", "--inline", "64", "-s", "64"]);
    assert_eq!(spec_of(&r, "inline"), 64);
    let r = perf(&["write", "lat", "--loopback", "-n", "50", "--inline", "0"]);
    assert_eq!(spec_of(&r, "inline"), 0);
    // A 4096-byte WRITE is 4 packets at MTU 1024.
    let r = perf(&["write", "bw", "--loopback", "-n", "50", "-s", "4096", "--mtu", "1024"]);
    assert_eq!(spec_of(&r, "mtu"), 1024);
    let sent = u(&r["results"][0]["client"], "packets_sent");
    assert!(sent >= 4 * 50, "MTU 1024: {sent} packets for 50 WRITEs of 4096 B");
}

#[test]
fn rdma_cm_connects_the_qps() {
    let _serial = serial();
    for args in [
        &["write", "bw", "-n", "100"][..],
        &["send", "lat", "-n", "100"],
        &["read", "bw", "-n", "50", "-q", "2"],
        &["send", "bw", "-n", "100", "-c", "UD"],
    ] {
        let mut all = args.to_vec();
        all.extend(["--loopback", "--rdma-cm"]);
        let r = perf(&all);
        assert_eq!(spec_of(&r, "rdma_cm"), true, "{all:?}");
    }
}

#[test]
fn authenticate_connects_the_qps_in_authenticated_mode() {
    let _serial = serial();
    let r = perf(&["write", "bw", "-n", "100", "--loopback", "--rdma-cm", "--authenticate"]);
    assert_eq!(spec_of(&r, "authenticate"), true);
    let done = softrdma(&["perf", "write", "bw", "--loopback", "--authenticate"], RUN_LIMIT);
    assert_eq!(done.status.code(), Some(2), "--authenticate without --rdma-cm is a usage error");
    assert!(done.stderr.contains("--rdma-cm"), "{}", done.stderr);
}

/// The ratios' like-for-like limit and target follow the path the packets took.
#[test]
fn vs_baseline_adds_the_limits_and_ratios() {
    let _serial = serial();
    let r = perf(&["write", "bw", "--loopback", "-n", "100", "--vs-baseline"]);
    let ratios = r["vs_baseline"].as_array().expect("vs_baseline").clone();
    assert!(ratios.iter().any(|x| x["baseline"] == "UDP GSO+GRO goodput"), "{ratios:?}");
    let send = perf(&["send", "bw", "--loopback", "-n", "200", "-s", "64", "--vs-baseline"]);
    let send_ratios = send["vs_baseline"].as_array().expect("vs_baseline").clone();
    let wire = perf(&["write", "bw", "--loopback", "-n", "100", "--vs-baseline", "--wire"]);
    let wire_ratios = wire["vs_baseline"].as_array().expect("vs_baseline").clone();
    let wire_send = perf(&["send", "bw", "--loopback", "-n", "200", "-s", "64", "--vs-baseline", "--wire"]);
    let wire_send_ratios = wire_send["vs_baseline"].as_array().expect("vs_baseline").clone();
    for x in ratios.iter().chain(&send_ratios).chain(&wire_ratios).chain(&wire_send_ratios) {
        let ratio = f(x, "ratio");
        assert!(close(ratio, f(x, "value") / f(x, "baseline_value")), "{x}: ratio is value / baseline");
        if let Some(target) = x["target"].as_str() {
            let (cmp, bound) = target.split_once(' ').expect("`<= x` or `>= x`");
            let bound: f64 = bound.parse().expect("a number");
            let met = if cmp == "<=" { ratio <= bound } else { ratio >= bound };
            assert_eq!(x["met"], met, "{x}: met says otherwise");
            assert_eq!(x["like_for_like"], true, "{x}: only a like-for-like limit has a target");
        }
    }
    // Which limit is like for like (and has the target).
    let like = |rs: &[Value], figure: &str| -> Vec<String> {
        rs.iter()
            .filter(|x| x["like_for_like"] == true && x["figure"].as_str().is_some_and(|f| f.contains(figure)))
            .map(|x| format!("{} {}", x["baseline"].as_str().unwrap_or(""), x["target"].as_str().unwrap_or("-")))
            .collect()
    };
    // --wire: 64 KiB WRITE bandwidth against UDP GSO+GRO goodput (issue 6); the 2-copy
    // ring is for reference only.
    assert_eq!(wire["path"], "wire");
    assert_eq!(like(&wire_ratios, "bandwidth"), ["UDP GSO+GRO goodput >= 0.6"], "{wire_ratios:?}");
    assert_eq!(wire_send["path"], "wire");
    assert!(like(&wire_send_ratios, "message rate").is_empty(), "{wire_send_ratios:?}");
    // The same-host path: against process_vm_writev (where this machine allows it) and the
    // 2-copy shared-memory ring, with their targets.
    if r["path"] == "same-host" && r["baseline"]["process_vm_writev_gbytes_per_sec"].is_number() {
        assert_eq!(like(&ratios, "bandwidth"), ["process_vm_writev >= 0.6"], "{ratios:?}");
    }
    if send["path"] == "same-host" {
        assert_eq!(like(&send_ratios, "message rate"), ["2-copy shared-memory ring (64 B) >= 0.5"], "{send_ratios:?}");
    }
    validate(&r["baseline"], Some("baseline"), "the report's baseline");
}

/// A ping-pong between two processes of the host, whose answers carry the ACKs they owe
/// beside them (in the inbox entry, not as datagrams of their own): its path is the
/// same-host path, and each such ACK counts as a packet sent, there as on the wire.
#[test]
fn a_same_host_ping_pong_counts_the_acks_beside_its_answers_as_packets() {
    let _serial = serial();
    let n = 2000;
    for wire in [false, true] {
        let mut args = vec!["write", "lat", "--loopback", "-s", "8", "-n", "2000"];
        if wire {
            args.push("--wire");
        }
        let r = perf(&args);
        let res = &r["results"][0];
        assert_eq!(r["path"], if wire { "wire" } else { "same-host" }, "{res}");
        for side in ["client", "server"] {
            let packets = u(&res[side], "packets_sent");
            assert!(packets >= 2 * n, "{side}: a request and an ACK a round: {res}");
            assert_eq!(u(&res[side], "packets_same_host"), if wire { 0 } else { packets }, "{side}: {res}");
        }
    }
}

/// Loopback's two processes share a host and a device: their packets take the same-host
/// path, unless `--wire` keeps them on the sockets.
#[test]
fn path_is_same_host_unless_wire() {
    let _serial = serial();
    let r = perf(&["write", "bw", "--loopback", "-s", "64K", "-n", "200"]);
    let res = &r["results"][0];
    assert_eq!(r["path"], "same-host", "{res}");
    assert!(u(&res["client"], "packets_same_host") > 0, "{res}");
    assert_eq!(u(&res["client"], "packets_same_host"), u(&res["client"], "packets_sent"), "{res}");
    // 64 KiB WRITEs: once the server has said it copies from the client, their data goes
    // by reference, a packet per WRITE where by value it takes 16.
    let by_reference = u(&res["server"], "packets_by_reference");
    assert!(by_reference > 100, "{res}");
    assert!(u(&res["client"], "packets_sent") < 200 * 16 / 2, "{res}");
    assert_eq!(spec_of(&r, "wire"), false);
    let r = perf(&["write", "bw", "--loopback", "-s", "64K", "-n", "200", "--wire"]);
    let res = &r["results"][0];
    assert_eq!(r["path"], "wire", "{res}");
    assert_eq!(spec_of(&r, "wire"), true);
    for side in ["client", "server"] {
        assert_eq!(u(&res[side], "packets_same_host"), 0, "{side}: {res}");
        assert_eq!(u(&res[side], "packets_by_reference"), 0, "{side}: {res}");
        assert!(u(&res[side], "packets_sent") > 0, "{side}: {res}");
    }
    // The table says it too.
    let done = softrdma(&["perf", "write", "bw", "--loopback", "-s", "64K", "-n", "200", "--wire"], RUN_LIMIT);
    assert!(done.status.success(), "{}\n{}", done.status, done.stderr);
    let banner = done.stdout.lines().find(|l| l.starts_with(" Connection:")).unwrap_or_default();
    assert!(banner.ends_with("   Path: wire"), "{}", done.stdout);
}

/// The server's counters must cover the whole run: on RC, without retransmissions, every
/// packet the client sent reached the server once. (The server once took its counters
/// after sending Ready, and a run lost this race now and then, READ most often: 15 runs
/// caught it every time.)
#[test]
fn server_stats_cover_the_whole_run() {
    let _serial = serial();
    let (mut short, mut checked) = (Vec::new(), 0);
    for _ in 0..5 {
        for op in ["read", "write", "send"] {
            let r = perf(&[op, "bw", "--loopback", "-n", "100"]);
            let res = &r["results"][0];
            let (c, s) = (&res["client"], &res["server"]);
            if u(c, "retransmitted") > 0 {
                continue; // see retransmitted_counts_packets
            }
            checked += 1;
            if u(s, "packets_received") < u(c, "packets_sent") {
                short.push(format!(
                    "{op} bw: the client sent {} packets, the server counted {} received",
                    u(c, "packets_sent"),
                    u(s, "packets_received")
                ));
            }
        }
    }
    assert!(checked > 0, "every run retransmitted");
    assert!(short.is_empty(), "{} of {checked} runs:\n{}", short.len(), short.join("\n"));
}

/// `retransmitted` counts the packets resent (so the server received at least the client's
/// packets less its retransmissions), not the times a requester went back. Packets are lost
/// on loopback when other processes join or leave 127.0.0.1:4791: they come and go in a
/// thread meanwhile.
#[test]
fn retransmitted_counts_packets() {
    let _serial = serial();
    with_churn(1, || {
        let mut wrong = Vec::new();
        for _ in 0..10 {
            for op in ["write", "send"] {
                let done = softrdma(&["perf", op, "bw", "--loopback", "-n", "200", "--json"], RUN_LIMIT);
                if !done.status.success() {
                    continue; // see rc_survives_other_processes_coming_and_going
                }
                let r: Value = serde_json::from_str(&done.stdout).expect("JSON");
                let res = &r["results"][0];
                let (c, s) = (&res["client"], &res["server"]);
                if u(s, "packets_received") + u(c, "retransmitted") < u(c, "packets_sent") {
                    wrong.push(format!(
                        "{op} bw: the client sent {} packets, {} of them resent, and the server received {}",
                        u(c, "packets_sent"),
                        u(c, "retransmitted"),
                        u(s, "packets_received")
                    ));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    });
}

// ---------------------------------------------------------------------------------------
// A server and a client as two commands.

/// `--rounds N`: the test and its limits N times in turn; each ratio is the median of the
/// rounds' and lists them, against a loopback server and against a server of its own
/// (which serves one connection per round).
#[test]
fn rounds_give_each_ratio_as_the_median_of_its_rounds() {
    let _serial = serial();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 }
    };
    let check = |r: &Value, n: usize| {
        let ratios = r["vs_baseline"].as_array().expect("vs_baseline");
        assert!(!ratios.is_empty());
        for x in ratios {
            let rounds = x["rounds"].as_array().unwrap_or_else(|| panic!("{x}: no rounds"));
            assert_eq!(rounds.len(), n, "{x}: one entry per round");
            for round in rounds {
                assert!(close(f(round, "ratio"), f(round, "value") / f(round, "baseline_value")), "{round}");
            }
            for key in ["value", "baseline_value", "ratio"] {
                let each = rounds.iter().map(|round| f(round, key)).collect();
                assert!(close(f(x, key), median(each)), "{x}: {key} is the rounds' median");
            }
            if let Some(target) = x["target"].as_str() {
                let (cmp, bound) = target.split_once(' ').expect("`<= x` or `>= x`");
                let bound: f64 = bound.parse().expect("a number");
                let met = if cmp == "<=" { f(x, "ratio") <= bound } else { f(x, "ratio") >= bound };
                assert_eq!(x["met"], met, "{x}: met is the median ratio's");
            }
        }
    };
    check(&perf(&["write", "lat", "--loopback", "-n", "300", "-s", "8", "--vs-baseline", "--rounds", "3"]), 3);
    let port = free_port().to_string();
    let mut server = Proc::spawn(&["perf", "write", "bw", "-p", &port]);
    server.wait_for_stdout("waiting for a client", QUICK);
    let args = ["perf", "write", "bw", "127.0.0.1", "-p", &port, "-n", "100", "--vs-baseline", "--rounds", "2"];
    let client = softrdma(&args, RUN_LIMIT);
    let served = server.finish(RUN_LIMIT);
    assert!(client.status.success(), "client: {}\n{}", client.status, client.stderr);
    assert!(served.status.success(), "the server served both rounds: {}\n{}", served.status, served.stderr);
    assert!(client.stdout.contains("2 rounds of the test and its limits in turn"), "{}", client.stdout);
    let bracketed = client.stdout.lines().filter(|l| l.contains(" x ") && l.trim_end().ends_with(']')).count();
    assert!(bracketed > 0, "each ratio's rounds in brackets: {}", client.stdout);
    let usage = softrdma(&["perf", "write", "lat", "--loopback", "--rounds", "2"], QUICK);
    assert_eq!(usage.status.code(), Some(2), "--rounds without --vs-baseline: {}", usage.stderr);
}

#[test]
fn separate_server_and_client() {
    let _serial = serial();
    let port = free_port().to_string();
    let mut server = Proc::spawn(&["perf", "write", "bw", "-p", &port]);
    server.wait_for_stdout("waiting for a client", QUICK);
    let client = softrdma(&["perf", "write", "bw", "127.0.0.1", "-p", &port, "-n", "200", "-s", "4096"], RUN_LIMIT);
    let served = server.finish(RUN_LIMIT);
    assert!(client.status.success(), "client: {}\n{}", client.status, client.stderr);
    assert!(served.status.success(), "server: {}\n{}", served.status, served.stderr);
    // The client's perftest-like table: a row for 4096 B with 200 iterations and bandwidth.
    let row: Vec<&str> = client
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("4096"))
        .unwrap_or_else(|| panic!("no row for 4096 B:\n{}", client.stdout))
        .split_whitespace()
        .collect();
    assert_eq!(row.len(), 7, "bytes, iterations, peak and average in MB/s and Gb/s, Mpps: {row:?}");
    assert_eq!(row[1], "200");
    for cell in &row[2..] {
        assert!(cell.parse::<f64>().expect("a number") > 0.0, "{row:?}");
    }
    assert!(client.stdout.contains("#bytes") && client.stdout.contains("retransmitted"), "{}", client.stdout);
    assert!(served.stdout.contains("write bw: served RC"), "the server's summary: {}", served.stdout);
}

#[test]
fn qps_sweep_runs_each_count_against_one_server() {
    let _serial = serial();
    // --loopback: one line of JSON per count, each a whole report; --sizes in their order.
    let cmd = "perf write bw --loopback --qps-sweep 1,2,4 --sizes 8K,4K -n 100 --json";
    let done = softrdma(&cmd.split(' ').collect::<Vec<_>>(), RUN_LIMIT);
    assert!(done.status.success(), "{cmd}: {}\n{}", done.status, done.stderr);
    let lines: Vec<&str> = done.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "one report per QP count:\n{}", done.stdout);
    for (k, (line, qps)) in lines.iter().zip([1u64, 2, 4]).enumerate() {
        let r = check_report(serde_json::from_str(line).expect("JSON"), cmd);
        assert_eq!(u(&r["spec"], "qps"), qps);
        assert_eq!(r["spec"]["sizes"], serde_json::json!([8192, 4096]));
        assert_eq!(r["spec"]["more"], k < 2, "every test but the last says another follows");
    }
    // Against a separate server, which serves one connection per count and then exits;
    // the table has a row per count and size.
    let port = free_port().to_string();
    let mut server = Proc::spawn(&["perf", "write", "bw", "-p", &port]);
    server.wait_for_stdout("waiting for a client", QUICK);
    let args = ["perf", "write", "bw", "127.0.0.1", "-p", &port, "-n", "100", "-s", "4096", "--qps-sweep", "1,3"];
    let client = softrdma(&args, RUN_LIMIT);
    let served = server.finish(RUN_LIMIT);
    assert!(client.status.success(), "client: {}\n{}", client.status, client.stderr);
    assert!(served.status.success(), "server: {}\n{}", served.status, served.stderr);
    let rows: Vec<Vec<&str>> = client
        .stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|c| c.len() == 6 && c[1] == "4096")
        .collect();
    assert_eq!(rows.iter().map(|c| c[0]).collect::<Vec<_>>(), ["1", "3"], "a row per count:\n{}", client.stdout);
    for c in &rows {
        assert!(c[2].parse::<f64>().expect("MB/s") > 0.0 && c[4].parse::<f64>().expect("Mpps") > 0.0, "{c:?}");
    }
    assert_eq!(served.stdout.matches("write bw: served RC").count(), 2, "the server served both: {}", served.stdout);
}

#[test]
fn plot_qps_sweep_draws_a_curve_per_size() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sweep.svg");
    let p = path.to_str().expect("utf-8");
    let args =
        ["perf", "write", "bw", "--loopback", "--qps-sweep", "1,2,4", "--sizes", "4K,16K", "-n", "50", "--plot", p];
    let done = softrdma(&args, RUN_LIMIT);
    assert!(done.status.success(), "{}\n{}", done.status, done.stderr);
    let source = svg(&path);
    let doc = roxmltree::Document::parse(&source).expect("XML");
    let labels = texts(&doc);
    for want in ["queue pairs", "average bandwidth (Gb/s)", "4096 B", "16384 B"] {
        assert!(labels.iter().any(|t| t == want), "no text {want:?} in {labels:?}");
    }
    let curves = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
        .map(|n| n.attribute("points").unwrap_or("").split_whitespace().count())
        .collect::<Vec<_>>();
    assert_eq!(curves, vec![3, 3], "a curve per size, a point per QP count");
}

#[test]
fn server_refuses_a_client_of_another_test() {
    let _serial = serial();
    let port = free_port().to_string();
    let mut server = Proc::spawn(&["perf", "write", "bw", "-p", &port]);
    server.wait_for_stdout("waiting for a client", QUICK);
    let client = softrdma(&["perf", "read", "bw", "127.0.0.1", "-p", &port, "-n", "10"], RUN_LIMIT);
    let served = server.finish(RUN_LIMIT);
    for (side, done) in [("client", &client), ("server", &served)] {
        assert!(!done.status.success(), "the {side} ran a test the other did not");
        assert_eq!(done.stderr.lines().count(), 1, "the {side}: one line: {}", done.stderr);
        assert!(done.stderr.contains("`read bw`") && done.stderr.contains("`write bw`"), "{side}: {}", done.stderr);
    }
    assert_eq!(served.status.code(), Some(2), "the server's user started the wrong test");
    assert!(client.stderr.contains("refused"), "{}", client.stderr);
}

#[test]
fn server_whose_client_leaves_exits() {
    let _serial = serial();
    let port = free_port();
    let mut server = Proc::spawn(&["perf", "send", "bw", "-p", &port.to_string()]);
    server.wait_for_stdout("waiting for a client", QUICK);
    // A client that connects and goes away without a word.
    drop(TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect to the server"));
    let done = server.finish(QUICK);
    assert_eq!(done.status.code(), Some(1), "stderr: {}", done.stderr);
    assert_eq!(done.stderr.lines().count(), 1, "one line: {}", done.stderr);
    assert!(!done.stderr.contains("panicked"), "{}", done.stderr);
}

// ---------------------------------------------------------------------------------------
// What the user gets wrong.

#[test]
fn bad_options_are_one_line_and_exit_2() {
    let cases: &[&[&str]] = &[
        &["write", "bw", "--bogus"],
        &["write", "bw", "-s", "0"],
        &["write", "bw", "-s", "9M"],
        &["write", "bw", "-s", "12q"],
        &["write", "bw", "--mtu", "1500"],
        &["write", "bw", "--loopback", "--plot", "/nonexistent-softrdma-dir/plot.svg"],
        &["atomic", "bw", "-s", "16"],
        &["atomic", "lat", "-a"],
        &["read", "bw", "-c", "UD"],
        &["write", "lat", "-c", "UD"],
        &["read", "bw", "-c", "UC"],
        &["send", "bw", "-c", "UD", "-s", "8192"],
        &["write", "lat", "-q", "2"],
        &["write", "lat", "--bidirectional"],
        &["write", "bw", "-n", "0"],
        &["write", "bw", "-D", "0"],
        &["write", "bw", "-D", "1", "-n", "5"],
        &["write", "bw", "-a", "-s", "64"],
        &["write", "bw", "-q", "0"],
        &["write", "bw", "127.0.0.1", "--loopback"],
        &["write", "bw", "--rdma-cm", "--mtu", "1024"],
        &["write", "lat", "--qps-sweep", "1,2"],
        &["write", "bw", "--qps-sweep", "0,2"],
        &["write", "bw", "--qps-sweep", "2", "-q", "2"],
        &["write", "bw", "--sizes", "4K", "-s", "64"],
        &["write", "bw", "--sizes", "64,0"],
        &["write", "sideways"],
        &["write"],
        &["teleport", "bw"],
        &["baseline", "-n", "5"],
        &["baseline", "-D", "0"],
    ];
    for args in cases {
        let mut all = vec!["perf"];
        all.extend_from_slice(args);
        let cmd = all.join(" ");
        let done = softrdma(&all, QUICK);
        assert_eq!(done.status.code(), Some(2), "softrdma {cmd}: {}\nstderr: {}", done.status, done.stderr);
        assert_eq!(done.stderr.lines().count(), 1, "softrdma {cmd}: one line on stderr, got:\n{}", done.stderr);
        assert!(done.stderr.starts_with("softrdma"), "softrdma {cmd}: {}", done.stderr);
        assert!(!done.stderr.contains("panicked"), "softrdma {cmd}: {}", done.stderr);
        assert!(done.stdout.is_empty(), "softrdma {cmd}: printed {}", done.stdout);
    }
}

/// A usage error names the help to read (`see \`softrdma perf write --help\``), as an
/// unknown flag's does.
#[test]
fn a_bad_value_names_the_subcommands_help() {
    for args in [&["perf", "write", "bw", "--mtu", "1500"][..], &["perf", "write", "bw", "-n", "0"]] {
        let done = softrdma(args, QUICK);
        assert_eq!(done.status.code(), Some(2));
        assert!(done.stderr.contains("`softrdma perf write --help`"), "{}: {}", args.join(" "), done.stderr);
    }
}

#[test]
fn unreachable_server_is_one_line_and_exit_2() {
    // A port this test holds bound without listening: a connection to it is refused. A port
    // merely found free could meanwhile be another test's server, or the client's own source
    // port (a TCP self-connection), as happened in CI.
    let held = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a TCP socket");
    held.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into()).expect("bind a port");
    let port = held.local_addr().expect("local_addr").as_socket().expect("an IP address").port().to_string();
    for mode in ["bw", "lat"] {
        let done = softrdma(&["perf", "write", mode, "127.0.0.1", "-p", &port], QUICK);
        assert_eq!(done.status.code(), Some(2), "{}", done.stderr);
        assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
        assert!(done.stderr.contains("cannot reach") && done.stderr.contains(&port), "{}", done.stderr);
        assert!(done.elapsed < Duration::from_secs(3), "took {:?}", done.elapsed);
    }
}

// ---------------------------------------------------------------------------------------
// --plot.

/// Parses an SVG file, checks its root and size, and returns its text and the document's
/// source for further checks.
fn svg(path: &std::path::Path) -> String {
    let source = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = roxmltree::Document::parse(&source).unwrap_or_else(|e| panic!("{} is not XML: {e}", path.display()));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.tag_name().namespace(), Some("http://www.w3.org/2000/svg"));
    for dim in ["width", "height"] {
        let v: f64 = root.attribute(dim).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {dim}"));
        assert!(v > 0.0, "{dim} {v}");
    }
    source
}

fn texts<'a>(doc: &'a roxmltree::Document<'a>) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect()
}

#[test]
fn plot_bw_curve_over_sizes() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bw.svg");
    let r = perf(&["write", "bw", "--loopback", "-a", "-n", "5", "--plot", path.to_str().expect("utf-8")]);
    let sizes = r["results"].as_array().expect("results").len();
    let source = svg(&path);
    let doc = roxmltree::Document::parse(&source).expect("XML");
    let labels = texts(&doc);
    for want in ["message size (bytes)", "average bandwidth (Gb/s)", "softrdma perf write bw (RC, 1 QP)"] {
        assert!(labels.iter().any(|t| t == want), "no text {want:?} in {labels:?}");
    }
    // The curve: one line through a point per size (plotters draws it as a polyline).
    let curve = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
        .map(|n| n.attribute("points").unwrap_or("").split_whitespace().count())
        .collect::<Vec<_>>();
    assert_eq!(curve, vec![sizes], "one curve with a point per size");
    let dots = doc.descendants().filter(|n| n.has_tag_name("circle")).count();
    assert_eq!(dots, sizes, "a dot per size");
}

#[test]
fn plot_lat_histogram() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lat.svg");
    let r = perf(&["send", "lat", "--loopback", "-n", "300", "--plot", path.to_str().expect("utf-8")]);
    assert_eq!(r["results"][0]["iterations"], 300);
    let source = svg(&path);
    let doc = roxmltree::Document::parse(&source).expect("XML");
    let labels = texts(&doc);
    assert!(labels.iter().any(|t| t.starts_with("latency (us)")), "no latency axis in {labels:?}");
    assert!(labels.iter().any(|t| t == "operations"), "no count axis in {labels:?}");
    // The bars: filled rectangles other than the background, with some height.
    let bars: Vec<f64> = doc
        .descendants()
        .filter(|n| n.has_tag_name("rect") && n.attribute("fill") != Some("#FFFFFF"))
        .filter_map(|n| n.attribute("height").and_then(|h| h.parse().ok()))
        .collect();
    assert!(bars.len() >= 10, "{} bars", bars.len());
    assert!(bars.iter().sum::<f64>() > 0.0, "every bar is empty");
}

#[test]
fn plot_lat_over_sizes() {
    let _serial = serial();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("lat-sizes.svg");
    let r = perf(&["read", "lat", "--loopback", "-a", "-n", "5", "--plot", path.to_str().expect("utf-8")]);
    let sizes = r["results"].as_array().expect("results").len();
    let source = svg(&path);
    let doc = roxmltree::Document::parse(&source).expect("XML");
    let labels = texts(&doc);
    assert!(labels.iter().any(|t| t == "latency (us)"), "no latency axis in {labels:?}");
    let curves = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline") && n.attribute("stroke-width") == Some("2"))
        .map(|n| n.attribute("points").unwrap_or("").split_whitespace().count())
        .collect::<Vec<_>>();
    assert_eq!(curves, vec![sizes, sizes], "median and p99 curves, a point per size");
}

// ---------------------------------------------------------------------------------------
// perf baseline.

#[test]
fn baseline_json_is_positive() {
    let _serial = serial();
    let b = perf_json(&["perf", "baseline", "--json", "-n", "200", "-D", "0.05"]);
    validate(&b, Some("baseline"), "perf baseline --json");
    for key in ["udp_busy_one_way_us", "udp_blocking_one_way_us", "shm_pingpong_one_way_us"] {
        check_lat_stats(&b[key], key);
    }
    for key in ["udp_gso_gro_gbytes_per_sec", "memcpy_gbytes_per_sec", "shm_ring_64b_mmsgs_per_sec"] {
        assert!(f(&b, key) > 0.0, "{key}: {b}");
    }
    // Shared memory answers faster than any socket, and its peer left no file behind.
    assert!(f(&b["shm_pingpong_one_way_us"], "median") < f(&b["udp_busy_one_way_us"], "median"), "{b}");
    let left = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("softrdma-baseline-"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(left, 0, "a shared-memory baseline page left in /dev/shm");
    match b["process_vm_writev_gbytes_per_sec"].as_f64() {
        Some(v) => assert!(v > 0.0, "process_vm_writev {v}"),
        None => assert!(b["process_vm_writev_unavailable"].is_string(), "{b}"),
    }
    assert_eq!(b["chunk_bytes"], 65536);
}

#[test]
fn gso_goodput_to_a_sink_elsewhere() {
    let _serial = serial();
    // The sink stays for any number of senders (another host's or namespace's); each gets
    // what the sink received from it.
    let mut sink = Proc::spawn(&["perf", "baseline", "--gso-sink", "127.0.0.1"]);
    sink.wait_for_stdout("LISTENING", QUICK);
    let port = text(&sink.out).split_whitespace().nth(1).expect("a port").to_string();
    let to = format!("127.0.0.1:{port}");
    for _ in 0..2 {
        let b = perf_json(&["perf", "baseline", "--gso-to", &to, "-D", "0.2", "--json"]);
        assert!(f(&b, "udp_gso_gro_gbytes_per_sec") > 0.0, "{b}");
    }
    let text = softrdma(&["perf", "baseline", "--gso-to", &to, "-D", "0.1"], RUN_LIMIT);
    assert!(text.status.success() && text.stdout.starts_with("UDP GSO+GRO goodput to 127.0.0.1:"), "{}", text.stdout);
    // Nobody there: one line, exit 1 (a run that failed), within the answer's retries.
    let dead = softrdma(&["perf", "baseline", "--gso-to", "127.0.0.1:9", "-D", "0.05"], RUN_LIMIT);
    assert_eq!(dead.status.code(), Some(1), "{}", dead.stderr);
    assert!(dead.stderr.contains("never answered"), "{}", dead.stderr);
}

// ---------------------------------------------------------------------------------------
// The schema itself rejects what it must (so that a passing validation means something).

#[test]
fn the_schema_rejects_broken_reports() {
    let _serial = serial();
    let good = perf(&["write", "lat", "--loopback", "-n", "20"]);
    let reject = |mutate: &dyn Fn(&mut Value), what: &str| {
        let mut bad = good.clone();
        mutate(&mut bad);
        let validator =
            jsonschema::draft202012::options().should_validate_formats(true).build(schema()).expect("schema");
        assert!(!validator.is_valid(&bad), "the schema accepts a report with {what}");
    };
    reject(
        &|v| {
            v["results"][0]["client"].as_object_mut().expect("object").remove("retransmitted");
        },
        "no retransmitted count",
    );
    reject(&|v| v["results"][0]["latency_us"]["median"] = Value::Null, "a null median");
    reject(&|v| v["results"][0]["bw_avg_mb_per_sec"] = 1.0.into(), "bandwidth in a lat test");
    reject(&|v| v["results"] = Value::Array(vec![]), "no results");
    reject(&|v| v["spec"]["mtu"] = 1500.into(), "MTU 1500");
    reject(&|v| v["local"]["ip"] = "127.0.0.300".into(), "a bad address");
    reject(&|v| v["surprise"] = true.into(), "an unknown field");
    reject(&|v| v["test"] = "read lat".into(), "a test name that is not its spec's");
    reject(&|v| v["path"] = "shm".into(), "an unknown path");
    reject(
        &|v| {
            v.as_object_mut().expect("object").remove("path");
        },
        "no path",
    );
}

/// The children of process `pid` (`/proc/PID/task/*/children`).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// Whether process `pid` is gone (or a zombie that no longer runs).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X'])))
}

/// Waits up to 5 s for process `pid` to be gone.
fn wait_gone(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(pid) {
        assert!(Instant::now() < deadline, "{what} (PID {pid}) runs on");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_killed_client_leaves_no_server_running() {
    let _serial = serial();
    for delay in [150u64, 300, 500, 800] {
        // --loopback: its server is a child, which must end with it.
        let mut run = Proc::spawn(&["perf", "write", "lat", "--loopback", "-n", "100000000"]);
        let pid = run.child.id();
        let deadline = Instant::now() + QUICK;
        let server = loop {
            if let Some(&c) = children_of(pid).first() {
                break c;
            }
            if Instant::now() >= deadline {
                run.kill_and_fail("started no loopback server");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::sleep(Duration::from_millis(delay));
        let _ = run.child.kill();
        let _ = run.child.wait();
        wait_gone(server, &format!("the loopback server of a run killed after {delay} ms"));

        // A server of its own: its client's end closes the control connection mid-run.
        let port = free_port().to_string();
        let mut server = Proc::spawn(&["perf", "write", "lat", "-p", &port]);
        server.wait_for_stdout("waiting for a client", QUICK);
        let mut client = Proc::spawn(&["perf", "write", "lat", "127.0.0.1", "-p", &port, "-n", "100000000"]);
        std::thread::sleep(Duration::from_millis(delay));
        let _ = client.child.kill();
        let _ = client.child.wait();
        // It says why it stopped, within seconds of the client's end, not at its run's
        // deadline (hours for this many iterations).
        let done = server.finish(Duration::from_millis(delay + 500) + QUICK);
        assert!(!done.status.success() && done.stderr.contains("closed the control connection"), "{}", done.stderr);
    }
}
