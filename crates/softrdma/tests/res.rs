//! `softrdma::res`: each live context answers, on its own socket, what it holds (QPs with
//! their PSNs and peers, CQs, MRs, PDs, SRQs, CM IDs), whatever its application is doing.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use softrdma::res::{self, Snapshot};
use softrdma::*;

const T: Duration = Duration::from_secs(10);

/// This process's contexts on UDP `port`, as `softrdma res` sees them.
fn snapshots(port: u16) -> Vec<Snapshot> {
    let me = std::process::id();
    let scan = res::scan(|p| p.pid == me && p.port == port).expect("the stats directory reads");
    scan.contexts.into_iter().map(|r| r.result.unwrap_or_else(|e| panic!("pid {me} did not answer: {e}"))).collect()
}

/// The snapshot that holds QP `qpn`.
fn holding(snaps: &[Snapshot], qpn: u32) -> &Snapshot {
    snaps.iter().find(|s| s.qps.iter().any(|q| q.lqpn == qpn)).unwrap_or_else(|| panic!("QP {qpn:#x} in {snaps:#?}"))
}

fn write(side: &Side, to: &RemoteMr, len: usize, wr_id: u64) {
    let sge = [side.mr.sge(0..len).unwrap()];
    let op = SendOp::RdmaWrite { remote_addr: to.addr, rkey: to.rkey };
    side.qp.post_send(&[SendWr { wr_id, op, sg_list: &sge, flags: SendFlags::SIGNALED, ..SendWr::default() }]).unwrap();
}

#[test]
fn an_rc_pair_shows_its_psns_peers_cqs_and_mr_keys() {
    let (a, b) = rc_pair(64 * 1024);
    let port = a.ctx.local_addr(0).unwrap().port();
    // PSNs move by the packets of the message (8 KiB: two at a 4096-byte path MTU).
    write(&a, &b.mr.remote(0..8192).unwrap(), 8192, 1);
    assert_eq!(a.cq.wait(T).unwrap().status, WcStatus::Success);

    let snaps = snapshots(port);
    assert_eq!(snaps.len(), 2, "two contexts of this test: {snaps:#?}");
    let (sa, sb) = (holding(&snaps, a.qp.qpn()), holding(&snaps, b.qp.qpn()));
    let (qa, qb) = (&sa.qps[0], &sb.qps[0]);
    assert_eq!((qa.qp_type.as_str(), qa.state.as_str()), ("RC", "RTS"));
    let mtu = qa.path_mtu as usize;
    let packets = 8192_usize.div_ceil(mtu) as u32;
    // rc_pair connects a from PSN 100, b from PSN 200.
    assert_eq!((qa.sq_psn, qa.unacked_psn, qa.rq_psn), (100 + packets, 100 + packets, 200));
    assert_eq!((qb.sq_psn, qb.rq_psn), (200, 100 + packets), "b expects what a sends next");
    assert_eq!((qa.pkts_in_flight, qa.msgs_in_flight, qa.sq_posted), (0, 0, 0), "all acknowledged");
    let peer = qa.peer.as_ref().expect("a connected QP names its peer");
    assert_eq!((peer.gid.as_str(), peer.rqpn, peer.udp_port), ("::ffff:127.0.0.1", b.qp.qpn(), Some(port)));
    assert_eq!(qb.peer.as_ref().unwrap().peer_udp_port, Some(port), "b learnt a's source port");
    assert_eq!((qa.scqn, qa.rcqn), (a.cq.id().0, a.cq.id().0));
    assert_eq!((qa.ack_timeouts, qa.retransmitted_pkts, qa.rnr_naks_rcvd, qa.naks_rcvd), (0, 0, 0, 0));

    // The CQ holds nothing (polled); the MR's keys are there for this user.
    assert_eq!(sa.cqs.len(), 1);
    assert_eq!((sa.cqs[0].cqe, sa.cqs[0].entries, sa.cqs[0].users), (256, 0, 1));
    assert!(sa.keys_shown, "the same user sees the keys");
    let mr = &sa.mrs[0];
    assert_eq!((mr.lkey, mr.rkey, mr.iova), (Some(a.mr.lkey()), Some(a.mr.rkey()), Some(a.mr.addr())));
    assert_eq!((mr.mrlen, mr.access.as_str()), (64 * 1024, "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC"));
    assert_eq!(sa.pds.len(), 1);
    assert_eq!(sa.pds[0].users, 2, "the QP and the MR");
    assert_eq!((sa.pid, sa.device.as_str(), sa.port), (std::process::id(), "softrdma_lo", port));
    assert!(!sa.truncated);
}

#[test]
fn a_qp_failed_by_a_bad_rkey_shows_err_and_its_naks() {
    let (a, b) = rc_pair(4096);
    let port = a.ctx.local_addr(0).unwrap().port();
    let mut bad = b.mr.remote(0..64).unwrap();
    bad.rkey = RKey(bad.rkey.0 ^ 0x5a5a_0000);
    write(&a, &bad, 64, 1);
    assert_eq!(a.cq.wait(T).unwrap().status, WcStatus::RemAccessErr);

    let snaps = snapshots(port);
    let (qa, qb) = (&holding(&snaps, a.qp.qpn()).qps[0], &holding(&snaps, b.qp.qpn()).qps[0]);
    assert_eq!((qa.state.as_str(), qa.naks_rcvd), ("ERR", 1));
    assert_eq!((qb.state.as_str(), qb.naks_sent), ("ERR", 1), "the responder refused and went to ERR as well");
}

#[test]
fn an_srq_and_its_qp_are_listed() {
    let port = test_port();
    let ctx = open([127, 0, 0, 1], port);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32, None).unwrap();
    let srq = pd.create_srq(64, 2).unwrap();
    srq.arm_limit(4).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.srq = Some(&srq);
    let qp = pd.create_qp(&init).unwrap();
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0..64).unwrap()];
    srq.post_recv(&[RecvWr { wr_id: 1, sg_list: &sge }, RecvWr { wr_id: 2, sg_list: &sge }]).unwrap();

    let snaps = snapshots(port);
    let s = holding(&snaps, qp.qpn());
    assert_eq!(s.srqs.len(), 1);
    let row = &s.srqs[0];
    assert_eq!((row.srqn, row.srq_type.as_str(), row.wqe, row.posted, row.limit), (srq.number(), "BASIC", 64, 2, 4));
    assert_eq!(row.lqpns, [qp.qpn()]);
    assert_eq!((s.qps[0].state.as_str(), s.qps[0].srqn), ("RESET", Some(srq.number())));
    assert!(s.qps[0].peer.is_none(), "no peer before RTR");
}

#[test]
fn cm_ids_show_their_states_addresses_and_qps() {
    let port = test_port();
    let options = ContextOptions { port, ..ContextOptions::default() };
    let sch = EventChannel::with_options(options.clone()).unwrap();
    let listen = sch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    listen.bind_addr(SocketAddr::from(([127, 0, 0, 1], 7491))).unwrap();
    listen.listen(4).unwrap();
    let cch = EventChannel::with_options(options).unwrap();
    let cid = cch.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    cid.resolve_addr(None, SocketAddr::from(([127, 0, 0, 1], 7491))).unwrap();
    cch.expect(CmEventKind::AddrResolved, T).unwrap();
    cid.resolve_route().unwrap();
    cch.expect(CmEventKind::RouteResolved, T).unwrap();
    let cpd = cid.context().unwrap().alloc_pd().unwrap();
    let cap = QpCap { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    cid.create_qp(&cpd, cap).unwrap();
    cid.connect(&ConnParam::default()).unwrap();
    let req = sch.expect(CmEventKind::ConnectRequest, T).unwrap();
    let sid = req.id.clone();
    let spd = sid.context().unwrap().alloc_pd().unwrap();
    sid.create_qp(&spd, cap).unwrap();
    sid.accept(&ConnParam::default()).unwrap();
    cch.expect(CmEventKind::Established, T).unwrap();
    sch.expect(CmEventKind::Established, T).unwrap();

    let snaps = snapshots(port);
    let ids: Vec<&res::CmIdRow> = snaps.iter().flat_map(|s| &s.cm_ids).collect();
    assert_eq!(ids.len(), 3, "the listener, the active and the passive ID: {ids:#?}");
    let listener = ids.iter().find(|i| i.state == "LISTEN").expect("the listener");
    assert_eq!(
        (listener.src_addr.as_deref(), listener.ps.as_str(), listener.lqpn),
        (Some("127.0.0.1:7491"), "TCP", None)
    );
    let active = ids.iter().find(|i| i.state == "CONNECT" && !i.passive).expect("the active ID");
    let passive = ids.iter().find(|i| i.state == "CONNECT" && i.passive).expect("the passive ID");
    assert_eq!((active.cm_state.as_str(), passive.cm_state.as_str()), ("ESTABLISHED", "ESTABLISHED"));
    assert_eq!(active.dst_addr.as_deref(), Some("127.0.0.1:7491"));
    assert_eq!(
        (active.src_addr.as_ref(), passive.dst_addr.as_ref()),
        (passive.dst_addr.as_ref(), active.src_addr.as_ref())
    );
    let (aq, pq) = (active.lqpn.expect("the active ID's QP"), passive.lqpn.expect("the passive ID's QP"));
    assert_eq!((active.rqpn, passive.rqpn), (Some(pq), Some(aq)));
    let qp = &holding(&snaps, aq).qps.iter().find(|q| q.lqpn == aq).unwrap();
    assert_eq!((qp.state.as_str(), qp.peer.as_ref().map(|p| p.rqpn)), ("RTS", Some(pq)));
    drop((cid, sid, listen, cpd, spd, req));
}

/// The context answers whatever its application does: polling its CQ in a tight loop (the
/// device lock taken and released all the time), or blocked on a completion channel (the
/// progress thread asleep in `poll`).
#[test]
fn a_context_answers_while_its_application_polls_and_while_it_sleeps() {
    let (a, b) = rc_pair(4096);
    let port = a.ctx.local_addr(0).unwrap().port();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            let mut wc = [EMPTY_WC; 16];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && start.elapsed() < Duration::from_secs(20) {
                a.cq.poll(&mut wc);
            }
        });
        for _ in 0..5 {
            let t = Instant::now();
            let snaps = snapshots(port);
            assert_eq!(snaps.len(), 2);
            assert!(t.elapsed() < Duration::from_secs(1), "answered in {:?} while the application polls", t.elapsed());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });

    // Blocked on a channel: both devices idle, their progress threads asleep.
    let ctx = open([127, 0, 0, 1], port);
    let channel = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(8, Some(&channel)).unwrap();
    cq.req_notify(false).unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| channel.get_cq_event(Some(Duration::from_secs(1))).unwrap().is_none());
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        let snaps = snapshots(port);
        assert_eq!(snaps.len(), 3);
        assert!(snaps.iter().any(|s| s.cqs.iter().any(|c| c.cqn == cq.id().0 && c.armed)), "the armed CQ");
        assert!(t.elapsed() < Duration::from_secs(1), "answered in {:?} while the application sleeps", t.elapsed());
        assert!(waiter.join().unwrap(), "no completion came");
    });
    drop(b);
}

#[test]
fn a_closed_context_leaves_no_socket() {
    let me = std::process::id();
    let dir = softrdma::stats::stats_dir();
    let sockets = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&dir)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{me}-"))))
            .filter(|p| p.extension().is_some_and(|e| e == "sock"))
            .collect()
    };
    let before = sockets();
    let port = test_port();
    let ctx = open([127, 0, 0, 1], port);
    // Other tests open contexts meanwhile: ours is the new socket that answers for `port`.
    let ours: Vec<std::path::PathBuf> = sockets()
        .into_iter()
        .filter(|p| !before.contains(p))
        .filter(|p| res::query(p, me, T).is_ok_and(|s| s.port == port))
        .collect();
    assert_eq!(ours.len(), 1, "the open context's socket, beside its counters in {}", dir.display());
    assert_eq!(snapshots(port).len(), 1);
    drop(ctx);
    assert!(!ours[0].exists(), "closing the context removed {}", ours[0].display());
    assert!(snapshots(port).is_empty());
}

/// An application that holds its device lock (here inside `Mr::with`, as a thread stuck in
/// a verb would) gets an answer that says so, within the reader's time, not a hang.
#[test]
fn a_context_whose_device_lock_stays_taken_says_so_in_time() {
    let port = test_port();
    let ctx = open([127, 0, 0, 1], port);
    let pd = ctx.alloc_pd().unwrap();
    let mut mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let me = std::process::id();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            mr.with(|_| {
                held_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(1500));
            })
        });
        held_rx.recv().unwrap();
        let t = Instant::now();
        let scan = res::scan(|p| p.pid == me && p.port == port).unwrap();
        let err = scan.contexts[0].result.as_ref().expect_err("no snapshot while the lock is held");
        assert!(err.contains("device lock"), "{err}");
        assert!(t.elapsed() < res::QUERY_TIMEOUT, "answered in {:?}", t.elapsed());
    });
    assert_eq!(snapshots(port)[0].mrs.len(), 1, "answers again once the lock is free");
}

const NOBODY_ENV: &str = "SOFTRDMA_RES_TEST_AS_NOBODY";

/// Not a test of its own: run as user nobody by the next test, it asks the contexts of the
/// pid and port in its environment and prints what it saw of their MRs.
#[test]
fn child_asking_as_another_user() {
    let Ok(what) = std::env::var(NOBODY_ENV) else { return };
    let (pid, port) = what.split_once(':').unwrap();
    let (pid, port): (u32, u16) = (pid.parse().unwrap(), port.parse().unwrap());
    let scan = res::scan(|p| p.pid == pid && p.port == port).unwrap();
    println!("contexts={} other_users={}", scan.contexts.len(), scan.other_users);
    // Asked straight at its socket (the directory is listable), the context refuses too.
    let dir = softrdma::stats::stats_dir();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{pid}-")) && name.ends_with(".sock") {
            match res::query(&e.path(), pid, Duration::from_secs(2)) {
                Ok(s) => println!("ANSWERED mrs={}", s.mrs.len()),
                Err(e) => println!("REFUSED {e}"),
            }
        }
    }
}

#[test]
fn another_user_sees_nothing_of_this_users_contexts() {
    if rustix::process::geteuid().as_raw() != 0 {
        println!("skipped: only root can run a reader as another user (the decision is unit-tested in res.rs)");
        return;
    }
    let port = test_port();
    let ctx = open([127, 0, 0, 1], port);
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.reg_mr(8192, Access::ALL).unwrap();
    use std::os::unix::process::CommandExt as _;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["child_asking_as_another_user", "--exact", "--nocapture", "--test-threads", "1"])
        .env(NOBODY_ENV, format!("{}:{port}", std::process::id()))
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    // Users of one host stay apart: another user finds no context of this one (its
    // counters file is this user's alone), and its socket answers nothing.
    assert!(stdout.contains("contexts=0 other_users="), "{stdout}");
    assert!(!stdout.contains("other_users=0"), "the reader counts what it may not see: {stdout}");
    assert!(stdout.contains("REFUSED") && !stdout.contains("ANSWERED"), "{stdout}");
    // This user still sees them, keys and all.
    let mine = &snapshots(port)[0].mrs[0];
    assert_eq!((mine.lkey, mine.rkey), (Some(mr.lkey()), Some(mr.rkey())));
}
