//! ACKs beside packets (`Engine::allow_acks_beside`): a responder that answers a request at
//! once owes that request's ACK and sends its answer in the same call; between processes
//! of one host the ACK rides beside the answer instead of going as a packet of its own, and
//! the requester takes it just before the answer, where the ACK packet would have been.
//! Each side is stepped by hand here, as the runtime does it: the ACK is owed when the
//! answer is posted.

mod common;

use common::*;
use softrdma_engine::*;
use softrdma_wire::{Opcode, RocePacket, Syndrome};

const LEN: u32 = 64;

/// Everything `from` sends now, in order: each packet and what rides beside it.
fn sent(from: &mut Node, now: Instant) -> Vec<(Transmit, Vec<u8>)> {
    let mut buf = vec![0u8; 4200];
    std::iter::from_fn(|| {
        let t = from.engine.poll_transmit(now, &mut from.mem, &mut buf)?;
        Some((t, buf[..t.len].to_vec()))
    })
    .collect()
}

/// `to` takes what was sent, as the runtime hands an inbox's entries over.
fn take(to: &mut Node, now: Instant, packets: &[(Transmit, Vec<u8>)]) {
    for (t, bytes) in packets {
        if let Some(ack) = t.ack_beside {
            to.engine.handle_ack_beside(now, &t.envelope, bytes, ack);
        }
        to.engine.handle_datagram_with(now, &t.envelope, IpInfo::default(), bytes, &mut to.mem);
    }
}

fn opcode(bytes: &[u8]) -> Opcode {
    RocePacket::new_checked(bytes).unwrap().bth().opcode()
}

fn send(wr_id: u64, n: &Node) -> SendWr<'static> {
    let sge = Box::leak(Box::new([n.sge(0, LEN)]));
    wr(wr_id, SendOp::Send, &sge[..])
}

/// A pair whose two QPs may carry ACKs beside their requests, with receives posted.
fn pair() -> Pair {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu4096);
    for n in [&mut pair.a, &mut pair.b] {
        assert!(n.engine.allow_acks_beside(n.qp, true));
        for i in 0..8 {
            n.post_recv(100 + i, 0x1000 * (i + 1), LEN);
        }
    }
    pair
}

#[test]
fn an_answer_carries_the_ack_it_owes_and_the_asker_takes_it_first() {
    let mut pair = pair();
    let now = pair.now;
    for round in 0..3u64 {
        pair.a.post_send(send(round, &pair.a));
        let ping = sent(&mut pair.a, now);
        assert_eq!(ping.len(), 1, "round {round}");
        // A's own ACK for B's last answer rode beside this ping (from round 1 on).
        assert_eq!(ping[0].0.ack_beside.is_some(), round > 0, "round {round}");
        take(&mut pair.b, now, &ping);
        // B's last answer completes by that ACK, before the ping's receive.
        let answered = (round > 0).then_some((10 + round - 1, WcStatus::Success));
        let expected: Vec<_> = answered.into_iter().chain([(100 + round, WcStatus::Success)]).collect();
        assert_eq!(outcomes(&pair.b.poll_all()), expected, "round {round}");

        // B answers at once: one packet, its ACK of the ping beside it.
        pair.b.post_send(send(10 + round, &pair.b));
        let answer = sent(&mut pair.b, now);
        assert_eq!(answer.len(), 1, "the answer alone, round {round}");
        let (t, bytes) = &answer[0];
        assert_eq!(opcode(bytes), Opcode::RC_SEND_ONLY);
        let ack = t.ack_beside.expect("the ping's ACK beside the answer");
        assert_eq!(ack.psn, RocePacket::new_checked(&ping[0].1[..]).unwrap().bth().psn());
        assert!(matches!(ack.aeth.syndrome, Syndrome::Ack { .. }));

        // A's send completes before its receive, as after an ACK packet and the answer.
        take(&mut pair.a, now, &answer);
        assert_eq!(outcomes(&pair.a.poll_all()), [(round, WcStatus::Success), (100 + round, WcStatus::Success)]);
        pair.a.post_recv(100 + round, 0x1000 * (round + 1), LEN);
        pair.b.post_recv(100 + round, 0x1000 * (round + 1), LEN);
    }
    // Each ACK counts as a packet sent and received, where it rode or not.
    let (a, b) = (pair.a.engine.counters(), pair.b.engine.counters());
    assert_eq!((a.sent_packets, b.rcvd_packets), (3 + 2, 3 + 2), "three pings and two ACKs beside them");
    assert_eq!((b.sent_packets, a.rcvd_packets), (3 + 3, 3 + 3), "three answers and three ACKs beside them");
    assert_eq!((a.rcvd_acks_beside, b.rcvd_acks_beside), (3, 2));
}

#[test]
fn without_a_request_to_ride_or_when_not_allowed_or_a_nak_the_ack_is_a_packet() {
    // Nothing to answer with: the ACK goes alone, as a packet.
    let mut pair = pair();
    let now = pair.now;
    pair.a.post_send(send(1, &pair.a));
    let ping = sent(&mut pair.a, now);
    take(&mut pair.b, now, &ping);
    let ack = sent(&mut pair.b, now);
    assert_eq!(ack.len(), 1);
    assert_eq!((opcode(&ack[0].1), ack[0].0.ack_beside), (Opcode::RC_ACKNOWLEDGE, None));

    // Not allowed (a peer whose inbox does not take them): a packet, then the answer.
    assert!(pair.b.engine.allow_acks_beside(pair.b.qp, false));
    pair.a.post_send(send(2, &pair.a));
    let ping = sent(&mut pair.a, now);
    take(&mut pair.b, now, &ping);
    pair.b.post_send(send(20, &pair.b));
    let out: Vec<_> = sent(&mut pair.b, now).into_iter().map(|(t, b)| (opcode(&b), t.ack_beside)).collect();
    assert_eq!(out, [(Opcode::RC_ACKNOWLEDGE, None), (Opcode::RC_SEND_ONLY, None)]);

    // An RNR NAK (B has no receive left) never rides: it goes first, as a packet.
    assert!(pair.b.engine.allow_acks_beside(pair.b.qp, true));
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu4096);
    assert!(pair.b.engine.allow_acks_beside(pair.b.qp, true));
    pair.a.post_recv(100, 0x1000, LEN);
    pair.a.post_send(send(3, &pair.a));
    let ping = sent(&mut pair.a, now);
    take(&mut pair.b, now, &ping);
    pair.b.post_send(send(30, &pair.b));
    let out = sent(&mut pair.b, now);
    assert_eq!(out.len(), 2);
    assert_eq!(opcode(&out[0].1), Opcode::RC_ACKNOWLEDGE);
    assert!(matches!(RocePacket::new_checked(&out[0].1[..]).unwrap().aeth().unwrap().syndrome(), Syndrome::RnrNak(_)));
    assert_eq!((opcode(&out[1].1), out[1].0.ack_beside), (Opcode::RC_SEND_ONLY, None));
}

#[test]
fn an_ack_beside_acts_only_as_its_packet_would_have() {
    let mut pair = pair();
    let now = pair.now;
    pair.a.post_send(send(1, &pair.a));
    let ping = sent(&mut pair.a, now);
    take(&mut pair.b, now, &ping);
    pair.b.post_send(send(10, &pair.b));
    let answer = sent(&mut pair.b, now);
    let (t, bytes) = &answer[0];
    let ack = t.ack_beside.unwrap();

    // From another address: dropped, nothing completes.
    let stranger = softrdma_wire::Envelope::rocev2([10, 9, 9, 9].into(), 4791, pair.a.addr).unwrap();
    let dropped = pair.a.engine.counters().rcvd_dropped;
    pair.a.engine.handle_ack_beside(now, &stranger, bytes, ack);
    assert_eq!(pair.a.engine.counters().rcvd_dropped, dropped + 1);
    // A NAK in that place: refused (a NAK always goes as a packet).
    let rnr = Syndrome::RnrNak(softrdma_wire::RnrTimer::new(1).unwrap());
    let nak = AckBeside { aeth: softrdma_wire::AethRepr { syndrome: rnr, ..ack.aeth }, ..ack };
    let malformed = pair.a.engine.counters().rcvd_malformed;
    pair.a.engine.handle_ack_beside(now, &t.envelope, bytes, nak);
    assert_eq!(pair.a.engine.counters().rcvd_malformed, malformed + 1);
    // Too short to name a QP: malformed.
    let malformed = pair.a.engine.counters().rcvd_malformed;
    pair.a.engine.handle_ack_beside(now, &t.envelope, &bytes[..8], ack);
    assert_eq!(pair.a.engine.counters().rcvd_malformed, malformed + 1);
    assert!(pair.a.poll_all().is_empty(), "nothing of that completed the ping");

    // Its own, from the peer: the ping completes.
    pair.a.engine.handle_ack_beside(now, &t.envelope, bytes, ack);
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
    // Again (a duplicate): nothing more.
    pair.a.engine.handle_ack_beside(now, &t.envelope, bytes, ack);
    assert!(pair.a.poll_all().is_empty());
}

#[test]
fn an_ack_beside_is_quiet_only_when_it_retires_unsignaled_sends_and_writes() {
    // The runtime may take such an ACK after its packet's completion is returned
    // (`Engine::ack_beside_is_quiet`): nothing it does is seen but room in the send queue.
    let mut pair = pair();
    let now = pair.now;
    let unsignaled = |wr_id: u64, n: &Node| SendWr { flags: SendFlags(0), ..send(wr_id, n) };
    let (mut quiet, mut acks) = (Vec::new(), Vec::new());
    for (round, signaled) in [false, true, false].into_iter().enumerate() {
        let round = round as u64;
        let ping = if signaled { send(round, &pair.a) } else { unsignaled(round, &pair.a) };
        pair.a.post_send(ping);
        let ping = sent(&mut pair.a, now);
        take(&mut pair.b, now, &ping);
        pair.b.poll_all();
        pair.b.post_send(send(10 + round, &pair.b));
        let answer = sent(&mut pair.b, now);
        let (t, bytes) = &answer[0];
        let ack = t.ack_beside.expect("the ping's ACK beside the answer");
        quiet.push(pair.a.engine.ack_beside_is_quiet(bytes, ack));
        acks.push(ack);
        take(&mut pair.a, now, &answer);
        pair.a.poll_all();
        pair.a.post_recv(100 + round, 0x1000 * (round + 1), LEN);
        pair.b.post_recv(100 + round, 0x1000 * (round + 1), LEN);
    }
    assert_eq!(quiet, [true, false, true], "quiet unless it completes a signaled SEND");

    // Nor for a packet that names no QP.
    assert!(!pair.a.engine.ack_beside_is_quiet(&[0u8; 4], acks[0]), "no transport header");
}
