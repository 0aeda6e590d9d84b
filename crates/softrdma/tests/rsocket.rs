//! rsockets (`softrdma::rsocket`): two sockets of one process over 127.0.0.1, speaking
//! rdma-core's rsocket protocol to each other.

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use softrdma::rsocket::{self, MsgFlags, PollItem, PollTarget, RSocket, events, os_error};

/// A listener on 127.0.0.1 at a port of its own, and a connected pair through it.
fn pair(port: u16) -> (RSocket, RSocket) {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let listener = RSocket::new().unwrap();
    listener.bind(addr).unwrap();
    listener.listen(1).unwrap();
    let client = thread::spawn(move || {
        let c = RSocket::new().unwrap();
        c.connect(addr).unwrap();
        c
    });
    let server = listener.accept().unwrap();
    (client.join().unwrap(), server)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add((i >> 8) as u8)).collect()
}

#[test]
fn send_recv_small_and_large_crossing_the_buffer_wrap() {
    let (c, s) = pair(27471);
    c.send(b"hello").unwrap();
    let mut buf = [0u8; 16];
    let n = s.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"hello");

    // 3 MiB each way: many times the 128 KiB receive buffer, so every half is handed back
    // (target SGL writes) over and over and reads wrap around its end.
    let data = pattern(3 << 20, 7);
    let to_send = data.clone();
    let sender = thread::spawn(move || {
        let mut off = 0;
        while off < to_send.len() {
            // Odd-sized sends, so messages end mid-buffer.
            let end = (off + 100_003).min(to_send.len());
            off += c.send(&to_send[off..end]).unwrap();
        }
        c
    });
    let mut got = vec![0u8; data.len()];
    let mut off = 0;
    while off < got.len() {
        let end = (off + 77_777).min(got.len());
        let n = s.recv(&mut got[off..end]).unwrap();
        assert!(n > 0, "end of stream after {off} bytes");
        off += n;
    }
    assert!(got == data, "the received bytes differ from those sent");
    let c = sender.join().unwrap();

    // The other way, with MSG_WAITALL.
    let back = pattern(1 << 20, 3);
    let b2 = back.clone();
    let t = thread::spawn(move || {
        assert_eq!(s.send(&b2).unwrap(), b2.len());
        s
    });
    let mut got = vec![0u8; back.len()];
    let n = c.recv_with(&mut got, MsgFlags { waitall: true, ..MsgFlags::default() }).unwrap();
    assert_eq!(n, back.len());
    assert!(got == back);
    let s = t.join().unwrap();

    // Gathered sends: small (inline) and large pieces, in order.
    let big = pattern(300_000, 9);
    let t = thread::spawn(move || {
        assert_eq!(c.sendv(&[b"ab", b"", b"cdef"], MsgFlags::default()).unwrap(), 6);
        assert_eq!(c.sendv(&[&big[..70_001], &big[70_001..]], MsgFlags::default()).unwrap(), big.len());
        (c, big)
    });
    let mut got = vec![0u8; 6 + 300_000];
    let n = s.recv_with(&mut got, MsgFlags { waitall: true, ..MsgFlags::default() }).unwrap();
    let (c, big) = t.join().unwrap();
    assert_eq!(n, got.len());
    assert_eq!(&got[..6], b"abcdef");
    assert!(got[6..] == big[..]);

    // Shutdown: the peer reads what was sent, then 0 (end of stream).
    c.send(b"last").unwrap();
    c.shutdown(true, true).unwrap();
    let mut buf = [0u8; 8];
    let n = s.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"last");
    assert_eq!(s.recv(&mut buf).unwrap(), 0);
    // Sending on a closed connection fails.
    assert!(c.send(b"x").is_err());
}

#[test]
fn nonblocking_recv_says_eagain_and_poll_wakes_on_data() {
    let (c, s) = pair(27472);
    s.set_nonblocking(true);
    let mut buf = [0u8; 8];
    let e = s.recv(&mut buf).unwrap_err();
    assert_eq!(os_error(&e), Some(libc_eagain()), "{e}");
    let e = s.recv_with(&mut buf, MsgFlags { dontwait: true, ..MsgFlags::default() }).unwrap_err();
    assert_eq!(os_error(&e), Some(libc_eagain()), "{e}");

    // Nothing to read: poll times out; room to send: at once.
    let mut items = [PollItem { target: PollTarget::Socket(&s), events: events::IN, revents: 0 }];
    assert_eq!(rsocket::poll(&mut items, Some(Duration::from_millis(50))).unwrap(), 0);
    let mut items = [PollItem { target: PollTarget::Socket(&s), events: events::OUT, revents: 0 }];
    assert_eq!(rsocket::poll(&mut items, Some(Duration::ZERO)).unwrap(), 1);
    assert_eq!(items[0].revents, events::OUT);

    // Data 100 ms later wakes a poll that sleeps (no timeout).
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        c.send(b"wake").unwrap();
        c
    });
    let mut items = [PollItem { target: PollTarget::Socket(&s), events: events::IN, revents: 0 }];
    let n = rsocket::poll(&mut items, None).unwrap();
    assert_eq!(n, 1);
    assert_eq!(items[0].revents, events::IN);
    // MSG_PEEK leaves the data queued.
    let n = s.recv_with(&mut buf, MsgFlags { peek: true, ..MsgFlags::default() }).unwrap();
    assert_eq!(&buf[..n], b"wake");
    let n = s.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"wake");
    let _c = t.join().unwrap();
}

#[test]
fn connect_to_a_port_nobody_listens_on_is_refused() {
    let c = RSocket::new().unwrap();
    let e = c.connect("127.0.0.1:27479".parse().unwrap()).unwrap_err();
    assert!(os_error(&e).is_some(), "{e}");
}

#[test]
fn conn_data_is_rdma_cores_layout() {
    let d = rsocket::ConnData {
        version: 1,
        flags: rsocket::CONN_FLAG_IOMAP,
        credits: 384,
        target_iomap_size: 0,
        target_sgl: rsocket::RsSge { addr: 0x1122_3344_5566_7788, key: 0xaabb_ccdd, length: 2 },
        data_buf: rsocket::RsSge { addr: 0x10, key: 0x20, length: 65536 },
    };
    let b = d.encode();
    assert_eq!(&b[..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
    assert_eq!(&b[8..24], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 2]);
    assert_eq!(&b[36..40], &[0, 1, 0, 0]);
    assert_eq!(rsocket::ConnData::decode(&b), Some(d));
    assert_eq!(rsocket::msg(rsocket::OP_SGL, 5), 0x8000_0005);
    assert_eq!(rsocket::msg(rsocket::OP_CTRL, rsocket::CTRL_SHUTDOWN), 0xe000_0002);
    assert_eq!(rsocket::scale_to_value(rsocket::value_to_scale(4096, 8), 8), 4096);
}

fn libc_eagain() -> i32 {
    11
}

/// Nanoseconds the calling thread has run (`/proc/thread-self/schedstat`).
fn thread_cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn blocking_waits_sleep_instead_of_spinning() {
    let (c, s) = pair(27473);
    // A poll with nothing to report for 300 ms, then a recv that waits 300 ms for its data:
    // each costs this thread a few milliseconds of CPU at most (spinning would be 300).
    let cpu = thread_cpu_ns();
    let mut items = [PollItem { target: PollTarget::Socket(&s), events: events::IN, revents: 0 }];
    assert_eq!(rsocket::poll(&mut items, Some(Duration::from_millis(300))).unwrap(), 0);
    let polled = thread_cpu_ns() - cpu;
    assert!(polled < 50_000_000, "an idle 300 ms poll used {} ms of CPU", polled / 1_000_000);

    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        c.send(b"late").unwrap();
        c
    });
    let cpu = thread_cpu_ns();
    let mut buf = [0u8; 8];
    let n = s.recv(&mut buf).unwrap();
    let waited = thread_cpu_ns() - cpu;
    assert_eq!(&buf[..n], b"late");
    assert!(waited < 50_000_000, "a recv that waited 300 ms used {} ms of CPU", waited / 1_000_000);
    let _c = t.join().unwrap();
}

#[test]
fn sizes_come_from_rdma_cores_configuration_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mem_default"), "262144\n").unwrap();
    std::fs::write(dir.path().join("sqsize_default"), "100000").unwrap();
    std::fs::write(dir.path().join("inline_default"), "junk").unwrap();
    let s = rsocket::Sizes::from_config(dir.path());
    let d = rsocket::Sizes::default();
    assert_eq!(s.rbuf, 262_144);
    assert_eq!(s.sq, 0xfffe, "clamped to rsockets' largest queue");
    assert_eq!((s.sbuf, s.rq, s.inline), (d.sbuf, d.rq, d.inline), "unset or unreadable values keep the defaults");
}

#[test]
fn connect_completes_before_accept_as_with_a_tcp_backlog() {
    let addr: SocketAddr = "127.0.0.1:27474".parse().unwrap();
    let listener = RSocket::new().unwrap();
    listener.bind(addr).unwrap();
    listener.listen(4).unwrap();
    // Two clients connect and send, in this thread, before anybody calls accept.
    let (c1, c2) = (RSocket::new().unwrap(), RSocket::new().unwrap());
    c1.connect(addr).unwrap();
    c2.connect(addr).unwrap();
    c1.send(b"one").unwrap();
    c2.send(b"two").unwrap();
    // The listener polls readable; accept returns them in order.
    let mut items = [PollItem { target: PollTarget::Socket(&listener), events: events::IN, revents: 0 }];
    assert_eq!(rsocket::poll(&mut items, Some(Duration::from_secs(5))).unwrap(), 1);
    let mut buf = [0u8; 8];
    for want in [&b"one"[..], b"two"] {
        let s = listener.accept().unwrap();
        let n = s.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], want);
    }
    listener.set_nonblocking(true);
    let e = listener.accept().unwrap_err();
    assert_eq!(os_error(&e), Some(libc_eagain()), "{e}");
}
