//! `softrdma perf baseline`: what this machine does without RDMA semantics, measured the
//! same way as the RDMA figures so that each can be judged as a fraction of its limit.
//!
//! | RDMA figure                           | its limit, measured here                       |
//! |---------------------------------------|------------------------------------------------|
//! | latency, completions polled           | busy-polled UDP ping-pong, one way             |
//! | latency, blocked on a channel         | blocking UDP ping-pong, one way                |
//! | bandwidth between hosts' stacks       | UDP GSO+GRO goodput over loopback, MTU-sized segments |
//! | bandwidth of a same-host fast path    | `process_vm_writev` into another process       |
//! | bandwidth of any copy                 | `memcpy` of the same chunk size                |
//!
//! Every peer is a second process (this program again, with a hidden `--role`), on
//! 127.0.0.1, as the RDMA peer is. The two bandwidth limits that targets are read against
//! (UDP GSO+GRO goodput, `process_vm_writev`) are the best of [`LIMIT_RUNS`] runs: the
//! machine's noise only ever takes from a throughput, and one half-second run of the UDP
//! goodput gave 1.6 to 4.9 GB/s within minutes on a 2-core VM (2026-11-29).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use serde::Serialize;
use softrdma_udp::{Config, Outgoing, RecvBatch, RoceSocket};

use super::PerfError;
use super::child::Peer;
use super::report::LatStats;

/// Options of `softrdma perf baseline`.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct BaselineArgs {
    /// Round trips per ping-pong (the blocking one does a quarter as many).
    #[arg(short = 'n', long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub(crate) iters: u64,
    /// Seconds each throughput figure is measured for (the UDP goodput and `process_vm_writev`
    /// three times each, the best counting).
    #[arg(short = 'D', long, default_value_t = 1.0)]
    pub(crate) duration: f64,
    /// Chunk size of the copies (memcpy, process_vm_writev).
    #[arg(short, long, default_value_t = 65536, value_parser = clap::value_parser!(u64).range(64..=(64 << 20)))]
    pub(crate) size: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// Receive UDP with GRO on this address (any port), for a `--gso-to` on another host or
    /// network namespace: prints `LISTENING <port>`, then answers each sender with what it
    /// received.
    #[arg(long, value_name = "ADDR", conflicts_with = "gso_to")]
    pub(crate) gso_sink: Option<std::net::IpAddr>,
    /// Measure UDP GSO+GRO goodput to a `--gso-sink` at ADDR:PORT for `-D` seconds: the
    /// limit of RoCE between two hosts.
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) gso_to: Option<SocketAddr>,
    /// Run as a measurement's peer (internal).
    #[arg(long, hide = true)]
    pub(crate) role: Option<String>,
}

/// The machine's limits.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Baseline {
    /// 8-byte UDP ping-pong over 127.0.0.1, both sides busy-polling non-blocking sockets.
    pub(crate) udp_busy_one_way_us: LatStats,
    /// The same with blocking sockets (each side sleeps in `recv`).
    pub(crate) udp_blocking_one_way_us: LatStats,
    /// UDP payload bytes a receiving process gets per second from a sender using GSO
    /// (4136-byte segments, an MTU-4096 RoCE packet) with GRO on the receiver.
    pub(crate) udp_gso_gro_gbytes_per_sec: f64,
    /// `memcpy` of `chunk_bytes` chunks into an 8 MiB destination, one core.
    pub(crate) memcpy_gbytes_per_sec: f64,
    /// `process_vm_writev` of `chunk_bytes` chunks into another process's 8 MiB buffer.
    pub(crate) process_vm_writev_gbytes_per_sec: Option<f64>,
    /// Why `process_vm_writev` was not measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) process_vm_writev_unavailable: Option<String>,
    pub(crate) chunk_bytes: u64,
    /// 8-byte ping-pong through shared memory, both processes spinning on a cache line:
    /// what a same-host path's doorbell could answer in, one way.
    pub(crate) shm_pingpong_one_way_us: LatStats,
    /// 64-byte messages through a ring in shared memory, copied in by one process and out
    /// by the other (two copies, as a same-host SEND would make), in millions per second.
    pub(crate) shm_ring_64b_mmsgs_per_sec: f64,
}

const SEGMENT: usize = 4096 + 40; // an MTU-4096 RoCE packet: payload, BTH, RETH, ICRC
const DEST_BYTES: usize = 8 << 20;

/// Runs of a bandwidth limit, of which the best counts.
pub(crate) const LIMIT_RUNS: usize = 3;

/// The best of [`LIMIT_RUNS`] runs of `run`, or its first error.
fn best_of(mut run: impl FnMut() -> Result<f64, PerfError>) -> Result<f64, PerfError> {
    (0..LIMIT_RUNS).try_fold(0.0, |best: f64, _| Ok(best.max(run()?)))
}

/// Measures everything.
pub(crate) fn measure(iters: u64, duration: Duration, chunk: u64) -> Result<Baseline, PerfError> {
    let udp_busy_one_way_us = udp_pingpong(true, iters)?;
    let udp_blocking_one_way_us = udp_pingpong(false, (iters / 4).max(10))?;
    let udp_gso_gro_gbytes_per_sec = best_of(|| udp_goodput(duration))?;
    let memcpy_gbytes_per_sec = memcpy(chunk as usize, duration);
    let (pvm, why) = match best_of(|| process_vm_writev(chunk as usize, duration)) {
        Ok(v) => (Some(v), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let (shm_pingpong_one_way_us, shm_ring_64b_mmsgs_per_sec) = shared_memory(iters, duration)?;
    Ok(Baseline {
        shm_pingpong_one_way_us,
        shm_ring_64b_mmsgs_per_sec,
        udp_busy_one_way_us,
        udp_blocking_one_way_us,
        udp_gso_gro_gbytes_per_sec,
        memcpy_gbytes_per_sec,
        process_vm_writev_gbytes_per_sec: pvm,
        process_vm_writev_unavailable: why,
        chunk_bytes: chunk,
    })
}

/// The baseline as text.
pub(crate) fn text(b: &Baseline) -> String {
    let l = |x: &LatStats| format!("min {:.2}  median {:.2}  p99 {:.2}  max {:.2} us", x.min, x.median, x.p99, x.max);
    let mut o = String::new();
    o += "softrdma perf baseline: this machine without RDMA semantics, two processes on 127.0.0.1\n";
    o += "(shm: a page of shared memory between the two)\n";
    o += &format!("  UDP ping-pong 8 B, busy-polled, one way     {}\n", l(&b.udp_busy_one_way_us));
    o += &format!("  UDP ping-pong 8 B, blocking, one way        {}\n", l(&b.udp_blocking_one_way_us));
    o += &format!(
        "  UDP GSO+GRO goodput, 4136 B segments        {:.2} GB/s (best of {LIMIT_RUNS} runs)\n",
        b.udp_gso_gro_gbytes_per_sec
    );
    o += &format!("  memcpy, {} B chunks                      {:.2} GB/s\n", b.chunk_bytes, b.memcpy_gbytes_per_sec);
    match (b.process_vm_writev_gbytes_per_sec, &b.process_vm_writev_unavailable) {
        (Some(v), _) => {
            o += &format!(
                "  process_vm_writev, {} B chunks           {v:.2} GB/s (best of {LIMIT_RUNS} runs)\n",
                b.chunk_bytes
            )
        }
        (None, Some(why)) => o += &format!("  process_vm_writev: not measured: {why}\n"),
        (None, None) => {}
    }
    o += &format!("  shm ping-pong 8 B, spinning, one way        {}\n", l(&b.shm_pingpong_one_way_us));
    o += &format!("  shm ring, 64 B messages, 2 copies           {:.2} M msg/s\n", b.shm_ring_64b_mmsgs_per_sec);
    o
}

/// The shared-memory page of the `shm-peer` role: control words on cache lines of their
/// own, then a ring of 64-byte slots.
mod shm {
    use std::sync::atomic::AtomicU64;

    /// Messages the consumer has taken (written by the peer).
    pub(super) const TAIL: usize = 0;
    /// Messages the producer has put in (written by the measuring process).
    pub(super) const HEAD: usize = 8;
    /// The ping-pong's ball: the measuring process writes n, the peer answers n in PONG.
    pub(super) const PING: usize = 16;
    pub(super) const PONG: usize = 24;
    /// Set to 1 to end the peer.
    pub(super) const QUIT: usize = 32;
    pub(super) const RING: usize = 4096;
    pub(super) const SLOT: usize = 64;
    pub(super) const SLOTS: usize = 1024;
    pub(super) const LEN: usize = RING + SLOT * SLOTS;

    /// A shared mapping of [`LEN`] bytes of a file in /dev/shm.
    pub(super) struct Page {
        ptr: *mut u8,
    }

    impl Page {
        #[allow(unsafe_code)] // mapping memory another process writes
        pub(super) fn map(file: &std::fs::File) -> std::io::Result<Page> {
            use std::os::fd::AsRawFd;
            file.set_len(LEN as u64)?;
            // SAFETY: a fresh shared mapping of a file of LEN bytes; nothing else in this
            // process refers to that range, and Drop unmaps it.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    file.as_raw_fd(),
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Page { ptr: ptr.cast() })
        }

        /// The control word at 8-byte index `i` (one of the constants above).
        #[allow(unsafe_code)] // a word of memory another process writes
        pub(super) fn word(&self, i: usize) -> &AtomicU64 {
            assert!(i * 8 + 8 <= RING);
            // SAFETY: in bounds of the mapping (asserted), 8-byte aligned (the mapping is
            // page-aligned), alive as long as `self`; both processes touch it only atomically.
            unsafe { AtomicU64::from_ptr(self.ptr.add(i * 8).cast()) }
        }

        /// Copies `msg` into ring slot `k` (copy one of two).
        #[allow(unsafe_code)] // a copy into memory another process reads
        pub(super) fn put(&self, k: usize, msg: &[u8; SLOT]) {
            // SAFETY: the slot is in bounds; the producer owns it until it publishes HEAD
            // past it, and the consumer reads it only after that (Release/Acquire).
            unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), self.ptr.add(RING + (k % SLOTS) * SLOT), SLOT) }
        }

        /// Copies ring slot `k` out into `msg` (copy two of two).
        #[allow(unsafe_code)] // a copy out of memory another process writes
        pub(super) fn take(&self, k: usize, msg: &mut [u8; SLOT]) {
            // SAFETY: the slot is in bounds; the consumer owns it from the HEAD it read
            // (Acquire) until it publishes TAIL past it.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(RING + (k % SLOTS) * SLOT), msg.as_mut_ptr(), SLOT) }
        }
    }

    impl Drop for Page {
        #[allow(unsafe_code)] // unmapping our own mapping
        fn drop(&mut self) {
            // SAFETY: the mapping `map` made; no reference into it outlives `self`.
            unsafe { libc::munmap(self.ptr.cast(), LEN) };
        }
    }
}

/// The shared-memory ping-pong (one-way latencies) and ring (million 64-byte messages per
/// second), against a peer process spinning on the same page.
pub(crate) fn shared_memory(n: u64, time: Duration) -> Result<(LatStats, f64), PerfError> {
    use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
    let (child, line) = peer("shm-peer")?;
    let path = line.split_whitespace().nth(1).ok_or_else(|| PerfError::Io(format!("the peer said {line:?}")))?;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(io("opening the shared page"))?;
    let page = shm::Page::map(&file).map_err(io("mapping the shared page"))?;
    let _ = std::fs::remove_file(path);
    let stalled = |t: Instant| t.elapsed() > Duration::from_secs(5);
    // The ping-pong.
    let warmup = (n / 10).max(1);
    let mut rtts = Vec::with_capacity(n as usize);
    for i in 1..=n + warmup {
        let t = Instant::now();
        page.word(shm::PING).store(i, Release);
        while page.word(shm::PONG).load(Acquire) != i {
            if stalled(t) {
                return Err(PerfError::Io("the shared-memory peer stopped answering".into()));
            }
            std::hint::spin_loop();
        }
        if i > warmup {
            rtts.push(t.elapsed());
        }
    }
    // The ring: count what the consumer took while this side produced for `time`.
    let msg = [0x5au8; shm::SLOT];
    let (start, tail0) = (Instant::now(), page.word(shm::TAIL).load(Acquire));
    let mut head = page.word(shm::HEAD).load(Relaxed);
    while start.elapsed() < time {
        for _ in 0..256 {
            let t = Instant::now();
            while head - page.word(shm::TAIL).load(Acquire) >= shm::SLOTS as u64 {
                if stalled(t) {
                    return Err(PerfError::Io("the shared-memory peer stopped consuming".into()));
                }
                std::hint::spin_loop();
            }
            page.put(head as usize, &msg);
            head += 1;
            page.word(shm::HEAD).store(head, Release);
        }
    }
    let taken = page.word(shm::TAIL).load(Acquire) - tail0;
    let rate = taken as f64 / start.elapsed().as_secs_f64() / 1e6;
    page.word(shm::QUIT).store(1, Release);
    let _ = child.wait(Duration::from_secs(5));
    Ok((one_way(rtts)?, rate))
}

fn one_way(mut rtts: Vec<Duration>) -> Result<LatStats, PerfError> {
    rtts.sort();
    LatStats::of(&rtts, 0.5).ok_or_else(|| PerfError::Io("no round trips measured".into()))
}

fn peer(role: &str) -> Result<(Peer, String), PerfError> {
    let mut p = Peer::spawn(&["perf".into(), "baseline".into(), "--role".into(), role.into()], "baseline peer")?;
    let line = p.expect_line("READY", Duration::from_secs(10))?;
    Ok((p, line))
}

fn ready_port(line: &str) -> Result<u16, PerfError> {
    line.split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| PerfError::Io(format!("peer said {line:?}")))
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> PerfError {
    move |e| PerfError::Io(format!("{what}: {e}"))
}

/// A UDP ping-pong of 8-byte datagrams; one-way latencies.
pub(crate) fn udp_pingpong(busy: bool, n: u64) -> Result<LatStats, PerfError> {
    let (child, line) = peer(if busy { "udp-echo-busy" } else { "udp-echo-block" })?;
    let to = SocketAddr::from((Ipv4Addr::LOCALHOST, ready_port(&line)?));
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io("binding a UDP socket"))?;
    sock.set_nonblocking(busy).map_err(io("set_nonblocking"))?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).map_err(io("set_read_timeout"))?;
    let mut buf = [0u8; 64];
    let warmup = (n / 10).max(1);
    let mut rtts = Vec::with_capacity(n as usize);
    for i in 0..n + warmup {
        let t = Instant::now();
        sock.send_to(&[1u8; 8], to).map_err(io("UDP send"))?;
        loop {
            match sock.recv(&mut buf) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && busy => {
                    if t.elapsed() > Duration::from_secs(5) {
                        return Err(PerfError::Io("the UDP echo stopped answering".into()));
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(PerfError::Io(format!("UDP receive: {e}"))),
            }
        }
        if i >= warmup {
            rtts.push(t.elapsed());
        }
    }
    let _ = sock.send_to(b"quit", to);
    let _ = child.wait(Duration::from_secs(5));
    one_way(rtts)
}

/// UDP goodput with GSO on the sender and GRO on the receiver (a peer process on
/// 127.0.0.1), in GB/s received.
pub(crate) fn udp_goodput(time: Duration) -> Result<f64, PerfError> {
    let (child, line) = peer("udp-sink-gro")?;
    let to = SocketAddr::from((Ipv4Addr::LOCALHOST, ready_port(&line)?));
    let goodput = gso_to(to, time);
    let _ = child.wait(Duration::from_secs(5));
    goodput
}

/// Sends RoCE-sized segments with GSO to the sink at `to` for `time`, then asks it what it
/// received: its goodput in GB/s.
pub(crate) fn gso_to(to: SocketAddr, time: Duration) -> Result<f64, PerfError> {
    // The address the route to the sink leaves from (what a connected socket picks).
    let probe = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).map_err(io("binding a probe"))?;
    probe.connect(to).map_err(|e| PerfError::Io(format!("no route to the sink at {to}: {e}")))?;
    let local = probe.local_addr().map_err(io("the probe's address"))?.ip();
    let sock =
        RoceSocket::bind_with(local, &Config { port: 0, ..Config::default() }).map_err(io("binding the GSO socket"))?;
    let buf = vec![7u8; SEGMENT * 15]; // under the 64 KiB a GSO buffer may hold
    let envelope = sock.envelope_to(to).map_err(io("the GSO socket's envelope"))?;
    let start = Instant::now();
    while start.elapsed() < time {
        let out = Outgoing { segment_size: Some(SEGMENT as u16), ..Outgoing::new(envelope, &buf) };
        match sock.send_batch(&[out]) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let _ = sock.wait_writable(Some(Duration::from_millis(10)));
            }
            Err(e) => return Err(PerfError::Io(format!("GSO send: {e}"))),
        }
    }
    // The sink answers "quit" with what it got; resent, since a datagram may be lost.
    let mut batch = RecvBatch::new(4, 2048);
    for _ in 0..20 {
        sock.send_to(to, b"quit").map_err(io("asking the sink"))?;
        if sock.recv_timeout(&mut batch, Duration::from_millis(250)).map_err(io("the sink's answer"))? == 0 {
            continue;
        }
        for d in batch.iter() {
            let got = String::from_utf8_lossy(d.payload);
            let f: Vec<f64> = got.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
            if let [bytes, secs] = f[..] {
                return if secs > 0.0 && got.starts_with("GOT ") {
                    Ok(bytes / secs / 1e9)
                } else {
                    Err(PerfError::Io(format!("the sink said {got:?}")))
                };
            }
        }
    }
    Err(PerfError::Io(format!("the GSO sink at {to} never answered")))
}

/// The GRO receiver of [`gso_to`], on `addr`: prints `LISTENING <port>`, counts what
/// arrives and answers each sender's "quit" with `GOT <bytes> <seconds>` (a "quit" resent
/// with nothing in between, because the answer was lost, gets the same answer again);
/// ends after 30 s of silence, or after answering when `once`.
pub(crate) fn gso_sink(addr: std::net::IpAddr, once: bool, announce: &dyn Fn(u16)) -> Result<(), PerfError> {
    let config = Config { port: 0, gro: true, recv_buffer_size: Some(8 << 20), ..Config::default() };
    let sock = RoceSocket::bind_with(addr, &config).map_err(io("binding the sink"))?;
    let mut batch = RecvBatch::new(32, 65536);
    announce(sock.local_addr().port());
    let (mut bytes, mut first) = (0u64, None);
    // Nothing received before a "quit": nothing got through.
    let mut last = String::from("GOT 0 1");
    loop {
        if sock.recv_timeout(&mut batch, Duration::from_secs(30)).map_err(io("sink receive"))? == 0 {
            return if once { Err(PerfError::Io("the sender went quiet".into())) } else { Ok(()) };
        }
        let mut answer = None;
        for d in batch.iter() {
            if d.payload == b"quit" {
                answer = Some(d.source);
                continue;
            }
            first.get_or_insert_with(Instant::now);
            bytes += d.payload.len() as u64;
        }
        if let Some(to) = answer {
            if let Some(f) = first {
                last = format!("GOT {bytes} {}", f.elapsed().as_secs_f64());
            }
            let _ = sock.send_to(to, last.as_bytes());
            if once {
                return Ok(());
            }
            (bytes, first) = (0, None);
        }
    }
}

/// `memcpy` bandwidth in GB/s.
pub(crate) fn memcpy(chunk: usize, time: Duration) -> f64 {
    let src = vec![0x5au8; chunk];
    let mut dst = vec![0u8; DEST_BYTES.max(chunk)];
    let slots = dst.len() / chunk;
    let (start, mut bytes, mut i) = (Instant::now(), 0u64, 0usize);
    while start.elapsed() < time {
        for _ in 0..64 {
            let off = (i % slots) * chunk;
            dst[off..off + chunk].copy_from_slice(&src);
            i += 1;
            bytes += chunk as u64;
        }
        std::hint::black_box(&mut dst);
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// `process_vm_writev` bandwidth into another process, in GB/s.
pub(crate) fn process_vm_writev(chunk: usize, time: Duration) -> Result<f64, PerfError> {
    let (mut child, line) = peer("vm-target")?;
    let f: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let [pid, addr, len] = f[..] else {
        return Err(PerfError::Io(format!("the target said {line:?}")));
    };
    let src = vec![0x5au8; chunk];
    let slots = (len as usize / chunk).max(1);
    for slot in 0..slots {
        // One untimed pass, so that the target's pages exist before the clock starts.
        write_other(pid as i32, &src, addr + (slot * chunk) as u64)?;
    }
    let (start, mut bytes, mut i) = (Instant::now(), 0u64, 0usize);
    while start.elapsed() < time {
        for _ in 0..64 {
            let at = addr + ((i % slots) * chunk) as u64;
            write_other(pid as i32, &src, at)?;
            i += 1;
            bytes += chunk as u64;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let _ = child.send_line("quit");
    let _ = child.wait(Duration::from_secs(5));
    Ok(bytes as f64 / secs / 1e9)
}

/// Copies `data` to `addr` in process `pid`.
#[allow(unsafe_code)] // The one system call that writes another process's memory.
fn write_other(pid: i32, data: &[u8], addr: u64) -> Result<(), PerfError> {
    let local = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: `local` describes `data`, which lives across the call and is only read; the
    // remote address is checked by the kernel against the target's mappings (EFAULT), and
    // the target is our child, which handed out that buffer and keeps it until told to quit.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(PerfError::Io(format!("process_vm_writev into process {pid}: {e}")));
    }
    Ok(())
}

/// The peers' side (`--role`).
pub(crate) fn role(role: &str) -> Result<(), PerfError> {
    let say = |s: String| {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{s}");
        let _ = out.flush();
    };
    match role {
        "udp-echo-busy" | "udp-echo-block" => {
            let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io("binding the echo socket"))?;
            sock.set_nonblocking(role == "udp-echo-busy").map_err(io("set_nonblocking"))?;
            sock.set_read_timeout(Some(Duration::from_secs(30))).map_err(io("set_read_timeout"))?;
            say(format!("READY {}", sock.local_addr().map_err(io("local_addr"))?.port()));
            let mut buf = [0u8; 64];
            let mut idle = Instant::now();
            loop {
                match sock.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        if &buf[..n] == b"quit" {
                            return Ok(());
                        }
                        sock.send_to(&buf[..n], from).map_err(io("echo"))?;
                        idle = Instant::now();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if idle.elapsed() > Duration::from_secs(30) {
                            return Err(PerfError::Io("the echo heard nothing for 30 s".into()));
                        }
                        std::hint::spin_loop();
                    }
                    Err(e) => return Err(PerfError::Io(format!("echo receive: {e}"))),
                }
            }
        }
        "udp-sink-gro" => gso_sink(Ipv4Addr::LOCALHOST.into(), true, &|port| say(format!("READY {port}"))),
        "vm-target" => {
            let buf = vec![0u8; DEST_BYTES];
            say(format!("READY {} {} {}", std::process::id(), buf.as_ptr() as usize, buf.len()));
            // Wait for "quit" (or the parent's end) with the buffer alive.
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            std::hint::black_box(&buf);
            Ok(())
        }
        "shm-peer" => {
            use std::sync::atomic::Ordering::{Acquire, Release};
            let path = format!("/dev/shm/softrdma-baseline-{}", std::process::id());
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(io("creating the shared page"))?;
            let page = shm::Page::map(&file).map_err(io("mapping the shared page"))?;
            say(format!("READY {path}"));
            let (mut idle, mut tail, mut msg) = (Instant::now(), 0u64, [0u8; shm::SLOT]);
            while page.word(shm::QUIT).load(Acquire) == 0 {
                let ping = page.word(shm::PING).load(Acquire);
                if ping != page.word(shm::PONG).load(Acquire) {
                    page.word(shm::PONG).store(ping, Release);
                    idle = Instant::now();
                }
                if tail < page.word(shm::HEAD).load(Acquire) {
                    page.take(tail as usize, &mut msg);
                    std::hint::black_box(&msg);
                    tail += 1;
                    page.word(shm::TAIL).store(tail, Release);
                    idle = Instant::now();
                } else if idle.elapsed() > Duration::from_secs(30) {
                    let _ = std::fs::remove_file(&path);
                    return Err(PerfError::Io("the shared-memory peer heard nothing for 30 s".into()));
                }
                std::hint::spin_loop();
            }
            Ok(())
        }
        other => Err(PerfError::Usage(format!("unknown baseline role {other:?}"))),
    }
}
