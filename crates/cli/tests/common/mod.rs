//! Set-up shared by the CLI's tests: running the built binary, the captures in tests/data,
//! contexts on 127.0.0.1, engines connected by hand.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use softrdma::{Context, ContextOptions, Device};
use softrdma_engine::*;
use softrdma_wire::{Gid, Qpn};

/// The built `softrdma` with `args`, run to its end.
pub fn softrdma(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softrdma")).args(args).output().expect("run softrdma")
}

/// The standard output of a run that must have succeeded.
pub fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "exit {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A capture in the repository's tests/data.
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data").join(name)
}

/// This test binary run again as test `entry` with `env=port` (a child that opens a context
/// on `port` and prints `ready`), once it said so.
pub fn spawn_ready_child(entry: &str, env: &str, port: u16) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([entry, "--exact", "--nocapture", "--test-threads", "1"])
        .env(env, port.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // The harness prints "test <entry> ... " first, on the same line.
    let ready = lines.by_ref().take(20).any(|l| l.is_ok_and(|l| l.trim_end().ends_with("ready")));
    assert!(ready, "the child opened its context");
    child
}

/// A context on softrdma_lo (127.0.0.1 only) on `port`.
pub fn open_lo(port: u16) -> Context {
    let device = Device::with_addresses("lo", vec![IpAddr::from([127, 0, 0, 1])]);
    device.open_with(&ContextOptions { port, ..ContextOptions::default() }).expect("open softrdma_lo")
}

/// An RC QP of `e` from RESET to RTS: path MTU 1024, connected to `peer` on `peer_ip`,
/// both PSNs `psn`, every access, 4 READs or atomics in flight, retries without end for RNR.
pub fn rc_up(e: &mut Engine, q: Qpn, peer: Qpn, peer_ip: IpAddr, psn: u32) {
    let init = QpAttr { qp_state: QpState::Init, qp_access_flags: Access::ALL, ..QpAttr::default() };
    e.modify_qp(q, &init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS).unwrap();
    let av =
        AddressVector { dgid: Gid::from_ip(peer_ip), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: Some(av),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer.value(),
        rq_psn: psn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    let m = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    e.modify_qp(q, &rtr, m).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: psn,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    let m = AttrMask::STATE
        | AttrMask::SQ_PSN
        | AttrMask::TIMEOUT
        | AttrMask::RETRY_CNT
        | AttrMask::RNR_RETRY
        | AttrMask::MAX_QP_RD_ATOMIC;
    e.modify_qp(q, &rts, m).unwrap();
}
