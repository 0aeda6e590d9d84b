//! Atomics a requester of this host applies to the responder's region itself, once the
//! responder's engine granted it (`softrdma_engine::direct`): none lost or doubled
//! against other requesters, direct or by packet; none past a deregistration; none while
//! a capture runs; and the responder's own reads see every one.

mod common;

use std::net::IpAddr;

use common::*;
use softrdma::*;

/// A responder context with a region of 4 KiB (all rights) and one RC QP per requester;
/// requesters with `options` each, an RC QP connected to one of the responder's and an
/// 8-byte-aligned local buffer.
struct Rig {
    responder: Side,
    extra: Vec<Qp>,
    requesters: Vec<Side>,
}

fn rig(options: &[ContextOptions]) -> Rig {
    let port = test_port();
    let device = || Device::with_addresses("lo", vec![IpAddr::from([127, 0, 0, 1])]);
    let open = |o: &ContextOptions| device().open_with(&ContextOptions { port, ..o.clone() }).unwrap();
    let rctx = open(&ContextOptions::default());
    let rpd = rctx.alloc_pd().unwrap();
    let rcq = rctx.create_cq(256, None).unwrap();
    let rmr = rpd.reg_mr(4096, Access::ALL).unwrap();
    let mut rqps = Vec::new();
    let mut requesters = Vec::new();
    let opts = ConnectOptions { timeout: 12, retry_cnt: 7, ..ConnectOptions::default() };
    for (i, o) in options.iter().enumerate() {
        let ctx = open(o);
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
        let mr = pd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
        let rqp = rpd.create_qp(&QpInit::new(QpType::Rc, &rcq)).unwrap();
        let psn = 100 * i as u32;
        let (e, re) = (qp.endpoint(0, psn).unwrap(), rqp.endpoint(0, psn + 50).unwrap());
        qp.connect(psn, &re, &opts).unwrap();
        rqp.connect(psn + 50, &e, &opts).unwrap();
        rqps.push(rqp);
        requesters.push(Side { ctx, pd, cq, qp, mr });
    }
    let first = rqps.remove(0);
    Rig { responder: Side { ctx: rctx, pd: rpd, cq: rcq, qp: first, mr: rmr }, extra: rqps, requesters }
}

/// A FETCH_ADD of `add` on the responder's word at byte 8; the value found, or the
/// completion's status.
fn fetch_add(s: &Side, target: &RemoteMr, add: u64) -> std::result::Result<u64, WcStatus> {
    let sge = [s.mr.sge(0..8).unwrap()];
    let op = SendOp::FetchAdd { remote_addr: target.addr + 8, rkey: target.rkey, add };
    s.qp.post_send(&[wr(1, op, &sge)]).unwrap();
    let wc = s.cq.wait(WAIT).unwrap();
    if wc.status != WcStatus::Success {
        return Err(wc.status);
    }
    assert_eq!((wc.opcode, wc.byte_len), (WcOpcode::FetchAdd, 8));
    Ok(s.mr.read_u64(0).unwrap())
}

#[test]
fn atomics_applied_directly_and_by_packet_on_one_word_lose_nothing() {
    // Two requesters that go directly once granted, one that keeps to the sockets (its
    // atomics the responder's engine executes with the CPU's atomics), all at once.
    let off = ContextOptions { same_host: false, ..ContextOptions::default() };
    let r = rig(&[ContextOptions::default(), ContextOptions::default(), off]);
    let target = r.responder.mr.remote(0..4096).unwrap();
    const EACH: u64 = 1500;
    let found: Vec<Vec<u64>> = std::thread::scope(|s| {
        let threads: Vec<_> = r
            .requesters
            .iter()
            .map(|q| s.spawn(move || (0..EACH).map(|_| fetch_add(q, &target, 1).unwrap()).collect::<Vec<_>>()))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (i, values) in found.iter().enumerate() {
        assert!(values.windows(2).all(|w| w[0] < w[1]), "requester {i} saw the word go back");
    }
    let mut all: Vec<u64> = found.concat();
    all.sort_unstable();
    assert_eq!(all, (0..3 * EACH).collect::<Vec<_>>(), "each value found once: no add lost or doubled");
    assert_eq!(r.responder.mr.read_u64(8).unwrap(), 3 * EACH);
    let direct: Vec<u64> = r.requesters.iter().map(|q| q.ctx.counters().engine.direct_atomics).collect();
    assert!(direct[0] >= EACH - 10 && direct[1] >= EACH - 10, "granted requesters go directly: {direct:?}");
    assert_eq!(direct[2], 0, "the one on the sockets never does");
    let c = r.requesters[0].ctx.counters();
    assert!(c.engine.sent_packets < 100, "a packet for the first atomic and each regrant, not one each: {c:?}");
    drop(r.extra);
}

#[test]
fn the_responders_reads_and_a_deregistration_close_the_gate() {
    let Rig { responder: Side { ctx: _rctx, pd: _rpd, cq: _rcq, qp: _rqp, mut mr }, requesters, .. } =
        rig(&[ContextOptions::default()]);
    let a = &requesters[0];
    let target = mr.remote(0..4096).unwrap();
    for i in 0..4 {
        assert_eq!(fetch_add(a, &target, 1), Ok(i));
    }
    let direct = || a.ctx.counters().engine.direct_atomics;
    assert_eq!(direct(), 3, "the first by packet, then directly");
    // The responder's own access: it sees every add, and the requester keeps its grant.
    assert_eq!(mr.read_u64(8).unwrap(), 4);
    mr.with(|bytes| bytes[8..16].copy_from_slice(&100u64.to_ne_bytes()));
    assert_eq!(fetch_add(a, &target, 1), Ok(100));
    assert_eq!(direct(), 4, "still directly after the responder's access");
    // A compare-swap, directly too.
    let sge = [a.mr.sge(0..8).unwrap()];
    let cas = SendOp::CompareSwap { remote_addr: target.addr + 8, rkey: target.rkey, compare: 101, swap: 7 };
    a.qp.post_send(&[wr(2, cas, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    assert_eq!((a.mr.read_u64(0).unwrap(), mr.read_u64(8).unwrap(), direct()), (101, 7, 5));
    // Once the region is deregistered, no atomic reaches it: the next one goes as a
    // packet and the responder refuses it, as any for a key it no longer has.
    drop(mr);
    assert_eq!(fetch_add(a, &target, 1), Err(WcStatus::RemAccessErr));
    assert_eq!(direct(), 5);
}

#[test]
fn a_capture_on_the_requester_keeps_every_atomic_in_packets() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("atomics.pcap");
    let captured = ContextOptions { capture: Some(CaptureOptions::new(&pcap)), ..ContextOptions::default() };
    let r = rig(&[captured]);
    let a = &r.requesters[0];
    let target = r.responder.mr.remote(0..4096).unwrap();
    for i in 0..5 {
        assert_eq!(fetch_add(a, &target, 1), Ok(i));
    }
    assert_eq!(a.ctx.counters().engine.direct_atomics, 0);
    drop(r);
    // Every one of them is in the capture, a request with its answer.
    let mut reader = softrdma_pcap::CaptureReader::open(&pcap).unwrap();
    let mut seen = Vec::new();
    while let Some(frame) = reader.next_frame() {
        let frame = frame.unwrap();
        // IPv4 and UDP headers (the test's port is not RoCE's, which parsers key on).
        let ip = frame.ip_packet().unwrap();
        let udp_payload = &ip[usize::from(ip[0] & 0xf) * 4 + 8..];
        let roce = softrdma_wire::RocePacket::new_checked(udp_payload);
        seen.push(roce.map(|p| p.bth().opcode()).map_err(|e| format!("{e:?}")));
    }
    let count = |op| seen.iter().filter(|o| **o == Ok(op)).count();
    use softrdma_wire::Opcode;
    assert_eq!((count(Opcode::RC_FETCH_ADD), count(Opcode::RC_ATOMIC_ACKNOWLEDGE)), (5, 5), "{seen:?}");
}

#[test]
fn the_responders_own_access_to_its_region_excludes_the_atomics_applied_directly() {
    // The responder reads, waits and writes its word back (no atomic of its own) while a
    // requester adds to it directly: an add that landed between its read and its write
    // would be lost, unless the gate keeps the requesters out meanwhile.
    let Rig { responder: Side { ctx: _rctx, pd: _rpd, cq: _rcq, qp: _rqp, mut mr }, requesters, .. } =
        rig(&[ContextOptions::default()]);
    let a = &requesters[0];
    let target = mr.remote(0..4096).unwrap();
    const ADDS: u64 = 3000;
    const BIG: u64 = 1 << 32;
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut writes = 0u64;
    std::thread::scope(|s| {
        let requester = s.spawn(|| {
            for _ in 0..ADDS {
                fetch_add(a, &target, 1).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        // For as long as the requester adds (bounded all the same).
        while !done.load(std::sync::atomic::Ordering::SeqCst) && writes < 1_000_000 {
            mr.with(|bytes| {
                let word = u64::from_ne_bytes(bytes[8..16].try_into().unwrap());
                // A window wider than a direct atomic, a few microseconds.
                (0..5000).for_each(|_| std::hint::spin_loop());
                bytes[8..16].copy_from_slice(&(word + BIG).to_ne_bytes());
            });
            writes += 1;
            // The gate open for a moment, as an owner that does other work between its
            // accesses leaves it: most adds go directly then. (Back to back they find it
            // closed and go as packets, which the loop answers: a loop of `Mr::with` calls
            // receives, as a loop of CQ polls does.)
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        requester.join().unwrap();
    });
    assert_eq!(mr.read_u64(8).unwrap(), ADDS + writes * BIG, "every add and every write kept ({writes} writes)");
    let direct = a.ctx.counters().engine.direct_atomics;
    assert!(direct > ADDS / 2, "most adds went directly, around the responder's writes: {direct}");
}

/// How many mappings of this process map the file that the mapping at `addr` maps.
fn mappings_of_file_at(addr: u64) -> (u64, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let inode = |line: &str| line.split_whitespace().nth(4).unwrap().parse::<u64>().unwrap();
    let start = |line: &str| u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
    let ino = maps.lines().find(|l| start(l) == addr).map(inode).expect("the region is mapped");
    (ino, maps.lines().filter(|l| inode(l) == ino).count())
}

#[test]
fn a_deregistered_regions_mapping_is_let_go_by_the_requesters_that_held_its_grant() {
    let Rig { responder: Side { ctx: _rctx, pd: _rpd, cq: _rcq, qp: _rqp, mr }, requesters, .. } =
        rig(&[ContextOptions::default()]);
    let a = &requesters[0];
    let target = mr.remote(0..4096).unwrap();
    for i in 0..4 {
        assert_eq!(fetch_add(a, &target, 1), Ok(i));
    }
    assert_eq!(a.ctx.counters().engine.direct_atomics, 3);
    let (ino, maps) = mappings_of_file_at(target.addr);
    assert_eq!(maps, 2, "the responder's mapping of its memfd ({ino}), and the requester's");
    drop(mr);
    // No atomic tries the grant again: the requester finds it stale on its own.
    let count = || {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().filter(|l| l.split_whitespace().nth(4) == Some(&ino.to_string())).count()
    };
    let started = std::time::Instant::now();
    while count() > 0 {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "still mapped: {}", count());
        std::thread::sleep(std::time::Duration::from_millis(50));
        let _ = a.cq.poll_one();
    }
    eprintln!("unmapped {:?} after the deregistration", started.elapsed());
}

#[test]
fn grants_of_two_contexts_of_one_process_are_held_side_by_side() {
    // Two responder contexts in one process (two inboxes, each with its gate and its
    // engine's epochs), one requester with a QP to each: atomics to one must not cost the
    // grant of the other.
    let port = test_port();
    let device = || Device::with_addresses("lo", vec![IpAddr::from([127, 0, 0, 1])]);
    let open = || device().open_with(&ContextOptions { port, ..ContextOptions::default() }).unwrap();
    let opts = ConnectOptions { timeout: 12, retry_cnt: 7, ..ConnectOptions::default() };
    let a = open();
    let (apd, acq) = (a.alloc_pd().unwrap(), a.create_cq(64, None).unwrap());
    let amr = apd.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let mut kept = Vec::new();
    let mut pairs = Vec::new();
    for i in 0..2u32 {
        let b = open();
        let (bpd, bcq) = (b.alloc_pd().unwrap(), b.create_cq(64, None).unwrap());
        let bmr = bpd.reg_mr(4096, Access::ALL).unwrap();
        // The second one's epoch moves on a few times: the two engines' epochs differ.
        for _ in 0..i * 3 {
            drop(bpd.reg_mr(4096, Access::ALL).unwrap());
        }
        let (aqp, bqp) = (
            apd.create_qp(&QpInit::new(QpType::Rc, &acq)).unwrap(),
            bpd.create_qp(&QpInit::new(QpType::Rc, &bcq)).unwrap(),
        );
        let (e, be) = (aqp.endpoint(0, 10).unwrap(), bqp.endpoint(0, 20).unwrap());
        aqp.connect(10, &be, &opts).unwrap();
        bqp.connect(20, &e, &opts).unwrap();
        pairs.push((aqp, bmr.remote(0..4096).unwrap()));
        kept.push((b, bpd, bcq, bqp, bmr));
    }
    const EACH: u64 = 200;
    let sge = [amr.sge(0..8).unwrap()];
    for i in 0..EACH {
        for (qp, target) in &pairs {
            let op = SendOp::FetchAdd { remote_addr: target.addr + 8, rkey: target.rkey, add: 1 };
            qp.post_send(&[wr(i, op, &sge)]).unwrap();
            let wc = acq.wait(WAIT).unwrap();
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(amr.read_u64(0).unwrap(), i, "each word counts its own adds");
        }
    }
    let direct = a.counters().engine.direct_atomics;
    assert!(direct >= 2 * EACH - 4, "after one by packet each, all directly: {direct} of {}", 2 * EACH);
    for (_, _, _, _, bmr) in &kept {
        assert_eq!(bmr.read_u64(8).unwrap(), EACH);
    }
}

#[test]
fn a_requester_that_missed_its_grant_asks_for_it_again() {
    // The requester's first atomics take the socket (every lane of the responder's inbox
    // taken), while their answers come through the requester's inbox with the grant, which
    // it cannot take without a route to the responder's inbox. Once a lane is free, its
    // atomics go through the inbox, and ask for the grant the responder sent already.
    let port = test_port();
    let device = || Device::with_addresses("lo", vec![IpAddr::from([127, 0, 0, 1])]);
    let open = || device().open_with(&ContextOptions { port, ..ContextOptions::default() }).unwrap();
    let (r, a) = (open(), open());
    let (rpd, rcq) = (r.alloc_pd().unwrap(), r.create_cq(16, None).unwrap());
    let rmr = rpd.reg_mr(4096, Access::ALL).unwrap();
    let rqp = rpd.create_qp(&QpInit::new(QpType::Rc, &rcq)).unwrap();
    let (apd, acq) = (a.alloc_pd().unwrap(), a.create_cq(16, None).unwrap());
    let amr = apd.reg_mr(64, Access::LOCAL_WRITE).unwrap();
    let aqp = apd.create_qp(&QpInit::new(QpType::Rc, &acq)).unwrap();
    let opts = ConnectOptions { timeout: 12, retry_cnt: 7, ..ConnectOptions::default() };
    let (e, re) = (aqp.endpoint(0, 1).unwrap(), rqp.endpoint(0, 2).unwrap());
    aqp.connect(1, &re, &opts).unwrap();
    rqp.connect(2, &e, &opts).unwrap();
    let name = softrdma_udp::local::inbox_name("lo", port, rqp.qpn() >> softrdma_udp::host::QPN_SLOT_BITS).unwrap();
    let taken: Vec<_> = std::iter::from_fn(|| softrdma_udp::local::Outbox::open(&name).ok()).take(64).collect();
    assert_eq!(taken.len(), softrdma_udp::local::LANES, "every lane of the responder's inbox taken");
    let target = rmr.remote(0..4096).unwrap();
    let sge = [amr.sge(0..8).unwrap()];
    let op = SendOp::FetchAdd { remote_addr: target.addr + 8, rkey: target.rkey, add: 1 };
    let fetch_add = |i: u64| {
        aqp.post_send(&[wr(i, op, &sge)]).unwrap();
        assert_eq!(acq.wait(WAIT).unwrap().status, WcStatus::Success);
        assert_eq!(amr.read_u64(0).unwrap(), i);
    };
    for i in 0..3 {
        fetch_add(i);
    }
    assert_eq!(a.counters().engine.direct_atomics, 0, "by packet while the lanes are taken");
    drop(taken);
    // The requester tries the inbox again a second after it found no lane.
    let started = std::time::Instant::now();
    let mut i = 3;
    while a.counters().engine.direct_atomics == 0 {
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "never directly: the grant is not sent again");
        fetch_add(i);
        i += 1;
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(rmr.read_u64(8).unwrap(), i);
}
