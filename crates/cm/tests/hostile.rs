//! Hostile input: arbitrary bytes and mutated kernel MADs never make `handle_mad` panic,
//! and whatever the CM does with them stays within its bounds.

mod common;

use std::net::{IpAddr, SocketAddr};

use common::*;
use proptest::prelude::*;
use softrdma_cm::{Cm, CmConfig, ConnParam, steering_key};
use softrdma_engine::{Instant, QpState, QpType};
use softrdma_wire::cma::PortSpace;
use softrdma_wire::mad::MAD_LEN;

/// Every CM MAD the kernel sent in the captures.
fn captured() -> Vec<CapturedMad> {
    ["rxe2rxe-rping.pcap", "rxe2rxe-ib_write_bw-rdma_cm.pcap", "guest-to-host-rping-cm-req.pcap"]
        .iter()
        .flat_map(|f| mads_in(f))
        .collect()
}

/// A CM in the middle of everything: listening on TCP 7174 and UDP 7174 of 198.18.0.3
/// (the captures' passive address), with a connection waiting for accept and one
/// established, and an active connection waiting for its REP.
fn busy_cm() -> (Cm, Vec<softrdma_cm::CmId>) {
    let ip: IpAddr = "198.18.0.3".parse().unwrap();
    let peer: IpAddr = "198.18.0.2".parse().unwrap();
    let config = CmConfig { seed: 3, addresses: vec![ip], max_ids: 64, ..CmConfig::default() };
    let mut cm = Cm::new(config);
    let now = Instant::ZERO;
    let mut ids = Vec::new();
    for (ps, qp) in [(PortSpace::TCP, QpType::Rc), (PortSpace::UDP, QpType::Ud)] {
        let l = cm.create_id(ps, qp).unwrap();
        cm.bind_addr(l, SocketAddr::new("0.0.0.0".parse().unwrap(), 7174)).unwrap();
        cm.listen(l, 4).unwrap();
        ids.push(l);
    }
    let mads = mads_in("rxe2rxe-rping.pcap");
    let req = mad_at(&mads, 3);
    cm.handle_mad(now, req.src, req.dst, &req.bytes);
    let e = cm.poll_event().unwrap();
    ids.push(e.id);
    let a = cm.create_id(PortSpace::TCP, QpType::Rc).unwrap();
    cm.resolve_addr(now, a, Some(SocketAddr::new(ip, 0)), SocketAddr::new(peer, 7174)).unwrap();
    cm.resolve_route(now, a).unwrap();
    cm.connect(now, a, &ConnParam { qp_num: 5, ..ConnParam::default() }).unwrap();
    ids.push(a);
    while cm.poll_event().is_some() {}
    while cm.poll_transmit().is_some() {}
    (cm, ids)
}

/// Runs the CM through everything after hostile input: outputs, timers, getters.
fn exercise(cm: &mut Cm, ids: &[softrdma_cm::CmId], now: Instant) {
    while let Some(t) = cm.poll_transmit() {
        assert_eq!(t.mad.len(), MAD_LEN);
    }
    while cm.poll_event().is_some() {}
    for &id in ids {
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let _ = cm.qp_attr(id, s);
        }
    }
    if let Some(t) = cm.poll_timeout() {
        cm.handle_timeout(t.max(now));
    }
    assert!(cm.id_count() <= 64);
}

fn mutate(mad: &[u8], edits: &[(usize, u8)]) -> Vec<u8> {
    let mut m = mad.to_vec();
    for &(at, v) in edits {
        let k = at % m.len();
        m[k] = v;
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let (mut cm, ids) = busy_cm();
        let src: IpAddr = "198.18.0.2".parse().unwrap();
        let dst: IpAddr = "198.18.0.3".parse().unwrap();
        cm.handle_mad(Instant::ZERO, src, dst, &bytes);
        let _ = steering_key(&bytes);
        exercise(&mut cm, &ids, Instant::ZERO);
    }

    /// A CM MAD header with an arbitrary attribute and body: gets past the header checks.
    #[test]
    fn arbitrary_cm_bodies_never_panic(attr in 0x10u16..0x1b, body in proptest::collection::vec(any::<u8>(), 232)) {
        let (mut cm, ids) = busy_cm();
        let mut mad = vec![1u8, 7, 2, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1];
        mad.extend_from_slice(&attr.to_be_bytes());
        mad.extend_from_slice(&[0; 6]);
        mad.extend_from_slice(&body);
        let src: IpAddr = "198.18.0.2".parse().unwrap();
        let dst: IpAddr = "198.18.0.3".parse().unwrap();
        cm.handle_mad(Instant::ZERO, src, dst, &mad);
        exercise(&mut cm, &ids, Instant::ZERO);
    }

    #[test]
    fn mutated_kernel_mads_never_panic(
        pick in any::<proptest::sample::Index>(),
        edits in proptest::collection::vec((0usize..MAD_LEN, any::<u8>()), 1..8),
        repeat in 1usize..4,
    ) {
        let mads = captured();
        let m = pick.get(&mads);
        let (mut cm, ids) = busy_cm();
        let bad = mutate(&m.bytes, &edits);
        let mut now = Instant::ZERO;
        for _ in 0..repeat {
            // Both directions: as if sent to us, and as if from ourselves.
            cm.handle_mad(now, m.src, m.dst, &bad);
            cm.handle_mad(now, m.dst, m.src, &bad);
            exercise(&mut cm, &ids, now);
            now += std::time::Duration::from_secs(5);
        }
    }
}

#[test]
fn junk_is_counted_as_dropped() {
    let (mut cm, _) = busy_cm();
    let before = cm.counters();
    let ip: IpAddr = "198.18.0.2".parse().unwrap();
    cm.handle_mad(Instant::ZERO, ip, ip, &[0u8; 3]);
    cm.handle_mad(Instant::ZERO, ip, ip, &[0u8; MAD_LEN]);
    let after = cm.counters();
    assert_eq!(after.mads_received - before.mads_received, 2);
    assert_eq!(after.mads_dropped - before.mads_dropped, 2);
}

/// The Pair harness under random losses converges: whatever is dropped, both sides end
/// with the connection either established or failed, and never panic.
#[test]
fn random_losses_converge() {
    for seed in 0..64u64 {
        let mut p = Pair::with_configs(config(seed * 2 + 1, IP_A, 1 << 21), config(seed * 2 + 2, IP_B, 2 << 21));
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        p.drop = Box::new(move |_, _| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % 3 == 0
        });
        p.listen(PortSpace::TCP, QpType::Rc);
        let a = p.a.create_id(PortSpace::TCP, QpType::Rc).unwrap();
        p.a.resolve_addr(p.now, a, Some(SocketAddr::new(IP_A, 0)), SocketAddr::new(IP_B, PORT)).unwrap();
        p.a.resolve_route(p.now, a).unwrap();
        p.a.connect(p.now, a, &active_param()).unwrap();
        p.drive();
        for _ in 0..100 {
            if let Some(e) = p.events_b.iter().find(|e| e.kind == softrdma_cm::CmEventKind::ConnectRequest) {
                let b = e.id;
                let _ = p.b.accept(p.now, b, &passive_param());
            }
            if p.events_a.iter().any(|e| e.kind == softrdma_cm::CmEventKind::ConnectResponse) {
                let _ = p.a.establish(p.now, a);
            }
            p.drive();
            if !p.step(Instant::MAX) {
                break;
            }
        }
        p.settle();
        assert!(p.a.poll_timeout().is_none() && p.b.poll_timeout().is_none(), "reproduce with seed {seed}");
    }
}
