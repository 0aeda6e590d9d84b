//! A hostile sender on the network: garbage datagrams, a wrong ICRC, a wrong QPN and forged
//! R_Keys, sent from a plain UDP socket to a device over real loopback. They are dropped or
//! NAKed and counted, nothing crashes, no byte of registered memory changes, and the device
//! keeps serving honest peers.

mod common;

use std::net::{SocketAddr, UdpSocket};

use common::*;
use softrdma::*;
use softrdma_wire::{BthRepr, Envelope, ExtHeaders, Opcode, PKey, Psn, RethRepr, RoceRepr};

/// An RC RDMA WRITE ONLY from `src` to QP `dest_qp` at `dst`, with its ICRC.
fn write_only(src: SocketAddr, dst: SocketAddr, dest_qp: u32, psn: u32, va: u64, rkey: u32, data: &[u8]) -> Vec<u8> {
    let repr = RoceRepr {
        bth: BthRepr {
            opcode: Opcode::RC_RDMA_WRITE_ONLY,
            solicited_event: false,
            mig_req: false,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::from_u24_truncating(dest_qp),
            ack_req: true,
            psn: Psn::from_u24_truncating(psn),
        },
        ext: ExtHeaders {
            reth: Some(RethRepr { virtual_address: va, rkey: RKey(rkey), dma_length: data.len() as u32 }),
            ..ExtHeaders::default()
        },
        payload: data,
    };
    let envelope = Envelope::rocev2(src.ip(), src.port(), dst.ip()).unwrap().with_dst_port(dst.port());
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&envelope, &mut buf).unwrap();
    buf
}

#[test]
fn hostile_datagrams_are_counted_and_change_no_memory() {
    let (a, b) = rc_pair(8192);
    let b_addr = b.ctx.local_addr(0).expect("b's socket");
    b.mr.write(0, &[0x11; 8192]).unwrap();
    let victim = b.mr.remote(0..8192).unwrap();
    let spoofed = UdpSocket::bind("127.0.0.1:0").unwrap(); // the honest peer's address, another port
    let src = spoofed.local_addr().unwrap();
    // Both devices share 127.0.0.1's port: the kernel steers what names neither's QPs (the
    // garbage) to either, so the two count together.
    let total = || {
        let (x, y) = (a.ctx.counters(), b.ctx.counters());
        let gsi = x.gsi_dropped + y.gsi_dropped + x.cm.mads_dropped + y.cm.mads_dropped;
        (x.engine.rcvd_malformed + y.engine.rcvd_malformed, x.engine.rcvd_dropped + y.engine.rcvd_dropped, gsi)
    };
    let before_total = total();
    let before = b.ctx.counters().engine;

    // 1. Garbage of every length up to 300 bytes.
    let mut x = 0x9e37_79b9_u32;
    for len in 0..300usize {
        let junk: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        spoofed.send_to(&junk, b_addr).unwrap();
    }
    // 2. A well-formed WRITE with one ICRC bit flipped.
    let mut bad_icrc = write_only(src, b_addr, b.qp.qpn(), 100, victim.addr, victim.rkey.0, &[0xee; 64]);
    *bad_icrc.last_mut().unwrap() ^= 1;
    spoofed.send_to(&bad_icrc, b_addr).unwrap();
    // 3. Valid ICRC, a QPN that does not exist.
    spoofed.send_to(&write_only(src, b_addr, 0xabcde, 100, victim.addr, victim.rkey.0, &[0xee; 64]), b_addr).unwrap();
    // 4. Valid ICRC, the right QP and PSN, forged R_Keys (the real one is never sent).
    for forged in [0u32, 1, victim.rkey.0 ^ 1, victim.rkey.0.rotate_left(8), 0xffff_ffff] {
        let p = write_only(src, b_addr, b.qp.qpn(), 100, victim.addr, forged, &[0xee; 64]);
        spoofed.send_to(&p, b_addr).unwrap();
    }

    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let c = b.ctx.counters().engine;
        let (malformed, dropped, gsi) = total();
        // Garbage whose bytes 5..8 happen to say QP1 is the CM's to drop.
        let seen = (malformed - before_total.0)
            + (dropped - before_total.1)
            + (gsi - before_total.2)
            + (c.naks_sent - before.naks_sent);
        // 300 garbage, the bad ICRC, the unknown QPN and at least one NAK.
        const ACCOUNTED: u64 = 303;
        if seen >= ACCOUNTED {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every hostile datagram was accounted for: {c:?}; (malformed, dropped, gsi) of both devices: {:?}",
            total()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let c = b.ctx.counters().engine;
    let icrc = a.ctx.counters().engine.rcvd_icrc_errors + c.rcvd_icrc_errors;
    assert!(icrc > 0, "the flipped ICRC was detected: {c:?}");
    assert!(c.naks_sent > before.naks_sent, "the forged R_Key was NAKed: {c:?}");
    let mut mem = vec![0u8; 8192];
    b.mr.read(0, &mut mem).unwrap();
    assert!(mem.iter().all(|&v| v == 0x11), "registered memory changed");

    // The device still serves honest peers: a fresh QP pair on the same devices works.
    let (qa, qb) = (
        a.pd.create_qp(&QpInit::new(QpType::Rc, &a.cq)).unwrap(),
        b.pd.create_qp(&QpInit::new(QpType::Rc, &b.cq)).unwrap(),
    );
    qa.connect(5, &qb.endpoint(0, 6).unwrap(), &ConnectOptions::default()).unwrap();
    qb.connect(6, &qa.endpoint(0, 5).unwrap(), &ConnectOptions::default()).unwrap();
    a.mr.write(0, b"still here").unwrap();
    let sge = [a.mr.sge(0..10).unwrap()];
    qa.post_send(&[wr(1, SendOp::RdmaWrite { remote_addr: victim.addr + 100, rkey: victim.rkey }, &sge)]).unwrap();
    let wc = loop {
        let wc = a.cq.wait(WAIT).unwrap();
        if wc.qp_num.value() == qa.qpn() {
            break wc;
        }
    };
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = [0u8; 10];
    b.mr.read(100, &mut got).unwrap();
    assert_eq!(&got, b"still here");
}
