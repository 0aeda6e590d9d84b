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

/// One step of [`direct_and_packet_atomics_keep_rcs_order`]'s workload.
#[derive(Clone, Debug)]
enum Step {
    /// A FETCH_ADD of `add` on B's word, offered to be applied directly with B's grant if
    /// A holds one (the runtime's part), or posted as any WR.
    Atomic { add: u64, direct: bool },
    /// A WRITE elsewhere in B's region: work that leaves the QP not idle until its ACK.
    Write,
}

fn step() -> impl proptest::strategy::Strategy<Value = (Step, bool)> {
    use proptest::prelude::*;
    let s = prop_oneof![
        3 => (1u64..1000, any::<bool>()).prop_map(|(add, direct)| Step::Atomic { add, direct }),
        1 => Just(Step::Write),
    ];
    (s, any::<bool>())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    /// Atomics applied directly and atomics by packet, mixed with WRITEs, over a wire that
    /// drops one packet in `drop_one_in`, driven after some steps and not after others:
    /// whatever went which way, each atomic found the sum of the adds posted before it
    /// (RC executes a QP's atomics in posting order), every WR completes once, in order,
    /// with success, and the word ends at the sum of all. The grant a direct atomic goes
    /// by is the last one that reached A beside B's answers (not one the wire dropped or
    /// still carries), checked against B's epoch as the runtime's gate does; and each atomic
    /// the runtime applied is one the engine completed as direct.
    #[test]
    fn direct_and_packet_atomics_keep_rcs_order(
        steps in proptest::collection::vec(step(), 1..40),
        drop_one_in in 20u64..100,
        seed in proptest::prelude::any::<u64>(),
    ) {
        let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
        let mut state = seed;
        pair.set_filter(move |_| {
            // splitmix64: losses at random, one in `drop_one_in` (a periodic pattern can hit
            // the same retransmission every time). Rare enough that 8 tries of a request and
            // its answer do not all fail but once in 10^8.
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % drop_one_in != 0
        });
        let mut expected = Vec::new();
        let mut sum = 0u64;
        let mut applied = 0u64;
        for (i, (s, drive)) in steps.iter().enumerate() {
            let wr_id = i as u64;
            match *s {
                Step::Write => {
                    let w = pair.a.sge(0x1000 + 64 * i as u64, 64);
                    let op = SendOp::RdmaWrite { remote_addr: pair.b.addr_of(0x8000 + 64 * i as u64), rkey: pair.b.mr.rkey };
                    pair.a.post_send(wr(wr_id, op, &[w]));
                    expected.push((wr_id, None));
                }
                Step::Atomic { add, direct } => {
                    let op = SendOp::FetchAdd { remote_addr: pair.b.addr_of(0x100), rkey: pair.b.mr.rkey, add };
                    let r = pair.a.sge(0x10_000 + 8 * i as u64, 8);
                    let (now, latency) = (pair.now, pair.latency);
                    let arrived = |p: &&Pkt| !p.from_a && p.delivered && p.at + latency <= now;
                    let grant = pair.log.iter().rev().filter(arrived).find_map(|p| p.grant);
                    let Pair { a, b, .. } = &mut pair;
                    let epoch = b.engine.grant_epoch();
                    a.engine
                        .post_send_direct(a.qp, &wr(wr_id, op, &[r]), &mut a.mem, |d| {
                            let g = grant.filter(|g| direct && g.epoch == epoch)?;
                            let found = apply_on(&mut b.mem, &g, d);
                            applied += u64::from(found.is_some());
                            found
                        })
                        .unwrap();
                    expected.push((wr_id, Some(sum)));
                    sum += add;
                }
            }
            if *drive {
                pair.drive();
            }
        }
        pair.drive();
        let wcs = pair.a.poll_all();
        proptest::prop_assert_eq!(
            wcs.iter().map(|wc| (wc.wr_id, wc.status)).collect::<Vec<_>>(),
            expected.iter().map(|&(id, _)| (id, WcStatus::Success)).collect::<Vec<_>>()
        );
        for &(id, found) in &expected {
            if let Some(found) = found {
                let got = u64::from_ne_bytes(pair.a.read(0x10_000 + 8 * id, 8).try_into().unwrap());
                proptest::prop_assert_eq!(got, found, "atomic {} found the wrong value", id);
            }
        }
        proptest::prop_assert_eq!(pair.b.read(0x100, 8), sum.to_ne_bytes());
        proptest::prop_assert_eq!(pair.a.engine.counters().direct_atomics, applied);
    }
}
