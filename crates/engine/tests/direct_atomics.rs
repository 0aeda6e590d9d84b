//! Atomics a requester applies itself on a responder's memory, after the responder's
//! engine granted it (`softrdma_engine::direct`): what a grant says and when it goes void,
//! and that a direct atomic keeps RC's order, completes as its answer would have, and takes
//! no PSN.

mod common;

use common::*;
use softrdma_engine::*;
use softrdma_wire::Opcode;

/// What the responder's runtime would do with a grant: the CPU's atomic on its memory.
fn apply_on(mem: &mut VecMemory, grant: &AtomicGrant, d: &DirectAtomic) -> Option<u64> {
    let at = grant.local + grant.offset_of(d.va)?;
    Some(match d.op {
        DirectOp::FetchAdd { add } => mem.fetch_add(at, add).ok()?,
        DirectOp::CompareSwap { compare, swap } => mem.compare_swap(at, compare, swap).ok()?,
    })
}

/// A pair where A ran one FETCH_ADD of 1 on B's word at 0x100 by packet; B's grant.
fn granted() -> (Pair, AtomicGrant) {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let op = SendOp::FetchAdd { remote_addr: pair.b.addr_of(0x100), rkey: pair.b.mr.rkey, add: 1 };
    let r = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, op, &[r]));
    pair.drive();
    assert_eq!(pair.a.poll().unwrap().status, WcStatus::Success);
    let grant = pair.log.iter().find_map(|p| p.grant).expect("the atomic's answer carries a grant");
    (pair, grant)
}

/// A FETCH_ADD of `add` on B's word, its answer to A's `local`.
fn fetch_add(pair: &Pair, local: u64, add: u64) -> (SendOp, Sge) {
    (SendOp::FetchAdd { remote_addr: pair.b.addr_of(0x100), rkey: pair.b.mr.rkey, add }, pair.a.sge(local, 8))
}

#[test]
fn an_executed_atomic_is_answered_with_a_grant_for_its_whole_region() {
    let (pair, grant) = granted();
    let b = &pair.b;
    assert_eq!(
        grant,
        AtomicGrant { rkey: b.mr.rkey, va: BASE, len: MEM_LEN as u64, local: BASE, epoch: b.engine.grant_epoch() }
    );
    let with_grant: Vec<_> = pair.log.iter().filter(|p| p.grant.is_some()).map(|p| (p.from_a, p.opcode())).collect();
    assert_eq!(with_grant, [(false, Opcode::RC_ATOMIC_ACKNOWLEDGE)], "only the answer carries it");
    assert_eq!(grant.offset_of(BASE + MEM_LEN as u64 - 8), Some(MEM_LEN as u64 - 8));
    assert_eq!(grant.offset_of(BASE + MEM_LEN as u64 - 7), None, "past the region's end");
    assert_eq!(grant.offset_of(BASE - 8), None);
}

#[test]
fn a_direct_atomic_completes_at_once_with_no_packet_and_takes_no_psn() {
    let (mut pair, grant) = granted();
    let (op, r) = fetch_add(&pair, 0x8, 10);
    let sent_before = pair.log.len();
    let Pair { a, b, .. } = &mut pair;
    let mut asked = None;
    a.engine
        .post_send_direct(a.qp, &wr(2, op, &[r]), &mut a.mem, |d| {
            asked = Some(*d);
            apply_on(&mut b.mem, &grant, d)
        })
        .unwrap();
    let d = asked.expect("an idle QP's atomic is offered");
    assert_eq!((d.dest_qp, d.rkey, d.va), (b.qp, b.mr.rkey, b.addr_of(0x100)));
    let wc = a.poll().expect("completed at once");
    assert_eq!((wc.wr_id, wc.status, wc.opcode, wc.byte_len), (2, WcStatus::Success, WcOpcode::FetchAdd, 8));
    assert_eq!(a.read(0x8, 8), 1u64.to_ne_bytes(), "the value found");
    assert_eq!(b.read(0x100, 8), 11u64.to_ne_bytes());
    assert_eq!(a.engine.counters().direct_atomics, 1);
    pair.drive();
    assert_eq!(pair.log.len(), sent_before, "no packet either way");
    // The PSNs still agree: a WRITE after it goes by packet and completes.
    pair.a.fill(0x40, b"after");
    let w = pair.a.sge(0x40, 5);
    pair.a.post_send(wr(3, SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0x200), rkey: pair.b.mr.rkey }, &[w]));
    pair.drive();
    assert_eq!(pair.a.poll().map(|wc| (wc.wr_id, wc.status)), Some((3, WcStatus::Success)));
    assert_eq!(pair.b.read(0x200, 5), b"after");
    assert_eq!(pair.b.engine.counters().out_of_sequence, 0);
    assert_eq!(pair.b.engine.counters().duplicate_requests, 0);
}

#[test]
fn an_atomic_behind_unacknowledged_work_goes_as_a_packet_in_its_order() {
    let (mut pair, _) = granted();
    let w = pair.a.sge(0x40, 8);
    pair.a.post_send(wr(2, SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0x100), rkey: pair.b.mr.rkey }, &[w]));
    let (op, r) = fetch_add(&pair, 0x8, 10);
    let a = &mut pair.a;
    a.engine.post_send_direct(a.qp, &wr(3, op, &[r]), &mut a.mem, |_| panic!("not idle: not offered")).unwrap();
    assert!(a.poll().is_none());
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(2, WcStatus::Success), (3, WcStatus::Success)]);
    assert_eq!(pair.a.read(0x8, 8), 0u64.to_ne_bytes(), "the WRITE's zeroes came first");
    assert_eq!(pair.a.engine.counters().direct_atomics, 0);
}

#[test]
fn an_atomic_the_runtime_declines_goes_as_a_packet() {
    let (mut pair, _) = granted();
    let (op, r) = fetch_add(&pair, 0x8, 10);
    let a = &mut pair.a;
    a.engine.post_send_direct(a.qp, &wr(2, op, &[r]), &mut a.mem, |_| None).unwrap();
    assert!(a.poll().is_none(), "not done yet");
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(2, WcStatus::Success)]);
    assert_eq!(pair.b.read(0x100, 8), 11u64.to_ne_bytes());
    assert!(pair.log.iter().filter(|p| p.opcode() == Opcode::RC_FETCH_ADD).count() == 2);
}

#[test]
fn a_local_buffer_that_cannot_take_the_answer_fails_the_qp_as_the_answer_would() {
    let (mut pair, grant) = granted();
    let op = SendOp::FetchAdd { remote_addr: pair.b.addr_of(0x100), rkey: pair.b.mr.rkey, add: 10 };
    let bad = Sge { lkey: LKey(pair.a.mr.lkey.0 ^ 0x100), ..pair.a.sge(0x8, 8) };
    let Pair { a, b, .. } = &mut pair;
    a.engine.post_send_direct(a.qp, &wr(2, op, &[bad]), &mut a.mem, |d| apply_on(&mut b.mem, &grant, d)).unwrap();
    assert_eq!(outcomes(&a.poll_all()), [(2, WcStatus::LocProtErr)]);
    assert_eq!(a.engine.qp_state(a.qp), Some(QpState::Err));
    assert_eq!(b.read(0x100, 8), 11u64.to_ne_bytes(), "the remote atomic was done, as by packet");
}

#[test]
fn the_epoch_moves_on_whatever_could_refuse_the_next_atomic() {
    let (mut pair, grant) = granted();
    let b = &mut pair.b;
    assert_eq!(b.engine.grant_epoch(), grant.epoch);
    let mut last = grant.epoch;
    let mut moved = |engine: &Engine, what: &str| {
        assert!(engine.grant_epoch() > last, "{what} voids the grants");
        last = engine.grant_epoch();
    };
    let other = b.engine.reg_mr(b.pd, BASE, 4096, Access::ALL).unwrap();
    assert_eq!(b.engine.grant_epoch(), grant.epoch, "a new region changes no grant");
    b.engine.rereg_mr(other.lkey, None, None, Some(Access::LOCAL_WRITE)).unwrap();
    moved(&b.engine, "rereg_mr");
    b.engine.dereg_mr(other.lkey).unwrap();
    moved(&b.engine, "dereg_mr");
    let attr = QpAttr { qp_access_flags: Access::REMOTE_WRITE, ..QpAttr::default() };
    b.engine.modify_qp(b.qp, &attr, AttrMask::ACCESS_FLAGS).unwrap();
    moved(&b.engine, "modify_qp");
    // A QP failing by a peer's packet: a WRITE with a bad key puts B's QP in ERR.
    let sge = pair.a.sge(0, 8);
    let bad = softrdma_wire::RKey(pair.b.mr.rkey.0 ^ 1);
    pair.a.post_send(wr(9, SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0), rkey: bad }, &[sge]));
    pair.drive();
    assert_eq!(pair.b.engine.qp_state(pair.b.qp), Some(QpState::Err));
    moved(&pair.b.engine, "a QP in error");
    let qp = pair.b.qp;
    pair.b.engine.destroy_qp(qp).unwrap();
    moved(&pair.b.engine, "destroy_qp");
}

#[test]
fn no_grant_for_a_qp_without_remote_atomics_now() {
    // The atomic was executed, but its QP lost the right before the answer went: the
    // answer carries no grant (it is decided when the answer is sent).
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    let op = SendOp::FetchAdd { remote_addr: pair.b.addr_of(0x100), rkey: pair.b.mr.rkey, add: 1 };
    let r = pair.a.sge(0, 8);
    pair.a.post_send(wr(1, op, &[r]));
    // Deliver the request to B, but let B answer only after its QP's rights changed.
    let mut buf = vec![0u8; 4200];
    let t = pair.a.engine.poll_transmit(pair.now, &mut pair.a.mem, &mut buf).unwrap();
    pair.b.engine.handle_datagram_with(pair.now, &t.envelope, IpInfo::default(), &buf[..t.len], &mut pair.b.mem);
    let attr = QpAttr { qp_access_flags: Access::REMOTE_WRITE, ..QpAttr::default() };
    pair.b.engine.modify_qp(pair.b.qp, &attr, AttrMask::ACCESS_FLAGS).unwrap();
    let answer = pair.b.engine.poll_transmit(pair.now, &mut pair.b.mem, &mut buf).unwrap();
    assert_eq!(
        softrdma_wire::RocePacket::new_checked(&buf[..answer.len]).unwrap().bth().opcode(),
        Opcode::RC_ATOMIC_ACKNOWLEDGE
    );
    assert!(!answer.grant);
    assert_eq!(pair.b.engine.grant(pair.b.qp), None);
}
