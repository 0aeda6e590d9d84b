//! rsockets through this build's `librdmacm.so.1`: Debian's unmodified rdmacm-utils
//! (`rstream`, `riostream`, `rcopy`) and, through rdma-core's `librspreload.so`, plain TCP
//! programs (`iperf3`, and `tests/c/tcp_check.c`, which checks every byte), each as a
//! server and a client process on 127.0.0.1. Each test skips, saying why, when its program
//! is not installed.
#![allow(clippy::print_stderr)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;

const PRELOAD: &str = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so";

/// A server process, killed (if still running) and reaped on drop.
struct Server {
    child: Child,
    out: PathBuf,
}

impl Server {
    /// What it printed (stdout and stderr).
    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits up to `t` for it to exit; its exit status.
    fn wait(&mut self, t: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + t;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The environment of a program over our libraries (and rdma-core's preload library).
fn command(lib: &LibDir, stats: &Path, preload: bool, args: &[&str]) -> Command {
    let mut c = Command::new(args[0]);
    c.args(&args[1..]).env("LD_LIBRARY_PATH", &lib.path).env("SOFTRDMA_STATS_DIR", stats);
    if preload {
        c.env("LD_PRELOAD", PRELOAD);
    }
    c
}

/// Starts a server and waits until it has opened the device (its counters file appears in
/// a directory of its own under `stats`), then a moment for its `rlisten`.
fn start_server(lib: &LibDir, stats: &Path, preload: bool, args: &[&str]) -> Server {
    static SERVERS: AtomicUsize = AtomicUsize::new(0);
    let stats = &stats.join(format!("server-{}", SERVERS.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(stats).unwrap();
    let out = stats.with_extension("out");
    let f = std::fs::File::create(&out).unwrap();
    let child = command(lib, stats, preload, args)
        .stdout(Stdio::from(f.try_clone().unwrap()))
        .stderr(Stdio::from(f))
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", args[0]));
    let mut server = Server { child, out };
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let opened = std::fs::read_dir(stats)
            .unwrap()
            .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".stats")));
        if opened {
            break;
        }
        if let Some(s) = server.child.try_wait().unwrap() {
            panic!("{} exited ({s}) before listening:\n{}", args.join(" "), server.output());
        }
        assert!(Instant::now() < end, "{} opened no device within 10 s:\n{}", args.join(" "), server.output());
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    server
}

/// Runs a client to its end (killed after two minutes).
fn run_client(lib: &LibDir, stats: &Path, preload: bool, args: &[&str]) -> Output {
    let mut all = vec!["timeout", "120"];
    all.extend_from_slice(args);
    command(lib, stats, preload, &all).output().unwrap_or_else(|e| panic!("{}: {e}", args[0]))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The libraries, or `None` having said why the test cannot run.
fn setup(tag: &str, programs: &[&str]) -> Option<(LibDir, PathBuf)> {
    for p in programs {
        if !installed(p) {
            eprintln!("SKIP: {p} is not installed (apt-get install rdmacm-utils iperf3)");
            return None;
        }
    }
    let lib = lib_dir(&format!("rsocket-{tag}"));
    if !lib.rdmacm {
        eprintln!("SKIP: librdmacm.so.1 was not built");
        return None;
    }
    let stats = lib.path.join("stats");
    Some((lib, stats))
}

/// One rstream or riostream run, server and client with the same options; the client's
/// output.
fn stream_pair(lib: &LibDir, stats: &Path, program: &str, port: u16, opts: &[&str]) -> String {
    let port = port.to_string();
    let mut server_args = vec![program, "-p", &port];
    server_args.extend_from_slice(opts);
    let mut server = start_server(lib, stats, false, &server_args);
    let mut client_args = vec![program, "-s", "127.0.0.1", "-p", &port];
    client_args.extend_from_slice(opts);
    let out = run_client(lib, stats, false, &client_args);
    let status = server.wait(Duration::from_secs(30));
    let (c, s) = (text(&out), server.output());
    assert!(out.status.success(), "{} failed ({}):\n{c}\nserver:\n{s}", client_args.join(" "), out.status);
    assert!(status.is_some_and(|s| s.success()), "{} failed ({status:?}):\n{s}", server_args.join(" "));
    // The result line: name, size, transfers, iterations, total, time, Gb/s, µs/transfer.
    assert!(c.lines().any(|l| l.starts_with("custom")), "{} printed no result:\n{c}", client_args.join(" "));
    eprintln!("{program} {}: {}", opts.join(" "), c.lines().last().unwrap_or(""));
    c
}

#[test]
fn rstream_blocking_nonblocking_and_async_up_to_1_mib() {
    let Some((lib, stats)) = setup("rstream", &["rstream"]) else { return };
    // Default (non-blocking, spinning), blocking, non-blocking, and poll-driven, from
    // 4 KiB to 1 MiB, data verified by the receiver (-T v) where the option allows.
    stream_pair(&lib, &stats, "rstream", 27511, &["-S", "4096", "-C", "1000"]);
    stream_pair(&lib, &stats, "rstream", 27512, &["-T", "b", "-S", "1048576", "-C", "50"]);
    stream_pair(&lib, &stats, "rstream", 27513, &["-T", "n", "-S", "65536", "-C", "200"]);
    stream_pair(&lib, &stats, "rstream", 27514, &["-T", "a", "-S", "1000000", "-C", "20"]);
    stream_pair(&lib, &stats, "rstream", 27515, &["-T", "v", "-S", "100000", "-C", "50"]);
}

#[test]
fn rstream_with_keepalives_every_second_moves_verified_data() {
    let Some((lib, stats)) = setup("keepalive", &["rstream"]) else { return };
    // -k 1: SO_KEEPALIVE and TCP_KEEPIDLE 1 on both sides, read back with rgetsockopt;
    // the run lasts over a second (1.7 s here), so each side's keepalive goes between its
    // data writes and the peer takes it as the control message it is (-T v checks every
    // byte). Keepalives to a peer that is gone: tests/rsocket_keepalive.rs.
    let out = stream_pair(&lib, &stats, "rstream", 27516, &["-k", "1", "-T", "v", "-S", "65536", "-C", "20000"]);
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    assert!(lines.contains(&"Keepalive: ON") && lines.contains(&"time: 1"), "rgetsockopt's answers:\n{out}");
}

#[test]
fn riostream_writes_into_the_peers_iomap() {
    let Some((lib, stats)) = setup("riostream", &["riostream"]) else { return };
    // riostream's data goes by riowrite into the region the server riomap'ed; -T v checks
    // it.
    stream_pair(&lib, &stats, "riostream", 27521, &["-T", "v", "-S", "1048576", "-C", "20"]);
    stream_pair(&lib, &stats, "riostream", 27522, &["-T", "b", "-S", "65536", "-C", "200"]);
    stream_pair(&lib, &stats, "riostream", 27523, &["-T", "a", "-S", "100000", "-C", "50"]);
}

#[test]
fn rcopy_copies_a_file() {
    let Some((lib, stats)) = setup("rcopy", &["rcopy"]) else { return };
    let src = lib.path.join("source.bin");
    let dst = lib.path.join("copy.bin");
    // 3 MB and a bit: many receive-buffer halves, and a last piece of odd size.
    let data: Vec<u8> = (0..3_000_017u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let _server = start_server(&lib, &stats, false, &["rcopy", "-p", "27531"]);
    let target = format!("127.0.0.1:{}", dst.display());
    let out = run_client(&lib, &stats, false, &["rcopy", src.to_str().unwrap(), &target, "-p", "27531"]);
    assert!(out.status.success(), "rcopy failed:\n{}", text(&out));
    let copied = std::fs::read(&dst).unwrap_or_default();
    assert!(copied == data, "the copy ({} bytes) differs from the source ({} bytes)", copied.len(), data.len());
}

fn preload_available() -> bool {
    if !Path::new(PRELOAD).exists() {
        eprintln!("SKIP: {PRELOAD} is missing (apt-get install librdmacm1)");
        return false;
    }
    true
}

#[test]
fn iperf3_runs_over_rsockets_through_librspreload() {
    let Some((lib, stats)) = setup("iperf3", &["iperf3"]) else { return };
    if !preload_available() {
        return;
    }
    // The server's listener is an rsocket (no kernel TCP listener exists: a client that fell
    // back to TCP would find nobody).
    let mut server = start_server(&lib, &stats, true, &["iperf3", "-s", "-1", "-p", "27541"]);
    let out = run_client(&lib, &stats, true, &["iperf3", "-c", "127.0.0.1", "-p", "27541", "-n", "64M"]);
    let c = text(&out);
    assert!(out.status.success(), "iperf3 -c failed:\n{c}\nserver:\n{}", server.output());
    // "[ 25]   0.00-0.29   sec  64.0 MBytes  1.87 Gbits/sec   sender" (iperf3 may send a
    // block past -n: 64.1), then the receiver's line; the receiver counts until the
    // sender's end message reaches it on the control connection, so a last block in
    // flight may be missing from its count (as over TCP).
    let mbytes = |side: &str| {
        c.lines().filter(|l| l.trim_end().ends_with(side)).find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let i = w.iter().position(|&x| x == "MBytes")?;
            w[i - 1].parse::<f64>().ok()
        })
    };
    assert!(mbytes("sender").is_some_and(|mb| mb >= 64.0), "iperf3 did not report 64 MB sent:\n{c}");
    assert!(mbytes("receiver").is_some_and(|mb| mb >= 63.0), "iperf3 did not report 64 MB received:\n{c}");
    let status = server.wait(Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "iperf3 -s -1 did not end well ({status:?}):\n{}", server.output());
    eprintln!("{}", c.lines().filter(|l| l.contains("receiver")).collect::<Vec<_>>().join("\n"));
}

#[test]
fn a_tcp_program_moves_checked_bytes_over_rsockets_through_librspreload() {
    let Some((lib, stats)) = setup("tcp-check", &[]) else { return };
    if !preload_available() {
        return;
    }
    let Some(exe) = build_c("tcp_check", &lib.path) else { return };
    let exe = exe.to_str().unwrap();
    let bytes = "8000000";
    let mut server = start_server(&lib, &stats, true, &[exe, "server", "27551", bytes]);
    let out = run_client(&lib, &stats, true, &[exe, "client", "127.0.0.1", "27551", bytes]);
    let c = text(&out);
    assert!(out.status.success(), "tcp_check client failed:\n{c}\nserver:\n{}", server.output());
    let status = server.wait(Duration::from_secs(20));
    let s = server.output();
    assert!(status.is_some_and(|st| st.success()), "tcp_check server failed ({status:?}):\n{s}");
    // Each side's connection was librspreload's (an rsocket), and every byte checked.
    assert_eq!(c.lines().collect::<Vec<_>>(), ["rsocket", "ok 8000000 bytes"], "client:\n{c}");
    assert_eq!(s.lines().collect::<Vec<_>>(), ["listening", "rsocket", "ok 8000000 bytes"], "server:\n{s}");
}

#[test]
fn a_process_that_exits_without_rclose_ends_its_connections() {
    let Some((lib, stats)) = setup("exit", &[]) else { return };
    let Some(exe) = build_c("rsocket_exit", &lib.path) else { return };
    let listener = softrdma::rsocket::RSocket::new().unwrap();
    listener.bind("127.0.0.1:27561".parse().unwrap()).unwrap();
    listener.listen(1).unwrap();
    let client = command(&lib, &stats, false, &[exe.to_str().unwrap(), "127.0.0.1", "27561"]).output().unwrap();
    assert!(client.status.success(), "rsocket_exit failed:\n{}", text(&client));
    let conn = listener.accept().unwrap();
    let mut buf = [0u8; 8];
    let n = conn.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"bye");
    // The client's exit sent a DREQ: the stream ends (0) rather than waiting forever.
    conn.set_nonblocking(true);
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match conn.recv(&mut buf) {
            Ok(0) => break,
            Ok(n) => panic!("{n} more bytes after the client's exit"),
            Err(e) if softrdma::rsocket::os_error(&e) == Some(libc::EAGAIN) => {
                assert!(Instant::now() < end, "the connection did not end within 10 s of the client's exit");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("recv after the client's exit: {e}"),
        }
    }
}

#[test]
fn rselect_reports_rsockets_beside_an_ordinary_descriptor() {
    let Some((lib, stats)) = setup("rselect", &[]) else { return };
    let Some(exe) = build_c("rselect_check", &lib.path) else { return };
    let out = run_client(&lib, &stats, false, &[exe.to_str().unwrap(), "27571"]);
    assert!(out.status.success(), "rselect_check failed:\n{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}
