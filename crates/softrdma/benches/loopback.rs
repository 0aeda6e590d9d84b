//! softrdma against what the machine can do without RDMA, in one run, two processes over
//! loopback: `cargo bench -p softrdma --bench loopback` (add `-- --quick` for a short run).
//!
//! Every figure is measured here, now, like against like:
//!
//! | softrdma                                   | baseline, same run                          |
//! |--------------------------------------------|---------------------------------------------|
//! | 8 B RDMA WRITE latency, completions polled | busy-polled UDP ping-pong, one way          |
//! | 8 B RDMA WRITE latency, completion channel | blocking UDP ping-pong, one way             |
//! | 64 KiB RDMA WRITE bandwidth                | UDP GSO+GRO goodput, 4 KiB segments         |
//!
//! Latency is perftest's: a ping-pong of 8-byte RDMA WRITEs with immediate (so the peer
//! learns of each by a completion), one way = round trip / 2. Also reported: the CPU a
//! process holding 100 connected RC QPs burns while idle, the memory each QP costs, and
//! what one poll of an empty CQ costs (a turn of a polling application's wait).
//!
//! The peer is this program run again as a child (`SOFTRDMA_TEST_ROLE`); the two talk in
//! lines over the child's stdin/stdout.
//!
//! Reported without a baseline: a ping-pong in which both processes wait for the peer's
//! WRITE by reading their own memory (programs written for a NIC, which places WRITEs
//! with no CPU of theirs): the progress threads place every WRITE, on cores the two
//! spinning applications also want (`--memory-wait-only` runs it alone).
//!
//! For profiling: `--rdma-bw-only`, `--rdma-lat-only`, `--rdma-events-only` and
//! `--empty-poll-only` (an empty CQ polled, per poll) run one figure alone;
//! `SOFTRDMA_BENCH_SPIN_US=N` sets both sides' progress-thread spin (`ContextOptions::spin`,
//! 50 by default), and `SOFTRDMA_BENCH_NO_GSO=1` turns GSO off.

#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "../tests/common/child.rs"]
#[allow(dead_code, unreachable_pub)]
mod child;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use child::{Advert, ChildProc, read_stdin_line, say};
use softrdma::*;
use softrdma_udp::{Config, Outgoing, RecvBatch, RoceSocket};

const ROLE: &str = child::ROLE_ENV;
const A: [u8; 4] = [127, 0, 0, 1];
const B: [u8; 4] = [127, 0, 0, 1]; // both processes on one address, as the issue asks
const PORT: u16 = 4791;
const UDP_PORT: u16 = 19_791;

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        child_main(&role);
        return;
    }
    // `cargo bench` passes `--bench`; `--quick` shortens every run.
    let quick = std::env::args().any(|a| a == "--quick");
    // `--rdma-bw-only`: just the RDMA bandwidth (for profiling).
    if std::env::args().any(|a| a == "--rdma-bw-only") {
        rdma_bandwidth(if quick { Duration::from_secs(1) } else { Duration::from_secs(5) });
        return;
    }
    // `--rdma-lat-only`: just the polled RDMA latency (for profiling).
    if std::env::args().any(|a| a == "--rdma-lat-only") {
        let n = if quick { 20_000 } else { 200_000 };
        let (polled, _) = rdma_latency_modes(n, &[false]);
        println!("RDMA WRITE 8 B polled one way: median {:.2} us, p99 {:.2} us", polled.median, polled.p99);
        return;
    }
    // `--empty-poll-only`: just what polling an empty CQ costs.
    if std::env::args().any(|a| a == "--empty-poll-only") {
        let (one, two) = empty_poll(if quick { 200_000 } else { 2_000_000 });
        println!("empty CQ poll: {one:.0} ns with one socket, {two:.0} ns with two");
        return;
    }
    // `--rdma-events-only`: just the RDMA latency with completion channels (for profiling).
    if std::env::args().any(|a| a == "--rdma-events-only") {
        let n = if quick { 2_000 } else { 20_000 };
        let (events, _) = rdma_latency_modes(n, &[true]);
        println!("RDMA WRITE 8 B with events one way: median {:.2} us, p99 {:.2} us", events.median, events.p99);
        return;
    }
    if std::env::args().any(|a| a == "--memory-wait-only") {
        let rt = rdma_memory_wait(if quick { 2_000 } else { 10_000 });
        println!("{}", rt.line());
        return;
    }
    let n_lat = if quick { 2_000 } else { 20_000 };
    let bw_time = if quick { Duration::from_millis(300) } else { Duration::from_secs(2) };

    println!("softrdma loopback benchmark: two processes on {}", IpAddr::from(A));
    let udp_busy = udp_pingpong(true, n_lat);
    let udp_block = udp_pingpong(false, n_lat / 4);
    let udp_bw = udp_goodput(bw_time);
    let (rdma_busy, rdma_event) = rdma_latency(n_lat);
    let rdma_bw = rdma_bandwidth(bw_time);
    let idle = idle_cpu(100, if quick { Duration::from_millis(500) } else { Duration::from_secs(2) });
    let per_qp = memory_per_qp(1000);
    let (poll_one, poll_two) = empty_poll(if quick { 200_000 } else { 2_000_000 });
    let memory_wait = rdma_memory_wait(if quick { 2_000 } else { 10_000 });

    println!();
    println!("{:<52} {:>12} {:>12} {:>8}", "what", "softrdma", "baseline", "ratio");
    let row =
        |what: &str, ours: String, base: String, ratio: f64| println!("{what:<52} {ours:>12} {base:>12} {ratio:>8.2}");
    row(
        "8 B WRITE latency, polled vs busy UDP ping-pong (us)",
        format!("{:.2}", rdma_busy.median),
        format!("{:.2}", udp_busy.median),
        rdma_busy.median / udp_busy.median,
    );
    row(
        "8 B WRITE latency, events vs blocking UDP (us)",
        format!("{:.2}", rdma_event.median),
        format!("{:.2}", udp_block.median),
        rdma_event.median / udp_block.median,
    );
    row(
        "64 KiB WRITE bandwidth vs UDP GSO+GRO (GB/s)",
        format!("{rdma_bw:.2}"),
        format!("{udp_bw:.2}"),
        rdma_bw / udp_bw,
    );
    println!("{:<52} {:>11.3}%", "idle CPU, 100 connected RC QPs (of one core)", idle * 100.0);
    println!("{:<52} {:>9.1} KiB", "memory per RC QP (default queue sizes)", per_qp / 1024.0);
    println!("{:<52} {:>10.0} ns", "an empty CQ polled, device with one socket", poll_one);
    println!("{:<52} {:>10.0} ns", "an empty CQ polled, device with two (IPv4, IPv6)", poll_two);
    println!("{}", memory_wait.line());
    println!(
        "latency detail (us, one way): UDP busy p99 {:.2}; RDMA polled min {:.2} p99 {:.2}; RDMA events p99 {:.2}; UDP blocking p99 {:.2}",
        udp_busy.p99, rdma_busy.min, rdma_busy.p99, rdma_event.p99, udp_block.p99
    );
}

/// Nanoseconds per poll of an empty CQ, `n` polls in a row, on an idle device with one
/// socket (127.0.0.1) and with two (and ::1), kept off the same-host path: the cost of
/// each turn of a polling application's wait, which bounds how soon it sees an answer.
fn empty_poll(n: u32) -> (f64, f64) {
    let per_poll = |addresses: Vec<IpAddr>| {
        let options = ContextOptions { port: UDP_PORT + 1, same_host: false, ..ContextOptions::default() };
        let ctx = Device::with_addresses("lo", addresses).open_with(&options).expect("open a loopback device");
        let cq = ctx.create_cq(16, None).expect("a CQ");
        let mut wc = [EMPTY_WC; 16];
        for _ in 0..n / 10 {
            std::hint::black_box(cq.poll(&mut wc));
        }
        let start = Instant::now();
        for _ in 0..n {
            std::hint::black_box(cq.poll(&mut wc));
        }
        start.elapsed().as_secs_f64() * 1e9 / f64::from(n)
    };
    let v4 = IpAddr::from(A);
    (per_poll(vec![v4]), per_poll(vec![v4, IpAddr::from(std::net::Ipv6Addr::LOCALHOST)]))
}

/// One-way latency statistics in microseconds.
#[derive(Clone, Copy, Debug)]
struct Lat {
    min: f64,
    median: f64,
    p99: f64,
}

fn one_way(mut rtts: Vec<Duration>) -> Lat {
    rtts.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6 / 2.0;
    Lat { min: us(rtts[0]), median: us(rtts[rtts.len() / 2]), p99: us(rtts[rtts.len() * 99 / 100]) }
}

/// Round trips of [`rdma_memory_wait`], in microseconds.
struct RoundTrips {
    median: f64,
    mean: f64,
    p99: f64,
    over_100us: f64,
}

impl RoundTrips {
    fn of(mut rtts: Vec<Duration>) -> RoundTrips {
        rtts.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let over = rtts.iter().filter(|&&d| d > Duration::from_micros(100)).count();
        RoundTrips {
            median: us(rtts[rtts.len() / 2]),
            mean: us(rtts.iter().sum::<Duration>()) / rtts.len() as f64,
            p99: us(rtts[rtts.len() * 99 / 100]),
            over_100us: over as f64 / rtts.len() as f64,
        }
    }

    fn line(&self) -> String {
        format!(
            "8 B WRITE round trip, both sides waiting in memory (us): median {:.1}, mean {:.1}, p99 {:.0}; {:.1} % over 100 us",
            self.median,
            self.mean,
            self.p99,
            self.over_100us * 100.0
        )
    }
}

/// WRITEs a ping-pong's number `i` into the peer's first 8 bytes: unsignaled but for one in
/// 16, whose completion is polled for at once (the send queue's room), as such programs do.
fn write_number(r: &Rdma, peer: &Advert, i: u64) {
    r.mr.write(8, &i.to_ne_bytes()).unwrap();
    let sge = [r.mr.sge(8..16).unwrap()];
    let signaled = i % 16 == 0;
    let flags = if signaled { SendFlags::SIGNALED } else { SendFlags(0) };
    let op = SendOp::RdmaWrite { remote_addr: peer.addr, rkey: peer.rkey() };
    r.qp.post_send(&[SendWr { wr_id: i, op, sg_list: &sge, flags, ud: None, xrc_srqn: None }]).unwrap();
    if signaled {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(wc) = r.cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                break;
            }
            assert!(Instant::now() < deadline, "no completion for WRITE {i}");
        }
    }
}

/// Waits until this side's first 8 bytes hold `i` (or `stop` is set), reading them by
/// address as a C program does: no call into softrdma (`Mr::read` would be a poll).
#[allow(unsafe_code)] // reads registered memory by address, as the programs it stands for
fn wait_for_number(r: &Rdma, i: u64, stop: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let word = r.mr.addr() as *const u64;
    loop {
        // SAFETY: the region's first 8 bytes (it is 4096 long, page-aligned), alive while
        // `r` is; the device writes them when a WRITE lands, and a volatile read sees that.
        if unsafe { std::ptr::read_volatile(word) } == i || stop() {
            return;
        }
        assert!(Instant::now() < deadline, "WRITE {i} did not land in 10 s");
        std::hint::spin_loop();
    }
}

/// `n` round trips of 8-byte RDMA WRITEs between two processes that each wait for the
/// other's by reading their own memory ([`write_number`], [`wait_for_number`]).
fn rdma_memory_wait(n: usize) -> RoundTrips {
    let mut peer = spawn("rdma-memory-pong", &[]);
    let (r, me) = rdma_side(A, 4096);
    let theirs = Advert::parse(&peer.expect_line("EP ", Duration::from_secs(10)));
    peer.send_line(&me.line());
    connect(&r, &me, &theirs);
    peer.expect_line("CONNECTED", Duration::from_secs(10));
    let warmup = n / 10;
    let mut rtts = Vec::with_capacity(n);
    for i in 1..=(n + warmup) as u64 {
        let t = Instant::now();
        write_number(&r, &theirs, i);
        wait_for_number(&r, i, &|| false);
        if i as usize > warmup {
            rtts.push(t.elapsed());
        }
    }
    peer.send_line("QUIT");
    peer.wait_success(Duration::from_secs(10));
    RoundTrips::of(rtts)
}

/// Runs this benchmark again as `role` (the test-runner arguments the helper adds are
/// ignored here).
fn spawn(role: &str, env: &[(&str, String)]) -> ChildProc {
    ChildProc::spawn("", role, env, None)
}

// ---- baselines -------------------------------------------------------------------------

fn udp_pingpong(busy: bool, n: usize) -> Lat {
    let mut peer = spawn(if busy { "udp-echo-busy" } else { "udp-echo-block" }, &[]);
    peer.expect_line("READY", Duration::from_secs(10));
    let sock = std::net::UdpSocket::bind(SocketAddr::new(A.into(), 0)).unwrap();
    sock.set_nonblocking(busy).unwrap();
    let to = SocketAddr::new(B.into(), UDP_PORT);
    let mut buf = [0u8; 64];
    let mut rtts = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        sock.send_to(&[1u8; 8], to).unwrap();
        loop {
            match sock.recv(&mut buf) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("{e}"),
            }
        }
        if i >= n / 10 {
            rtts.push(t.elapsed());
        }
    }
    sock.send_to(b"quit", to).unwrap();
    peer.wait_success(Duration::from_secs(10));
    let lat = one_way(rtts);
    println!("UDP ping-pong ({}): one way median {:.2} us", if busy { "busy-polled" } else { "blocking" }, lat.median);
    lat
}

fn udp_goodput(time: Duration) -> f64 {
    let mut sink = spawn("udp-sink-gro", &[]);
    sink.expect_line("READY", Duration::from_secs(10));
    let sock = RoceSocket::bind_with(A.into(), &Config { port: 0, ..Config::default() }).unwrap();
    let to = SocketAddr::new(B.into(), UDP_PORT);
    let segment = 4096 + 40; // a RoCE packet at MTU 4096: payload, BTH, RETH, ICRC
    let buf = vec![7u8; segment * 15]; // under the 64 KiB a UDP datagram (and a GSO buffer) may hold
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < time {
        let out = Outgoing { segment_size: Some(segment as u16), ..Outgoing::new(envelope_to(&sock, to), &buf) };
        match sock.send_batch(&[out]) {
            Ok(_) => sent += buf.len() as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let _ = sock.wait_writable(Some(Duration::from_millis(10)));
            }
            Err(e) => panic!("GSO send: {e}"),
        }
    }
    let _ = sock.send_to(to, b"quit");
    let line = sink.expect_line("GOT", Duration::from_secs(10));
    sink.wait_success(Duration::from_secs(10));
    let f: Vec<f64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    let (bytes, secs) = (f[0], f[1]);
    let gbs = bytes / secs / 1e9;
    println!(
        "UDP GSO+GRO goodput: {gbs:.2} GB/s received ({:.2} GB/s offered)",
        sent as f64 / time.as_secs_f64() / 1e9
    );
    gbs
}

fn envelope_to(sock: &RoceSocket, to: SocketAddr) -> softrdma_wire::Envelope {
    sock.envelope_to(to).unwrap()
}

// ---- softrdma --------------------------------------------------------------------------

struct Rdma {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    channel: CompChannel,
    qp: Qp,
    mr: Mr,
}

/// A device on loopback address `ip`, on the benchmark's port (`SOFTRDMA_BENCH_NO_GSO` turns
/// GSO/GRO off, to compare).
fn open_device(ip: [u8; 4]) -> Context {
    let options = ContextOptions {
        port: PORT,
        gso: std::env::var_os("SOFTRDMA_BENCH_NO_GSO").is_none(),
        spin: std::env::var("SOFTRDMA_BENCH_SPIN_US")
            .ok()
            .and_then(|us| us.parse().ok())
            .map_or(ContextOptions::default().spin, std::time::Duration::from_micros),
        ..ContextOptions::default()
    };
    Device::with_addresses("lo", vec![IpAddr::from(ip)]).open_with(&options).unwrap()
}

fn rdma_side(ip: [u8; 4], len: usize) -> (Rdma, Advert) {
    let ctx = open_device(ip);
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(4096, Some(&channel)).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = 1024;
    init.cap.max_recv_wr = 1024;
    init.cap.max_inline_data = 64;
    let qp = pd.create_qp(&init).unwrap();
    let mr = pd.reg_mr(len, Access::ALL).unwrap();
    let advert = Advert { qpn: qp.qpn(), ip: ip.into(), psn: 0, addr: mr.addr(), rkey: mr.rkey(), len: len as u64 };
    (Rdma { ctx, _pd: pd, cq, channel, qp, mr }, advert)
}

fn post_recvs(r: &Rdma, n: usize) {
    let sge = [r.mr.sge(0..8).unwrap()];
    for _ in 0..n {
        r.qp.post_recv(&[RecvWr { wr_id: 0, sg_list: &sge }]).unwrap();
    }
}

/// Sends an 8-byte WRITE with immediate, unsignaled unless every 64th (`i`), inline.
fn write_imm(r: &Rdma, peer: &Advert, i: u64) {
    let sge = [r.mr.sge(0..8).unwrap()];
    let mut flags = SendFlags::INLINE;
    if i % 64 == 63 {
        flags = flags | SendFlags::SIGNALED;
    }
    let op = SendOp::RdmaWriteWithImm { remote_addr: peer.addr + 64, rkey: peer.rkey(), imm: [0; 4] };
    r.qp.post_send(&[SendWr { wr_id: i, op, sg_list: &sge, flags, ud: None, xrc_srqn: None }]).unwrap();
}

/// Waits for the next receive completion, skipping send completions. `events`: sleep on
/// the completion channel instead of polling.
fn next_recv(r: &Rdma, events: bool) {
    loop {
        if let Some(wc) = r.cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::RecvRdmaWithImm {
                post_recvs(r, 1);
                return;
            }
            continue;
        }
        if events {
            r.cq.req_notify(false).unwrap();
            if let Some(wc) = r.cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success);
                if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    post_recvs(r, 1);
                    return;
                }
                continue;
            }
            r.channel.get_cq_event(Some(Duration::from_secs(10))).unwrap().expect("a completion event");
        }
    }
}

fn connect(r: &Rdma, me: &Advert, peer: &Advert) {
    let opts = ConnectOptions { timeout: 14, ..ConnectOptions::default() };
    r.qp.connect(me.psn, &peer.endpoint(), &opts).unwrap();
}

fn rdma_latency(n: usize) -> (Lat, Lat) {
    rdma_latency_modes(n, &[false, true])
}

fn rdma_latency_modes(n: usize, modes: &[bool]) -> (Lat, Lat) {
    let mut out = Vec::new();
    for &events in modes {
        let mut peer = spawn("rdma-pong", &[("SOFTRDMA_BENCH_EVENTS", u8::from(events).to_string())]);
        let (r, me) = rdma_side(A, 4096);
        let theirs = Advert::parse(&peer.expect_line("EP ", Duration::from_secs(10)));
        peer.send_line(&me.line());
        connect(&r, &me, &theirs);
        post_recvs(&r, 512);
        peer.expect_line("CONNECTED", Duration::from_secs(10));
        let rounds = if events { n / 4 } else { n };
        let mut rtts = Vec::with_capacity(rounds);
        for i in 0..(rounds + rounds / 10) as u64 {
            let t = Instant::now();
            write_imm(&r, &theirs, i);
            next_recv(&r, events);
            if i as usize >= rounds / 10 {
                rtts.push(t.elapsed());
            }
        }
        peer.send_line("QUIT");
        peer.wait_success(Duration::from_secs(10));
        let lat = one_way(rtts);
        println!(
            "RDMA WRITE 8 B ping-pong ({}): one way median {:.2} us",
            if events { "completion channel" } else { "polled" },
            lat.median
        );
        out.push(lat);
    }
    (out[0], *out.last().expect("a mode"))
}

fn rdma_bandwidth(time: Duration) -> f64 {
    const SIZE: usize = 65536;
    const DEPTH: usize = 16;
    let mut peer = spawn("rdma-target", &[]);
    let (r, me) = rdma_side(A, SIZE * DEPTH);
    let theirs = Advert::parse(&peer.expect_line("EP ", Duration::from_secs(10)));
    peer.send_line(&me.line());
    connect(&r, &me, &theirs);
    peer.expect_line("CONNECTED", Duration::from_secs(10));
    let post = |slot: usize, id: u64| {
        let sge = [r.mr.sge(slot * SIZE..(slot + 1) * SIZE).unwrap()];
        let op = SendOp::RdmaWrite { remote_addr: theirs.addr + (slot * SIZE) as u64, rkey: theirs.rkey() };
        r.qp.post_send(&[SendWr {
            wr_id: id,
            op,
            sg_list: &sge,
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: None,
        }])
        .unwrap();
    };
    for slot in 0..DEPTH {
        post(slot, slot as u64);
    }
    let start = Instant::now();
    let (mut done, mut posted) = (0u64, DEPTH as u64);
    let mut wcs = [EMPTY_WC; 16];
    while start.elapsed() < time {
        let n = r.cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success);
            done += 1;
            post((wc.wr_id % DEPTH as u64) as usize, posted);
            posted += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let gbs = (done * SIZE as u64) as f64 / secs / 1e9;
    let c = r.ctx.counters();
    while done < posted {
        done += r.cq.poll(&mut wcs) as u64;
    }
    peer.send_line("QUIT");
    peer.wait_success(Duration::from_secs(10));
    println!(
        "RDMA WRITE 64 KiB, {DEPTH} in flight: {gbs:.2} GB/s ({:.0} msg/s), retransmitted {}",
        gbs * 1e9 / SIZE as f64,
        c.engine.retransmitted_packets
    );
    gbs
}

fn idle_cpu(qps: usize, time: Duration) -> f64 {
    let mut holder = spawn("rdma-idle", &[("SOFTRDMA_BENCH_QPS", qps.to_string())]);
    let mut other = spawn("rdma-idle-peer", &[("SOFTRDMA_BENCH_QPS", qps.to_string())]);
    for _ in 0..qps {
        let (h, o) =
            (holder.expect_line("EP ", Duration::from_secs(10)), other.expect_line("EP ", Duration::from_secs(10)));
        holder.send_line(&o);
        other.send_line(&h);
    }
    holder.expect_line("CONNECTED", Duration::from_secs(10));
    other.expect_line("CONNECTED", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(200)); // past the progress thread's spin
    let cpu = |pid: u32| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
        // utime and stime, fields 14 and 15 of stat(5); f[0] is field 3.
        (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
    };
    let (before, t) = (cpu(holder.pid()), Instant::now());
    std::thread::sleep(time);
    let used = cpu(holder.pid()) - before;
    let share = used / t.elapsed().as_secs_f64();
    holder.send_line("QUIT");
    other.send_line("QUIT");
    holder.wait_success(Duration::from_secs(10));
    other.wait_success(Duration::from_secs(10));
    println!("idle: a process with {qps} connected RC QPs used {:.3} % of a core over {time:?}", share * 100.0);
    share
}

fn memory_per_qp(n: usize) -> f64 {
    let mut child = spawn("rdma-memory", &[("SOFTRDMA_BENCH_QPS", n.to_string())]);
    let line = child.expect_line("RSS", Duration::from_secs(30));
    child.wait_success(Duration::from_secs(10));
    let f: Vec<f64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    let per = (f[1] - f[0]) / n as f64;
    println!(
        "memory: {n} RC QPs (send/recv queues 64/64, CQ shared) took {:.1} KiB each of resident memory",
        per / 1024.0
    );
    per
}

// ---- the child roles -----------------------------------------------------------------------

fn rss_bytes() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() * 1024.0
}

fn child_main(role: &str) {
    match role {
        "udp-echo-busy" | "udp-echo-block" => {
            let sock = std::net::UdpSocket::bind(SocketAddr::new(B.into(), UDP_PORT)).unwrap();
            sock.set_nonblocking(role == "udp-echo-busy").unwrap();
            say("READY");
            let mut buf = [0u8; 64];
            loop {
                match sock.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        if &buf[..n] == b"quit" {
                            return;
                        }
                        sock.send_to(&buf[..n], from).unwrap();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        "udp-sink-gro" => {
            let config = Config { port: UDP_PORT, gro: true, recv_buffer_size: Some(8 << 20), ..Config::default() };
            let sock = RoceSocket::bind_with(B.into(), &config).unwrap();
            let mut batch = RecvBatch::new(32, 65536);
            say("READY");
            let (mut bytes, mut first) = (0u64, None);
            loop {
                if sock.recv_timeout(&mut batch, Duration::from_secs(10)).unwrap() == 0 {
                    panic!("the sender went quiet");
                }
                for d in batch.iter() {
                    if d.payload == b"quit" {
                        let secs = first.map_or(1.0, |f: Instant| f.elapsed().as_secs_f64());
                        say(&format!("GOT {bytes} {secs}"));
                        return;
                    }
                    first.get_or_insert_with(Instant::now);
                    bytes += d.payload.len() as u64;
                }
            }
        }
        "rdma-pong" | "rdma-target" => {
            let events = std::env::var("SOFTRDMA_BENCH_EVENTS").as_deref() == Ok("1");
            let (r, me) = rdma_side(B, 16 * 65536);
            say(&me.line());
            let peer = Advert::parse(&read_stdin_line().unwrap());
            connect(&r, &me, &peer);
            post_recvs(&r, 512);
            say("CONNECTED");
            if role == "rdma-target" {
                // A passive target: the progress thread does everything.
                while read_stdin_line().is_some_and(|l| l != "QUIT") {}
                return;
            }
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            std::thread::spawn(move || {
                while read_stdin_line().is_some_and(|l| l != "QUIT") {}
                s2.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Pong: wait for the ping (polling), answer it.
                if let Some(wc) = r.cq.poll_one() {
                    assert_eq!(wc.status, WcStatus::Success);
                    if wc.opcode == WcOpcode::RecvRdmaWithImm {
                        post_recvs(&r, 1);
                        write_imm(&r, &peer, i);
                        i += 1;
                    }
                } else if events {
                    r.cq.req_notify(false).unwrap();
                    if r.cq.poll_one().is_some_and(|wc| {
                        if wc.opcode == WcOpcode::RecvRdmaWithImm {
                            post_recvs(&r, 1);
                            write_imm(&r, &peer, i);
                            i += 1;
                        }
                        true
                    }) {
                        continue;
                    }
                    let _ = r.channel.get_cq_event(Some(Duration::from_millis(100))).unwrap();
                }
            }
        }
        "rdma-memory-pong" => {
            // Waits in its memory for each number, and WRITEs it back.
            let (r, me) = rdma_side(B, 4096);
            say(&me.line());
            let peer = Advert::parse(&read_stdin_line().unwrap());
            connect(&r, &me, &peer);
            say("CONNECTED");
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            std::thread::spawn(move || {
                while read_stdin_line().is_some_and(|l| l != "QUIT") {}
                s2.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
            for i in 1.. {
                wait_for_number(&r, i, &stopped);
                if stopped() {
                    return;
                }
                write_number(&r, &peer, i);
            }
        }
        "rdma-idle" | "rdma-idle-peer" => {
            let n: usize = std::env::var("SOFTRDMA_BENCH_QPS").unwrap().parse().unwrap();
            let ip = if role == "rdma-idle" { A } else { B };
            let ctx = open_device(ip);
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(4096, None).unwrap();
            let mut qps = Vec::new();
            for _ in 0..n {
                let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
                say(&Advert { qpn: qp.qpn(), ip: ip.into(), psn: 0, addr: 0, rkey: 0, len: 0 }.line());
                let peer = Advert::parse(&read_stdin_line().unwrap());
                qp.connect(0, &peer.endpoint(), &ConnectOptions::default()).unwrap();
                qps.push(qp);
            }
            say("CONNECTED");
            while read_stdin_line().is_some_and(|l| l != "QUIT") {}
        }
        "rdma-memory" => {
            let n: usize = std::env::var("SOFTRDMA_BENCH_QPS").unwrap().parse().unwrap();
            let ctx = open_device([127, 0, 0, 3]);
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(4096, None).unwrap();
            let before = rss_bytes();
            let qps: Vec<Qp> = (0..n).map(|_| pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap()).collect();
            let after = rss_bytes();
            say(&format!("RSS {before} {after}"));
            drop(qps);
        }
        other => panic!("unknown bench role {other}"),
    }
}
