//! An RC ping-pong in the manner of `ibv_rc_pingpong`: the two sides swap their QP's
//! number, GID and first PSN over a TCP connection (nothing else goes over TCP), connect
//! their QPs by hand (RESET → INIT → RTR → RTS), then bounce a message back and forth with
//! SEND/RECV, checking its bytes each time.
//!
//! ```sh
//! cargo run --release -p softrdma --example pingpong                      # both sides
//! cargo run --release -p softrdma --example pingpong -- --server          # one side ...
//! cargo run --release -p softrdma --example pingpong -- --client 127.0.0.1  # ... the other
//! ```
//!
//! Options: `-n ITERS` (1000), `-s SIZE` (4096). It prints the round trips, the bytes moved
//! and the one-way latency (half the round trip); exit status 0 only if every message
//! arrived intact.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program reports on its terminal

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use softrdma::{Access, ConnectOptions, Endpoint, Gid, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus};

const TCP_PORT: u16 = 18515; // ibv_rc_pingpong's
const T: Duration = Duration::from_secs(10);

struct Args {
    role: Option<(bool, Option<IpAddr>)>,
    iters: usize,
    size: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args { role: None, iters: 1000, size: 4096 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--server" => a.role = Some((true, None)),
            "--client" => {
                a.role = Some((false, Some(value("--client")?.parse().map_err(|e| format!("--client: {e}"))?)))
            }
            "-n" => a.iters = value("-n")?.parse().map_err(|e| format!("-n: {e}"))?,
            "-s" => a.size = value("-s")?.parse().map_err(|e| format!("-s: {e}"))?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.size == 0 || a.iters == 0 {
        return Err("-n and -s must be at least 1".into());
    }
    Ok(a)
}

/// One side: sets up a QP, swaps endpoints over `tcp`, ping-pongs. The client pings.
fn side(mut tcp: TcpStream, client: bool, iters: usize, size: usize) -> Result<Vec<Duration>, String> {
    let e = |e: softrdma::Error| e.to_string();
    let ctx = softrdma::device("lo").map_err(e)?.open().map_err(e)?;
    let pd = ctx.alloc_pd().map_err(e)?;
    let cq = ctx.create_cq(16, None).map_err(e)?;
    let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).map_err(e)?;
    let mr = pd.reg_mr(2 * size, Access::LOCAL_WRITE).map_err(e)?;
    let psn = if client { 0x1000 } else { 0x2000 };
    let me = qp.endpoint(0, psn).map_err(e)?;

    // The out-of-band exchange: "qpn gid psn" lines, as ibv_rc_pingpong's. One reader for
    // the whole exchange: it may read the peer's next line ahead.
    writeln!(tcp, "{} {} {}", me.qpn, me.gid.to_ip(), me.psn).map_err(|x| x.to_string())?;
    let mut reader = BufReader::new(tcp.try_clone().map_err(|x| x.to_string())?);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|x| x.to_string())?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let peer = Endpoint {
        qpn: f.first().and_then(|x| x.parse().ok()).ok_or("bad peer line")?,
        gid: Gid::from_ip(f.get(1).and_then(|x| x.parse().ok()).ok_or("bad peer line")?),
        psn: f.get(2).and_then(|x| x.parse().ok()).ok_or("bad peer line")?,
    };
    qp.connect(psn, &peer, &ConnectOptions::default()).map_err(e)?;
    let recv = [mr.sge(size..2 * size).map_err(e)?];
    qp.post_recv(&[RecvWr { wr_id: 0, sg_list: &recv }]).map_err(e)?;
    // Both receives are posted before either side sends (the TCP line is the barrier).
    writeln!(tcp, "ready").map_err(|x| x.to_string())?;
    line.clear();
    reader.read_line(&mut line).map_err(|x| x.to_string())?;

    let send = [mr.sge(0..size).map_err(e)?];
    let message: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    mr.write(0, &message).map_err(e)?;
    let mut rtts = Vec::with_capacity(iters);
    let post_send = || {
        qp.post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::Send,
            sg_list: &send,
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_srqn: None,
        }])
    };
    // Sends complete when the peer's ACK comes back, which may be after the peer's next
    // message: count them apart from the messages.
    let mut unacked = 0usize;
    for i in 0..iters {
        let started = Instant::now();
        if client {
            post_send().map_err(e)?;
            unacked += 1;
        }
        loop {
            let wc = cq.wait(T).map_err(e)?;
            if wc.status != WcStatus::Success {
                return Err(format!("round {i}: {:?} completed with {:?}", wc.opcode, wc.status));
            }
            if wc.wr_id == 1 {
                unacked -= 1;
                continue;
            }
            let mut got = vec![0u8; size];
            mr.read(size, &mut got).map_err(e)?;
            if got != message {
                return Err(format!("round {i}: the message arrived corrupted"));
            }
            qp.post_recv(&[RecvWr { wr_id: 0, sg_list: &recv }]).map_err(e)?;
            if !client {
                post_send().map_err(e)?; // the pong
                unacked += 1;
            }
            break;
        }
        rtts.push(started.elapsed());
    }
    while unacked > 0 {
        let wc = cq.wait(T).map_err(e)?;
        if wc.wr_id == 1 {
            unacked -= 1;
        }
    }
    Ok(rtts)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("pingpong: {msg}; usage: pingpong [--server | --client IP] [-n ITERS] [-s SIZE]");
            return ExitCode::from(2);
        }
    };
    let result = match args.role {
        Some((true, _)) => TcpListener::bind(("0.0.0.0", TCP_PORT))
            .and_then(|l| l.accept())
            .map_err(|e| e.to_string())
            .and_then(|(tcp, _)| side(tcp, false, args.iters, args.size)),
        Some((false, host)) => TcpStream::connect(SocketAddr::new(host.expect("parsed"), TCP_PORT))
            .map_err(|e| e.to_string())
            .and_then(|tcp| side(tcp, true, args.iters, args.size)),
        None => {
            // Both sides in this process, two threads, two device contexts on 127.0.0.1.
            match TcpListener::bind(("127.0.0.1", 0)) {
                Err(e) => Err(e.to_string()),
                Ok(listener) => {
                    let at = listener.local_addr().expect("bound");
                    let (n, s) = (args.iters, args.size);
                    let server = std::thread::spawn(move || {
                        listener.accept().map_err(|e| e.to_string()).and_then(|(tcp, _)| side(tcp, false, n, s))
                    });
                    let client =
                        TcpStream::connect(at).map_err(|e| e.to_string()).and_then(|tcp| side(tcp, true, n, s));
                    let server = server.join().unwrap_or_else(|_| Err("the server thread panicked".into()));
                    server.and(client)
                }
            }
        }
    };
    match result {
        Ok(mut rtts) => {
            rtts.sort();
            let one_way = |d: Duration| d.as_secs_f64() * 1e6 / 2.0;
            println!(
                "{} round trips of {} bytes, data checked: one way median {:.2} us, p99 {:.2} us",
                rtts.len(),
                args.size,
                one_way(rtts[rtts.len() / 2]),
                one_way(rtts[rtts.len() * 99 / 100])
            );
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("pingpong: {msg}");
            ExitCode::FAILURE
        }
    }
}
