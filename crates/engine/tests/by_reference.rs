//! Messages carried by reference (`softrdma_engine::reference`): the same-host path's one
//! copy. The pair's receiver copies from its sender's memory as a process of the host
//! would, so what is checked is what lands, what the wire carried, and that every rule of
//! the packets by value (PSNs, retries, keys, receives) holds for them too.

mod common;

use common::*;
use softrdma_engine::reference::{MIN_LEN, SEGMENT};
use softrdma_engine::*;
use softrdma_wire::Opcode;

fn pair() -> Pair {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu4096);
    assert!(pair.a.engine.allow_by_reference(pair.a.qp, true));
    pair
}

fn by_reference(pair: &Pair) -> usize {
    pair.log.iter().filter(|p| p.from_a && p.by_reference).count()
}

#[test]
fn a_long_write_is_a_packet_per_segment_and_lands_whole() {
    let mut pair = pair();
    let len = SEGMENT as usize;
    let data = pattern(len, 5);
    pair.a.fill(0, &data);
    let (remote, rkey) = (pair.b.addr_of(0x10_0000), pair.b.mr.rkey);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(0, len as u32)]));
    pair.drive();

    assert_eq!(pair.opcodes(true), [Opcode::RC_RDMA_WRITE_ONLY], "a segment in one packet, not 16");
    assert_eq!(by_reference(&pair), 1);
    assert!(pair.log[0].bytes.len() < 100, "the packet carries where the data is, not the data");
    assert_eq!(pair.b.read(0x10_0000, len), &data[..]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);

    // 300 KiB: five packets (four segments and a part), not 75.
    let len = 300 * 1024;
    let data = pattern(len, 8);
    pair.a.fill(0, &data);
    let sent = pair.log.len();
    pair.a.post_send(wr(2, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(0, len as u32)]));
    pair.drive();
    let requests: Vec<_> = pair.log[sent..].iter().filter(|p| p.from_a).collect();
    assert_eq!(requests.len(), 5);
    assert!(requests.iter().all(|p| p.by_reference));
    assert_eq!(pair.b.read(0x10_0000, len), &data[..]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(2, WcStatus::Success)]);
}

#[test]
fn short_messages_and_inline_ones_still_go_by_value() {
    let mut pair = pair();
    let data = pattern(MIN_LEN as usize - 1, 9);
    pair.a.fill(0, &data);
    let (remote, rkey) = (pair.b.addr_of(0x10_0000), pair.b.mr.rkey);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(0, MIN_LEN - 1)]));
    pair.drive();
    assert_eq!(by_reference(&pair), 0);
    assert_eq!(pair.opcodes(true).len(), 4, "16 KiB - 1 at MTU 4096");
    assert_eq!(pair.b.read(0x10_0000, data.len()), &data[..]);
}

#[test]
fn a_send_by_reference_scatters_over_the_receive_buffers() {
    let mut pair = pair();
    let len = 100_000;
    let data = pattern(len, 3);
    pair.a.fill(0x1000, &data);
    // Two receive SGEs: the message is split 40 000 + 60 000 across them, out of order in memory.
    let (first, second) = (pair.b.sge(0x30_0000, 40_000), pair.b.sge(0x10_0000, 70_000));
    pair.b.engine.post_recv(pair.b.qp, &[RecvWr { wr_id: 7, sg_list: &[first, second] }]).unwrap();
    // And two send SGEs, split elsewhere: 30 000 + 70 000.
    pair.a.fill(0x20_0000, &data[30_000..]);
    let sges = [pair.a.sge(0x1000, 30_000), pair.a.sge(0x20_0000, 70_000)];
    pair.a.post_send(wr(1, SendOp::SendWithImm { imm: [1, 2, 3, 4] }, &sges));
    pair.drive();

    assert_eq!(by_reference(&pair), len.div_ceil(SEGMENT as usize));
    assert_eq!(pair.b.read(0x30_0000, 40_000), &data[..40_000]);
    assert_eq!(pair.b.read(0x10_0000, 60_000), &data[40_000..]);
    let recv = pair.b.poll().expect("the receive completes");
    assert_eq!(
        (recv.wr_id, recv.status, recv.byte_len, recv.imm_data),
        (7, WcStatus::Success, len as u32, Some([1, 2, 3, 4]))
    );
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
}

#[test]
fn a_message_of_several_segments_survives_a_lost_middle_packet() {
    let mut pair = pair();
    let len = 2 * SEGMENT as usize + 12_345;
    let data = pattern(len, 11);
    pair.a.fill(0, &data);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if p.from_a && p.opcode() == Opcode::RC_RDMA_WRITE_MIDDLE && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let (remote, rkey) = (pair.b.addr_of(0x8000), pair.b.mr.rkey);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(0, len as u32)]));
    pair.a.post_send(wr(2, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(0, 8)]));
    pair.drive();

    let sent = pair.opcodes(true);
    assert_eq!(
        &sent[..3],
        [Opcode::RC_RDMA_WRITE_FIRST, Opcode::RC_RDMA_WRITE_MIDDLE, Opcode::RC_RDMA_WRITE_LAST],
        "a segment per packet"
    );
    assert!(sent.len() > 4, "the lost MIDDLE and what followed it were sent again: {sent:?}");
    assert_eq!(pair.b.read(0x8000, len), &data[..]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert!(pair.b.engine.counters().out_of_sequence > 0);
}

#[test]
fn a_message_keeps_its_carriage_when_sent_again() {
    // Two messages go by reference and execute, but their ACKs are lost; then the QP stops
    // sending by reference, and its ACK timeout sends both again. They must take the same
    // PSNs as before (one each), or the responder, expecting the PSN after the second,
    // would take the by-value packets of a message it executed for new ones.
    let mut pair = pair();
    let len = 64 * 1024;
    let (first, second) = (pattern(len, 2), pattern(len, 4));
    pair.a.fill(0, &first);
    pair.a.fill(0x20_0000, &second);
    let lost_until = Instant::ZERO + std::time::Duration::from_micros(40);
    pair.set_filter(move |p| p.from_a || p.at >= lost_until);
    let rkey = pair.b.mr.rkey;
    let (r1, r2) = (pair.b.addr_of(0x8000), pair.b.addr_of(0x30_0000));
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: r1, rkey }, &[pair.a.sge(0, len as u32)]));
    pair.a.post_send(wr(2, SendOp::RdmaWrite { remote_addr: r2, rkey }, &[pair.a.sge(0x20_0000, len as u32)]));
    pair.drive_for(std::time::Duration::from_micros(50));
    assert_eq!(by_reference(&pair), 2, "both sent, once each");
    assert!(pair.a.engine.allow_by_reference(pair.a.qp, false));
    pair.drive();

    assert_eq!(by_reference(&pair), 4, "both sent again by reference");
    assert!(pair.opcodes(true).iter().all(|&o| o == Opcode::RC_RDMA_WRITE_ONLY), "{:?}", pair.opcodes(true));
    assert_eq!(pair.b.engine.counters().duplicate_requests, 2);
    assert_eq!(pair.b.engine.counters().rcvd_by_reference, 2, "each copied once: a duplicate is not executed");
    assert_eq!(pair.b.engine.counters().naks_sent, 0);
    assert_eq!(pair.b.read(0x8000, len), &first[..]);
    assert_eq!(pair.b.read(0x30_0000, len), &second[..]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success), (2, WcStatus::Success)]);

    // A message posted now goes by value.
    pair.a.post_send(wr(3, SendOp::RdmaWrite { remote_addr: r1, rkey }, &[pair.a.sge(0x20_0000, len as u32)]));
    pair.drive();
    assert_eq!(by_reference(&pair), 4);
    assert_eq!(pair.b.read(0x8000, len), &second[..]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(3, WcStatus::Success)]);
}

#[test]
fn the_responder_checks_a_packet_by_reference_like_any_other() {
    let mut pair = pair();
    let len = 32 * 1024;
    pair.a.fill(0, &pattern(len, 1));
    let remote = pair.b.addr_of(MEM_LEN as u64 - 100); // runs past the region's end
    let rkey = pair.b.mr.rkey;
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(0, len as u32)]));
    pair.drive();
    assert_eq!(by_reference(&pair), 1);
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(pair.b.read(0, MEM_LEN), &vec![0u8; MEM_LEN][..], "nothing written anywhere");
}

#[test]
fn only_rc_sends_writes_and_reads_are_taken_by_reference() {
    // An atomic handed over as carried by reference is dropped, as malformed, and so is
    // anything for a QP that is not RC.
    let mut pair = pair();
    let (remote, rkey) = (pair.b.addr_of(0), pair.b.mr.rkey);
    let op = SendOp::FetchAdd { remote_addr: remote, rkey, add: 1 };
    pair.a.post_send(wr(1, op, &[pair.a.sge(0, 8)]));
    pair.set_filter(|p| !p.from_a);
    pair.drive_for(std::time::Duration::from_micros(10));
    let read = pair.log.iter().find(|p| p.from_a).expect("the atomic").clone();
    let before = pair.b.engine.counters().rcvd_malformed;
    let (b, a) = (&mut pair.b, &pair.a);
    let mut mem = Pulling { mine: &mut b.mem, theirs: &a.mem };
    b.engine.handle_referenced_datagram(pair.now, &read.envelope, IpInfo::default(), &read.bytes, 1, &mut mem);
    assert_eq!(pair.b.engine.counters().rcvd_malformed, before + 1);

    let mut uc = Pair::connected(QpType::Uc, Mtu::Mtu4096);
    assert!(uc.a.engine.allow_by_reference(uc.a.qp, true), "the QP exists");
    let len = 32 * 1024;
    uc.a.fill(0, &pattern(len, 1));
    let (remote, rkey) = (uc.b.addr_of(0), uc.b.mr.rkey);
    uc.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[uc.a.sge(0, len as u32)]));
    uc.drive();
    assert_eq!(uc.log.iter().filter(|p| p.by_reference).count(), 0, "UC sends by value");
    let first = uc.log[0].clone();
    let before = uc.b.engine.counters().rcvd_malformed;
    let (b, a) = (&mut uc.b, &uc.a);
    let mut mem = Pulling { mine: &mut b.mem, theirs: &a.mem };
    b.engine.handle_referenced_datagram(uc.now, &first.envelope, IpInfo::default(), &first.bytes, 1, &mut mem);
    assert_eq!(uc.b.engine.counters().rcvd_malformed, before + 1);
}

#[test]
fn a_long_read_is_answered_by_reference_and_survives_a_lost_response() {
    let mut pair = pair();
    let len = 2 * SEGMENT as usize + 777;
    let data = pattern(len, 6);
    pair.b.fill(0x1000, &data);
    let mut dropped = false;
    pair.set_filter(move |p| {
        if !p.from_a && p.opcode() == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    let (remote, rkey) = (pair.b.addr_of(0x1000), pair.b.mr.rkey);
    pair.a.post_send(wr(1, SendOp::RdmaRead { remote_addr: remote, rkey }, &[pair.a.sge(0x8000, len as u32)]));
    pair.drive();

    let responses: Vec<Opcode> = pair.log.iter().filter(|p| !p.from_a).map(Pkt::opcode).collect();
    assert_eq!(
        &responses[..3],
        [Opcode::RC_RDMA_READ_RESPONSE_FIRST, Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, Opcode::RC_RDMA_READ_RESPONSE_LAST],
        "a segment per response"
    );
    assert!(pair.log.iter().filter(|p| !p.from_a).all(|p| p.by_reference), "every response by reference");
    assert!(pair.log.iter().filter(|p| p.from_a).all(|p| p.by_reference), "every request asks for it");
    assert_eq!(pair.opcodes(true).len(), 2, "the READ, and once more for what the lost MIDDLE left");
    assert_eq!(pair.a.read(0x8000, len), &data[..]);
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::Success)]);
}

#[test]
fn a_response_in_the_other_carriage_than_asked_is_a_bad_response() {
    // A READ by reference answered by value (a responder that took the request as one by
    // value): its FIRST response is not a segment, and the requester must not take it for
    // one.
    let mut pair = pair();
    let len = 64 * 1024;
    pair.b.fill(0, &pattern(len, 1));
    pair.set_filter(|p| !p.from_a || !p.by_reference);
    let (remote, rkey) = (pair.b.addr_of(0), pair.b.mr.rkey);
    pair.a.post_send(wr(1, SendOp::RdmaRead { remote_addr: remote, rkey }, &[pair.a.sge(0x8000, len as u32)]));
    pair.drive_for(std::time::Duration::ZERO);
    let request = pair.log.iter().find(|p| p.from_a).expect("the READ request").clone();
    assert!(request.by_reference, "a long READ asks for its answer by reference");
    let b = &mut pair.b;
    b.engine.handle_datagram_with(pair.now, &request.envelope, IpInfo::default(), &request.bytes, &mut b.mem);
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::BadRespErr)]);
    assert_eq!(pair.a.read(0x8000, 16), &[0; 16], "nothing of it placed");
}

/// A seeded generator for the mixes below (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Seeded mixes of long and short SENDs, WRITEs and READs, some by reference and some by
/// value (the QP's permission turned off and on between posts and during retries), over a
/// link that loses up to 5 % of the packets either way: every WR completes successfully, in order, and every
/// byte is where the model puts it. `SOFTRDMA_SEEDS=N` runs more.
#[test]
fn seeded_mixes_under_loss_land_every_byte() {
    const SLOT: u64 = 1300 * 1024;
    let seeds: u64 = std::env::var("SOFTRDMA_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    for seed in 0..seeds {
        let mut rng = Rng(seed);
        let mtu = [Mtu::Mtu1024, Mtu::Mtu4096][rng.below(2) as usize];
        let mut pair = Pair::connected(QpType::Rc, mtu);
        let loss = rng.below(6);
        let mut wire = Rng(seed ^ 0x5eed);
        pair.set_filter(move |_| wire.below(100) >= loss);
        let mut expect_b = pair.b.mem.clone();
        let mut expect_a = pair.a.mem.clone();
        let mut reads = Vec::new();
        for slot in 0..3u64 {
            pair.a.engine.allow_by_reference(pair.a.qp, rng.below(4) != 0);
            let len = match rng.below(3) {
                0 => 1 + rng.below(u64::from(MIN_LEN)) as u32,
                _ => MIN_LEN + rng.below(SLOT - u64::from(MIN_LEN)) as u32,
            };
            let at = slot * SLOT;
            let data = pattern(len as usize, (seed + slot) as u8);
            let rkey = pair.b.mr.rkey;
            match rng.below(3) {
                0 => {
                    pair.a.fill(at, &data);
                    expect_a.slice_mut(BASE + at, data.len()).copy_from_slice(&data);
                    expect_b.slice_mut(BASE + at, data.len()).copy_from_slice(&data);
                    let remote = pair.b.addr_of(at);
                    pair.a.post_send(wr(slot, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(at, len)]));
                }
                1 => {
                    pair.a.fill(at, &data);
                    expect_a.slice_mut(BASE + at, data.len()).copy_from_slice(&data);
                    expect_b.slice_mut(BASE + at, data.len()).copy_from_slice(&data);
                    pair.b.post_recv(100 + slot, at, SLOT as u32);
                    pair.a.post_send(wr(slot, SendOp::Send, &[pair.a.sge(at, len)]));
                }
                _ => {
                    pair.b.fill(at, &data);
                    expect_b.slice_mut(BASE + at, data.len()).copy_from_slice(&data);
                    expect_a.slice_mut(BASE + at, data.len()).copy_from_slice(&data);
                    let remote = pair.b.addr_of(at);
                    pair.a.post_send(wr(slot, SendOp::RdmaRead { remote_addr: remote, rkey }, &[pair.a.sge(at, len)]));
                    reads.push(slot);
                }
            }
            pair.drive_for(std::time::Duration::from_micros(rng.below(200)));
        }
        // The permission changes while retries (of ~4 ms ACK timeouts) are under way too.
        for _ in 0..4 {
            pair.a.engine.allow_by_reference(pair.a.qp, rng.below(2) == 0);
            pair.drive_for(std::time::Duration::from_micros(rng.below(6000)));
        }
        pair.drive();
        let done = outcomes(&pair.a.poll_all());
        assert_eq!(done, [(0, WcStatus::Success), (1, WcStatus::Success), (2, WcStatus::Success)], "seed {seed}");
        assert!(pair.b.mem == expect_b, "seed {seed}: B's memory is the model's");
        assert!(pair.a.mem == expect_a, "seed {seed}: A's memory is the model's (READs {reads:?})");
    }
}
