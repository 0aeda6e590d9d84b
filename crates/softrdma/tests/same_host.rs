//! The same-host path: two contexts on one host exchange their packets through shared
//! memory (`softrdma_udp::local`), with the same results as over the sockets, and keep to
//! the sockets when it is turned off on either side.

mod common;

use std::time::Duration;

use common::*;
use softrdma::*;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

/// A WRITE of `len` bytes, a READ of them back into another place, and a SEND with
/// immediate: every byte checked.
fn write_read_send(a: &Side, b: &Side, len: usize) {
    let data = pattern(len, 5);
    a.mr.write(0, &data).unwrap();
    let target = b.mr.remote(0..len).unwrap();
    let sge = [a.mr.sge(0..len).unwrap()];
    a.qp.post_send(&[wr(1, SendOp::RdmaWrite { remote_addr: target.addr, rkey: target.rkey }, &sge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let back = [a.mr.sge(len..2 * len).unwrap()];
    a.qp.post_send(&[wr(2, SendOp::RdmaRead { remote_addr: target.addr, rkey: target.rkey }, &back)]).unwrap();
    let wc = a.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (2, WcStatus::Success, len as u32));
    let mut got = vec![0u8; len];
    a.mr.read(len, &mut got).unwrap();
    assert!(got == data, "the READ brought back what the WRITE put");
    let rsge = [b.mr.sge(len..len + 64).unwrap()];
    b.qp.post_recv(&[RecvWr { wr_id: 3, sg_list: &rsge }]).unwrap();
    let ssge = [a.mr.sge(0..64).unwrap()];
    a.qp.post_send(&[wr(4, SendOp::SendWithImm { imm: [9, 8, 7, 6] }, &ssge)]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let wc = b.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len, wc.imm_data), (3, WcStatus::Success, 64, Some([9, 8, 7, 6])));
    let mut got = [0u8; 64];
    b.mr.read(len, &mut got).unwrap();
    assert_eq!(got[..], data[..64]);
}

#[test]
fn contexts_on_one_host_exchange_packets_through_shared_memory() {
    let (a, b) = rc_pair(2 << 20);
    write_read_send(&a, &b, 1 << 20);
    // A packet resent because a loaded machine starved a side past the 4 ms ACK timeout
    // goes the same way, and may still be in the inbox when the completion is seen: the
    // responder receives all the requester sent within a moment.
    let start = std::time::Instant::now();
    let (ca, cb) = loop {
        let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
        if cb.same_host_rcvd == ca.same_host_sent || start.elapsed() > Duration::from_secs(5) {
            break (ca, cb);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // Every packet of the connection (QPs connected directly, no CM) took the path.
    assert!(ca.same_host_sent >= 256 + 2, "{ca:?}"); // the WRITE, READ request and SEND
    assert_eq!(ca.same_host_sent, ca.engine.sent_packets, "requester: every packet through shared memory");
    assert_eq!(cb.same_host_sent, cb.engine.sent_packets, "responder: every packet through shared memory");
    assert_eq!(cb.same_host_rcvd, ca.same_host_sent, "the responder received all the requester sent");
    // Nothing crossed a wire: the inbox's packets are taken without an ICRC check.
    assert_eq!(ca.engine.rcvd_packets, ca.same_host_rcvd, "{ca:?}");
    assert_eq!(ca.engine.rcvd_icrc_exact + ca.engine.rcvd_icrc_errors, 0, "no ICRC checked: {ca:?}");
}

#[test]
fn either_side_turning_the_path_off_keeps_both_on_the_sockets() {
    for off in [0, 1] {
        let mut options = [ContextOptions::default(), ContextOptions::default()];
        options[off].same_host = false;
        let (a, b) = pair_with(QpType::Rc, 256 << 10, options);
        write_read_send(&a, &b, 128 << 10);
        let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
        assert_eq!((ca.same_host_sent, cb.same_host_sent), (0, 0), "side {off} off: {ca:?} {cb:?}");
        assert!(ca.engine.sent_packets >= 32 + 2, "{ca:?}");
    }
}

#[test]
fn a_ud_datagram_through_shared_memory_arrives_with_its_grh() {
    let port = test_port();
    let (a, b) = (ud_side([127, 0, 0, 1], port), ud_side([127, 0, 0, 1], port));
    let rsge = [b.mr.sge(0..40 + 100).unwrap()];
    b.qp.post_recv(&[RecvWr { wr_id: 1, sg_list: &rsge }]).unwrap();
    a.mr.write(0, &pattern(100, 1)).unwrap();
    let av =
        AddressVector { dgid: b.ctx.gid(0).unwrap(), sgid_index: 0, hop_limit: 64, traffic_class: 0, flow_label: 0 };
    let ah = a.pd.create_ah(av).unwrap();
    let sge = [a.mr.sge(0..100).unwrap()];
    let dest = UdDest { ah: ah.id(), remote_qpn: Qpn::from_u24_truncating(b.qp.qpn()), remote_qkey: QKey(0x1111_2222) };
    a.qp.post_send(&[SendWr { ud: Some(dest), ..wr(2, SendOp::Send, &sge) }]).unwrap();
    assert_eq!(a.cq.wait(WAIT).unwrap().status, WcStatus::Success);
    let wc = b.cq.wait(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status, wc.byte_len, wc.grh), (1, WcStatus::Success, 140, Some(NetworkHdr::Ipv4)));
    assert_eq!(wc.src_qp.value(), a.qp.qpn());
    let mut got = vec![0u8; 140];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(got[20] >> 4, 4, "an IPv4 header in the GRH's last 20 bytes");
    assert_eq!(got[40..], pattern(100, 1)[..]);
    assert_eq!((a.ctx.counters().same_host_sent, b.ctx.counters().same_host_rcvd), (1, 1));
}
