//! Fault injection in the live runtime (`ContextOptions::faults`, `SOFTRDMA_FAULTS`): real
//! devices over loopback sockets and the same-host path receive through the simulator's
//! rules. RC must deliver every byte through loss, reordering, duplication and corruption;
//! UD must lose exactly what the rules dropped, no more.

mod common;

use std::time::{Duration, Instant};

use common::*;
use softrdma::*;

fn with_faults(spec: &str, same_host: bool) -> ContextOptions {
    ContextOptions { faults: Some(spec.parse().unwrap()), same_host, ..ContextOptions::default() }
}

/// WRITEs and SENDs of a pattern through `spec` on both sides; every byte must arrive, and
/// the faults and the retransmissions they caused must show in the counters.
fn rc_survives(spec: &str, same_host: bool) {
    const LEN: usize = 256 * 1024;
    let (a, b) = pair_with(QpType::Rc, LEN, [with_faults(spec, same_host), with_faults(spec, same_host)]);
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
    a.mr.write(0, &pattern).unwrap();
    let remote = b.mr.remote(0..LEN).unwrap();
    // 16 WRITEs of 8 KiB, then 8 SENDs of 16 KiB into posted receives.
    for i in 0..16u64 {
        let range = (i as usize * 8192)..(i as usize + 1) * 8192;
        let sge = [a.mr.sge(range.clone()).unwrap()];
        let op = SendOp::RdmaWrite { remote_addr: remote.addr + range.start as u64, rkey: remote.rkey };
        a.qp.post_send(&[wr(i, op, &sge)]).unwrap();
    }
    for wc in a.cq.wait_n(16, Duration::from_secs(30)).unwrap() {
        assert_eq!(wc.status, WcStatus::Success, "WRITE {wc:?} under {spec:?}");
    }
    let recvs: Vec<[Sge; 1]> =
        (0..8).map(|i| [b.mr.sge(131_072 + i * 16_384..131_072 + (i + 1) * 16_384).unwrap()]).collect();
    for (i, sge) in recvs.iter().enumerate() {
        b.qp.post_recv(&[RecvWr { wr_id: 100 + i as u64, sg_list: sge }]).unwrap();
    }
    for i in 0..8usize {
        let sge = [a.mr.sge(131_072 + i * 16_384..131_072 + (i + 1) * 16_384).unwrap()];
        a.qp.post_send(&[wr(100 + i as u64, SendOp::Send, &sge)]).unwrap();
    }
    for wc in a.cq.wait_n(8, Duration::from_secs(30)).unwrap() {
        assert_eq!(wc.status, WcStatus::Success, "SEND {wc:?} under {spec:?}");
    }
    let got = b.cq.wait_n(8, Duration::from_secs(30)).unwrap();
    let ids: Vec<u64> = got.iter().map(|wc| wc.wr_id).collect();
    assert_eq!(ids, (100..108).collect::<Vec<_>>(), "receives complete in order");
    let mut back = vec![0u8; LEN];
    b.mr.read(0, &mut back).unwrap();
    assert!(back == pattern, "every byte arrived under {spec:?}");
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    let faults = |c: &Counters| c.faults.dropped + c.faults.delayed + c.faults.duplicated + c.faults.corrupted;
    assert!(faults(&ca) + faults(&cb) > 0, "faults were injected: {:?} {:?}", ca.faults, cb.faults);
    if cb.faults.dropped > 0 {
        assert!(ca.engine.retransmitted_packets > 0, "lost requests were resent: {:?}", ca.engine);
    }
    if cb.faults.corrupted > 0 && !same_host {
        assert!(cb.engine.rcvd_icrc_errors > 0, "corrupted datagrams fail their ICRC: {:?}", cb.engine);
    }
    if same_host {
        // The inbox's packets carry no ICRC and are not checked: a corrupted one is
        // dropped by the faults, where the check would have dropped it.
        assert_eq!(cb.engine.rcvd_icrc_errors + ca.engine.rcvd_icrc_errors, 0);
        assert!(cb.same_host_rcvd > 0 && ca.same_host_rcvd > 0, "{ca:?} {cb:?}");
    }
}

#[test]
fn rc_moves_every_byte_through_loss_reordering_duplication_and_corruption_on_the_sockets() {
    rc_survives("loss 5%; reorder 10% 200us; duplicate 2%; corrupt 1%; seed 0x5eed", false);
}

#[test]
fn rc_moves_every_byte_through_loss_reordering_and_corruption_on_the_same_host_path() {
    rc_survives("loss 5%; reorder 10% 200us; corrupt 2%; seed 7", true);
}

#[test]
fn rc_moves_every_byte_through_delay_jitter_and_a_rate_limit() {
    rc_survives("delay 200us jitter 100us; rate 200mbit queue 2ms; seed 3", false);
}

#[test]
fn a_lost_read_response_scoped_to_one_operation_class_is_asked_for_again() {
    // Only READ responses are lost, and only at the requester.
    let opts = [with_faults("loss 30% op read; seed 11", true), ContextOptions::default()];
    let (a, b) = pair_with(QpType::Rc, 64 * 1024, opts);
    b.mr.write(0, &[0x5a; 65536]).unwrap();
    let sge = [a.mr.sge(0..65536).unwrap()];
    let remote = b.mr.remote(0..65536).unwrap();
    a.qp.post_send(&[wr(1, SendOp::RdmaRead { remote_addr: remote.addr, rkey: remote.rkey }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(Duration::from_secs(30)).unwrap().status, WcStatus::Success);
    let mut got = vec![0u8; 65536];
    a.mr.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 0x5a));
    assert!(a.ctx.counters().faults.dropped > 0, "16 responses at 30%: some lost");
    assert_eq!(b.ctx.counters().faults, FaultCounters::default(), "the responder runs without faults");
}

#[test]
fn ud_loses_exactly_what_the_rules_dropped() {
    let port = test_port();
    let a = ud_side([127, 0, 0, 1], port);
    let b = {
        let device = Device::with_addresses("lo", vec![[127, 0, 0, 3].into()]);
        let ctx = device.open_with(&ContextOptions { port, ..with_faults("loss 20% op send; seed 21", true) }).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(512, None).unwrap();
        let mut init = QpInit::new(QpType::Ud, &cq);
        init.cap.max_recv_wr = 512;
        let qp = pd.create_qp(&init).unwrap();
        qp.ready_ud(0x1111_2222, 0).unwrap();
        let mr = pd.reg_mr(512 * 128, Access::LOCAL_WRITE).unwrap();
        Side { ctx, pd, cq, qp, mr }
    };
    for i in 0..400usize {
        b.qp.post_recv(&[RecvWr { wr_id: i as u64, sg_list: &[b.mr.sge(i * 128..(i + 1) * 128).unwrap()] }]).unwrap();
    }
    let av =
        AddressVector { dgid: b.ctx.gid(0).unwrap(), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let ah = a.pd.create_ah(av).unwrap();
    let dest = UdDest { ah: ah.id(), remote_qpn: Qpn::from_u24_truncating(b.qp.qpn()), remote_qkey: QKey(0x1111_2222) };
    let sge = [a.mr.sge(0..64).unwrap()];
    // 400 datagrams in bursts of 20, each burst sent before the next: no receive buffer of
    // the kernel or the inbox overflows, so the rules are the only loss.
    for burst in 0..20u64 {
        let wrs: Vec<SendWr<'_>> =
            (0..20).map(|i| SendWr { ud: Some(dest), ..wr(burst * 20 + i, SendOp::Send, &sge) }).collect();
        a.qp.post_send(&wrs).unwrap();
        for wc in a.cq.wait_n(20, WAIT).unwrap() {
            assert_eq!(wc.status, WcStatus::Success);
        }
    }
    let deadline = Instant::now() + WAIT;
    let mut received = 0u64;
    while Instant::now() < deadline {
        received += b.cq.poll(&mut [EMPTY_WC; 64]) as u64;
        let dropped = b.ctx.counters().faults.dropped;
        if received + dropped == 400 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    received += b.cq.poll(&mut [EMPTY_WC; 64]) as u64;
    let c = b.ctx.counters();
    assert_eq!(received + c.faults.dropped, 400, "received {received}, dropped {:?}", c.faults);
    assert!((40..130).contains(&c.faults.dropped), "about 20% of 400: {:?}", c.faults);
    assert_eq!(c.engine.rcvd_dropped, 0, "no loss but the rules': {:?}", c.engine);
}

/// Set by the parent for the child run of [`environment_child`].
const CHILD_ENV: &str = "SOFTRDMA_FAULTS_TEST_CHILD";

/// The child half of [`the_environment_variable_applies_to_any_program_and_is_checked`]: opens
/// a device under the parent's `SOFTRDMA_FAULTS` and says what happened on stdout.
#[test]
fn environment_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let device = Device::with_addresses("lo", vec![[127, 0, 0, 1].into()]);
    match device.open_with(&ContextOptions { port: test_port(), ..ContextOptions::default() }) {
        Ok(_) => println!("opened"),
        Err(e) => println!("refused: {e}"),
    }
}

#[test]
fn the_environment_variable_applies_to_any_program_and_is_checked() {
    let run = |spec: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "environment_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env(FAULTS_ENV, spec)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (stdout, stderr) = run("loss 5%; reorder 10% 200us");
    assert!(stdout.contains("opened"), "{stdout}");
    // The seed the device drew is printed, with the line that repeats the run.
    let line = stderr.lines().find(|l| l.contains("injecting faults")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("loss 5%; reorder 10% 200us; seed 0x") && line.contains("SOFTRDMA_FAULTS='"), "{line}");
    let (stdout, _) = run("loss 5");
    assert!(stdout.contains("refused: reading SOFTRDMA_FAULTS=\"loss 5\"") && stdout.contains("loss 5%"), "{stdout}");
}
