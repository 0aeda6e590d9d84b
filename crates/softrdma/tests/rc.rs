//! RC over real loopback sockets through the safe API: every operation moves real RoCEv2
//! packets through the kernel, and every byte is checked.

mod common;

use std::time::Duration;

use common::*;
use softrdma::*;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Two contexts on 127.0.0.1 with `options` (a port of their own, shared), each with an RC
/// QP (16 receives) whose CQ has a completion channel, connected.
fn channel_pair(options: [ContextOptions; 2]) -> ((Side, CompChannel), (Side, CompChannel)) {
    let [a, b] = options.map(|o| {
        let device = Device::with_addresses("lo", vec![std::net::IpAddr::from([127, 0, 0, 1])]);
        let ctx = device.open_with(&o).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let cq = ctx.create_cq(512, Some(&ch)).unwrap();
        let mut init = QpInit::new(QpType::Rc, &cq);
        init.cap.max_recv_wr = 16;
        let qp = pd.create_qp(&init).unwrap();
        let mr = pd.reg_mr(4096, Access::ALL).unwrap();
        (Side { ctx, pd, cq, qp, mr }, ch)
    });
    let (ea, eb) = (a.0.qp.endpoint(0, 100).unwrap(), b.0.qp.endpoint(0, 200).unwrap());
    a.0.qp.connect(100, &eb, &ConnectOptions::default()).unwrap();
    b.0.qp.connect(200, &ea, &ConnectOptions::default()).unwrap();
    (a, b)
}

/// Polls `cq` (as a busy application does, calling no other verb) until it has a
/// completion, which must be a success.
fn spin_for_success(cq: &Cq) -> Wc {
    let until = std::time::Instant::now() + WAIT;
    loop {
        if let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            return wc;
        }
        assert!(std::time::Instant::now() < until, "no completion within {WAIT:?} of polling");
    }
}

#[test]
fn rdma_write_lands_in_the_peers_memory() {
    let (a, b) = rc_pair(64 * 1024);
    let data = pattern(40_000, 7); // ten packets at MTU 4096
    a.mr.write(0, &data).unwrap();
    let target = b.mr.remote(1000..41_000).unwrap();
    let sge = [a.mr.sge(0..data.len()).unwrap()];
    a.qp.post_send(&[wr(1, SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey }, &sge)]).unwrap();
    let wc = a.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::RdmaWrite));
    let mut got = vec![0u8; data.len()];
    b.mr.read(1000, &mut got).unwrap();
    assert_eq!(got, data);
    let mut before = [1u8; 1000];
    b.mr.read(0, &mut before).unwrap();
    assert!(before.iter().all(|&x| x == 0), "nothing written before the target range");
}

#[test]
fn rdma_read_fetches_the_peers_memory() {
    let (a, b) = rc_pair(16 * 1024);
    let data = pattern(10_000, 3);
    b.mr.write(0, &data).unwrap();
    let source = b.mr.remote(0..data.len()).unwrap();
    let sge = [a.mr.sge(100..100 + data.len()).unwrap()];
    a.qp.post_send(&[wr(9, SendOp::RdmaRead { remote_addr: source.addr, rkey: source.rkey }, &sge)]).unwrap();
    let wc = a.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.opcode, wc.byte_len), (9, WcStatus::Success, WcOpcode::RdmaRead, 10_000));
    let mut got = vec![0u8; data.len()];
    a.mr.read(100, &mut got).unwrap();
    assert_eq!(got, data);
}

#[test]
fn send_with_immediate_fills_a_posted_receive() {
    let (a, b) = rc_pair(8192);
    let rsge = [b.mr.sge(0..8192).unwrap()];
    b.qp.post_recv(&[RecvWr { wr_id: 77, sg_list: &rsge }]).unwrap();
    a.mr.write(0, b"ping over RoCEv2").unwrap();
    let sge = [a.mr.sge(0..16).unwrap()];
    a.qp.post_send(&[wr(5, SendOp::SendWithImm { imm: [1, 2, 3, 4] }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let wc = b.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.opcode, wc.byte_len), (77, WcStatus::Success, WcOpcode::Recv, 16));
    assert_eq!(wc.imm_data, Some([1, 2, 3, 4]));
    let mut got = [0u8; 16];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"ping over RoCEv2");
}

#[test]
fn atomics_fetch_add_and_compare_swap_on_the_peer() {
    let (a, b) = rc_pair(4096);
    b.mr.write(64, &40u64.to_ne_bytes()).unwrap();
    let word = b.mr.remote(64..72).unwrap();
    let rkey = word.rkey;
    let sge = [a.mr.sge(0..8).unwrap()];
    a.qp.post_send(&[wr(1, SendOp::FetchAdd { remote_addr: word.addr, rkey, add: 2 }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().opcode, WcOpcode::FetchAdd);
    assert_eq!(a.mr.read_u64(0).unwrap(), 40, "the value before the add comes back");
    assert_eq!(b.mr.read_u64(64).unwrap(), 42);
    let sge = [a.mr.sge(8..16).unwrap()];
    a.qp.post_send(&[wr(2, SendOp::CompareSwap { remote_addr: word.addr, rkey, compare: 42, swap: 7 }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    assert_eq!(a.mr.read_u64(8).unwrap(), 42);
    assert_eq!(b.mr.read_u64(64).unwrap(), 7);
}

/// One side of a WRITE ping-pong through memory, as `ib_write_lat` runs it: each round
/// writes its number into the peer's word and polls its own word with `Mr::read` until the
/// peer's answer lands. `first`: this side pings first. `cq_too`: it also polls its CQ
/// between reads (whose empty polls do the device's work in this thread); without it, it
/// calls no other verb while it waits. Every WRITE is signaled; the completions are taken
/// as they come and must all be successes.
fn write_pingpong_polling_memory(side: &Side, peer: RemoteMr, rounds: u64, first: bool, cq_too: bool) {
    let until = std::time::Instant::now() + WAIT * 3;
    let mut completed = 0;
    let reap = |completed: &mut u64| {
        while let Some(wc) = side.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            *completed += 1;
        }
    };
    let write = |n: u64| {
        side.mr.write(8, &n.to_ne_bytes()).unwrap();
        let sge = [side.mr.sge(8..16).unwrap()];
        let op = SendOp::RdmaWrite { remote_addr: peer.addr, rkey: peer.rkey };
        side.qp.post_send(&[wr(n, op, &sge)]).unwrap();
    };
    for n in 1..=rounds {
        if first {
            write(n);
        }
        while side.mr.read_u64(0).unwrap() != n {
            assert!(std::time::Instant::now() < until, "round {n}: the peer's WRITE never landed");
            if cq_too {
                reap(&mut completed);
            }
        }
        if !first {
            write(n);
        }
        reap(&mut completed);
    }
    while completed < rounds {
        assert_eq!(side.cq.wait(WAIT).unwrap().status, WcStatus::Success);
        completed += 1;
    }
}

/// A WRITE ping-pong of `rounds` through memory between two new contexts; how long it took.
fn time_write_pingpong_polling_memory(rounds: u64, cq_too: bool) -> Duration {
    let (a, b) = rc_pair(4096);
    let (ta, tb) = (a.mr.remote(0..8).unwrap(), b.mr.remote(0..8).unwrap());
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| write_pingpong_polling_memory(&b, ta, rounds, false, cq_too));
        write_pingpong_polling_memory(&a, tb, rounds, true, cq_too);
    });
    let took = started.elapsed();
    assert_eq!((a.mr.read_u64(0).unwrap(), b.mr.read_u64(0).unwrap()), (rounds, rounds));
    took
}

#[test]
fn a_write_pingpong_polling_memory_with_mr_read_alone_is_as_quick_as_one_that_polls_its_cq() {
    // Each application thread takes its device's lock back at once, over and over, to read
    // its word: the progress thread, which waits for the same lock, may not get it for
    // milliseconds (the lock does not hand itself over in turn). A loop of reads with no
    // poll or post between receives itself, as a loop of empty CQ polls does; without
    // that, each round waited for the progress thread to win the lock: 3 000 rounds took
    // 5.5 s against 0.06 s (debug build), and under a loop of `Mr::with` a peer's retries
    // ran out.
    const ROUNDS: u64 = 3000;
    let with_cq = time_write_pingpong_polling_memory(ROUNDS, true);
    let alone = time_write_pingpong_polling_memory(ROUNDS, false);
    eprintln!("{ROUNDS} rounds: {alone:?} with reads alone, {with_cq:?} with the CQ polled between");
    // Far from a measurement: the gap this guards against is a hundredfold.
    assert!(
        alone < with_cq * 10 + Duration::from_millis(100),
        "reads alone took {alone:?}, against {with_cq:?} for reads and CQ polls: the reads wait for the progress thread"
    );
}

#[test]
fn passive_target_completes_while_its_application_sleeps() {
    // The target's thread only sleeps; its progress thread must answer WRITEs and READs.
    let (a, b) = rc_pair(4096);
    let b_mem = b.mr.remote(0..4096).unwrap();
    let sleeper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        b // keep the target alive while it sleeps
    });
    std::thread::sleep(Duration::from_millis(50)); // let b's progress thread go idle
    for round in 0..20u64 {
        a.mr.write(0, &round.to_ne_bytes()).unwrap();
        let sge = [a.mr.sge(0..8).unwrap()];
        let op = SendOp::RdmaWrite { remote_addr: b_mem.addr + round * 8, rkey: b_mem.rkey };
        a.qp.post_send(&[wr(round, op, &sge)]).unwrap();
        assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    }
    let sge = [a.mr.sge(1024..1024 + 160).unwrap()];
    a.qp.post_send(&[wr(99, SendOp::RdmaRead { remote_addr: b_mem.addr, rkey: b_mem.rkey }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let mut got = [0u8; 160];
    a.mr.read(1024, &mut got).unwrap();
    for round in 0..20usize {
        assert_eq!(u64::from_ne_bytes(got[round * 8..round * 8 + 8].try_into().unwrap()), round as u64);
    }
    assert!(!sleeper.is_finished(), "the target was asleep the whole time");
    drop(sleeper.join().unwrap());
}

#[test]
fn write_to_a_deregistered_region_fails_remotely_and_changes_nothing() {
    let (a, b) = rc_pair(4096);
    let keep = b.pd.reg_mr(4096, Access::ALL).unwrap();
    let gone = b.pd.reg_mr(4096, Access::ALL).unwrap();
    let target = gone.remote(0..8).unwrap();
    drop(gone);
    a.mr.write(0, &[0xee; 8]).unwrap();
    let sge = [a.mr.sge(0..8).unwrap()];
    a.qp.post_send(&[wr(1, SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::RemAccessErr);
    let mut other = vec![1u8; 4096];
    keep.read(0, &mut other).unwrap();
    assert!(other.iter().all(|&x| x == 0));
}

#[test]
fn completion_channel_wakes_a_blocked_waiter() {
    let port = test_port();
    let a = open([127, 0, 0, 1], port);
    let b = open([127, 0, 0, 2], port);
    let ch = b.create_comp_channel().unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let cqa = a.create_cq(16, None).unwrap();
    let cqb = b.create_cq(16, Some(&ch)).unwrap();
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &cqa)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cqb)).unwrap();
    qa.connect(1, &qb.endpoint(0, 2).unwrap(), &ConnectOptions::default()).unwrap();
    qb.connect(2, &qa.endpoint(0, 1).unwrap(), &ConnectOptions::default()).unwrap();
    let (ma, mb) = (pa.reg_mr(64, Access::ALL).unwrap(), pb.reg_mr(64, Access::ALL).unwrap());
    let rsge = [mb.sge(0..64).unwrap()];
    qb.post_recv(&[RecvWr { wr_id: 3, sg_list: &rsge }]).unwrap();
    cqb.req_notify(false).unwrap();
    assert!(ch.get_cq_event(Some(Duration::from_millis(50))).unwrap().is_none(), "no event before the send");
    let waiter = std::thread::spawn(move || {
        let cq = ch.get_cq_event(Some(WAIT)).unwrap().expect("an event");
        cq.poll_one().expect("a completion after the event")
    });
    std::thread::sleep(Duration::from_millis(20));
    let sge = [ma.sge(0..10).unwrap()];
    qa.post_send(&[wr(1, SendOp::Send, &sge)]).unwrap();
    let wc = waiter.join().unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (3, WcStatus::Success, 10));
}

/// A receiver that takes a SEND in its own poll, as `rdma_get_recv_comp` does (poll,
/// `req_notify`, poll, then sleep on the channel), and then makes no call, still ACKs it at
/// once: the ACK its poll queued waits for its next call only while the progress thread
/// sends it within a millisecond anyway. It waited for the next datagram: here the sender's
/// retransmission, 4.3 s later (ACK timeout 20). The race (the datagram lands between
/// `req_notify`, which hands the sockets back to the progress thread, and the poll that
/// follows) is run a hundred times.
#[test]
fn a_send_the_receivers_poll_takes_is_acked_though_the_receiver_then_makes_no_call() {
    let port = test_port();
    let side = |ip: [u8; 4], channel: bool| {
        let ctx = open(ip, port);
        let pd = ctx.alloc_pd().unwrap();
        let ch = channel.then(|| ctx.create_comp_channel().unwrap());
        let cq = ctx.create_cq(64, ch.as_ref()).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
        let mr = pd.reg_mr(4096, Access::ALL).unwrap();
        (Side { ctx, pd, cq, qp, mr }, ch)
    };
    let ((a, _), (b, channel)) = (side([127, 0, 0, 1], false), side([127, 0, 0, 1], true));
    let channel = channel.unwrap();
    let (ea, eb) = (a.qp.endpoint(0, 100).unwrap(), b.qp.endpoint(0, 200).unwrap());
    // 4.096 µs × 2^20 = 4.3 s: only the receiver's ACK completes the SEND in time.
    let opts = ConnectOptions { timeout: 20, ..ConnectOptions::default() };
    a.qp.connect(100, &eb, &opts).unwrap();
    b.qp.connect(200, &ea, &opts).unwrap();
    let sge = [a.mr.sge(0..64).unwrap()];
    let rsge = [b.mr.sge(0..64).unwrap()];
    for i in 0..100u64 {
        b.qp.post_recv(&[RecvWr { wr_id: i, sg_list: &rsge }]).unwrap();
        std::thread::scope(|s| {
            // rdma_get_recv_comp, then no call until the next round.
            let receiver = s.spawn(|| {
                loop {
                    if let Some(wc) = b.cq.poll_one() {
                        return wc;
                    }
                    b.cq.req_notify(false).unwrap();
                    if let Some(wc) = b.cq.poll_one() {
                        return wc;
                    }
                    channel.get_cq_event(Some(WAIT)).unwrap();
                }
            });
            std::thread::sleep(Duration::from_micros(i % 7 * 30));
            a.qp.post_send(&[wr(i, SendOp::Send, &sge)]).unwrap();
            let wc = a.cq.wait(Duration::from_secs(1)).unwrap_or_else(|e| panic!("round {i}: the SEND: {e}"));
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
            assert_eq!(receiver.join().unwrap().wr_id, i);
        });
    }
}

/// An event-driven ping-pong (each side arms its CQ, polls once more, then sleeps in
/// `get_cq_event`, as `rdma_get_recv_comp` and perftest's `-e` do): a side whose waits may
/// poll first ([`ContextOptions::wait_spin`]) finds its events while polling once its
/// window has opened, and one that may not sleeps for every one. The cap is a second, so
/// that no wait on a loaded machine is long enough to close the window again: the window
/// starts at 10 µs and doubles at each wait it did not cover, so at most a few dozen of
/// the waits sleep.
#[test]
fn an_event_driven_ping_pong_finds_its_events_while_polling_and_sleeps_where_told_not_to_poll() {
    const ROUNDS: u64 = 300;
    let port = test_port();
    let options = |wait_spin| ContextOptions { port, wait_spin, ..ContextOptions::default() };
    let ((a, cha), (b, chb)) = channel_pair([options(Duration::from_secs(1)), options(Duration::ZERO)]);
    let play = |me: &Side, ch: &CompChannel, serve: bool| {
        let sge = [me.mr.sge(0..8).unwrap()];
        let rsge = [me.mr.sge(64..128).unwrap()];
        for k in 0..16 {
            me.qp.post_recv(&[RecvWr { wr_id: k, sg_list: &rsge }]).unwrap();
        }
        // Polls; when empty, arms the CQ and polls again; when still empty, sleeps.
        let next = || {
            me.cq.poll_one().or_else(|| {
                me.cq.req_notify(false).unwrap();
                me.cq.poll_one()
            })
        };
        let receive = || loop {
            match next() {
                Some(wc) if wc.opcode == WcOpcode::Recv => return wc,
                Some(wc) => assert_eq!(wc.status, WcStatus::Success, "{wc:?}"),
                None => {
                    ch.get_cq_event(Some(WAIT)).unwrap().expect("an event before the timeout");
                }
            }
        };
        for i in 0..ROUNDS {
            if serve {
                let wc = receive();
                me.qp.post_recv(&[RecvWr { wr_id: wc.wr_id, sg_list: &rsge }]).unwrap();
            }
            me.qp.post_send(&[wr(i, SendOp::Send, &sge)]).unwrap();
            if !serve {
                let wc = receive();
                assert_eq!(wc.status, WcStatus::Success);
                me.qp.post_recv(&[RecvWr { wr_id: wc.wr_id, sg_list: &rsge }]).unwrap();
            }
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| play(&b, &chb, true));
        play(&a, &cha, false);
    });
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    let waits = |c: &Counters| c.channel_waits_polled + c.channel_waits_slept;
    assert!(waits(&ca) > 0 && waits(&cb) > 0, "both sides waited on their channel: {ca:?} {cb:?}");
    assert!(
        ca.channel_waits_slept <= 40 && ca.channel_waits_polled >= waits(&ca) / 2,
        "the side that may poll slept {} times and polled {} times",
        ca.channel_waits_slept,
        ca.channel_waits_polled
    );
    assert_eq!(cb.channel_waits_polled, 0, "the side that may not poll polled");
}

/// This process's resident memory, from `/proc/self/status` (`VmRSS`, in kB).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("a VmRSS line");
    let kb: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS in kB");
    kb * 1024
}

#[test]
fn a_large_region_costs_memory_only_where_it_is_written() {
    const GIB: usize = 1 << 30;
    let before = resident_bytes();
    let (a, b) = rc_pair(GIB);
    let grown = resident_bytes().saturating_sub(before);
    // Two 1 GiB regions registered; other tests of this binary run beside this one and
    // allocate a few MiB at most.
    assert!(grown < 256 << 20, "registering 2 × 1 GiB made {} MiB resident", grown >> 20);
    // Usable to its last byte: a WRITE into the end of the peer's region lands.
    let data = pattern(40_000, 11);
    a.mr.write(0, &data).unwrap();
    let target = b.mr.remote(GIB - data.len()..GIB).unwrap();
    let sge = [a.mr.sge(0..data.len()).unwrap()];
    a.qp.post_send(&[wr(5, SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let mut got = vec![0u8; data.len()];
    b.mr.read(GIB - data.len(), &mut got).unwrap();
    assert_eq!(got, data);
    let mut untouched = [1u8; 4096];
    b.mr.read(GIB / 2, &mut untouched).unwrap();
    assert!(untouched.iter().all(|&x| x == 0), "a fresh region reads as zeroes");
}

#[test]
fn memory_windows_bind_rebind_invalidate_and_a_dropped_region_takes_its_windows_along() {
    let (a, b) = rc_pair(4096);
    let region = b.pd.reg_mr(8192, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let one = b.pd.alloc_mw(MwType::Type1).unwrap();
    let two = b.pd.alloc_mw(MwType::Type2).unwrap();
    assert_eq!((one.mw_type(), two.mw_type()), (MwType::Type1, MwType::Type2));
    assert!(one.remote().is_none() && two.binding().is_none(), "bound to nothing yet");
    let before = two.rkey();
    let k1 = b.qp.bind_mw(1, &one, &region, 0..100, Access::REMOTE_READ, SendFlags::SIGNALED).unwrap();
    let k2 = b.qp.bind_mw(2, &two, &region, 4096..4196, Access::REMOTE_WRITE, SendFlags::SIGNALED).unwrap();
    let wcs = b.cq.wait_n(2, WAIT).unwrap();
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::BindMw), "{wcs:?}");
    assert_eq!((two.rkey(), k2), (inc_rkey(before), inc_rkey(before)));
    let binding = two.binding().unwrap();
    assert_eq!(
        (binding.addr, binding.length, binding.qp),
        (region.addr() + 4096, 100, Some(Qpn::new(b.qp.qpn()).unwrap()))
    );

    // A writes through the type 2 window; reads through the type 1.
    a.mr.write(0, &pattern(100, 5)).unwrap();
    let sge = [a.mr.sge(0..100).unwrap()];
    let w = two.remote().unwrap();
    a.qp.post_send(&[wr(3, SendOp::RdmaWrite { remote_addr: w.addr, rkey: w.rkey }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let mut got = vec![0u8; 100];
    region.read(4096, &mut got).unwrap();
    assert_eq!(got, pattern(100, 5));
    let r = one.remote().unwrap();
    a.qp.post_send(&[wr(4, SendOp::RdmaRead { remote_addr: r.addr, rkey: k1 }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);

    // A type 2 window is freed by a LOCAL_INV and bound again with the next key.
    b.qp.invalidate(5, k2, SendFlags::SIGNALED).unwrap();
    assert_eq!(b.cq.wait(WAIT).unwrap().opcode, WcOpcode::LocalInv);
    assert!(two.binding().is_none());
    let k3 = b.qp.bind_mw(6, &two, &region, 0..8, Access::REMOTE_WRITE, SendFlags::SIGNALED).unwrap();
    assert_eq!(b.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    assert_eq!(k3, inc_rkey(k2));

    // Dropping the region unbinds both windows before its memory goes: the next access
    // through either is refused.
    drop(region);
    assert!(one.binding().is_none() && two.binding().is_none());
    a.qp.post_send(&[wr(7, SendOp::RdmaWrite { remote_addr: 0, rkey: k3 }, &sge[..])]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::RemAccessErr);
    drop((one, two)); // deallocated
}

/// On the sockets, a packet's payload of 1 KiB and up leaves from where the application
/// keeps it: the kernel gathers it with the headers (`iovec`s), and the ICRC is computed
/// over it there, one copy fewer. A WRITE and a SEND whose SGEs are above and below that
/// size and cross packet boundaries land byte for byte, and so does a READ (whose answer
/// the responder copies: its region may change under it).
#[test]
fn payloads_gathered_from_application_memory_cross_the_sockets_byte_for_byte() {
    let sockets = ContextOptions { same_host: false, ..ContextOptions::default() };
    let (a, b) = pair_with(QpType::Rc, 64 * 1024, [sockets.clone(), sockets]);
    let data = pattern(20_000, 11);
    a.mr.write(0, &data).unwrap();
    // 3000 + 700 + 9000 + 300 bytes: packets of 4096 cut through the first, third and
    // fourth SGE; the second and fourth are copied, the others gathered.
    let cuts = [0, 3000, 3700, 12_700, 13_000];
    let sges: Vec<Sge> = cuts.windows(2).map(|w| a.mr.sge(w[0]..w[1]).unwrap()).collect();
    let target = b.mr.remote(2000..2000 + 13_000).unwrap();
    a.qp.post_send(&[wr(1, SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey }, &sges)]).unwrap();
    let wc = a.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    let mut got = vec![0u8; 13_000];
    b.mr.read(2000, &mut got).unwrap();
    assert_eq!(got, data[..13_000], "the WRITE");

    let rsge = [b.mr.sge(20_000..40_000).unwrap()];
    b.qp.post_recv(&[RecvWr { wr_id: 2, sg_list: &rsge }]).unwrap();
    a.qp.post_send(&[wr(3, SendOp::Send, &sges)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let wc = b.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (2, WcStatus::Success, 13_000));
    b.mr.read(20_000, &mut got).unwrap();
    assert_eq!(got, data[..13_000], "the SEND");

    let back = pattern(10_000, 5);
    b.mr.write(50_000, &back).unwrap();
    let source = b.mr.remote(50_000..60_000).unwrap();
    let lsge = [a.mr.sge(30_000..40_000).unwrap()];
    a.qp.post_send(&[wr(4, SendOp::RdmaRead { remote_addr: source.addr, rkey: source.rkey }, &lsge)]).unwrap();
    let wc = a.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (4, WcStatus::Success, 10_000));
    let mut read = vec![0u8; 10_000];
    a.mr.read(30_000, &mut read).unwrap();
    assert_eq!(read, back, "the READ");
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    assert_eq!((ca.same_host_sent, cb.same_host_sent), (0, 0), "every packet on the sockets");
    assert_eq!(ca.send_errors + cb.send_errors, 0);
}

/// While an application polls and nothing arrives, its device asks the socket that last
/// brought datagrams on every pass and its other sockets every 20 µs (one `recvmmsg` per
/// empty pass, not one per socket). A datagram on another socket is still taken, by the
/// application's own polls (the progress thread leaves the sockets to a polling
/// application): here an IPv6 QP's SEND, after an IPv4 ping-pong made the IPv4 socket the
/// one asked on every pass.
#[test]
fn a_polling_application_takes_datagrams_on_its_quiet_socket_too() {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let port = test_port();
    let side = || {
        let addresses = vec![IpAddr::from(Ipv4Addr::LOCALHOST), IpAddr::from(Ipv6Addr::LOCALHOST)];
        let options = ContextOptions { port, same_host: false, ..ContextOptions::default() };
        let ctx = Device::with_addresses("lo", addresses).open_with(&options).expect("open a loopback device");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let qps: Vec<Qp> = (0..2).map(|_| pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap()).collect();
        let mr = pd.reg_mr(4096, Access::ALL).unwrap();
        (ctx, pd, cq, qps, mr)
    };
    let (a, b) = (side(), side());
    // QP 0 of each over GID 0 (127.0.0.1), QP 1 over GID 1 (::1).
    for (gid, qp) in [(0u8, 0usize), (1, 1)] {
        let opts = ConnectOptions { timeout: 10, sgid_index: gid, ..ConnectOptions::default() };
        let (ea, eb) = (a.3[qp].endpoint(gid, 100).unwrap(), b.3[qp].endpoint(gid, 200).unwrap());
        a.3[qp].connect(100, &eb, &opts).unwrap();
        b.3[qp].connect(200, &ea, &opts).unwrap();
    }
    // Polls `cq` (never sleeping, as a latency loop does) until one completion, for WAIT
    // at most.
    let spin = |cq: &Cq| {
        let until = std::time::Instant::now() + WAIT;
        loop {
            if let Some(wc) = cq.poll_one() {
                return wc;
            }
            assert!(std::time::Instant::now() < until, "no completion within {WAIT:?} of polling");
        }
    };
    let (asge, bsge) = ([a.4.sge(0..8).unwrap()], [b.4.sge(0..8).unwrap()]);
    let send = |qp: &Qp, sge: &[Sge; 1], id| qp.post_send(&[wr(id, SendOp::Send, sge)]).unwrap();
    let recv = |qp: &Qp, sge: &[Sge; 1], id| qp.post_recv(&[RecvWr { wr_id: id, sg_list: sge }]).unwrap();
    // An IPv4 ping-pong, polled: each side's IPv4 socket is the one that last brought
    // datagrams, and every wait for an answer is quiet (far more than 64 empty passes).
    for round in 0..200 {
        recv(&b.3[0], &bsge, round);
        recv(&a.3[0], &asge, round);
        send(&a.3[0], &asge, round);
        let mut got = [false; 2]; // b: the ping received, and the answer's send completed
        while !got[0] {
            let wc = spin(&b.2);
            assert_eq!(wc.status, WcStatus::Success);
            got[0] |= wc.opcode == WcOpcode::Recv;
        }
        send(&b.3[0], &bsge, round);
        let mut answered = false;
        while !answered {
            let wc = spin(&a.2);
            assert_eq!(wc.status, WcStatus::Success);
            answered |= wc.opcode == WcOpcode::Recv;
        }
        while !got[1] {
            got[1] |= spin(&b.2).opcode == WcOpcode::Send;
        }
    }
    // Drain the pings' send completions on a.
    while a.2.poll_one().is_some() {}
    // Now a SEND over IPv6: only b's polls can take it from its IPv6 socket.
    recv(&b.3[1], &bsge, 1000);
    send(&a.3[1], &asge, 1000);
    let wc = spin(&b.2);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.qp_num.value()),
        (1000, WcStatus::Success, WcOpcode::Recv, b.3[1].qpn())
    );
    assert_eq!(spin(&a.2).wr_id, 1000, "the IPv6 SEND completes at the sender");
}

/// Over the sockets a peer answers a message and acknowledges it in one GSO datagram, the
/// answer first (`TxQueue::pair_answers`). A poll that takes the answer returns it at once
/// and leaves the ACK after it for its next call: the ACK's work is off the answer's path.
/// Nothing is lost so: every signaled SEND of both sides completes, in order; and an ACK
/// left while the application makes no further call is taken by the progress thread
/// (within `APP_POLL_WINDOW`, 1 ms), with nobody polling.
#[test]
fn a_poll_returns_its_answer_and_leaves_the_ack_that_came_with_it_for_the_next_call() {
    let sockets = ContextOptions { same_host: false, ..ContextOptions::default() };
    let (a, b) = pair_with(QpType::Rc, 4096, [sockets.clone(), sockets]);
    let spin = spin_for_success;
    let (asge, bsge) = ([a.mr.sge(0..8).unwrap()], [b.mr.sge(0..8).unwrap()]);
    let recv = |s: &Side, sge: &[Sge; 1], id| s.qp.post_recv(&[RecvWr { wr_id: id, sg_list: sge }]).unwrap();
    let send = |s: &Side, sge: &[Sge; 1], id| s.qp.post_send(&[wr(id, SendOp::Send, sge)]).unwrap();
    // a pings, b takes the ping and answers at once (its ACK of the ping goes with the
    // answer). b's SENDs complete with a's next ping (their ACKs come with it): `b_sent`
    // collects them as they come.
    let ping_pong = |r: u64, b_sent: &mut Vec<u64>| {
        recv(&b, &bsge, r);
        recv(&a, &asge, r);
        send(&a, &asge, r);
        loop {
            let wc = spin(&b.cq);
            if wc.opcode == WcOpcode::Recv {
                assert_eq!(wc.wr_id, r);
                break;
            }
            b_sent.push(wc.wr_id);
        }
        send(&b, &bsge, r);
    };
    let mut b_sent = Vec::new();
    // One round: a waits for both its SEND's completion and the answer.
    let round = |r: u64, b_sent: &mut Vec<u64>| {
        ping_pong(r, b_sent);
        let first = spin(&a.cq);
        let second = spin(&a.cq);
        let mut got = [(first.opcode, first.wr_id), (second.opcode, second.wr_id)];
        got.sort_by_key(|&(op, _)| op == WcOpcode::Recv);
        assert_eq!(got, [(WcOpcode::Send, r), (WcOpcode::Recv, r)], "round {r}");
        first.opcode
    };
    const ROUNDS: u64 = 300;
    let mut answer_first = 0;
    for r in 0..ROUNDS {
        answer_first += u64::from(round(r, &mut b_sent) == WcOpcode::Recv);
    }
    let left = a.ctx.counters().acks_left_for_next_poll;
    // The answer comes with the ACK in most rounds (a progress pass of b's may send the
    // ACK alone first: 217-298 rounds of 300 quiet, 98-297 beside two busy loops): the poll
    // that took the answer returned it before the ACK was taken.
    assert!(left >= ROUNDS / 10, "only {left} of {ROUNDS} polls left an ACK for their next call");
    assert!(answer_first >= left, "{answer_first} answers came first, {left} ACKs were left");

    // The application makes no further call after the answer: the progress thread takes
    // the ACK it left. Rounds in which nothing was left are tried again, for up to WAIT: b
    // sends its ACK alone, before the answer, in runs of rounds while its progress thread
    // sleeps through its application's polls (up to 50 in a row beside two busy loops).
    let mut r = ROUNDS;
    let until = std::time::Instant::now() + WAIT;
    let taken_by_the_progress_thread =
        std::iter::from_fn(|| (std::time::Instant::now() < until).then_some(())).any(|()| {
            ping_pong(r, &mut b_sent);
            let before = a.ctx.counters();
            let wc = spin(&a.cq);
            let after = a.ctx.counters();
            r += 1;
            if wc.opcode != WcOpcode::Recv || after.acks_left_for_next_poll == before.acks_left_for_next_poll {
                // Take the round's other completion, and try again.
                let other = if wc.opcode == WcOpcode::Recv { WcOpcode::Send } else { WcOpcode::Recv };
                assert_eq!(spin(&a.cq).opcode, other);
                return false;
            }
            // The poll took one packet of the answer's datagram (the answer), the progress
            // thread takes the other (the ACK), before `after` was read or after.
            let until = std::time::Instant::now() + Duration::from_millis(100);
            while a.ctx.counters().engine.rcvd_packets < before.engine.rcvd_packets + 2 {
                assert!(std::time::Instant::now() < until, "the ACK left by the last poll was never taken");
                std::thread::sleep(Duration::from_micros(100));
            }
            let wc = spin(&a.cq);
            assert_eq!((wc.opcode, wc.wr_id), (WcOpcode::Send, r - 1));
            true
        });
    assert!(taken_by_the_progress_thread, "no poll left an ACK in {WAIT:?} of rounds");
    // b's answers all completed too (the last ones with a's last pings, or their own ACKs).
    while (b_sent.len() as u64) < r {
        let wc = spin(&b.cq);
        assert_eq!(wc.opcode, WcOpcode::Send);
        b_sent.push(wc.wr_id);
    }
    assert_eq!(b_sent, (0..r).collect::<Vec<_>>());
}

/// Through the same-host inbox a side takes its peer's packets in the order the peer made
/// them, as from a NIC: the ACK of a SEND before the answer to it. A program that binds
/// its send and receive CQs to one completion channel sees the two events in that order;
/// Debian's `ib_send_lat -e` does so, takes one event, arms the CQ it names and polls the
/// CQ it expects once, and stalled when the events came the other way round (the ACK put
/// in the inbox after the answer; docs/architecture.md, "The answer first, its ACK's work
/// after").
#[test]
fn one_channel_for_both_cqs_gets_the_send_event_before_the_answers() {
    let port = test_port();
    let [a, b] = [0, 1].map(|_| {
        let device = Device::with_addresses("lo", vec![std::net::IpAddr::from([127, 0, 0, 1])]);
        let ctx = device.open_with(&ContextOptions { port, ..ContextOptions::default() }).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let ch = ctx.create_comp_channel().unwrap();
        let (send_cq, recv_cq) = (ctx.create_cq(16, Some(&ch)).unwrap(), ctx.create_cq(16, Some(&ch)).unwrap());
        let mut init = QpInit::new(QpType::Rc, &send_cq);
        init.recv_cq = &recv_cq;
        let qp = pd.create_qp(&init).unwrap();
        let mr = pd.reg_mr(4096, Access::ALL).unwrap();
        (ctx, pd, ch, send_cq, recv_cq, qp, mr)
    });
    let (ea, eb) = (a.5.endpoint(0, 100).unwrap(), b.5.endpoint(0, 200).unwrap());
    a.5.connect(100, &eb, &ConnectOptions::default()).unwrap();
    b.5.connect(200, &ea, &ConnectOptions::default()).unwrap();
    let (asge, bsge) = ([a.6.sge(0..8).unwrap()], [b.6.sge(0..8).unwrap()]);
    a.3.req_notify(false).unwrap();
    a.4.req_notify(false).unwrap();
    for round in 0..20 {
        a.5.post_recv(&[RecvWr { wr_id: round, sg_list: &asge }]).unwrap();
        b.5.post_recv(&[RecvWr { wr_id: round, sg_list: &bsge }]).unwrap();
        a.5.post_send(&[wr(round, SendOp::Send, &asge)]).unwrap();
        // B answers as soon as the ping is there; its ACK of the ping is still to go.
        assert_eq!(spin_for_success(&b.4).opcode, WcOpcode::Recv);
        b.5.post_send(&[wr(round, SendOp::Send, &bsge)]).unwrap();
        let mut order = Vec::new();
        for _ in 0..2 {
            let cq = a.2.get_cq_event(Some(WAIT)).unwrap().expect("an event within WAIT");
            cq.req_notify(false).unwrap();
            let wc = cq.poll_one().expect("the completion the event was for");
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            order.push(wc.opcode);
        }
        assert_eq!(order, [WcOpcode::Send, WcOpcode::Recv], "round {round}: the events' order");
        assert_eq!(spin_for_success(&b.3).opcode, WcOpcode::Send);
    }
    assert!(a.0.counters().same_host_rcvd > 0, "the packets took the same-host path");
}

/// A poll that returned its answer and left the ACK after it (as in the test above), then
/// a wait on the completion channel for the SEND's completion that ACK brings, by a side
/// whose waits may not poll first (`wait_spin` zero, as a program that sleeps at once):
/// the wait takes what the poll left before it sleeps, and finds its event there. (It slept
/// until the progress thread's next look, up to APP_POLL_WINDOW, for an event that was
/// already in the device.)
#[test]
fn a_wait_on_the_channel_takes_the_ack_a_poll_left_before_it_sleeps() {
    let port = test_port();
    let options = |wait_spin| ContextOptions { port, wait_spin, same_host: false, ..ContextOptions::default() };
    let ((a, ch), (b, _)) = channel_pair([options(Duration::ZERO), options(Duration::from_micros(50))]);
    let spin = spin_for_success;
    let (asge, bsge) = ([a.mr.sge(0..8).unwrap()], [b.mr.sge(0..8).unwrap()]);
    const WANTED: u32 = 20;
    let (mut waits, mut b_sent, mut slept) = (0, 0, 0);
    let until = std::time::Instant::now() + WAIT;
    let mut r = 0;
    while waits < WANTED {
        assert!(std::time::Instant::now() < until, "only {waits} of {r} polls left an ACK in {WAIT:?}");
        b.qp.post_recv(&[RecvWr { wr_id: r, sg_list: &bsge }]).unwrap();
        a.qp.post_recv(&[RecvWr { wr_id: r, sg_list: &asge }]).unwrap();
        a.qp.post_send(&[wr(r, SendOp::Send, &asge)]).unwrap();
        loop {
            let wc = spin(&b.cq);
            if wc.opcode == WcOpcode::Recv {
                break;
            }
            b_sent += 1;
        }
        b.qp.post_send(&[wr(r, SendOp::Send, &bsge)]).unwrap();
        let before = a.ctx.counters();
        let wc = spin(&a.cq);
        let after = a.ctx.counters();
        if wc.opcode != WcOpcode::Recv || after.acks_left_for_next_poll == before.acks_left_for_next_poll {
            let other = if wc.opcode == WcOpcode::Recv { WcOpcode::Send } else { WcOpcode::Recv };
            assert_eq!(spin(&a.cq).opcode, other);
        } else {
            // The progress thread may take what the poll left before the CQ is armed (the
            // first arm of a run gives it the sockets back): the completion then raises no
            // event, and the round tells nothing. Once armed with the ACK not yet taken, the
            // event comes, whoever takes it. (The poll took one packet of the answer's
            // datagram, the answer; the ACK is the other.)
            let untaken = |c: &Counters| c.engine.rcvd_packets < before.engine.rcvd_packets + 2;
            a.cq.req_notify(false).unwrap();
            if !untaken(&a.ctx.counters()) {
                // Taken before the wait: drain the event if it came after the arm.
                let _ = ch.get_cq_event(Some(Duration::from_millis(20))).unwrap();
                let wc = spin(&a.cq);
                assert_eq!((wc.opcode, wc.wr_id), (WcOpcode::Send, r));
                r += 1;
                continue;
            }
            ch.get_cq_event(Some(WAIT)).unwrap().expect("the SEND's completion's event");
            slept += a.ctx.counters().channel_waits_slept - after.channel_waits_slept;
            let wc = spin(&a.cq);
            assert_eq!((wc.opcode, wc.wr_id), (WcOpcode::Send, r));
            waits += 1;
        }
        r += 1;
    }
    // Each of those waits found its event in what the poll left, but for the rare one whose
    // ACK the progress thread took between the test's look and the wait (then the event
    // was on the channel already, and a wait that may not spin counts as one that slept).
    // Without the wait taking what was left first, all of them slept.
    assert!(
        slept <= u64::from(WANTED) / 10,
        "{slept} of {WANTED} waits slept, though their event was in what the last poll left"
    );
    while b_sent < r {
        assert_eq!(spin(&b.cq).opcode, WcOpcode::Send);
        b_sent += 1;
    }
}
