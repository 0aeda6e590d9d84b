//! The CM and the engine together in a `Nic`, on a virtual clock: rdma_cm connections as
//! librdmacm programs make them (the NIC driving each ID's QP), set up, used and torn down
//! over a simulated network that loses, duplicates and reorders their MADs.

mod nic_common;

use std::time::Duration;

use nic_common::*;
use softrdma_cm::CmEventKind::*;
use softrdma_cm::CmStatus;
use softrdma_engine::{AsyncEvent, QpState, WcStatus};
use softrdma_sim::{Match, Verdict, seed_from_env_or};
use softrdma_wire::Qpn;

/// The outcome of a connection, each side: A's ID and QP, B's ID and QP.
struct Conn {
    a_id: softrdma_cm::CmId,
    a_qp: Qpn,
    b_id: softrdma_cm::CmId,
    b_qp: Qpn,
}

/// A connects to B, B accepts, and the network settles.
fn connected(net: &mut Net) -> Conn {
    let (a_id, a_qp, b_id) = net.request(b"hello");
    let now = net.now();
    let b_qp = net.b().accept(now, b_id);
    net.settle();
    Conn { a_id, a_qp, b_id, b_qp }
}

fn drop_first(name: &'static str, n: u64) -> impl softrdma_sim::Rule {
    Match::new(move |d| mad_name(d) == Some(name), Verdict::Drop).times(n)
}

#[test]
fn a_connection_comes_up_with_both_qps_in_rts_and_one_established_each() {
    let mut net = Net::new(seed_from_env_or(1));
    let (a_id, a_qp, b_id) = net.request(b"hello");
    assert!(net.b().requests()[0].1.starts_with(b"hello"));
    assert_eq!(net.a().qp_state(a_qp), Some(QpState::Init), "attached: INIT until the REP");
    let now = net.now();
    let b_qp = net.b().accept(now, b_id);
    assert_eq!(net.b().qp_state(b_qp), Some(QpState::Rts), "rdma_accept: RTR and RTS before the REP");
    net.settle();
    // The CONNECT_RESPONSE is reported as ESTABLISHED, and the CM's own is not repeated.
    assert_eq!(net.a().kinds(a_id), [AddrResolved, RouteResolved, Established]);
    assert_eq!(net.b().kinds(b_id), [ConnectRequest, Established]);
    assert_eq!(net.a().qp_state(a_qp), Some(QpState::Rts));
    let (a, b) = (net.a().nic.engine().query_qp(a_qp).unwrap().0, net.b().nic.engine().query_qp(b_qp).unwrap().0);
    assert_eq!((a.dest_qp_num, b.dest_qp_num), (b_qp.value(), a_qp.value()));
    assert_eq!((a.sq_psn, b.sq_psn), (b.rq_psn, a.rq_psn), "each sends from the PSN the other expects");
}

#[test]
fn an_established_connection_carries_a_send_and_a_write_both_ways() {
    let mut net = Net::new(seed_from_env_or(2));
    let c = connected(&mut net);
    let (ka, kb) = (net.a().mr, net.b().mr);
    net.b().post_recv(c.b_qp, 1, 0, 64);
    net.a().post_recv(c.a_qp, 2, 0, 64);
    net.a().fill(0x1000, b"ping");
    net.a().post_send(c.a_qp, 10, 0x1000, 4);
    net.a().fill(0x2000, b"written by a");
    net.a().post_write(c.a_qp, 11, 0x2000, 12, &kb, 0x3000);
    net.b().fill(0x1000, b"pong");
    net.b().post_send(c.b_qp, 20, 0x1000, 4);
    net.b().fill(0x2000, b"written by b");
    net.b().post_write(c.b_qp, 21, 0x2000, 12, &ka, 0x3000);
    net.settle();
    let outcomes = |w: Vec<softrdma_engine::Wc>| {
        let mut o: Vec<_> = w.iter().map(|w| (w.wr_id, w.status)).collect();
        o.sort_by_key(|x| x.0);
        o
    };
    let ok = WcStatus::Success;
    assert_eq!(outcomes(net.a().poll_cq()), [(2, ok), (10, ok), (11, ok)]);
    assert_eq!(outcomes(net.b().poll_cq()), [(1, ok), (20, ok), (21, ok)]);
    assert_eq!(net.b().read(0, 4), b"ping");
    assert_eq!(net.a().read(0, 4), b"pong");
    assert_eq!(net.b().read(0x3000, 12), b"written by a");
    assert_eq!(net.a().read(0x3000, 12), b"written by b");
}

#[test]
fn a_rejected_connect_moves_the_qp_to_error_and_flushes_its_receives() {
    let mut net = Net::new(seed_from_env_or(3));
    let (a_id, a_qp, b_id) = net.request(b"hello");
    net.a().post_recv(a_qp, 7, 0, 64);
    let now = net.now();
    net.b().reject(now, b_id);
    net.settle();
    assert_eq!(net.a().kinds(a_id), [AddrResolved, RouteResolved, Rejected]);
    assert_eq!(net.a().qp_state(a_qp), Some(QpState::Err));
    let wcs = net.a().poll_cq();
    assert_eq!(wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), [(7, WcStatus::WrFlushErr)]);
    assert_eq!(net.b().kinds(b_id), [ConnectRequest]);
}

/// B gives up on a connection whose RTU never came (its ID destroyed while its REP waits):
/// its REJ finds A established, and A's rdma_cm reports REJECTED, its QP in ERR and what it
/// posted flushed, as cm.c and cma.c do; `rdma_disconnect` then has nothing to send.
#[test]
fn a_rej_that_finds_the_connection_established_flushes_the_qp() {
    let mut net = Net::new(seed_from_env_or(23));
    net.sim.add_rule(Match::new(|d| mad_name(d) == Some("RTU"), Verdict::Drop));
    let (a_id, a_qp, b_id) = net.request(b"hello");
    let now = net.now();
    net.b().accept(now, b_id);
    let a = net.a;
    net.sim
        .run_until_cond(Duration::from_secs(1), |s| s.node::<NicNode>(a).kinds(a_id).contains(&Established))
        .unwrap();
    net.a().post_recv(a_qp, 7, 0, 64);
    let now = net.now();
    net.b().destroy(now, b_id);
    net.settle();
    assert_eq!(net.a().kinds(a_id), [AddrResolved, RouteResolved, Established, Rejected]);
    assert_eq!(net.a().qp_state(a_qp), Some(QpState::Err));
    let wcs = net.a().poll_cq();
    assert_eq!(wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(), [(7, WcStatus::WrFlushErr)]);
    let now = net.now();
    assert!(net.a().disconnect(now, a_id).is_ok());
    net.settle();
    assert_eq!(net.a().kinds(a_id).len(), 4, "no TIMEWAIT_EXIT, nothing after the disconnect");
}

/// Disconnects from `first`'s side, the other answering `rdma_disconnect` when it hears of
/// it; both QPs end in ERR, both IDs see DISCONNECTED then TIMEWAIT_EXIT.
fn disconnect_from(a_first: bool) {
    let mut net = Net::new(seed_from_env_or(4));
    let c = connected(&mut net);
    let now = net.now();
    if a_first {
        net.a().disconnect(now, c.a_id).unwrap();
        assert_eq!(net.a().qp_state(c.a_qp), Some(QpState::Err), "ERR before the DREQ");
    } else {
        net.b().disconnect(now, c.b_id).unwrap();
        assert_eq!(net.b().qp_state(c.b_qp), Some(QpState::Err), "ERR before the DREQ");
    }
    net.run_for(Duration::from_micros(20));
    let (other, other_id, other_qp) = if a_first { (net.b(), c.b_id, c.b_qp) } else { (net.a(), c.a_id, c.a_qp) };
    assert_eq!(other.kinds(other_id).last(), Some(&Disconnected));
    assert_eq!(other.qp_state(other_qp), Some(QpState::Err), "librdmacm's ERR at DISCONNECTED");
    other.disconnect(now, other_id).unwrap(); // the DREP
    net.settle();
    assert_eq!(net.a().kinds(c.a_id), [AddrResolved, RouteResolved, Established, Disconnected, TimewaitExit]);
    assert_eq!(net.b().kinds(c.b_id), [ConnectRequest, Established, Disconnected, TimewaitExit]);
    assert!(net.nodes().iter().flat_map(|n| &n.events).all(|e| e.status == CmStatus::Ok));
}

#[test]
fn the_active_side_disconnects() {
    disconnect_from(true);
}

#[test]
fn the_passive_side_disconnects() {
    disconnect_from(false);
}

#[test]
fn both_sides_disconnect_at_once() {
    let mut net = Net::new(seed_from_env_or(5));
    let c = connected(&mut net);
    let now = net.now();
    net.a().disconnect(now, c.a_id).unwrap();
    net.b().disconnect(now, c.b_id).unwrap();
    net.settle();
    assert_eq!(net.a().kinds(c.a_id), [AddrResolved, RouteResolved, Established, Disconnected, TimewaitExit]);
    assert_eq!(net.b().kinds(c.b_id), [ConnectRequest, Established, Disconnected, TimewaitExit]);
    assert!(net.nodes().iter().flat_map(|n| &n.events).all(|e| e.status == CmStatus::Ok));
    assert_eq!((net.a().qp_state(c.a_qp), net.b().qp_state(c.b_qp)), (Some(QpState::Err), Some(QpState::Err)));
}

#[test]
fn a_peer_that_never_answers_the_drep_times_the_disconnect_out() {
    let mut net = Net::new(seed_from_env_or(6));
    let c = connected(&mut net);
    let now = net.now();
    net.a().disconnect(now, c.a_id).unwrap();
    net.settle(); // B heard, but its application never calls rdma_disconnect
    assert_eq!(net.b().kinds(c.b_id), [ConnectRequest, Established, Disconnected]);
    let a = net.a().events.iter().filter(|e| e.id == c.a_id).map(|e| (e.kind, e.status)).collect::<Vec<_>>();
    assert_eq!(a[3..], [(Disconnected, CmStatus::TimedOut), (TimewaitExit, CmStatus::Ok)]);
}

/// Connects with the first `n` MADs named `name` lost; both sides end established, once.
fn connect_losing(name: &'static str, n: u64, seed: u64) -> (Net, Conn) {
    let mut net = Net::new(seed_from_env_or(seed));
    net.sim.add_rule(drop_first(name, n));
    let c = connected(&mut net);
    assert_eq!(net.a().kinds(c.a_id), [AddrResolved, RouteResolved, Established], "{name} x{n} lost");
    assert_eq!(net.b().kinds(c.b_id), [ConnectRequest, Established], "{name} x{n} lost");
    assert_eq!((net.a().qp_state(c.a_qp), net.b().qp_state(c.b_qp)), (Some(QpState::Rts), Some(QpState::Rts)));
    (net, c)
}

#[test]
fn a_lost_req_rep_or_rtu_is_resent_and_the_connection_comes_up() {
    for (seed, name) in [(10, "REQ"), (11, "REP"), (12, "RTU")] {
        for n in 1..=MAX_RETRIES as u64 {
            let (net, _) = connect_losing(name, n, seed);
            // A loss costs a response timeout (4.2 ms) before a resend (a REP lost twice is
            // resent by B's timer and at once for the REQ that A's timer resends).
            assert!(net.now() >= softrdma_engine::Instant::ZERO + Duration::from_millis(4), "{name} x{n}");
        }
    }
}

#[test]
fn a_req_lost_every_time_ends_unreachable_and_leaves_the_qp_in_init() {
    let mut net = Net::new(seed_from_env_or(13));
    net.sim.add_rule(drop_first("REQ", u64::MAX));
    net.b().listen(PORT);
    let now = net.now();
    let (id, qpn) = net.a().connect(now, IP_B, PORT, b"x");
    net.settle();
    assert_eq!(net.a().kinds(id), [AddrResolved, RouteResolved, Unreachable]);
    assert_eq!(net.a().qp_state(qpn), Some(QpState::Init));
    assert!(net.b().requests().is_empty());
}

#[test]
fn data_that_overtakes_a_lost_rtu_lands_and_the_resent_rep_brings_the_rtu() {
    let mut net = Net::new(seed_from_env_or(14));
    net.sim.add_rule(drop_first("RTU", 1));
    let (a_id, a_qp, b_id) = net.request(b"hello");
    let now = net.now();
    let b_qp = net.b().accept(now, b_id);
    let a = net.a;
    net.sim
        .run_until_cond(Duration::from_secs(1), |s| s.node::<NicNode>(a).kinds(a_id).contains(&Established))
        .unwrap();
    net.b().post_recv(b_qp, 1, 0, 64);
    net.a().fill(0x1000, b"early");
    net.a().post_send(a_qp, 2, 0x1000, 5);
    net.run_for(Duration::from_millis(1));
    assert_eq!(net.b().read(0, 5), b"early", "B's QP is in RTS since the accept");
    assert_eq!(net.b().kinds(b_id), [ConnectRequest], "the RTU is still missing");
    net.settle();
    assert_eq!(net.b().kinds(b_id), [ConnectRequest, Established]);
    assert_eq!(net.a().kinds(a_id), [AddrResolved, RouteResolved, Established]);
}

#[test]
fn duplicated_mads_change_nothing() {
    let mut net = Net::new(seed_from_env_or(15));
    net.sim.add_rule(Match::new(|d| mad_name(d).is_some(), Verdict::Duplicate));
    let c = connected(&mut net);
    assert_eq!(net.a().kinds(c.a_id), [AddrResolved, RouteResolved, Established]);
    assert_eq!(net.b().kinds(c.b_id), [ConnectRequest, Established]);
    assert_eq!(net.b().requests().len(), 1, "a repeated REQ is not a new request");
    let now = net.now();
    net.a().disconnect(now, c.a_id).unwrap();
    net.run_for(Duration::from_micros(20));
    let now = net.now();
    net.b().disconnect(now, c.b_id).unwrap();
    net.settle();
    assert_eq!(net.a().kinds(c.a_id), [AddrResolved, RouteResolved, Established, Disconnected, TimewaitExit]);
    assert_eq!(net.b().kinds(c.b_id), [ConnectRequest, Established, Disconnected, TimewaitExit]);
}

#[test]
fn a_dreq_lost_is_resent() {
    let mut net = Net::new(seed_from_env_or(16));
    let c = connected(&mut net);
    net.sim.add_rule(drop_first("DREQ", 2));
    let now = net.now();
    net.a().disconnect(now, c.a_id).unwrap();
    let b = net.b;
    net.sim
        .run_until_cond(Duration::from_secs(1), |s| s.node::<NicNode>(b).kinds(c.b_id).contains(&Disconnected))
        .unwrap();
    assert!(net.now() >= now + Duration::from_millis(8), "two DREQs lost: the third arrives");
    let now = net.now();
    net.b().disconnect(now, c.b_id).unwrap();
    net.settle();
    assert_eq!(net.a().kinds(c.a_id), [AddrResolved, RouteResolved, Established, Disconnected, TimewaitExit]);
    assert!(net.a().events.iter().all(|e| e.status == CmStatus::Ok));
}

#[test]
fn a_dreq_that_overtakes_the_rtu_disconnects_the_passive_side_before_it_was_established() {
    // The RTU is held back 1 ms; A disconnects at once after establishing.
    let mut net = Net::new(seed_from_env_or(17));
    net.sim.add_rule(Match::new(|d| mad_name(d) == Some("RTU"), Verdict::Delay(Duration::from_millis(1))));
    let (a_id, a_qp, b_id) = net.request(b"hello");
    let now = net.now();
    let b_qp = net.b().accept(now, b_id);
    let a = net.a;
    net.sim
        .run_until_cond(Duration::from_secs(1), |s| s.node::<NicNode>(a).kinds(a_id).contains(&Established))
        .unwrap();
    let now = net.now();
    net.a().disconnect(now, a_id).unwrap();
    net.run_for(Duration::from_micros(100));
    // cm.c's cm_dreq_handler takes a DREQ in REP_SENT, and cma reports DISCONNECTED.
    assert_eq!(net.b().kinds(b_id), [ConnectRequest, Disconnected]);
    assert_eq!(net.b().qp_state(b_qp), Some(QpState::Err));
    let now = net.now();
    net.b().disconnect(now, b_id).unwrap();
    net.settle();
    assert_eq!(net.a().kinds(a_id), [AddrResolved, RouteResolved, Established, Disconnected, TimewaitExit]);
    assert_eq!(net.b().kinds(b_id), [ConnectRequest, Disconnected, TimewaitExit], "the late RTU is ignored");
    assert_eq!(net.a().qp_state(a_qp), Some(QpState::Err));
}

#[test]
fn a_peer_that_vanishes_mid_connect_leaves_the_passive_side_unreachable() {
    // B accepts, then A is cut off: B's REP is never answered.
    let mut net = Net::new(seed_from_env_or(18));
    let (_, _, b_id) = net.request(b"hello");
    net.sim.partition([IP_A], [IP_B]);
    let now = net.now();
    let b_qp = net.b().accept(now, b_id);
    net.settle();
    let b: Vec<_> = net.b().events.iter().filter(|e| e.id == b_id).map(|e| (e.kind, e.status)).collect();
    assert_eq!(b, [(ConnectRequest, CmStatus::Ok), (Unreachable, CmStatus::TimedOut)]);
    // librdmacm leaves the QP of an UNREACHABLE ID as it was; rdma_destroy_qp is next.
    assert_eq!(net.b().qp_state(b_qp), Some(QpState::Rts));
}

#[test]
fn a_peer_that_vanishes_mid_connection_fails_the_sends_and_times_the_disconnect_out() {
    let mut net = Net::new(seed_from_env_or(19));
    let c = connected(&mut net);
    net.sim.partition([IP_A], [IP_B]);
    net.a().fill(0x1000, b"lost");
    let kb = net.b().mr;
    net.a().post_write(c.a_qp, 1, 0x1000, 4, &kb, 0);
    net.a().post_write(c.a_qp, 2, 0x1000, 4, &kb, 0);
    net.settle();
    let wcs = net.a().poll_cq();
    let st: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(st, [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(net.a().qp_state(c.a_qp), Some(QpState::Err));
    let now = net.now();
    net.a().disconnect(now, c.a_id).unwrap();
    net.settle();
    let a: Vec<_> = net.a().events.iter().filter(|e| e.id == c.a_id).map(|e| (e.kind, e.status)).collect();
    assert_eq!(a[3..], [(Disconnected, CmStatus::TimedOut), (TimewaitExit, CmStatus::Ok)]);
    assert_eq!(net.b().kinds(c.b_id), [ConnectRequest, Established]);
    assert!(net.a().async_events.iter().all(|e| !matches!(e, AsyncEvent::CommEstablished(_))));
}

#[test]
fn destroying_every_id_and_qp_leaves_nothing() {
    let mut net = Net::new(seed_from_env_or(20));
    let c = connected(&mut net);
    let now = net.now();
    net.a().destroy(now, c.a_id); // a DREQ
    net.run_for(Duration::from_micros(20));
    let now = net.now();
    net.b().destroy(now, c.b_id); // the DREP
    let listeners: Vec<_> = net.b().nic.cm().ids();
    for l in listeners {
        net.b().destroy(now, l);
    }
    net.settle();
    for n in net.nodes() {
        assert_eq!(n.nic.cm().id_count(), 0);
        assert_eq!(n.nic.engine().qp_count(), 0);
    }
    assert_eq!(net.a().kinds(c.a_id), [AddrResolved, RouteResolved, Established]);
}

#[test]
fn a_lost_rej_is_sent_again_for_the_repeated_req() {
    // Found by the swarm: the passive side kept no REJ, so the active side waited out every
    // REQ retry (69 s after an MRA) and reported UNREACHABLE instead of REJECTED.
    let mut net = Net::new(seed_from_env_or(21));
    net.sim.add_rule(drop_first("REJ", 1));
    let (a_id, a_qp, b_id) = net.request(b"hello");
    let now = net.now();
    net.b().reject(now, b_id);
    net.settle();
    assert_eq!(net.a().kinds(a_id), [AddrResolved, RouteResolved, Rejected]);
    assert!(net.now() < now + Duration::from_millis(5), "at the REQ's first resend");
    assert_eq!(net.a().qp_state(a_qp), Some(QpState::Err));
    assert_eq!(net.b().requests().len(), 1, "the repeated REQ is no new request");
}

#[test]
fn a_repeated_req_after_a_lost_rej_and_an_mra_still_ends_rejected() {
    // The REQ arrives twice before the application rejects: the second gets rdma_cm's MRA
    // (service timeout 2^24 · 4.096 µs ≈ 69 s), and the REJ is lost. The REQ's next resend
    // comes after the MRA's wait, and gets the REJ again.
    let mut net = Net::new(seed_from_env_or(22));
    net.sim.add_rule(Match::new(|d| mad_name(d) == Some("REQ"), Verdict::Duplicate).times(1));
    net.sim.add_rule(drop_first("REJ", 1));
    let (a_id, _, b_id) = net.request(b"hello");
    net.run_for(Duration::from_micros(50)); // the duplicate REQ, and B's MRA
    let now = net.now();
    net.b().reject(now, b_id);
    net.run_for(Duration::from_secs(60));
    assert_eq!(net.a().kinds(a_id), [AddrResolved, RouteResolved], "A waits as the MRA asked");
    net.run_for(Duration::from_secs(20));
    assert_eq!(net.a().kinds(a_id), [AddrResolved, RouteResolved, Rejected]);
    assert_eq!(net.b().requests().len(), 1);
}

#[test]
fn id_info_follows_a_connection_from_request_to_timewait() {
    use softrdma_cm::CmState;
    let mut net = Net::new(seed_from_env_or(21));
    let (a_id, a_qp, b_id) = net.request(b"hello");
    let a = net.a().nic.cm().id_info(a_id).unwrap();
    assert_eq!((a.state, a.state.rdma_cm_name(), a.state.ib_cm_name()), (CmState::ReqSent, "CONNECT", "REQ_SENT"));
    assert!(!a.passive && a.remote_qpn.is_none() && a.local_comm_id != 0);
    let b = net.b().nic.cm().id_info(b_id).unwrap();
    assert_eq!((b.state.rdma_cm_name(), b.state.ib_cm_name()), ("CONNECT", "REQ_RCVD"));
    assert!(b.passive, "made for the REQ");
    let listener = net.b().nic.cm().id_info(b.listener.expect("a passive ID names its listener")).unwrap();
    assert_eq!((listener.state.rdma_cm_name(), listener.service_id), ("LISTEN", b.service_id));
    let now = net.now();
    let b_qp = net.b().accept(now, b_id);
    net.settle();
    let (a, b) = (net.a().nic.cm().id_info(a_id).unwrap(), net.b().nic.cm().id_info(b_id).unwrap());
    assert_eq!((a.state, b.state), (CmState::Established, CmState::Established));
    assert_eq!((a.remote_qpn, b.remote_qpn), (Some(b_qp.value()), Some(a_qp.value())));
    assert_eq!((a.local, a.peer), (b.peer, b.local), "each side's addresses are the other's");
    assert_eq!((a.local_comm_id, a.remote_comm_id), (b.remote_comm_id, b.local_comm_id));
    let now = net.now();
    net.a().disconnect(now, a_id).unwrap();
    let a = net.a().nic.cm().id_info(a_id).unwrap();
    assert_eq!((a.state.rdma_cm_name(), a.state.ib_cm_name()), ("DISCONNECT", "DREQ_SENT"));
}
