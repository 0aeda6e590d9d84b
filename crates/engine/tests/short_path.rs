//! The requester's short path for a new message of one packet (`one_packet_request` in
//! `transmit.rs`) against the general path it stands in for: every scenario drawn runs
//! twice, once with the short path and once with
//! [`DeviceConfig::one_packet_short_path`] off, and both runs must put the same bytes on
//! the wire at the same instants, complete the same work requests the same way on both
//! sides, leave the same memory and count the same. The scenarios mix what the short path
//! takes (SENDs and WRITEs of up to a path MTU, with and without immediate, inline or from
//! registered memory) with what it leaves to the general path (longer messages, READs,
//! atomics, zero-length SGEs, bad keys, fences), in both directions with ACKs carried
//! beside answers, over a lossy wire (resent messages go through the short path again) and
//! a peer window of a few packets.

mod common;

use common::*;
use proptest::prelude::*;
use softrdma_engine::*;
use softrdma_wire::{Opcode, RKey};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
}

#[derive(Clone, Debug)]
struct Step {
    kind: Kind,
    /// The SGEs' lengths (one of them may be zero).
    pieces: Vec<u32>,
    inline: bool,
    signaled: bool,
    solicited: bool,
    fence: bool,
    bad_key: bool,
    /// A WRITE, READ or atomic with a wrong R_Key.
    bad_remote: bool,
}

#[derive(Clone, Debug)]
struct Scenario {
    mtu: Mtu,
    window: Option<u32>,
    a: Vec<Step>,
    b: Vec<Step>,
    /// Indices of packets the wire loses (counted over both directions).
    lost: Vec<usize>,
    /// Receives each side posts (fewer than the SENDs coming: RNR NAKs), and which of them
    /// have a wrong local key or room for only 16 bytes.
    recvs: u64,
    bad_recvs: Vec<u64>,
    short_recvs: Vec<u64>,
}

fn step(mtu: u32) -> impl Strategy<Value = Step> {
    let kind = prop_oneof![
        4 => Just(Kind::Send),
        2 => Just(Kind::SendImm),
        4 => Just(Kind::Write),
        2 => Just(Kind::WriteImm),
        1 => Just(Kind::Read),
        1 => Just(Kind::FetchAdd),
    ];
    // Lengths around what the short path takes: none, a few bytes, the MTU and past it.
    let piece = prop_oneof![Just(0u32), 1u32..64, Just(mtu - 1), Just(mtu), Just(mtu + 1), 1u32..2 * mtu + 8];
    (kind, prop::collection::vec(piece, 1..4), any::<[bool; 4]>(), 0u8..40, 0u8..40).prop_map(
        |(kind, pieces, [inline, signaled, solicited, fence], bad, bad_remote)| Step {
            kind,
            pieces,
            inline,
            signaled,
            solicited,
            fence,
            bad_key: bad == 0,
            bad_remote: bad_remote == 0,
        },
    )
}

fn scenario() -> impl Strategy<Value = Scenario> {
    prop_oneof![Just(Mtu::Mtu256), Just(Mtu::Mtu1024), Just(Mtu::Mtu4096)].prop_flat_map(|mtu| {
        let bytes = mtu.bytes();
        (
            prop_oneof![Just(None), Just(Some(4u32)), Just(Some(512))],
            prop::collection::vec(step(bytes), 1..20),
            prop::collection::vec(step(bytes), 0..8),
            prop::collection::vec(0usize..80, 0..4),
            prop_oneof![Just(32u64), 0u64..32],
            prop::collection::vec(0u64..32, 0..2),
            prop::collection::vec(0u64..32, 0..2),
        )
            .prop_map(move |(window, a, b, lost, recvs, bad_recvs, short_recvs)| Scenario {
                mtu,
                window,
                a,
                b,
                lost,
                recvs,
                bad_recvs,
                short_recvs,
            })
    })
}

/// Where each side's sends come from, where WRITEs, READs and atomics land in the peer,
/// and where its receives are.
const SOURCE: u64 = 0;
const TARGET: u64 = 0x10_0000;
const ATOMIC: u64 = 0x20_0000;
const RECV: u64 = 0x30_0000;
const RECV_LEN: u32 = 3 * 4096;

/// Everything a run leaves that the two paths must agree on.
#[derive(Debug, PartialEq)]
struct Outcome {
    wire: Vec<(bool, Instant, bool, Vec<u8>)>,
    completions: [Vec<Wc>; 2],
    memory: [Vec<u8>; 2],
    counters: [Counters; 2],
    /// Packets each side built by the short path (`Counters::sent_by_short_path`).
    short_path: [u64; 2],
    /// Requests each side took by the short path (`Counters::rcvd_by_short_path`).
    short_path_received: [u64; 2],
}

fn post(n: &mut Node, peer_rkey: RKey, steps: &[Step], first_id: u64) {
    for (i, s) in steps.iter().enumerate() {
        let length: u32 = s.pieces.iter().sum();
        let mut sges = Vec::new();
        let mut at = SOURCE;
        for &len in &s.pieces {
            let lkey = if s.bad_key { LKey(n.mr.lkey.0 ^ 0x100) } else { n.mr.lkey };
            sges.push(Sge { addr: BASE + at, length: len, lkey });
            at += u64::from(len);
        }
        let id = first_id + i as u64;
        let remote = |base: u64| BASE + base + (id % 8) * 0x2000;
        let peer_rkey = if s.bad_remote { RKey(peer_rkey.0 ^ 0x100) } else { peer_rkey };
        let op = match s.kind {
            Kind::Send => SendOp::Send,
            Kind::SendImm => SendOp::SendWithImm { imm: (id as u32).to_be_bytes() },
            Kind::Write => SendOp::RdmaWrite { remote_addr: remote(TARGET), rkey: peer_rkey },
            Kind::WriteImm => SendOp::RdmaWriteWithImm {
                remote_addr: remote(TARGET),
                rkey: peer_rkey,
                imm: (id as u32).to_be_bytes(),
            },
            Kind::Read => SendOp::RdmaRead { remote_addr: remote(TARGET), rkey: peer_rkey },
            Kind::FetchAdd => SendOp::FetchAdd { remote_addr: BASE + ATOMIC + (id % 8) * 8, rkey: peer_rkey, add: id },
        };
        let sges = if matches!(s.kind, Kind::FetchAdd) {
            vec![Sge { addr: BASE + SOURCE + 0x8_0000 + id * 8, length: 8, lkey: n.mr.lkey }]
        } else {
            sges
        };
        let mut flags = SendFlags::default();
        for (on, flag) in [
            (s.signaled, SendFlags::SIGNALED),
            (s.solicited, SendFlags::SOLICITED),
            (s.fence, SendFlags::FENCE),
            (
                s.inline && length <= 64 && matches!(s.kind, Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm),
                SendFlags::INLINE,
            ),
        ] {
            if on {
                flags = flags | flag;
            }
        }
        let wr = SendWr { wr_id: id, op, sg_list: &sges, flags, ud: None, xrc_srqn: None };
        // A WR the verbs refuse (too many bytes inline, say) is refused the same way by both
        // runs; the scenario goes on without it.
        let _ = n.engine.post_send(n.qp, &[wr], &n.mem);
    }
}

fn run(s: &Scenario, short_path: bool) -> Outcome {
    let config = |c: &mut DeviceConfig| {
        c.one_packet_short_path = short_path;
        c.peer_window = s.window;
    };
    let mut a = node_configured([10, 0, 0, 1], 1, QpType::Rc, QpCap::default(), &config);
    let mut b = node_configured([10, 0, 0, 2], 2, QpType::Rc, QpCap::default(), &config);
    a.fill(SOURCE, &pattern(0x9_0000, 1));
    b.fill(SOURCE, &pattern(0x9_0000, 2));
    let mut pair = pair_of(a, b, QpType::Rc, s.mtu);
    let post_recvs = |n: &mut Node, ids: std::ops::Range<u64>| {
        for i in ids {
            let len = if s.short_recvs.contains(&i) { 16 } else { RECV_LEN };
            let mut sge = n.sge(RECV + i * u64::from(RECV_LEN), len);
            if s.bad_recvs.contains(&i) {
                sge.lkey = LKey(sge.lkey.0 ^ 0x100);
            }
            n.engine.post_recv(n.qp, &[RecvWr { wr_id: 1000 + i, sg_list: &[sge] }]).unwrap();
        }
    };
    for n in [&mut pair.a, &mut pair.b] {
        n.engine.allow_acks_beside(n.qp, true);
        post_recvs(n, 0..s.recvs);
    }
    let lost = s.lost.clone();
    let mut seen = 0usize;
    pair.set_filter(move |_| {
        seen += 1;
        !lost.contains(&(seen - 1))
    });
    let (a_rkey, b_rkey) = (pair.a.mr.rkey, pair.b.mr.rkey);
    post(&mut pair.a, b_rkey, &s.a, 0);
    post(&mut pair.b, a_rkey, &s.b, 100);
    // SENDs past the receives posted are RNR NAKed and retried (rnr_retry 7: for ever)
    // until the rest are posted.
    pair.drive_for(std::time::Duration::from_millis(1));
    for n in [&mut pair.a, &mut pair.b] {
        post_recvs(n, s.recvs..32);
    }
    pair.drive();
    let region = |n: &Node| n.read(0, 0x40_0000 - 1).to_vec();
    Outcome {
        wire: pair.log.iter().map(|p| (p.from_a, p.at, p.delivered, p.bytes.clone())).collect(),
        completions: [pair.a.poll_all(), pair.b.poll_all()],
        memory: [region(&pair.a), region(&pair.b)],
        // Which path built a packet is the one thing the runs differ in.
        counters: [&pair.a, &pair.b].map(|n| Counters {
            sent_by_short_path: 0,
            rcvd_by_short_path: 0,
            ..n.engine.counters()
        }),
        short_path: [pair.a.engine.counters().sent_by_short_path, pair.b.engine.counters().sent_by_short_path],
        short_path_received: [pair.a.engine.counters().rcvd_by_short_path, pair.b.engine.counters().rcvd_by_short_path],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_short_path_sends_what_the_general_path_sends(s in scenario()) {
        let short = run(&s, true);
        let general = run(&s, false);
        prop_assert!(short.wire == general.wire, "the packets differ: {:?}", first_difference(&short.wire, &general.wire));
        prop_assert_eq!(&short.completions, &general.completions);
        prop_assert!(short.memory == general.memory, "the memory differs");
        prop_assert_eq!(short.counters, general.counters);
        prop_assert_eq!(general.short_path, [0, 0]);
        prop_assert_eq!(general.short_path_received, [0, 0]);
    }
}

fn first_difference<'a, T: PartialEq>(a: &'a [T], b: &'a [T]) -> Option<(usize, Option<&'a T>, Option<&'a T>)> {
    (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)).map(|i| (i, a.get(i), b.get(i)))
}

/// Longer SENDs and WRITEs, with and without immediate and solicited, through a peer window
/// of a few packets (so that bursts end, and ask for their ACK, in the middle of messages):
/// every packet after a message's first takes the requester's continuing short path, the
/// WRITEs' the responder's, and both do what the general paths do.
#[test]
fn the_packets_after_a_messages_first_take_the_short_path_through_a_small_window() {
    let kinds = [Kind::Write, Kind::SendImm, Kind::Send, Kind::WriteImm];
    let steps: Vec<Step> = (0..8)
        .map(|i| Step {
            kind: kinds[i % 4],
            pieces: vec![6 * 256 + 1 + i as u32, 40],
            inline: false,
            signaled: i % 3 != 0,
            solicited: i % 2 == 0,
            fence: false,
            bad_key: false,
            bad_remote: false,
        })
        .collect();
    let s = Scenario {
        mtu: Mtu::Mtu256,
        window: Some(4),
        a: steps,
        b: Vec::new(),
        lost: vec![7, 30],
        recvs: 32,
        bad_recvs: Vec::new(),
        short_recvs: Vec::new(),
    };
    let (short, general) = (run(&s, true), run(&s, false));
    if let Some(d) = first_difference(&short.wire, &general.wire) {
        panic!("the wire differs at packet {}: short path {:?}, general path {:?}", d.0, d.1, d.2);
    }
    assert_eq!(short.completions, general.completions);
    assert!(short.memory == general.memory, "the memory differs");
    assert_eq!(short.counters, general.counters);
    // Seven packets a message, the last six continuing (more where losses resend them),
    // and the two WRITEs without immediate's taken so by the responder.
    assert!(short.short_path[0] >= 8 * 6, "{:?}", short.short_path);
    assert!(short.short_path_received[1] >= 2 * 6, "{:?}", short.short_path_received);
    assert_eq!(general.short_path, [0, 0]);
    assert_eq!(general.short_path_received, [0, 0]);
}

/// Plain one-packet SENDs and WRITEs do take the short path (else the comparison above
/// would compare the general path with itself), and only with it on.
#[test]
fn plain_one_packet_messages_take_the_short_path() {
    let steps: Vec<Step> = [Kind::Send, Kind::Write, Kind::SendImm, Kind::WriteImm]
        .into_iter()
        .cycle()
        .take(12)
        .map(|kind| Step {
            kind,
            pieces: vec![100],
            inline: false,
            signaled: true,
            solicited: false,
            fence: false,
            bad_key: false,
            bad_remote: false,
        })
        .collect();
    let s = Scenario {
        mtu: Mtu::Mtu1024,
        window: Some(512),
        a: steps,
        b: Vec::new(),
        lost: Vec::new(),
        recvs: 32,
        bad_recvs: Vec::new(),
        short_recvs: Vec::new(),
    };
    let (short, general) = (run(&s, true), run(&s, false));
    assert_eq!(short.wire, general.wire);
    assert_eq!(short.wire.iter().filter(|p| p.0).count(), 12, "one packet per message");
    assert_eq!(short.short_path, [12, 0]);
    // The first packet teaches the responder its peer's UDP port: the general path's.
    assert_eq!(short.short_path_received, [0, 11]);
    assert_eq!(general.short_path, [0, 0]);
    assert_eq!(general.short_path_received, [0, 0]);
    assert!(short.completions[0].iter().all(|wc| wc.status == WcStatus::Success));
    assert_eq!(short.completions[0].len(), 12);
}

/// A region deregistered while a WRITE into it is under way: its packets after the first
/// are refused (the R_Key checked again for each, as `execute` checks it, by the short path
/// too), NAKed Remote Access Error, and nothing of theirs lands.
#[test]
fn a_write_under_way_into_a_deregistered_region_is_refused_past_its_first_packet() {
    let mut pair = Pair::connected(QpType::Rc, Mtu::Mtu256);
    let data = vec![0x5au8; 3 * 256];
    pair.a.fill(0, &data);
    let (remote, rkey) = (pair.b.addr_of(0x10_0000), pair.b.mr.rkey);
    // The FIRST gets through; the MIDDLE and LAST not, the first time.
    pair.set_filter(|p| !p.from_a || p.opcode() == Opcode::RC_RDMA_WRITE_FIRST);
    pair.a.post_send(wr(1, SendOp::RdmaWrite { remote_addr: remote, rkey }, &[pair.a.sge(0, 3 * 256)]));
    pair.drive_for(std::time::Duration::from_micros(10));
    assert_eq!(pair.b.read(0x10_0000, 256), &data[..256], "the FIRST landed");
    pair.b.engine.dereg_mr(pair.b.mr.lkey).unwrap();
    pair.filter = None;
    pair.drive();
    assert_eq!(outcomes(&pair.a.poll_all()), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(pair.b.read(0x10_0000 + 256, 512), &[0u8; 512][..], "nothing past the FIRST landed");
    assert_eq!(pair.b.engine.counters().resp_remote_access_errors, 1);
}
