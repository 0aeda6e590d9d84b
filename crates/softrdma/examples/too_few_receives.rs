//! A program with a bug, to debug: its receiver posts fewer receives than its sender sends
//! messages. The README's "Debugging your RDMA program" walks through what softrdma's log,
//! `softrdma res` and a capture show of it.
//!
//! ```sh
//! cargo run -p softrdma --example too_few_receives                    # 2 receives, 5 SENDs
//! SOFTRDMA_LOG=softrdma::qp=debug cargo run -p softrdma --example too_few_receives -- --linger 30
//! ```
//!
//! Options: `--recvs N` (2) receives posted, `--messages N` (5) SENDs of 4 KiB, `--rnr-retry
//! N` (2) RNR retries the sender's QP allows, `--linger SECS` (0) to keep the QPs open after
//! the failure (for `softrdma res`). Both sides run in this process, each on a device context
//! of its own on 127.0.0.1, connected by hand. Exit status 1 when a SEND fails, which with
//! the defaults it does: the third SEND finds no receive, the receiver answers RNR NAKs, and
//! after the retries the sender's QP goes to the error state.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line program reports on its terminal

use std::process::ExitCode;
use std::time::Duration;

use softrdma::{Access, ConnectOptions, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus};

const SIZE: usize = 4096;

struct Args {
    recvs: usize,
    messages: usize,
    rnr_retry: u8,
    linger: u64,
}

fn parse() -> Result<Args, String> {
    let mut a = Args { recvs: 2, messages: 5, rnr_retry: 2, linger: 0 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let value = it.next().ok_or(format!("{arg} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{arg} {value}: {e}");
        match arg.as_str() {
            "--recvs" => a.recvs = value.parse().map_err(bad)?,
            "--messages" => a.messages = value.parse().map_err(bad)?,
            "--rnr-retry" => a.rnr_retry = value.parse().map_err(bad)?,
            "--linger" => a.linger = value.parse().map_err(bad)?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.messages == 0 || a.messages > 64 || a.recvs > 64 || a.rnr_retry > 7 {
        return Err("--messages 1..=64, --recvs 0..=64, --rnr-retry 0..=7".into());
    }
    Ok(a)
}

/// A signaled SEND of one SGE.
fn send<'a>(wr_id: u64, sge: &'a softrdma::Sge) -> SendWr<'a> {
    SendWr {
        wr_id,
        op: SendOp::Send,
        sg_list: std::slice::from_ref(sge),
        flags: SendFlags::SIGNALED,
        ..SendWr::default()
    }
}

fn run(a: &Args) -> Result<bool, softrdma::Error> {
    let open = || softrdma::device("lo")?.open();
    let (sender_ctx, receiver_ctx) = (open()?, open()?);
    let (spd, rpd) = (sender_ctx.alloc_pd()?, receiver_ctx.alloc_pd()?);
    let (scq, rcq) = (sender_ctx.create_cq(128, None)?, receiver_ctx.create_cq(128, None)?);
    let mut init = QpInit::new(QpType::Rc, &scq);
    init.cap.max_send_wr = 64;
    let sender = spd.create_qp(&init)?;
    let mut init = QpInit::new(QpType::Rc, &rcq);
    init.cap.max_recv_wr = 64;
    let receiver = rpd.create_qp(&init)?;
    let (smr, rmr) = (spd.reg_mr(a.messages * SIZE, Access::LOCAL_WRITE)?, rpd.reg_mr(64 * SIZE, Access::LOCAL_WRITE)?);
    println!("sender QP {:#08x}, receiver QP {:#08x}", sender.qpn(), receiver.qpn());

    let options = ConnectOptions { rnr_retry: a.rnr_retry, ..ConnectOptions::default() };
    let (se, re) = (sender.endpoint(0, 0x100)?, receiver.endpoint(0, 0x200)?);
    sender.connect(0x100, &re, &options)?;
    receiver.connect(0x200, &se, &options)?;

    // The bug: `recvs` receives for `messages` SENDs.
    for i in 0..a.recvs {
        receiver.post_recv(&[RecvWr { wr_id: i as u64, sg_list: &[rmr.sge(i * SIZE..(i + 1) * SIZE)?] }])?;
    }

    let sges: Vec<_> = (0..a.messages).map(|i| smr.sge(i * SIZE..(i + 1) * SIZE)).collect::<Result<_, _>>()?;
    let wrs: Vec<SendWr<'_>> = sges.iter().enumerate().map(|(i, sge)| send(i as u64, sge)).collect();
    sender.post_send(&wrs)?;
    let mut ok = true;
    for _ in 0..a.messages {
        let wc = scq.wait(Duration::from_secs(30))?;
        println!("send {} completed: {:?}", wc.wr_id, wc.status);
        ok &= wc.status == WcStatus::Success;
    }
    while let Some(wc) = rcq.poll_one() {
        println!("receive {} completed: {:?}, {} bytes", wc.wr_id, wc.status, wc.byte_len);
    }
    if a.linger > 0 {
        println!("keeping the QPs open for {} s (softrdma res qp)", a.linger);
        std::thread::sleep(Duration::from_secs(a.linger));
    }
    Ok(ok)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!(
                "too_few_receives: {msg}; usage: too_few_receives [--recvs N] [--messages N] [--rnr-retry N] [--linger SECS]"
            );
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("too_few_receives: a SEND failed (see the README's \"Debugging your RDMA program\")");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("too_few_receives: {e}");
            ExitCode::FAILURE
        }
    }
}
