//! An incast between processes: N sender processes each WRITE 64 KiB messages into one
//! receiving process as fast as they can, each over an RC QP of its own, all through the
//! kernel's UDP loopback (the wire path, the same-host path off), once with congestion
//! control off and once on; and one sender alone before them, for reference.
//!
//! `cargo bench -p softrdma --bench incast` (`-- --senders N`, default 4; `-- --secs S`,
//! default 2). What it reports per run: the goodput all senders together moved (bytes of
//! WRITEs completed successfully, per second of the run), the slowest and fastest sender,
//! the packets they sent again (go-back-N after a loss) as a share of those they sent, the
//! CNPs the receiver sent and the senders acted on, and the receiver's out-of-sequence
//! packets (each a loss seen). On loopback the bottleneck is the receiving process and its
//! socket buffer: what overflows it is dropped by the kernel, which congestion control
//! answers with CNPs (`State::receive`'s overrun signal).
//!
//! The senders are this program run again (`SOFTRDMA_TEST_ROLE`), talking in lines over
//! their stdin/stdout; every wait has a deadline, and every sender's loop ends with its run.

#![allow(clippy::print_stdout, clippy::print_stderr)]

#[path = "../tests/common/child.rs"]
#[allow(dead_code, unreachable_pub)]
mod child;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use child::{Advert, ChildProc, read_stdin_line, say};
use softrdma::*;

const ROLE: &str = child::ROLE_ENV;
const IP: [u8; 4] = [127, 0, 0, 1];
const PORT: u16 = 4791;
const SIZE: usize = 65536;
/// WRITEs each sender keeps outstanding.
const DEPTH: usize = 16;
/// Whether the run has congestion control (the senders' environment).
const CC_ENV: &str = "SOFTRDMA_INCAST_CC";
const T: Duration = Duration::from_secs(20);

fn main() {
    if std::env::var(ROLE).is_ok() {
        sender();
        return;
    }
    let arg = |name: &str, default: u64| {
        let args: Vec<String> = std::env::args().collect();
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let senders = arg("--senders", 4).clamp(1, 32) as usize;
    let secs = Duration::from_secs(arg("--secs", 2).clamp(1, 60));
    println!(
        "incast over 127.0.0.1 (the wire path): 64 KiB RDMA WRITEs, {DEPTH} outstanding per sender, {secs:?} a run"
    );
    println!(
        "  {:<28} {:>9} {:>21} {:>13} {:>7} {:>7} {:>9}",
        "run", "GB/s", "slowest..fastest", "resent", "CNPs", "acted", "out of seq"
    );
    let alone = run(1, false, secs);
    report("1 sender, no CC", &alone);
    let off = run(senders, false, secs);
    report(&format!("{senders} senders, no CC"), &off);
    let on = run(senders, true, secs);
    report(&format!("{senders} senders, CC"), &on);
}

/// What one run measured.
struct Outcome {
    /// Per sender: bytes completed, packets sent, packets resent, CNPs acted on, failed WRs.
    senders: Vec<[u64; 5]>,
    secs: f64,
    /// The receiver's CNPs sent and out-of-sequence packets.
    cnps_sent: u64,
    out_of_sequence: u64,
}

fn report(name: &str, o: &Outcome) {
    let gbps = |bytes: u64| bytes as f64 / o.secs / 1e9;
    let total: u64 = o.senders.iter().map(|s| s[0]).sum();
    let (slow, fast) = o.senders.iter().map(|s| gbps(s[0])).fold((f64::MAX, 0f64), |(a, b), x| (a.min(x), b.max(x)));
    let (sent, resent) = o.senders.iter().fold((0, 0), |(a, b), s| (a + s[1], b + s[2]));
    let acted: u64 = o.senders.iter().map(|s| s[3]).sum();
    let failed: u64 = o.senders.iter().map(|s| s[4]).sum();
    let share = if sent > 0 { 100.0 * resent as f64 / sent as f64 } else { 0.0 };
    println!(
        "  {name:<28} {:>9.2} {:>9.2} .. {:>8.2} {:>8} {:>3.0}% {:>7} {:>7} {:>9}{}",
        gbps(total),
        slow,
        fast,
        resent,
        share,
        o.cnps_sent,
        acted,
        o.out_of_sequence,
        if failed > 0 { format!("  ({failed} WRs failed)") } else { String::new() }
    );
}

fn options(cc: bool) -> ContextOptions {
    ContextOptions { port: PORT, same_host: false, congestion_control: cc, ..ContextOptions::default() }
}

fn open(cc: bool) -> Context {
    Device::with_addresses("lo", vec![IpAddr::from(IP)]).open_with(&options(cc)).expect("open the device")
}

/// One run: `n` senders into this process, with congestion control or not.
fn run(n: usize, cc: bool, secs: Duration) -> Outcome {
    let ctx = open(cc);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mr = pd.reg_mr(n * SIZE, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let qps: Vec<Qp> = (0..n).map(|_| pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap()).collect();
    let mut children: Vec<ChildProc> =
        (0..n).map(|_| ChildProc::spawn("", "incast-sender", &[(CC_ENV, u8::from(cc).to_string())], None)).collect();
    let opts = ConnectOptions { timeout: 14, ..ConnectOptions::default() };
    for (i, (child, qp)) in children.iter_mut().zip(&qps).enumerate() {
        let theirs = Advert::parse(&child.expect_line("EP ", T));
        let me = Advert {
            qpn: qp.qpn(),
            ip: IP.into(),
            psn: 0,
            addr: mr.addr() + (i * SIZE) as u64,
            rkey: mr.rkey(),
            len: SIZE as u64,
        };
        child.send_line(&me.line());
        qp.connect(0, &theirs.endpoint(), &opts).unwrap();
        child.expect_line("READY", T);
    }
    let before = ctx.counters().engine;
    let started = Instant::now();
    for child in &mut children {
        child.send_line(&format!("GO {}", secs.as_millis()));
    }
    let senders: Vec<[u64; 5]> = children
        .iter_mut()
        .map(|child| {
            let line = child.expect_line("DONE ", secs + T);
            let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
            [f[0], f[1], f[2], f[3], f[4]]
        })
        .collect();
    let elapsed = started.elapsed().min(secs + Duration::from_millis(50)).as_secs_f64();
    let after = ctx.counters().engine;
    for child in &mut children {
        child.close_stdin();
        child.wait_success(T);
    }
    Outcome {
        senders,
        secs: elapsed.max(secs.as_secs_f64()),
        cnps_sent: after.cnps_sent - before.cnps_sent,
        out_of_sequence: after.out_of_sequence - before.out_of_sequence,
    }
}

/// A sender: one RC QP to the receiver, 64 KiB WRITEs with `DEPTH` outstanding for the time
/// the `GO` line gives, then what it did on a `DONE` line.
fn sender() {
    let cc = std::env::var(CC_ENV).is_ok_and(|v| v == "1");
    let ctx = open(cc);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.cap.max_send_wr = DEPTH as u32;
    let qp = pd.create_qp(&init).unwrap();
    let mr = pd.reg_mr(SIZE, Access::LOCAL_WRITE).unwrap();
    let me = Advert { qpn: qp.qpn(), ip: IP.into(), psn: 0, addr: mr.addr(), rkey: 0, len: SIZE as u64 };
    say(&me.line());
    let peer = Advert::parse(&read_stdin_line().expect("the receiver's EP line"));
    let opts = ConnectOptions { timeout: 14, ..ConnectOptions::default() };
    qp.connect(0, &peer.endpoint(), &opts).unwrap();
    say("READY");
    let go = read_stdin_line().expect("GO");
    let ms: u64 = go.strip_prefix("GO ").and_then(|m| m.parse().ok()).expect("GO <ms>");
    let before = ctx.counters().engine;
    let sge = [mr.sge(0..SIZE).unwrap()];
    let post = |id: u64| {
        let op = SendOp::RdmaWrite { remote_addr: peer.addr, rkey: peer.rkey() };
        let wr = SendWr { wr_id: id, op, sg_list: &sge, flags: SendFlags::SIGNALED, ud: None, xrc_srqn: None };
        qp.post_send(&[wr]).is_ok()
    };
    let (mut outstanding, mut next, mut done, mut failed) = (0usize, 0u64, 0u64, 0u64);
    let end = Instant::now() + Duration::from_millis(ms);
    // Posts while the run lasts; then only drains what is outstanding, for at most `T`.
    while (Instant::now() < end || outstanding > 0) && Instant::now() < end + T {
        while Instant::now() < end && outstanding < DEPTH && post(next) {
            next += 1;
            outstanding += 1;
        }
        while let Some(wc) = cq.poll_one() {
            outstanding -= 1;
            if wc.status == WcStatus::Success {
                done += 1;
            } else {
                failed += 1;
            }
        }
    }
    let after = ctx.counters().engine;
    say(&format!(
        "DONE {} {} {} {} {}",
        done * SIZE as u64,
        after.sent_packets - before.sent_packets,
        after.retransmitted_packets - before.retransmitted_packets,
        after.cnps_rcvd - before.cnps_rcvd,
        failed
    ));
    // Stays until the receiver has read the line and lets go (its QP outlives the run).
    let _ = read_stdin_line();
}
