//! RoceSocket over loopback (127.0.0.1 and ::1 only), each test bounded in time.
//!
//! The ICRC tests are the point: a RoCE packet whose ICRC was computed for IPv4 ID 0 and
//! DF verifies at the receiver against the envelope rebuilt from what `recv` reports, so
//! the kernel put exactly ID 0 and DF on the wire. As root, an AF_PACKET capture also reads
//! the ID from the IP header.

#![allow(clippy::print_stderr)]

use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use softrdma_udp::{Config, Envelope, Outgoing, Received, RecvBatch, RoceSocket};
use softrdma_wire::{BthRepr, Error, ExtHeaders, Opcode, PKey, Psn, Qpn, RocePacket, RoceRepr};

const WAIT: Duration = Duration::from_secs(2);

fn lo4() -> IpAddr {
    Ipv4Addr::LOCALHOST.into()
}

fn lo6() -> IpAddr {
    Ipv6Addr::LOCALHOST.into()
}

/// An ephemeral port: tests run in parallel.
fn config() -> Config {
    Config { port: 0, ..Config::default() }
}

fn pair(ip: IpAddr) -> (RoceSocket, RoceSocket) {
    (RoceSocket::bind_with(ip, &config()).unwrap(), RoceSocket::bind_with(ip, &config()).unwrap())
}

fn send_only(psn: u32, payload: &[u8]) -> RoceRepr<'_> {
    RoceRepr {
        bth: BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited_event: false,
            mig_req: true,
            pkey: PKey::DEFAULT,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x11).unwrap(),
            ack_req: true,
            psn: Psn::new(psn).unwrap(),
        },
        ext: ExtHeaders::default(),
        payload,
    }
}

fn with_id(envelope: Envelope, identification: u16) -> Envelope {
    match envelope {
        Envelope::V4(mut e) => {
            e.identification = identification;
            Envelope::V4(e)
        }
        v6 => v6,
    }
}

/// Receives until `want` datagrams arrived or `WAIT` passed; returns them as owned data
/// (payload, source, destination, hop limit, traffic class, flow label, truncated, segment).
#[derive(Clone, Debug)]
struct Got {
    payload: Vec<u8>,
    source: SocketAddr,
    destination: SocketAddr,
    hop_limit: u8,
    traffic_class: u8,
    flow_label: u32,
    truncated: bool,
    segment_index: usize,
    envelope: Envelope,
}

impl From<Received<'_>> for Got {
    fn from(d: Received<'_>) -> Self {
        Self {
            payload: d.payload.to_vec(),
            source: d.source,
            destination: d.destination,
            hop_limit: d.hop_limit,
            traffic_class: d.traffic_class,
            flow_label: d.flow_label,
            truncated: d.truncated,
            segment_index: d.segment_index,
            envelope: d.envelope(),
        }
    }
}

/// Receives until `want` datagrams arrived or `WAIT` passed. Also returns the number of
/// messages each `recvmmsg` returned.
fn recv_n(sock: &RoceSocket, batch: &mut RecvBatch, want: usize) -> (Vec<Got>, Vec<usize>) {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    let mut calls = Vec::new();
    while got.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        let n = sock.recv_timeout(batch, left).unwrap();
        if n == 0 {
            break;
        }
        assert!(!batch.control_truncated(), "control messages truncated");
        calls.push(n);
        got.extend(batch.iter().map(Got::from));
    }
    (got, calls)
}

fn icrc_round_trip(ip: IpAddr) {
    let (a, b) = pair(ip);
    let envelope = a.envelope_to(b.local_addr()).unwrap();
    // The same envelope Envelope::rocev2 builds, but to the test's port instead of 4791.
    let expected = Envelope::rocev2(ip, a.local_addr().port(), ip).unwrap().with_dst_port(b.local_addr().port());
    assert_eq!(envelope, expected);

    let repr = send_only(7, b"hello, rxe"); // 10 bytes: the packet carries 2 pad bytes
    let mut buf = [0u8; 64];
    let len = repr.emit(&envelope, &mut buf).unwrap();
    a.send(&envelope, &buf[..len]).unwrap();

    let mut batch = RecvBatch::new(4, 2048);
    let (got, _) = recv_n(&b, &mut batch, 1);
    assert_eq!(got.len(), 1, "datagram did not arrive");
    let d = &got[0];
    assert_eq!(d.source, a.local_addr());
    assert_eq!(d.destination, b.local_addr());
    assert_eq!(d.envelope, envelope);
    let packet = RocePacket::new_checked(&d.payload[..]).unwrap();
    // The ICRC verifies: the kernel sent exactly the envelope it was computed for.
    assert_eq!(RoceRepr::parse(&packet, &d.envelope).unwrap(), repr);
    if ip.is_ipv4() {
        // Control: the ICRC does depend on the ID, so ID 0 was really checked.
        assert_eq!(RoceRepr::parse(&packet, &with_id(d.envelope, 1)), Err(Error::BadIcrc));
    }
    eprintln!(
        "{ip}: ICRC verified; hop limit {}, traffic class {:#x}, flow label {:#x}",
        d.hop_limit, d.traffic_class, d.flow_label
    );
}

#[test]
fn icrc_verifies_over_ipv4_with_id_0_and_df() {
    icrc_round_trip(lo4());
}

#[test]
fn icrc_verifies_over_ipv6() {
    icrc_round_trip(lo6());
}

/// An AF_PACKET socket seeing IPv4 (`ethertype` 0x0800) or IPv6 (0x86dd) on every
/// interface, cooked (no link header). `None` (with the reason printed) without
/// CAP_NET_RAW.
fn capture(ethertype: u16) -> Option<Socket> {
    let protocol = Protocol::from(i32::from(ethertype.to_be()));
    match Socket::new(Domain::PACKET, Type::DGRAM, Some(protocol)) {
        Ok(s) => {
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            Some(s)
        }
        Err(e) => {
            eprintln!("skipped the capture check: AF_PACKET socket refused ({e}); it needs root or CAP_NET_RAW");
            None
        }
    }
}

/// Reads captured IP packets for up to `WAIT`, until `done` says enough.
fn read_packets(cap: &Socket, mut keep: impl FnMut(&[u8]) -> bool) {
    let deadline = Instant::now() + WAIT;
    let mut buf = vec![0u8; 70_000];
    let mut reader = cap;
    while Instant::now() < deadline {
        match reader.read(&mut buf) {
            Ok(n) => {
                if !keep(&buf[..n]) {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => panic!("capture: {e}"),
        }
    }
}

#[test]
fn capture_shows_ipv4_id_0_and_df() {
    let Some(cap) = capture(0x0800) else { return };
    let (a, b) = pair(lo4());
    let envelope = a.envelope_to(b.local_addr()).unwrap();
    let mut buf = [0u8; 64];
    for psn in 0..3 {
        let len = send_only(psn, b"id?").emit(&envelope, &mut buf).unwrap();
        a.send(&envelope, &buf[..len]).unwrap();
    }
    let (sport, dport) = (a.local_addr().port(), b.local_addr().port());
    let mut seen = Vec::new();
    read_packets(&cap, |ip| {
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ip.len() >= ihl + 8
            && ip[0] >> 4 == 4
            && ip[9] == 17
            && u16::from_be_bytes([ip[ihl], ip[ihl + 1]]) == sport
            && u16::from_be_bytes([ip[ihl + 2], ip[ihl + 3]]) == dport
        {
            let id = u16::from_be_bytes([ip[4], ip[5]]);
            let df = ip[6] & 0x40 != 0;
            let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff; // MF and offset
            seen.push((id, df, frag, ip[8]));
        }
        // A socket for one ethertype sees each datagram once on lo, coming in (only
        // ETH_P_ALL taps see it going out too).
        seen.len() < 3
    });
    eprintln!("captured (id, df, mf|offset, ttl): {seen:?}");
    assert_eq!(seen.len(), 3, "captured {} of 3 packets", seen.len());
    assert!(seen.iter().all(|&(id, df, frag, _)| id == 0 && df && frag == 0), "{seen:?}");
}

fn batch_round_trip(ip: IpAddr) {
    const N: usize = 1000;
    const LEN: usize = 1100;
    const TOS: u8 = 0x68; // DSCP 26, ECN 0
    let tx = RoceSocket::bind_with(ip, &Config { hop_limit: Some(7), ..config() }).unwrap();
    let rx = RoceSocket::bind_with(ip, &Config { recv_buffer_size: Some(1 << 21), ..config() }).unwrap();
    let envelope = tx.envelope_to(rx.local_addr()).unwrap();
    let payloads: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let mut p: Vec<u8> = (0..LEN).map(|j| (i * 7 + j) as u8).collect();
            p[..4].copy_from_slice(&(i as u32).to_be_bytes());
            p
        })
        .collect();
    let outgoing: Vec<Outgoing<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| Outgoing { traffic_class: (i % 2 == 1).then_some(TOS), ..Outgoing::new(envelope, p) })
        .collect();

    // Pace: send at most 64 ahead of the receiver, so no buffer can overflow and the test
    // is deterministic even with the default 208 KiB receive buffer.
    let mut batch = RecvBatch::new(64, 2048);
    let mut got = Vec::new();
    let mut calls = Vec::new();
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(4);
    while got.len() < N {
        assert!(Instant::now() < deadline, "stalled at {} sent, {} received", sent, got.len());
        let end = N.min(got.len() + 64);
        if sent < end {
            match tx.send_batch(&outgoing[sent..end]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tx.wait_writable(Some(Duration::from_millis(10))).unwrap();
                }
                Err(e) => panic!("send_batch: {e}"),
            }
        }
        let n = rx.recv_timeout(&mut batch, Duration::from_millis(200)).unwrap();
        if n > 0 {
            calls.push(n);
            got.extend(batch.iter().map(Got::from));
        }
    }
    assert_eq!(got.len(), N);
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.payload, payloads[i], "datagram {i}");
        assert_eq!(d.source, tx.local_addr());
        assert_eq!(d.destination, rx.local_addr());
        assert_eq!(d.hop_limit, 7);
        assert_eq!(d.traffic_class, if i % 2 == 1 { TOS } else { 0 }, "datagram {i}");
        assert!(!d.truncated);
    }
    let most = calls.iter().max().copied().unwrap_or(0);
    eprintln!("{ip}: {N} x {LEN} B in {} recvmmsg calls (up to {most} per call)", calls.len());
    assert!(most > 1, "recvmmsg never returned more than one datagram");
}

#[test]
fn batch_of_1000_arrives_intact_over_ipv4() {
    batch_round_trip(lo4());
}

#[test]
fn batch_of_1000_arrives_intact_over_ipv6() {
    batch_round_trip(lo6());
}

#[test]
fn zero_checksum_ipv6_is_accepted() {
    let zero = Config { udp6_zero_checksum_tx: true, ..config() };
    let tx = match RoceSocket::bind_with(lo6(), &zero) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: the kernel refuses UDP_NO_CHECK6_TX ({e})");
            return;
        }
    };
    let rx = RoceSocket::bind_with(lo6(), &config()).unwrap();
    // Control: a plain socket (no UDP_NO_CHECK6_RX) must drop what rx accepts; if it does
    // not, the checksum was not zero and this test would prove nothing.
    let plain = UdpSocket::bind((Ipv6Addr::LOCALHOST, 0)).unwrap();
    plain.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let cap = capture(0x86dd);

    let envelope = tx.envelope_to(rx.local_addr()).unwrap();
    let mut buf = [0u8; 64];
    let len = send_only(1, b"from rxe?").emit(&envelope, &mut buf).unwrap();
    tx.send(&envelope, &buf[..len]).unwrap();
    tx.send_to(plain.local_addr().unwrap(), &buf[..len]).unwrap();

    let mut batch = RecvBatch::new(4, 2048);
    let (got, _) = recv_n(&rx, &mut batch, 1);
    assert_eq!(got.len(), 1, "the zero-checksum datagram did not arrive");
    let packet = RocePacket::new_checked(&got[0].payload[..]).unwrap();
    RoceRepr::parse(&packet, &got[0].envelope).unwrap(); // the ICRC masks the UDP checksum

    let mut scratch = [0u8; 64];
    match plain.recv_from(&mut scratch) {
        Ok(_) => panic!("a plain socket received it: the UDP checksum was not zero"),
        Err(e) => assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{e}"),
    }

    if let Some(cap) = cap {
        let (sport, dport) = (tx.local_addr().port(), rx.local_addr().port());
        let mut checksums = Vec::new();
        read_packets(&cap, |ip| {
            // Fixed header only (no extension headers on loopback).
            if ip.len() >= 48 && ip[0] >> 4 == 6 && ip[6] == 17 {
                let udp = &ip[40..];
                if u16::from_be_bytes([udp[0], udp[1]]) == sport && u16::from_be_bytes([udp[2], udp[3]]) == dport {
                    checksums.push(u16::from_be_bytes([udp[6], udp[7]]));
                }
            }
            checksums.is_empty()
        });
        eprintln!("captured UDP checksums: {checksums:?}");
        assert!(!checksums.is_empty() && checksums.iter().all(|&c| c == 0), "{checksums:?}");
    }
}

#[test]
fn garbage_arrives_as_bytes() {
    let (a, b) = pair(lo4());
    let mut seed = 0x1234_5678u32;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 24) as u8
            })
            .collect()
    };
    let lens = [0usize, 1, 3, 11, 12, 16, 100, 1500, 3000, 2048, 7];
    let datagrams: Vec<Vec<u8>> = lens.iter().map(|&n| noise(n)).collect();
    for d in &datagrams {
        a.send_to(b.local_addr(), d).unwrap();
    }
    let slot = 2048;
    let mut batch = RecvBatch::new(16, slot);
    let (got, _) = recv_n(&b, &mut batch, datagrams.len());
    assert_eq!(got.len(), datagrams.len());
    for (d, sent) in got.iter().zip(&datagrams) {
        let keep = sent.len().min(slot);
        assert_eq!(d.payload, sent[..keep]);
        assert_eq!(d.truncated, sent.len() > slot, "{} bytes", sent.len());
        assert_eq!(d.source, a.local_addr());
    }
}

#[test]
fn envelopes_the_kernel_would_not_honour_are_refused() {
    let (a, b) = pair(lo4());
    let good = a.envelope_to(b.local_addr()).unwrap();
    let Envelope::V4(g) = good else { unreachable!() };
    let bad = [
        Envelope::V4(softrdma_udp::Ipv4Envelope { identification: 5, ..g }),
        Envelope::V4(softrdma_udp::Ipv4Envelope { dont_fragment: false, ..g }),
        Envelope::V4(softrdma_udp::Ipv4Envelope { src_port: g.src_port.wrapping_add(1), ..g }),
        Envelope::V4(softrdma_udp::Ipv4Envelope { src: Ipv4Addr::new(127, 0, 0, 2), ..g }),
        Envelope::rocev2(lo6(), g.src_port, lo6()).unwrap(),
    ];
    for e in bad {
        let err = a.send(&e, b"x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{e:?}");
    }
    // A batch stops before the bad datagram and reports it on the next call.
    let batch = [Outgoing::new(good, b"1"), Outgoing::new(good, b"2"), Outgoing::new(bad[0], b"3")];
    assert_eq!(a.send_batch(&batch).unwrap(), 2);
    assert_eq!(a.send_batch(&batch[2..]).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    let mut rb = RecvBatch::new(4, 64);
    let (got, _) = recv_n(&b, &mut rb, 2);
    assert_eq!(got.iter().map(|d| d.payload.clone()).collect::<Vec<_>>(), [b"1".to_vec(), b"2".to_vec()]);
}

/// GSO: one send of `SEGMENTS` RoCE packets; segment i's ICRC computed with IPv4 ID i.
/// A sending socket, a receiving one on `ip` (with `UDP_GRO` if `gro`), and the envelope
/// from the first to the second.
fn sender_and_receiver(ip: IpAddr, gro: bool) -> (RoceSocket, RoceSocket, Envelope) {
    let tx = RoceSocket::bind_with(ip, &config()).unwrap();
    let rx = RoceSocket::bind_with(ip, &Config { gro, ..config() }).unwrap();
    let envelope = tx.envelope_to(rx.local_addr()).unwrap();
    (tx, rx, envelope)
}

fn gso(ip: IpAddr, gro: bool) {
    const SEGMENTS: usize = 8;
    const PAYLOAD: usize = 1000;
    let (tx, rx, envelope) = sender_and_receiver(ip, gro);
    let data = vec![0x5a; PAYLOAD];
    let seg = send_only(0, &data).buffer_len();
    let mut buf = vec![0u8; seg * SEGMENTS];
    for (i, chunk) in buf.chunks_mut(seg).enumerate() {
        send_only(i as u32, &data).emit(&with_id(envelope, i as u16), chunk).unwrap();
    }
    let out = Outgoing { segment_size: Some(seg as u16), ..Outgoing::new(envelope, &buf) };
    match tx.send_batch(&[out]) {
        Ok(1) => {}
        Ok(n) => panic!("sent {n}"),
        Err(e) => {
            eprintln!("skipped: the kernel refuses UDP GSO here ({e})");
            return;
        }
    }
    let mut batch = RecvBatch::new(16, 65536);
    let (got, calls) = recv_n(&rx, &mut batch, SEGMENTS);
    assert_eq!(got.len(), SEGMENTS);
    let mut ids = Vec::new();
    for (k, d) in got.iter().enumerate() {
        assert_eq!(d.payload.len(), seg);
        let packet = RocePacket::new_checked(&d.payload[..]).unwrap();
        // Which ID makes the ICRC verify tells which ID the kernel gave segment k.
        let id = (0..64u16).find(|&id| RoceRepr::parse(&packet, &with_id(d.envelope, id)).is_ok());
        ids.push(id);
        assert_eq!(RoceRepr::parse_ignoring_icrc(&packet).unwrap().bth.psn.value(), k as u32);
        if gro {
            assert_eq!(d.segment_index, k);
        }
    }
    eprintln!("{ip} GSO, GRO {gro}: {} recvmmsg messages {calls:?}; ICRC-verifying IDs {ids:?}", calls.len());
    if ip.is_ipv4() {
        let want: Vec<_> = (0..SEGMENTS as u16).map(Some).collect();
        assert_eq!(ids, want, "segment i must carry IPv4 ID i");
    } else {
        assert!(ids.iter().all(|&id| id == Some(0)), "IPv6 has no ID: every segment verifies");
    }
    if gro {
        assert_eq!(calls, [1], "with GRO the GSO send arrives as one message on loopback");
    }
}

#[test]
fn gso_segment_i_carries_ipv4_id_i() {
    gso(lo4(), false);
}

#[test]
fn gso_with_gro_arrives_whole_and_splits_by_segment() {
    gso(lo4(), true);
}

/// An iteration stopped part way through a GRO message goes on from where it stopped, the
/// segment indexes and what follows included, and says when nothing is left.
#[test]
fn a_batch_resumes_where_its_iteration_stopped() {
    let (tx, rx, envelope) = sender_and_receiver(lo4(), true);
    let train: Vec<u8> = (0..3u8).flat_map(|i| [i; 100]).collect();
    let gso = Outgoing { segment_size: Some(100), ..Outgoing::new(envelope, &train) };
    if let Err(e) = tx.send_batch(&[gso, Outgoing::new(envelope, b"after")]) {
        eprintln!("skipped: the kernel refuses UDP GSO here ({e})");
        return;
    }
    let mut batch = RecvBatch::new(4, 65536);
    assert!(rx.wait_readable(Some(Duration::from_secs(5))).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rx.recv(&mut batch).unwrap(), 2, "the train and the datagram after it, in one receive");
    let all: Vec<(Vec<u8>, usize)> = batch.iter().map(|d| (d.payload.to_vec(), d.segment_index)).collect();
    assert_eq!(all.len(), 4);
    for stop in 0..=all.len() {
        let mut it = batch.iter();
        let first: Vec<_> = it.by_ref().take(stop).map(|d| (d.payload.to_vec(), d.segment_index)).collect();
        let Some(at) = it.rest() else {
            assert_eq!(stop, all.len(), "rest() is None only once every datagram was yielded");
            continue;
        };
        let rest: Vec<_> = batch.iter_from(at).map(|d| (d.payload.to_vec(), d.segment_index)).collect();
        assert_eq!([first, rest].concat(), all, "stopped after {stop}");
    }
}

/// A batch's limit bounds what one receive takes, whatever its capacity, and the receive
/// says how many bytes it took and its longest message (a GRO train counts whole).
#[test]
fn a_limit_bounds_a_receive_and_the_batch_says_its_bytes() {
    let (tx, rx, envelope) = sender_and_receiver(lo4(), true);
    let train = [7u8; 300];
    let gso = Outgoing { segment_size: Some(100), ..Outgoing::new(envelope, &train) };
    let singles: Vec<Vec<u8>> = (1..=4).map(|n| vec![n; 10 * usize::from(n)]).collect();
    let mut out = vec![gso];
    out.extend(singles.iter().map(|p| Outgoing::new(envelope, p)));
    if let Err(e) = tx.send_batch(&out) {
        eprintln!("skipped: the kernel refuses UDP GSO here ({e})");
        return;
    }
    let mut batch = RecvBatch::new(8, 65536);
    assert_eq!(batch.limit(), 8, "the capacity until told otherwise");
    assert!(rx.wait_readable(Some(Duration::from_secs(5))).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    batch.set_limit(2);
    assert_eq!(rx.recv(&mut batch).unwrap(), 2, "two messages of the five queued");
    assert_eq!((batch.bytes(), batch.longest()), (300 + 10, 300), "the train whole and the first single");
    assert_eq!(batch.iter().count(), 4, "the train's three datagrams and the single");
    batch.set_limit(0);
    assert_eq!(batch.limit(), 1, "at least one");
    assert_eq!(rx.recv(&mut batch).unwrap(), 1);
    assert_eq!((batch.bytes(), batch.longest()), (20, 20));
    batch.set_limit(100);
    assert_eq!(batch.limit(), 8, "at most the capacity");
    assert_eq!(rx.recv(&mut batch).unwrap(), 2, "what was left");
    assert_eq!((batch.bytes(), batch.longest()), (30 + 40, 40));
    assert_eq!(rx.recv(&mut batch).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    assert_eq!((batch.bytes(), batch.longest()), (0, 0), "an empty receive took nothing");
}

#[test]
fn gso_over_ipv6_needs_no_id() {
    gso(lo6(), false);
}

#[test]
fn reuse_port_lets_sockets_share_a_port() {
    let shared = Config { reuse_port: true, ..config() };
    let first = RoceSocket::bind_with(lo4(), &shared).unwrap();
    let port = first.local_addr().port();
    RoceSocket::bind_with(lo4(), &Config { port, ..shared }).unwrap();
    let err = RoceSocket::bind_with(lo4(), &Config { port, ..config() }).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
}

#[test]
fn recv_is_non_blocking_and_times_out() {
    let (a, _) = pair(lo6());
    let mut batch = RecvBatch::new(2, 64);
    assert_eq!(a.recv(&mut batch).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    let t = Instant::now();
    assert_eq!(a.recv_timeout(&mut batch, Duration::from_millis(30)).unwrap(), 0);
    assert!(t.elapsed() >= Duration::from_millis(30));
    assert!(!a.wait_readable(Some(Duration::ZERO)).unwrap());
    assert!(a.wait_writable(Some(Duration::ZERO)).unwrap());
}

#[test]
fn a_full_receive_buffer_shows_in_the_drop_counter() {
    // A receiver with the smallest buffer the kernel allows, flooded before it reads:
    // SO_RXQ_OVFL reports what the kernel dropped.
    let ip = lo4();
    let a = RoceSocket::bind_with(ip, &config()).unwrap();
    let b = RoceSocket::bind_with(ip, &Config { recv_buffer_size: Some(4096), ..config() }).unwrap();
    let payload = [0u8; 1024];
    for _ in 0..200 {
        a.send_to(b.local_addr(), &payload).unwrap();
    }
    let mut batch = RecvBatch::new(8, 2048);
    let mut got = 0;
    let mut drain = |b: &RoceSocket, drops: &mut Option<u32>| {
        for _ in 0..100 {
            match b.recv(&mut batch) {
                Ok(_) => {
                    got += batch.len();
                    *drops = batch.drops().or(*drops);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("{e}"),
            }
        }
    };
    let mut drops = None;
    drain(&b, &mut drops);
    assert_eq!(drops, None, "what was queued before the drops began carries no count");
    // The kernel stamps the count on datagrams queued after drops happened.
    a.send_to(b.local_addr(), &payload).unwrap();
    drain(&b, &mut drops);
    let drops = drops.expect("a datagram queued after the drops carries the counter") as usize;
    assert!(drops > 0, "the kernel counted what it dropped");
    assert_eq!(got + drops, 201, "received and dropped add up to what was sent");
}

/// One batch serves every socket of a device (the runtime's): its headers, made once,
/// must carry nothing from one receive to the next (a longer IPv6 source, a truncation, a
/// traffic class, more datagrams than the next receive gets).
#[test]
fn a_batch_reused_across_sockets_and_sizes_keeps_nothing_from_the_last_receive() {
    let (a4, b4) = pair(lo4());
    let (a6, b6) = pair(lo6());
    let slot = 2048;
    let mut batch = RecvBatch::new(8, slot);
    for round in 0..6 {
        let (tx, rx) = if round % 2 == 0 { (&a6, &b6) } else { (&a4, &b4) };
        // Even rounds: five datagrams, the third longer than its slot; odd rounds: two.
        let lens: &[usize] = if round % 2 == 0 { &[40, 900, 3000, 12, 64] } else { &[33, 7] };
        let sent: Vec<Vec<u8>> = lens.iter().map(|&n| vec![round as u8 ^ n as u8; n]).collect();
        for d in &sent {
            tx.send_to(rx.local_addr(), d).unwrap();
        }
        let (got, _) = recv_n(rx, &mut batch, sent.len());
        assert_eq!(got.len(), sent.len(), "round {round}");
        for (d, s) in got.iter().zip(&sent) {
            assert_eq!(d.payload, s[..s.len().min(slot)], "round {round}");
            assert_eq!(d.truncated, s.len() > slot, "round {round}: {} bytes", s.len());
            assert_eq!(d.source, tx.local_addr(), "round {round}");
            assert_eq!(d.destination, rx.local_addr(), "round {round}");
        }
        assert!(rx.recv(&mut batch).is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock), "round {round}");
        assert!(batch.is_empty());
    }
}
