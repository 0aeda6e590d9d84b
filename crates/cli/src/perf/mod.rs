//! `softrdma perf`: perftest for softrdma.
//!
//! `softrdma perf <send|write|read|atomic> <bw|lat>` waits as the server; with a HOST it
//! connects to one as the client; with `--loopback` it runs both, as two processes on
//! 127.0.0.1. The client decides the test and sends it to the server ([`spec::Spec`]), so
//! the server needs no options but its port. `softrdma perf baseline` measures what the
//! machine does without RDMA, and `--vs-baseline` prints each figure as a ratio of it.

mod baseline;
mod child;
mod cm;
mod control;
mod plot;
mod progress;
mod report;
mod run;
mod spec;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Subcommand;
use softrdma::{ContextOptions, Device};

pub(crate) use baseline::BaselineArgs;
use cm::CmConn;
use control::{Control, Msg, SideInfo, SideStats};
use progress::Progress;
use report::{Path, Ratio, Report, SizeResult, Target, latency_is};
use run::Side;
use spec::{Mode, Op, Spec, TestArgs};

/// `softrdma perf`'s tests.
#[derive(Clone, Debug, Subcommand)]
pub(crate) enum PerfCommand {
    /// SEND into the peer's receive queue (ib_send_bw, ib_send_lat).
    Send(TestArgs),
    /// RDMA WRITE into the peer's memory (ib_write_bw, ib_write_lat).
    Write(TestArgs),
    /// RDMA READ from the peer's memory (ib_read_bw, ib_read_lat).
    Read(TestArgs),
    /// 8-byte atomic FETCH_AND_ADD on the peer's memory (ib_atomic_bw, ib_atomic_lat).
    Atomic(TestArgs),
    /// What this machine does without RDMA: UDP ping-pong latency (busy-polled and
    /// blocking), UDP GSO+GRO goodput, memcpy and process_vm_writev bandwidth.
    Baseline(BaselineArgs),
}

/// Why a perf run failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PerfError {
    /// The options do not make a test.
    #[error("{0}")]
    Usage(String),
    /// The peer cannot be reached.
    #[error("{0}")]
    Unreachable(String),
    /// The peer broke the protocol or went away.
    #[error("{0}")]
    Peer(String),
    /// A verb failed.
    #[error("{0}")]
    Rdma(String),
    /// Operations stopped completing.
    #[error("the run stalled: {0}")]
    Stalled(String),
    /// A system call or file failed.
    #[error("{0}")]
    Io(String),
}

impl PerfError {
    /// 2 for what the user can fix by changing the command (options, host), 1 otherwise.
    fn exit_code(&self) -> u8 {
        match self {
            PerfError::Usage(_) | PerfError::Unreachable(_) => 2,
            _ => 1,
        }
    }
}

/// Runs a `softrdma perf` command.
pub(crate) fn main(cmd: PerfCommand) -> ExitCode {
    let (what, result) = match cmd {
        PerfCommand::Send(a) => ("send", test(Op::Send, &a)),
        PerfCommand::Write(a) => ("write", test(Op::Write, &a)),
        PerfCommand::Read(a) => ("read", test(Op::Read, &a)),
        PerfCommand::Atomic(a) => ("atomic", test(Op::Atomic, &a)),
        PerfCommand::Baseline(a) => ("baseline", baseline_main(&a)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("softrdma perf {what}: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}

fn print(text: &str) -> Result<(), PerfError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(PerfError::Io(format!("writing the results: {e}"))),
    }
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, PerfError> {
    serde_json::to_string_pretty(value).map(|s| s + "\n").map_err(|e| PerfError::Io(format!("encoding JSON: {e}")))
}

fn baseline_main(a: &BaselineArgs) -> Result<(), PerfError> {
    if let Some(role) = &a.role {
        return baseline::role(role);
    }
    if !(0.01..=600.0).contains(&a.duration) {
        return Err(PerfError::Usage(format!("-D/--duration {}: 0.01 to 600 seconds", a.duration)));
    }
    if let Some(addr) = a.gso_sink {
        return baseline::gso_sink(addr, false, &|port| {
            let _ = print(&format!("LISTENING {port}\n"));
        });
    }
    if let Some(to) = a.gso_to {
        let goodput = baseline::gso_to(to, Duration::from_secs_f64(a.duration))?;
        return print(&if a.json {
            format!("{{\"udp_gso_gro_gbytes_per_sec\":{goodput}}}\n")
        } else {
            format!("UDP GSO+GRO goodput to {to}, 4136 B segments: {goodput:.2} GB/s\n")
        });
    }
    let b = baseline::measure(a.iters, Duration::from_secs_f64(a.duration), a.size)?;
    print(&if a.json { json(&b)? } else { baseline::text(&b) })
}

fn test(op: Op, a: &TestArgs) -> Result<(), PerfError> {
    let spec = Spec::from_args(op, a).map_err(PerfError::Usage)?;
    if let Some(path) = &a.plot {
        // Before the run, not after it: a plot that cannot be written wastes the run.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        if !dir.is_dir() {
            return Err(PerfError::Usage(format!(
                "--plot {}: there is no directory {}",
                path.display(),
                dir.display()
            )));
        }
    }
    if !a.qps_sweep.is_empty() && (a.loopback || a.host.is_some()) {
        return sweep(op, a, &spec);
    }
    if a.rounds > 1 && (a.loopback || a.host.is_some()) {
        return rounds(op, a, &spec);
    }
    if a.loopback {
        return loopback(op, a, &spec);
    }
    match &a.host {
        Some(host) => {
            let report = client(host, a, &spec)?;
            output(a, report)
        }
        None => server(op, a),
    }
}

/// Prints (and plots) a client's report, measuring the baseline first if asked.
fn output(a: &TestArgs, mut report: Report) -> Result<(), PerfError> {
    if a.vs_baseline {
        let b = measure_baseline(&report.spec)?;
        with_baseline(&mut report, b);
    }
    if let Some(path) = &a.plot {
        plot::draw(&report, path)?;
    }
    print(&if a.json { json(&report)? } else { report.text() })
}

/// `--vs-baseline`'s measurement of this machine, sized for `spec`'s messages.
fn measure_baseline(spec: &Spec) -> Result<baseline::Baseline, PerfError> {
    baseline::measure(5000, Duration::from_millis(500), spec.max_size().max(64))
}

/// Puts `b` and each figure's ratio to it into `report`.
fn with_baseline(report: &mut Report, b: baseline::Baseline) {
    report.vs_baseline = ratios(report, &b);
    report.baseline = Some(b);
}

/// Each figure of `report` against the limits that bound it. One rule picks the
/// like-for-like limit, which comes first for its figure, and the project's target: the
/// path the report's packets took ([`Path`]).
///
/// - **same-host** (every packet through shared memory): 64 KiB WRITE bandwidth against
///   `process_vm_writev` (target >= 0.6), 8 B WRITE latency against the spinning
///   shared-memory ping-pong (<= 3), 64 B SEND message rate against the 2-copy
///   shared-memory ring (>= 0.5).
/// - **wire** (every packet through the kernel's UDP): 64 KiB WRITE bandwidth against UDP
///   GSO+GRO goodput (>= 0.6), 8 B WRITE latency against the busy-polled UDP ping-pong
///   (<= 1.3).
/// - **mixed**: no limit is like for like, and no target applies.
/// - **events** (`-e`, on either path): latency against the blocking UDP ping-pong, the
///   like-for-like limit of a thread that sleeps for each answer; no target applies.
///
/// The other limits (the other path's, blocking UDP, memcpy) are for reference.
fn ratios(report: &Report, b: &baseline::Baseline) -> Vec<Ratio> {
    let mut out = Vec::new();
    let write = report.spec.op == Op::Write;
    let same_host = report.path == Path::SameHost;
    let wire = report.path == Path::Wire;
    let events = report.spec.events;
    // The target where `like` (this limit is the path's) holds.
    let aim = |like: bool, applies: bool, t: Target| (like && applies).then_some(t);
    // One figure's ratios, the like-for-like limit first, the others in the order given.
    let push = |out: &mut Vec<Ratio>, mut figure: Vec<Ratio>| {
        figure.sort_by_key(|x| !x.like_for_like);
        out.extend(figure);
    };
    for r in &report.results {
        if let Some(l) = r.latency_us {
            let mut figure = Vec::new();
            let lat = |what: &str, limit: f64, like_for_like: bool, target: Option<Target>| {
                Ratio::new(format!("{} B median latency", r.bytes), l.median, "us", what, limit, like_for_like, target)
            };
            // Polled latency has the path's limits and targets; latency that sleeps on a
            // completion channel is like a blocking UDP ping-pong's, on either path.
            let eight = write && r.bytes == 8 && !events;
            let (wire, same_host) = (wire && !events, same_host && !events);
            figure.push(lat(
                "busy-polled UDP one way",
                b.udp_busy_one_way_us.median,
                wire,
                aim(wire, eight, Target::AtMost(1.3)),
            ));
            figure.push(lat("blocking UDP one way", b.udp_blocking_one_way_us.median, events, None));
            figure.push(lat(
                "spinning shared-memory ping-pong one way",
                b.shm_pingpong_one_way_us.median,
                same_host,
                aim(same_host, eight, Target::AtMost(3.0)),
            ));
            push(&mut out, figure);
        }
        if let Some(mbs) = r.bw_avg_mb_per_sec {
            let mut figure = Vec::new();
            let bw = |what: &str, limit: f64, like_for_like: bool, target: Option<Target>| {
                Ratio::new(
                    format!("{} B average bandwidth", r.bytes),
                    mbs / 1e3,
                    "GB/s",
                    what,
                    limit,
                    like_for_like,
                    target,
                )
            };
            let big = write && r.bytes == 65536;
            figure.push(bw(
                "UDP GSO+GRO goodput",
                b.udp_gso_gro_gbytes_per_sec,
                wire,
                aim(wire, big, Target::AtLeast(0.6)),
            ));
            if let Some(pvm) = b.process_vm_writev_gbytes_per_sec {
                figure.push(bw("process_vm_writev", pvm, same_host, aim(same_host, big, Target::AtLeast(0.6))));
            }
            figure.push(bw("memcpy", b.memcpy_gbytes_per_sec, false, None));
            push(&mut out, figure);
        }
        if let (Some(rate), true) = (r.msg_rate_mpps, report.spec.op == Op::Send && r.bytes <= 64) {
            out.push(Ratio::new(
                format!("{} B message rate", r.bytes),
                rate,
                "M/s",
                "2-copy shared-memory ring (64 B)",
                b.shm_ring_64b_mmsgs_per_sec,
                same_host,
                aim(same_host, r.bytes == 64, Target::AtLeast(0.5)),
            ));
        }
    }
    out
}

/// The device that owns `ip` (or is named `name`) and the GID index of `ip` on it.
fn device_for(ip: IpAddr, name: Option<&str>) -> Result<(Device, u8), PerfError> {
    let ip = ip.to_canonical();
    if let Some(name) = name {
        let d = softrdma::device(name).map_err(|e| PerfError::Usage(e.to_string()))?;
        let index = d.gid_index(ip).unwrap_or(0);
        return Ok((d, index));
    }
    let all = softrdma::devices().map_err(|e| PerfError::Io(e.to_string()))?;
    if let Some((d, i)) = all.iter().find_map(|d| d.gid_index(ip).map(|i| (d.clone(), i))) {
        return Ok((d, i));
    }
    if ip.is_loopback() {
        // 127.0.0.2 and friends: lo answers the whole 127.0.0.0/8.
        return Ok((Device::with_addresses("lo", vec![ip]), 0));
    }
    let names: Vec<&str> = all.iter().map(Device::name).collect();
    Err(PerfError::Usage(format!(
        "no softrdma device has address {ip}; name one with -d (there are: {})",
        names.join(", ")
    )))
}

/// Opens the device for `ip` (or named `name`) for `spec`'s test: with the same-host path
/// unless it says `--wire`.
fn open(ip: IpAddr, name: Option<&str>, spec: &Spec) -> Result<(softrdma::Context, u8), PerfError> {
    let (device, gid_index) = device_for(ip, name)?;
    let ctx = device
        .open_with(&ContextOptions { same_host: !spec.wire, ..ContextOptions::default() })
        .map_err(|e| PerfError::Rdma(format!("opening {}: {e}", device.name())))?;
    Ok((ctx, gid_index))
}

const HANDSHAKE: Duration = Duration::from_secs(30);

/// The server: waits for one client and runs what it asks.
fn server(op: Op, a: &TestArgs) -> Result<(), PerfError> {
    let bind: SocketAddr =
        if a.announce { (Ipv4Addr::LOCALHOST, a.port).into() } else { (Ipv4Addr::UNSPECIFIED, a.port).into() };
    let listener = TcpListener::bind(bind).map_err(|e| {
        PerfError::Usage(format!("cannot listen on TCP {bind}: {e} (is another server running? pick another -p)"))
    })?;
    let port = listener.local_addr().map_err(|e| PerfError::Io(e.to_string()))?.port();
    if a.announce {
        print(&format!("LISTENING {port}\n"))?;
    } else if !a.json {
        print(&format!("softrdma perf: waiting for a client on TCP port {port} (Ctrl-C to stop)\n"))?;
    }
    // One test per connection; a client that sweeps says another follows (Spec::more).
    let mut first = true;
    loop {
        let stream = if a.announce || !first {
            accept_within(&listener, HANDSHAKE)?
        } else {
            listener.accept().map_err(|e| PerfError::Io(format!("accept: {e}")))?.0
        };
        first = false;
        if !serve(op, a, Control::new(stream)?)? {
            return Ok(());
        }
    }
}

/// Serves one client's test on `ctl`; whether the client said another test follows.
fn serve(op: Op, a: &TestArgs, ctl: Control) -> Result<bool, PerfError> {
    let (version, spec, mut peer) = ctl.expect("Hello", HANDSHAKE, |m| match m {
        Msg::Hello { version, spec, side } => Some((version, spec, side)),
        _ => None,
    })?;
    let refuse = |e: PerfError| {
        let _ = ctl.send(&Msg::Refuse { reason: e.to_string() });
        e
    };
    if version != control::VERSION {
        return Err(refuse(PerfError::Peer(format!(
            "the client speaks perf protocol {version}, this server {}; run the same softrdma on both sides",
            control::VERSION
        ))));
    }
    spec.validate().map_err(|e| refuse(PerfError::Peer(format!("the client asked for an impossible test: {e}"))))?;
    if (spec.op, spec.mode) != (op, a.mode) {
        return Err(refuse(PerfError::Usage(format!(
            "the client runs `{}`, this server was started for `{op} {}`; start both sides with the same test",
            spec.title(),
            a.mode
        ))));
    }
    run::check_peer(&spec, &peer).map_err(refuse)?;
    let (side, info, cm_conn) = if spec.rdma_cm {
        // rdma_cm listens on the TCP connection's address and port number.
        let mut conn = CmConn::listen(&spec, ctl.local()).map_err(refuse)?;
        let ctx = conn.context().map_err(refuse)?;
        check_device(&ctx, a.device.as_deref()).map_err(refuse)?;
        let gid_index = ctx.device().gid_index(ctl.local().ip()).unwrap_or(0);
        let mut side = Side::new(ctx, gid_index, &spec).map_err(refuse)?;
        // The client connects once it knows the server listens: its QPs come after.
        ctl.send(&Msg::Accept { side: side.info()? })?;
        peer.qps = conn.accept(&mut side, &peer)?;
        side.prepare(&peer)?;
        let info = side.info()?;
        (side, info, Some(conn))
    } else {
        let (ctx, gid_index) = open(ctl.local().ip(), a.device.as_deref(), &spec).map_err(refuse)?;
        let mut side = Side::new(ctx, gid_index, &spec).map_err(refuse)?;
        side.connect(&peer).map_err(refuse)?;
        let info = side.info()?;
        ctl.send(&Msg::Accept { side: info.clone() })?;
        (side, info, None)
    };
    let mut lines = Vec::new();
    loop {
        let size = match ctl.recv(HANDSHAKE + spec.run_deadline(spec.max_size()))? {
            Msg::Run { size } => size,
            Msg::Bye => break,
            other => return Err(PerfError::Peer(format!("expected Run or Bye, got {other:?}"))),
        };
        if !spec.sizes.contains(&size) {
            return Err(PerfError::Peer(format!("the client asked for size {size}, not one of the test's")));
        }
        ctl.reset_finished();
        // The client starts when it reads Ready: count this run's packets from before.
        side.mark();
        ctl.send(&Msg::Ready)?;
        let stats = match spec.mode {
            Mode::Bw => side.bw(&ctl, &peer, size, spec.bidirectional, &mut Progress::new(&spec, false))?.0,
            Mode::Lat => side.lat_server(&ctl, &peer, size)?,
        };
        ctl.send(&Msg::Report { stats })?;
        lines.push(format!(
            " {:<10} answered: {} messages received, {} operations sent, {} packets sent ({} through shared \
             memory), {} retransmitted",
            size, stats.received, stats.ops, stats.packets_sent, stats.packets_same_host, stats.retransmitted
        ));
    }
    if let Some(conn) = &cm_conn {
        conn.close(false)?;
    }
    if !a.announce && !a.json {
        print(&format!(
            "softrdma perf {}: served {} on {} (QPN {:#08x}) for {}\n{}\n",
            spec.title(),
            spec.conn,
            info.device,
            info.qps.first().map_or(0, |q| q.qpn),
            ctl.peer(),
            lines.join("\n")
        ))?;
    }
    Ok(spec.more)
}

fn accept_within(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, PerfError> {
    listener.set_nonblocking(true).map_err(|e| PerfError::Io(e.to_string()))?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| PerfError::Io(e.to_string()))?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(PerfError::Peer(format!("no client came within {timeout:?}")));
            }
            Err(e) => return Err(PerfError::Io(format!("accept: {e}"))),
        }
    }
}

/// The client: connects, runs every size, returns the report.
fn client(host: &str, a: &TestArgs, spec: &Spec) -> Result<Report, PerfError> {
    let target = format!("{host}:{}", a.port);
    let addrs: Vec<SocketAddr> = match target.to_socket_addrs() {
        Ok(it) => it.collect(),
        Err(e) if host.contains(':') && !host.starts_with('[') => {
            format!("[{host}]:{}", a.port).to_socket_addrs().map_err(|_| unreachable(host, a.port, &e))?.collect()
        }
        Err(e) => return Err(unreachable(host, a.port, &e)),
    };
    let mut last = None;
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, Duration::from_secs(5)) {
            // With no server on a port of the ephemeral range, the kernel may pick that very
            // port as the source and connect the socket to itself (TCP's simultaneous open).
            Ok(s) if s.local_addr().ok() == Some(*addr) => {
                last = Some(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "nothing listens there (the connection reached itself)",
                ));
            }
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let stream = match stream {
        Some(s) => s,
        None => {
            let e = last.unwrap_or_else(|| std::io::Error::other("no address"));
            return Err(unreachable(host, a.port, &e));
        }
    };
    let ctl = Control::new(stream)?;
    let (side, local, peer, cm_conn) = if spec.rdma_cm {
        // rdma_cm's port is the server's TCP port number.
        let conn = CmConn::resolve(spec, ctl.local().ip(), ctl.peer())?;
        let ctx = conn.context()?;
        check_device(&ctx, a.device.as_deref())?;
        let gid_index = ctx.device().gid_index(ctl.local().ip()).unwrap_or(0);
        let mut side = Side::new(ctx, gid_index, spec)?;
        for id in conn.ids() {
            side.add_cm_qp(id)?;
        }
        let local = side.info()?;
        let mut peer = hello(&ctl, spec, &local)?;
        let (qps, qkey) = conn.connect(&side)?;
        peer.qps = qps;
        if let Some(qkey) = qkey {
            peer.qkey = qkey;
        }
        run::check_peer(spec, &peer)?;
        side.prepare(&peer)?;
        (side, local, peer, Some(conn))
    } else {
        let (ctx, gid_index) = open(ctl.local().ip(), a.device.as_deref(), spec)?;
        let mut side = Side::new(ctx, gid_index, spec)?;
        let local = side.info()?;
        let peer = hello(&ctl, spec, &local)?;
        run::check_peer(spec, &peer)?;
        side.connect(&peer)?;
        (side, local, peer, None)
    };
    let mut progress = Progress::new(spec, true);
    let mut results = Vec::new();
    for (i, &size) in spec.sizes.iter().enumerate() {
        progress.start_run(i, size);
        side.mark();
        ctl.send(&Msg::Run { size })?;
        ctl.expect("Ready", HANDSHAKE, |m| matches!(m, Msg::Ready).then_some(()))?;
        let result = match spec.mode {
            Mode::Bw => {
                let (mine, samples) = side.bw(&ctl, &peer, size, true, &mut progress)?;
                let theirs = report_of(&ctl, spec, size)?;
                SizeResult::bw(spec, size, mine, theirs, &samples)
            }
            Mode::Lat => {
                let (mine, samples) = side.lat_client(&ctl, &peer, size, &mut progress)?;
                let theirs = report_of(&ctl, spec, size)?;
                SizeResult::lat(spec, size, mine, theirs, &samples)
            }
        };
        results.push(result);
    }
    progress.finish();
    ctl.send(&Msg::Bye)?;
    if let Some(conn) = &cm_conn {
        conn.close(true)?;
    }
    Ok(Report {
        test: spec.title(),
        spec: spec.clone(),
        local,
        remote: peer,
        latency_is: (spec.mode == Mode::Lat).then(|| latency_is(spec.op)),
        path: Path::of(&results),
        results,
        baseline: None,
        vs_baseline: Vec::new(),
    })
}

/// Sends the test and this side to the server; its side comes back.
fn hello(ctl: &Control, spec: &Spec, local: &SideInfo) -> Result<SideInfo, PerfError> {
    ctl.send(&Msg::Hello { version: control::VERSION, spec: spec.clone(), side: local.clone() })?;
    ctl.expect("Accept", HANDSHAKE, |m| match m {
        Msg::Accept { side } => Some(side),
        _ => None,
    })
}

/// `-d` with `--rdma-cm`: rdma_cm picks the device by address; it must be the one named.
fn check_device(ctx: &softrdma::Context, name: Option<&str>) -> Result<(), PerfError> {
    match name {
        Some(n) if n != ctx.device().name() && n != ctx.device().interface() => Err(PerfError::Usage(format!(
            "-d {n}: rdma_cm resolved the peer's address to {}; drop -d or connect to an address of {n}",
            ctx.device().name()
        ))),
        _ => Ok(()),
    }
}

fn report_of(ctl: &Control, spec: &Spec, size: u64) -> Result<SideStats, PerfError> {
    ctl.expect("Report", HANDSHAKE + spec.run_deadline(size), |m| match m {
        Msg::Report { stats } => Some(stats),
        _ => None,
    })
}

fn unreachable(host: &str, port: u16, e: &std::io::Error) -> PerfError {
    PerfError::Unreachable(format!(
        "cannot reach a softrdma perf server at {host} port {port}: {e} (start `softrdma perf <test> <bw|lat>` there first)"
    ))
}

/// `--loopback`: the server as a child process on 127.0.0.1, this process the client.
/// `--qps-sweep`: the test once per QP count, against one server (the loopback's, or
/// `host`, which serves one connection per count), then one table, one line of JSON per
/// count, and one plot.
fn sweep(op: Op, a: &TestArgs, spec: &Spec) -> Result<(), PerfError> {
    let counts = &a.qps_sweep;
    let reports = clients_of_one_server(op, a, counts.len(), |host, args, i| {
        client(host, args, &Spec { qps: counts[i], more: i + 1 < counts.len(), ..spec.clone() })
    })?;
    let baseline = if a.vs_baseline { Some(measure_baseline(spec)?) } else { None };
    if let Some(path) = &a.plot {
        plot::draw_sweep(&reports, baseline.as_ref(), path)?;
    }
    if a.json {
        let mut out = String::new();
        for mut r in reports {
            if let Some(b) = &baseline {
                with_baseline(&mut r, b.clone());
            }
            let line = serde_json::to_string(&r).map_err(|e| PerfError::Io(format!("encoding JSON: {e}")))?;
            out.push_str(&line);
            out.push('\n');
        }
        return print(&out);
    }
    print(&report::sweep_text(&reports, baseline.as_ref()))
}

/// `--rounds N` (with `--vs-baseline`): the test, then this machine's limits, N times in
/// turn, against one server (the loopback's, or `host`, which serves one connection per
/// round); one report, the last round's results with each ratio the median of the rounds'.
fn rounds(op: Op, a: &TestArgs, spec: &Spec) -> Result<(), PerfError> {
    let n = a.rounds as usize;
    let taken = clients_of_one_server(op, a, n, |host, args, i| {
        let report = client(host, args, &Spec { more: i + 1 < n, ..spec.clone() })?;
        let b = measure_baseline(&report.spec)?;
        Ok((report, b))
    })?;
    let report = over_rounds(taken).ok_or_else(|| PerfError::Usage("--rounds: no round ran".into()))?;
    if let Some(path) = &a.plot {
        plot::draw(&report, path)?;
    }
    print(&if a.json { json(&report)? } else { report.text() })
}

/// The last round's report, its baseline, and each of its ratios as the median over the
/// rounds (matched by figure and limit: a round whose packets took another path has other
/// ratios, and adds nothing to those it lacks).
fn over_rounds(taken: Vec<(Report, baseline::Baseline)>) -> Option<Report> {
    let per_round: Vec<Vec<Ratio>> = taken.iter().map(|(r, b)| ratios(r, b)).collect();
    let (mut report, b) = taken.into_iter().next_back()?;
    let last = per_round.last().cloned().unwrap_or_default();
    report.vs_baseline = last
        .into_iter()
        .map(|ratio| {
            let rounds = per_round
                .iter()
                .filter_map(|round| round.iter().find(|r| r.figure == ratio.figure && r.baseline == ratio.baseline))
                .map(Ratio::round)
                .collect();
            ratio.over_rounds(rounds)
        })
        .collect();
    report.baseline = Some(b);
    Some(report)
}

/// `n` client connections, `each(host, args, i)` the `i`th, against one server: the
/// loopback's (started here, and waited for once the last is done) or `host`'s. The spec
/// each connection sends must say whether more follow (`Spec::more`), so that the server
/// stays for them.
fn clients_of_one_server<T>(
    op: Op,
    a: &TestArgs,
    n: usize,
    mut each: impl FnMut(&str, &TestArgs, usize) -> Result<T, PerfError>,
) -> Result<Vec<T>, PerfError> {
    if a.loopback {
        let (server, port) = loopback_server(op, a)?;
        let args = TestArgs { port, ..a.clone() };
        let out = (0..n).map(|i| each("127.0.0.1", &args, i)).collect::<Result<Vec<T>, _>>()?;
        loopback_server_done(server)?;
        Ok(out)
    } else if let Some(host) = &a.host {
        (0..n).map(|i| each(host, a, i)).collect()
    } else {
        Ok(Vec::new())
    }
}

/// Starts the loopback server: a child `softrdma perf` on an ephemeral port of 127.0.0.1.
fn loopback_server(op: Op, a: &TestArgs) -> Result<(child::Peer, u16), PerfError> {
    let mut args =
        vec!["perf".to_string(), op.to_string(), a.mode.to_string(), "--port".into(), "0".into(), "--announce".into()];
    if let Some(d) = &a.device {
        args.extend(["-d".into(), d.clone()]);
    }
    let mut server = child::Peer::spawn(&args, "loopback server")?;
    let line = server.expect_line("LISTENING", HANDSHAKE)?;
    let port: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| PerfError::Io(format!("the loopback server said {line:?}")))?;
    Ok((server, port))
}

/// Waits for the loopback server to end, as it does after its last client.
fn loopback_server_done(server: child::Peer) -> Result<(), PerfError> {
    let status = server.wait(Duration::from_secs(30))?;
    if !status.success() {
        return Err(PerfError::Peer(format!("the loopback server failed: {status}")));
    }
    Ok(())
}

fn loopback(op: Op, a: &TestArgs, spec: &Spec) -> Result<(), PerfError> {
    let (server, port) = loopback_server(op, a)?;
    let client_args = TestArgs { port, ..a.clone() };
    let report = client("127.0.0.1", &client_args, spec)?;
    loopback_server_done(server)?;
    output(a, report)
}
