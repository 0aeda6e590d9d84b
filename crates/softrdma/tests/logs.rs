//! Logs (`SOFTRDMA_LOG`, `SOFTRDMA_LOG_FILE`, rdma-core's `VERBS_LOG_LEVEL`/`VERBS_LOG_FILE`),
//! seen from a child process whose RC QP sends to a peer that is not there: the log says
//! which QP failed, how (its retries ran out, the work request, the peer) and, at debug, each
//! ACK timeout before; with no variable set nothing is written.

#![allow(clippy::print_stdout)]

mod common;

use std::time::Duration;

use common::child::*;
use common::*;
use softrdma::{Access, ConnectOptions, Endpoint, QpInit, QpType, SendFlags, SendOp, SendWr, WcStatus};

const ENTRY: &str = "child_entry";
const WAIT: Duration = Duration::from_secs(20);

/// Runs the child role named in the environment; a no-op when this is not a child.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else { return };
    assert_eq!(role, "lonely-sender");
    let port: u16 = std::env::var("SOFTRDMA_TEST_PORT").unwrap().parse().unwrap();
    let ctx = open([127, 0, 0, 1], port);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
    // A peer QP nobody has: every packet goes unanswered.
    let nobody = Endpoint { qpn: qp.qpn() ^ 0x100, gid: ctx.gid(0).unwrap(), psn: 0 };
    let options = ConnectOptions { timeout: 8, retry_cnt: 2, ..ConnectOptions::default() };
    qp.connect(0, &nobody, &options).unwrap();
    let mr = pd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0..8).unwrap()];
    let wr = SendWr { wr_id: 42, op: SendOp::Send, sg_list: &sge, flags: SendFlags::SIGNALED, ..SendWr::default() };
    qp.post_send(&[wr]).unwrap();
    let wc = cq.wait(WAIT).unwrap();
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    println!("QPN {}", qp.qpn());
}

/// The child's log file after it ran with `env`, and its QPN.
fn run(env: &[(&str, &str)], file_var: &str) -> (Option<String>, u32) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("log");
    let mut vars: Vec<(&str, String)> = env.iter().map(|&(k, v)| (k, v.to_string())).collect();
    vars.push((file_var, file.display().to_string()));
    vars.push(("SOFTRDMA_TEST_PORT", test_port().to_string()));
    let mut child = ChildProc::spawn(ENTRY, "lonely-sender", &vars, None);
    let qpn = child.expect_line("QPN ", WAIT)["QPN ".len()..].parse().unwrap();
    assert!(child.wait_success(WAIT));
    (std::fs::read_to_string(&file).ok(), qpn)
}

#[test]
fn a_qp_that_fails_says_which_how_and_why_in_the_log() {
    let (log, qpn) = run(&[("SOFTRDMA_LOG", "softrdma=debug")], "SOFTRDMA_LOG_FILE");
    let log = log.expect("SOFTRDMA_LOG_FILE was written");
    let failed = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains(&format!("QP {qpn:#08x} RTS → ERR")))
        .unwrap_or_else(|| panic!("no failure line for QP {qpn:#08x}:\n{log}"));
    assert!(failed.contains("RetryExcErr") && failed.contains("wr_id=42"), "{failed}");
    assert!(failed.contains("peer=Some(127.0.0.1)"), "{failed}");
    let timeouts = log.lines().filter(|l| l.contains("ACK timeout") && l.contains(&format!("{qpn:#08x}"))).count();
    assert_eq!(timeouts, 3, "two retries, then the third timeout fails the QP:\n{log}");
    assert!(log.contains("RESET → INIT (modify_qp)"), "state changes at debug:\n{log}");
    assert!(log.contains("joined device lo port"), "the host group:\n{log}");
}

#[test]
fn rdma_cores_verbs_log_level_is_honoured_and_no_variable_means_no_log() {
    let (log, qpn) = run(&[("VERBS_LOG_LEVEL", "2")], "VERBS_LOG_FILE");
    let log = log.expect("VERBS_LOG_FILE was written");
    assert!(log.contains(&format!("QP {qpn:#08x} RTS → ERR")), "warnings at level 2:\n{log}");
    assert!(!log.contains("ACK timeout"), "no debug at level 2:\n{log}");
    let (log, _) = run(&[], "SOFTRDMA_LOG_FILE");
    assert_eq!(log, None, "no SOFTRDMA_LOG: no log file");
}
