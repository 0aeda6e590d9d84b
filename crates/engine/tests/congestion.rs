//! Congestion control ([`softrdma_engine::congestion`]) between two engines: ECN-marked
//! packets and receive drops answered with CNPs, senders (READ responders included) paced
//! at the rate the CNPs leave them, and nothing changed when it is off.

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::congestion::DcqcnConfig;
use softrdma_engine::*;
use softrdma_wire::Opcode;

const MB: f64 = 1e6;

/// A connected RC pair, both devices with congestion control on (`cc`) or off.
fn pair(cc: bool) -> Pair {
    let config = DcqcnConfig { line_rate: 1000.0 * MB, ..DcqcnConfig::default() };
    let tweak = move |c: &mut DeviceConfig| c.congestion = cc.then_some(config);
    let a = node_configured([10, 0, 0, 1], 1, QpType::Rc, QpCap::default(), &tweak);
    let b = node_configured([10, 0, 0, 2], 2, QpType::Rc, QpCap::default(), &tweak);
    pair_of(a, b, QpType::Rc, Mtu::Mtu4096)
}

/// The first `n` packets arrive marked CE (a switch queue on the path congested for a
/// while), the rest unmarked.
fn mark_first(p: &mut Pair, n: usize) {
    let mut left = n;
    p.ip_info = Some(Box::new(move |_| {
        let ce = left > 0;
        left = left.saturating_sub(1);
        IpInfo { traffic_class: if ce { 0b11 } else { 0 }, ..IpInfo::default() }
    }));
}

/// Posts `n` WRITEs of 64 KiB from a to b and drives until they complete.
fn write_stream(p: &mut Pair, n: u64) {
    let data = pattern(65536, 5);
    p.a.fill(0, &data);
    let (rkey, remote) = (p.b.mr.rkey, p.b.addr_of(0x10000));
    for i in 0..n {
        let sge = p.a.sge(0, 65536);
        let flags = if i + 1 == n { SendFlags::SIGNALED } else { SendFlags::default() };
        p.a.post_send(SendWr { flags, ..wr(i, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[sge]) });
    }
    let mut done = None;
    for _ in 0..20_000 {
        p.drive_for(Duration::from_micros(100));
        done = p.a.poll();
        if done.is_some() {
            break;
        }
    }
    assert_eq!(done.map(|w| w.status), Some(WcStatus::Success));
    assert_eq!(p.b.read(0x10000, 65536), &data[..]);
}

/// Bytes per second of `from_a`'s packets of `opcodes`, from the first to the last.
fn rate_of(p: &Pair, from_a: bool, opcodes: &[Opcode]) -> f64 {
    let pkts: Vec<_> = p.sent(from_a).into_iter().filter(|k| opcodes.contains(&k.opcode())).collect();
    let bytes: usize = pkts.iter().skip(1).map(|k| k.bytes.len()).sum();
    let span = pkts.last().unwrap().at - pkts.first().unwrap().at;
    bytes as f64 / span.as_secs_f64()
}

const WRITES: [Opcode; 4] =
    [Opcode::RC_RDMA_WRITE_FIRST, Opcode::RC_RDMA_WRITE_MIDDLE, Opcode::RC_RDMA_WRITE_LAST, Opcode::RC_RDMA_WRITE_ONLY];

#[test]
fn ecn_marks_bring_cnps_that_pace_the_sender() {
    let mut p = pair(true);
    mark_first(&mut p, 200);
    write_stream(&mut p, 32);
    let (a, b) = (p.a.engine.counters(), p.b.engine.counters());
    assert!(b.cnps_sent > 0 && a.cnps_rcvd == b.cnps_sent, "b answered the marks: {} / {}", b.cnps_sent, a.cnps_rcvd);
    assert!(p.sent(false).iter().any(|k| k.opcode() == Opcode::CNP));
    // The pair's wire is infinitely fast: only the pacer spaces a's packets.
    let rate = rate_of(&p, true, &WRITES);
    assert!(rate < 600.0 * MB, "paced below the 1000 MB/s line: {:.0} MB/s", rate / MB);
    assert!(rate > 1.0 * MB, "but not stopped: {:.0} MB/s", rate / MB);
}

#[test]
fn without_congestion_control_marks_change_nothing() {
    let mut p = pair(false);
    mark_first(&mut p, 200);
    write_stream(&mut p, 8);
    assert_eq!(p.b.engine.counters().cnps_sent, 0);
    assert!(p.sent(false).iter().all(|k| k.opcode() != Opcode::CNP));
    let a = p.sent(true);
    assert_eq!(a.first().unwrap().at, a.last().unwrap().at, "no pacing: every packet at once");
}

#[test]
fn read_responses_are_paced_like_any_traffic() {
    // a READs from b; the responses reach a marked, a's CNPs slow b's responder.
    let mut p = pair(true);
    mark_first(&mut p, 200);
    let data = pattern(65536, 6);
    p.b.fill(0x10000, &data);
    let (rkey, remote) = (p.b.mr.rkey, p.b.addr_of(0x10000));
    for i in 0..16u64 {
        let sge = p.a.sge(0x20000, 65536);
        p.a.post_send(SendWr {
            flags: SendFlags::SIGNALED,
            ..wr(i, SendOp::RdmaRead { remote_addr: remote, rkey }, &[sge])
        });
    }
    p.drive_for(Duration::from_secs(2));
    let wcs = p.a.poll_all();
    assert_eq!(wcs.len(), 16);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(p.a.read(0x20000, 65536), &data[..]);
    assert!(p.b.engine.counters().cnps_rcvd > 0);
    let responses = [
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
    ];
    let rate = rate_of(&p, false, &responses);
    assert!(rate < 600.0 * MB, "b's READ responses paced: {:.0} MB/s", rate / MB);
}

#[test]
fn receive_drops_send_cnps_to_the_recent_senders_only() {
    let mut p = pair(true);
    write_stream(&mut p, 1);
    let now = p.now;
    p.b.engine.handle_receive_drops(now);
    let q = p.b.engine.poll_transmit(now, &mut p.b.mem, &mut [0u8; 4200][..]).expect("a CNP to a");
    assert_eq!(p.b.engine.counters().cnps_sent, 1);
    assert!(q.len >= 12 + 16 + 4);
    // Long after the last packet, a drop is nobody's fault.
    let later = now + Duration::from_millis(10);
    p.b.engine.handle_receive_drops(later);
    assert!(p.b.engine.poll_transmit(later, &mut p.b.mem, &mut [0u8; 4200][..]).is_none());
}

#[test]
fn a_cnp_for_a_device_without_congestion_control_is_dropped() {
    let mut p = pair(false);
    write_stream(&mut p, 1);
    let mut q = pair(true);
    write_stream(&mut q, 1);
    q.b.engine.handle_receive_drops(q.now);
    let mut buf = [0u8; 4200];
    let t = q.b.engine.poll_transmit(q.now, &mut q.b.mem, &mut buf[..]).unwrap();
    // Deliver b's CNP (addressed to a's QP in q) to p's a, whose QP has the same number.
    let before = p.a.engine.counters();
    p.a.engine.handle_datagram(p.now, &t.envelope, &buf[..t.len], &mut p.a.mem);
    let after = p.a.engine.counters();
    assert_eq!(after.cnps_rcvd, 0);
    assert_eq!(after.rcvd_dropped, before.rcvd_dropped + 1);
}
