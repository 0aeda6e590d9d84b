//! Two CMs on a virtual clock exchanging MADs: the connection protocol, with and without
//! losses.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use common::*;
use softrdma_cm::{Cm, CmConfig, CmError, CmEventKind, CmId, CmStatus, ConnParam, ib_timeout};
use softrdma_engine::{Access, AttrMask, Instant, Mtu, QpState, QpType};
use softrdma_wire::cm::{REJ_PRIVATE_DATA_LEN, RejReason, SidrStatus};
use softrdma_wire::cma::PortSpace;
use softrdma_wire::types::{Gid, QKey};

use CmEventKind::*;

#[test]
fn rc_connect_accept_establish_disconnect_timewait() {
    let mut p = Pair::new();
    let listener = p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);

    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let req = p.take_request();
    assert_eq!(req.listen_id, Some(listener));
    assert_eq!(req.private_data.len(), 56, "the kernel reports the whole REQ area after the header");
    assert!(req.private_data.starts_with(b"from A"));
    let param = req.param.clone().unwrap();
    // From B's point of view: A issues 2 READs at once, accepts 1.
    assert_eq!((param.responder_resources, param.initiator_depth, param.qp_num), (2, 1, 0x11));
    let b = req.id;
    assert_eq!(p.b.peer_addr(b).unwrap().ip(), IP_A);
    assert_eq!(p.b.local_addr(b), Some(SocketAddr::new(IP_B, PORT)));
    assert_eq!(p.b.peer_addr(b).unwrap().port(), p.a.local_addr(a).unwrap().port());

    p.b.accept(p.now, b, &passive_param()).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [ConnectResponse]);
    let rep = &p.events_a[0];
    assert!(rep.private_data.starts_with(b"from B"));
    assert_eq!(rep.param.as_ref().unwrap().qp_num, 0x22);
    assert!(p.kinds_b().is_empty(), "B waits for the RTU");

    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [ConnectResponse, Established]);
    assert_eq!(p.kinds_b(), [Established]);
    let names: Vec<_> = p.log.iter().map(|s| s.name).collect();
    assert_eq!(names, ["REQ", "REP", "RTU"]);

    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.kinds_b(), [Established, Disconnected]);
    p.b.disconnect(p.now, b).unwrap(); // answers with the DREP
    p.drive();
    assert_eq!(p.kinds_a(), [ConnectResponse, Established, Disconnected]);
    let names: Vec<_> = p.log.iter().map(|s| s.name).collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);

    let start = p.now;
    p.settle();
    assert_eq!(p.now - start, Duration::from_millis(50), "timewait as configured");
    assert_eq!(p.kinds_a().last(), Some(&TimewaitExit));
    assert_eq!(p.kinds_b().last(), Some(&TimewaitExit));
    p.a.destroy_id(p.now, a).unwrap();
    p.b.destroy_id(p.now, b).unwrap();
    p.drive();
    assert_eq!(p.log.len(), 5, "nothing left to say after timewait");
    assert_eq!(p.a.counters().mads_dropped + p.b.counters().mads_dropped, 0);
}

#[test]
fn qp_attrs_cross_the_psns_and_swap_the_depths() {
    let (p, a, b) = connected();
    let (init, mask) = p.a.qp_attr(a, QpState::Init).unwrap();
    assert_eq!(mask, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS);
    assert_eq!((init.pkey_index, init.port_num), (0, 1));
    // After the REP, A's responder resources are B's initiator depth (1): READ allowed.
    assert_eq!(init.qp_access_flags, Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC);

    let (a_rtr, mask) = p.a.qp_attr(a, QpState::Rtr).unwrap();
    let (b_rtr, _) = p.b.qp_attr(b, QpState::Rtr).unwrap();
    assert!(mask.contains(AttrMask::AV | AttrMask::DEST_QPN | AttrMask::RQ_PSN | AttrMask::PATH_MTU));
    assert!(mask.contains(AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER));
    let (a_rts, mask) = p.a.qp_attr(a, QpState::Rts).unwrap();
    let (b_rts, _) = p.b.qp_attr(b, QpState::Rts).unwrap();
    assert!(mask.contains(AttrMask::SQ_PSN | AttrMask::TIMEOUT | AttrMask::RETRY_CNT | AttrMask::RNR_RETRY));

    assert_eq!((a_rtr.dest_qp_num, b_rtr.dest_qp_num), (0x22, 0x11));
    // Each side advertises the PSN it expects: A's rq_psn is B's sq_psn and vice versa.
    assert_eq!((a_rtr.rq_psn, b_rts.sq_psn), (0x1000, 0x1000));
    assert_eq!((b_rtr.rq_psn, a_rts.sq_psn), (0x2000, 0x2000));
    assert_eq!((a_rtr.path_mtu, b_rtr.path_mtu), (Mtu::Mtu1024, Mtu::Mtu1024));
    let (a_av, b_av) = (a_rtr.ah_attr.unwrap(), b_rtr.ah_attr.unwrap());
    assert_eq!((a_av.dgid, b_av.dgid), (Gid::from_ip(IP_B), Gid::from_ip(IP_A)));
    assert_eq!((a_av.sgid_index, a_av.hop_limit, a_av.traffic_class), (0, 64, 0));
    assert_eq!(a_av.flow_label, b_av.flow_label, "both directions hash the same ports");
    assert_eq!(b_av.hop_limit, 64);
    // Depths: A accepts 1 (B's initiator depth) and issues 2 (B's responder resources).
    assert_eq!((a_rtr.max_dest_rd_atomic, a_rts.max_rd_atomic), (1, 2));
    assert_eq!((b_rtr.max_dest_rd_atomic, b_rts.max_rd_atomic), (2, 1));
    assert_eq!((a_rtr.min_rnr_timer, b_rtr.min_rnr_timer), (0, 0));
    // Retry count from the REQ on both; RNR retry: B's from the REQ (7), A's from the REP (6).
    assert_eq!((a_rts.retry_cnt, b_rts.retry_cnt), (7, 7));
    assert_eq!((a_rts.rnr_retry, b_rts.rnr_retry), (6, 7));
    // cm_ack_timeout(15, 18) = 19 both ways with rxe's ACK delay.
    assert_eq!((a_rts.timeout, b_rts.timeout), (19, 19));
    assert_eq!(
        p.a.qp_attr(a, QpState::Sqd).unwrap_err().to_string(),
        "qp_attr: CM ID 1 has no attributes for Sqd; ask for INIT, RTR or RTS"
    );
}

#[test]
fn tos_and_ack_timeout_options_reach_the_route_the_req_and_the_qp() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    // Before the route, as rping -T and perftest --tos set it.
    p.a.set_tos(a, 0xb8).unwrap();
    p.a.set_ack_timeout(a, 14).unwrap();
    assert!(p.a.set_ack_timeout(a, 32).is_err(), "a 5-bit exponent");
    p.resolve_id(a);
    let b = p.connect_accept_establish(a);
    // The traffic class is A's route's, and the REQ's path carries it to B.
    let (a_rtr, _) = p.a.qp_attr(a, QpState::Rtr).unwrap();
    let (b_rtr, _) = p.b.qp_attr(b, QpState::Rtr).unwrap();
    assert_eq!((a_rtr.ah_attr.unwrap().traffic_class, b_rtr.ah_attr.unwrap().traffic_class), (0xb8, 0xb8));
    // A's QP takes the ACK timeout set; B's the path's (cm_ack_timeout(15, 18) = 19).
    let (a_rts, _) = p.a.qp_attr(a, QpState::Rts).unwrap();
    let (b_rts, _) = p.b.qp_attr(b, QpState::Rts).unwrap();
    assert_eq!((a_rts.timeout, b_rts.timeout), (14, 19));
    // UD has no ACK timeout.
    let u = p.a.create_id(PortSpace::UDP, QpType::Ud).unwrap();
    assert!(p.a.set_ack_timeout(u, 14).is_err());
}

#[test]
fn qp_attr_before_the_exchange() {
    let mut p = Pair::new();
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    let (init, _) = p.a.qp_attr(a, QpState::Init).unwrap();
    assert_eq!(init.qp_access_flags, Access(0), "cma_ib_init_qp_attr: no access before the CM exchange");
    let err = p.a.qp_attr(a, QpState::Rtr).unwrap_err();
    assert!(err.to_string().contains("wait for CONNECT_REQUEST or CONNECT_RESPONSE"), "{err}");
}

#[test]
fn reject_with_private_data() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let b = p.take_request().id;
    p.b.reject(p.now, b, b"go away").unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [Rejected]);
    let e = &p.events_a[0];
    assert_eq!(e.status, CmStatus::Rejected(RejReason::CONSUMER_DEFINED));
    assert!(e.private_data.starts_with(b"go away"));
    assert_eq!(p.a.poll_timeout(), None, "no REQ retransmission after a REJ");
    p.settle();
    assert_eq!(p.log.len(), 2);
}

#[test]
fn req_to_nobody_is_rejected_with_reason_8() {
    let mut p = Pair::new();
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [Rejected]);
    assert_eq!(p.events_a[0].status, CmStatus::Rejected(RejReason::INVALID_SERVICE_ID));
    assert!(p.events_b.is_empty());
    assert_eq!(p.b.id_count(), 0, "a stateless REJ, as cm_issue_rej");
}

/// A's device also owns B's address: the same host, with `same_host_rej_retries` set.
fn same_host_pair(retries: u8) -> Pair {
    let mut ca = config(1, IP_A, 3 << 21);
    ca.addresses.push(IP_B);
    ca.same_host_rej_retries = retries;
    Pair::with_configs(ca, config(2, IP_B, 5 << 21))
}

#[test]
fn same_host_req_rejected_for_no_listener_is_resent_until_one_listens() {
    let mut p = same_host_pair(6);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    let t0 = p.now;
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    assert!(p.kinds_a().is_empty(), "no REJECTED yet: the REQ goes again in 1 ms");
    assert_eq!(p.a.poll_timeout(), Some(t0 + Duration::from_millis(1)));
    p.drive_for(Duration::from_millis(2)); // resent at 1 ms, rejected again; next at +2 ms
    assert_eq!(p.sent(Side::A, "REQ").len(), 2);
    // B listens now: the REQ at 3 ms finds it.
    let listener = p.listen(PortSpace::TCP, QpType::Rc);
    p.drive_for(Duration::from_millis(2));
    let req = p.take_request();
    assert_eq!(req.listen_id, Some(listener));
    assert_eq!(p.sent(Side::A, "REQ").len(), 3);
    assert_eq!(p.sent(Side::B, "REJ").len(), 2);
    assert!(p.kinds_a().is_empty());
    p.b.accept(p.now, req.id, &passive_param()).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [ConnectResponse]);
}

#[test]
fn same_host_req_to_nobody_is_rejected_after_the_retries() {
    let mut p = same_host_pair(3);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive_for(Duration::from_millis(6)); // resent at 1, 3 and 7 ms
    assert!(p.kinds_a().is_empty());
    p.drive_for(Duration::from_millis(2));
    assert_eq!(p.kinds_a(), [Rejected]);
    assert_eq!(p.events_a[0].status, CmStatus::Rejected(RejReason::INVALID_SERVICE_ID));
    assert_eq!(p.sent(Side::A, "REQ").len(), 4);
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn req_to_another_host_is_rejected_at_once_even_with_same_host_retries() {
    let mut ca = config(1, IP_A, 3 << 21);
    ca.same_host_rej_retries = 6;
    let mut p = Pair::with_configs(ca, config(2, IP_B, 5 << 21));
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [Rejected]);
    assert_eq!(p.sent(Side::A, "REQ").len(), 1);
}

#[test]
fn lost_req_is_resent_after_exactly_the_timeout_and_connects_once() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.drop_first(Side::A, "REQ", 1);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    assert!(p.events_b.is_empty());
    p.drive_for(ib_timeout(RESPONSE_TIMEOUT));
    let reqs = p.sent(Side::A, "REQ");
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[1].at - reqs[0].at, ib_timeout(RESPONSE_TIMEOUT));
    assert_eq!(ib_timeout(RESPONSE_TIMEOUT), Duration::from_nanos(4096 << 10));
    assert_eq!(reqs[0].mad, reqs[1].mad, "the same REQ, byte for byte");
    assert_eq!(p.kinds_b(), [ConnectRequest]);
    let b = p.events_b[0].id;
    p.b.accept(p.now, b, &passive_param()).unwrap();
    p.drive();
    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.kinds_b(), [ConnectRequest, Established]);
    assert_eq!(p.a.counters().mads_retried, 1);
}

#[test]
fn req_always_lost_is_unreachable_after_max_retries() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.drop = Box::new(|_, _| true);
    let start = p.now;
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.settle();
    assert_eq!(p.sent(Side::A, "REQ").len(), 4, "the REQ and max_retries (3) resends");
    assert_eq!(p.kinds_a(), [Unreachable]);
    assert_eq!(p.events_a[0].status, CmStatus::TimedOut);
    assert_eq!(p.now - start, ib_timeout(RESPONSE_TIMEOUT) * 4);
    // Destroying it now sends nothing: the exchange is over.
    p.a.destroy_id(p.now, a).unwrap();
    assert!(p.a.poll_transmit().is_none());
}

#[test]
fn lost_rep_is_resent_and_the_repeated_req_makes_no_second_request() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.drop_first(Side::B, "REP", 1);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let b = p.take_request().id;
    p.b.accept(p.now, b, &passive_param()).unwrap();
    p.drive();
    assert!(p.events_a.is_empty());
    // The REQ timer and the REP timer fire together: the repeated REQ is answered with the
    // REP, and the REP goes out again on its own timer.
    p.drive_for(ib_timeout(RESPONSE_TIMEOUT));
    assert_eq!(p.sent(Side::A, "REQ").len(), 2);
    assert!(p.sent(Side::B, "REP").len() >= 2);
    assert!(p.events_b.is_empty(), "no second CONNECT_REQUEST: {:?}", p.kinds_b());
    assert!(p.b.counters().duplicates >= 1);
    assert_eq!(p.kinds_a(), [ConnectResponse]);
    p.a.establish(p.now, a).unwrap();
    p.settle();
    assert_eq!(p.kinds_b(), [Established]);
    assert_eq!(p.b.id_count(), 2, "the listener and one connection");
}

#[test]
fn repeated_req_before_accept_gets_an_mra_that_holds_the_active_side() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let b = p.take_request().id;
    // B's user takes its time: A resends the REQ, B answers with rdma_cm's delayed MRA.
    p.drive_for(ib_timeout(RESPONSE_TIMEOUT));
    assert_eq!(p.sent(Side::A, "REQ").len(), 2);
    assert_eq!(p.sent(Side::B, "MRA").len(), 1);
    assert!(p.events_b.is_empty());
    // The MRA's service timeout (24: about 69 s) keeps A waiting far beyond its retries.
    p.drive_for(ib_timeout(RESPONSE_TIMEOUT) * 10);
    assert_eq!(p.sent(Side::A, "REQ").len(), 2);
    assert!(p.events_a.is_empty());
    p.b.accept(p.now, b, &passive_param()).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [ConnectResponse]);
}

/// cm.c keeps resending the REP while the RTU is missing; the active side answers a repeated
/// REP with the RTU again (`cm_dup_rep_handler`), which establishes the passive side.
#[test]
fn lost_rtu_is_recovered_by_the_rep_retry() {
    let (mut p, _a, _b) = {
        let mut p = Pair::new();
        p.listen(PortSpace::TCP, QpType::Rc);
        let a = p.resolve(PortSpace::TCP, QpType::Rc);
        p.drop_first(Side::A, "RTU", 1);
        let b = p.connect_accept_establish(a);
        (p, a, b)
    };
    assert!(p.events_b.is_empty());
    p.settle();
    assert_eq!(p.kinds_b(), [Established]);
    assert_eq!(p.sent(Side::A, "RTU").len(), 2);
    assert_eq!(p.sent(Side::B, "REP").len(), 2);
}

/// `ib_cm_notify(IB_EVENT_COMM_EST)`: the first data packet establishes the passive side.
#[test]
fn lost_rtu_first_data_establishes_with_notify() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.drop = Box::new(|s, m| s == Side::A && m == "RTU");
    let b = p.connect_accept_establish(a);
    p.b.notify(p.now, b).unwrap();
    p.drive();
    assert_eq!(p.kinds_b(), [Established]);
    p.b.notify(p.now, b).unwrap(); // idempotent
    p.settle();
    assert_eq!(p.kinds_b(), [Established]);
    assert_eq!(p.sent(Side::B, "REP").len(), 1, "no REP retry once established");
}

/// Every RTU lost and no data: cm.c gives up on the REP (`IB_CM_REP_ERROR`), which cma.c
/// reports as UNREACHABLE with -ETIMEDOUT.
#[test]
fn rtu_always_lost_is_unreachable_on_the_passive_side() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.drop = Box::new(|s, m| s == Side::A && m == "RTU");
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let b = p.take_request().id;
    p.b.accept(p.now, b, &passive_param()).unwrap();
    p.drive();
    p.a.establish(p.now, a).unwrap();
    p.settle();
    assert_eq!(p.sent(Side::B, "REP").len(), 4);
    assert_eq!(p.kinds_b(), [Unreachable]);
    assert_eq!(p.events_b[0].status, CmStatus::TimedOut);
}

/// The passive side destroys its ID while its REP waits for an RTU that was lost: cm.c's
/// cm_destroy_id sends a REJ, which finds the active side established. cm.c takes it there
/// and enters timewait, cma.c reports REJECTED (the NIC moves the QP to ERR); no
/// TIMEWAIT_EXIT follows (cma.c reports that only for a connection its user disconnected),
/// and `rdma_disconnect` afterwards sends nothing and does not fail.
#[test]
fn a_rej_that_finds_the_connection_established_ends_it_rejected() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.drop = Box::new(|s, m| s == Side::A && m == "RTU");
    let b = p.connect_accept_establish(a);
    assert_eq!(p.kinds_a().last(), Some(&Established));
    assert!(p.kinds_b().is_empty(), "B waits for the RTU");
    let before = p.kinds_a().len();

    p.b.destroy_id(p.now, b).unwrap();
    p.drive();
    assert_eq!(p.sent(Side::B, "REJ").len(), 1);
    assert_eq!(p.kinds_a()[before..], [Rejected]);
    let rejected = p.events_a.last().unwrap();
    assert_eq!(rejected.status, CmStatus::Rejected(RejReason::CONSUMER_DEFINED));
    assert_eq!(rejected.private_data.len(), REJ_PRIVATE_DATA_LEN);

    // Timewait ends quietly.
    p.settle();
    assert_eq!(p.kinds_a()[before..], [Rejected]);
    assert_eq!(p.a.poll_timeout(), None);
    // rdma_disconnect: nothing to send, and no error.
    p.a.disconnect(p.now, a).unwrap();
    p.a.destroy_id(p.now, a).unwrap();
    p.drive();
    assert!(p.sent(Side::A, "DREQ").is_empty() && p.sent(Side::A, "REJ").is_empty());
}

#[test]
fn lost_dreq_is_resent() {
    let (mut p, a, b) = connected();
    p.drop_first(Side::A, "DREQ", 1);
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    assert!(p.events_b.is_empty());
    p.drive_for(ib_timeout(RESPONSE_TIMEOUT));
    assert_eq!(p.sent(Side::A, "DREQ").len(), 2);
    assert_eq!(p.kinds_b(), [Disconnected]);
    p.b.disconnect(p.now, b).unwrap();
    p.settle();
    assert_eq!(p.kinds_a(), [Disconnected, TimewaitExit]);
    assert_eq!(p.kinds_b(), [Disconnected, TimewaitExit]);
}

#[test]
fn repeated_dreq_in_timewait_is_answered_again() {
    let (mut p, a, b) = connected();
    p.drop_first(Side::B, "DREP", 1);
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    p.b.disconnect(p.now, b).unwrap();
    p.drive();
    p.drive_for(ib_timeout(RESPONSE_TIMEOUT));
    assert_eq!(p.sent(Side::B, "DREP").len(), 2, "the repeated DREQ gets the DREP again");
    assert_eq!(p.kinds_a(), [Disconnected]);
    assert_eq!(p.b.counters().duplicates, 1);
}

/// B's process dies connected and a new one takes its host slot (the same comm ID prefix):
/// A's DREQ names a comm ID the new CM never made, which answers with a DREP as Linux does
/// (cm_issue_drep), so A leaves DREQ_SENT at once instead of after its retries. A comm ID of
/// another prefix gets no answer.
#[test]
fn dreq_for_a_comm_id_nobody_holds_is_answered() {
    let (mut p, a, _b) = connected();
    p.b = Cm::new(config(7, IP_B, 5 << 21)); // B's successor on the same slot
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.sent(Side::A, "DREQ").len(), 1);
    assert_eq!(p.sent(Side::B, "DREP").len(), 1);
    assert_eq!(p.kinds_a(), [Disconnected]);
    assert_eq!(p.events_a[0].status, CmStatus::Ok, "a DREP, not a timeout");
    assert_eq!((p.b.counters().duplicates, p.b.counters().mads_dropped), (1, 0));
    p.settle();
    assert_eq!(p.sent(Side::A, "DREQ").len(), 1, "no retry");
    assert_eq!(p.kinds_a(), [Disconnected, TimewaitExit]);

    let (mut p, a, _b) = connected();
    p.b = Cm::new(config(7, IP_B, 6 << 21)); // a member of another slot
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    assert!(p.sent(Side::B, "DREP").is_empty());
    assert_eq!(p.b.counters().mads_dropped, 1);
}

#[test]
fn dreq_always_lost_disconnects_after_the_retries() {
    let (mut p, a, _b) = connected();
    p.drop = Box::new(|s, m| s == Side::A && m == "DREQ");
    p.a.disconnect(p.now, a).unwrap();
    p.settle();
    assert_eq!(p.sent(Side::A, "DREQ").len(), 4);
    assert_eq!(p.kinds_a(), [Disconnected, TimewaitExit]);
    assert_eq!(p.events_a[0].status, CmStatus::TimedOut);
    assert!(p.events_b.is_empty());
}

#[test]
fn simultaneous_disconnect() {
    let (mut p, a, b) = connected();
    p.a.disconnect(p.now, a).unwrap();
    p.b.disconnect(p.now, b).unwrap();
    p.drive();
    assert_eq!(p.sent(Side::A, "DREQ").len(), 1);
    assert_eq!(p.sent(Side::B, "DREQ").len(), 1);
    assert_eq!(p.sent(Side::A, "DREP").len(), 1);
    assert_eq!(p.sent(Side::B, "DREP").len(), 1);
    assert_eq!(p.kinds_a(), [Disconnected]);
    assert_eq!(p.kinds_b(), [Disconnected]);
    p.settle();
    assert_eq!(p.kinds_a(), [Disconnected, TimewaitExit]);
    assert_eq!(p.kinds_b(), [Disconnected, TimewaitExit]);
    assert_eq!(p.log.iter().filter(|s| s.name == "DREQ").count(), 2, "no DREQ retry");
    assert!(p.a.disconnect(p.now, a).is_err());
}

#[test]
fn destroy_sends_what_the_state_needs() {
    // Established: a DREQ.
    let (mut p, a, _b) = connected();
    p.a.destroy_id(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.sent(Side::A, "DREQ").len(), 1);
    assert_eq!(p.kinds_b(), [Disconnected]);
    // DREQ received: the DREP.
    let (mut p, a, b) = connected();
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    p.b.destroy_id(p.now, b).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [Disconnected]);
    // A REQ not yet answered by the user: REJ 28.
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let b = p.take_request().id;
    p.b.destroy_id(p.now, b).unwrap();
    p.drive();
    assert_eq!(p.events_a[0].status, CmStatus::Rejected(RejReason::CONSUMER_DEFINED));
    // Our REQ unanswered: REJ TIMEOUT (B has no ID for it any more, so B drops it).
    let mut p = Pair::new();
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.drop = Box::new(|_, _| true);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    p.a.destroy_id(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.sent(Side::A, "REJ").len(), 1);
    assert_eq!(p.a.poll_timeout(), None);
    assert!(matches!(p.a.destroy_id(p.now, a), Err(CmError::NoSuchId { .. })));
}

#[test]
fn ud_sidr_resolves_the_service_qp() {
    let mut p = Pair::new();
    let listener = p.listen(PortSpace::UDP, QpType::Ud);
    let a = p.resolve(PortSpace::UDP, QpType::Ud);
    let param = ConnParam { private_data: b"udaddy".to_vec(), ..ConnParam::default() };
    p.a.connect(p.now, a, &param).unwrap();
    p.drive();
    let req = p.take_request();
    assert_eq!(req.listen_id, Some(listener));
    assert!(req.private_data.starts_with(b"udaddy"));
    assert_eq!(req.private_data.len(), 180);
    let (init, mask) = p.b.qp_attr(req.id, QpState::Init).unwrap();
    assert!(mask.contains(AttrMask::QKEY));
    assert_eq!(init.qkey, QKey::RDMA_CM_UDP);
    p.b.accept(p.now, req.id, &ConnParam { qp_num: 0x99, private_data: b"ok".to_vec(), ..ConnParam::default() })
        .unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [Established]);
    let e = &p.events_a[0];
    let ud = e.ud.unwrap();
    assert_eq!((ud.remote_qpn, ud.qkey), (0x99, QKey::RDMA_CM_UDP.0));
    assert_eq!(ud.ah.dgid, Gid::from_ip(IP_B));
    assert!(e.private_data.starts_with(b"ok"));
    assert!(p.events_b.is_empty(), "the passive side of SIDR gets no ESTABLISHED: {:?}", p.kinds_b());
    let names: Vec<_> = p.log.iter().map(|s| s.name).collect();
    assert_eq!(names, ["SIDR_REQ", "SIDR_REP"]);
}

#[test]
fn sidr_to_nobody_and_sidr_reject_are_unreachable() {
    let mut p = Pair::new();
    let a = p.resolve(PortSpace::UDP, QpType::Ud);
    p.a.connect(p.now, a, &ConnParam::default()).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [Unreachable]);
    assert_eq!(p.events_a[0].status, CmStatus::Sidr(SidrStatus::UNSUPPORTED));

    let mut p = Pair::new();
    p.listen(PortSpace::UDP, QpType::Ud);
    let a = p.resolve(PortSpace::UDP, QpType::Ud);
    p.a.connect(p.now, a, &ConnParam::default()).unwrap();
    p.drive();
    let b = p.take_request().id;
    p.b.reject(p.now, b, b"no").unwrap();
    p.drive();
    assert_eq!(p.events_a[0].status, CmStatus::Sidr(SidrStatus::REJECT));
}

#[test]
fn lost_sidr_req_is_resent_then_unreachable() {
    let mut p = Pair::new();
    p.listen(PortSpace::UDP, QpType::Ud);
    let a = p.resolve(PortSpace::UDP, QpType::Ud);
    p.drop = Box::new(|_, m| m == "SIDR_REQ");
    p.a.connect(p.now, a, &ConnParam::default()).unwrap();
    p.settle();
    assert_eq!(p.sent(Side::A, "SIDR_REQ").len(), 4);
    assert_eq!(p.kinds_a(), [Unreachable]);
    assert_eq!(p.events_a[0].status, CmStatus::TimedOut);
}

/// A SIDR_REP lost: the repeated SIDR_REQ finds the request answered, and the answer goes
/// again (not a second CONNECT_REQUEST, nor silence until the requester gives up), for an
/// accept and for a reject alike.
#[test]
fn a_lost_sidr_rep_is_sent_again_for_the_repeated_sidr_req() {
    for accept in [true, false] {
        let mut p = Pair::new();
        p.listen(PortSpace::UDP, QpType::Ud);
        let a = p.resolve(PortSpace::UDP, QpType::Ud);
        p.drop_first(Side::B, "SIDR_REP", 1);
        p.a.connect(p.now, a, &ConnParam::default()).unwrap();
        p.drive();
        let b = p.take_request().id;
        if accept {
            p.b.accept(p.now, b, &ConnParam { qp_num: 0x99, ..ConnParam::default() }).unwrap();
        } else {
            p.b.reject(p.now, b, b"no").unwrap();
        }
        p.settle();
        assert_eq!(p.sent(Side::A, "SIDR_REQ").len(), 2, "accept {accept}");
        assert_eq!(p.sent(Side::B, "SIDR_REP").len(), 2, "accept {accept}");
        assert!(p.events_b.is_empty(), "one request for the one connect: {:?}", p.kinds_b());
        if accept {
            assert_eq!(p.kinds_a(), [Established]);
            assert_eq!(p.events_a[0].ud.map(|u| u.remote_qpn), Some(0x99));
        } else {
            assert_eq!(p.kinds_a(), [Unreachable]);
            assert_eq!(p.events_a[0].status, CmStatus::Sidr(SidrStatus::REJECT));
        }
    }
}

#[test]
fn every_mad_carries_the_comm_id_prefix() {
    for (pa, pb) in [(3 << 21, 5 << 21), (0, 0x7ff << 21), (0xfff << 21, 1 << 21)] {
        let mut p = Pair::with_prefixes(pa, pb);
        p.listen(PortSpace::TCP, QpType::Rc);
        p.listen_udp_too();
        // Several connections, some with losses, a reject, a disconnect, a SIDR.
        for round in 0..5u32 {
            p.drop_first(Side::B, "REP", (round % 2) as usize);
            let a = p.resolve(PortSpace::TCP, QpType::Rc);
            p.a.connect(p.now, a, &active_param()).unwrap();
            p.drive();
            let b = p.take_request().id;
            if round == 3 {
                p.b.reject(p.now, b, b"").unwrap();
                p.settle();
                p.events_a.clear();
                continue;
            }
            p.b.accept(p.now, b, &passive_param()).unwrap();
            p.drive_for(ib_timeout(RESPONSE_TIMEOUT) * 2);
            p.a.establish(p.now, a).unwrap();
            p.drive();
            p.b.disconnect(p.now, b).unwrap();
            p.drive();
            p.a.disconnect(p.now, a).unwrap();
            p.settle();
            p.events_a.clear();
            p.events_b.clear();
        }
        let u = p.resolve(PortSpace::UDP, QpType::Ud);
        p.a.connect(p.now, u, &ConnParam::default()).unwrap();
        p.drive();
        let b = p.take_request().id;
        p.b.accept(p.now, b, &ConnParam { qp_num: 5, ..ConnParam::default() }).unwrap();
        p.drive();
        assert!(p.log.len() > 20);
        for s in &p.log {
            let prefix = if s.from == Side::A { pa } else { pb };
            let local = u32::from_be_bytes(s.mad[24..28].try_into().unwrap());
            let what = format!("{} from {:?}: local comm ID {local:#010x}", s.name, s.from);
            match s.name {
                // A SIDR_REP's first word is the requester's ID: it must carry the *other* prefix.
                "SIDR_REP" => assert_eq!(local >> 21, pa >> 21, "{what}"),
                _ => {
                    assert_eq!(local >> 21, prefix >> 21, "{what}");
                    assert_ne!(local & 0x1f_ffff, 0, "{what}");
                }
            }
            if s.name != "REQ" && s.name != "SIDR_REQ" && s.name != "SIDR_REP" {
                let remote = u32::from_be_bytes(s.mad[28..32].try_into().unwrap());
                let other = if s.from == Side::A { pb } else { pa };
                assert_eq!(remote >> 21, other >> 21, "{what}: remote comm ID {remote:#010x}");
            }
        }
    }
}

trait ListenUdp {
    fn listen_udp_too(&mut self);
}

impl ListenUdp for Pair {
    fn listen_udp_too(&mut self) {
        let l = self.b.create_id(PortSpace::UDP, QpType::Ud).unwrap();
        self.b.bind_addr(l, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT)).unwrap();
        self.b.listen(l, 8).unwrap();
    }
}

#[test]
fn binding_rules_and_errors_that_say_what_to_do() {
    let mut p = Pair::new();
    let any: IpAddr = Ipv4Addr::UNSPECIFIED.into();
    let x = p.b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    p.b.bind_addr(x, SocketAddr::new(IP_B, 5000)).unwrap();
    // The same port in the same port space: taken, on the same IP or the wildcard.
    let y = p.b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    let err = p.b.bind_addr(y, SocketAddr::new(any, 5000)).unwrap_err();
    assert!(matches!(err, CmError::AddrInUse { .. }));
    assert!(err.to_string().contains("already bound in port space TCP"), "{err}");
    // Another port space may use it.
    let u = p.b.create_id(PortSpace::UDP, QpType::Ud).unwrap();
    p.b.bind_addr(u, SocketAddr::new(any, 5000)).unwrap();
    // An address that is not ours.
    let err = p.b.bind_addr(y, SocketAddr::new(IP_A, 1)).unwrap_err();
    assert!(matches!(err, CmError::AddrNotAvailable { .. }), "{err}");
    // Ephemeral ports are distinct.
    p.b.bind_addr(y, SocketAddr::new(any, 0)).unwrap();
    let z = p.b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    p.b.bind_addr(z, SocketAddr::new(any, 0)).unwrap();
    let (py, pz) = (p.b.local_addr(y).unwrap().port(), p.b.local_addr(z).unwrap().port());
    assert_ne!(py, pz);
    assert!((32768..=60999).contains(&py));
    // Port space and QP type must fit.
    assert!(matches!(p.b.create_id(PortSpace::UDP, QpType::Rc), Err(CmError::PortSpaceMismatch { .. })));
    // Connect before the route.
    let c = p.a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    let err = p.a.connect(p.now, c, &ConnParam::default()).unwrap_err();
    assert_eq!(err.to_string(), "connect: CM ID 1 is idle; call resolve_route first and wait for ROUTE_RESOLVED");
    // Too much private data for a REQ.
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    let big = ConnParam { private_data: vec![1; 57], ..ConnParam::default() };
    let err = p.a.connect(p.now, a, &big).unwrap_err();
    assert_eq!(err.to_string(), "connect: 57 bytes of private data, but the REQ leaves room for 56");
}

#[test]
fn resolve_addr_without_a_usable_source_is_an_addr_error() {
    let mut p = Pair::new();
    let id = p.a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    let dst = SocketAddr::new(IP_B, PORT);
    p.a.resolve_addr(p.now, id, None, dst).unwrap();
    p.a.resolve_addr(p.now, id, Some(SocketAddr::new(IP_B, 0)), dst).unwrap();
    p.a.resolve_addr(p.now, id, Some(SocketAddr::new("::1".parse().unwrap(), 0)), dst).unwrap();
    p.drive();
    assert_eq!(p.kinds_a(), [AddrError, AddrError, AddrError]);
    assert_eq!(p.events_a[0].status, CmStatus::AddrNotAvailable);
    p.a.resolve_addr(p.now, id, Some(SocketAddr::new(IP_A, 0)), dst).unwrap();
    p.drive();
    assert_eq!(p.kinds_a().last(), Some(&AddrResolved));
}

#[test]
fn listener_on_a_specific_address_rejects_requests_for_another() {
    let ip_b2: IpAddr = "10.0.0.3".parse().unwrap();
    let mut cb = config(2, IP_B, 5 << 21);
    cb.addresses.push(ip_b2);
    let mut p = Pair::with_configs(config(1, IP_A, 3 << 21), cb);
    let l = p.b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    p.b.bind_addr(l, SocketAddr::new(ip_b2, PORT)).unwrap();
    p.b.listen(l, 1).unwrap();
    let a = p.resolve(PortSpace::TCP, QpType::Rc); // to IP_B, where nobody listens on PORT
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    assert_eq!(p.events_a[0].status, CmStatus::Rejected(RejReason::CONSUMER_DEFINED));
}

/// As ucma: the backlog bounds the requests reported and not yet taken by the application;
/// a REQ beyond it gets no answer (ib_cm: "do not reject to allow future retries") and
/// its sender's retry gets in once the application took one; requests taken and left
/// unanswered do not block later ones.
#[test]
fn backlog_bounds_requests_not_yet_taken_and_a_full_one_is_retried() {
    let mut p = Pair::new();
    let l = p.b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    p.b.bind_addr(l, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT)).unwrap();
    p.b.listen(l, 2).unwrap();
    let mut actives = Vec::new();
    for _ in 0..3 {
        let a = p.resolve(PortSpace::TCP, QpType::Rc);
        p.a.connect(p.now, a, &active_param()).unwrap();
        p.drive();
        actives.push(a);
    }
    assert_eq!(p.kinds_b(), [ConnectRequest, ConnectRequest]);
    assert_eq!(p.kinds_a(), [], "the third REQ is neither rejected nor answered");
    assert_eq!(p.sent(Side::B, "REJ").len(), 0);
    assert_eq!(p.b.counters().mads_dropped, 1);
    // The application takes both requests and answers neither: the third REQ's retry
    // gets in, and so does a fourth.
    let taken: Vec<CmId> = p.events_b.drain(..).map(|e| e.id).collect();
    for &id in &taken {
        p.b.request_taken(id);
        p.b.request_taken(id); // a second call changes nothing
    }
    p.step(p.next_timeout().expect("the third REQ's retry"));
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    assert_eq!(p.kinds_b(), [ConnectRequest, ConnectRequest], "the third (retried) and the fourth");
    // Two untaken again: a fifth waits, until one of them is destroyed.
    let b = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, b, &active_param()).unwrap();
    p.drive();
    assert_eq!(p.kinds_b().len(), 2);
    let untaken = p.events_b[0].id;
    p.b.destroy_id(p.now, untaken).unwrap();
    for _ in 0..20 {
        if p.kinds_b().len() == 3 {
            break;
        }
        p.step(Instant::MAX);
    }
    assert_eq!(p.kinds_b().len(), 3, "the fifth REQ's retry got in");
    assert_eq!(p.kinds_a(), [Rejected], "only the destroyed request's sender, with a REJ");
}

#[test]
fn repeated_req_in_timewait_is_rejected_as_stale() {
    let (mut p, a, b) = connected();
    let req = p.sent(Side::A, "REQ")[0].mad;
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    p.b.disconnect(p.now, b).unwrap();
    p.drive();
    p.b.handle_mad(p.now, IP_A, IP_B, &req);
    let t = p.b.poll_transmit().expect("a REJ");
    assert_eq!(name_of(&t.mad), "REJ");
    assert_eq!(u16::from_be_bytes([t.mad[24 + 10], t.mad[24 + 11]]), RejReason::STALE_CONN.0);
    assert!(p.b.poll_event().is_none(), "no new CONNECT_REQUEST");
}

#[test]
fn rc_over_ipv6_with_a_dual_stack_wildcard_listener() {
    let (ip_a, ip_b): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
    let mut p = Pair::with_configs(config(1, ip_a, 1 << 21), config(2, ip_b, 2 << 21));
    let l = p.b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    p.b.bind_addr(l, SocketAddr::new("::".parse().unwrap(), PORT)).unwrap();
    p.b.listen(l, 1).unwrap();
    assert_eq!(p.b.listen_service_id(l), Some(0x0106_1c06));
    let a = p.a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    p.a.resolve_addr(p.now, a, Some(SocketAddr::new(ip_a, 0)), SocketAddr::new(ip_b, PORT)).unwrap();
    p.a.resolve_route(p.now, a).unwrap();
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let req = p.events_b.pop().unwrap();
    assert_eq!(req.kind, ConnectRequest);
    assert_eq!(p.b.peer_addr(req.id).unwrap().ip(), ip_a);
    p.b.accept(p.now, req.id, &passive_param()).unwrap();
    p.drive();
    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.kinds_b(), [Established]);
    let (rtr, _) = p.b.qp_attr(req.id, QpState::Rtr).unwrap();
    assert_eq!(rtr.ah_attr.unwrap().dgid, Gid::from_ip(ip_a));
}

#[test]
fn the_same_seed_gives_the_same_mads() {
    let run = || {
        let (mut p, a, _) = connected();
        p.a.disconnect(p.now, a).unwrap();
        p.settle();
        p.log.iter().map(|s| s.mad).collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn ids_are_bounded() {
    let mut c = config(1, IP_A, 0);
    c.max_ids = 3;
    let mut p = Pair::with_configs(c, config(2, IP_B, 0));
    for _ in 0..3 {
        p.a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    }
    let err = p.a.create_id(PortSpace::TCP, QpType::Rc).unwrap_err();
    assert!(err.to_string().contains("destroy some first"), "{err}");
}

#[test]
fn established_carries_the_peers_parameters() {
    let mut p = Pair::new();
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.connect_accept_establish(a);
    let on_a = p.events_a.last().unwrap().param.clone().unwrap();
    let on_b = p.events_b.last().unwrap().param.clone().unwrap();
    assert_eq!((on_a.qp_num, on_a.start_psn), (0x22, Some(0x2000)));
    assert_eq!((on_b.qp_num, on_b.start_psn), (0x11, Some(0x1000)));
}

/// cm.c: the passive side resends its REP on the REQ's Local CM Response Timeout and Max
/// CM Retries, not on its own.
#[test]
fn the_passive_side_retries_on_the_reqs_timeout() {
    let mut cb = config(2, IP_B, 5 << 21);
    cb.response_timeout = RESPONSE_TIMEOUT + 4;
    cb.max_retries = 9;
    let mut p = Pair::with_configs(config(1, IP_A, 3 << 21), cb);
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.drop = Box::new(|s, m| s == Side::A && m == "RTU");
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let b = p.take_request().id;
    p.b.accept(p.now, b, &passive_param()).unwrap();
    p.drive();
    p.a.establish(p.now, a).unwrap();
    p.settle();
    let reps = p.sent(Side::B, "REP");
    assert_eq!(reps.len(), 4, "A's max_retries (3), not B's (9)");
    assert_eq!(reps[1].at - reps[0].at, ib_timeout(RESPONSE_TIMEOUT));
}

#[test]
fn link_local_addresses_are_reported_in_each_devices_scope() {
    let (ll_a, ll_b): (Ipv6Addr, Ipv6Addr) = ("fe80::a".parse().unwrap(), "fe80::b".parse().unwrap());
    // The same link, seen from two hosts: interface 5 on A, 7 on B.
    let scoped = |seed, ip: Ipv6Addr, scope_id| CmConfig { scope_id, ..config(seed, ip.into(), (seed as u32) << 21) };
    let mut p = Pair::with_configs(scoped(1, ll_a, 5), scoped(2, ll_b, 7));
    let at = |ip, port, scope| SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope));
    let listener = p.b.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    p.b.bind_addr(listener, at(ll_b, PORT, 7)).unwrap();
    p.b.listen(listener, 8).unwrap();
    assert_eq!(p.b.local_addr(listener), Some(at(ll_b, PORT, 7)));

    // The runtime's route lookup may hand over the source without its scope.
    let a = p.a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    p.a.resolve_addr(p.now, a, Some(SocketAddr::new(ll_a.into(), 0)), at(ll_b, PORT, 5)).unwrap();
    p.a.resolve_route(p.now, a).unwrap();
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let local_a = p.a.local_addr(a).unwrap();
    assert_eq!(local_a, at(ll_a, local_a.port(), 5), "A's address in A's scope");
    assert_eq!(p.a.peer_addr(a), Some(at(ll_b, PORT, 5)));
    let b = p.take_request().id;
    assert_eq!(p.b.local_addr(b), Some(at(ll_b, PORT, 7)), "B's address in B's scope");
    assert_eq!(p.b.peer_addr(b), Some(at(ll_a, local_a.port(), 7)), "A's address in B's scope");
}

/// The CM message of a logged MAD.
fn message(mad: &[u8]) -> softrdma_wire::cm::CmMessage<'_> {
    use softrdma_wire::mad::{MadPacket, MadRepr};
    let repr = MadRepr::parse(&MadPacket::new_checked(mad).unwrap()).unwrap();
    let data = &mad[mad.len() - repr.data.len()..];
    softrdma_wire::cm::CmMessage::parse_data(repr.header.attribute_id, data).unwrap()
}

/// XRC as Linux's cm.c puts it on the wire: the XRC INI side's REQ says transport 3
/// (extended) with extended type 1 (XRC) and carries no responder resources, retry counts or
/// SRQ bit; the listener of XRC TGT QPs takes it (one of RC QPs refuses it); the REP carries
/// the TGT QP's number in the local EE context number (its local QPN 0) with the SRQ bit,
/// and the INI side's RTR points at that QP; each half's QP attributes are its row's.
#[test]
fn xrc_req_and_rep_carry_the_qps_as_linux_does() {
    use softrdma_wire::cm::{CmMessage, TransportServiceType};
    let mut p = Pair::new();
    p.listen(PortSpace::IB, QpType::XrcTgt);
    let a = p.resolve(PortSpace::IB, QpType::XrcIni);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let CmMessage::Req(req) = message(&p.log[0].mad) else { panic!("{}", p.log[0].name) };
    assert_eq!((req.transport_service_type, req.extended_transport_type), (TransportServiceType::EXTENDED, 1));
    assert_eq!((req.responder_resources, req.retry_count, req.rnr_retry_count, req.srq), (0, 0, 0, false));
    assert_eq!(req.local_qpn.value(), 0x11);
    let r = p.take_request();
    assert_eq!(p.b.qp_type(r.id), Some(QpType::XrcTgt));
    p.b.accept(p.now, r.id, &passive_param()).unwrap();
    p.drive();
    let CmMessage::Rep(rep) = message(&p.log[1].mad) else { panic!("{}", p.log[1].name) };
    assert_eq!((rep.local_qpn.value(), rep.local_eecn, rep.srq), (0, 0x22, true));
    assert_eq!(p.kinds_a(), [ConnectResponse]);
    let (rtr, _) = p.a.qp_attr(a, QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qp_num, 0x22, "the INI QP sends to the TGT QP");
    let (_, rts) = p.a.qp_attr(a, QpState::Rts).unwrap();
    assert!(rts.contains(AttrMask::RETRY_CNT | AttrMask::MAX_QP_RD_ATOMIC), "the INI half is a requester");
    let (tgt_rtr, rtr_mask) = p.b.qp_attr(r.id, QpState::Rtr).unwrap();
    assert_eq!(tgt_rtr.dest_qp_num, 0x11);
    assert!(rtr_mask.contains(AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER), "the TGT half responds");
    let (_, tgt_rts) = p.b.qp_attr(r.id, QpState::Rts).unwrap();
    assert_eq!(tgt_rts, AttrMask::STATE | AttrMask::SQ_PSN | AttrMask::TIMEOUT, "XRC_TGT's RTR→RTS row");

    // A listener of RC QPs on the IB port space refuses an XRC REQ.
    let mut q = Pair::new();
    q.listen(PortSpace::IB, QpType::Rc);
    let a = q.resolve(PortSpace::IB, QpType::XrcIni);
    q.a.connect(q.now, a, &active_param()).unwrap();
    q.drive();
    assert_eq!(q.kinds_a(), [Rejected]);
}
