//! `softrdma res` end to end: the built binary asks the contexts this test opens (in its own
//! process, and in a child process that it stops), in text and JSON.

#![allow(clippy::print_stdout)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{open_lo, softrdma, stdout};
use softrdma::{Access, ConnectOptions, QpInit, QpType, SendFlags, SendOp, SendWr};

/// A UDP port for this test binary's contexts, away from 4791 and from other tests.
fn test_port(offset: u16) -> u16 {
    45000 + (std::process::id() % 4000) as u16 * 4 + offset
}

#[test]
fn res_lists_the_qps_cqs_and_mrs_of_a_live_process_in_text_and_json() {
    let (ca, cb) = (open_lo(test_port(0)), open_lo(test_port(0)));
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(16, None).unwrap(), cb.create_cq(32, None).unwrap());
    let a = pa.create_qp(&QpInit::new(QpType::Rc, &qa_cq)).unwrap();
    let b = pb.create_qp(&QpInit::new(QpType::Rc, &qb_cq)).unwrap();
    let opts = ConnectOptions { timeout: 12, ..ConnectOptions::default() };
    a.connect(0x10, &b.endpoint(0, 0x20).unwrap(), &opts).unwrap();
    b.connect(0x20, &a.endpoint(0, 0x10).unwrap(), &opts).unwrap();
    let (src, dst) = (pa.reg_mr(4096, Access::ALL).unwrap(), pb.reg_mr(4096, Access::ALL).unwrap());
    let remote = dst.remote(0..64).unwrap();
    let sge = [src.sge(0..64).unwrap()];
    let op = SendOp::RdmaWrite { remote_addr: remote.addr, rkey: remote.rkey };
    a.post_send(&[SendWr { wr_id: 1, op, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None }])
        .unwrap();
    assert_eq!(qa_cq.wait(Duration::from_secs(10)).unwrap().status, softrdma::WcStatus::Success);

    let me = std::process::id().to_string();
    let text = stdout(&softrdma(&["res", "qp", "--pid", &me]));
    let line = |qpn: u32| {
        let key = format!(" lqpn {qpn:#08x} ");
        text.lines()
            .find(|l| l.contains(&key))
            .unwrap_or_else(|| panic!("QP {qpn:#x} missing from\n{text}"))
            .to_string()
    };
    let la = line(a.qpn());
    assert!(la.starts_with("link softrdma_lo/1 lqpn "), "{la}");
    for part in [
        format!(" rqpn {:#08x} ", b.qpn()),
        " type RC state RTS sq-psn 0x000011 rq-psn 0x000020 unacked-psn 0x000011 ".to_string(),
        " inflight-msgs 0 inflight-pkts 0 ".to_string(),
        " dgid ::ffff:127.0.0.1 ".to_string(),
        format!(" dport {} ", test_port(0)),
        format!(" pid {me} comm "),
    ] {
        assert!(la.contains(&part), "{part:?} missing from {la}");
    }
    assert!(line(b.qpn()).contains(" sq-psn 0x000020 rq-psn 0x000011 "), "{}", line(b.qpn()));

    let text = stdout(&softrdma(&["res", "mr", "--pid", &me, "-d", "lo"]));
    assert!(
        text.contains(&format!(" rkey {:#x} lkey {:#x} iova {:#x} mrlen 4096 ", src.rkey(), src.lkey(), src.addr())),
        "{text}"
    );
    let text = stdout(&softrdma(&["res", "cq", "--pid", &me]));
    assert!(text.contains(" cqe 32 entries 0 users 1 "), "{text}");
    let summary = stdout(&softrdma(&["res", "--pid", &me, "-d", "softrdma_lo"]));
    let lo = summary.lines().find(|l| l.contains(" softrdma_lo: ")).unwrap_or_else(|| panic!("{summary}"));
    assert!(lo.ends_with(": softrdma_lo: pd 2 cq 2 qp 2 cm_id 0 mr 2 srq 0 ctx 2"), "{summary}");

    let v: serde_json::Value =
        serde_json::from_str(&stdout(&softrdma(&["res", "qp", "--json", "--pid", &me]))).unwrap();
    let rows = v["qps"].as_array().unwrap();
    let row = rows.iter().find(|r| r["lqpn"] == a.qpn()).expect("QP a in the JSON");
    assert_eq!((row["state"].as_str(), row["type"].as_str()), (Some("RTS"), Some("RC")));
    assert_eq!((row["sq_psn"].as_u64(), row["rq_psn"].as_u64()), (Some(0x11), Some(0x20)));
    assert_eq!(row["peer"]["rqpn"], b.qpn());
    assert_eq!(row["pid"], std::process::id());
    let v: serde_json::Value = serde_json::from_str(&stdout(&softrdma(&["res", "--json", "--pid", &me]))).unwrap();
    assert_eq!(v["contexts"].as_array().unwrap().len(), 2);
    assert!(v["contexts"][0]["keys_shown"].as_bool().unwrap());

    // --watch, bounded by --count.
    let text = stdout(&softrdma(&["res", "pd", "--pid", &me, "--watch", "0.05", "--count", "3"]));
    assert_eq!(text.matches("Every 0.05s: softrdma res pd\n").count(), 3, "{text}");
    assert_eq!(text.matches(&format!(" pid {me} comm ")).count(), 6, "two PDs each time:\n{text}");
}

#[test]
fn another_user_sees_nothing_of_this_users_contexts() {
    use std::os::unix::process::CommandExt as _;
    if !Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n")) {
        println!("skipped: only root can run softrdma as another user");
        return;
    }
    let ctx = open_lo(test_port(1));
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.reg_mr(8192, Access::ALL).unwrap();
    let me = std::process::id().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["res", "mr", "--pid", &me])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(!text.contains(&format!(" pid {me} ")) && !text.contains(" mrlen 8192 "), "{text}");
    assert!(!text.contains(&format!("{:#x}", mr.rkey())), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("contexts of other users not shown"), "{err}");
    // Its own user sees the row, keys and all.
    let mine = stdout(&softrdma(&["res", "mr", "--pid", &me]));
    assert!(mine.contains(&format!("{:#x}", mr.rkey())), "{mine}");
}

const CHILD_ENV: &str = "SOFTRDMA_RES_TEST_CHILD";

/// Not a test of its own: the child process of the next test, which holds a context open
/// until it is killed (30 s at most).
#[test]
fn child_holding_a_context() {
    let Ok(port) = std::env::var(CHILD_ENV) else { return };
    let ctx = open_lo(port.parse().unwrap());
    let _pd = ctx.alloc_pd().unwrap();
    println!("ready");
    std::thread::sleep(Duration::from_secs(30));
    drop(ctx);
}

/// A stopped process cannot answer: `softrdma res` says so within its time and goes on.
#[test]
fn a_stopped_process_is_reported_not_waited_for() {
    let mut child = common::spawn_ready_child("child_holding_a_context", CHILD_ENV, test_port(2));
    let pid = child.id().to_string();
    assert!(stdout(&softrdma(&["res", "pd", "--pid", &pid])).contains(&format!(" pid {pid} comm ")));

    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let t = Instant::now();
    let out = softrdma(&["res", "--json", "--pid", &pid]);
    let took = t.elapsed();
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let t = Instant::now();
    let text_out = softrdma(&["res", "pd", "--pid", &pid]);
    let text_took = t.elapsed();
    child.kill().unwrap(); // SIGKILL ends a stopped process too
    child.wait().unwrap();

    assert!(took < Duration::from_secs(5), "softrdma res took {took:?} with a stopped process");
    assert!(text_took < Duration::from_secs(5), "softrdma res took {text_took:?} with a stopped process");
    assert_eq!(v["unanswered"][0]["pid"].as_u64().map(|p| p.to_string()), Some(pid.clone()), "{v}");
    assert!(v["unanswered"][0]["error"].as_str().unwrap().contains("no answer within"), "{v}");
    assert_eq!(v["contexts"].as_array().map(Vec::len), Some(0));
    let err = String::from_utf8_lossy(&text_out.stderr);
    assert!(text_out.status.success());
    assert!(err.contains(&format!("pid {pid} (")) && err.contains("skipped"), "{err}");
}
