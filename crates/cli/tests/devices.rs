//! `softrdma devices`, `devinfo` and `stats` end to end: the built binary against this
//! host's devices, and against counters published by contexts this test opens (its own
//! process, and a child process that it kills).

#![allow(clippy::print_stdout)]

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{open_lo, softrdma, stdout};
use softrdma::{Access, ConnectOptions, QpInit, QpType, SendFlags, SendOp, SendWr};

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout(out)).expect("one JSON object")
}

/// A UDP port for this test binary's contexts, away from 4791 and from other tests.
fn test_port(offset: u16) -> u16 {
    41000 + (std::process::id() % 4000) as u16 * 4 + offset
}

#[test]
fn devices_lists_softrdma_lo_with_its_guid() {
    let text = stdout(&softrdma(&["devices"]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["device", "node", "GUID"]);
    let lo = softrdma::device("lo").unwrap();
    let row = lines.iter().find(|l| l.trim_start().starts_with("softrdma_lo")).expect("softrdma_lo is listed");
    let fields: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(fields[1], format!("{:016x}", lo.node_guid()));
    assert_eq!(lines.len() - 2, softrdma::devices().unwrap().len(), "one line per device");

    let v = json(&softrdma(&["devices", "--json"]));
    let lo_json = v["devices"].as_array().unwrap().iter().find(|d| d["device"] == "softrdma_lo").unwrap();
    assert_eq!(lo_json["interface"], "lo");
    assert_eq!(lo_json["node_guid"], fields[1]);
}

#[test]
fn devinfo_verbose_shows_the_port_the_gids_and_the_engines_limits() {
    let text = stdout(&softrdma(&["devinfo", "-v", "-d", "softrdma_lo"]));
    assert!(text.starts_with("hca_id:\tsoftrdma_lo\n"), "{text}");
    assert_eq!(text.matches("hca_id:").count(), 1, "-d names one device");
    for line in [
        "\ttransport:\t\t\tInfiniBand (0)\n",
        "\tphys_port_cnt:\t\t\t1\n",
        "\t\tport:\t1\n",
        "\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n",
        "\t\t\tmax_mtu:\t\t4096 (5)\n",
        "\t\t\tlink_layer:\t\tEthernet\n",
        "\t\t\tGID[  0]:\t\t::ffff:127.0.0.1, RoCE v2\n",
    ] {
        assert!(text.contains(line), "{line:?} missing from\n{text}");
    }
    // The limits are the ones an open context's engine enforces.
    let ctx = open_lo(test_port(0));
    let attr = ctx.query_device();
    assert_eq!(attr, softrdma::device("lo").unwrap().attributes(), "query_device without opening agrees");
    for (name, value) in [
        ("max_qp", attr.max_qp),
        ("max_qp_wr", attr.max_qp_wr),
        ("max_sge", attr.max_sge),
        ("max_cqe", attr.max_cqe),
        ("max_mr", attr.max_mr),
        ("max_qp_rd_atom", u32::from(attr.max_qp_rd_atom)),
        ("max_inline_data", attr.max_inline_data),
    ] {
        let line = text.lines().find(|l| l.trim_start().starts_with(&format!("{name}:"))).expect(name);
        assert_eq!(line.split_whitespace().nth(1), Some(value.to_string().as_str()), "{line}");
    }
    let port = ctx.query_port(1).unwrap();
    assert!(text.contains(&format!("active_mtu:\t\t{} ({})", port.active_mtu.bytes(), port.active_mtu as u8)));

    // Interface names are accepted too; --json has the same facts.
    let v = json(&softrdma(&["devinfo", "--json", "-d", "lo"]));
    let d = &v["devices"][0];
    assert_eq!(d["hca_id"], "softrdma_lo");
    assert_eq!(d["limits"]["max_qp_wr"], attr.max_qp_wr);
    assert_eq!(d["limits"]["max_cq"], serde_json::Value::Null, "the engine does not count CQs");
    assert_eq!(d["ports"][0]["state"], "PORT_ACTIVE");
    assert_eq!(d["ports"][0]["gids"][0]["gid"], "::ffff:127.0.0.1");
    assert_eq!(d["ports"][0]["gids"][0]["type"], "RoCE v2");
}

#[test]
fn a_bad_device_name_is_a_one_line_error_with_status_2() {
    for command in ["devinfo", "stats", "res"] {
        let out = softrdma(&[command, "-d", "mlx5_0"]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("mlx5_0") && err.contains("softrdma_lo") && err.contains("softrdma devices"), "{err}");
        assert!(out.stdout.is_empty());
    }
}

/// Counters of `pid` on softrdma_lo as `softrdma stats --json -v` reports them.
fn published_by(pid: u32) -> Option<serde_json::Value> {
    let v = json(&softrdma(&["stats", "--json", "-v", "-d", "softrdma_lo"]));
    let per_process = v["devices"][0]["per_process"].as_array()?.clone();
    per_process.into_iter().find(|p| p["pid"] == pid)
}

#[test]
fn stats_reports_the_counters_of_a_live_process() {
    // Two contexts of softrdma_lo: the application polls the requester's CQ, and never
    // touches the target, whose progress thread alone receives the WRITEs and ACKs them.
    let (requester, target) = (open_lo(test_port(1)), open_lo(test_port(1)));
    let (pd, target_pd) = (requester.alloc_pd().unwrap(), target.alloc_pd().unwrap());
    let (cq, target_cq) = (requester.create_cq(16, None).unwrap(), target.create_cq(16, None).unwrap());
    let a = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    let b = target_pd.create_qp(&QpInit::new(QpType::Rc, &target_cq)).unwrap();
    let opts = ConnectOptions { timeout: 12, ..ConnectOptions::default() };
    a.connect(1, &b.endpoint(0, 2).unwrap(), &opts).unwrap();
    b.connect(2, &a.endpoint(0, 1).unwrap(), &opts).unwrap();
    let src = pd.reg_mr(10_000, Access::ALL).unwrap();
    let dst = target_pd.reg_mr(10_000, Access::ALL).unwrap();
    src.write(0, &[7u8; 10_000]).unwrap();
    let remote = dst.remote(0..10_000).unwrap();
    let sge = [src.sge(0..10_000).unwrap()];
    for i in 0..5 {
        let op = SendOp::RdmaWrite { remote_addr: remote.addr, rkey: remote.rkey };
        a.post_send(&[SendWr { wr_id: i, op, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }])
            .unwrap();
        assert_eq!(cq.wait(Duration::from_secs(10)).unwrap().status, softrdma::WcStatus::Success);
    }
    let mut landed = [0u8; 10_000];
    dst.read(0, &mut landed).unwrap();
    assert!(landed.iter().all(|&b| b == 7), "the WRITEs landed");

    // Each device publishes as it goes idle: within a few ms of its last packet.
    let me = std::process::id();
    let (r, t) = (requester.counters(), target.counters());
    assert!(r.engine.sent_packets >= 15 && t.engine.sent_packets >= 5, "data packets and ACKs: {r:?} {t:?}");
    let want: Vec<(&str, u64)> = r.named().iter().zip(t.named()).map(|(&(name, x), (_, y))| (name, x + y)).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let got = loop {
        let got = published_by(me).expect("this process is listed while its contexts are open");
        let same = want.iter().all(|(name, v)| got["counters"][*name] == *v);
        if same || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for (name, v) in want {
        assert_eq!(got["counters"][name], v, "{name}: published {} against ctx.counters() {v}", got["counters"][name]);
    }
    assert_eq!(got["contexts"], 2);
    assert_eq!(got["ports"][0], test_port(1));
    assert!(!got["command"].as_str().unwrap().is_empty());

    // The text form shows the same process.
    let text = stdout(&softrdma(&["stats", "-v", "-d", "lo"]));
    assert!(text.contains(&format!("  pid {me} (")), "{text}");

    // Closing the contexts removes their files.
    drop((a, b, src, dst, cq, target_cq, pd, target_pd, requester, target));
    assert!(published_by(me).is_none(), "closed contexts are no longer listed");
}

const CHILD_ENV: &str = "SOFTRDMA_DEVICES_TEST_CHILD";

/// Not a test of its own: the child process of the next test, which holds a context open
/// until it is killed (30 s at most).
#[test]
fn child_holding_a_context() {
    let Ok(port) = std::env::var(CHILD_ENV) else { return };
    let ctx = open_lo(port.parse().unwrap());
    println!("ready");
    std::thread::sleep(Duration::from_secs(30));
    drop(ctx);
}

#[test]
fn the_file_of_a_killed_process_is_not_counted_and_is_removed() {
    let mut child = common::spawn_ready_child("child_holding_a_context", CHILD_ENV, test_port(2));
    let pid = child.id();
    let dir = softrdma::stats::stats_dir();
    let files = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{pid}-"))))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Its counters and, beside them, the socket `softrdma res` asks it on.
    let names = || -> Vec<String> {
        let mut n: Vec<String> =
            files().iter().map(|p| p.extension().unwrap_or_default().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    };
    assert_eq!(names(), ["sock", "stats"], "the child published one context in {}", dir.display());
    assert!(published_by(pid).is_some(), "a live child is listed");

    child.kill().unwrap(); // SIGKILL: no destructor runs
    child.wait().unwrap();
    assert_eq!(names(), ["sock", "stats"], "a killed process leaves its files behind");
    assert!(published_by(pid).is_none(), "a dead process is not counted");
    assert!(files().is_empty(), "softrdma stats removed the dead process's files");
}

/// The parent pid of `pid`, from /proc.
fn parent_of(pid: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": the command may hold spaces, so split after its ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn stats_follows_a_benchmark_while_it_runs() {
    // `softrdma perf --loopback` busy-polls its CQ in two processes, which keeps each device
    // lock nearly always taken by the application: its own thread must publish, and the
    // counters must show while the run goes on, not only once it is over.
    let mut perf = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["perf", "write", "bw", "--loopback", "-D", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = u64::from(perf.id());
    let start = Instant::now();
    let mut seen = None;
    while seen.is_none() && start.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(200));
        let v = json(&softrdma(&["stats", "--json", "-d", "lo"]));
        let still_running = perf.try_wait().unwrap().is_none();
        let ours = v["devices"][0]["per_process"].as_array().unwrap().iter().find(|p| {
            let p_pid = p["pid"].as_u64().unwrap();
            (p_pid == pid || parent_of(p_pid) == Some(pid)) && p["counters"]["sent_packets"].as_u64() > Some(0)
        });
        if still_running {
            seen = ours.map(|p| p["counters"]["sent_packets"].as_u64().unwrap());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while perf.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if perf.try_wait().unwrap().is_none() {
        perf.kill().unwrap();
        perf.wait().unwrap();
    }
    let mut err = String::new();
    std::io::Read::read_to_string(perf.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(seen.is_some(), "no packet counted while `softrdma perf write bw --loopback` ran (its stderr: {err})");
}

#[test]
fn stats_follows_a_process_that_busy_polls() {
    // An application that polls its CQ in a tight loop holds the device lock nearly all the
    // time, so its own thread must publish: the counters show while it runs, not only after.
    let ctx = open_lo(test_port(3));
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 32;
    let (a, b) = (pd.create_qp(&init).unwrap(), pd.create_qp(&init).unwrap());
    let opts = ConnectOptions { timeout: 12, ..ConnectOptions::default() };
    a.connect(1, &b.endpoint(0, 2).unwrap(), &opts).unwrap();
    b.connect(2, &a.endpoint(0, 1).unwrap(), &opts).unwrap();
    let src = pd.reg_mr(65536, Access::ALL).unwrap();
    let dst = pd.reg_mr(65536, Access::ALL).unwrap();
    let target = dst.remote(0..65536).unwrap();
    let sge = [src.sge(0..65536).unwrap()];

    let me = std::process::id();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(100));
            let sent = published_by(me).map_or(0, |p| p["counters"]["sent_packets"].as_u64().unwrap());
            if tx.send(sent).is_err() || sent > 0 {
                return;
            }
        }
    });
    // 16 WRITEs in flight, the CQ polled without a pause, as `softrdma perf write bw` does.
    let start = Instant::now();
    let mut seen = None;
    let mut wcs = [softrdma::EMPTY_WC; 16];
    let mut in_flight = 0;
    let mut last_completion = Instant::now();
    while seen.is_none() && start.elapsed() < Duration::from_secs(10) {
        while in_flight < 16 {
            let op = SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey };
            a.post_send(&[SendWr {
                wr_id: 1,
                op,
                sg_list: &sge,
                flags: SendFlags::SIGNALED,
                ud: None,
                xrc_srqn: None,
            }])
            .unwrap();
            in_flight += 1;
        }
        let n = cq.poll(&mut wcs);
        if n > 0 {
            last_completion = Instant::now();
        }
        assert!(last_completion.elapsed() < Duration::from_secs(10), "the WRITEs complete");
        assert!(wcs[..n].iter().all(|wc| wc.status == softrdma::WcStatus::Success));
        in_flight -= n;
        seen = rx.try_iter().find(|&sent| sent > 0);
    }
    let published = seen.expect("counters published while the process busy-polls");
    assert!(published <= ctx.counters().engine.sent_packets);
    drop(rx);
    reader.join().unwrap();
}

/// A process that moved to a network namespace of its own without remounting sysfs (plain
/// `unshare -n`) sees the host's interfaces in `/sys/class/net`: the port state of its own
/// interfaces comes from the namespace it is in. Root only (network namespaces).
#[test]
fn port_state_is_the_namespaces_own() {
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref().ok() != Some("0") {
        eprintln!("SKIP: network namespaces need root");
        return;
    }
    let script = format!(
        "ip link set lo up && ip link add srdma-st0 type veth peer name srdma-st1 && \
         ip addr add 10.79.5.1/24 dev srdma-st0 && ip link set srdma-st0 up && \
         ip addr add 10.79.5.2/24 dev srdma-st1 && \
         {bin} devinfo -d srdma-st0 && ip link set srdma-st1 up && sleep 0.2 && {bin} devinfo -d srdma-st0",
        bin = env!("CARGO_BIN_EXE_softrdma")
    );
    let out = Command::new("unshare").args(["-n", "sh", "-c", &script]).output().expect("run unshare");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let states: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("state:")).collect();
    assert_eq!(states.len(), 2, "{text}");
    // veth: no carrier until its peer is up, then active.
    assert!(states[0].contains("PORT_DOWN"), "{text}");
    assert!(states[1].contains("PORT_ACTIVE"), "{text}");
}
