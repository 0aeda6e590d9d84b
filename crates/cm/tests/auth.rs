//! Authenticated mode's key agreement beside the REQ and the REP (`softrdma_cm::auth`).

mod common;

use common::*;
use softrdma_cm::auth::{OFFER_LEN, OFFER_MAGIC, psk_from_passphrase};
use std::time::Duration;

use softrdma_cm::{CmConfig, CmEventKind, CmStatus};
use softrdma_engine::QpType;
use softrdma_wire::cm::RejReason;
use softrdma_wire::cma::PortSpace;

use CmEventKind::*;

fn configs(a_auth: bool, b_auth: bool) -> (CmConfig, CmConfig) {
    let mut a = config(1, IP_A, 3 << 21);
    let mut b = config(2, IP_B, 5 << 21);
    (a.auth.required, a.auth_seed) = (a_auth, [0xa; 32]);
    (b.auth.required, b.auth_seed) = (b_auth, [0xb; 32]);
    (a, b)
}

/// A connects to B as far as `CONNECT_RESPONSE` (or whatever happens instead).
fn exchange(p: &mut Pair) -> (softrdma_cm::CmId, Option<softrdma_cm::CmId>) {
    p.listen(PortSpace::TCP, QpType::Rc);
    let a = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a, &active_param()).unwrap();
    p.drive();
    let Some(req) = p.events_b.iter().find(|e| e.kind == ConnectRequest).cloned() else { return (a, None) };
    p.b.accept(p.now, req.id, &passive_param()).unwrap();
    p.drive();
    (a, Some(req.id))
}

#[test]
fn both_sides_derive_mirrored_keys_and_the_mads_are_unchanged() {
    let (ca, cb) = configs(true, true);
    let mut p = Pair::with_configs(ca, cb);
    let (a, b) = exchange(&mut p);
    let b = b.expect("B got the request");
    let (ka, kb) = (p.a.packet_keys(a).expect("A has keys"), p.b.packet_keys(b).expect("B has keys"));
    assert_eq!((ka.send, ka.receive), (kb.receive, kb.send));
    assert_ne!(ka.send, ka.receive);
    assert_eq!(p.kinds_a(), [ConnectResponse]);
    for name in ["REQ", "REP"] {
        let sent = p.log.iter().find(|s| s.name == name).unwrap();
        let offer = sent.offer.expect("REQ and REP carry an offer");
        assert_eq!(offer.len(), OFFER_LEN);
        assert_eq!(offer[..8], OFFER_MAGIC);
    }
    // The MADs are what a plain connection sends: the offer only follows them.
    let mut plain = Pair::new();
    exchange(&mut plain);
    let req = |p: &Pair| p.log.iter().find(|s| s.name == "REQ").unwrap().mad;
    let (r1, r2) = (req(&p), req(&plain));
    assert_eq!(r1[24 + 100..], r2[24 + 100..], "the private data is the application's, untouched");
    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert!(p.log.iter().filter(|s| s.name == "RTU").all(|s| s.offer.is_none()));
}

#[test]
fn a_listener_without_authenticate_still_answers_an_offer() {
    let (ca, cb) = configs(true, false);
    let mut p = Pair::with_configs(ca, cb);
    let (a, b) = exchange(&mut p);
    assert!(p.a.packet_keys(a).is_some() && p.b.packet_keys(b.unwrap()).is_some());
}

#[test]
fn plain_connections_have_no_keys_and_no_offers() {
    let mut p = Pair::new();
    let (a, b) = exchange(&mut p);
    assert!(p.a.packet_keys(a).is_none() && p.b.packet_keys(b.unwrap()).is_none());
    assert!(p.log.iter().all(|s| s.offer.is_none()));
}

#[test]
fn a_listener_that_requires_it_rejects_a_plain_req() {
    let (ca, cb) = configs(false, true);
    let mut p = Pair::with_configs(ca, cb);
    let (_, b) = exchange(&mut p);
    assert!(b.is_none(), "no CONNECT_REQUEST for a REQ without an offer");
    assert_eq!(p.kinds_a(), [Rejected]);
    assert_eq!(p.events_a[0].status, CmStatus::Rejected(RejReason::CONSUMER_DEFINED));
}

#[test]
fn a_rep_without_an_offer_is_rejected_and_reported_as_not_authenticated() {
    // B stands for a peer that is not softrdma: its REP carries no offer.
    let (ca, cb) = configs(true, false);
    let mut p = Pair::with_configs(ca, cb);
    p.strip_offers = Some(Side::B);
    let (a, b) = exchange(&mut p);
    assert_eq!(p.kinds_a(), [Rejected]);
    assert_eq!(p.events_a[0].status, CmStatus::NotAuthenticated);
    assert!(p.a.packet_keys(a).is_none());
    assert_eq!(p.sent(Side::A, "REJ").len(), 1, "A rejects the REP");
    assert!(p.kinds_b().contains(&Rejected), "B hears of it");
    let _ = b;
    p.settle();
    assert_eq!(p.kinds_a(), [Rejected], "nothing more after the rejection");
}

#[test]
fn a_pre_shared_key_on_one_side_only_gives_keys_that_do_not_match() {
    let (mut ca, cb) = configs(true, true);
    ca.auth.psk = Some(psk_from_passphrase(b"only A knows"));
    let mut p = Pair::with_configs(ca, cb);
    let (a, b) = exchange(&mut p);
    let (ka, kb) = (p.a.packet_keys(a).unwrap(), p.b.packet_keys(b.unwrap()).unwrap());
    assert_ne!(ka.send, kb.receive);
}

#[test]
fn a_second_connection_gets_other_keys() {
    let (ca, cb) = configs(true, true);
    let mut p = Pair::with_configs(ca, cb);
    let (a1, _) = exchange(&mut p);
    p.events_a.clear();
    let a2 = p.resolve(PortSpace::TCP, QpType::Rc);
    p.a.connect(p.now, a2, &active_param()).unwrap();
    p.drive();
    let req = p.take_request();
    p.b.accept(p.now, req.id, &passive_param()).unwrap();
    p.drive();
    assert_ne!(p.a.packet_keys(a1).unwrap(), p.a.packet_keys(a2).unwrap());
}

#[test]
fn an_authenticated_connection_seals_its_dreq_and_drep_and_takes_no_forged_one() {
    let (ca, cb) = configs(true, true);
    let mut p = Pair::with_configs(ca, cb);
    let (a, b) = exchange(&mut p);
    let b = b.unwrap();
    p.a.establish(p.now, a).unwrap();
    p.drive();
    assert_eq!(p.kinds_b(), [ConnectRequest, Established]);

    // A's DREQ is lost on the way; a host that saw it replays its MAD without the seal,
    // then with a seal of the wrong key: B acts on neither.
    p.drop_first(Side::A, "DREQ", 1);
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    let dreq = p.sent(Side::A, "DREQ")[0].clone();
    let seal = dreq.seal.expect("an authenticated connection's DREQ is sealed");
    let dropped = p.b.counters().mads_dropped;
    p.b.handle_mad(p.now, IP_A, IP_B, &dreq.mad);
    let mut forged = dreq.mad.to_vec();
    let mut wrong = seal;
    wrong[20] ^= 1;
    forged.extend_from_slice(&wrong);
    p.b.handle_mad(p.now, IP_A, IP_B, &forged);
    p.drive();
    assert_eq!(p.b.counters().mads_dropped, dropped + 2, "both refused");
    assert_eq!(p.kinds_b(), [ConnectRequest, Established], "no DISCONNECTED from a forgery");

    // The real DREQ, resent by A's retry, disconnects; B's DREP is sealed too.
    p.drive_for(Duration::from_millis(100));
    assert_eq!(p.kinds_b(), [ConnectRequest, Established, Disconnected]);
    p.b.disconnect(p.now, b).unwrap();
    p.drive();
    assert!(p.kinds_a().contains(&Disconnected));
    assert!(p.sent(Side::B, "DREP")[0].seal.is_some());
}

#[test]
fn a_plain_connection_seals_nothing() {
    let mut p = Pair::new();
    let (a, _) = exchange(&mut p);
    p.a.establish(p.now, a).unwrap();
    p.a.disconnect(p.now, a).unwrap();
    p.drive();
    assert!(p.log.iter().all(|s| s.seal.is_none()));
    assert!(p.kinds_b().contains(&Disconnected));
}
