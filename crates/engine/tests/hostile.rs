//! A hostile peer: whatever arrives from the network, the engine never panics, and memory
//! outside the registrations that allow it never changes.
//!
//! The target device registers one region for remote access and keeps guard memory on both
//! sides of it (and a local-only region). Hostile input is of two kinds: arbitrary bytes,
//! and well-formed packets with a valid ICRC whose opcode, PSN, R_Key (the real one or
//! not), address and length are chosen by the attacker, aimed at connected RC and UC QPs
//! and at a UD QP. Between packets the engine transmits and fires its timers as usual.

mod common;

use common::*;
use proptest::prelude::*;
use softrdma_engine::*;
use softrdma_wire::opcode::{OPCODES, PayloadRule};
use softrdma_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Envelope, ExtHeaders, FethRepr, Headers, IethRepr,
    ImmDtRepr, Msn, PKey, Psn, QKey, Qpn, RKey, RethRepr, RoceRepr, Syndrome,
};

/// The remotely accessible region: `[REMOTE, REMOTE + REMOTE_LEN)`.
const REMOTE: u64 = BASE + 0x4_0000;
const REMOTE_LEN: u64 = 0x1_0000;

struct Target {
    pair: Pair,
    uc: Qpn,
    ud: Qpn,
    remote_rkey: RKey,
    local_only_rkey: RKey,
}

fn target() -> Target {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu1024);
    // Replace b's whole-memory MR by a small remote region and a local-only one.
    pair.b.engine.dereg_mr(pair.b.mr.lkey).unwrap();
    let remote = pair.b.engine.reg_mr(pair.b.pd, REMOTE, REMOTE_LEN, Access::ALL).unwrap();
    let local = pair.b.engine.reg_mr(pair.b.pd, BASE, 0x1_0000, Access::LOCAL_WRITE).unwrap();
    pair.b.mr = remote;
    let (ai, bi) = (init_attr(&pair.a, QpType::Uc), init_attr(&pair.b, QpType::Uc));
    let (_, uc) = pair.add_connected(&ai, &bi, Mtu::Mtu1024);
    let ud_init = QpInitAttr { qp_type: QpType::Ud, ..init_attr(&pair.b, QpType::Ud) };
    let ud = pair.b.engine.create_qp(&ud_init).unwrap();
    let e = &mut pair.b.engine;
    let init = QpAttr { qp_state: QpState::Init, qkey: QKey(0x1111_1111), ..QpAttr::default() };
    e.modify_qp(ud, &init, AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY).unwrap();
    e.modify_qp(ud, &QpAttr { qp_state: QpState::Rtr, ..init }, AttrMask::STATE).unwrap();
    e.modify_qp(ud, &QpAttr { qp_state: QpState::Rts, ..init }, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
    // Receives land in the remote region too (they need LOCAL_WRITE, which it has).
    for (i, qp) in [pair.b.qp, uc, ud].into_iter().enumerate() {
        for k in 0..8u64 {
            let sge = Sge { addr: REMOTE + 0x1000 * (i as u64 * 8 + k) % REMOTE_LEN, length: 0x800, lkey: remote.lkey };
            let _ = pair.b.engine.post_recv(qp, &[RecvWr { wr_id: k, sg_list: &[sge] }]);
        }
    }
    Target { pair, uc, ud, remote_rkey: remote.rkey, local_only_rkey: local.rkey }
}

/// Every byte of b's memory outside the remote region.
fn outside(t: &Target) -> Vec<u8> {
    let m = t.pair.b.mem.bytes();
    let (lo, hi) = ((REMOTE - BASE) as usize, (REMOTE - BASE + REMOTE_LEN) as usize);
    let mut v = m[..lo].to_vec();
    v.extend_from_slice(&m[hi..]);
    v
}

/// A well-formed packet from a to b, as the attacker wants it.
#[derive(Debug, Clone)]
struct Attack {
    opcode_index: usize,
    qp: u8,
    psn_offset: i32,
    key: u8,
    va: u64,
    len: u32,
    payload_len: usize,
    ack_req: bool,
}

fn attack() -> impl Strategy<Value = Attack> {
    (
        0..OPCODES.len(),
        0u8..4,
        prop_oneof![Just(0), -3i32..4, any::<i32>()],
        0u8..4,
        prop_oneof![
            Just(REMOTE),
            REMOTE..REMOTE + REMOTE_LEN,
            (REMOTE - 0x100)..REMOTE,
            (REMOTE + REMOTE_LEN - 0x100)..(REMOTE + REMOTE_LEN + 0x100),
            Just(BASE),
            any::<u64>()
        ],
        prop_oneof![Just(0u32), 1u32..0x2000, Just(0x1_0001), any::<u32>()],
        prop_oneof![Just(0usize), 1usize..64, Just(1024), 1000usize..1100],
        any::<bool>(),
    )
        .prop_map(|(opcode_index, qp, psn_offset, key, va, len, payload_len, ack_req)| Attack {
            opcode_index,
            qp,
            psn_offset,
            key,
            va,
            len,
            payload_len,
            ack_req,
        })
}

fn send_attack(t: &mut Target, a: &Attack, expected_psn: Psn) {
    let info = &OPCODES[a.opcode_index];
    let dest = match a.qp {
        0 => t.pair.b.qp,
        1 => t.uc,
        2 => t.ud,
        _ => Qpn::new(0x77).unwrap(), // no such QP
    };
    let rkey = match a.key {
        0 => t.remote_rkey,
        1 => t.local_only_rkey,
        2 => RKey(t.remote_rkey.0 ^ 1),
        _ => RKey(0),
    };
    let payload_len = match info.payload {
        PayloadRule::None => 0,
        PayloadRule::PathMtu => 1024,
        PayloadRule::Exactly(n) => usize::from(n),
        PayloadRule::UpToPathMtuNonEmpty => a.payload_len.clamp(1, 4096),
        PayloadRule::UpToPathMtu => a.payload_len.min(4096),
    };
    let payload = vec![0xeeu8; payload_len];
    let h = info.headers;
    let repr = RoceRepr {
        bth: BthRepr {
            opcode: info.opcode,
            solicited_event: false,
            mig_req: false,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: dest,
            ack_req: a.ack_req,
            psn: Psn::from_u24_truncating(expected_psn.value().wrapping_add(a.psn_offset as u32)),
        },
        ext: ExtHeaders {
            xrceth: h.contains(Headers::XRCETH).then_some(softrdma_wire::XrcEthRepr { srqn: a.len & 0xff_ffff }),
            feth: h.contains(Headers::FETH).then_some(FethRepr { selectivity: 0, placement_type: 1 }),
            reth: h.contains(Headers::RETH).then_some(RethRepr { virtual_address: a.va, rkey, dma_length: a.len }),
            aeth: h
                .contains(Headers::AETH)
                .then_some(AethRepr { syndrome: Syndrome::from_u8(a.len as u8), msn: Msn::default() }),
            deth: h
                .contains(Headers::DETH)
                .then_some(DethRepr { qkey: QKey(0x1111_1111), src_qp: Qpn::new(9).unwrap() }),
            atomic_eth: h.contains(Headers::ATOMIC_ETH).then_some(AtomicEthRepr {
                virtual_address: a.va,
                rkey,
                swap_add: 1,
                compare: 0,
            }),
            atomic_ack_eth: h.contains(Headers::ATOMIC_ACK_ETH).then_some(AtomicAckEthRepr { original_data: 7 }),
            imm_dt: h.contains(Headers::IMM_DT).then_some(ImmDtRepr([1, 2, 3, 4])),
            ieth: h.contains(Headers::IETH).then_some(IethRepr { rkey }),
        },
        payload: &payload,
    };
    let envelope = Envelope::rocev2(t.pair.a.addr, 0xc000, t.pair.b.addr).unwrap();
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&envelope, &mut buf).unwrap();
    let now = t.pair.now;
    t.pair.b.engine.handle_datagram(now, &envelope, &buf, &mut t.pair.b.mem);
}

fn drain(t: &mut Target) {
    let mut buf = vec![0u8; 4200];
    for _ in 0..10_000 {
        if t.pair.b.engine.poll_transmit(t.pair.now, &mut t.pair.b.mem, &mut buf).is_none() {
            break;
        }
    }
    t.pair.now += std::time::Duration::from_millis(1);
    t.pair.b.engine.handle_timeout(t.pair.now);
    while t.pair.b.engine.poll_cq(t.pair.b.cq).is_some() {}
    while t.pair.b.engine.poll_event().is_some() {}
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn hostile_packets_never_touch_memory_outside_the_remote_region(attacks in prop::collection::vec(attack(), 1..40)) {
        let mut t = target();
        let guard = outside(&t);
        // Receives and PSNs start at the harness's 0xfffffe; the attacker knows them.
        let mut expected = Psn::new(0xfffffe).unwrap();
        for a in &attacks {
            send_attack(&mut t, a, expected);
            drain(&mut t);
            expected = expected.next();
        }
        prop_assert!(outside(&t) == guard, "memory outside the remote region changed");
    }

    #[test]
    fn arbitrary_bytes_never_panic_or_touch_memory(datagrams in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..1200), 1..20)) {
        let mut t = target();
        let before = t.pair.b.mem.clone();
        let envelope = Envelope::rocev2(t.pair.a.addr, 0xc000, t.pair.b.addr).unwrap();
        for d in &datagrams {
            t.pair.b.engine.handle_datagram(t.pair.now, &envelope, d, &mut t.pair.b.mem);
            drain(&mut t);
        }
        // Random bytes almost never pass the ICRC; nothing may be written at all.
        prop_assert!(t.pair.b.mem == before);
    }
}
